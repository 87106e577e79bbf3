"""Link prediction's sampling (jgraph.sampling.edges) against numpy, on 8 devices.

EdgeLoader: over an epoch every training positive of the split is dealt exactly once,
by the device owning its destination, with its own src / dst / relation, padding
masked and -1; epoch orders change with the epoch and repeat for the same seed. The
order is a sort by a hash of the edge's id in the split, never of anything the mesh
decides, so it does not depend on the mesh: the 8-device order of a device's edges is
the order those edges take in the one-device order of a 1-part partition of the same
split (every partition stores the same edge ids; eid is the position in the split).

Negatives: uniform ones are uniform over all nodes (chi-square), local ones are drawn
by their device from its own nodes, uniformly; joint ones are k per device and step,
shared by its positives, and uniform over all nodes; in-batch ones are other
positives' destinations, never the positive's own, invalid opposite padding. On a
heterogeneous graph (ACM) a negative always has its relation's destination type.
Uniform negatives are keyed by (seed, step, edge id): a hand-built batch split over 8
devices and the same edges on 1 device, in another order, get the same negatives.

dedup and link_seeds equal np.unique-based references (distinct ids in order of first
appearance, padding ignored). exclude_pairs, on blocks sampled for a batch's endpoints,
masks exactly the slots joining the two ends of one of the batch's real positives, in
either direction, counts them, and leaves every other slot (padding pairs' included)
as it was.

Every reference is computed from the split's own host arrays (mapped into partition
ids by node_map_inv) or from the inputs given, never from the library's outputs.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jgraph.data import load_dataset, split_edges
from jgraph.partition import partition_graph
from jgraph.sampling import NeighborSampler
from jgraph.sampling.edges import (
    EdgeBatch,
    EdgeLoader,
    Negatives,
    NegativeSampler,
    TypeTable,
    dedup,
    exclude_pairs,
    link_seeds,
)
from jgraph.sharded import REPLICATED, ROWS, DistGraph, ExchangeConfig

P = 8
BATCH = 64                   # positives per device asked for (the loader spreads them evenly)
SEED = 5
ALPHA = 1e-3                 # chi-square: reject uniformity below this p-value
CHI_STEPS = 4                # batches pooled for the chi-square tests (full on every device)
SAMPLERS = {                 # one program draws all four kinds for the same batch
    Negatives.UNIFORM: NegativeSampler(32, Negatives.UNIFORM),
    Negatives.LOCAL: NegativeSampler(32, Negatives.LOCAL),
    Negatives.JOINT: NegativeSampler(1024, Negatives.JOINT),
    Negatives.IN_BATCH: NegativeSampler(4, Negatives.IN_BATCH),
}


def per_device(x, devices: int = P) -> np.ndarray:
    """A row-sharded output as [devices, rows per device, ...]."""
    x = np.asarray(x)
    return x.reshape(devices, -1, *x.shape[1:])


def every_negative_of_real_positives(batch, d) -> np.ndarray:
    """bool[P, B, k]: valid exactly where the positive is real."""
    return np.broadcast_to(batch.mask[..., None], d.valid.shape)


def uniform_p(groups) -> float:
    """Chi-square p-value that each group of counts is uniform within itself (the
    groups pooled: dof = bins - groups)."""
    stat, dof = 0.0, 0
    for counts in groups:
        counts = np.asarray(counts, np.float64)
        expected = counts.sum() / counts.size
        stat += float(np.sum((counts - expected) ** 2) / expected)
        dof += counts.size - 1
    return float(scipy.stats.chi2.sf(stat, dof))


# -- graphs with edge splits ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def split(cora):
    """cora (already symmetric) with 10% / 10% of its undirected edges held out."""
    return split_edges(cora, 0.1, 0.1, eval_negatives=20, seed=0, undirected=True)


def partitioned(graph, edges, parts: int, mesh, tmp_path_factory, name: str) -> DistGraph:
    out = tmp_path_factory.mktemp(name) / "parts"
    partition_graph(graph, parts, "metis", out, edge_splits=edges)
    return DistGraph(out, mesh)


@pytest.fixture(scope="module")
def link8(split, mesh8, tmp_path_factory):
    return partitioned(split.graph, split.edges, P, mesh8, tmp_path_factory, "link8")


@pytest.fixture(scope="module")
def link1(split, mesh1, tmp_path_factory):
    """The same split in a 1-part partition, on one device."""
    return partitioned(split.graph, split.edges, 1, mesh1, tmp_path_factory, "link1")


class Positives(NamedTuple):
    """A split's positives in partition ids, indexed by eid (position in the split):
    src, dst int64[n], etype int32[n], owner int64[n] (partition owning dst)."""

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    owner: np.ndarray

    @classmethod
    def of(cls, edge_set, dg: DistGraph) -> Positives:
        inv = np.asarray(dg.parts.node_map_inv())
        dst = inv[edge_set.dst]
        owner = np.searchsorted(dg.book.offsets, dst, side="right") - 1
        return cls(inv[edge_set.src], dst, edge_set.etype, owner)


@pytest.fixture(scope="module")
def train8(split, link8):
    return Positives.of(split.edges["train"], link8)


@pytest.fixture(scope="module")
def acm(shared_data):
    return load_dataset(shared_data("heco_acm.npz"))


@pytest.fixture(scope="module")
def acm8(acm, mesh8, tmp_path_factory):
    """ACM (paper->author, paper->subject) split as directed edges, in 8 parts."""
    s = split_edges(acm, 0.1, 0.1, eval_negatives=20, seed=0, undirected=False)
    return partitioned(s.graph, s.edges, P, mesh8, tmp_path_factory, "acm8")


# -- EdgeLoader ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loader8(link8):
    return EdgeLoader.from_split(link8, "train", batch_size=BATCH, seed=SEED)


def batch_fn(loader):
    """Compiled: (epoch order, step) -> every device's EdgeBatch of that step."""
    return jax.jit(jax.shard_map(loader.batch, mesh=loader.mesh, in_specs=(ROWS, REPLICATED),
                                 out_specs=ROWS))


