"""Capacities measured from the graph: the calibrated sampler samples exactly the
blocks of the worst-case one (on the batches it was measured on), a batch that needs
more than its capacities is reported (never cut silently), and `grow` always makes
room for what a batch needed."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sampling.capacity import ROUND, calibrate, grow, measure_frontiers, with_headroom
from jgraph.sampling.sampler import SampleOverflowError
from jgraph.sharded import REPLICATED, ROWS, ExchangeConfig

ONE_RUNG = ExchangeConfig(relay=False, max_rungs=1)     # one compiled branch: faster
FANOUTS = (5, 4)
BATCH = 16


@pytest.fixture(scope="module")
def setup(cora8):
    loader = NodeLoader.from_ids(cora8.mesh, cora8.book.offsets, np.arange(0, 2708, 7),
                                 batch_size=BATCH)
    return cora8, loader, cora8.exchange(ONE_RUNG)


def sample_program(dg, loader, exchange, sampler):
    def fn(graph, order, index):
        seeds, mask = loader.batch(order, index)
        s = sampler.sample(graph, exchange, seeds, mask, seed=3, step=index, local_seeds=True)
        return tuple((b.dst, b.src, b.nbr, b.mask) for b in s.blocks), s.stats
    return jax.jit(jax.shard_map(fn, mesh=dg.mesh, in_specs=(dg.graph.specs(), ROWS, REPLICATED),
                                 out_specs=(ROWS, REPLICATED)))


def per_device(x, P=8):
    return np.asarray(x).reshape(P, -1, *np.asarray(x).shape[1:])


@pytest.mark.slow      # samples at two sizes
def test_calibrated_capacities_sample_the_same_blocks_as_the_worst_case(setup):
    dg, loader, exchange = setup
    worst = NeighborSampler(FANOUTS)
    bound = worst.worst_case(dg.graph, BATCH)
    needed = measure_frontiers(worst, dg.graph, exchange, loader, seed=0,
                               batches=loader.steps_per_epoch)
    fitted = calibrate(worst, dg.graph, exchange, loader, seed=0, headroom=0.1,
                       batches=loader.steps_per_epoch)
    assert all(c <= b for c, b in zip(fitted.capacities, bound))
    assert fitted.capacities[-1] < bound[-1]          # cora's frontiers share nodes
    assert all(c >= n for c, n in zip(fitted.capacities, needed))
    big = sample_program(dg, loader, exchange, worst)
    small = sample_program(dg, loader, exchange, fitted)
    order = loader.epoch_order(0)
    for i in range(loader.steps_per_epoch):
        (ref_blocks, ref_stats) = big(dg.graph, order, jnp.int32(i))
        (blocks, stats) = small(dg.graph, order, jnp.int32(i))
        assert int(stats.overflow) == 0 and int(ref_stats.overflow) == 0
        np.testing.assert_array_equal(stats.needed, ref_stats.needed)
        for (d0, s0, n0, m0), (d1, s1, n1, m1) in zip(ref_blocks, blocks):
            s0, s1 = per_device(s0), per_device(s1)
            k = s1.shape[1]
            # The calibrated src is the worst case's, cut where only padding was.
            np.testing.assert_array_equal(s1, s0[:, :k])
            assert (s0[:, k:] == -1).all()
            n0, n1 = per_device(n0), per_device(n1)
            d0, d1 = per_device(d0), per_device(d1)
            np.testing.assert_array_equal(per_device(m1), per_device(m0)[:, :d1.shape[1]])
            np.testing.assert_array_equal(n1, n0[:, :d1.shape[1]])
            np.testing.assert_array_equal(d1, d0[:, :d1.shape[1]])
            assert (d0[:, d1.shape[1]:] == -1).all()


def test_a_batch_that_needs_more_than_the_capacities_is_reported_not_cut_silently(setup):
    dg, loader, exchange = setup
    tight = NeighborSampler(FANOUTS, capacities=(BATCH + 8, BATCH + 16))
    (blocks, stats) = sample_program(dg, loader, exchange, tight)(
        dg.graph, loader.epoch_order(0), jnp.int32(0))
    assert int(stats.overflow) > 0
    assert (np.asarray(stats.needed) > np.asarray(stats.capacity)).any()
    with pytest.raises(SampleOverflowError, match="capacities"):
        stats.check()
    for _, src, nbr, mask in blocks:
        nbr, mask = per_device(nbr), per_device(mask)
        # A neighbour that did not fit is masked, never an index past src.
        assert (nbr[mask] < per_device(src).shape[1]).all() and (nbr[~mask] == -1).all()


def test_grow_makes_room_for_every_hop_that_overflowed_and_scales_the_later_ones(setup):
    dg, _, _ = setup
    sampler = NeighborSampler((5, 4, 3), capacities=(64, 128, 256))
    worst = sampler.worst_case(dg.graph, BATCH)
    grown = grow(sampler, dg.graph, BATCH, needed=(100, 120, 200), capacity=(64, 128, 256))
    caps = grown.capacities
    assert (caps[0] >= 100 and caps[0] % ROUND == 0) or caps[0] == worst[0]
    # Hops after the first overflow were sampled from a cut frontier: they grow too.
    factor = 100 / 64
    assert caps[1] >= min(128 * factor, worst[1]) and caps[2] >= min(256 * factor, worst[2])
    assert grow(sampler, dg.graph, BATCH, (10, 20, 30), (64, 128, 256)) is sampler


def test_with_headroom_rounds_up_and_never_exceeds_the_worst_case():
    assert with_headroom([100, 1000], [10_000, 10_000], 0.1) == (128, 1152)
    assert with_headroom([100, 1000], [120, 1000], 0.1) == (120, 1000)
    assert with_headroom([0], [500], 0.5) == (ROUND,)


def test_capacities_must_be_one_positive_count_per_hop():
    with pytest.raises(ValueError, match="one count >= 1 per hop"):
        NeighborSampler((5, 4), capacities=(10,))
    with pytest.raises(ValueError, match="one count >= 1 per hop"):
        dataclasses.replace(NeighborSampler((5,)), capacities=(0,))
