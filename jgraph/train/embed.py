"""`jgraph embed WORKDIR --out DIR`: what a trained model gives back for every node.

A layer's rows (embeddings: by default the last hidden layer's for node
classification, the encoder's output that the decoder scores for link prediction),
the logits, their softmax or the predicted class, for every node, one node type or a
list of nodes, computed by layer-wise full-graph inference on the run's devices
(`jgraph.jobs.inference.full_graph_rows_program`) and written in original node ids
(`jgraph.data.outputs`). Each process writes the rows its own devices computed, one
device's at a time, so no process holds more than a partition's rows on the host; the
directory appears whole or not at all (written as a sibling and renamed).
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

import jgraph.segments as segments
from jgraph.atomic import free_bytes, occupied, publish, staging_dir
from jgraph.config import ConfigError
from jgraph.data.graph import GraphError
from jgraph.data.outputs import INDEX, What, is_outputs_dir, write_chunk, write_index
from jgraph.jobs.inference import full_graph_rows_program
from jgraph.jobs.signal import signal_of
from jgraph.memory import peak_rss_bytes
from jgraph.mesh import host_sync
from jgraph.progress import Progress
from jgraph.train.model import open_trained
from jgraph.train.smooth import every_node_rows, predicted_scores


class OutputExists(ConfigError):
    """The output directory exists and may not be replaced."""


def embed(workdir: str, out: str, *, what: What | str = What.EMBEDDINGS,
          layer: int | None = None, node_type: str | None = None,
          nodes: np.ndarray | Sequence[int] | str | None = None, overwrite: bool = False,
          smoothed: bool = False, progress: Progress | None = None) -> dict:
    """Write the outputs of the model saved in `workdir` to `out`; returns a summary
    (rows, width, seconds, rows_per_s, peak_rss_bytes of this process, ...).

    what: embeddings (the rows of `layer`, counted from 1: by default the last hidden
    layer for node classification, the last layer for link prediction), logits,
    probabilities or predictions. node_type: only that type's nodes (default: every
    type's). nodes: only these original (type-local) ids of `node_type` (or of the only
    type), an array or a file (`.npy`, or text with one id a line). overwrite: replace
    an earlier `jgraph embed` output at `out`. smoothed: probabilities or predictions
    after the Correct & Smooth that `jgraph smooth` (or smooth.after_training) chose
    (WORKDIR/correct_and_smooth.json), of the labelled node type. A run of label
    propagation gives its probabilities or predictions, of the labelled type.
    """
    progress = progress or Progress()
    what = parse_what(what)
    out = os.path.abspath(out)
    check_out(out, overwrite)
    begin = time.perf_counter()
    run, params, embeddings = open_trained(workdir, progress)
    book = run.dg.book
    predicted = predicted_scores(run, params, embeddings, workdir, smoothed, progress)
    if predicted is None:
        depth = nnx.merge(run.job.graphdef, run.params).gnn.num_layers
        layer = checked_layer(run, what, layer, depth)
        types = checked_types(book.node_types, node_type)
        program = full_graph_rows_program(run.job, run.dg.graph, what, layer)
        data = run.job.data(run.dg.graph)
        # Classes of nodes no signal reaches are the prior's (`jgraph.jobs.signal`).
        signal = signal_of(run, embeddings) if what is not What.EMBEDDINGS else None
        compute = lambda: program(params, embeddings, data, signal=signal)
        shape = jax.eval_shape(compute)[0].shape
    else:
        depth = layer = checked_predicted(run, what, layer, node_type, smoothed)
        types = [run.target]
        compute = lambda: (every_node_rows(run.dg, predicted, what), 0)
        shape = (0, run.num_classes) if what is What.PROBABILITIES else (0,)
    wanted = None if nodes is None else _nodes(run.dg, types, nodes)
    rows = {t: {p: int(_rows(book, p, t, wanted).size) for p in range(book.num_parts)}
            for t in types}
    width = int(shape[1]) if len(shape) > 1 else 1
    dtype = np.int32 if what is What.PREDICTIONS else np.float32
    total = sum(sum(r.values()) for r in rows.values())
    check_disk(out, total * (8 + width * np.dtype(dtype).itemsize))
    staging = _shared_staging(out)
    with progress.phase(f"{what.value} of {total:,} nodes (layer {layer} of {depth})"):
        values, lost = compute()
        if int(lost):
            from jgraph.exchange import ExchangeOverflowError
            raise ExchangeOverflowError(f"full-graph inference: {int(lost)} id(s) were lost "
                                        f"by the exchange; leave exchange.max_capacity unset")
    node_map = run.dg.parts.node_map()
    starts = np.asarray(run.dg.meta.orig_type_offsets, np.int64)
    user = {t: run.dg.parts.user_ids(t) for t in types}
    n = run.dg.graph.nodes_per_part
    shards = sorted(values.addressable_shards, key=lambda s: s.index[0].start or 0)
    for shard in progress.iterate(shards, "writing", total=len(shards)):
        p = (shard.index[0].start or 0) // n
        block = np.asarray(shard.data)
        for t in types:
            new = _rows(book, p, t, wanted)
            orig = node_map[new] - starts[book.node_types.index(t)]
            # Rows named by the user's own ids, where the graph has them.
            ids = orig if user[t] is None else np.asarray(user[t][orig])
            write_chunk(staging, t, p, ids, block[new - book.offsets[p]].astype(dtype))
    host_sync("jgraph embed: chunks written")
    if jax.process_index() == 0:
        write_index(staging, what, layer, width, dtype, os.path.abspath(workdir), rows)
        check_out(out, overwrite)
        publish(staging, out)
    host_sync("jgraph embed: published")
    seconds = time.perf_counter() - begin
    return {"out": out, "what": what.value, "layer": layer, "width": width,
            "node_types": {t: sum(r.values()) for t, r in rows.items()}, "rows": total,
            "seconds": seconds, "rows_per_s": total / max(seconds, 1e-9),
            "peak_rss_bytes": peak_rss_bytes()}


def parse_what(what, flag: str = "--what ") -> What:
    """`what` as a `What`; ConfigError naming `flag` and the choices otherwise."""
    try:
        return What(what)
    except ValueError:
        raise ConfigError(f"{flag}{what!r}: one of {[w.value for w in What]}") from None


def checked_layer(run, what: What, layer: int | None, depth: int) -> int:
    """The layer to read, checked against the model's `depth` layers."""
    embeds = not run.kind.classifies
    if what is not What.EMBEDDINGS:
        if embeds:
            raise ConfigError(f"--what {what.value}: a {run.kind.title} model has no "
                              f"classes; its outputs are embeddings")
        if layer is not None and layer != depth:
            raise ConfigError(f"--layer {layer} with --what {what.value}: "
                              f"{what.value} come from the last layer ({depth})")
        return depth
    if layer is None:
        return depth if embeds or depth == 1 else depth - 1
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
            or not 1 <= layer <= depth:
        raise ConfigError(f"--layer {layer!r}: the model has layers 1 to {depth} (the "
                          f"last gives the {'embeddings' if embeds else 'logits'})")
    return int(layer)