@pytest.fixture(scope="module")
def take8(loader8):
    return batch_fn(loader8)


def eids_of(order, devices: int = P) -> np.ndarray:
    return per_device(order.eid, devices)


def test_edge_loader_holds_each_devices_own_positives(loader8, train8):
    counts = np.bincount(train8.owner, minlength=P)
    assert loader8.num_seeds == train8.src.size == counts.sum()
    assert counts.min() < counts.max()              # uneven: some devices pad more
    assert loader8.steps_per_epoch == -(-counts.max() // BATCH)
    assert loader8.batch_size * loader8.steps_per_epoch >= counts.max()
    edges = [per_device(a) for a in loader8.edges]
    for k in range(P):
        n = counts[k]
        eid = np.flatnonzero(train8.owner == k)     # sorted, as the loader keeps them
        for got, want in zip(edges, (eid, train8.src[eid], train8.dst[eid], train8.etype[eid])):
            np.testing.assert_array_equal(got[k, :n], want)
            assert np.all(got[k, n:] == -1)


def test_one_epoch_deals_every_training_positive_exactly_once_to_its_dst_owner(
        loader8, take8, train8, link8):
    B, steps = loader8.batch_size, loader8.steps_per_epoch
    offsets = link8.book.offsets
    for epoch in range(2):
        order = loader8.epoch_order(epoch)
        dealt = np.zeros(train8.src.size, np.int64)
        for s in range(steps):
            batch = EdgeBatch(*(per_device(a) for a in take8(order, jnp.int32(s))))
            assert batch.eid.shape == (P, B)
            np.testing.assert_array_equal(batch.mask, batch.eid >= 0)
            for name in ("src", "dst", "etype"):       # padding is -1 throughout
                assert np.all(getattr(batch, name)[~batch.mask] == -1)
            # The batch is the slice of the epoch's order it says.
            np.testing.assert_array_equal(batch.eid, eids_of(order)[:, s * B:(s + 1) * B])
            for k in range(P):
                eid = batch.eid[k][batch.mask[k]]
                np.add.at(dealt, eid, 1)
                np.testing.assert_array_equal(batch.src[k][batch.mask[k]], train8.src[eid])
                np.testing.assert_array_equal(batch.dst[k][batch.mask[k]], train8.dst[eid])
                np.testing.assert_array_equal(batch.etype[k][batch.mask[k]], train8.etype[eid])
                dst = batch.dst[k][batch.mask[k]]
                assert np.all((dst >= offsets[k]) & (dst < offsets[k + 1])), \
                    f"device {k} was dealt a positive whose destination it does not own"
        np.testing.assert_array_equal(dealt, 1)
        # Padding only after the real positives (so only in the last steps).
        counts = np.bincount(train8.owner, minlength=P)
        real = eids_of(order) >= 0
        np.testing.assert_array_equal(real, np.arange(real.shape[1]) < counts[:, None])


def test_epoch_orders_differ_between_epochs_and_are_a_function_of_the_seed(loader8, link8):
    orders = [eids_of(loader8.epoch_order(e)) for e in range(3)]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        for k in range(P):
            assert not np.array_equal(orders[a][k], orders[b][k])
    np.testing.assert_array_equal(eids_of(loader8.epoch_order(1)), orders[1])
    same = EdgeLoader.from_split(link8, "train", batch_size=BATCH, seed=SEED)
    np.testing.assert_array_equal(eids_of(same.epoch_order(2)), orders[2])
    other = EdgeLoader.from_split(link8, "train", batch_size=BATCH, seed=SEED + 1)
    for k in range(P):
        assert not np.array_equal(eids_of(other.epoch_order(2))[k], orders[2][k])
    # The other columns follow their edge through the shuffle.
    order = loader8.epoch_order(0)
    np.testing.assert_array_equal(np.sort(per_device(order.dst), axis=1),
                                  np.sort(per_device(loader8.edges.dst), axis=1))


def test_a_devices_order_is_its_edges_order_in_the_one_device_order(loader8, link1, train8):
    """The same split partitioned into 1 part on 1 device: its epoch order holds every
    positive; each of the 8 devices' orders must be that order restricted to its own
    edges (so the order depends on (seed, epoch, eid) only, not on the mesh)."""
    loader1 = EdgeLoader.from_split(link1, "train", batch_size=BATCH, seed=SEED)
    assert loader1.num_seeds == train8.src.size
    for epoch in range(2):
        everything = eids_of(loader1.epoch_order(epoch), 1)[0]
        everything = everything[everything >= 0]
        np.testing.assert_array_equal(np.sort(everything), np.arange(train8.src.size))
        mine = eids_of(loader8.epoch_order(epoch))
        for k in range(P):
            own = np.flatnonzero(train8.owner == k)
            expected = everything[np.isin(everything, own)]
            np.testing.assert_array_equal(mine[k, :own.size], expected)


# -- negatives: all four kinds of one batch in one program -----------------------------------------


class Drawn(NamedTuple):
    """One kind's negatives of every device's batch, on the host: cands [P, C], where
    and valid [P, B, k], and the LinkSeeds."""

    cands: np.ndarray
    where: np.ndarray
    valid: np.ndarray
    seeds: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    neg: np.ndarray
    neg_mask: np.ndarray

    def ids(self, batch: EdgeBatch) -> np.ndarray:
        """[P, B, k] each negative's node id, read as documented: `where` indexes the
        batch's endpoints [src; dst; candidates] (padding positives as -1); -1 where
        not valid."""
        ends = np.concatenate([np.where(batch.mask, batch.src, -1),
                               np.where(batch.mask, batch.dst, -1), self.cands], axis=1)
        out = np.take_along_axis(ends, self.where.reshape(P, -1), axis=1).reshape(self.where.shape)
        return np.where(self.valid, out, -1)


class NegativeRunner:
    """(loader's epoch order, batch index, seed, step) -> (EdgeBatch, {kind: Drawn}):
    the loader's batch with each of SAMPLERS' negatives, and link_seeds of each."""

    def __init__(self, loader: EdgeLoader, table: TypeTable):
        self.loader = loader

        def body(order, index, seed, step):
            batch = loader.batch(order, index)
            out = {}
            for kind, sampler in SAMPLERS.items():
                drawn = sampler.sample(table, batch, seed=seed, step=step, axis="parts")
                out[kind.value] = (*drawn, *link_seeds(batch, *drawn))
            return batch, out

        self.fn = jax.jit(jax.shard_map(body, mesh=loader.mesh,
                                        in_specs=(ROWS, REPLICATED, REPLICATED, REPLICATED),
                                        out_specs=ROWS))

    def __call__(self, epoch: int, index: int, *, seed: int = 0, step: int | None = None):
        batch, out = self.fn(self.loader.epoch_order(epoch), jnp.int32(index), jnp.uint32(seed),
                             jnp.uint32(index if step is None else step))
        batch = EdgeBatch(*(per_device(a) for a in batch))
        return batch, {Negatives(kind): Drawn(*(per_device(a) for a in arrays))
                       for kind, arrays in out.items()}


@pytest.fixture(scope="module")
def negatives8(loader8, link8):
    return NegativeRunner(loader8, TypeTable.of(link8))


@pytest.fixture(scope="module")
def cora_draws(negatives8, loader8):
    """[(batch, {kind: Drawn})] of batches 0..CHI_STEPS-1 and of the last (padded) one."""
    last = loader8.steps_per_epoch - 1
    assert last >= CHI_STEPS
    return [negatives8(0, s, seed=SEED) for s in [*range(CHI_STEPS), last]]


def test_batches_for_the_negative_tests_are_full_then_padded(cora_draws):
    for batch, _ in cora_draws[:CHI_STEPS]:
        assert batch.mask.all()
    batch, _ = cora_draws[-1]
    assert (~batch.mask).any() and batch.mask.any()


def test_uniform_negatives_are_uniform_over_all_nodes(cora_draws, link8):
    n = link8.meta.num_nodes
    k = SAMPLERS[Negatives.UNIFORM].k
    counts = np.zeros(n, np.int64)
    for batch, drawn in cora_draws:
        d = drawn[Negatives.UNIFORM]
        np.testing.assert_array_equal(d.valid, every_negative_of_real_positives(batch, d))
        assert d.cands.shape == (P, batch.mask.shape[1] * k)
        ids = d.ids(batch)
        assert np.all((ids[d.valid] >= 0) & (ids[d.valid] < n))
        assert np.all(d.cands[~batch.mask.repeat(k, axis=1)] == -1)   # padding draws nothing
        np.add.at(counts, ids[d.valid], 1)
    assert counts.sum() > 20 * n
    assert uniform_p([counts]) > ALPHA


def test_local_negatives_are_the_devices_own_nodes_uniformly(cora_draws, link8):
    offsets = link8.book.offsets
    counts = [np.zeros(offsets[k + 1] - offsets[k], np.int64) for k in range(P)]
    for batch, drawn in cora_draws:
        d = drawn[Negatives.LOCAL]
        np.testing.assert_array_equal(d.valid, every_negative_of_real_positives(batch, d))
        ids = d.ids(batch)
        for k in range(P):
            mine = ids[k][d.valid[k]]
            assert np.all((mine >= offsets[k]) & (mine < offsets[k + 1])), \
                f"device {k} drew a local negative it does not own"
            np.add.at(counts[k], mine - offsets[k], 1)
    assert min(c.sum() / c.size for c in counts) > 15
    assert uniform_p(counts) > ALPHA


def test_joint_negatives_are_shared_by_a_devices_positives_and_uniform(cora_draws, link8):
    n = link8.meta.num_nodes
    k = SAMPLERS[Negatives.JOINT].k
    counts = np.zeros(n, np.int64)
    per_step = []
    for batch, drawn in cora_draws:
        d = drawn[Negatives.JOINT]
        np.testing.assert_array_equal(d.valid, every_negative_of_real_positives(batch, d))
        assert d.cands.shape == (P, k)       # k for the device, not per positive
        ids = d.ids(batch)
        for k_dev in range(P):
            rows = ids[k_dev][batch.mask[k_dev]]
            if not rows.size:                   # a device with no positive left
                continue
            assert np.all(rows == rows[0]), f"device {k_dev}: positives got different negatives"
            np.testing.assert_array_equal(np.sort(rows[0]), np.sort(d.cands[k_dev]))
        per_step.append(d.cands)
        np.add.at(counts, d.cands.reshape(-1), 1)
    for s, cands in enumerate(per_step):     # devices and steps draw differently
        assert len({tuple(c) for c in cands}) == P
        if s:
            assert not np.array_equal(cands, per_step[s - 1])
    assert counts.sum() > 10 * n
    assert uniform_p([counts]) > ALPHA


def check_in_batch(batch: EdgeBatch, d: Drawn, dst_type=None):
    """In-batch negatives are other positives' destinations: `where` points into the
    dst block at k distinct positions other than the positive's own, and a negative is
    valid exactly where both positives are real (and, typed, of one destination type).
    Returns how many valid negatives the batch has."""
    B = batch.mask.shape[1]
    k = d.where.shape[-1]
    assert d.cands.shape == (P, 0)
    at = d.where - B
    assert np.all((at >= 0) & (at < B)), "an in-batch negative is not a batch destination"
    own = np.arange(B)[None, :, None]
    assert np.all(at != own), "a positive is its own in-batch negative"
    assert all(np.unique(row).size == k for row in at.reshape(-1, k))
    other_real = np.take_along_axis(batch.mask, at.reshape(P, -1), axis=1).reshape(at.shape)
    expected = batch.mask[..., None] & other_real
    if dst_type is not None:
        types = dst_type[np.maximum(batch.etype, 0)]
        other_type = np.take_along_axis(types, at.reshape(P, -1), axis=1).reshape(at.shape)
        expected &= other_type == types[..., None]
    np.testing.assert_array_equal(d.valid, expected)
    ids = d.ids(batch)
    other_dst = np.take_along_axis(batch.dst, at.reshape(P, -1), axis=1).reshape(at.shape)
    np.testing.assert_array_equal(ids[d.valid], other_dst[d.valid])
    return int(d.valid.sum())


def test_in_batch_negatives_are_other_real_positives_destinations(cora_draws):
    for batch, drawn in cora_draws:
        valid = check_in_batch(batch, drawn[Negatives.IN_BATCH])
        assert valid > 0
    # The padded batch has negatives made invalid by padding opposite a real positive.
    batch, drawn = cora_draws[-1]
    d = drawn[Negatives.IN_BATCH]
    assert (batch.mask[..., None] & ~d.valid).any()


def expected_link_seeds(batch: EdgeBatch, d: Drawn):
    """numpy: seeds of [src; dst; candidates] (padding positives' ends as -1): the
    distinct ids >= 0 in order of first appearance, then -1."""
    ends = np.concatenate([np.where(batch.mask, batch.src, -1),
                           np.where(batch.mask, batch.dst, -1), d.cands], axis=1)
    out = np.full(ends.shape, -1, np.int64)
    for k, row in enumerate(ends):
        real = row[row >= 0]
        _, first = np.unique(real, return_index=True)
        out[k, :first.size] = real[np.sort(first)]
    return out


@pytest.mark.parametrize("kind", list(Negatives), ids=lambda k: k.value)
def test_link_seeds_of_each_kind_equal_the_numpy_reference(cora_draws, kind):
    for batch, drawn in cora_draws:
        d = drawn[kind]
        assert d.cands.shape[1] == SAMPLERS[kind].candidates(batch.mask.shape[1])
        seeds = expected_link_seeds(batch, d)
        np.testing.assert_array_equal(d.seeds, seeds)
        for k in range(P):
            m = batch.mask[k]
            np.testing.assert_array_equal(d.seeds[k][d.src[k][m]], batch.src[k][m])
            np.testing.assert_array_equal(d.seeds[k][d.dst[k][m]], batch.dst[k][m])
            assert np.all(d.src[k][~m] == 0) and np.all(d.dst[k][~m] == 0)
        ids = d.ids(batch)
        np.testing.assert_array_equal(d.neg_mask, d.valid)
        np.testing.assert_array_equal(np.take_along_axis(
            d.seeds, d.neg.reshape(P, -1), axis=1).reshape(d.neg.shape)[d.valid], ids[d.valid])
        assert np.all(d.neg[~d.valid] == 0)


# -- typed negatives (ACM) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def acm_draws(acm8):
    loader = EdgeLoader.from_split(acm8, "train", batch_size=BATCH, seed=SEED)
    run = NegativeRunner(loader, TypeTable.of(acm8))
    return [run(0, s, seed=SEED) for s in [0, 1, 2, loader.steps_per_epoch - 1]]


def test_typed_negatives_have_their_relations_destination_type(acm_draws, acm, acm8):
    """Node types read from the original graph: node_map (new -> original id) and
    the original type ranges; each relation's destination type from acm.relations."""
    orig_type = np.searchsorted(acm.type_offsets(), np.asarray(acm8.parts.node_map()),
                                side="right") - 1
    dst_type = np.array([acm.node_types.index(r.dst_type) for r in acm.relations])
    assert set(dst_type.tolist()) == {1, 2}          # author and subject, never paper
    offsets = acm8.book.offsets
    subject = acm.node_types.index("subject")
    subjects = np.flatnonzero(orig_type == subject)
    subject_counts = np.zeros(orig_type.size, np.int64)
    seen_relations = set()
    for batch, drawn in acm_draws:
        want = dst_type[np.maximum(batch.etype, 0)][..., None]           # [P, B, 1]
        seen_relations |= set(batch.etype[batch.mask].tolist())
        for kind, d in drawn.items():
            assert d.cands.shape[1] == SAMPLERS[kind].candidates(batch.mask.shape[1], 3)
            ids = d.ids(batch)
            got = np.where(d.valid, orig_type[np.maximum(ids, 0)], -1)
            bad = d.valid & (got != want)
            assert not bad.any(), f"{kind.value}: negatives {ids[bad][:5]} have the wrong type"
            if kind is Negatives.LOCAL:
                owner = np.searchsorted(offsets, ids, side="right") - 1
                assert np.all(owner[d.valid] == np.nonzero(d.valid)[0])
            if kind is Negatives.UNIFORM:
                np.add.at(subject_counts, ids[d.valid & (want == subject)], 1)
        assert check_in_batch(batch, drawn[Negatives.IN_BATCH], dst_type) > 0
    assert seen_relations == {0, 1}
    # Uniform over the subjects (60 of them; the authors are too many for these draws).
    assert subject_counts[subjects].sum() == subject_counts.sum() > 20 * subjects.size
    assert uniform_p([subject_counts[subjects]]) > ALPHA


# -- uniform negatives do not depend on the mesh ---------------------------------------------------


def uniform_fn(mesh, table: TypeTable):
    sampler = NegativeSampler(6, Negatives.UNIFORM)

    def body(batch, seed, step):
        return sampler.sample(table, batch, seed=seed, step=step, axis="parts")[0]

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(ROWS, REPLICATED, REPLICATED),
                                 out_specs=ROWS))


