"""Exchange.gather and Exchange.scatter_add on 8 devices against plain numpy: `table[ids]`
and `np.add.at`, for every strategy, with the statistics (distinct ids, capacity rung,
overflow, out-of-range) recomputed in numpy.

The partition book is hand-made with unequal sizes and one empty partition. Each
device's batch is n ids; the global arrays are [8 * n] and device k holds block k.
ragged_all_to_all, which XLA:CPU lacks, runs on an emulation of the collective.
"""
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jgraph.exchange.ragged as ragged_module
from jgraph.exchange.relay import RELAY_GAIN, Relay
from jgraph.exchange.scheduled import CHUNKS_PER_PAIR, build_schedule
from jgraph.exchange.sizing import Key, Route, with_headroom
from jgraph.sharded import (
    AXIS,
    REPLICATED,
    ROWS,
    Exchange,
    ExchangeConfig,
    ExchangeOverflowError,
    make_mesh,
)

SIZES = (5, 0, 12, 7, 70, 3, 9, 16)      # partition 1 empty; 4 can take a whole batch
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
P, N, RPP = len(SIZES), int(OFFSETS[-1]), max(SIZES)
n = 32                                    # ids per device; ladder(32) has >= 3 rungs


def own(length: int) -> Key:
    return Key(Route.OWN, length)


def straight(length: int) -> Key:
    return Key(Route.STRAIGHT, length)


DIM = 3
ROW_BYTES = DIM * 4 + 4                   # an answer: float32[DIM] row + int32 (id * 2)
TABLE = np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)
# Every strategy, by test id, on ladders of many rungs (choosing rungs is tested here).
# "all_to_all-relay" routes a gather's rows in two hops, through intermediate devices
# (the default); "all_to_all" is the plain per-peer-capacity all_to_all.
LADDER = dict(growth=1.25, max_rungs=24, sizing="bound")
CONFIGS = {"all_to_all-relay": ExchangeConfig(strategy="all_to_all", **LADDER),
           "all_to_all": ExchangeConfig(strategy="all_to_all", relay=False, **LADDER),
           "ppermute": ExchangeConfig(strategy="ppermute", **LADDER),
           "all_gather": ExchangeConfig(strategy="all_gather", **LADDER),
           "scheduled": ExchangeConfig(strategy="scheduled", **LADDER)}
# The default strategy in the fast tier, every strategy in the full suite (each compiles
# its own programs).
STRATEGIES = [pytest.param(s, marks=() if s == "all_to_all" else pytest.mark.slow)
              for s in sorted(CONFIGS)]


def owner_of(ids):
    return np.searchsorted(OFFSETS, ids, side="right") - 1


def sharded_table() -> np.ndarray:
    """TABLE row-sharded: partition k's rows in block k, padded to RPP rows."""
    blocks = np.zeros((P * RPP, DIM), np.float32)
    for k in range(P):
        blocks[k * RPP:k * RPP + SIZES[k]] = TABLE[OFFSETS[k]:OFFSETS[k + 1]]
    return blocks


# The hot-node cache of `exchange_step(..., cached=True)`: 20 ids of partition 4 and 2 of
# partition 7, with their answers.
CACHE_IDS = np.concatenate([np.arange(OFFSETS[4], OFFSETS[4] + 20), OFFSETS[7] + [3, 9]])


def exchange_step(config: ExchangeConfig, once: bool = False, capacities=(),
                  weights=None, cached: bool = False):
    """`compiled_step` for pair weights float[P, P] or None (the scheduled strategy's)."""
    return compiled_step(config, once, capacities,
                         None if weights is None else tuple(map(tuple, weights)), cached)


@functools.cache
def compiled_step(config: ExchangeConfig, once: bool = False, capacities=(), weights=None,
                  cached: bool = False):
    """One compiled program per config: gather (pytree answers, a `contains` screen read
    from a replicated bool[N]; `once`: the owner function outside the ladder; `cached`:
    with the hot-node cache of CACHE_IDS) and scatter_add of the same ids; capacities:
    calibrated ((length, capacity), ...); weights: the exchange's pair weights."""
    ex = Exchange(OFFSETS, config, capacities=dict(capacities), pair_weights=weights)
    offsets = jnp.asarray(OFFSETS, jnp.int32)
    cache = (jnp.asarray(CACHE_IDS, jnp.int32),
             (jnp.asarray(TABLE[CACHE_IDS]), jnp.asarray(CACHE_IDS * 2, jnp.int32)))

    def body(shard, allowed, ids, valid, values):
        me = lax.axis_index(AXIS)

        def owner_fn(q, mask):
            # Answers only for ids this device owns; asked for any other id, it answers
            # NaN / -1 so that misrouting cannot go unnoticed.
            owned = (q >= offsets[me]) & (q < offsets[me + 1])
            wrong = mask & ~owned
            rows = shard[jnp.clip(q - offsets[me], 0, RPP - 1)]
            return jnp.where(wrong[:, None], jnp.nan, rows), jnp.where(wrong, -1, q * 2)

        answers, gstats = ex.gather(ids, valid, owner_fn, once=once,
                                    cache=cache if cached else None,
                                    contains=lambda q: allowed[jnp.clip(q, 0, N - 1)])
        scattered, sstats = ex.scatter_add(ids, valid, values)
        return answers, gstats, scattered, sstats

    return jax.jit(jax.shard_map(
        body, mesh=make_mesh(8), in_specs=(ROWS, REPLICATED, ROWS, ROWS, ROWS),
        out_specs=((ROWS, ROWS), REPLICATED, (ROWS, ROWS, ROWS), REPLICATED)))


def run(config, case, once=False, capacities=(), weights=None, cached=False):
    ids, valid, allowed, values = case
    (rows, twice), gstats, (owned, sums, mask), sstats = exchange_step(
        config, once, tuple(sorted(dict(capacities).items())), weights, cached)(
        sharded_table(), allowed, ids.reshape(-1).astype(np.int32), valid.reshape(-1),
        values.reshape(P * n, 2))
    m = owned.shape[0] // P
    return dict(rows=np.asarray(rows).reshape(P, n, DIM), twice=np.asarray(twice).reshape(P, n),
                gstats=gstats, sstats=sstats, owned=np.asarray(owned).reshape(P, m),
                sums=np.asarray(sums).reshape(P, m, 2), mask=np.asarray(mask).reshape(P, m))


