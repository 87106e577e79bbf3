"""The host's segment arithmetic (`jgraph.segments`) against plain Python loops, on random
segments and on the edges: no segments, empty segments, one segment, ids on a boundary."""
import numpy as np
import pytest

from jgraph import segments

EDGE_COUNTS = [[], [0], [0, 0, 0], [5], [3, 0, 2], [0, 4, 0], [1, 1, 1, 1]]


def random_counts(rng, trials=20):
    """Count vectors of 0 to 12 segments, many of them empty."""
    for _ in range(trials):
        n = int(rng.integers(0, 13))
        yield rng.integers(0, 4, n) * (rng.random(n) < 0.7)


def every_counts():
    rng = np.random.default_rng(0)
    return [np.asarray(c, np.int64) for c in EDGE_COUNTS] + list(random_counts(rng))


# -- plain loops -------------------------------------------------------------------------


def loop_offsets(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def loop_segment_of(starts, position):
    found = -1
    for i, s in enumerate(starts):
        if s <= position:
            found = i
    return found


def loop_ids_and_positions(counts):
    ids, positions = [], []
    for i, c in enumerate(counts):
        for j in range(int(c)):
            ids.append(i)
            positions.append(j)
    return ids, positions


def loop_range_bounds(counts, most):
    bounds, i = [0], 0
    while i < len(counts):
        j, total = i, 0
        while j < len(counts) and total + counts[j] <= most:
            total += counts[j]
            j += 1
        i = max(j, i + 1)
        bounds.append(i)
    return bounds


# -- tests -------------------------------------------------------------------------------


def test_offsets_are_the_running_totals_from_zero_in_int64():
    for counts in every_counts():
        for given in (counts, counts.astype(np.int32), counts.tolist()):
            got = segments.offsets(given)
            assert got.dtype == np.int64
            assert got.tolist() == loop_offsets(counts)
    assert segments.offsets([]).tolist() == [0]


def test_offsets_sum_past_int32_and_in_the_dtype_asked():
    big = np.full(3, 2**31 - 1, np.int32)
    assert segments.offsets(big).tolist() == loop_offsets(big)
    small = segments.offsets(np.array([3, 0, 2], np.uint8), dtype=np.int32)
    assert small.dtype == np.int32 and small.tolist() == [0, 3, 3, 5]
    assert segments.offsets(np.array([True, False, True])).tolist() == [0, 1, 1, 2]


def test_offsets_along_either_axis_of_a_matrix():
    counts = np.random.default_rng(1).integers(0, 5, (4, 3))
    rows = segments.offsets(counts, axis=1)
    cols = segments.offsets(counts, axis=0)
    assert rows.shape == (4, 4) and cols.shape == (5, 3)
    assert rows.tolist() == [loop_offsets(r) for r in counts]
    assert cols.T.tolist() == [loop_offsets(c) for c in counts.T]


def test_offsets_refuse_counts_that_are_not_integers():
    with pytest.raises(TypeError, match="integers"):
        segments.offsets([1.5, 2.0])


def test_exclusive_sum_is_where_each_segment_starts():
    for counts in every_counts():
        assert segments.exclusive_sum(counts).tolist() == loop_offsets(counts)[:-1]
    counts = np.random.default_rng(2).integers(0, 5, (4, 3)).astype(np.int32)
    got = segments.exclusive_sum(counts, axis=0)
    assert got.dtype == np.int64
    assert got.T.tolist() == [loop_offsets(c)[:-1] for c in counts.T]


def test_exclusive_sum_of_floats_keeps_them_as_cumsum_minus_x():
    x = np.random.default_rng(3).random(50)
    got = segments.exclusive_sum(x)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.cumsum(x) - x)      # the bits callers had
    np.testing.assert_allclose(got, loop_offsets_float(x), rtol=1e-12, atol=1e-12)


def loop_offsets_float(x):
    out, total = [], 0.0
    for v in x:
        out.append(total)
        total += v
    return out


def test_segment_of_is_the_last_segment_starting_at_or_below_each_position():
    for counts in every_counts():
        bounds = loop_offsets(counts)
        # Every position from below the first start to past the end, boundaries included.
        positions = np.arange(-2, bounds[-1] + 3)
        for starts in (bounds[:-1], bounds):            # starts alone, or offsets
            if not starts:
                continue
            got = segments.segment_of(np.asarray(starts), positions)
            assert got.dtype == np.int64
            assert got.tolist() == [loop_segment_of(starts, int(p)) for p in positions]


def test_segment_of_a_position_in_range_skips_empty_segments():
    bounds = np.array([0, 2, 2, 2, 5, 5])               # segments 1, 2 and 4 are empty
    assert segments.segment_of(bounds, [0, 1, 2, 4, 5]).tolist() == [0, 0, 3, 3, 5]
    assert segments.segment_of(bounds, -1) == -1
    assert int(segments.segment_of([0, 3], 3)) == 1      # a scalar in, a scalar out


def test_segment_ids_and_positions_number_every_entry():
    for counts in every_counts():
        ids, positions = loop_ids_and_positions(counts)
        got_ids = segments.segment_ids(counts)
        got_positions = segments.segment_positions(counts)
        assert got_ids.dtype == np.int64 and got_positions.dtype == np.int64
        assert got_ids.tolist() == ids
        assert got_positions.tolist() == positions
        assert segments.segment_ids(counts.tolist(), np.int32).dtype == np.int32
        assert segments.segment_positions(counts.astype(np.int32)).tolist() == positions


def test_group_by_lists_each_keys_entries_in_their_order():
    rng = np.random.default_rng(4)
    cases = [np.zeros(0, np.int64), np.zeros(5, np.int64), np.full(3, 3, np.uint16)]
    cases += [rng.integers(0, 4, int(rng.integers(0, 30))).astype(dtype)
              for dtype in (np.int64, np.int32, np.uint16) for _ in range(5)]
    for keys in cases:
        for n in (4, 6):
            order, bounds = segments.group_by(keys, n)
            assert bounds.tolist() == loop_offsets([(keys == k).sum() for k in range(n)])
            for k in range(n):
                members = [i for i, key in enumerate(keys.tolist()) if key == k]
                assert order[bounds[k]:bounds[k + 1]].tolist() == members


def test_distinct_is_the_sorted_set_of_the_values():
    """`distinct` against a reference set: empty, one value, all alike, repeats of
    a few, of many (int64 past 2^32, negatives), a matrix (flattened), byte strings."""
    rng = np.random.default_rng(6)
    cases = [np.zeros(0, np.int64), np.array([7], np.int32), np.full(9, 3, np.uint16),
             rng.integers(0, 5, 40), rng.integers(-(1 << 40), 1 << 40, 5000),
             rng.integers(0, 4, (6, 5)).astype(np.int32),
             np.array([b"b", b"a", b"bb", b"a", b""], "S2")]
    for values in cases:
        got = segments.distinct(values)
        assert got.dtype == values.dtype and got.ndim == 1
        assert got.tolist() == sorted(set(values.ravel().tolist()))


def test_range_bounds_cut_segments_greedily_below_the_most():
    rng = np.random.default_rng(5)
    cases = [np.asarray(c, np.int64) for c in EDGE_COUNTS]
    cases += [rng.integers(0, 9, int(rng.integers(0, 25))) for _ in range(20)]
    for counts in cases:
        for most in (0, 1, 4, 10, 1000):
            got = segments.range_bounds(counts, most)
            assert got.dtype == np.int64
            assert got.tolist() == loop_range_bounds(counts.tolist(), most)
