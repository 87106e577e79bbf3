"""The hot-node cache changes traffic, never results: DistTensor.lookup with a cache
returns exactly the rows it returns without one, on cora partitioned over 8 devices."""
import functools

import jax
import numpy as np
import pytest

from jgraph.exchange.relay import Relay
from jgraph.sharded import (
    REPLICATED,
    ROWS,
    DistGraph,
    DistTensor,
    ExchangeConfig,
    HotCache,
    cache_size,
    request_counts,
)

P, n = 8, 24                   # ids per device; the default ladder(24) has two rungs


@pytest.fixture(scope="module")
def setup(cora_parts8, mesh):
    dg = DistGraph(cora_parts8, mesh)
    values = np.random.default_rng(0).normal(size=(dg.meta.num_nodes, 4)).astype(np.float32)
    tensor = DistTensor.from_numpy(mesh, dg.layout(), values, name="x")
    # all_to_all, relayed (the default) and straight on a fine ladder up to the request's
    # length (sized for the worst case, so that rungs under the batch size exist)
    ladder = dict(growth=1.25, max_rungs=24, sizing="bound")
    return (dg, tensor, values, dg.exchange(ExchangeConfig(**ladder)),
            dg.exchange(ExchangeConfig(relay=False, **ladder)))


@functools.cache
def lookup_fn(tensor, exchange, with_cache):
    def body(shard, ids, valid, *cache):
        return tensor.lookup(exchange, shard, ids, valid, cache=cache if cache else None)
    specs = (ROWS, ROWS, ROWS) + ((REPLICATED, REPLICATED) if with_cache else ())
    return jax.jit(jax.shard_map(body, mesh=tensor.mesh, in_specs=specs,
                                 out_specs=(ROWS, REPLICATED)))


@pytest.fixture(scope="module")
def batch(setup):
    """Random ids (with repeats and padding), except that device 0 asks for n distinct
    nodes of partition 1: without a cache that pair needs the top rung."""
    dg = setup[0]
    rng = np.random.default_rng(1)
    num = dg.meta.num_nodes
    ids = rng.integers(0, num, (P, n))
    lo, hi = dg.book.part_range(1)
    ids[0] = rng.choice(np.arange(lo, hi), n, replace=False)
    valid = rng.random((P, n)) < 0.9
    valid[0] = True
    return ids.astype(np.int32), valid


def run_lookup(setup, batch, cache, exchange=None):
    _, tensor, _, relayed, _ = setup
    exchange = exchange or relayed
    ids, valid = batch
    args = (tensor.array, ids.reshape(-1), valid.reshape(-1))
    if cache is None:
        rows, stats = lookup_fn(tensor, exchange, False)(*args)
    else:
        rows, stats = lookup_fn(tensor, exchange, True)(*args, *cache.device_args(tensor))
    return np.asarray(rows).reshape(P, n, -1), stats


def caches(dg):
    _, out_degree = dg.degrees()
    return {"top10": HotCache.top(out_degree, 0.1),
            "every_node": HotCache(np.arange(dg.meta.num_nodes, dtype=np.int64)),
            "empty": HotCache.empty()}