def checked_predicted(run, what: What, layer: int | None, node_type: str | None,
                      smoothed: bool) -> int:
    """The layer recorded for class predictions that are not the model's layers' own
    (Correct & Smooth's, label propagation's: `predicted_scores`), after checking that
    they are what is asked: probabilities or predictions of the labelled type."""
    source = "Correct & Smooth" if smoothed else run.kind.title
    if what not in (What.PROBABILITIES, What.PREDICTIONS):
        raise ConfigError(f"--what {what.value}: {source} gives class probabilities and "
                          f"predictions, not {what.value}")
    if node_type is not None and node_type != run.target:
        raise ConfigError(f"--node-type {node_type!r}: {source} predicts the labelled "
                          f"node type, {run.target!r}")
    depth = (nnx.merge(run.job.graphdef, run.params).gnn.num_layers if run.kind.learns
             else run.config.model.num_layers)
    if layer is not None and layer != depth:
        raise ConfigError(f"--layer {layer} with --what {what.value}: {what.value} come "
                          f"from the last layer ({depth})")
    return depth


def checked_types(node_types: Sequence[str], node_type: str | None) -> list[str]:
    """The node types to read: every one, or `node_type`, checked to be one of them."""
    if node_type is None:
        return list(node_types)
    if node_type not in node_types:
        raise ConfigError(f"--node-type {node_type!r} is not a node type of the graph; it "
                          f"has {list(node_types)}")
    return [node_type]


def _nodes(dg, types: list[str], nodes) -> np.ndarray:
    """int64[k] sorted new ids of the original (type-local) ids `nodes` of the only
    type in `types`, checked."""
    return segments.distinct(new_ids(dg, types, nodes, "--nodes"))


