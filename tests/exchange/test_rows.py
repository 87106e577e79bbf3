"""The row primitives of the exchange (jgraph/exchange/rows.py) against plain numpy, on
8 devices: owned rows read, routed to their owners and stored there, with ids of other
devices, out of range and masked among them.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.exchange import Exchange
from jgraph.exchange.rows import owned_index, owned_rows, route_rows, store_rows
from jgraph.exchange.segments import owner_of
from jgraph.sharded import AXIS, REPLICATED, ROWS, make_mesh

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
