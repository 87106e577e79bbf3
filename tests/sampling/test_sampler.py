"""NeighborSampler on 8 devices against numpy: sampled neighbours are true in-neighbours,
distinct without replacement, all of them up to the fanout; uniform by chi-square; the
same neighbours as a single-device sample of the same relabelled graph; -1 fanouts,
`max_fanout` and the truncated count; per-relation fanouts.

Every node's draw is keyed by (seed, step, hop, node id), so a node asked for by
several devices must get the same neighbours on each: `check_sample` asserts that too.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from jgraph.kernels.sample import draw_positions_reference

from jgraph.data import Graph
from jgraph.partition import open_partitions, partition_graph
from jgraph.sampling import NeighborSampler, stream_key
from jgraph.sampling.sampler import node_keys
from jgraph.sharded import REPLICATED, ROWS, DistGraph

P, B = 8, 24                 # devices, seeds per device
ALPHA = 1e-3                 # chi-square: reject uniformity below this p-value
UNIFORM = NeighborSampler((5, 3))
REPLACE = NeighborSampler((4, 2), replace=True)


@pytest.fixture(scope="module")
def ref(cora, cora8, reference_of):
    return reference_of(cora, cora8)


@pytest.fixture(scope="module")
def uniform8(cora8, runner_cls):
    return runner_cls(cora8, UNIFORM)


@pytest.fixture(scope="module")
def replace8(cora8, runner_cls):
    return runner_cls(cora8, REPLACE)


def seeds_with_padding(rng, num_nodes, distinct_across_devices: bool):
    """(seeds int[P, B], mask bool[P, B]): distinct ids within each device, from the whole
    graph (so most are owned elsewhere); the last 4 slots of every device and all of
    device 5's are padding that holds real ids, repeats included."""
    if distinct_across_devices:
        seeds = rng.choice(num_nodes, (P, B), replace=False)
    else:   # devices share a pool, so several devices ask for the same nodes
        pool = rng.choice(num_nodes, 3 * B, replace=False)
        seeds = np.stack([rng.choice(pool, B, replace=False) for _ in range(P)])
    mask = np.ones((P, B), bool)
    mask[:, -4:] = False
    mask[5] = False
    seeds[:, -4:] = seeds[:, :4]          # padding may repeat a real seed's id
    return seeds, mask


# -- true neighbours, no repeats, all up to the fanout ---------------------------------------


@pytest.mark.parametrize("seed,step", [(0, 0), (1, 7), (12345, 2**31 + 3)])
def test_without_replacement_neighbours_are_true_distinct_and_min_of_degree_and_fanout(
        uniform8, ref, check, seed, step):
    rng = np.random.default_rng(seed)
    seeds, mask = seeds_with_padding(rng, ref.num_nodes, distinct_across_devices=False)
    sample = uniform8(seeds, mask, seed=seed, step=step)
    draws = check(sample, ref, seeds, mask, UNIFORM.fanouts, replace=False)
    # Some sampled nodes have more in-neighbours than the fanout, some fewer.
    degrees = {hop: ref.degree([v for h, v in draws if h == hop]) for hop in (0, 1)}
    assert (degrees[0] > 5).any() and (degrees[0] <= 5).any()
    assert (degrees[1] > 3).any() and (degrees[1] <= 3).any()
    stats = sample.stats
    assert int(stats.sampled_edges) == sum(int(b.mask.sum()) for b in sample.blocks)
    assert int(stats.truncated) == 0
    for hop, block in enumerate(sample.hops):   # each device asks once per frontier node
        assert int(stats.exchange[hop].requested) == int(np.sum(block.dst >= 0))
    stats.check()                          # no exchange overflow or out-of-range ids


@pytest.mark.parametrize("seed,step", [(0, 0), (3, 11)])
def test_with_replacement_every_node_gets_exactly_fanout_true_neighbours(
        replace8, ref, check, seed, step):
    rng = np.random.default_rng(seed + 100)
    seeds, mask = seeds_with_padding(rng, ref.num_nodes, distinct_across_devices=False)
    sample = replace8(seeds, mask, seed=seed, step=step)
    check(sample, ref, seeds, mask, REPLACE.fanouts, replace=True)
    assert int(sample.stats.sampled_edges) == sum(int(b.mask.sum()) for b in sample.blocks)


