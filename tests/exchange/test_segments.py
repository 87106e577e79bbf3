"""The segment primitives (jgraph/exchange/segments.py) against plain numpy: running sums
along every axis and at every level of their CPU formulation, which segment holds a
position (both formulations, batched, empty segments, positions at and past every
boundary). Owned rows read, routed and stored: tests/exchange/test_rows.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.exchange.segments import (
    FEW_SEGMENTS,
    _counted,
    _searched,
    exclusive_sum,
    owner_of,
    running_count,
    segment_of,
)

# -- running sums ------------------------------------------------------------------------


@pytest.mark.slow        # every level of the running sums compiled: 20 s
def test_running_count_and_exclusive_sum_equal_numpy_cumsum_at_every_level():
    """The counts that programs for CPU use (a masked sum along axes of up to
    FEW_SEGMENTS; matmuls in one level of blocks of 64, two, three; a single row; empty
    arrays), and cumsum (a bound past 2^24), against numpy along every axis of 1-, 2-
    and 3-dimensional arrays."""
    rng = np.random.default_rng(5)
    count = jax.jit(running_count, static_argnums=1)
    starts = jax.jit(exclusive_sum, static_argnums=(1, 2))
    for n in (0, 1, 3, FEW_SEGMENTS, FEW_SEGMENTS + 1, 63, 64, 65, 4097, 300_001):
        for shape, axis in (((n,), 0), ((n, 3), 0), ((3, n), 1), ((1, n), 1), ((n, 1), 0),
                            ((2, n, 3), 1)):
            flags = rng.random(shape) < 0.3
            np.testing.assert_array_equal(count(flags, axis), np.cumsum(flags, axis=axis))
            sizes = rng.integers(0, 50, shape).astype(np.int32)
            for most in (50 * max(n, 1), 1 << 24):
                np.testing.assert_array_equal(starts(jnp.asarray(sizes), most, axis),
                                              np.cumsum(sizes, axis=axis) - sizes)


@pytest.mark.slow      # 2^24 entries
def test_a_running_count_past_two_to_the_24_stays_exact():
    """Past float32's exact integers, the blocks' starts are carried in int32."""
    flags = np.random.default_rng(6).random((1 << 24) + 100) < 0.9
    got = np.asarray(jax.jit(running_count)(flags))
    want = np.cumsum(flags, dtype=np.int64)
    assert want[-1] > (1 << 24) * 0.8
    np.testing.assert_array_equal(got, want)


def test_cpu_counts_lower_to_matmuls_without_a_reduce_window():
    """What the matmul counts are for: no cumsum (a reduce-window XLA:CPU splits into a
    tree of kernels) in the program built for CPU."""
    text = jax.jit(lambda f, c: (running_count(f), exclusive_sum(c, 1 << 20))).lower(
        np.zeros(5000, bool), np.zeros(FEW_SEGMENTS + 1, np.int32)).as_text()
    assert "dot_general" in text and "reduce_window" not in text


def test_cpu_sums_of_short_axes_are_one_masked_sum():
    """Along FEW_SEGMENTS entries or fewer, neither a cumsum nor a matmul (and its
    conversions to float32): a masked sum in int32."""
    text = jax.jit(lambda f, c: (running_count(f, 1), exclusive_sum(c, 1 << 30))).lower(
        np.zeros((300, FEW_SEGMENTS), bool), np.zeros(FEW_SEGMENTS, np.int32)).as_text()
    assert "reduce_window" not in text and "dot_general" not in text and "f32" not in text


# -- which segment -----------------------------------------------------------------------


def numpy_segment_of(starts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The last segment starting at or below each position, in [0, S - 1]."""
    found = np.searchsorted(starts, positions, side="right") - 1
    return np.clip(found, 0, starts.size - 1)


def segment_cases():
    """(starts int32[S], positions) of segments from these sizes laid end to end from
    a few below zero: every start, one below and one above it, and past both ends."""
    rng = np.random.default_rng(7)
    sizes = [(4,), (0, 0, 3), (2, 0, 0, 5, 0), tuple(range(FEW_SEGMENTS)),
             tuple(rng.integers(0, 3, FEW_SEGMENTS + 1)), tuple(rng.integers(0, 4, 300))]
    for size in sizes:
        starts = (np.concatenate([[0], np.cumsum(size)[:-1]]) - 3).astype(np.int32)
        end = int(starts[-1]) + size[-1]
        positions = np.unique(np.concatenate([starts - 1, starts, starts + 1,
                                              [-100, end - 1, end, end + 100]]))
        yield starts, positions.astype(np.int32)


@pytest.mark.parametrize("form", [segment_of, _counted, _searched],
                         ids=["segment_of", "counted", "searched"])
def test_segment_of_is_the_last_segment_starting_at_or_below(form):
    """Each formulation (counted: CPU's up to FEW_SEGMENTS; searched: otherwise) on its
    own, and the choice segment_of makes, against numpy: empty segments (repeated
    starts: the position goes to the last of them), one segment, boundaries."""
    for starts, positions in segment_cases():
        got = jax.jit(form)(jnp.asarray(starts), jnp.asarray(positions))
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(got, numpy_segment_of(starts, positions))


@pytest.mark.parametrize("form", [_counted, _searched], ids=["counted", "searched"])
def test_segment_of_with_leading_axes_searches_each_row_apart(form):
    """starts [2, 3, S] and positions [2, 3, m]: row (a, b)'s positions in row (a, b)'s
    segments (relay's three buffers of P rows); and a scalar position."""
    rng = np.random.default_rng(8)
    sizes = rng.integers(0, 4, (2, 3, 6))
    starts = (np.cumsum(sizes, -1) - sizes).astype(np.int32)
    positions = rng.integers(-2, 20, (2, 3, 9)).astype(np.int32)
    got = jax.jit(form)(jnp.asarray(starts), jnp.asarray(positions))
    for a in range(2):
        for b in range(3):
            np.testing.assert_array_equal(got[a, b],
                                          numpy_segment_of(starts[a, b], positions[a, b]))
    assert int(jax.jit(form)(jnp.asarray(starts[0, 0]), jnp.int32(5))) == int(
        numpy_segment_of(starts[0, 0], np.array([5]))[0])


def test_segment_of_counts_few_segments_for_cpu_and_searches_many():
    """The CPU program for up to FEW_SEGMENTS segments has no loop (a search's); for
    more it searches (an [n, S] comparison would grow with S)."""
    positions = np.zeros(1000, np.int32)
    few = jax.jit(segment_of).lower(np.arange(FEW_SEGMENTS, dtype=np.int32),
                                    positions).as_text()
    many = jax.jit(segment_of).lower(np.arange(FEW_SEGMENTS + 1, dtype=np.int32),
                                     positions).as_text()
    assert "while" not in few and "while" in many


@pytest.mark.parametrize("sizes", [(5, 0, 12, 7, 70, 3, 9, 16), (0, 0, 4), (9,),
                                   tuple(range(20))])
def test_owner_of_is_the_partition_whose_range_holds_the_id(sizes):
    """Against numpy's search of the offsets: empty partitions, one partition, more
    partitions than one comparison each takes (a binary search), ids past both ends."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = np.arange(-3, int(offsets[-1]) + 4, dtype=np.int32)
    want = np.clip(np.searchsorted(offsets, ids, side="right") - 1, 0, len(sizes) - 1)
    np.testing.assert_array_equal(jax.jit(lambda q: owner_of(offsets, q))(ids), want)
