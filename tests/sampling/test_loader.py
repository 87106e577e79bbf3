"""NodeLoader on 8 devices against numpy: each device holds exactly the training seeds
of its own partition, deals each of them exactly once per epoch in batches that are
padded with masked -1 entries, in an order fixed by (seed, epoch); LoaderState rolls
over epochs; and the loader plus the sampler compile once for any number of epochs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.sampling import LoaderState, NeighborSampler, NodeLoader
from jgraph.sampling import loader as loader_module
from jgraph.sharded import REPLICATED, ROWS, ExchangeConfig

P = 8
BATCH = 8


def per_device(array) -> np.ndarray:
    return np.asarray(array).reshape(P, -1)


@pytest.fixture(scope="module")
def train_ids(cora, cora8):
    """Each partition's training seeds, from the original split relabelled by
    node_map_inv (not from the partition's split files)."""
    new = np.sort(np.asarray(cora8.parts.node_map_inv())[cora.splits["_N"]["train"]])
    owner = np.searchsorted(cora8.book.offsets, new, side="right") - 1
    return [new[owner == k] for k in range(P)]


@pytest.fixture(scope="module")
def loader(cora8):
    return NodeLoader.from_split(cora8, "train", batch_size=BATCH, seed=3)


def batch_fn(loader):
    """Compiled: (order, step) -> every device's batch `step` (ids, mask)."""
    return jax.jit(jax.shard_map(loader.batch, mesh=loader.mesh, in_specs=(ROWS, REPLICATED),
                                 out_specs=(ROWS, ROWS)))


@pytest.fixture(scope="module")
def take(loader):
    return batch_fn(loader)


def epoch_batches(loader, take, epoch):
    """[steps, P, B] ids and masks of one epoch, taken batch by batch."""
    order = loader.epoch_order(epoch)
    out = [take(order, jnp.int32(s)) for s in range(loader.steps_per_epoch)]
    return (np.stack([per_device(ids) for ids, _ in out]),
            np.stack([per_device(mask) for _, mask in out]))


def test_each_device_holds_exactly_its_partitions_training_seeds(loader, train_ids, cora8):
    counts = np.array([ids.size for ids in train_ids])
    np.testing.assert_array_equal(loader.counts, counts)
    assert loader.num_seeds == 140 and counts.min() < counts.max()
    seeds = per_device(loader.seeds)
    steps = -(-counts.max() // BATCH)
    assert loader.batch_size == -(-counts.max() // steps) <= BATCH    # spread evenly
    assert loader.per_device == seeds.shape[1] == steps * loader.batch_size
    for k in range(P):
        np.testing.assert_array_equal(seeds[k, :counts[k]], train_ids[k])
        assert np.all(seeds[k, counts[k]:] == -1)
        assert np.all(cora8.book.owner(train_ids[k]) == k)


def test_epoch_order_permutes_each_devices_own_seeds(loader, train_ids):
    for epoch in range(3):
        order = per_device(loader.epoch_order(epoch))
        for k in range(P):
            n = train_ids[k].size
            np.testing.assert_array_equal(np.sort(order[k, :n]), train_ids[k])
            assert np.all(order[k, n:] == -1)


def test_orders_differ_between_epochs_and_repeat_for_the_same_seed_and_epoch(loader, cora8):
    orders = [per_device(loader.epoch_order(e)) for e in range(3)]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        for k in range(P):                 # every device reshuffles (each has > 8 seeds)
            assert not np.array_equal(orders[a][k], orders[b][k])
    np.testing.assert_array_equal(per_device(loader.epoch_order(1)), orders[1])
    same = NodeLoader.from_split(cora8, "train", batch_size=BATCH, seed=3)
    np.testing.assert_array_equal(per_device(same.epoch_order(2)), orders[2])
    other = NodeLoader.from_split(cora8, "train", batch_size=BATCH, seed=4)
    assert not np.array_equal(per_device(other.epoch_order(2)), orders[2])


@pytest.fixture(scope="module")
def skewed(cora8):
    """(loader, ids per device): 30 seeds on device 0, 3 on device 3, none elsewhere."""
    offsets = cora8.book.offsets
    rng = np.random.default_rng(2)
    ids = [np.sort(rng.choice(np.arange(offsets[k], offsets[k + 1]), n, replace=False))
           for k, n in enumerate([30, 0, 0, 3, 0, 0, 0, 0])]
    loader = NodeLoader.from_ids(cora8.mesh, offsets, np.concatenate(ids), batch_size=BATCH,
                                 seed=1)
    return loader, ids


@pytest.mark.parametrize("which", ["train_split", "skewed_ids"])
def test_every_device_takes_steps_per_epoch_batches_covering_its_seeds_once(
        which, loader, take, train_ids, skewed):
    if which == "skewed_ids":
        loader, expected_ids = skewed
        take = batch_fn(loader)
    else:
        expected_ids = train_ids
    counts = loader.counts
    np.testing.assert_array_equal(counts, [ids.size for ids in expected_ids])
    assert loader.steps_per_epoch == -(-counts.max() // BATCH)
    B = loader.batch_size
    assert -(-counts.max() // loader.steps_per_epoch) == B
    for epoch in range(2):
        ids, mask = epoch_batches(loader, take, epoch)
        assert ids.shape == (loader.steps_per_epoch, P, B)
        np.testing.assert_array_equal(mask, ids >= 0)
        order = per_device(loader.epoch_order(epoch))
        for k in range(P):
            dealt = ids[:, k].reshape(-1)
            np.testing.assert_array_equal(dealt, order[k, :dealt.size])   # in order
            real = dealt[dealt >= 0]
            assert real.size == counts[k] and np.unique(real).size == real.size
            np.testing.assert_array_equal(np.sort(real), expected_ids[k])
            # Padding only at the tail: full batches, one partial, then empty ones.
            filled = mask[:, k].sum(axis=1)
            expected = np.clip(counts[k] - B * np.arange(loader.steps_per_epoch), 0, B)
            np.testing.assert_array_equal(filled, expected)


def test_drop_last_drops_only_the_last_partial_batch(cora8, train_ids):
    full = NodeLoader.from_split(cora8, "train", batch_size=BATCH, seed=3)
    dropping = NodeLoader.from_split(cora8, "train", batch_size=BATCH, seed=3, drop_last=True)
    counts = dropping.counts
    assert counts.max() % BATCH, "the largest device must have a partial last batch"
    assert dropping.steps_per_epoch == counts.max() // BATCH == full.steps_per_epoch - 1
    ids, mask = epoch_batches(dropping, batch_fn(dropping), 0)
    # Same seed: the same order (the padding after it differs: `full` spreads its
    # seeds evenly over one more step).
    most = counts.max()
    order = per_device(full.epoch_order(0))[:, :most]
    np.testing.assert_array_equal(per_device(dropping.epoch_order(0))[:, :most], order)
    for k in range(P):
        dealt = ids[:, k].reshape(-1)
        np.testing.assert_array_equal(dealt, order[k, :dealt.size])
        assert np.sum(dealt >= 0) == min(counts[k], dropping.steps_per_epoch * BATCH)
        np.testing.assert_array_equal(mask[:, k], ids[:, k] >= 0)


def test_loader_state_advance_rolls_over_to_the_next_epoch(loader):
    steps = loader.steps_per_epoch
    state, seen = LoaderState(), []
    for _ in range(2 * steps + 1):
        seen.append(state)
        state = loader.advance(state)
    assert seen == [LoaderState(e, s) for e in range(2) for s in range(steps)] + [LoaderState(2, 0)]
    assert state == LoaderState(2, 1)


def test_loader_and_sampler_compile_once_for_three_epochs(loader, cora8, cora, reference_of):
    """The step takes (epoch order, step, seed-step) as traced values; 3 epochs of it
    trace it once, and epoch_order compiles once. Each step's sample is checked, and
    its seeds are the loader's batch."""
    ref = reference_of(cora, cora8)
    sampler = NeighborSampler((3,))
    exchange = cora8.exchange(ExchangeConfig(relay=False, max_rungs=1))   # compiles faster
    traces = []

    def body(graph, order, step):
        traces.append(1)
        seeds, mask = loader.batch(order, step)
        out = sampler.sample(graph, exchange, seeds, mask, seed=jnp.uint32(7),
                             step=step.astype(jnp.uint32))
        block = out.blocks[-1]
        return seeds, mask, block.dst, block.src, block.nbr, block.mask

    fn = jax.jit(jax.shard_map(body, mesh=cora8.mesh,
                               in_specs=(cora8.graph.specs(), ROWS, REPLICATED),
                               out_specs=ROWS))
    epoch_cache = loader_module._epoch_order._cache_size
    seen = {k: [] for k in range(P)}
    sizes = []
    for epoch in range(3):
        order = loader.epoch_order(epoch)
        sizes.append(epoch_cache())
        for s in range(loader.steps_per_epoch):
            seeds, mask, dst, src, nbr, m = (per_device(x) if x.ndim == 1 else
                                             np.asarray(x).reshape(P, -1, x.shape[1])
                                             for x in fn(cora8.graph, order, jnp.int32(s)))
            np.testing.assert_array_equal(dst, np.where(mask, seeds, -1))
            for k in range(P):
                seen[k].extend(seeds[k][mask[k]].tolist())
            for k in range(P):
                for i in np.flatnonzero(mask[k]):
                    got = src[k][nbr[k, i][m[k, i]]]
                    true = ref.nbrs(int(dst[k, i]))
                    assert np.isin(got, true).all() and got.size == min(true.size, 3)
    assert len(traces) == 1
    assert sizes[1] == sizes[2] == sizes[0]        # epochs 1, 2 added no compilation
    for k in range(P):                              # each seed once per epoch
        got = np.sort(seen[k])
        np.testing.assert_array_equal(got, np.sort(np.repeat(
            per_device(loader.seeds)[k][:loader.counts[k]], 3)))


# -- from_ids and errors -----------------------------------------------------------------------


def test_from_ids_deals_distinct_ids_to_their_owners(cora8):
    rng = np.random.default_rng(0)
    ids = rng.choice(2708, 90, replace=False)
    loader = NodeLoader.from_ids(cora8.mesh, cora8.book.offsets,
                                 np.concatenate([ids, ids[:10]]), batch_size=4)
    owner = cora8.book.owner(ids)
    seeds = per_device(loader.seeds)
    for k in range(P):
        mine = np.sort(ids[owner == k])
        assert loader.counts[k] == mine.size
        np.testing.assert_array_equal(seeds[k, :mine.size], mine)
        assert np.all(seeds[k, mine.size:] == -1)


@pytest.mark.parametrize("bad", [-1, 2708])
def test_from_ids_outside_the_graph_is_a_value_error_naming_the_id(cora8, bad):
    with pytest.raises(ValueError, match=rf"seed id {bad} is outside"):
        NodeLoader.from_ids(cora8.mesh, cora8.book.offsets, [0, 5, bad], batch_size=4)


def test_loader_errors_name_what_is_wrong(cora8, mesh1):
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        NodeLoader.from_split(cora8, "train", batch_size=0)
    with pytest.raises(KeyError, match="split 'holdout'.*'train'"):
        NodeLoader.from_split(cora8, "holdout", batch_size=4)
    with pytest.raises(ValueError, match="8 partitions of seeds for a mesh of 1"):
        NodeLoader.from_ids(mesh1, cora8.book.offsets, [1, 2], batch_size=4)
