"""Rows propagated over the partitioned graph's in-edges, on the mesh: label propagation
(Zhou et al., 2004) and the two propagations of Correct & Smooth (Huang et al., ICLR
2021).

One step updates every owned node at once:

    Y <- (1 - alpha) Y0 + alpha Â Y

where Â is the graph's adjacency (row: destination, column: source, one entry per
in-edge) normalised as `Norm` says: `SYMMETRIC`, D^-1/2 A D^-1/2, the papers' and
PyG's choice (D: in-degrees, at both ends, as PyG's `gcn_norm` of the adjacency);
`ROW`, D^-1 A, each node the mean of its in-neighbours. Heterogeneous graphs' relations
are alike: every in-edge carries its source's row whatever its relation, and nodes of
types without labels start at zero and relay what reaches them.

A step is one full-graph aggregation (`window_aggregate` over `Summed`): each device
walks its partition's in-edges `window` at a time, their sources' rows through the
exchange, so a device holds its partition's rows and one window, whatever the number
of devices. `after` (clamping the known rows back to their labels, clipping) runs
after each step, on the device's own rows.
"""
from __future__ import annotations

import enum
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.jobs.windows import Summed, edge_window, window_aggregate
from jgraph.mesh import REPLICATED, ROWS
from jgraph.sharded.tensor import DistTensor


class Norm(str, enum.Enum):
    """How the adjacency is normalised (see the module)."""

    SYMMETRIC = "symmetric"
    ROW = "row"


def propagate(y0: jax.Array, graph, exchange, *, steps: int, alpha: float, norm: Norm,
              window: int, after: Callable[[jax.Array], jax.Array] | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """(Y, lost) inside `shard_map`: this device's rows y0 float32[n, C] (local node i
    is global id offsets[me] + i; padding rows zero) after `steps` steps from y0 (see
    the module); lost: in-edge sources the exchange did not answer (ids outside the
    graph), summed over the steps."""
    degree = graph.in_degree.astype(jnp.float32)
    reached = degree > 0
    if norm is Norm.SYMMETRIC:
        scale = jnp.where(reached, lax.rsqrt(jnp.maximum(degree, 1.0)), 0.0)
        send, receive = scale, scale
    else:
        send, receive = jnp.ones_like(degree), jnp.where(reached, 1.0 / jnp.maximum(degree, 1.0),
                                                         0.0)

    def step(y, _):
        acc, lost = window_aggregate(Summed(), y * send[:, None], graph, exchange, window)
        y = (1.0 - alpha) * y0 + alpha * acc["sum"] * receive[:, None]
        y = jnp.where(graph.node_mask[:, None], y, 0.0)
        return (y if after is None else after(y)), lost

    y, lost = lax.scan(step, y0, None, length=steps)
    return y, jnp.sum(lost)


class Placed:
    """Where a device's rows of the labelled type sit in its block of every node (the
    rows of type t of partition p start `starts[p] - offsets[p]` into the block), so
    that they can be written there before a propagation and read back after it."""

    def __init__(self, layout):
        self.first = jnp.asarray(layout.starts - layout.offsets[:-1], jnp.int32)
        self.count = jnp.asarray(layout.counts, jnp.int32)
        self.rows = layout.rows_per_part

    def positions(self, graph, axis: str) -> tuple[jax.Array, jax.Array]:
        """Inside `shard_map`: (held bool[r], at int32[r]): which of this device's r
        labelled rows are real, and each one's row in the block of every node (the
        block's length, out of range, for padding)."""
        me = lax.axis_index(axis)
        held = jnp.arange(self.rows) < self.count[me]
        return held, jnp.where(held, self.first[me] + jnp.arange(self.rows),
                               graph.nodes_per_part)

    @staticmethod
    def put(rows, at, n: int):
        """The block of n nodes' rows holding `rows` at `at`, zeros elsewhere."""
        return jnp.zeros((n, *rows.shape[1:]), rows.dtype).at[at].set(rows, mode="drop")

    @staticmethod
    def take(y, held, at):
        """The labelled rows of the block y (zeros for padding)."""
        out = y[jnp.where(held, at, 0)]
        return jnp.where(held.reshape(-1, *(1,) * (out.ndim - 1)), out, 0)


def _program(body, graph, mesh, in_specs: tuple, out_specs=(ROWS, REPLICATED)):
    """`body(graph, *inputs)` (by default `-> (rows, lost)`) compiled on `mesh`, the
    inputs placed as `in_specs` say."""
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(graph.specs(), *in_specs),
                                 out_specs=out_specs))


def _checked(what: str, lost) -> None:
    if int(lost):
        raise RuntimeError(f"{what}: {int(lost)} in-edge source id(s) are not nodes of "
                           f"the graph")