def new_ids(dg, types: list[str], nodes, where: str) -> np.ndarray:
    """int64[k]: the new ids of `nodes` of the only type in `types`, in their order:
    the user's own ids where the graph was built from the user's tables (strings or
    integers, `Graph.ids`), else original (type-local) ids; an array, or a file (`.npy`,
    or text with one id a line). ConfigError naming `where` (or the file) and the id at
    fault."""
    if len(types) != 1:
        raise ConfigError(f"{where}: the graph has the node types {types}; name the type "
                          f"of the listed nodes (--node-type; node_type= in Python)")
    t = types[0]
    user = dg.parts.user_ids(t)
    if isinstance(nodes, (str, os.PathLike)):
        where = os.fspath(nodes)
        nodes = _read_ids(where, strings=user is not None and user.dtype.kind == "S")
    ids = np.asarray(nodes)
    if user is not None:
        try:
            orig = dg.parts.id_map(t).positions(ids.reshape(-1), f"{where}: type {t!r}")
        except GraphError as e:
            raise ConfigError(str(e)) from None
        return dg.parts.to_new(t, orig).astype(np.int64)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ConfigError(f"{where}: node ids must be a list of integers, got "
                          f"{ids.dtype} of shape {list(ids.shape)}")
    count = int(np.diff(dg.book.ntype_offsets, axis=1)[:, dg.book.node_types.index(t)].sum())
    bad = ids[(ids < 0) | (ids >= count)]
    if bad.size:
        raise ConfigError(f"{where}: node id {int(bad[0])} is out of range: type {t!r} has "
                          f"ids 0 to {count - 1} ({bad.size} id(s) out of range)")
    return dg.parts.to_new(t, ids.astype(np.int64)).astype(np.int64)


def _read_ids(path: str, strings: bool = False) -> np.ndarray:
    """The ids of a node list file: `.npy`, or text with one id a line (`strings`: read
    as text, for a type whose ids are strings)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such node list file")
    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        if strings:             # one id a line, as written (ids may hold spaces or #)
            with open(path, encoding="utf-8") as f:
                return np.array([line.rstrip("\r\n") for line in f if line.strip()])
        return np.loadtxt(path, dtype=np.int64, ndmin=1, comments="#")
    except ValueError as e:
        raise ConfigError(f"{path}: not a list of node ids ({e})") from None


def read_pairs(path: str, strings: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of a file of pairs: `.npy` of shape [k, 2], or text with "src dst" a
    line (`strings`: ids read as text, for graphs whose ids are strings: tab-separated
    "src<TAB>dst" where a line holds a tab, as ids may hold spaces)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file of pairs")
    try:
        if path.endswith(".npy"):
            pairs = np.load(path, allow_pickle=False)
        elif strings:
            with open(path, encoding="utf-8") as f:
                pairs = np.array([line.rstrip("\r\n").split("\t") if "\t" in line
                                  else line.split() for line in f if line.strip()],
                                 dtype=object)
            pairs = np.array(pairs.tolist(), dtype=str) if pairs.size else pairs
        else:
            pairs = np.loadtxt(path, dtype=np.int64, ndmin=2, comments="#")
    except ValueError as e:
        raise ConfigError(f"{path}: not a list of pairs of node ids ({e})") from None
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ConfigError(f"{path}: pairs are two ids a row (src, dst), got an array of "
                          f"shape {list(pairs.shape)}")
    return pairs[:, 0], pairs[:, 1]


def _rows(book, p: int, ntype: str, wanted: np.ndarray | None) -> np.ndarray:
    """int64 new ids of partition p's nodes of `ntype` (those in `wanted` only)."""
    t = book.node_types.index(ntype)
    lo, hi = int(book.ntype_offsets[p, t]), int(book.ntype_offsets[p, t + 1])
    if wanted is None:
        return np.arange(lo, hi, dtype=np.int64)
    return wanted[(wanted >= lo) & (wanted < hi)]


def check_out(out: str, overwrite: bool) -> None:
    """Raise `OutputExists` unless `out` may receive outputs: absent, an empty
    directory, or an earlier `jgraph embed` output that `overwrite` lets replace."""
    found = occupied(out, is_outputs_dir, f"a jgraph outputs directory ({INDEX})", overwrite)
    if found:
        reason, replaceable = found
        raise OutputExists(f"{out} {reason}"
                           + ("; pass --overwrite to replace it" if replaceable else ""))


def check_disk(out: str, need: int) -> None:
    """Raise ConfigError when the disk that will hold `out` has less free space than
    `need` bytes and a margin."""
    free = free_bytes(out)
    need = int(need * 1.05) + (1 << 20)
    if need > free:
        raise ConfigError(f"{out}: the outputs need about {need / 2**20:.1f} MiB and the "
                          f"disk has {free / 2**20:.1f} MiB free")


def _shared_staging(out: str) -> str:
    """The sibling of `out` every process writes into: the first process's, made by
    it and named to the others."""
    if jax.process_count() == 1:
        return staging_dir(out)
    from jax.experimental import multihost_utils
    name = staging_dir(out) if jax.process_index() == 0 else ""
    raw = np.zeros(4096, np.uint8)
    raw[:len(name.encode())] = np.frombuffer(name.encode(), np.uint8)
    raw = np.asarray(multihost_utils.broadcast_one_to_all(raw))
    return bytes(raw[raw != 0]).decode()