@pytest.mark.parametrize("graph", ["cora", "acm"])
def test_uniform_negatives_are_keyed_by_edge_id_not_by_device_or_position(
        graph, link8, acm8, split, mesh1):
    """A hand-built batch of 8 x 24 positives (4 padded slots per device) on 8 devices,
    and the same positives shuffled into one batch of 192 on 1 device, with the 8-part
    table on both: each edge gets the same 6 negatives; another step or seed changes
    them."""
    dg = link8 if graph == "cora" else acm8
    table = TypeTable.of(dg)
    rng = np.random.default_rng(11)
    parts = dg.parts.part(0).edge_splits["train"], dg.parts.part(5).edge_splits["train"]
    pool = {name: np.concatenate([p[name] for p in parts]) for name in ("eid", "src", "dst",
                                                                        "etype")}
    pick = rng.choice(pool["eid"].size, P * 24, replace=False)
    cols = {name: pool[name][pick].astype(np.int32) for name in pool}
    mask = np.ones(P * 24, bool)
    mask[np.arange(P * 24) % 24 >= 20] = False
    for name in cols:
        cols[name] = np.where(mask, cols[name], -1)
    if graph == "acm":
        assert set(cols["etype"][mask].tolist()) == {0, 1}
    perm = rng.permutation(P * 24)
    batch8 = EdgeBatch(*(jnp.asarray(cols[n]) for n in ("eid", "src", "dst", "etype")),
                       jnp.asarray(mask))
    batch1 = EdgeBatch(*(jnp.asarray(cols[n][perm]) for n in ("eid", "src", "dst", "etype")),
                       jnp.asarray(mask[perm]))
    on8, on1 = uniform_fn(dg.mesh, table), uniform_fn(mesh1, table)
    for seed, step in ((0, 0), (SEED, 3)):
        got8 = np.asarray(on8(batch8, jnp.uint32(seed), jnp.uint32(step))).reshape(P * 24, 6)
        got1 = np.asarray(on1(batch1, jnp.uint32(seed), jnp.uint32(step))).reshape(P * 24, 6)
        np.testing.assert_array_equal(got1, got8[perm])
        assert np.all(got8[mask] >= 0) and np.all(got8[~mask] == -1)
    a = np.asarray(on8(batch8, jnp.uint32(SEED), jnp.uint32(3)))
    assert not np.array_equal(a, np.asarray(on8(batch8, jnp.uint32(SEED), jnp.uint32(4))))
    assert not np.array_equal(a, np.asarray(on8(batch8, jnp.uint32(SEED + 1), jnp.uint32(3))))


