"""Edge-weighted neighbour draws (probability proportional to weight).

Each device keeps, per in-edge, the cumulative weight of its node's in-edges up to and
including it (restarting at every node: `edge_weight_cumsum`). A draw is a uniform
point in [0, total weight) located by bisection. Without replacement the next draw
takes a point in the weight left over and steps over the edges already chosen
(successive sampling, as DGL's weighted `sample_neighbors`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.dist.graph import DistGraph
from jgraph.dist.mesh import shard_rows
from jgraph.kernels.sample import hash32


def edge_weight_cumsum(dg: DistGraph, name: str = "weight") -> jax.Array:
    """float32[P * e] row-sharded: per-node running sums of the edge array `name`.

    Raises KeyError when the partition has no edge array `name`, and ValueError, naming
    the array, when it is not one value per edge, negative or not finite.
    """
    specs = dg.meta.edge_data
    if name not in specs:
        raise KeyError(f"edge data {name!r} is not in {dg.parts.root}; it has {sorted(specs)}")
    e = dg.graph.edges_per_part

    def part(k):
        p = dg.parts.part(k)
        w = np.asarray(p.edge_data[name])
        if w.ndim != 1:
            raise ValueError(f"{dg.parts.root}: edge data {name!r} has shape {w.shape}; "
                             f"weighted sampling needs one number per edge")
        w = w.astype(np.float64)
        if not np.all(np.isfinite(w)) or (w < 0).any():
            bad = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
            raise ValueError(f"{dg.parts.root}: edge data {name!r} of partition {k} has "
                             f"weight {w[bad]} at edge {bad}; weights must be finite and >= 0")
        run = np.cumsum(w)
        indptr = np.asarray(p.indptr)
        node = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        before = np.concatenate([[0.0], run])[indptr[:-1]]
        return (run - before[node]).astype(np.float32)
    return shard_rows(dg.mesh, e, (), np.float32, part)


def bisect_steps(max_degree: int) -> int:
    """Halvings that close any range of up to `max_degree` positions."""
    return max(int(max_degree), 1).bit_length() + 1


def bisect(a, b, steps: int, go_right):
    """Per row, the first p in [a, b) where `go_right(p)` is False (b if none), for a
    predicate that is True then False along the range; a fixed number of steps."""
    for _ in range(steps):
        mid = (a + b) // 2
        active = a < b
        right = go_right(mid)
        a = jnp.where(active & right, mid + 1, a)
        b = jnp.where(active & ~right, mid, b)
    return a


def range_weights(cumw, lo, node_lo=None):
    """(at, weight) over each row's edge range starting at lo: at(p) is the running
    weight up to relative position p, weight(p) that edge's own weight. node_lo: each
    node's first in-edge when lo starts inside it (one relation's range), so the
    node's running weight before lo is taken off."""
    last = cumw.shape[0] - 1
    base = 0.0 if node_lo is None else jnp.where(lo > node_lo, cumw[jnp.clip(lo - 1, 0, last)],
                                                    0.0)

    def at(p):
        return cumw[jnp.clip(lo + p, 0, last)] - base

    def weight(p):
        return at(p) - jnp.where(p > 0, at(p - 1), 0.0)
    return at, weight


def weighted_edges(lo, deg, width: int, cumw, node_lo=None):
    """int32[m, width]: every edge of each row's range that has weight, in order, -1
    after (the rows' degrees must not exceed width)."""
    j = jnp.arange(width, dtype=jnp.int32)[None, :]
    _, weight = range_weights(cumw, lo[:, None], None if node_lo is None else node_lo[:, None])
    take = (j < deg[:, None]) & (weight(j) > 0)
    return jnp.where(take, lo[:, None] + j, -1)


def weighted_positions(lo, deg, keys, fanout: int, replace: bool, cumw, max_degree: int,
                       node_lo=None):
    """int32[m, fanout] edge positions drawn with probability proportional to weight;
    -1 where there is no draw (no weight left, or degree 0).

    lo, deg: int32[m] each node's in-edge range; keys: uint32[m] its random key;
    cumw: float32[e] from `edge_weight_cumsum`; max_degree bounds the bisection.
    node_lo: int32[m] first in-edge of each node when [lo, lo + deg) is only part of
    its edges (one relation's): the running weight before lo is then subtracted.
    """
    m = lo.shape[0]
    steps = bisect_steps(max_degree)
    at, weight = range_weights(cumw, lo, node_lo)
    total = jnp.where(deg > 0, at(deg - 1), 0.0)
    chosen = jnp.full((m, fanout), -1, jnp.int32)
    taken = jnp.zeros(m, jnp.float32)
    cols = jnp.arange(fanout)
    for i in range(fanout):
        u = (hash32(keys, i) >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)
        left = total if replace else total - taken
        t = u * left
        if not replace and i:
            # Step over the chosen edges, in position order, to map t from the
            # remaining weight onto the node's whole range.
            order = jnp.sort(jnp.where(chosen[:, :i] >= 0, chosen[:, :i], jnp.iinfo(jnp.int32).max),
                             axis=1)
            for c in range(i):
                s = order[:, c]
                real = s < deg
                t = jnp.where(real & (t >= at(s) - weight(s)), t + weight(s), t)
        first = bisect(jnp.zeros(m, jnp.int32), deg, steps, lambda p: at(p) <= t)
        p = jnp.minimum(first, jnp.maximum(deg - 1, 0))     # first p with running weight > t
        if not replace and i:
            # Float rounding can land on a chosen (or weightless) edge; take the next
            # free edge with weight instead (there is one while weight is left).
            for s in range(i + 1):
                q = (p + s) % jnp.maximum(deg, 1)
                free = ~jnp.any((chosen == q[:, None]) & (cols < i), axis=1) & (weight(q) > 0)
                bad = jnp.any((chosen == p[:, None]) & (cols < i), axis=1) | (weight(p) <= 0)
                p = jnp.where(bad & free, q, p)
        repeat = jnp.any((chosen == p[:, None]) & (cols < i), axis=1) if not replace else False
        ok = (left > 0) & (deg > 0) & (weight(p) > 0) & ~repeat
        chosen = jnp.where((cols == i)[None], jnp.where(ok, p, -1)[:, None], chosen)
        taken = taken + jnp.where(ok, weight(p), 0.0)
    return jnp.where(chosen >= 0, lo[:, None] + chosen, -1)
