"""Exchange.gather(..., distinct=True), as the sampler calls it for each hop's frontier:
for ids that are distinct on each device it answers exactly as the deduplicating
gather (distinct=False) and as numpy's `table[ids]`, with the same statistics, for
every strategy XLA:CPU runs, on 8 devices with unequal partitions (one empty).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jgraph.sharded import AXIS, ROWS, Exchange, ExchangeConfig, make_mesh

SIZES = (5, 0, 12, 7, 70, 3, 9, 16)
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
P, N, RPP = len(SIZES), int(OFFSETS[-1]), max(SIZES)
n = 32                                    # ids per device
TABLE = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
# One rung (the batch size): each extra rung compiles another copy of the transfer,
# and choosing rungs is tested in tests/sharded/test_exchange.py.
CONFIGS = {"all_to_all-relay": ExchangeConfig(max_rungs=1, relay=True),
           "all_to_all": ExchangeConfig(max_rungs=1),
           "all_gather": ExchangeConfig(strategy="all_gather", max_rungs=1),
           "ppermute": ExchangeConfig(strategy="ppermute", max_rungs=1)}
assert all(c.ladder(n) == (n,) for c in CONFIGS.values())


def sharded_table():
    blocks = np.zeros((P * RPP, 3), np.float32)
    for k in range(P):
        blocks[k * RPP:k * RPP + SIZES[k]] = TABLE[OFFSETS[k]:OFFSETS[k + 1]]
    return blocks


@functools.cache
def both_gathers(strategy):
    """One program: the same request gathered with distinct=False and distinct=True."""
    ex = Exchange(OFFSETS, CONFIGS[strategy])
    offsets = jnp.asarray(OFFSETS, jnp.int32)

    def body(shard, ids, valid):
        me = lax.axis_index(AXIS)

        def owner_fn(q, mask):
            # A misrouted id (asked of a device that does not own it) answers NaN / -1.
            wrong = mask & ~((q >= offsets[me]) & (q < offsets[me + 1]))
            rows = shard[jnp.clip(q - offsets[me], 0, RPP - 1)]
            return {"row": jnp.where(wrong[:, None], jnp.nan, rows),
                    "twice": jnp.where(wrong, -1, q * 2)}

        plain, plain_stats = ex.gather(ids, valid, owner_fn)
        fast, fast_stats = ex.gather(ids, valid, owner_fn, distinct=True)
        # Every device's own copy of the stats, to check they agree.
        return plain, fast, *jax.tree.map(lambda x: x[None], (plain_stats, fast_stats))

    return jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=(ROWS, ROWS, ROWS),
                                 out_specs=ROWS))


def case_spread(rng):
    """Distinct ids from the whole graph on each device; devices overlap."""
    return np.stack([rng.choice(N, n, replace=False) for _ in range(P)]), np.ones((P, n), bool)


def case_padded(rng):
    """A third of the entries are padding holding garbage (even repeated) ids."""
    ids, _ = case_spread(rng)
    valid = rng.random((P, n)) >= 1 / 3
    ids = np.where(valid, ids, rng.integers(-5, N + 5, (P, n)))
    ids[:, -1] = ids[:, 0]
    valid[:, -1] = False
    return ids, valid


def case_one_peer(rng):
    """Every device asks n distinct ids of partition 4 (which asks partition 7's 16 and
    pads): the top rung."""
    ids, valid = np.zeros((P, n), np.int64), np.ones((P, n), bool)
    for k in range(P):
        if k == 4:
            ids[k, :16] = np.arange(OFFSETS[7], OFFSETS[8])
            valid[k, 16:] = False
        else:
            ids[k] = rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), n, replace=False)
    return ids, valid


def case_out_of_range(rng):
    """Valid entries outside the graph (below 0, past the last id) among distinct ids:
    answered zero and counted in out_of_range by both gathers."""
    ids, valid = case_spread(rng)
    ids[:, 3], ids[:, 7] = -1 - np.arange(P), N + np.arange(P)
    return ids, valid


CASES = {"spread": case_spread, "padded": case_padded, "one_peer": case_one_peer,
         "out_of_range": case_out_of_range}


@pytest.mark.slow      # every strategy
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("strategy", sorted(CONFIGS))
def test_distinct_gather_answers_and_counts_as_the_deduplicating_gather(strategy, case):
    ids, valid = CASES[case](np.random.default_rng(sorted(CASES).index(case)))
    for k in range(P):
        assert np.unique(ids[k][valid[k]]).size == valid[k].sum()      # distinct per device
    plain, fast, plain_stats, fast_stats = both_gathers(strategy)(
        sharded_table(), ids.reshape(-1).astype(np.int32), valid.reshape(-1))
    ok = (valid & (ids >= 0) & (ids < N)).reshape(-1)
    safe = np.where(ok, ids.reshape(-1), 0)
    np.testing.assert_array_equal(fast["row"], np.where(ok[:, None], TABLE[safe], 0))
    np.testing.assert_array_equal(fast["twice"], np.where(ok, safe * 2, 0))
    np.testing.assert_array_equal(fast["row"], plain["row"])
    np.testing.assert_array_equal(fast["twice"], plain["twice"])
    inside = valid & (ids >= 0) & (ids < N)
    remote = sum(int(np.sum(np.searchsorted(OFFSETS, ids[k][inside[k]], side="right") - 1
                            != k)) for k in range(P))
    for name in plain_stats._fields:
        a, b = np.asarray(getattr(plain_stats, name)), np.asarray(getattr(fast_stats, name))
        assert np.all(a == a[0]) and np.all(b == b[0]), f"{name} differs between devices"
        assert a[0] == b[0], f"{name}: {a[0]} with the sort, {b[0]} without"
    assert int(fast_stats.requested[0]) == inside.sum()
    assert int(fast_stats.out_of_range[0]) == (valid & ~inside).sum()
    assert int(fast_stats.non_local[0]) == remote
    assert int(fast_stats.overflow[0]) == 0
