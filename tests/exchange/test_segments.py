"""The segment primitives (jgraph/exchange/segments.py) against plain numpy: running sums
along every axis and at every level of their CPU formulation, which segment holds a
position (both formulations, batched, empty segments, positions at and past every
boundary), and owned rows read, routed and stored on 8 devices, with ids of other
devices and masked ids among them.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.exchange import Exchange
from jgraph.exchange.segments import (
    FEW_SEGMENTS,
    _counted,
    _searched,
    exclusive_sum,
    owned_index,
    owned_rows,
    owner_of,
    route_rows,
    running_count,
    segment_of,
    store_rows,
)
from jgraph.sharded import AXIS, REPLICATED, ROWS, make_mesh

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


# -- this device's rows, on 8 devices -----------------------------------------------------

SIZES = (5, 0, 12, 7, 30, 3, 9, 16)       # partition 1 empty
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
P, N, RPP = len(SIZES), int(OFFSETS[-1]), max(SIZES)
n = 24                                    # ids per device
TABLE = np.random.default_rng(0).integers(-50, 50, (N, 3)).astype(np.float32)


def blocks_of(rows: np.ndarray) -> np.ndarray:
    """Node rows [N, ...] row-sharded: partition k's in block k, padded to RPP rows."""
    out = np.zeros((P * RPP,) + rows.shape[1:], rows.dtype)
    for k in range(P):
        out[k * RPP:k * RPP + SIZES[k]] = rows[OFFSETS[k]:OFFSETS[k + 1]]
    return out


def owner_np(ids):
    return np.clip(np.searchsorted(OFFSETS, ids, side="right") - 1, 0, P - 1)


def device_ids(seed: int):
    """ids int32[P, n] of every partition (repeated, and out of range), mask bool[P, n]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-5, N + 5, (P, n)).astype(np.int32)
    return ids, rng.random((P, n)) < 0.8


@functools.cache
def reading():
    def body(block, ids, valid):
        mine = valid & (owner_of(OFFSETS, ids) == jax.lax.axis_index(AXIS)) & (ids >= 0) & (
            ids < N)
        return (owned_index(ids, mine, OFFSETS[:-1], AXIS),
                owned_index(ids, mine, jnp.asarray(OFFSETS[:-1], jnp.int32), AXIS, fill=-7),
                owned_rows({"x": block, "twice": 2 * block}, OFFSETS[:-1], AXIS)(ids, mine),
                mine)
    return jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=(ROWS,) * 3,
                                 out_specs=(ROWS,) * 4))


def test_owned_index_and_rows_read_this_devices_block_and_zero_elsewhere():
    """Each device's own ids read their rows of its block; ids of other devices, out
    of range or masked read row 0 (or `fill`); offsets static or traced alike."""
    ids, valid = device_ids(1)
    at, filled, rows, mine = reading()(blocks_of(TABLE), ids.reshape(-1), valid.reshape(-1))
    me = np.repeat(np.arange(P), n).reshape(P, n)
    want_mine = valid & (owner_np(ids) == me) & (ids >= 0) & (ids < N)
    np.testing.assert_array_equal(np.asarray(mine).reshape(P, n), want_mine)
    assert want_mine.any() and (valid & ~want_mine).any()
    want_at = np.where(want_mine, ids - OFFSETS[me], 0)
    np.testing.assert_array_equal(np.asarray(at).reshape(P, n), want_at)
    np.testing.assert_array_equal(np.asarray(filled).reshape(P, n),
                                  np.where(want_mine, want_at, -7))
    block = blocks_of(TABLE).reshape(P, RPP, 3)
    want_rows = block[me, want_at]
    np.testing.assert_array_equal(np.asarray(rows["x"]).reshape(P, n, 3), want_rows)
    np.testing.assert_array_equal(np.asarray(rows["twice"]).reshape(P, n, 3), 2 * want_rows)


@functools.cache
def routing(mean: bool, add: bool, where: bool):
    exchange = Exchange(OFFSETS)

    def body(block, ids, valid, rows):
        routed, stats = route_rows(exchange, ids, valid, rows, mean=mean)
        return store_rows(block, routed, OFFSETS[:-1], AXIS, add=add, where=where), stats
    return jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=(ROWS,) * 4,
                                 out_specs=(ROWS, REPLICATED)))


def routed(mean, add, where, seed=2, dtype=np.float32):
    """(the table after the scatter, the numpy table, the stats) of ids of every device
    (the valid ones in range: out-of-range ids are the exchange's to screen)."""
    ids, valid = device_ids(seed)
    valid &= (ids >= 0) & (ids < N)
    rng = np.random.default_rng(seed + 10)
    rows = rng.integers(-9, 10, (P, n, 3)).astype(dtype)      # integers: exact sums
    out, stats = routing(mean, add, where)(blocks_of(TABLE).astype(dtype), ids.reshape(-1),
                                           valid.reshape(-1), rows.reshape(P * n, 3))
    sums, count = np.zeros((N, 3), np.float32), np.zeros(N, np.float32)   # exact: integers
    np.add.at(sums, ids[valid], rows[valid])
    np.add.at(count, ids[valid], 1)
    want = TABLE.copy()
    hit = count > 0
    if where:
        # XLA divides by a broadcast count as a multiplication by its reciprocal (its
        # algebraic simplifier): the mean as the program computes it, in float32.
        combined = sums * (1 / np.maximum(count, 1))[:, None] if mean else sums
        want[hit] = want[hit] + combined[hit] if add else combined[hit]
    stats.check()
    return np.asarray(out).astype(np.float32), blocks_of(want.astype(dtype)).astype(np.float32)


@pytest.mark.parametrize(("mean", "add"), [(True, False), (False, True), (False, False)],
                         ids=["set-mean", "add-sum", "set-sum"])
def test_route_then_store_writes_each_id_on_its_owner(mean, add):
    """Rows of ids from every device (repeated within one and across devices, masked
    ones among them) land on the owners as numpy's mean or sum per id, set or added;
    rows no id names, and the padding, keep what they held."""
    got, want = routed(mean, add, where=True)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, blocks_of(TABLE))


def test_store_where_false_leaves_the_block_as_it_was():
    got, _ = routed(mean=True, add=False, where=False)
    np.testing.assert_array_equal(got, blocks_of(TABLE))


def test_bool_rows_route_as_integers():
    """bool rows are counted as int32 (a mean of True and False is True where any is:
    nonzero), then stored as bool."""
    got, want = routed(mean=True, add=False, where=True, dtype=bool)
    np.testing.assert_array_equal(got, want)