# -- dedup and link_seeds ----------------------------------------------------------------------


def first_appearance(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy dedup: (unique [n]: distinct ids >= 0 by first appearance, then -1; row [n]:
    each entry's row in unique, -1 for ids < 0)."""
    ids = np.asarray(ids, np.int64)
    real = ids >= 0
    _, first = np.unique(ids[real], return_index=True)
    distinct = ids[real][np.sort(first)]
    unique = np.full(ids.size, -1, np.int64)
    unique[:distinct.size] = distinct
    rank = {int(v): i for i, v in enumerate(distinct)}
    row = np.array([rank[int(v)] if v >= 0 else -1 for v in ids], np.int64)
    return unique, row


def dedup_cases():
    rng = np.random.default_rng(3)
    repeats = rng.integers(0, 40, 200)
    repeats[rng.random(200) < 0.3] = -1
    big = rng.choice(1 << 30, 200, replace=False)
    big[::7] = -1
    return {
        "repeats_and_padding": repeats,
        "all_distinct": rng.permutation(200) * 3 + 1,
        "big_ids_with_padding": big,
        "all_padding": np.full(200, -1),
        "one_id": np.full(200, 17),
        "padding_first": np.concatenate([np.full(100, -1), rng.integers(0, 5, 100)]),
    }


@pytest.fixture(scope="module")
def dedup_jit():
    return jax.jit(dedup)


@pytest.mark.parametrize("case", list(dedup_cases()))
def test_dedup_equals_first_appearance_order(dedup_jit, case):
    ids = dedup_cases()[case]
    unique, row = dedup_jit(jnp.asarray(ids, jnp.int32))
    want_unique, want_row = first_appearance(ids)
    np.testing.assert_array_equal(np.asarray(unique), want_unique)
    np.testing.assert_array_equal(np.asarray(row), want_row)


def test_link_seeds_ignores_padding_positives_ids_and_invalid_negatives():
    """A hand-built batch whose padding slots hold real ids (absent elsewhere), with
    repeated endpoints and negatives that repeat endpoints: the seeds are the real
    endpoints and valid candidates by first appearance; padding maps to row 0."""
    src = np.array([5, 9, 5, 100, 7, 101])
    dst = np.array([9, 3, 3, 102, 5, 103])
    mask = np.array([True, True, True, False, True, False])
    cands = np.array([3, 44, 9, 44, -1, 7, 60, 61, 44, -1, 62, 63])     # k = 2 per positive
    where = 12 + np.arange(12).reshape(6, 2)
    valid = np.broadcast_to(mask[:, None], (6, 2)) & (cands.reshape(6, 2) >= 0)
    cands = np.where(valid.reshape(-1), cands, -1)
    batch = EdgeBatch(*(jnp.asarray(a, jnp.int32) for a in (np.arange(6), src, dst, src * 0)),
                      jnp.asarray(mask))
    out = jax.jit(link_seeds)(batch, jnp.asarray(cands, jnp.int32), jnp.asarray(where, jnp.int32),
                              jnp.asarray(valid))
    ends = np.concatenate([np.where(mask, src, -1), np.where(mask, dst, -1), cands])
    seeds, row = first_appearance(ends)
    np.testing.assert_array_equal(np.asarray(out.seeds), seeds)
    assert seeds[:5].tolist() == [5, 9, 7, 3, 44] and np.all(seeds[5:] == -1)
    assert not np.isin([100, 101, 102, 103, 60, 61, 62, 63], np.asarray(out.seeds)).any()
    np.testing.assert_array_equal(np.asarray(out.src), np.where(mask, row[:6], 0))
    np.testing.assert_array_equal(np.asarray(out.dst), np.where(mask, row[6:12], 0))
    np.testing.assert_array_equal(np.asarray(out.neg), np.where(valid, row[where], 0))
    np.testing.assert_array_equal(np.asarray(out.neg_mask), valid)


# -- exclude_pairs -----------------------------------------------------------------------------


EXCLUDE_B, EXCLUDE_PAD = 16, 4            # positives per device, the last ones padding
FANOUTS = (10, 5)


@pytest.fixture(scope="module")
def exclude_run(link8):
    """Compiled: (EdgeBatch, seed, step) -> (blocks, blocks with the batch's pairs
    excluded, excluded count [P]) of the batch's endpoints and 2 uniform negatives each,
    as LinkPrediction.fetch_edges samples them."""
    table = TypeTable.of(link8)
    sampler = NeighborSampler(FANOUTS)
    negatives = NegativeSampler(2)
    exchange = link8.exchange(ExchangeConfig(relay=False, max_rungs=1))

    def body(graph, batch, seed, step):
        ends = link_seeds(batch, *negatives.sample(table, batch, seed=seed, step=step,
                                                   axis="parts"))
        sample = sampler.sample(graph, exchange, ends.seeds, ends.seeds >= 0, seed=seed,
                                step=step)
        blocks, removed = exclude_pairs(sample.blocks, batch.src, batch.dst, batch.mask)
        # What the step runs: only the first 2B dst rows of each block are searched.
        head, head_removed = exclude_pairs(sample.blocks, batch.src, batch.dst, batch.mask,
                                           rows=2 * batch.src.shape[0])
        return sample.blocks, blocks, removed[None], head, head_removed[None]

    return jax.jit(jax.shard_map(body, mesh=link8.mesh,
                                 in_specs=(link8.graph.specs(), ROWS, REPLICATED, REPLICATED),
                                 out_specs=ROWS))


@pytest.fixture(scope="module")
def in_neighbours(split, link8):
    """{v: its in-neighbours} of the graph the model samples, in partition ids."""
    inv = np.asarray(link8.parts.node_map_inv())
    src, dst, _ = split.graph.homogeneous_edges()
    src, dst = inv[src], inv[dst]
    order = np.argsort(dst, kind="stable")
    bounds = np.searchsorted(dst[order], np.arange(inv.size + 1))
    return [src[order][bounds[v]:bounds[v + 1]] for v in range(inv.size)]


def pair_keys(u, v, n: int) -> np.ndarray:
    """int64 keys of unordered pairs {u, v} (ids < n)."""
    u, v = np.asarray(u, np.int64), np.asarray(v, np.int64)
    return np.minimum(u, v) * n + np.maximum(u, v)


def exclusion_batch(rng, train8, in_neighbours):
    """(EdgeBatch [P * B], src, dst, mask [P, B] on the host): each device's first
    B - PAD slots are its own positives whose dst has at most FANOUTS[0] in-neighbours
    (so the positive's edge is certainly sampled); the padding slots, mask False, hold
    real edges (w, v), v a real positive's dst, that join no real pair of the device:
    they must stay."""
    n = len(in_neighbours)
    small = np.array([len(in_neighbours[v]) for v in train8.dst]) <= FANOUTS[0]
    cols = {name: np.full((P, EXCLUDE_B), -1, np.int64) for name in ("eid", "src", "dst", "etype")}
    mask = np.zeros((P, EXCLUDE_B), bool)
    real = EXCLUDE_B - EXCLUDE_PAD
    for k in range(P):
        eid = rng.choice(np.flatnonzero((train8.owner == k) & small), real, replace=False)
        cols["eid"][k, :real], cols["etype"][k, :real] = eid, train8.etype[eid]
        cols["src"][k, :real], cols["dst"][k, :real] = train8.src[eid], train8.dst[eid]
        mask[k, :real] = True
        mine = pair_keys(train8.src[eid], train8.dst[eid], n)
        # Edges (w, v) into the positives' dsts that join no pair of the device.
        w_all = np.concatenate([in_neighbours[v] for v in train8.dst[eid]])
        v_all = np.concatenate([np.full(len(in_neighbours[v]), v) for v in train8.dst[eid]])
        free = np.flatnonzero(~np.isin(pair_keys(w_all, v_all, n), mine))
        for slot, at in zip(range(real, EXCLUDE_B), rng.choice(free, EXCLUDE_PAD, replace=False)):
            w, v = w_all[at], v_all[at]
            cols["src"][k, slot], cols["dst"][k, slot], cols["etype"][k, slot] = w, v, 0
    batch = EdgeBatch(*(jnp.asarray(cols[name].reshape(-1), jnp.int32)
                        for name in ("eid", "src", "dst", "etype")), jnp.asarray(mask.reshape(-1)))
    return batch, cols["src"], cols["dst"], mask


def host_blocks(blocks):
    return [{f: per_device(getattr(b, f)) for f in ("dst", "src", "nbr", "mask")}
            for b in blocks]


def slot_ends(block, k):
    """(u, v) [n_dst, W] of device k's slots: the sampled neighbour and its dst (-1
    where masked)."""
    u = np.where(block["mask"][k], block["src"][k][np.maximum(block["nbr"][k], 0)], -1)
    v = np.broadcast_to(block["dst"][k][:, None], u.shape)
    return u, v


@pytest.mark.parametrize("seed", [0, 1])
def test_exclude_pairs_masks_exactly_the_slots_joining_a_batch_positives_ends(
        exclude_run, link8, train8, in_neighbours, seed):
    n = len(in_neighbours)
    batch, src, dst, mask = exclusion_batch(np.random.default_rng(seed), train8, in_neighbours)
    before, after, removed, head, head_removed = exclude_run(link8.graph, batch,
                                                             jnp.uint32(seed), jnp.uint32(seed))
    before, after, removed = host_blocks(before), host_blocks(after), np.asarray(removed)
    # Searching only the rows of the batch's endpoints (2B, as the step does) finds
    # every one of them.
    np.testing.assert_array_equal(np.asarray(head_removed), removed)
    for a, h in zip(after, host_blocks(head)):
        for key in ("mask", "nbr"):
            np.testing.assert_array_equal(a[key], h[key])
    assert len(before) == len(FANOUTS)
    forward = backward = padding_slots = 0
    for k in range(P):
        pairs = pair_keys(src[k][mask[k]], dst[k][mask[k]], n)
        directed = src[k] * np.int64(n) + dst[k]             # (src, dst) keys, all slots
        joins = 0
        for b, a in zip(before, after):
            u, v = slot_ends(b, k)
            real = b["mask"][k]
            is_pair = real & np.isin(pair_keys(np.maximum(u, 0), v, n), pairs)
            joins += int(is_pair.sum())
            forward += int(np.isin((u * n + v)[is_pair], directed[mask[k]]).sum())
            backward += int(np.isin((v * n + u)[is_pair], directed[mask[k]]).sum())
            padding_slots += int(np.isin((u * n + v)[real], directed[~mask[k]]).sum())
            # Exactly the pair slots go; every other slot (padding pairs' included) and
            # the node lists stay as they were.
            np.testing.assert_array_equal(a["mask"][k], real & ~is_pair)
            np.testing.assert_array_equal(a["nbr"][k], np.where(a["mask"][k], b["nbr"][k], -1))
            np.testing.assert_array_equal(a["dst"][k], b["dst"][k])
            np.testing.assert_array_equal(a["src"][k], b["src"][k])
        assert removed[k] == joins, f"device {k}: counted {removed[k]}, masked {joins}"
    # The test can fail: every positive's own edge was sampled (its dst keeps all its
    # in-neighbours), reverses too, and the padding slots' edges as well.
    assert forward >= int(mask.sum()) and backward > 0
    assert padding_slots >= int((~mask).sum())