def label_propagation(dg, labels, train, num_classes: int, *, steps: int, alpha: float,
                      norm: Norm = Norm.SYMMETRIC, window: int | None = None) -> DistTensor:
    """Class scores of every node of the labelled type by label propagation (Zhou et
    al., 2004), a `DistTensor` float32 [rows, num_classes] in the labels' layout.

    Y0 holds the training nodes' one-hot labels (`labels`: the labelled type's int
    `DistTensor`, `train`: its bool mask) and zeros everywhere else, nodes of every
    other type included; `steps` steps propagate it, the training rows clamped back to
    their labels after each. A row no label reaches holds the class prior instead of
    zeros (the training labels' frequencies: predicting their majority class), never
    class 0 by default."""
    graph, exchange = dg.graph, dg.exchange()
    window = window or edge_window(graph.edges_per_part, num_classes)
    placed = Placed(labels.layout)

    def body(graph, label, known):
        held, at = placed.positions(graph, exchange.axis)
        seen = known & held
        onehot = jax.nn.one_hot(label, num_classes, dtype=jnp.float32) * seen[:, None]
        # The training labels' frequencies, over every device.
        counts = lax.psum(jnp.sum(onehot, axis=0), exchange.axis)
        prior = counts / jnp.maximum(jnp.sum(counts), 1.0)
        y0 = placed.put(onehot, at, graph.nodes_per_part)
        clamp = placed.put(seen, at, graph.nodes_per_part)
        y, lost = propagate(y0, graph, exchange, steps=steps, alpha=alpha, norm=norm,
                            window=window,
                            after=lambda y: jnp.where(clamp[:, None], y0, y))
        out = placed.take(y, held, at)
        out = jnp.where(jnp.any(out > 0, axis=1, keepdims=True), out, prior[None])
        return jnp.where(held[:, None], out, 0.0), lost

    scores, lost = _program(body, dg.graph, dg.mesh, (ROWS, ROWS))(graph, labels.array,
                                                                   train.array)
    _checked("label propagation", lost)
    return DistTensor(scores, labels.layout, "label propagation", dg.mesh)


def correct_and_smooth(dg, probs, labels, train, *, correct_steps: int,
                       correct_alpha: float, smooth_steps: int, smooth_alpha: float,
                       autoscale: bool = True, scale: float = 1.0,
                       norm: Norm = Norm.SYMMETRIC, window: int | None = None
                       ) -> DistTensor:
    """A base predictor's class probabilities corrected and smoothed once
    (`CorrectAndSmooth`, whose arguments these are)."""
    return CorrectAndSmooth(dg, labels, train, int(probs.array.shape[1]),
                            correct_steps=correct_steps, smooth_steps=smooth_steps,
                            autoscale=autoscale, norm=norm, window=window)(
        probs, correct_alpha, smooth_alpha, scale)


class CorrectAndSmooth:
    """A base predictor's class probabilities (float32 [rows, C] of the labelled type,
    a `DistTensor` in the labels' layout) corrected and smoothed (Huang et al., ICLR
    2021, as PyG's `CorrectAndSmooth` computes them); one program for the graph, the
    labels (`labels`: the labelled type's int `DistTensor`, `train`: its bool mask)
    and the steps, called with any alphas and scale:

    - correct: the training rows' errors (one-hot label - probability; zeros
      elsewhere) propagated `correct_steps` steps with the correction's alpha, then
      added. autoscale: clipped to [-1, 1] after each step, and each row's scaled to
      the training rows' mean absolute error (sigma / the row's own; 1 where a row has
      none, or where that would exceed 1000); else the training rows are reset to
      their errors after each step and every row is scaled by `scale`;
    - smooth: the corrected rows, the training rows set to their one-hot labels,
      propagated `smooth_steps` steps with the smoothing's alpha, clipped to [0, 1]
      after each.
    """

    def __init__(self, dg, labels, train, classes: int, *, correct_steps: int,
                 smooth_steps: int, autoscale: bool = True, norm: Norm = Norm.SYMMETRIC,
                 window: int | None = None):
        self.program = smoothing_program(dg.graph, dg.exchange(), labels.layout, classes,
                                         dg.mesh, correct_steps=correct_steps,
                                         smooth_steps=smooth_steps, autoscale=autoscale,
                                         norm=norm, window=window)
        self.dg, self.labels, self.train = dg, labels, train

    def __call__(self, probs, correct_alpha: float, smooth_alpha: float,
                 scale: float = 1.0) -> DistTensor:
        alphas = jnp.asarray([correct_alpha, smooth_alpha, scale], jnp.float32)
        out, lost = self.program(self.dg.graph, probs.array, self.labels.array,
                                 self.train.array, alphas)
        _checked("correct and smooth", lost)
        return DistTensor(out, self.labels.layout, "correct and smooth", self.dg.mesh)


