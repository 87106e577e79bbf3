"""Segment arithmetic, in one place: runs of entries laid end to end (an owner's group of
a request, a node's in-edges, a round's chunks) and the partition that owns an id.
Traced inside `shard_map`; where the lowering platform matters, each primitive makes
its choice here, once.

- `running_count`, `exclusive_sum`: running counts, and where segments of given sizes
  start;
- `segment_of`, `owner_of`: which segment holds a position (which partition owns an id).

Rows (an owned id's row in this device's block, rows routed to their owners) are
`jgraph.exchange.rows`'.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

FEW_SEGMENTS = 16
"""Up to this many segments (partitions, rounds), programs for CPU compare every position
with every segment ([n, S]: one fused pass, cheaper on XLA:CPU than a search's loop or
a sort) and sum a running sum's [S, S] triangle; beyond it they search (and multiply),
so that memory stays n entries however many segments there are."""

_COUNT_BLOCK = 64
_EXACT = 1 << 24    # float32 holds every integer below this exactly


# -- running sums ------------------------------------------------------------------------


def running_count(flags: jnp.ndarray, axis: int = 0) -> jnp.ndarray:
    """int32 inclusive running count of the True entries of bool `flags` along `axis`.

    Programs lowered for CPU count with float32 matmuls (`_inclusive_last`, exact while
    no count passes 2^24): XLA:CPU lowers a cumsum to a reduce-window that its rewriter
    splits into a tree of kernels (about nine for a request's length, each compiled
    apart), and a parallel-prefix scan compiles into about 2 log2(n) kernels, while a
    float32 matmul is a library call with nothing to compile. Longer arrays carry the
    blocks' totals with an int32 cumsum. Axes of at most `FEW_SEGMENTS` entries (a
    count per device, a schedule's rounds) sum a triangle of them instead, in int32:
    one fused reduction, where a matmul needs conversions around it (and a zero row
    beside a single one). Other platforms keep cumsum. Chosen by the lowering
    platform, not the host's backend.
    """
    if flags.dtype != jnp.bool_:
        raise TypeError(f"running_count counts bool flags, got {flags.dtype}")
    return _prefix(flags, axis, flags.shape[axis], inclusive=True)


def exclusive_sum(counts: jnp.ndarray, most: int, axis: int = 0) -> jnp.ndarray:
    """int32 exclusive running sum of int `counts` (>= 0) along `axis`: where each
    segment starts when segments of these sizes are laid end to end. most: a static
    bound on their total (a request's length, say); on CPU, as `running_count` counts
    (matmuls where it is below 2^24; exact: integers, in any order)."""
    return _prefix(counts.astype(jnp.int32), axis, most, inclusive=False)


def _prefix(x: jnp.ndarray, axis: int, most: int, inclusive: bool) -> jnp.ndarray:
    """int32 running sum of x (>= 0, totals at most `most`) along `axis`, inclusive or
    exclusive: on CPU a masked sum of [m, m] along a short axis, else float32 matmuls
    along the last axis (exact below 2^24; past it, running counts take only their
    first level from a matmul); cumsum elsewhere."""
    def cumsum(x):
        total = jnp.cumsum(x, axis=axis, dtype=jnp.int32)
        return total if inclusive else total - x

    def last(x):
        x = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
        if most < _EXACT:
            out = (_inclusive_last if inclusive else _exclusive_last)(x).astype(jnp.int32)
        else:
            out = _long_count(x)
        return jnp.moveaxis(out, -1, axis)

    def short(x):
        m = x.shape[axis]
        x = jnp.moveaxis(x, axis, -1)
        keep = np.tril(np.ones((m, m), bool), 0 if inclusive else -1)     # [at, before]
        out = jnp.sum(jnp.where(keep, x[..., None, :], 0), axis=-1, dtype=jnp.int32)
        return jnp.moveaxis(out, -1, axis)
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.int32)
    if x.shape[axis] <= FEW_SEGMENTS:
        return lax.platform_dependent(x, cpu=short, default=cumsum)
    if most >= _EXACT and not inclusive:
        return cumsum(x)
    return lax.platform_dependent(x, cpu=last, default=cumsum)


def _blocks_of(x: jnp.ndarray) -> jnp.ndarray:
    """[..., m] -> [..., ceil(m / b), b] for b = `_COUNT_BLOCK`, zero-padded."""
    m, b = x.shape[-1], _COUNT_BLOCK
    blocks = -(-m // b)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * b - m)])
    return x.reshape(x.shape[:-1] + (blocks, b))


def _unblock(x: jnp.ndarray, m: int) -> jnp.ndarray:
    """Inverse of `_blocks_of`: [..., B, b] -> [..., m]."""
    return x.reshape(x.shape[:-2] + (-1,))[..., :m]


def _running(x: jnp.ndarray, strict: bool = False) -> jnp.ndarray:
    """x @ a [m, m] triangle of ones (row <= column, < if strict) for float32[..., m]:
    x's running sum along its last axis, in a matmul XLA:CPU hands to its library (the
    triangle a numpy constant; a single row gets a zero row: a one-row product would
    be a kernel to compile; HIGHEST precision: the sums stay exact whatever the
    default)."""
    m = x.shape[-1]
    triangle = np.triu(np.ones((m, m), np.float32), 1 if strict else 0)
    if math.prod(x.shape[:-1]) > 1:
        return jnp.matmul(x, triangle, precision=lax.Precision.HIGHEST)
    rows = jnp.stack([x.reshape(m), jnp.zeros(m, x.dtype)])
    return jnp.matmul(rows, triangle, precision=lax.Precision.HIGHEST)[0].reshape(x.shape)


def _inclusive_last(x: jnp.ndarray) -> jnp.ndarray:
    """float32[..., n] inclusive running sum of float32 x (0 or 1) along its last axis:
    a triangle of ones within blocks of `_COUNT_BLOCK`, plus where each block starts
    (`_exclusive_last` of the blocks' totals)."""
    within = _running(_blocks_of(x))
    return _unblock(within + _exclusive_last(within[..., -1])[..., None], x.shape[-1])


def _exclusive_last(x: jnp.ndarray) -> jnp.ndarray:
    """float32[..., m] exclusive running sum along the last axis of float32 x: blocks of
    `_COUNT_BLOCK` as `_inclusive_last`, down to one block, summed with a strict
    triangle (log64(m) levels)."""
    m = x.shape[-1]
    if m <= _COUNT_BLOCK:
        return _running(x, strict=True)
    blocks = _blocks_of(x)
    within = _running(blocks)
    return _unblock(within - blocks + _exclusive_last(within[..., -1])[..., None], m)


def _long_count(x: jnp.ndarray) -> jnp.ndarray:
    """int32[..., n] inclusive running count of float32 x (0 or 1) past 2^24 entries:
    a triangle within blocks (exact: at most 64), the blocks' starts by int32 cumsum."""
    within = _running(_blocks_of(x)).astype(jnp.int32)
    totals = within[..., -1]
    before = jnp.cumsum(totals, axis=-1, dtype=jnp.int32) - totals
    return _unblock(within + before[..., None], x.shape[-1])


# -- which segment -----------------------------------------------------------------------


def segment_of(starts, positions) -> jnp.ndarray:
    """int32: the segment holding each of `positions`, for S segments laid end to end
    from `starts` (int[..., S], nondecreasing): the last segment that starts at or below
    the position. An empty segment shares its start with the next, so it holds nothing;
    positions below starts[1] fall in segment 0, those past the end in S - 1. Leading
    axes of `starts` (each its own segments) are leading axes of `positions`.

    Programs for CPU with at most `FEW_SEGMENTS` segments count the starts after the
    first at or below each position (one fused comparison: no loop, no clip to
    compile); otherwise a binary search of the starts (log2(S) passes over the
    positions, their memory alone whatever S).
    """
    starts = jnp.asarray(starts, jnp.int32)
    positions = jnp.asarray(positions)
    if starts.shape[-1] > FEW_SEGMENTS:
        return _searched(starts, positions)
    if starts.shape[-1] == 1:
        return _counted(starts, positions)       # one segment: zeros, nothing to search
    return lax.platform_dependent(starts, positions, cpu=_counted, default=_searched)


def _counted(starts: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """`segment_of`, counting the starts after the first at or below each position."""
    bounds = starts[..., 1:]
    lead = bounds.ndim - 1
    flat = positions.reshape(positions.shape[:lead] + (-1,))
    below = bounds[..., None, :] <= flat[..., None]
    return jnp.sum(below, axis=-1, dtype=jnp.int32).reshape(positions.shape)


def _searched(starts: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """`segment_of` by a binary search of the starts, clipped to the segments. (A
    search of starts[1:] needs no clip, but as `owner_of`, compiled for H100, it left
    full-graph inference 3.8% more temporaries at 8 devices than at 2; this, none.)"""
    last = starts.shape[-1] - 1
    find = lambda s, p: jnp.clip(jnp.searchsorted(s, p, side="right", method="scan") - 1,
                                 0, last)
    for _ in range(starts.ndim - 1):
        find = jax.vmap(find)
    return find(starts, positions).astype(jnp.int32)


def owner_of(offsets: np.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """int32 partition owning each id; partitions own the contiguous ranges
    `offsets[p] <= id < offsets[p + 1]` (ids below the first go to 0, past the last to
    P - 1)."""
    return segment_of(np.asarray(offsets)[:-1], ids)