# -- the id sets ---------------------------------------------------------------------------
# Each returns (ids int[P, n], valid bool[P, n], allowed bool[N], values float32[P, n, 2]).
# Padding entries (valid False) hold garbage ids, in range or not: they must be ignored.


def _finish(rng, ids, valid, allowed=None):
    ids = np.where(valid, ids, rng.integers(-10**6, 10**6, ids.shape)).astype(np.int64)
    values = np.stack([rng.integers(-8, 9, ids.shape).astype(np.float32),   # exact sums
                       rng.uniform(0.5, 1.5, ids.shape).astype(np.float32)], axis=-1)
    return ids, valid, np.ones(N, bool) if allowed is None else allowed, values


def case_duplicates(rng):
    """Ids from a pool of 40: repeated within each device and across devices."""
    pool = rng.choice(N, 40, replace=False)
    return _finish(rng, rng.choice(pool, (P, n)), np.ones((P, n), bool))


def _own_ids(rng):
    """(ids, valid): each device's batch of ids it owns (the empty partition's is
    padding)."""
    ids, valid = np.zeros((P, n), np.int64), np.ones((P, n), bool)
    for k in range(P):
        if SIZES[k]:
            ids[k] = rng.integers(OFFSETS[k], OFFSETS[k + 1], n)
        else:
            valid[k] = False
    return ids, valid


def case_all_local(rng):
    """Each device asks only for ids it owns (the empty partition's batch is padding)."""
    return _finish(rng, *_own_ids(rng))


def case_all_remote(rng):
    """No device asks for an id it owns."""
    ids = np.stack([rng.choice(np.setdiff1d(np.arange(N), np.arange(OFFSETS[k], OFFSETS[k + 1])), n)
                    for k in range(P)])
    return _finish(rng, ids, np.ones((P, n), bool))


def case_padding(rng):
    """About half the entries are padding; device 3's batch is padding only."""
    valid = rng.random((P, n)) < 0.5
    valid[3] = False
    return _finish(rng, rng.integers(0, N, (P, n)), valid)


def case_middle_rung(rng):
    """Largest per-(device, peer) request is one more than the lowest rung: device 0
    asks that many distinct ids of partition 4; everyone else asks only the small
    partitions (at most 16 distinct ids each, which is <= the lowest rung)."""
    need = ExchangeConfig().ladder(n)[0] + 1
    small = np.setdiff1d(np.arange(N), np.arange(OFFSETS[4], OFFSETS[5]))
    assert max(np.delete(SIZES, 4)) <= need - 1
    ids = rng.choice(small, (P, n))
    ids[0, :need] = rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), need, replace=False)
    ids[0, need:] = rng.integers(OFFSETS[0], OFFSETS[1], n - need)    # local to device 0
    return _finish(rng, ids, np.ones((P, n), bool))


def case_one_peer(rng):
    """Every device sends its whole batch to a single peer: n distinct ids to partition 4
    (partition 4 itself: to partition 7, whose 16 ids repeat)."""
    ids = np.stack([rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), n, replace=False) if k != 4
                    else rng.choice(np.arange(OFFSETS[7], OFFSETS[8]), n) for k in range(P)])
    return _finish(rng, ids, np.ones((P, n), bool))


def case_out_of_range(rng):
    """`contains` rejects a fifth of the ids; some valid ids are outside [0, N). Every
    rejected or out-of-range entry is a distinct id."""
    allowed = rng.random(N) >= 0.2
    ids = rng.choice(np.flatnonzero(allowed), (P, n))
    valid = np.ones((P, n), bool)
    bad = np.concatenate([[-1, -7, N, N + 5, 10**6, np.iinfo(np.int32).max],
                          rng.choice(np.flatnonzero(~allowed), 8, replace=False)])
    valid[5, :4] = False                         # padding is not out of range
    slots = rng.choice(np.flatnonzero(valid), bad.size, replace=False)
    ids.reshape(-1)[slots] = bad
    return _finish(rng, ids, valid, allowed)


def case_skewed(rng):
    """Pair loads from 0 to n: device k != 4 asks 4 (k + 1) distinct ids of partition 4
    (its whole batch for k = 7) and the rest of its batch anywhere; device 4 asks
    partitions 6 and 7 only."""
    ids = rng.integers(0, N, (P, n))
    for k in range(P):
        if k == 4:
            ids[k] = rng.integers(OFFSETS[6], OFFSETS[8], n)
        else:
            m = 4 * (k + 1)
            ids[k, :m] = rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), m, replace=False)
    return _finish(rng, ids, np.ones((P, n), bool))


CASES = {f.__name__[5:]: f for f in (case_duplicates, case_all_local, case_all_remote,
                                     case_padding, case_middle_rung, case_one_peer,
                                     case_out_of_range, case_skewed)}


@functools.cache
def make_case(name):
    return CASES[name](np.random.default_rng(sorted(CASES).index(name) + 10))


# -- numpy references ----------------------------------------------------------------------


def request_counts(ids, ok):
    """(distinct ids per device, int[P, P] distinct remote ids per (device, owner))."""
    distinct, counts = [], np.zeros((P, P), np.int64)
    for k in range(P):
        u = np.unique(ids[k][ok[k]])
        distinct.append(u)
        own = owner_of(u)
        counts[k] = np.bincount(own[own != k], minlength=P)
    return distinct, counts


def smallest_rung(ladder, need):
    return min(r for r in ladder if r >= need)


def expected_capacity(config, counts, capacities=None):
    """The rung each strategy must pick: the smallest one that holds the largest need
    (the relay's one capacity: the bound, n); the scheduled strategy's chunk, the bound
    or else the chunk calibrated for the batch's length (`capacities`: {length: chunk},
    as given to `run`)."""
    s = config.strategy.value
    if s == "all_to_all":          # the relay: one capacity, the bound
        return n if config.relay else smallest_rung(config.ladder(n), counts.max())
    if s == "ppermute":        # shift s: device k sends to k + s; each shift has its own rung
        return max(smallest_rung(config.ladder(n), max(counts[k, (k + sh) % P] for k in range(P)))
                   for sh in range(1, P))
    if s == "all_gather":
        return smallest_rung(config.ladder(n), counts.sum(axis=1).max())
    if s == "ragged_all_to_all":   # everything an owner receives, in one exact-size buffer
        return smallest_rung(config.ladder((P - 1) * n), counts.sum(axis=0).max())
    if s == "scheduled":           # one chunk: the whole request when bound-sized
        return n if config.sizing.value == "bound" else dict(capacities)[n]
    raise AssertionError(s)