def test_padded_seed_slots_are_ignored_whatever_ids_they_hold(uniform8, ref, compact_rows):
    """Two batches that differ only in the ids held by masked-out slots give identical
    samples: padding draws nothing and adds nothing to src."""
    rng = np.random.default_rng(5)
    seeds, mask = seeds_with_padding(rng, ref.num_nodes, distinct_across_devices=True)
    other = np.where(mask, seeds, rng.integers(0, ref.num_nodes, seeds.shape))
    a, b = uniform8(seeds, mask, seed=4, step=4), uniform8(other, mask, seed=4, step=4)
    for x, y in zip(a.blocks, b.blocks):
        for field in ("dst", "src", "nbr", "mask"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
    hop0 = a.hops[0]
    np.testing.assert_array_equal(hop0.dst, compact_rows(np.where(mask, seeds, -1)))
    padding = hop0.dst < 0
    assert padding.sum() == (~mask).sum() and not hop0.mask[padding].any()


def test_same_seed_and_step_repeat_the_sample_and_another_step_or_seed_changes_it(uniform8, ref):
    rng = np.random.default_rng(6)
    seeds, mask = seeds_with_padding(rng, ref.num_nodes, distinct_across_devices=True)
    first = uniform8(seeds, mask, seed=9, step=2)
    again = uniform8(seeds, mask, seed=9, step=2)
    for x, y in zip(first.blocks, again.blocks):
        np.testing.assert_array_equal(x.src, y.src)
        np.testing.assert_array_equal(x.nbr, y.nbr)
    for other in (uniform8(seeds, mask, seed=9, step=3), uniform8(seeds, mask, seed=10, step=2)):
        assert not np.array_equal(first.hops[0].src, other.hops[0].src)


# -- sharded equals unsharded ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cora1(cora, cora8, mesh1, tmp_path_factory, reference_of):
    """(graph, DistGraph, Reference): the 8-part relabelling of cora as ONE partition on a
    1-device mesh. The relabelled edge list, partitioned "randomly" into 1 part, keeps
    every id (checked on node_map)."""
    inv = np.asarray(cora8.parts.node_map_inv())
    src, dst, _ = cora.homogeneous_edges()
    relabelled = Graph.homogeneous(inv[src], inv[dst], cora.total_nodes, name="cora-relabelled")
    out = tmp_path_factory.mktemp("cora1") / "parts"
    partition_graph(relabelled, 1, "random", out)
    pg = open_partitions(out)
    np.testing.assert_array_equal(pg.node_map(), np.arange(cora.total_nodes))
    dg = DistGraph(pg, mesh1)
    return relabelled, dg, reference_of(relabelled, dg)


@pytest.mark.parametrize("sampler", [UNIFORM, pytest.param(REPLACE, marks=pytest.mark.slow)],
                         ids=["uniform", "replace"])
def test_8_device_sample_equals_single_device_sample_of_the_same_relabelled_graph(
        sampler, cora1, ref, check, runner_cls, uniform8, replace8):
    _, dg1, ref1 = cora1
    np.testing.assert_array_equal(ref1.indptr, ref.indptr)     # the same graph, same ids
    np.testing.assert_array_equal(ref1.src, ref.src)
    run8 = uniform8 if sampler is UNIFORM else replace8
    run1 = runner_cls(dg1, sampler)
    for trial in range(2):
        rng = np.random.default_rng(20 + trial)
        seeds, mask = seeds_with_padding(rng, ref.num_nodes, distinct_across_devices=True)
        s8 = run8(seeds, mask, seed=trial, step=100 + trial)
        s1 = run1(seeds.reshape(1, -1), mask.reshape(1, -1), seed=trial, step=100 + trial)
        draws8 = check(s8, ref, seeds, mask, sampler.fanouts, sampler.replace)
        draws1 = check(s1, ref, seeds.reshape(1, -1), mask.reshape(1, -1), sampler.fanouts,
                       sampler.replace)
        assert draws8.keys() == draws1.keys()      # the same frontier at every hop
        assert draws8 == draws1                    # and the same neighbours per node
        # Devices whose frontiers overlap each sample the shared nodes again.
        assert int(s8.stats.sampled_edges) >= int(s1.stats.sampled_edges)


def test_own_seeds_sampled_without_the_exchange_equal_the_exchanged_sample(cora8, uniform8,
                                                                          runner_cls):
    """local_seeds: each device's seeds are its own nodes (as a loader deals them), so
    hop 0 is drawn where they live, with no exchange; the blocks are the same. A seed
    owned by another device is not sampled: it is counted in hop 0's out_of_range, so
    `check()` raises instead of returning a wrong sample."""
    local = runner_cls(cora8, UNIFORM, local_seeds=True)
    offsets = cora8.book.offsets
    rng = np.random.default_rng(5)
    seeds = np.stack([rng.choice(np.arange(offsets[k], offsets[k + 1]), B, replace=False)
                      for k in range(P)])
    mask = np.ones((P, B), bool)
    mask[:, -3:] = False
    got, want = local(seeds, mask, seed=3, step=9), uniform8(seeds, mask, seed=3, step=9)
    for a, b in zip(got.blocks, want.blocks):
        for field in ("dst", "src", "nbr", "mask"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    # Nothing travels for hop 0 (the exchange still moved its smallest rung of padding).
    assert float(got.stats.exchange[0].wire_bytes) == 0 < float(want.stats.exchange[0].wire_bytes)
    assert int(got.stats.exchange[0].requested) == int(want.stats.exchange[0].requested)
    got.stats.check()
    seeds[2, 0] = offsets[3]                       # device 2 asks for device 3's node
    foreign = local(seeds, mask, seed=3, step=9)
    assert int(foreign.stats.exchange[0].out_of_range) == 1
    with pytest.raises(IndexError, match="not rows"):
        foreign.stats.check()


# -- uniformity --------------------------------------------------------------------------------


def deal(nodes):
    """Up to P * B distinct nodes dealt round-robin over the devices: (seeds, mask)."""
    nodes = np.asarray(nodes)[:P * B]
    seeds, mask = np.zeros(P * B, np.int64), np.zeros(P * B, bool)
    seeds[:nodes.size], mask[:nodes.size] = nodes, True
    return seeds.reshape(B, P).T, mask.reshape(B, P).T


def positions(ref, v, got):
    """Positions of the sampled ids among v's in-neighbours (which are distinct in cora)."""
    nbrs = ref.nbrs(v)
    return np.searchsorted(nbrs, got)


def test_without_replacement_every_fanout_subset_is_equally_likely_chi_square(uniform8, ref):
    """Degree-7 nodes, fanout 5: the 21 possible 5-subsets (and so each neighbour) are
    equally frequent over 60 steps."""
    nodes = np.flatnonzero(ref.degree(np.arange(ref.num_nodes)) == 7)
    assert nodes.size >= 60
    seeds, mask = deal(nodes)
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(7), 5))}
    counts, marginal = np.zeros(len(subsets)), np.zeros(7)
    for step in range(60):
        hop0 = uniform8(seeds, mask, seed=1, step=step).hops[0]
        for k, i in zip(*np.nonzero(mask)):
            pos = np.sort(positions(ref, seeds[k, i], hop0.sampled(k, i)))
            counts[subsets[tuple(pos)]] += 1
            marginal[pos] += 1
    assert scipy.stats.chisquare(counts).pvalue > ALPHA
    assert scipy.stats.chisquare(marginal).pvalue > ALPHA
    assert uniform8.traces == 1            # every seed, step and batch: one compilation


