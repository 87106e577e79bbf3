"""`jgraph.load_run(WORKDIR)`: a trained run in a Python program, answering for a few
nodes or pairs without running the whole graph.

    run = jgraph.load_run("runs/cora")          # the run's devices, as it trained
    run.predict([0, 5, 17])                     # int32[3]: predicted classes
    run.probabilities([0, 5, 17])               # float32[3, C]
    run.embed([0, 5, 17], layer=1)              # float32[3, hidden]
    link = jgraph.load_run("runs/facebook-link")
    link.score([0, 1], [5, 9])                  # float32[2]: the decoder's logits

Nodes are original ids (type-local, as the input graph numbered them), answered in the
order given (repeats allowed). Each answer is computed on the run's devices over the
nodes' sampled neighbourhoods: `fanouts` per hop, from the nodes outward (default: the
run's `train.eval_fanouts`). A fanout of -1 takes every in-neighbour, so with -1 at
every hop (the default eval fanouts) the answer is exact: the rows `jgraph embed`
writes by full-graph inference, to float rounding. Other fanouts give the sampled
estimate a sampled evaluation scores, drawn the same way on every call. For every
node, or millions of them, `jgraph embed` (`jgraph.embed`) is the faster route.

A run of label propagation, or one loaded with `smoothed=True` (after `jgraph
smooth`), answers `predict` and `probabilities` for the labelled type from its
propagated scores, computed once over the whole graph when it is loaded: exact, with
no fanouts.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jgraph.segments as segments
from jgraph.config import ConfigError
from jgraph.data.outputs import What
from jgraph.jobs.link import to_host
from jgraph.jobs.run import check_stats
from jgraph.jobs.signal import signal_of
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.train.embed import (
    checked_layer,
    checked_predicted,
    checked_types,
    new_ids,
    parse_what,
    read_pairs,
)
from jgraph.train.model import open_trained
from jgraph.train.smooth import predicted_scores

# Seeds on the busiest device are padded to a power of two, at least this many, so a
# few shapes of program serve every call.
SMALLEST_BATCH = 16


def load_run(workdir: str, progress: bool = False, smoothed: bool = False) -> TrainedRun:
    """The model `jgraph train` saved in `workdir`, on the devices it trained on (its
    partitions: as many devices as the run had; under `jgraph.launch`, every process
    of the job calls this and the methods alike). smoothed: `predict` and
    `probabilities` answer with the predictions after the run's Correct & Smooth
    (`jgraph smooth`, or smooth.after_training), computed once for every labelled node
    when the run is loaded."""
    return TrainedRun(workdir, Progress(enabled=progress), smoothed)


class TrainedRun:
    """A trained run's model and graph (see the module). Fields: workdir, config (the
    run's `Experiment`), task (the config's), node_types, relations,
    num_layers."""

    def __init__(self, workdir: str, progress: Progress | None = None,
                 smoothed: bool = False):
        self.workdir = workdir
        self._run, self._params, self._embeddings = open_trained(workdir, progress)
        self.config = self._run.config
        self.task = self.config.task
        self.node_types = tuple(self._run.dg.book.node_types)
        self.relations = tuple(tuple(r) for r in self._run.dg.meta.relations)
        self._smoothed = smoothed
        # Class probabilities of every labelled node that are not the model's layers'
        # own (Correct & Smooth's, label propagation's), else None.
        self._predicted = predicted_scores(self._run, self._params, self._embeddings,
                                           workdir, smoothed, progress)
        if not self._run.kind.learns:
            self.num_layers = self.config.model.num_layers
            return
        self.num_layers = nnx.merge(self._run.job.graphdef, self._params).gnn.num_layers
        self._programs: dict = {}           # by shape: (program, the data it reads)
        # Where no signal reaches, classes are the prior's (`jgraph.jobs.signal`).
        self._signal = signal_of(self._run, self._embeddings)
        graphdef = self._run.job.graphdef
        self._score = jax.jit(lambda params, a, b, e: nnx.merge(graphdef, params).score(a, b, e))

    def __repr__(self) -> str:
        return (f"TrainedRun({self.workdir!r}: {self.config.model.kind}, "
                f"{self.num_layers} layers, task {self.task}, {self._run.dg.num_parts} "
                f"partitions)")

    # -- answers ------------------------------------------------------------------------

    def predict(self, nodes, node_type: str | None = None, *, fanouts=None) -> np.ndarray:
        """int32[k]: each node's predicted class."""
        return self.outputs(nodes, node_type, what=What.PREDICTIONS, fanouts=fanouts)

    def probabilities(self, nodes, node_type: str | None = None, *, fanouts=None
                      ) -> np.ndarray:
        """float32[k, classes]: the softmax of each node's logits."""
        return self.outputs(nodes, node_type, what=What.PROBABILITIES, fanouts=fanouts)

    def logits(self, nodes, node_type: str | None = None, *, fanouts=None) -> np.ndarray:
        """float32[k, classes]: each node's logits."""
        return self.outputs(nodes, node_type, what=What.LOGITS, fanouts=fanouts)

    def embed(self, nodes, node_type: str | None = None, *, layer: int | None = None,
              fanouts=None) -> np.ndarray:
        """float32[k, width]: each node's rows of `layer` (counted from 1; default, as
        `jgraph embed`'s: the last hidden layer, or the last for link prediction)."""
        return self.outputs(nodes, node_type, what=What.EMBEDDINGS, layer=layer,
                            fanouts=fanouts)

    def outputs(self, nodes, node_type: str | None = None, *,
                what: What | str = What.EMBEDDINGS, layer: int | None = None,
                fanouts=None) -> np.ndarray:
        """What `jgraph embed --what` writes, for `nodes` only (see the methods above).
        nodes: ids of `node_type` (the only type by default), the user's own where the
        graph was built from the user's tables, else original ids: an array, a
        list, or a file (`.npy`, or text with one id a line)."""
        run = self._run
        what = parse_what(what, "what=")
        if self._predicted is not None:
            checked_predicted(run, what, layer, node_type, self._smoothed)
            new = new_ids(run.dg, [run.target], nodes, "nodes")
            if not new.size:
                raise ConfigError("nodes: give at least one node id")
            probs = self._predicted[run.dg.book.to_type_local(new)[1]]
            return (probs if what is What.PROBABILITIES
                    else np.argmax(probs, axis=1).astype(np.int32))
        layer = checked_layer(run, what, layer, self.num_layers)
        types = checked_types(self.node_types, node_type) if node_type is not None \
            else list(self.node_types)
        new = new_ids(run.dg, types, nodes, "nodes")
        if not new.size:
            raise ConfigError("nodes: give at least one node id")
        return self._rows(new, what, layer, self._fanouts(fanouts, layer))

    def score(self, src, dst=None, relation: str | Sequence[str] | None = None, *,
              fanouts=None) -> np.ndarray:
        """float32[k]: the decoder's logit of each pair (src[i], dst[i]) of a link
        prediction run (its sigmoid, the edge's probability under the BCE loss). src,
        dst: ids of the relation's source and destination types (the user's own where
        the graph has them, as `outputs`); or src alone,
        a file of pairs (`.npy` [k, 2], or text with "src dst" a line). relation: the
        relation's name or (src type, name, dst type) (default: the only one)."""
        run = self._run
        if run.kind.classifies:
            raise ConfigError(f"{self.workdir}: a {run.kind.title} run scores nodes "
                              f"(predict, probabilities), not pairs")
        r = self._relation(relation)
        s_type, _, d_type = self.relations[r]
        where = "src"
        if dst is None:
            if not isinstance(src, (str, os.PathLike)):
                raise ConfigError("score(src, dst): give both ends, or a file of pairs as src")
            where = os.fspath(src)
            user = [run.dg.parts.user_ids(t) for t in (s_type, d_type)]
            src, dst = read_pairs(where, strings=any(u is not None and u.dtype.kind == "S"
                                                     for u in user))
        src = new_ids(run.dg, [s_type], src, where)
        dst = new_ids(run.dg, [d_type], dst, "dst" if where == "src" else where)
        if src.shape != dst.shape or not src.size:
            raise ConfigError(f"score: {src.size} sources and {dst.size} destinations; give "
                              f"one of each per pair, at least one pair")
        layer = self.num_layers
        h = self._rows(np.concatenate([src, dst]), What.EMBEDDINGS, layer,
                       self._fanouts(fanouts, layer))
        etype = np.full(src.size, r, np.int32)
        return np.asarray(self._score(self._params, jnp.asarray(h[:src.size]),
                                      jnp.asarray(h[src.size:]), jnp.asarray(etype)),
                          np.float32)

    # -- inside -------------------------------------------------------------------------

    def _relation(self, relation) -> int:
        names = [r[1] for r in self.relations]
        if relation is None:
            if len(self.relations) != 1:
                raise ConfigError(f"score: the graph has the relations {names}; name one "
                                  f"with relation=")
            return 0
        for i, r in enumerate(self.relations):
            if relation == r[1] or tuple(relation) == r:
                return i
        raise ConfigError(f"score: relation {relation!r} is not in the graph; it has "
                          f"{[list(r) for r in self.relations]}")

    def _fanouts(self, fanouts, layer: int) -> tuple:
        """The first `layer` hops of `fanouts` (default: the run's eval fanouts),
        checked."""
        given = self.config.train.eval_fanouts if fanouts is None else tuple(fanouts)
        if len(given) != self.num_layers:
            raise ConfigError(f"fanouts {list(given)}: one per layer, {self.num_layers} for "
                              f"this model")
        try:
            return NeighborSampler(given[:layer]).fanouts
        except ValueError as e:
            raise ConfigError(f"fanouts {list(given)}: {e}") from None

    def _rows(self, new: np.ndarray, what: What, layer: int, fanouts: tuple) -> np.ndarray:
        """The outputs of the nodes of new ids `new`, in their order."""
        run = self._run
        dg = run.dg
        unique = segments.distinct(new)
        offsets = np.asarray(dg.book.offsets, np.int64)
        bounds = np.searchsorted(unique, offsets)
        counts = np.diff(bounds)
        busiest = int(counts.max(initial=0))
        most = max(SMALLEST_BATCH, 1 << max(busiest - 1, 0).bit_length())
        loader = NodeLoader.from_parts(dg.mesh, counts,
                                       lambda k: unique[bounds[k]:bounds[k + 1]],
                                       batch_size=self.config.train.eval_batch_size,
                                       most=most)
        key = (what, layer, fanouts, loader.batch_size, loader.per_device)
        if key not in self._programs:
            # The evaluating job is a plain one (a control-variate run's too): its data.
            job = run.job.evaluating(loader, fanouts)
            self._programs[key] = (job.compile_outputs(dg.graph, what, layer),
                                   job.data(dg.graph))
        program, data = self._programs[key]
        order = loader.epoch_order(0)
        found, values = [], []
        for i in range(loader.steps_per_epoch):
            seeds, h, stats = program(self._params, self._embeddings, data, order,
                                      jnp.int32(i), signal=self._signal)
            check_stats(jax.device_get(stats))
            seeds, h = to_host(seeds), to_host(h)
            real = seeds >= 0
            found.append(seeds[real])
            values.append(h[real])
        found, values = np.concatenate(found), np.concatenate(values)
        at = np.argsort(found)
        if not np.array_equal(found[at], unique):
            raise RuntimeError(f"outputs of {found.size} node(s) came back for "
                               f"{unique.size} asked")
        return values[at][np.searchsorted(found[at], new)]