@pytest.mark.slow      # three caches
@pytest.mark.parametrize("which", ["top10", "every_node", "empty"])
def test_lookup_with_hot_cache_returns_the_same_rows_and_counts_cached_ids(setup, batch, which):
    dg, values = setup[0], setup[2]
    ids, valid = batch
    cache = caches(dg)[which]
    plain, plain_stats = run_lookup(setup, batch, None)
    cached, stats = run_lookup(setup, batch, cache)
    expected = np.where(valid[..., None], values[ids], 0)
    np.testing.assert_array_equal(plain, expected)
    np.testing.assert_array_equal(cached, expected)

    # cached: distinct non-local ids per device that the cache holds, summed.
    owner = dg.book.owner(ids)
    want = sum(np.unique(ids[k][valid[k] & (owner[k] != k) & np.isin(ids[k], cache.ids)]).size
               for k in range(P))
    assert int(stats.cached) == want
    assert int(stats.non_local) == int(plain_stats.non_local)
    assert int(stats.requested) == int(plain_stats.requested)
    assert int(stats.overflow) == 0 and int(plain_stats.overflow) == 0
    # Fewer remote ids never move more bytes straight to their owners (the relay's
    # routing of two or three rows per pair, rounded, may: it is not compared).
    straight = setup[4]
    _, plain_straight = run_lookup(setup, batch, None, straight)
    _, cached_straight = run_lookup(setup, batch, cache, straight)
    if which == "empty":
        assert want == 0 and float(stats.wire_bytes) == float(plain_stats.wire_bytes)
        assert float(cached_straight.wire_bytes) == float(plain_straight.wire_bytes)
    else:
        assert want > 0
        assert float(cached_straight.wire_bytes) <= float(plain_straight.wire_bytes)
    if which == "every_node":
        assert want == int(plain_stats.non_local)


@pytest.mark.slow       # some 7 s: the fast tier stays under 4 minutes
def test_cache_of_every_node_moves_fewer_wire_bytes_than_no_cache(setup, batch):
    """The relay's buffers hold the bound (n rows per pair and hop) with or without a
    cache, but its chunks move only what the batch's busiest hop pair needs: with every
    node cached nothing is remote and nothing moves."""
    dg = setup[0]
    _, plain = run_lookup(setup, batch, None)
    _, cached = run_lookup(setup, batch, caches(dg)["every_node"])
    assert int(plain.capacity) == int(cached.capacity) == n
    assert int(cached.cached) == int(plain.non_local) > 0
    assert float(cached.wire_bytes) == 0 < float(plain.wire_bytes)


def test_top_cache_takes_the_highest_scores_ties_to_the_lower_id():
    scores = np.array([5, 1, 7, 5, 0, 7, 5])
    assert HotCache.top(scores, 4).ids.tolist() == [0, 2, 3, 5]      # 7, 7, then 5s: 0, 3
    assert HotCache.top(scores, 0.5).ids.tolist() == [0, 2, 3, 5]    # round(3.5) = 4
    assert len(HotCache.top(scores, 0)) == 0 and len(HotCache.top(scores, 100)) == 7
    assert cache_size(0.1, 2708) == 271
    with pytest.raises(ValueError):
        cache_size(1.5, 10)


def test_request_counts_count_each_batch_once_per_distinct_id():
    counts = request_counts([np.array([3, 3, 1]), np.array([[1, 9], [-1, 0]])], 5)
    assert counts.tolist() == [1, 2, 0, 1, 0]


def test_a_relayed_lookup_of_400_ids_a_device_moves_chunks_of_many_rows(setup):
    """400 ids a device, half of them from the next partition: the relay's bound
    capacity (400 rows a pair and hop) moves in chunks of 13 rows (coarse ones of 104),
    through third devices (its busiest hop pair carries fewer rows than the busiest pair
    straight), in one round; every row is numpy's."""
    dg, tensor, values, relayed, _ = setup
    rng = np.random.default_rng(2)
    ids = rng.integers(0, dg.meta.num_nodes, (P, 400))
    for k in range(P):
        lo, hi = dg.book.part_range((k + 1) % P)
        ids[k, :200] = rng.integers(lo, hi, 200)
    valid = rng.random((P, 400)) < 0.95
    rows, stats = lookup_fn(tensor, relayed, False)(
        tensor.array, ids.reshape(-1).astype(np.int32), valid.reshape(-1))
    np.testing.assert_array_equal(np.asarray(rows).reshape(P, 400, -1),
                                  np.where(valid[..., None], values[ids], 0))
    owner = dg.book.owner(ids)
    busiest = max(np.unique(ids[k][valid[k] & (owner[k] == j)]).size
                  for k in range(P) for j in range(P) if j != k)
    assert int(stats.capacity) == 400 and Relay.chunk(400) == 13
    assert int(stats.rounds) == 1 and int(stats.needed) < busiest