def smoothing_program(graph, exchange, layout, classes: int, mesh, *, correct_steps: int,
                      smooth_steps: int, autoscale: bool = True,
                      norm: Norm = Norm.SYMMETRIC, window: int | None = None):
    """Correct & Smooth's program (see `CorrectAndSmooth`) on `mesh` (the graph's, or
    one of other hardware: `jgraph compile --program correct_and_smooth`): `(graph,
    probs, labels, train, alphas) -> (rows, ids lost)`; probs float32 [P * rows, C],
    labels and the train mask row-sharded in `layout`, alphas float32[3] (the
    correction's and the smoothing's alphas, the scale) replicated."""
    window = window or edge_window(graph.edges_per_part, classes)
    placed = Placed(layout)
    n = graph.nodes_per_part

    def body(graph, soft, label, known, alphas):
        correct_alpha, smooth_alpha, scale = alphas[0], alphas[1], alphas[2]
        held, at = placed.positions(graph, exchange.axis)
        seen = (known & held)[:, None]
        truth = jax.nn.one_hot(label, classes, dtype=jnp.float32)
        error = jnp.where(seen, truth - soft, 0.0)
        e0, fixed = placed.put(error, at, n), placed.put(seen[:, 0], at, n)[:, None]
        if autoscale:
            spread, lost1 = propagate(e0, graph, exchange, steps=correct_steps,
                                      alpha=correct_alpha, norm=norm, window=window,
                                      after=lambda y: jnp.clip(y, -1.0, 1.0))
            spread = placed.take(spread, held, at)
            total = lax.psum(jnp.sum(jnp.abs(error)), exchange.axis)
            sigma = total / lax.psum(jnp.sum(seen), exchange.axis)
            factor = sigma / jnp.sum(jnp.abs(spread), axis=1, keepdims=True)
            factor = jnp.where(jnp.isinf(factor) | (factor > 1000), 1.0, factor)
            corrected = soft + factor * spread
            corrected = jnp.where(jnp.isnan(corrected), soft, corrected)
        else:
            spread, lost1 = propagate(e0, graph, exchange, steps=correct_steps,
                                      alpha=correct_alpha, norm=norm, window=window,
                                      after=lambda y: jnp.where(fixed, e0, y))
            corrected = soft + scale * placed.take(spread, held, at)
        start = placed.put(jnp.where(seen, truth, corrected), at, n)
        smooth, lost2 = propagate(start, graph, exchange, steps=smooth_steps,
                                  alpha=smooth_alpha, norm=norm, window=window,
                                  after=lambda y: jnp.clip(y, 0.0, 1.0))
        out = placed.take(smooth, held, at)
        return jnp.where(held[:, None], out, 0.0), lost1 + lost2

    return _program(body, graph, mesh, (ROWS, ROWS, ROWS, REPLICATED))


def rows_summing_to_one(scores: DistTensor) -> DistTensor:
    """`scores` (non-negative) with each row divided by its sum: class probabilities;
    a row of zeros (nothing reached it, from a base of zeros) becomes uniform."""
    return DistTensor(_rows_summing_to_one(scores.array), scores.layout, scores.name,
                      scores.mesh)


@jax.jit
def _rows_summing_to_one(scores):
    total = jnp.sum(scores, axis=1, keepdims=True)
    return jnp.where(total > 0, scores / jnp.where(total > 0, total, 1.0),
                     1.0 / scores.shape[1])


def labelled_rows(dg, layout, rows) -> DistTensor:
    """The rows of `layout`'s node type (a `DistTensor` in that layout) of `rows`, a
    row-sharded array of every node's rows [P * nodes_per_part, ...] (what full-graph
    inference gives)."""
    placed, axis = Placed(layout), dg.exchange().axis

    def body(graph, rows):
        held, at = placed.positions(graph, axis)
        return placed.take(rows, held, at)

    out = _program(body, dg.graph, dg.mesh, (ROWS,), ROWS)(dg.graph, rows)
    return DistTensor(out, layout, "labelled rows", dg.mesh)


def placed_rows(dg, layout, rows):
    """The inverse of `labelled_rows`: `rows` (row-sharded, in `layout`, the rows of its
    node type) written into each device's block of every node, [P * nodes_per_part,
    ...] row-sharded, zeros in other types' rows."""
    placed, axis = Placed(layout), dg.exchange().axis

    def body(graph, rows):
        _, at = placed.positions(graph, axis)
        return Placed.put(rows, at, graph.nodes_per_part)

    return _program(body, dg.graph, dg.mesh, (ROWS,), ROWS)(dg.graph, rows)
