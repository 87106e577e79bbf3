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
import numpy as np
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


def label_propagation(dg, labels, train, num_classes: int, *, steps: int, alpha: float,
                      norm: Norm = Norm.SYMMETRIC, window: int | None = None):
    """Class scores of every node of the labelled type by label propagation (Zhou et
    al., 2004), a `DistTensor` float32 [rows, num_classes] in the labels' layout.

    Y0 holds the training nodes' one-hot labels (`labels`: the labelled type's int
    `DistTensor`, `train`: its bool mask) and zeros everywhere else, nodes of every
    other type included; `steps` steps propagate it, the training rows clamped back to
    their labels after each. A row no label reaches holds the class prior instead of
    zeros (the training labels' frequencies: predicting their majority class), never
    class 0 by default."""
    layout, graph, mesh = labels.layout, dg.graph, dg.mesh
    exchange = dg.exchange()
    window = window or edge_window(graph.edges_per_part, num_classes)
    # This device's labelled rows sit in its block of every node from `first` on.
    first = jnp.asarray(layout.starts - layout.offsets[:-1], jnp.int32)
    count = jnp.asarray(layout.counts, jnp.int32)
    rows = layout.rows_per_part
    prior = jnp.asarray(class_prior(labels, train, num_classes))

    def body(graph, label, known):
        me = lax.axis_index(exchange.axis)
        held = jnp.arange(rows) < count[me]
        at = jnp.where(held, first[me] + jnp.arange(rows), graph.nodes_per_part)
        seen = known & held
        onehot = jax.nn.one_hot(label, num_classes, dtype=jnp.float32) * seen[:, None]
        y0 = jnp.zeros((graph.nodes_per_part, num_classes), jnp.float32).at[at].set(
            onehot, mode="drop")
        clamp = jnp.zeros(graph.nodes_per_part, bool).at[at].set(seen, mode="drop")
        y, lost = propagate(y0, graph, exchange, steps=steps, alpha=alpha, norm=norm,
                            window=window,
                            after=lambda y: jnp.where(clamp[:, None], y0, y))
        out = y[jnp.where(held, at, 0)]
        out = jnp.where(jnp.any(out > 0, axis=1, keepdims=True), out, prior[None])
        return jnp.where(held[:, None], out, 0.0), lost

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(graph.specs(), ROWS, ROWS),
                                    out_specs=(ROWS, REPLICATED)))
    scores, lost = program(graph, labels.array, train.array)
    if int(lost):
        raise RuntimeError(f"label propagation: {int(lost)} in-edge source id(s) are not "
                           f"nodes of the graph")
    return DistTensor(scores, layout, "label propagation", mesh)


def class_prior(labels, train, num_classes: int):
    """float32[C]: the training nodes' class frequencies."""
    held = labels.to_numpy()[train.to_numpy()]
    counts = np.bincount(held[held >= 0], minlength=num_classes).astype(np.float32)
    return counts / max(counts.sum(), 1.0)
