"""Edge-weighted neighbour draws (probability proportional to weight).

Each device keeps, per in-edge, the float32 running weight of its node's in-edges up to
and including it (restarting at every node: `edge_weight_cumsum`). Rounding is never
allowed to hide a weight: an edge of weight > 0 runs strictly above the edge before it,
one of weight 0 runs equal, so "has weight" is an exact comparison of two stored floats.

A draw is a point in a node's weight, located by bisection. Without replacement
(successive sampling, as DGL's weighted `sample_neighbors`) the point is drawn in the
weight of the gaps between the edges already chosen and clamped into the gap it falls
in, so whatever the rounding, a draw is a free edge with weight while one is left.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jgraph.segments as segments
from jgraph.hashing import hash32
from jgraph.mesh import shard_rows
from jgraph.sharded.graph import DistGraph

# float32's smallest normal: the least step between running weights, so the gap of a
# positive weight survives flush-to-zero of subnormal differences.
_TINY = np.finfo(np.float32).tiny


def running_weights(weights: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """float32[e]: each node's running sum of its in-edges' weights (summed in float64,
    rounded), raised where rounding would hide a positive weight: an edge of weight
    > 0 runs above the edge before it (0 before a node's first edge) by at least one
    float32 step and _TINY; an edge of weight 0 runs equal to it.

    weights: float[e] finite, >= 0; indptr: int[n + 1] each node's in-edge range.
    A weight hidden by rounding (1e-6 after 1e6) keeps the least weight float32 can
    hold there, about one part in 2**24 of the node's weight.
    """
    w = np.asarray(weights, np.float64)
    indptr = np.asarray(indptr)
    run = np.cumsum(w)
    node = segments.segment_ids(np.diff(indptr))
    before = np.concatenate([[0.0], run])[indptr[:-1]]
    with np.errstate(over="ignore"):            # past float32's range: inf, refused
        out = (run - before[node]).astype(np.float32)
    first = np.zeros(w.size, bool)
    first[indptr[:-1][np.diff(indptr) > 0]] = True

    def least(i):
        prev = np.where(first[i], np.float32(0), out[i - 1])
        step = np.maximum(np.nextafter(prev, np.float32(np.inf)), prev + _TINY)
        return np.where(w[i] > 0, step, prev)

    # Raising an edge can push the next one of its node below its own least value;
    # only those are looked at again, so the work is the length of the raised runs.
    i = np.arange(w.size)
    while i.size:
        low = least(i)
        under = out[i] < low
        i = i[under]
        out[i] = low[under]
        i = i + 1
        i = i[i < w.size]
        i = i[~first[i]]
    return out


def edge_weight_cumsum(dg: DistGraph, name: str = "weight") -> jax.Array:
    """float32[P * e] row-sharded: per-node running sums of the edge array `name`
    (`running_weights`: exact sums where float32 holds them).

    Raises KeyError when the partition has no edge array `name`, and ValueError, naming
    the array, when it is not one value per edge, negative or not finite, or when a
    node's weights sum past float32's range.
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
        run = running_weights(w, p.indptr)
        if not np.all(np.isfinite(run)):
            bad = int(np.flatnonzero(~np.isfinite(run))[0])
            raise ValueError(f"{dg.parts.root}: edge data {name!r} of partition {k} sums "
                             f"past float32's range at edge {bad}; scale the weights down")
        return run
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


def running_weight_at(cumw, lo, deg, node_lo=None):
    """run(p): float32[m, k] the running weight at relative position p: int32[m, k] of
    each row's range [lo, lo + deg), as stored in cumw (not shifted to start at 0):
    p = -1 gives the weight before the range (0, or when node_lo, each node's first
    in-edge, says the range starts inside the node, the node's weight before lo) and
    p >= deg that at deg - 1. An edge p has weight exactly when run(p) > run(p - 1)."""
    lo, deg = lo[:, None], deg[:, None]
    last = cumw.shape[0] - 1
    before = jnp.float32(0.0) if node_lo is None else jnp.where(
        lo > node_lo[:, None], cumw[jnp.clip(lo - 1, 0, last)], 0.0)

    def run(p):
        p = jnp.minimum(p, deg - 1)
        return jnp.where(p >= 0, cumw[jnp.clip(lo + p, 0, last)], before)
    return run


def weighted_edges(lo, deg, width: int, cumw, node_lo=None):
    """int32[m, width]: every edge of each row's range that has weight, in order, -1
    after (the rows' degrees must not exceed width)."""
    j = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (lo.shape[0], width))
    run = running_weight_at(cumw, lo, deg, node_lo)
    take = (j < deg[:, None]) & (run(j) > run(j - 1))
    return jnp.where(take, lo[:, None] + j, -1)