def test_with_replacement_draws_are_uniform_and_independent_chi_square(replace8, ref):
    """Degree-3 nodes, 4 draws with replacement: each of the 81 ordered 4-tuples of
    positions is equally frequent over 40 steps (uniform and independent draws)."""
    nodes = np.flatnonzero(ref.degree(np.arange(ref.num_nodes)) == 3)
    seeds, mask = deal(nodes)
    counts = np.zeros(3 ** 4)
    for step in range(40):
        hop0 = replace8(seeds, mask, seed=2, step=step).hops[0]
        for k, i in zip(*np.nonzero(mask)):
            pos = positions(ref, seeds[k, i], hop0.sampled(k, i))
            counts[np.ravel_multi_index(tuple(pos), (3,) * 4)] += 1
    assert counts.sum() == 40 * min(nodes.size, P * B)
    assert scipy.stats.chisquare(counts).pvalue > ALPHA


# -- -1 fanouts, max_fanout, truncation ---------------------------------------------------------


@pytest.fixture(scope="module")
def small(simple_graph, mesh8, tmp_path_factory):
    """96 nodes, in-degree 0..9 (nodes 0..3 have none), randomly partitioned."""
    graph = simple_graph(np.random.default_rng(3), 96, max_degree=9, zero_degree=4, name="small")
    out = tmp_path_factory.mktemp("small8") / "parts"
    partition_graph(graph, P, "random", out)
    return graph, DistGraph(open_partitions(out), mesh8)


