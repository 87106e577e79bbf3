"""Segment arithmetic on the host, in numpy: runs of entries laid end to end (a node's
in-edges, a partition's ids, a bucket's edges) described by their counts, their
offsets, or each entry's segment id. The device-side counterpart, traced inside
`shard_map`, is `jgraph.exchange.segments`; the words are the same.

- `offsets`, `exclusive_sum`: where segments of given sizes start (and end);
- `segment_of`: which segment holds a position (which partition owns an id);
- `segment_ids`, `segment_positions`: each entry's segment, and its place in it;
- `group_by`: entries sorted into the segments their keys name;
- `distinct`: the sorted distinct values of an array (np.unique's, by a sort);
- `range_bounds`: consecutive segments cut into ranges of a bounded total.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike


def offsets(counts: ArrayLike, axis: int = -1, dtype: DTypeLike = np.int64) -> np.ndarray:
    """dtype[..., n + 1] (int64 unless told): where each of n segments of sizes `counts`
    (int[..., n], >= 0) starts along `axis`, then where the last ends; segment i is
    [offsets[i], offsets[i + 1]). offsets(sizes)[-1] is their total; an empty `counts`
    gives [0]. Summed in `dtype` (int64: no overflow of int32 counts); counts of any other
    kind than bool or integer raise TypeError."""
    counts = np.asarray(counts)
    if counts.size and counts.dtype.kind not in "biu":
        raise TypeError(f"segment counts are integers, got {counts.dtype}")
    shape = list(counts.shape)
    shape[axis] += 1
    out = np.zeros(shape, dtype)
    ends = np.moveaxis(out, axis, -1)[..., 1:]          # a view of out past its zeros
    np.cumsum(np.moveaxis(counts, axis, -1), axis=-1, dtype=dtype, out=ends)
    return out


def exclusive_sum(x: ArrayLike, axis: int = 0) -> np.ndarray:
    """x's exclusive running sum along `axis`: for counts, where each segment starts
    (`offsets` without the end), in numpy's cumsum dtype (int64 for int32 or bool
    counts; float64 sums of floats stay floats, computed as cumsum(x) - x)."""
    x = np.asarray(x)
    return np.cumsum(x, axis=axis) - x


def segment_of(starts: ArrayLike, positions: ArrayLike) -> np.ndarray:
    """int64 (a numpy integer for a scalar position): the segment holding each of
    `positions`, for segments laid end to end from `starts` (int[S], nondecreasing):
    the last one that starts at or below the position. An empty segment shares its
    start with the next, so it holds nothing.

    `starts` may be a segments' `offsets` (their S starts and the end, [S + 1]): the
    segments are the same, and a position at or past the end gets S, out of range.
    Positions below starts[0] get -1. Unlike the device's `segment_of`, nothing is
    clipped: callers check their ids, or read -1 / S as "not in any segment".
    """
    return np.searchsorted(starts, positions, side="right") - 1


def segment_ids(counts: ArrayLike, dtype: DTypeLike = np.int64) -> np.ndarray:
    """dtype[sum(counts)]: each entry's segment, for segments of sizes `counts` (int[n],
    >= 0) laid end to end: i repeated counts[i] times (CSR row of each entry)."""
    return np.repeat(np.arange(len(counts), dtype=dtype), counts)


def segment_positions(counts: ArrayLike) -> np.ndarray:
    """int64[sum(counts)]: each entry's position within its segment (0 at the segment's
    first entry), for segments of sizes `counts` (int[n], >= 0) laid end to end."""
    counts = np.asarray(counts)
    starts = offsets(counts)
    return np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], counts)


def group_by(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order int64[m], offsets int64[n + 1]): the stable order that sorts `keys`
    (int[m], in [0, n)), and where each key's entries lie in it: order[offsets[k]:
    offsets[k + 1]] are the entries of key k, in their own order."""
    order = np.argsort(keys, kind="stable")
    return order, np.searchsorted(keys[order], np.arange(n + 1))


def distinct(values: ArrayLike) -> np.ndarray:
    """The sorted distinct values of `values` (flattened; integers or strings), as
    `np.unique(values)`, by a sort and a comparison of neighbours: numpy 2.4's
    `np.unique` without `return_*` hashes, some 20x slower than sorting on 10M
    distinct int64 (14 s against 0.7)."""
    flat = np.sort(np.ravel(values))
    if flat.size < 2:
        return flat
    keep = np.empty(flat.size, bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    return flat[keep]


def range_bounds(counts: ArrayLike, most: int) -> np.ndarray:
    """int64[R + 1]: consecutive ranges of n segments, [bounds[r], bounds[r + 1]), whose
    `counts` (int[n]: each segment's entries, or an upper bound of them) total at most
    `most`; a segment with more holds a range of its own. [0] when n is 0."""
    counts = np.asarray(counts)
    n = counts.size
    ends = np.cumsum(counts, dtype=np.int64)
    bounds = [0]
    while bounds[-1] < n:
        base = ends[bounds[-1] - 1] if bounds[-1] else 0
        nxt = int(np.searchsorted(ends, base + most, side="right"))
        bounds.append(min(max(nxt, bounds[-1] + 1), n))
    return np.asarray(bounds, np.int64)
