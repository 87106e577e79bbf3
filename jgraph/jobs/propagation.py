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

from jgraph.jobs.windows import Summed, window_aggregate


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