def all_nodes(num_nodes):
    """Every node once, device k holding a slice of 12: (seeds [8, 12], mask)."""
    seeds = np.random.default_rng(0).permutation(num_nodes).reshape(P, -1)
    return seeds, np.ones(seeds.shape, bool)


def test_fanout_minus_one_gives_every_in_neighbour(small, reference_of, runner_cls, check):
    graph, dg = small
    ref = reference_of(graph, dg)
    sampler = NeighborSampler((-1,))
    assert dg.graph.max_in_degree == ref.degree(np.arange(96)).max()
    assert sampler.hop_fanouts(dg.graph) == [(dg.graph.max_in_degree,)]
    seeds, mask = all_nodes(96)
    sample = runner_cls(dg, sampler)(seeds, mask, seed=0, step=0)
    draws = check(sample, ref, seeds, mask, [dg.graph.max_in_degree], replace=False)
    assert len(draws) == 96
    for (_, v), got in draws.items():
        assert got == tuple(np.sort(ref.nbrs(v)).tolist())
    assert int(sample.stats.truncated) == 0
    assert int(sample.stats.sampled_edges) == ref.src.size


def test_max_fanout_below_the_degree_draws_max_fanout_and_counts_truncated_nodes(
        small, reference_of, runner_cls, check):
    """A -1 hop capped at 3: a node of degree > 3 gets 3 distinct true neighbours, and
    `truncated` counts those nodes."""
    graph, dg = small
    ref = reference_of(graph, dg)
    sampler = NeighborSampler((-1,), max_fanout=3)
    assert sampler.hop_fanouts(dg.graph) == [(3,)]
    seeds, mask = all_nodes(96)
    mask[2] = False                      # device 2's seeds are padding this time
    run = runner_cls(dg, sampler)
    for step in range(3):
        sample = run(seeds, mask, seed=5, step=step)
        check(sample, ref, seeds, mask, [3], replace=False)
        expected = int(np.sum(ref.degree(seeds[mask]) > 3))
        assert 0 < expected < mask.sum() and int(sample.stats.truncated) == expected


@pytest.mark.parametrize("impl", ["xla", pytest.param("pallas", marks=pytest.mark.slow)])
def test_each_node_draws_the_reference_kernels_positions_for_its_seed_step_hop_key(
        small, reference_of, runner_cls, impl):
    """A node's neighbours, in slot order, are `draw_positions_reference` over its
    in-edges with the key of (seed, step, hop, node id), whichever device owns or asks
    for it; with impl="pallas" (interpret mode on CPU) too."""
    graph, dg = small
    ref = reference_of(graph, dg)
    seeds, mask = all_nodes(96)
    sample = runner_cls(dg, NeighborSampler((3,), impl=impl))(seeds, mask, seed=7, step=9)
    ids = np.arange(96)
    keys = node_keys(stream_key(7, 9, 0), jnp.asarray(ids, jnp.int32))
    pos = np.asarray(jax.jit(functools.partial(draw_positions_reference, fanout=3))(
        jnp.asarray(ref.indptr[:-1], jnp.int32), jnp.asarray(ref.degree(ids), jnp.int32), keys))
    block = sample.hops[0]
    for k, i in zip(*np.nonzero(block.dst >= 0)):
        v = int(block.dst[k, i])
        expected = ref.src[pos[v][pos[v] >= 0]]
        np.testing.assert_array_equal(block.sampled(k, i), expected)


# -- per-relation fanouts ----------------------------------------------------------------------

RELATIONS = 3
REL_FANOUTS = ((2, 0, -1),)             # relation 1: none; relation 2: all (up to 4)
REL_CAP = 4


def relational_graph(rng, num_nodes=80, max_degree=6) -> Graph:
    """One node type, three relations; each node gets 0..max_degree distinct sources per
    relation (the same pair may be linked by several relations)."""
    edges = {}
    for r in range(RELATIONS):
        src, dst = [], []
        for v in range(num_nodes):
            d = int(rng.integers(0, max_degree + 1))
            src.append(rng.choice(np.delete(np.arange(num_nodes), v), d, replace=False))
            dst.append(np.full(d, v))
        edges[("_N", f"r{r}", "_N")] = np.stack([np.concatenate(src), np.concatenate(dst)])
    return Graph(name="rel", num_nodes={"_N": num_nodes}, edges=edges)


@pytest.fixture(scope="module")
def relational(mesh8, tmp_path_factory, reference_of):
    graph = relational_graph(np.random.default_rng(11))
    out = tmp_path_factory.mktemp("rel8") / "parts"
    partition_graph(graph, P, "random", out)
    dg = DistGraph(open_partitions(out), mesh8)
    return graph, dg, reference_of(graph, dg)


