"""Where no signal arrives: a labelled node whose output carries nothing that training
learned predicts the class prior, not the noise of untrained embedding rows.

On a featureless graph with few labels, most nodes may lie beyond every training node's
reach: their logits are a function of randomly drawn embedding rows only, and a model
scores them below predicting the majority class. So:

- an input row has *signal* when its node's type has features (`NodeInputs.features`),
  or when training touched its learnable row (`NodeInputs.embeddings`): the row got a
  non-zero gradient at some step (`touched`);
- a labelled node is *reached* when a row with signal lies within its model's
  receptive field: `depth` hops (the model's layers) along in-edges, the way messages
  flow, the node's own row included (an L-step propagation of a 1-wide indicator over
  the partitioned graph, `jgraph.jobs.propagation.propagate`);
- a node that is not reached scores log(prior), the training labels' class
  frequencies (`with_prior`): it predicts their majority class (the lowest of those
  tied, as the result's majority baseline), and its probabilities are the prior.

`Signal` carries the reached mask and the prior into a program beside its data; every
node classification program that scores or outputs classes takes one as an optional
`signal=` argument (`optional_signal`), and without it is the program it was. `Reach`
computes it for a run's embedding tables (None where the labelled type has features:
every labelled node is then reached, and nothing is computed or added).

Why the optimizer's state and not a comparison with the initial draw: the two agree
for jgraph's sparse optimizers (neither moves a row whose gradient is zero: no weight
decay, and the moments or accumulator of such a row stay at their start, also where
full-batch training hands every row to the optimizer with its zero gradient), but the
state says it exactly on any backend, where a draw redone by another compilation of
the random number generator need not match bit for bit.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jgraph.exchange import owned_index
from jgraph.jobs.propagation import Norm, Placed, propagate
from jgraph.jobs.windows import edge_window
from jgraph.mesh import REPLICATED, ROWS


class Signal(NamedTuple):
    """What a program needs to score unreached nodes by the prior.

    reached: bool[P * r] row-sharded, in the labelled type's layout (the labels'):
      True where a row with signal lies within the node's receptive field (False for
      padding).
    prior: float32[C] replicated: the training labels' class frequencies.
    """

    reached: jax.Array
    prior: jax.Array


SPECS = Signal(ROWS, REPLICATED)
"""How a `Signal` lies on the mesh."""


# -- inside a program (per device, under shard_map) --------------------------------------

def with_prior(logits, reached, prior):
    """`logits` [n, C] with log(prior) in the rows not `reached` (bool[n]). A class that
    no training node has gets the log of the smallest normal float32 instead of -inf:
    its probability is 0 to float precision, and a loss stays finite."""
    floor = jnp.finfo(jnp.float32).tiny
    log_prior = jnp.log(jnp.maximum(prior, floor)).astype(logits.dtype)
    return jnp.where(reached[:, None], logits, log_prior[None])


def seed_reached(signal: Signal, ids, layout, axis: str):
    """bool[n]: whether each of this device's own nodes `ids` (int32[n] global ids, -1
    = padding) is reached, True for nodes of other types than the labelled one (whose
    layout is `layout`) and for padding: `with_prior` changes only unreached labelled
    nodes."""
    labelled = (ids >= 0) & layout.contains(ids)
    at = owned_index(ids, labelled, layout.starts, axis, fill=layout.rows_per_part)
    return ~labelled | signal.reached.at[at].get(mode="fill", fill_value=False)


def block_reached(signal: Signal, graph, layout, axis: str):
    """bool[n]: `seed_reached` of every node of this device's block of every node
    (local node i is global id offsets[me] + i)."""
    placed = Placed(layout)
    held, at = placed.positions(graph, axis)
    return ~Placed.put(held & ~signal.reached, at, graph.nodes_per_part)


def optional_signal(body, mesh, in_specs: tuple, out_specs, used: bool = True):
    """jit(shard_map(body)) of `(*args, signal=None)`: `body(*args)` with the arguments
    placed as `in_specs` say, or `body(*args, signal)` where a `Signal` is given (laid
    out as `SPECS`). Without one the program is the one `body` alone makes: a signal is
    an input only where it is given, and where it is `used` (a program of embeddings
    ignores it, so that its callers may pass it whatever they ask)."""
    def program(*args, signal=None):
        if signal is None or not used:
            return jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs)(*args)
        return jax.shard_map(body, mesh=mesh, in_specs=(*in_specs, SPECS),
                             out_specs=out_specs)(*args, signal)
    # Named as `body` would name jit(shard_map(body)): the same program, the same name.
    program.__name__ = program.__qualname__ = getattr(body, "__name__", "program")
    return jax.jit(program)


# -- the signal of a run -------------------------------------------------------------------

def touched(table, state) -> jax.Array:
    """bool[r] per device (under shard_map): which rows of this device's block of a
    learnable table (`DistEmbedding` table, `EmbeddingState` state) training touched:
    a floating-point slot of its sparse optimizer (Adam's moments, Adagrad's
    accumulator) left its initial value, which happens exactly when the row got a
    non-zero gradient (the integer step count of Adam is left out: full-batch training
    counts every row's steps, touched or not)."""
    out = jnp.zeros(state.table.shape[0], bool)
    for name, (_, dtype, start) in table.optimizer.slots(table.dim).items():
        if jnp.issubdtype(dtype, jnp.floating):
            slot = state.slots[name]
            out = out | jnp.any((slot != start).reshape(slot.shape[0], -1), axis=1)
    return out


class Reach:
    """The `Signal` of a node classification run for given embedding tables (call it
    with them); None where there is nothing to change: the run's labelled type has
    features (every labelled node is reached), or the run does not classify nodes with
    a model on inputs (link prediction, label propagation). One compiled program, built
    at the first call; the training mask is read once."""

    def __init__(self, run):
        from jgraph.jobs.step import NodeClassification  # which imports this module
        job = run.job
        self.needed = (run.kind.classifies and run.target is not None
                       and isinstance(job, NodeClassification)
                       and run.target not in job.inputs.features)
        if not self.needed:
            return
        self.run = run
        self.depth = int(nnx.merge(job.graphdef, run.params).gnn.num_layers)
        self.train = run.dg.split_mask("train", run.target)
        self.program = None

    def __call__(self, embeddings) -> Signal | None:
        if not self.needed:
            return None
        run = self.run
        if self.program is None:
            self.program = reach_program(run.job, run.dg.graph, run.num_classes, self.depth)
        signal, lost = self.program(run.dg.graph, embeddings, run.job.labels.array,
                                    self.train.array)
        if int(lost):
            raise RuntimeError(f"the reach of the rows with signal: {int(lost)} in-edge "
                               f"source id(s) are not nodes of the graph")
        return signal


def signal_of(run, embeddings) -> Signal | None:
    """The `Signal` of `run` for the embedding tables `embeddings` (`Reach`), to pass
    as `signal=` to its evaluation and output programs; None where nothing changes."""
    return Reach(run)(embeddings)


def reach_program(job, graph, classes: int, depth: int):
    """jit(shard_map(...)): `(graph, embeddings, labels, train) -> (Signal, ids lost)`
    of a node classification job whose labelled type has no features; labels and train:
    the labelled type's row-sharded labels and training mask."""
    inputs, exchange = job.inputs, job.exchange
    axis = exchange.axis
    layout = job.labels.layout
    placed = Placed(layout)
    window = edge_window(graph.edges_per_part, 1)

    def body(graph, embeddings, labels, train):
        me = lax.axis_index(axis)
        n = graph.nodes_per_part
        ids = graph.offsets[me] + jnp.arange(n, dtype=jnp.int32)
        # The rows with signal, in this device's block of every node.
        has = jnp.zeros(n, bool)
        for ntype, rows in inputs.layouts.items():
            ok = graph.node_mask & rows.contains(ids)
            if ntype in inputs.embeddings:
                moved = touched(inputs.embeddings[ntype], embeddings[ntype])
                ok = ok & moved[owned_index(ids, ok, rows.starts, axis)]
            has = has | ok
        # depth steps, each node's indicator 1 where it or an in-neighbour had it: a
        # breadth-first search along in-edges (kept 0/1, so nothing underflows).
        y, lost = propagate(has[:, None].astype(jnp.float32), graph, exchange, steps=depth,
                            alpha=0.5, norm=Norm.ROW, window=window,
                            after=lambda y: (y > 0).astype(y.dtype))
        held, at = placed.positions(graph, axis)
        reached = held & (Placed.take(y, held, at)[:, 0] > 0)
        # The training labels' frequencies, over every device.
        seen = train & held & (labels >= 0)
        onehot = jax.nn.one_hot(labels, classes, dtype=jnp.float32) * seen[:, None]
        counts = lax.psum(jnp.sum(onehot, axis=0), axis)
        prior = counts / jnp.maximum(jnp.sum(counts), 1.0)
        return Signal(reached, prior), lost

    return jax.jit(jax.shard_map(
        body, mesh=job.mesh,
        in_specs=(graph.specs(), inputs.embedding_specs(), ROWS, ROWS),
        out_specs=(SPECS, REPLICATED)))


def host_signal(run, signal: Signal | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(reached bool[rows], prior float[C]) of `signal` on the host, reached indexed by
    the labelled type's row id (for reports and tests); None for None."""
    if signal is None:
        return None
    from jgraph.sharded.tensor import DistTensor
    layout = run.job.labels.layout
    reached = DistTensor(signal.reached, layout, "reached", run.dg.mesh).to_numpy()
    return reached.astype(bool), np.asarray(signal.prior)