def scheduled_wire(dest, counts, chunk, row_bytes):
    """Bytes the scheduled strategy moves: round r takes as many chunks as its busiest
    pair needs, and every device sending in it sends that many (and gets the answers)."""
    total = 0
    for row in dest:
        senders = np.flatnonzero(row >= 0)
        iterations = max((-(-counts[i, row[i]] // chunk) for i in senders), default=0)
        total += iterations * chunk * senders.size * (4 + row_bytes)
    return total


def in_range(ids):
    return (ids >= 0) & (ids < N)


def check_gather(config, case, out, weights=None, capacities=None):
    ids, valid, allowed, _ = case
    ok = valid & in_range(ids) & allowed[np.clip(ids, 0, N - 1)]
    safe = np.clip(ids, 0, N - 1)
    np.testing.assert_array_equal(out["rows"], np.where(ok[..., None], TABLE[safe], 0))
    np.testing.assert_array_equal(out["twice"], np.where(ok, ids * 2, 0))

    distinct, counts = request_counts(ids, ok)
    st = out["gstats"]
    assert int(st.requested) == sum(u.size for u in distinct)
    assert int(st.non_local) == counts.sum()
    assert int(st.cached) == 0
    assert int(st.overflow) == 0
    assert int(st.out_of_range) == np.sum(valid & ~ok)
    assert int(st.capacity) == expected_capacity(config, counts, capacities)
    # Every distinct remote id must cross the wire, and its answer must come back.
    assert float(st.wire_bytes) >= counts.sum() * (4 + ROW_BYTES)
    if config.strategy.value == "ragged_all_to_all":      # exact sizes: nothing more
        assert float(st.wire_bytes) == counts.sum() * (4 + ROW_BYTES)
    if relays(config):
        check_relayed(counts, st)
    if config.strategy.value == "scheduled":
        assert int(st.rounds) == 1
        assert float(st.wire_bytes) == scheduled_wire(build_schedule(P, weights), counts,
                                                      int(st.capacity), ROW_BYTES)


def relays(config):
    return config.strategy.value == "all_to_all" and config.relay


def check_relayed(counts, st):
    """A relayed gather's need lies between the lower bound of two hops (half the
    busiest device's rows over the P - 1 others) and the busiest pair's (straight); its
    busiest hop moves at least the need, and no hop moves more than the need, ids
    rounded up to coarse chunks (one-row fine chunks at a capacity of n = 32)."""
    need, busiest = int(st.needed), int(counts.max())
    bound = -(-max(counts.sum(0).max(), counts.sum(1).max()) // (2 * (P - 1)))
    assert bound <= need <= busiest
    wire, q = float(st.wire_bytes), Relay.chunk(int(st.capacity))
    if int(st.rounds) == 1 and need < busiest:        # relayed, in one round
        assert P * (P - 1) * need * (4 + ROW_BYTES) <= wire
        assert wire <= P * (P - 1) * 2 * -(-need // q) * q * (4 + ROW_BYTES)


def scatter_strategy(config):
    """The strategy a scatter_add moves with: scheduled's is all_to_all."""
    s = config.strategy.value
    return "all_to_all" if s == "scheduled" else s


def check_scatter_add(config, case, out):
    ids, valid, _, values = case
    ok = valid & in_range(ids)
    expected = np.zeros((N, 2), np.float64)
    np.add.at(expected, ids[ok], values[ok])
    sent = np.unique(ids[ok])
    got = np.zeros((N, 2), np.float64)
    for k in range(P):
        owned, mask, sums = out["owned"][k], out["mask"][k], out["sums"][k]
        mine = owned[mask]
        # The ids any device sent that k owns, each once, sorted, then -1 padding.
        np.testing.assert_array_equal(mine, sent[owner_of(sent) == k])
        assert np.all(np.diff(mine) > 0)
        assert np.all(owned[~mask] == -1)
        assert np.all(owner_of(mine) == k)
        got[mine] = sums[mask]
    np.testing.assert_array_equal(got[:, 0], expected[:, 0])            # integers: exact
    np.testing.assert_allclose(got[:, 1], expected[:, 1], rtol=1e-6)

    distinct, counts = request_counts(ids, ok)
    st = out["sstats"]
    assert int(st.requested) == sum(u.size for u in distinct)
    assert int(st.non_local) == counts.sum()
    assert int(st.overflow) == 0
    assert int(st.out_of_range) == np.sum(valid & ~in_range(ids))
    # scatter_add never relays: all_to_all always picks the smallest sufficient rung
    # (scheduled's is all_to_all's, bound-sized).
    direct = dataclasses.replace(config, relay=False, strategy=scatter_strategy(config))
    assert int(st.capacity) == expected_capacity(direct, counts)
    assert float(st.wire_bytes) >= counts.sum() * (4 + 8)
    if config.strategy.value == "ragged_all_to_all":
        assert float(st.wire_bytes) == counts.sum() * (4 + 8)


# -- gather and scatter_add, every strategy ------------------------------------------------


def case_one_pair(rng):
    """One busy device pair, the rest nearly idle: device 0 asks 30 distinct ids of
    partition 4, every other device 2 ids anywhere (the rest of each batch is padding)."""
    ids = rng.integers(0, N, (P, n))
    valid = np.zeros((P, n), bool)
    valid[:, :2] = True
    ids[0, :30] = rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), 30, replace=False)
    valid[0, :30] = True
    return _finish(rng, ids, valid)


def test_a_batch_with_one_busy_pair_is_relayed_through_third_devices_in_one_round():
    """The busy pair's rows spread over the other devices: the relay's busiest hop pair
    carries under RELAY_GAIN / 2 of the busiest pair's rows, in one round, every answer
    numpy's; the stats count the rows relayed through a third device. A batch whose
    traffic comes from one busy owner (case_skewed: relaying would save under a
    quarter) goes straight, relaying nothing."""
    config = CONFIGS["all_to_all-relay"]
    case = case_one_pair(np.random.default_rng(30))
    out = run(config, case)
    check_gather(config, case, out)
    ids, valid, allowed, _ = case
    _, counts = request_counts(ids, valid & in_range(ids) & allowed[np.clip(ids, 0, N - 1)])
    st = out["gstats"]
    assert int(st.rounds) == 1 and int(st.needed) <= RELAY_GAIN / 2 * counts.max()
    assert 0 < int(st.relayed) <= counts[0, 4] and Key.of(st) == own(n)
    ids, valid, allowed, _ = skewed = make_case("skewed")
    _, counts = request_counts(ids, valid & in_range(ids) & allowed[np.clip(ids, 0, N - 1)])
    st = run(config, skewed)["gstats"]
    assert int(st.relayed) == 0 and int(st.needed) == counts.max()


def test_calibration_keeps_the_relay_only_for_gathers_whose_batches_relayed():
    """`fitted` records a gather length whose batches relayed nothing under the straight
    route: that gather then moves straight (the plain all_to_all, its stats keyed
    straight, no rows relayed), every answer numpy's. One batch that relayed keeps it
    relayed, under its own route."""
    config = CONFIGS["all_to_all-relay"]
    headroom = config.headroom
    pair, skewed = case_one_pair(np.random.default_rng(30)), make_case("skewed")
    relayed, direct = run(config, pair)["gstats"], run(config, skewed)["gstats"]
    ex = Exchange(OFFSETS, config)
    assert ex.fitted([relayed]).capacities == {own(n): with_headroom(int(relayed.needed),
                                                                      headroom)}
    assert set(ex.fitted([direct, relayed]).capacities) == {own(n)}
    fitted = ex.fitted([direct])
    assert fitted.capacities == {straight(n): with_headroom(int(direct.needed), headroom)}
    out = run(config, skewed, capacities=fitted.capacities)
    check_gather(config, skewed, out)
    st = out["gstats"]
    assert Key.of(st) == straight(n) and int(st.relayed) == 0
    assert int(st.capacity) == min(fitted.capacities[straight(n)], n)     # at most the top, n
    # Measured again on a batch that relays, it relays (its own route is measured again).
    assert fitted.fitted([relayed]).capacities[own(n)] == \
        ex.fitted([relayed]).capacities[own(n)]


def test_a_gather_run_once_goes_straight_where_gathers_relay_keyed_as_scatters():
    """The sampler's draws (`once`) never relay: under the relaying config they move as
    the plain all_to_all does, and their need is calibrated under the straight route
    (with the scatters), apart from relayed gathers of the same length."""
    config, case = CONFIGS["all_to_all-relay"], make_case("skewed")
    out = run(config, case, once=True)
    ids, valid, allowed, _ = case
    ok = valid & in_range(ids) & allowed[np.clip(ids, 0, N - 1)]
    np.testing.assert_array_equal(out["rows"], np.where(ok[..., None],
                                                        TABLE[np.clip(ids, 0, N - 1)], 0))
    _, counts = request_counts(ids, ok)
    st = out["gstats"]
    assert Key.of(st) == straight(n) and int(st.needed) == counts.max()
    assert int(st.capacity) == expected_capacity(CONFIGS["all_to_all"], counts)
    fitted = Exchange(OFFSETS, config).fitted(st)
    assert fitted.capacities == {straight(n): with_headroom(counts.max(), config.headroom)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gather_equals_numpy_take_and_counts_match(strategy, case):
    config = CONFIGS[strategy]
    check_gather(config, make_case(case), run(config, make_case(case)))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_scatter_add_sums_at_the_owner_equal_numpy_add_at(strategy, case):
    config = CONFIGS[strategy]
    check_scatter_add(config, make_case(case), run(config, make_case(case)))


ONCE_CASES = ("one_peer", "out_of_range")


@pytest.mark.parametrize("case", ONCE_CASES)
@pytest.mark.parametrize("strategy", [p for p in STRATEGIES if p.values[0] != "all_to_all-relay"])
def test_gather_with_the_owner_function_run_once_equals_numpy_take(strategy, case):
    """once=True: ids through the ladder, every owner answering all it received in one
    call outside it, answers back through the ladder: the same rows, rungs and counts."""
    config = CONFIGS[strategy]
    check_gather(config, make_case(case), run(config, make_case(case), once=True))


@pytest.mark.parametrize("num_parts", [2, 8, 16])
def test_a_distinct_plans_slots_by_counting_and_by_sorting_agree_with_numpy(num_parts):
    """A distinct request's remote ids placed after the earlier ones of their owner
    (the counted way programs for CPU take, and the sort the others take), against
    numpy's stable sort by owner."""
    from jgraph.exchange.plan import _slots_counted, _slots_sorted
    rng = np.random.default_rng(num_parts)
    n = 300
    owner = rng.integers(0, num_parts, n).astype(np.int32)
    remote = rng.random(n) < 0.7
    counts = np.bincount(owner[remote], minlength=num_parts)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    order = np.argsort(np.where(remote, owner, num_parts), kind="stable")
    want = np.full(n, -1, np.int32)
    want[order[:remote.sum()]] = np.arange(remote.sum())
    for slots in (_slots_counted, _slots_sorted):
        got = jax.jit(slots)(jnp.asarray(owner), jnp.asarray(remote), jnp.asarray(start))
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(got, want, err_msg=slots.__name__)


def test_answer_filled_answers_every_present_id_and_zeros_the_rest():
    """The owner's loop over only the chunks that hold ids (ids scattered among -1s),
    against numpy, down to a buffer of -1s only (zeros) and one id among 8 slots."""
    from jgraph.exchange import answer_filled
    rng = np.random.default_rng(3)
    for length, present in ((100, 37), (64, 64), (50, 0), (9, 1)):
        ids = np.full(length, -1, np.int32)
        ids[rng.choice(length, present, replace=False)] = rng.integers(0, 10**6, present)

        def owner(q, mask):
            return {"twice": jnp.where(mask, q * 2, -5), "row": jnp.stack([q, q + 1], 1)}
        got = jax.jit(lambda x: answer_filled(owner, x))(jnp.asarray(ids))
        ok = ids >= 0
        np.testing.assert_array_equal(got["twice"], np.where(ok, ids * 2, 0))
        np.testing.assert_array_equal(got["row"], np.where(ok[:, None],
                                                            np.stack([ids, ids + 1], 1), 0))


def test_a_measured_gather_run_once_traces_its_owner_function_once():
    """One trace of the owner function per gather (the loop's shapes come from the
    trace the loop uses): the sampler's draw is the costliest function to trace."""
    ex = Exchange(OFFSETS, ExchangeConfig(sizing="calibrated"), capacities={n: 8})
    traces = []

    def body(ids):
        def owner_fn(q, mask):
            traces.append(q.shape)
            return {"twice": jnp.where(mask, q * 2, 0)}
        return ex.gather(ids, ids >= 0, owner_fn, distinct=True, once=True)[0]["twice"]
    ids = np.arange(P * n, dtype=np.int32) % N
    jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=ROWS, out_specs=ROWS)).lower(
        jax.ShapeDtypeStruct(ids.shape, ids.dtype))
    assert len(traces) == 1, traces


def test_all_to_all_capacity_climbs_the_ladder_to_the_smallest_sufficient_rung():
    """Requests whose largest per-(device, peer) count is 0, lowest rung + 1 and n pick
    the lowest, the second and the top rung."""
    config = CONFIGS["all_to_all"]
    ladder = config.ladder(n)
    assert len(ladder) >= 3 and ladder[-1] == n
    caps = [int(run(config, make_case(c))["gstats"].capacity)
            for c in ("all_local", "middle_rung", "one_peer")]
    assert caps == [ladder[0], ladder[1], ladder[-1]]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_default_config_never_overflows_when_every_id_goes_to_one_peer(strategy):
    out = run(CONFIGS[strategy], make_case("one_peer"))
    assert int(out["gstats"].overflow) == 0 and int(out["sstats"].overflow) == 0
    assert out["gstats"].check() is out["gstats"]
    out["sstats"].check()


def test_out_of_range_ids_are_counted_answered_zero_and_check_raises_index_error():
    case = make_case("out_of_range")
    out = run(ExchangeConfig(sizing="bound"), case)
    ids, valid, allowed, _ = case
    rejected = valid & ~(in_range(ids) & allowed[np.clip(ids, 0, N - 1)])
    assert rejected.sum() == 14 and int(out["gstats"].out_of_range) == 14
    assert np.all(out["rows"][rejected] == 0) and np.all(out["twice"][rejected] == 0)
    with pytest.raises(IndexError, match="14 id"):
        out["gstats"].check("features")
    # scatter_add has no `contains`: only the 6 ids outside [0, N) are out of range.
    assert int(out["sstats"].out_of_range) == 6
    with pytest.raises(IndexError):
        out["sstats"].check()


# -- capacities below the need: rounds, never a lost answer ------------------------------


def expected_need(strategy, counts):
    """The largest need, in the capacity's units, that each strategy reports (not the
    relay's: its routing's, see `check_relayed`)."""
    if strategy == "all_gather":                     # one buffer for all peers
        return int(counts.sum(axis=1).max())
    if strategy == "ragged_all_to_all":              # what an owner receives
        return int(counts.sum(axis=0).max())
    if strategy == "scheduled":                      # a chunk for the mean pair
        return -(-int(counts.sum(axis=1).max()) // ((P - 1) * CHUNKS_PER_PAIR))
    return int(counts.max())                         # per (device, peer)


def expected_overflow(strategy, counts, cap):
    if strategy == "all_gather":
        return int(np.maximum(counts.sum(axis=1) - cap, 0).sum())
    return int(np.maximum(counts - cap, 0).sum())    # a buffer of cap per (device, peer)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gather_beyond_max_capacity_takes_rounds_and_scatter_add_counts_its_overflow(strategy):
    """A capacity of 4 where a peer is asked 32 ids: the gather moves them in rounds of
    4 and answers every one; scatter_add's one round loses exactly what does not fit,
    counted, and check raises."""
    config = dataclasses.replace(CONFIGS[strategy], max_capacity=4)
    case = make_case("one_peer")
    ids, valid, _, _ = case
    out = run(config, case)
    gst, sst = out["gstats"], out["sstats"]
    ok = valid & in_range(ids)
    np.testing.assert_array_equal(out["rows"], np.where(ok[..., None], TABLE[ids], 0))
    _, counts = request_counts(ids, valid)
    need = expected_need(config.strategy.value, counts)
    assert int(gst.overflow) == 0 and gst.check() is gst
    if config.strategy.value == "scheduled":         # chunks of 4: its schedule, one round
        assert int(gst.needed) == need and int(gst.capacity) == 4 and int(gst.rounds) == 1
    elif not config.relay:
        assert int(gst.needed) == need and int(gst.capacity) == 4
        assert int(gst.rounds) == -(-need // 4) > 1
    else:      # the relay's need is its routing's; above 4 it goes straight, in rounds
        assert int(gst.needed) > 4 and int(gst.capacity) == 4
        assert int(gst.rounds) == -(-need // 4) > 1
    scatter = scatter_strategy(config)
    lost = expected_overflow(scatter, counts, 4)
    assert lost > 0 and int(sst.overflow) == lost
    assert int(sst.needed) == expected_need(scatter, counts)
    with pytest.raises(ExchangeOverflowError, match="capacity 4"):
        sst.check()


# (the relay answers per rung: once is not relayed; scheduled's chunks below the need are
# tested with its own, test_scheduled_gather_in_chunks_of_2_...)
ROUND_PATHS = [pytest.param(s.values[0], once, marks=s.marks, id=f"{s.values[0]}-{path}")
               for s in STRATEGIES for once, path in ((False, "per_rung"), (True, "once"))
               if not (once and s.values[0] == "all_to_all-relay")
               and s.values[0] != "scheduled"]


@pytest.mark.parametrize("case", ("one_peer", "duplicates", "out_of_range"))
@pytest.mark.parametrize("strategy,once", ROUND_PATHS)
def test_calibrated_capacities_below_the_need_answer_everything_in_rounds(strategy, once,
                                                                          case):
    """Calibrated sizing with a capacity of 8 for the batch's length: every answer
    equals numpy's in as many rounds as the need asks; `grown` sizes the length to
    its need plus headroom, after which one round holds it."""
    config = dataclasses.replace(CONFIGS[strategy], sizing="calibrated")
    data = make_case(case)
    out = run(config, data, once, {n: 8})
    ids, valid, allowed, _ = data
    ok = valid & in_range(ids) & allowed[np.clip(ids, 0, N - 1)]
    np.testing.assert_array_equal(out["rows"], np.where(ok[..., None],
                                                        TABLE[np.clip(ids, 0, N - 1)], 0))
    np.testing.assert_array_equal(out["twice"], np.where(ok, ids * 2, 0))
    _, counts = request_counts(ids, ok)
    gst = out["gstats"]
    need = expected_need(config.strategy.value, counts)
    chunked = config.strategy.value == "scheduled"     # its loop is not rounds
    if relays(config):
        # Relayed in one round if its routing's need fits 8, else straight in rounds
        # of 8 for the busiest pair; grown, it fits.
        relayed = int(gst.needed) <= 8
        assert int(gst.rounds) == (1 if relayed else max(-(-need // 8), 1))
        need = int(gst.needed)
    else:
        assert int(gst.needed) == need
        assert int(gst.rounds) == (1 if chunked else max(-(-need // 8), 1))
    grown = Exchange(OFFSETS, config, capacities={n: 8}).grown(gst)
    if need > 8:
        assert grown.capacities[own(n)] >= need
        again = run(config, data, once, grown.capacities)
        # all_gather: every device receives every device's round, so a round holds at
        # most n / P ids from each, rounded up to 8 (its memory stays about n, whatever
        # P): growing does not take it past that.
        limit = 8 if config.strategy.value == "all_gather" else n
        assert int(again["gstats"].rounds) == -(-need // limit)
        np.testing.assert_array_equal(again["rows"], out["rows"])
    else:
        assert grown.capacities == {own(n): 8}


def test_calibrated_capacity_of_an_unmeasured_length_is_estimated_from_the_cut():
    """Before calibration: cut x n spread over the other devices, with headroom (8 at
    least); measured lengths use what was measured; bound sizing the worst case."""
    from jgraph.exchange.all_to_all import AllToAll

    class Shape:            # what `capacity` reads of a transfer
        def __init__(self, length):
            self.n, self.num_parts, self.top = length, P, length
        estimate, limit = AllToAll.estimate, AllToAll.limit
    ex = Exchange(OFFSETS, ExchangeConfig(strategy="all_to_all", cut=0.5, headroom=0.25))
    assert ex.capacity(Shape(1400)) == 128         # 1400 * 0.5 / 7 * 1.25 = 125 -> 128
    assert ex.capacity(Shape(32)) == 8
    assert ex.calibrated({1400: 40}).capacity(Shape(1400)) == 40
    bound = Exchange(OFFSETS, ExchangeConfig(strategy="all_to_all", sizing="bound"))
    assert bound.capacity(Shape(1400)) == 1400


# -- ragged_all_to_all ----------------------------------------------------------------------


def test_ragged_strategy_on_cpu_raises_not_implemented_naming_all_to_all():
    with pytest.raises(NotImplementedError, match="all_to_all"):
        Exchange(OFFSETS, ExchangeConfig(strategy="ragged_all_to_all"), platform="cpu")


@pytest.mark.parametrize("platform,strategy", [("cpu", "all_to_all"), (None, "all_to_all"),
                                               ("gpu", "ragged_all_to_all")])
def test_the_auto_strategy_is_what_the_platform_has(platform, strategy):
    """The default: exact sizes on GPUs, the ladder of all_to_all elsewhere."""
    assert ExchangeConfig().strategy.value == "auto"
    assert Exchange(OFFSETS, ExchangeConfig(), platform=platform).config.strategy.value == strategy


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name):
    """`lax.ragged_all_to_all` built from all_gather and masks (XLA:CPU lacks it).

    On device `me`, sender q's slice `operand_q[input_offsets_q[me] : + send_sizes_q[me]]`
    is written at `output[output_offsets_q[me] : ...]`; the rest of `output` is kept.
    What the real collective leaves undefined poisons the whole result instead: slices
    out of bounds, overlapping writes, or `recv_sizes` that disagree with what is sent.
    """
    me = lax.axis_index(axis_name)
    operands = lax.all_gather(operand, axis_name)             # [P, L, ...]
    starts = lax.all_gather(input_offsets, axis_name)         # [sender, receiver]
    sizes = lax.all_gather(send_sizes, axis_name)
    at = lax.all_gather(output_offsets, axis_name)
    num, length, m = operands.shape[0], operand.shape[0], output.shape[0]
    j = jnp.arange(m)
    expand = lambda mask: mask.reshape((m,) + (1,) * (output.ndim - 1))
    result, writes = output, jnp.zeros(m, jnp.int32)
    bad = jnp.any(recv_sizes != sizes[:, me])
    for q in range(num):
        start, size, dst = starts[q, me], sizes[q, me], at[q, me]
        bad |= (size < 0) | (start < 0) | (dst < 0) | (start + size > length) | (dst + size > m)
        take = (j >= dst) & (j < dst + size)
        rows = operands[q][jnp.clip(j - dst + start, 0, length - 1)]
        result = jnp.where(expand(take), rows, result)
        writes += take
    bad |= jnp.any(writes > 1)
    poison = (jnp.nan if jnp.issubdtype(output.dtype, jnp.floating)
              else jnp.iinfo(output.dtype).min)
    return jnp.where(bad, jnp.asarray(poison, output.dtype), result)


def test_emulated_ragged_all_to_all_follows_the_documented_example():
    """The example of `help(jax.lax.ragged_all_to_all)`, on 2 devices."""
    mesh2 = make_mesh(devices=jax.devices()[:2])
    args = [np.array(a, np.int32) for a in (
        [1, 2, 2, 3, 4, 0], [0] * 8, [0, 1, 0, 1], [1, 2, 1, 1], [0, 0, 1, 2], [1, 1, 2, 1])]
    step = jax.jit(jax.shard_map(
        lambda *a: emulated_ragged_all_to_all(*a, axis_name=AXIS), mesh=mesh2,
        in_specs=(ROWS,) * 6, out_specs=ROWS))
    np.testing.assert_array_equal(step(*args), [1, 3, 0, 0, 2, 2, 4, 0])
    args[5] = np.array([1, 2, 2, 1], np.int32)        # recv_sizes disagree with send_sizes
    assert np.all(np.asarray(step(*args))[:4] == np.iinfo(np.int32).min)


# Few rungs (each compiles its own copy of the emulation); top (P - 1) * n.
RAGGED = ExchangeConfig(strategy="ragged_all_to_all", growth=4.0, sizing="bound")


@pytest.mark.parametrize("case", sorted(CASES))
def test_ragged_gather_and_scatter_add_equal_numpy_with_emulated_collective(case, monkeypatch):
    monkeypatch.setattr(ragged_module, "_ragged_all_to_all", emulated_ragged_all_to_all)
    out = run(RAGGED, make_case(case))
    check_gather(RAGGED, make_case(case), out)
    check_scatter_add(RAGGED, make_case(case), out)


@pytest.mark.parametrize("once", [False, True], ids=["per_rung", "once"])
def test_ragged_rounds_answer_everything_with_emulated_collective(once, monkeypatch):
    """ragged_all_to_all with a receive buffer of 8 where owners receive up to 7 x 32
    ids: windows of the receive order, round by round, every answer equal to numpy's."""
    monkeypatch.setattr(ragged_module, "_ragged_all_to_all", emulated_ragged_all_to_all)
    config = dataclasses.replace(RAGGED, sizing="calibrated")
    data = make_case("one_peer")
    out = run(config, data, once, {n: 8})
    ids, valid, _, _ = data
    np.testing.assert_array_equal(out["rows"], np.where(valid[..., None], TABLE[ids], 0))
    _, counts = request_counts(ids, valid)
    need = expected_need("ragged_all_to_all", counts)
    assert int(out["gstats"].needed) == need and int(out["gstats"].rounds) == -(-need // 8)
    assert float(out["gstats"].wire_bytes) == counts.sum() * (4 + ROW_BYTES)


@pytest.mark.slow      # the ragged transport's per-rung path is in the fast tier
@pytest.mark.parametrize("case", ONCE_CASES[:1])
def test_ragged_gather_with_the_owner_function_run_once_equals_numpy(case, monkeypatch):
    monkeypatch.setattr(ragged_module, "_ragged_all_to_all", emulated_ragged_all_to_all)
    check_gather(RAGGED, make_case(case), run(RAGGED, make_case(case), once=True))


# -- the scheduled strategy -----------------------------------------------------------------


def test_schedule_meets_every_ordered_pair_once_in_partial_permutations():
    """Every ordered pair i != j in exactly one round, no owner twice in a round, each
    pair at least half its round's heaviest; without weights the P - 1 shifts."""
    rng = np.random.default_rng(5)
    for parts in (2, 3, 8, 16):
        skewed = rng.pareto(1.0, (parts, parts)) * (rng.random((parts, parts)) < 0.5)
        for weights in (None, skewed, np.ones((parts, parts))):
            dest = build_schedule(parts, weights)
            assert dest.shape[1] == parts and dest.dtype == np.int32
            pairs = sorted((i, int(j)) for row in dest for i, j in enumerate(row) if j >= 0)
            assert pairs == [(i, j) for i in range(parts) for j in range(parts) if i != j]
            for row in dest:
                owners = row[row >= 0]
                assert owners.size == np.unique(owners).size
                if weights is not None:
                    w = weights[np.flatnonzero(row >= 0), owners]
                    assert w.min() >= 0.5 * w.max()
    np.testing.assert_array_equal(build_schedule(4), [[1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]])


def case_to_one_owner(rng):
    """Only pairs (k, 4) are loaded, 4k + 3 ids each (3 to 31); the rest is local."""
    ids, valid = _own_ids(rng)
    for k in range(P):
        if k != 4:
            m = 4 * k + 3
            ids[k, :m] = rng.choice(np.arange(OFFSETS[4], OFFSETS[5]), m, replace=False)
            valid[k, :m] = True
    return _finish(rng, ids, valid)


TO_ONE_OWNER = case_to_one_owner(np.random.default_rng(7))
WEIGHTS = request_counts(TO_ONE_OWNER[0], TO_ONE_OWNER[1])[1].astype(float)
SCHEDULED = ExchangeConfig(strategy="scheduled")      # calibrated, chunks of 2 below


@pytest.mark.parametrize("once,weighted", [(False, False), (True, True)],
                         ids=["per_rung-shifts", "once-weighted"])
def test_scheduled_gather_in_chunks_of_2_and_its_scatter_add_equal_numpy(once, weighted):
    """Chunks of 2 ids where pairs ask up to 32 (up to 16 iterations a round), on the
    shifts and on a schedule from pair weights: every answer equal to numpy's, the wire
    that of the schedule, one round reported, nothing to grow; scatter_add (all_to_all,
    not yet measured: bound-sized, never the chunk) sums equal to numpy's."""
    weights = WEIGHTS if weighted else None
    for name in ("skewed", "one_peer", "out_of_range"):
        data = make_case(name)
        out = run(SCHEDULED, data, once, {n: 2}, weights)
        check_gather(SCHEDULED, data, out, weights, {n: 2})
        assert int(out["gstats"].capacity) == 2
        grown = Exchange(OFFSETS, SCHEDULED, capacities={own(n): 2}).grown(out["gstats"])
        assert grown.capacities == {own(n): 2}
        check_scatter_add(SCHEDULED, data, out)


def test_scheduled_scatter_add_is_calibrated_under_its_own_key_apart_from_the_chunks():
    """A scatter_add's capacity is a device pair's load, a gather's a chunk: the
    scatter's is keyed by the straight route. Measured below its need it loses exactly
    what does not fit (counted); `grown` raises that key only (the chunk stays 2),
    after which the sums equal numpy's at that capacity, not the bound."""
    data = make_case("all_remote")
    ids, valid, _, _ = data
    _, counts = request_counts(ids, valid & in_range(ids))
    need = int(counts.max())                    # 17 of n = 32: 24 with headroom
    ex = Exchange(OFFSETS, SCHEDULED, capacities={own(n): 2, straight(n): 8})
    assert ex.scatters_straight and need > 8
    low = run(SCHEDULED, data, False, ex.capacities)
    st = low["sstats"]
    assert Key.of(st) == straight(n) and int(st.capacity) == 8 and int(st.needed) == need
    assert int(st.overflow) == expected_overflow("all_to_all", counts, 8) > 0
    grown = ex.grown([low["gstats"], st])
    assert grown.capacities == {own(n): 2, straight(n): with_headroom(need, SCHEDULED.headroom)}
    assert ex.fitted([st]).capacities[straight(n)] == grown.capacities[straight(n)]
    again = run(SCHEDULED, data, False, grown.capacities)
    check_gather(SCHEDULED, data, again, capacities={n: 2})
    assert int(again["sstats"].overflow) == 0
    assert int(again["sstats"].capacity) == grown.capacities[straight(n)] < n
    owned, mask, sums = again["owned"], again["mask"], again["sums"]
    expected = np.zeros((N, 2))
    ok = valid & in_range(ids)
    np.add.at(expected, ids[ok], data[3][ok])
    got = np.zeros((N, 2))
    for k in range(P):
        got[owned[k][mask[k]]] = sums[k][mask[k]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_scheduled_wire_is_the_exact_bytes_up_to_a_chunk_per_loaded_pair():
    """Weights equal to the loads: the 7 loaded pairs (all to owner 4) get a round each,
    so each is padded only to its last chunk: 4k + 3 ids in chunks of 2 cost one slot
    more than exact, per pair."""
    out = run(SCHEDULED, TO_ONE_OWNER, True, {n: 2}, WEIGHTS)
    check_gather(SCHEDULED, TO_ONE_OWNER, out, WEIGHTS, {n: 2})
    exact = WEIGHTS.sum() * (4 + ROW_BYTES)
    assert float(out["gstats"].wire_bytes) == exact + 7 * (4 + ROW_BYTES)


def test_scheduled_gather_with_the_hot_node_cache_equals_numpy():
    """Cached ids are answered from the cache and never cross the wire."""
    data = make_case("skewed")
    out = run(SCHEDULED, data, False, {n: 2}, cached=True)
    ids, valid, _, _ = data
    np.testing.assert_array_equal(out["rows"], np.where(valid[..., None], TABLE[ids], 0))
    np.testing.assert_array_equal(out["twice"], np.where(valid, ids * 2, 0))
    _, counts = request_counts(ids, valid & ~np.isin(ids, CACHE_IDS))
    cached = 0
    for k in range(P):
        asked = np.unique(ids[k][valid[k]])
        cached += np.sum(np.isin(asked, CACHE_IDS) & (owner_of(asked) != k))
    st = out["gstats"]
    assert int(st.cached) == cached > 0
    assert float(st.wire_bytes) == scheduled_wire(build_schedule(P), counts, 2, ROW_BYTES)


def test_dist_graph_gives_the_scheduled_exchange_its_partitions_halo_counts(tmp_path):
    """DistGraph.exchange: pair weights [k, j] = partition k's halo nodes owned by j
    (only for the scheduled strategy); copies of the exchange keep them."""
    from jgraph.data import Graph
    from jgraph.partition import open_partitions, partition_graph
    from jgraph.sharded import DistGraph

    rng = np.random.default_rng(11)
    graph = Graph(name="ring", num_nodes={"_N": 64},
                  edges={("_N", "_E", "_N"): np.stack([rng.integers(0, 64, 300),
                                                        rng.integers(0, 64, 300)])})
    partition_graph(graph, P, "random", tmp_path / "parts")
    dg = DistGraph(open_partitions(tmp_path / "parts"), make_mesh(8))
    ex = dg.exchange(ExchangeConfig(strategy="scheduled"))
    offsets = np.asarray(dg.book.offsets)
    expected = np.zeros((P, P))
    for k in range(P):
        for node in np.asarray(dg.parts.part(k).halo):
            expected[k, np.searchsorted(offsets, node, side="right") - 1] += 1
    np.testing.assert_array_equal(ex.pair_weights, expected)
    # meta.json records them, so no partition's halo is read; a partition written
    # before it did still gets them, from the halos.
    assert [info.halo_by_owner for info in dg.meta.parts] == expected.astype(int).tolist()
    meta = json.loads((tmp_path / "parts" / "meta.json").read_text())
    for entry in meta["parts"]:
        del entry["halo_by_owner"]
    (tmp_path / "parts" / "meta.json").write_text(json.dumps(meta))
    older = DistGraph(open_partitions(tmp_path / "parts"), make_mesh(8))
    np.testing.assert_array_equal(
        older.exchange(ExchangeConfig(strategy="scheduled")).pair_weights, expected)
    assert expected.sum() > 0 and np.all(np.diag(expected) == 0)
    np.testing.assert_array_equal(ex.schedule, build_schedule(P, expected))
    assert ex.calibrated({own(n): 8})._straight().schedule is ex.schedule
    assert dg.exchange(ExchangeConfig(strategy="all_to_all")).pair_weights is None


# -- scatter_rows: gather's transpose into the owners' dense tables -------------------------


@functools.cache
def scatter_rows_step(config: ExchangeConfig):
    ex = Exchange(OFFSETS, config)

    def body(ids, valid, values):
        tables, stats = ex.scatter_rows(ids, valid, values, RPP)
        return tables, stats

    return jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=(ROWS, ROWS, ROWS),
                                 out_specs=(ROWS, REPLICATED)))


@pytest.mark.parametrize("case", ("one_peer", "duplicates", "out_of_range"))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_scatter_rows_sums_every_value_into_its_owners_table_in_rounds(strategy, case):
    """With a capacity of 4 ids (every request needs several rounds), each owner's table
    row is the sum of every device's values for that id, as numpy's add.at; nothing is
    lost, and out-of-range ids are counted, not added."""
    config = dataclasses.replace(CONFIGS[strategy], max_capacity=4, sizing="calibrated")
    ids, valid, _, values = make_case(case)
    tables, stats = scatter_rows_step(config)(ids.reshape(-1).astype(np.int32),
                                              valid.reshape(-1), values.reshape(P * n, 2))
    ok = valid & in_range(ids)
    expected = np.zeros((N, 2), np.float64)
    np.add.at(expected, ids[ok], values[ok])
    tables = np.asarray(tables).reshape(P, RPP, 2)
    got = np.concatenate([tables[k, :SIZES[k]] for k in range(P)])
    np.testing.assert_array_equal(got[:, 0], expected[:, 0])            # integers: exact
    np.testing.assert_allclose(got[:, 1], expected[:, 1], rtol=1e-6)
    assert all(np.all(tables[k, SIZES[k]:] == 0) for k in range(P))
    _, counts = request_counts(ids, ok)
    assert int(stats.overflow) == 0 and int(stats.non_local) == counts.sum()
    assert int(stats.out_of_range) == np.sum(valid & ~in_range(ids))
    if counts.max() > 4 and config.strategy.value in ("all_to_all", "ppermute"):
        assert int(stats.rounds) > 1