def test_per_relation_fanouts_draw_true_edges_of_each_relation_up_to_its_fanout(
        relational, runner_cls, check):
    """Slots are laid out relation by relation; each holds an edge of its relation;
    min(degree in r, f_r) distinct neighbours per relation, all when the node has at
    most f_r; the capped -1 relation counts the nodes it truncated."""
    _, dg, ref = relational
    assert dg.graph.num_relations == RELATIONS
    sampler = NeighborSampler(REL_FANOUTS, max_fanout=REL_CAP)
    widths = [tuple(REL_CAP if f == -1 else f for f in hop) for hop in REL_FANOUTS]
    assert sampler.hop_fanouts(dg.graph) == widths
    seeds, mask = all_nodes(80)
    mask[:, -2:] = False
    run = runner_cls(dg, sampler)
    seen_full = seen_cut = 0
    for step in range(3):
        sample = run(seeds, mask, seed=1, step=step)
        check(sample, ref, seeds, mask, [sum(w) for w in widths], replace=False,
              counts=False)
        truncated = 0
        for block, fanout, given in zip(sample.hops, widths, REL_FANOUTS):
            assert block.etype is not None and block.nbr.shape[2] == sum(fanout)
            np.testing.assert_array_equal(block.etype >= 0, block.mask)
            starts = np.concatenate([[0], np.cumsum(fanout)])
            for k, i in zip(*np.nonzero(block.dst >= 0)):
                v = int(block.dst[k, i])
                for r, f in enumerate(fanout):
                    cols = slice(starts[r], starts[r + 1])
                    m = block.mask[k, i, cols]
                    assert np.all(block.etype[k, i, cols][m] == r), "wrong relation"
                    got = block.src[k][block.nbr[k, i, cols][m]]
                    true = ref.nbrs(v, r)
                    assert np.isin(got, true).all(), f"not {v}'s in-neighbours along r{r}"
                    assert np.unique(got).size == got.size
                    assert got.size == min(true.size, f)
                    if true.size <= f:
                        np.testing.assert_array_equal(np.sort(got), true)
                        seen_full += f > 0 and true.size > 0
                    else:
                        seen_cut += 1
                    truncated += given[r] == -1 and true.size > f
        assert truncated > 0 and int(sample.stats.truncated) == truncated
    assert seen_full > 0 and seen_cut > 0


def test_per_relation_fanout_with_the_wrong_number_of_relations_is_an_error(relational):
    _, dg, _ = relational
    with pytest.raises(ValueError, match="2 entries but the graph has 3 relations"):
        NeighborSampler(((1, 2),)).hop_fanouts(dg.graph)


# -- configuration errors ----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    ({"fanouts": ()}, "at least one hop"),
    ({"fanouts": (5, -2)}, r"fanouts\[1\]"),
    ({"fanouts": (-1,), "replace": True}, "not with replace"),
    ({"fanouts": ((2, -1),), "replace": True}, "not with replace"),
    ({"fanouts": (5,), "max_fanout": 0}, "max_fanout"),
    ({"fanouts": (5,), "impl": "cuda"}, "impl"),
])
def test_invalid_sampler_settings_raise_value_errors_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NeighborSampler(**kwargs)


# -- a one-device mesh -------------------------------------------------------------------------


def test_sample_stats_return_replicated_from_a_one_device_mesh(cora1):
    """Stats are "summed over devices, the same on every device": a step on a 1-device
    mesh can return them with a replicated out_spec, as on 8 devices."""
    _, dg1, ref1 = cora1
    sampler = NeighborSampler((2,))
    exchange = dg1.exchange()

    def body(graph, seeds):
        out = sampler.sample(graph, exchange, seeds, seeds >= 0, seed=0, step=0)
        return out.blocks[-1].mask, out.stats

    step = jax.jit(jax.shard_map(body, mesh=dg1.mesh, in_specs=(dg1.graph.specs(), ROWS),
                                 out_specs=(ROWS, REPLICATED)))
    seeds = np.concatenate([np.arange(0, 2000, 100), [-1] * 4]).astype(np.int32)
    mask, stats = step(dg1.graph, seeds)
    assert int(stats.sampled_edges) == int(np.sum(mask)) == int(
        np.minimum(ref1.degree(seeds[seeds >= 0]), 2).sum())
    assert int(stats.exchange[0].requested) == 20
    assert int(stats.exchange[0].non_local) == 0