def weighted_positions(lo, deg, keys, fanout: int, replace: bool, cumw, max_degree: int,
                       node_lo=None):
    """int32[m, fanout] edge positions drawn with probability proportional to weight;
    -1 where there is no draw: degree 0 or no weight, and without replacement after
    every edge with weight is drawn (so a row holds min(fanout, edges with weight)
    distinct edges, then -1).

    lo, deg: int32[m] each node's in-edge range; keys: uint32[m] its random key;
    cumw: float32[e] from `edge_weight_cumsum`; max_degree bounds the bisection.
    node_lo: int32[m] first in-edge of each node when [lo, lo + deg) is only part of
    its edges (one relation's): the range's weight then starts at the node's running
    weight before lo.
    """
    m = lo.shape[0]
    steps = bisect_steps(max_degree)
    run = running_weight_at(cumw, lo, deg, node_lo)
    before, end = jnp.full((m, 1), -1, jnp.int32), deg[:, None]
    cols = jnp.arange(fanout, dtype=jnp.int32)[None, :]

    def draw(i, state):
        # drawn: int32[m, fanout] positions so far (-1: none yet, or no weight left);
        # taken: the same in position order, deg for each slot not (yet) an edge. The
        # free edges lie in the gaps between -1, the taken edges and deg.
        drawn, taken = state
        u = (hash32(keys, i) >> 8).astype(jnp.float32)[:, None] * jnp.float32(2.0 ** -24)
        bounds = jnp.concatenate([before, taken, end], axis=1)      # [m, fanout + 2]
        low, high = run(bounds[:, :-1]), run(bounds[:, 1:] - 1)     # [m, fanout + 1]
        has = high > low                    # exact: the gap holds an edge with weight
        upto = jnp.cumsum(high - low, axis=1)
        t = u * upto[:, -1:]                # uniform in [0, the free weight]
        # The gap the point falls in; rounding past the end (t >= the summed weight)
        # means the top of the weight: the last gap that has any.
        inside = has & (t < upto)
        last = fanout - jnp.argmax(has[:, ::-1], axis=1)
        k = jnp.where(inside.any(1), jnp.argmax(inside, axis=1), last)[:, None]

        def pick(a):
            return jnp.take_along_axis(a, k, axis=1)
        gap_low, gap_high = pick(low), pick(high)
        point = gap_low + (t - (pick(upto) - (gap_high - gap_low)))
        # Clamped into [low, high) of its gap, the first edge running past the point is
        # in the gap (after the taken edge at its start) and has weight.
        point = jnp.clip(point, gap_low, jnp.nextafter(gap_high, gap_low))
        p = bisect(jnp.zeros_like(end), end, steps, lambda q: run(q) <= point)
        ok = has.any(1, keepdims=True)
        drawn = jnp.where(cols == i, jnp.where(ok, p, -1), drawn)
        if not replace:                     # insert p into taken, in order
            new = jnp.where(ok, p, end)
            at = jnp.sum(taken < new, axis=1, keepdims=True)
            shifted = jnp.concatenate([before, taken[:, :-1]], axis=1)
            taken = jnp.where(cols < at, taken, jnp.where(cols == at, new, shifted))
        return drawn, taken
    # One compiled draw in a loop (as `draw_positions_reference`): unrolled, fanout 10
    # took 12-20 s to compile on the 2-core XLA:CPU host and fanout 25 50 s (as a loop
    # 1.5 s and 2.3 s, the same draws; measured). The carry is built from lo and deg
    # so that inside shard_map it varies over the mesh as they do.
    drawn = jnp.full((m, fanout), -1, jnp.int32) + jnp.zeros_like(lo)[:, None]
    taken = jnp.broadcast_to(end, (m, fanout))
    drawn, _ = jax.lax.fori_loop(0, fanout, draw, (drawn, taken))
    return jnp.where(drawn >= 0, lo[:, None] + drawn, -1)
