"""Edge-weighted sampling against numpy: `edge_weight_cumsum` against per-node running
sums of the partition's edge weights; `weighted_positions` against the exact
probabilities of weighted draws (with replacement: w_a w_b / W^2; without, successive
sampling: w_a / W * w_b / (W - w_a)) by chi-square; the weighted NeighborSampler on 8
devices: true neighbours, zero-weight edges never drawn, no repeats without
replacement, every positive-weight edge when there are fewer than the fanout, and
frequencies proportional to weight. Except where float rounding is the point, weights
are small integers, so every float sum is exact; where it is (issue 15), rows of any
degree, zero-weight pattern and magnitude spread must still draw exactly
min(fanout, positive-weight edges) distinct positive-weight edges, then -1.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jgraph.data import Graph
from jgraph.data.graph import GraphError
from jgraph.partition import open_partitions, partition_graph
from jgraph.sampling import NeighborSampler, edge_weight_cumsum, weighted_positions
from jgraph.sampling.weighted import running_weights, weighted_edges
from jgraph.sharded import DistGraph

P = 8
N = 64
ALPHA = 1e-3
WEIGHTS = np.array([0.0, 1.0, 2.0, 3.0, 5.0])


def weighted_graph(simple_graph) -> Graph:
    """64 nodes, in-degree 0..9; about a fifth of the edges weigh 0, and all of the
    in-edges of node 5 (original id) do. Weights follow the original edge list."""
    rng = np.random.default_rng(21)
    base = simple_graph(rng, N, max_degree=9, zero_degree=2, name="weighted")
    src, dst = base.edges[("_N", "_E", "_N")]
    weight = rng.choice(WEIGHTS, src.size, p=[0.2, 0.2, 0.2, 0.2, 0.2])
    weight[dst == 5] = 0.0
    return Graph.homogeneous(src, dst, N, name="weighted",
                             edge_data={"weight": weight.astype(np.float32)})


@pytest.fixture(scope="module")
def weighted(simple_graph, mesh8, tmp_path_factory, reference_of):
    graph = weighted_graph(simple_graph)
    out = tmp_path_factory.mktemp("weighted8") / "parts"
    partition_graph(graph, P, "random", out)
    dg = DistGraph(open_partitions(out), mesh8)
    return dg, reference_of(graph, dg, weight="weight"), edge_weight_cumsum(dg, "weight")


def every_node():
    seeds = np.random.default_rng(1).permutation(N).reshape(P, -1)
    return seeds, np.ones(seeds.shape, bool)


# -- edge_weight_cumsum ------------------------------------------------------------------------


def test_edge_weight_cumsum_is_each_nodes_running_sum_in_the_partitions_edge_order(weighted):
    dg, ref, cumw = weighted
    blocks = np.asarray(cumw).reshape(P, -1)
    assert blocks.shape[1] == dg.graph.edges_per_part and cumw.dtype == jnp.float32
    offsets = dg.book.offsets
    for k in range(P):
        expected = np.concatenate([np.cumsum(ref.weight[ref.edges(v)])
                                   for v in range(offsets[k], offsets[k + 1])] + [[]])
        np.testing.assert_array_equal(blocks[k, :expected.size], expected)


@pytest.fixture(scope="module")
def bad_weights(simple_graph, mesh8, tmp_path_factory):
    """Open a partition of the 64-node graph whose edge data `name` is `values(E)`."""
    base = weighted_graph(simple_graph)
    src, dst = base.edges[("_N", "_E", "_N")]

    def open_with(name, values, tag):
        graph = Graph.homogeneous(src, dst, N, edge_data={name: values(src.size)})
        out = tmp_path_factory.mktemp(tag) / "parts"
        partition_graph(graph, P, "random", out)
        return DistGraph(open_partitions(out), mesh8)
    return open_with


def weights_with(bad):
    def values(e):
        w = np.ones(e, np.float32)
        w[e // 2] = bad
        return w
    return values


def test_negative_weights_are_a_value_error_naming_the_array_and_value(bad_weights):
    dg = bad_weights("weight", weights_with(-1.5), "bad")
    with pytest.raises(ValueError, match=r"'weight'.*weight -1.5 at edge \d+.*finite and >= 0"):
        edge_weight_cumsum(dg, "weight")


@pytest.mark.parametrize("bad,shown", [(np.nan, "nan"), (np.inf, "inf")])
def test_non_finite_weights_are_an_error_naming_the_value_before_any_draw(
        bad_weights, bad, shown):
    """Refused by `Graph` (GraphError) or, for a partition written without it, by
    `edge_weight_cumsum` (ValueError); either way the message names the value."""
    with pytest.raises((GraphError, ValueError), match=rf"'weight'.*{shown} at edge \d+"):
        edge_weight_cumsum(bad_weights("weight", weights_with(bad), "nonfinite"), "weight")


def test_node_weights_summing_past_float32_are_a_value_error(bad_weights):
    dg = bad_weights("weight", lambda e: np.full(e, 3e38, np.float32), "huge")
    with pytest.raises(ValueError, match=r"'weight'.*past float32's range at edge \d+"):
        edge_weight_cumsum(dg, "weight")


def test_running_weights_keep_every_positive_weight_visible_in_float32():
    """1e-6 after 1e6 is lost by a float32 running sum; `running_weights` raises it by
    one float32 step, keeps weight-0 edges level and exact sums exact."""
    w = np.array([1e6, 1e-6, 0.0, 1e-6, 1.0, 0.0, 1e-45, 2.0, 3.0])
    indptr = np.array([0, 7, 7, 9])              # nodes of degree 7, 0, 2
    run = running_weights(w, indptr)
    assert run.dtype == np.float32
    node = np.cumsum(w[:7]).astype(np.float32)
    assert node[1] == node[0]                    # what a plain float32 sum would do
    step = np.diff(np.concatenate([[0.0], run[:7]]).astype(np.float32))
    np.testing.assert_array_equal(step > 0, w[:7] > 0)
    assert run[0] == np.float32(1e6) and run[6] > run[5] >= np.float32(1e6 + 1)
    np.testing.assert_array_equal(run[7:], [2.0, 5.0])


def test_missing_weight_array_is_a_key_error_naming_it_and_the_arrays_there(weighted):
    dg, _, _ = weighted
    with pytest.raises(KeyError, match=r"'importance'.*\['weight'\]"):
        edge_weight_cumsum(dg, "importance")


def test_weights_of_more_than_one_number_per_edge_are_a_value_error(bad_weights):
    dg = bad_weights("weight", lambda e: np.ones((e, 2), np.float32), "twod")
    with pytest.raises(ValueError, match="one number per edge"):
        edge_weight_cumsum(dg, "weight")


def test_weighted_sampler_without_edge_weights_is_a_value_error(weighted):
    dg, _, _ = weighted
    sampler = NeighborSampler((2,), weighted=True)
    seeds = jnp.zeros(4, jnp.int32)
    with pytest.raises(ValueError, match="edge_weight_cumsum"):
        sampler.sample(dg.graph, dg.exchange(), seeds, seeds >= 0, seed=0, step=0)


# -- weighted_positions alone, exact distributions ---------------------------------------------

NODE_WEIGHTS = np.array([1.0, 0.0, 2.0, 3.0, 0.0, 4.0])   # one node's in-edges
FEW_WEIGHTS = np.array([0.0, 2.0, 0.0, 0.0, 3.0, 0.0])    # only two edges weigh > 0
LO = 3                                                     # where its edges start


@functools.cache
def draw_fn(fanout, replace, max_degree=8):
    return jax.jit(functools.partial(weighted_positions, fanout=fanout, replace=replace,
                                     max_degree=max_degree))


def draws_of_one_node(weights, fanout, replace, num_keys=24000):
    """Positions (relative to the node's first edge) of `num_keys` independent draws of
    a node with these edge weights, whose edges sit after 3 edges of another node."""
    other = np.array([2.0, 1.0, 1.0])
    cumw = np.concatenate([np.cumsum(other), np.cumsum(weights), [7.0, 9.0]])
    keys = random_keys(np.random.default_rng(fanout + 10 * replace), num_keys)
    m = keys.size
    pos = draw_fn(fanout, replace)(jnp.full(m, LO, jnp.int32),
                                   jnp.full(m, weights.size, jnp.int32), keys,
                                   cumw=jnp.asarray(cumw, jnp.float32))
    pos = np.asarray(pos)
    return np.where(pos >= 0, pos - LO, -1)


def test_weighted_draws_with_replacement_follow_the_weights_chi_square():
    pos = draws_of_one_node(NODE_WEIGHTS, 2, True)
    assert pos.min() >= 0 and np.all(NODE_WEIGHTS[pos] > 0)
    W = NODE_WEIGHTS.sum()
    pairs = list(itertools.product(np.flatnonzero(NODE_WEIGHTS), repeat=2))
    index = {p: i for i, p in enumerate(pairs)}
    counts = np.bincount([index[tuple(p)] for p in pos], minlength=len(pairs))
    expected = np.array([NODE_WEIGHTS[a] * NODE_WEIGHTS[b] / W**2 for a, b in pairs])
    assert scipy.stats.chisquare(counts, expected * len(pos)).pvalue > ALPHA


def test_weighted_draws_without_replacement_are_successive_sampling_chi_square():
    pos = draws_of_one_node(NODE_WEIGHTS, 2, False)
    assert pos.min() >= 0 and np.all(NODE_WEIGHTS[pos] > 0)
    assert np.all(pos[:, 0] != pos[:, 1])
    W = NODE_WEIGHTS.sum()
    pairs = list(itertools.permutations(np.flatnonzero(NODE_WEIGHTS), 2))
    index = {p: i for i, p in enumerate(pairs)}
    counts = np.bincount([index[tuple(p)] for p in pos], minlength=len(pairs))
    w = NODE_WEIGHTS
    expected = np.array([w[a] / W * w[b] / (W - w[a]) for a, b in pairs])
    assert np.isclose(expected.sum(), 1.0)
    assert scipy.stats.chisquare(counts, expected * len(pos)).pvalue > ALPHA


def test_weighted_draws_without_replacement_third_draw_is_successive_sampling_chi_square():
    """Ordered triples of the four positive-weight edges: the third draw maps its point
    through three gaps around the two edges already taken."""
    pos = draws_of_one_node(NODE_WEIGHTS, 3, False)
    assert pos.min() >= 0 and np.all(NODE_WEIGHTS[pos] > 0)
    w, W = NODE_WEIGHTS, NODE_WEIGHTS.sum()
    triples = list(itertools.permutations(np.flatnonzero(w), 3))
    index = {t: i for i, t in enumerate(triples)}
    counts = np.bincount([index[tuple(p)] for p in pos], minlength=len(triples))
    expected = np.array([w[a] / W * w[b] / (W - w[a]) * w[c] / (W - w[a] - w[b])
                         for a, b, c in triples])
    assert np.isclose(expected.sum(), 1.0)
    assert scipy.stats.chisquare(counts, expected * len(pos)).pvalue > ALPHA


def test_weighted_draws_without_replacement_take_every_positive_edge_up_to_the_fanout():
    """600 nodes of degree 6 with float weights over four orders of magnitude, a third
    of them 0 (the first node: only two edges weigh > 0), fanout 3: min(positive
    edges, 3) distinct positive-weight edges, whatever the float rounding."""
    rng = np.random.default_rng(8)
    m, d = 600, 6
    w = (10.0 ** rng.uniform(-2, 2, (m, d))).astype(np.float32)
    w[rng.random((m, d)) < 1 / 3] = 0
    w[0] = FEW_WEIGHTS
    cumw = np.cumsum(w, axis=1).astype(np.float32).reshape(-1)
    lo = (np.arange(m) * d).astype(np.int32)
    pos = np.asarray(draw_fn(3, False)(jnp.asarray(lo), jnp.full(m, d, jnp.int32),
                                       random_keys(rng, m), cumw=jnp.asarray(cumw)))
    positive = (w > 0).sum(axis=1)
    assert (positive < 3).any() and (positive > 3).any()
    for i in range(m):
        got = pos[i][pos[i] >= 0] - lo[i]
        assert np.all(pos[i][got.size:] == -1), "draws are not packed at the front"
        assert np.all(w[i, got] > 0) and np.unique(got).size == got.size
        assert got.size == min(positive[i], 3)
        if positive[i] <= 3:
            np.testing.assert_array_equal(np.sort(got), np.flatnonzero(w[i]))
    np.testing.assert_array_equal(np.sort(pos[0, :2]), [1, 4])


def random_keys(rng, m):
    return rng.integers(0, 2**32, m, dtype=np.uint64).astype(np.uint32)


# -- float rounding: any degree, zero pattern and magnitude (issue 15) ------------------------


def assert_min_fanout_distinct_positive(pos, lo, w_rows, fanout):
    """Each row i of pos (absolute positions, rows' edges at lo[i]...) holds exactly
    min(fanout, positive weights of w_rows[i]) distinct positive-weight edges, then -1;
    all of them when there are no more than fanout."""
    for i, w in enumerate(w_rows):
        got = pos[i][pos[i] >= 0] - lo[i]
        positive = np.flatnonzero(w > 0)
        assert got.size == min(fanout, positive.size), (i, w.tolist(), pos[i].tolist())
        assert np.all(pos[i][got.size:] == -1), f"row {i}: -1 before a draw"
        assert np.all((got >= 0) & (got < w.size)) and np.all(w[got] > 0), f"row {i}"
        assert np.unique(got).size == got.size, f"row {i}: repeated edge"
        if positive.size <= fanout:
            np.testing.assert_array_equal(np.sort(got), positive)


def test_issue_15_degree_17_seven_zero_weights_fanout_10_draws_10_edges_for_every_key():
    """A node of degree 17 with 7 weights 0 and fanout 10, 262,144 keys over four zero
    patterns: every key draws all 10 positive-weight edges (before the fix 2,481 of
    these keys drew 9 and a -1: float32 rounding stepped the point past the free
    weight), and the first draw's frequencies follow the weights (in the two patterns
    of weights 0.1..10, where every expected count is large)."""
    rng = np.random.default_rng(15)
    d, keys_each = 17, 65536
    zeros = [[0, 1, 4, 6, 7, 15, 16], [0, 1, 3, 5, 6, 7, 14], [10, 11, 12, 13, 14, 15, 16],
             [1, 3, 5, 7, 9, 11, 13]]
    w = np.stack([10.0 ** rng.uniform(-3, 3, d) if k % 2 else rng.uniform(0.1, 10, d)
                  for k in range(len(zeros))]).astype(np.float32)
    for k, z in enumerate(zeros):
        w[k, z] = 0
    cumw = running_weights(w.reshape(-1), np.arange(len(zeros) + 1) * d)
    node = np.repeat(np.arange(len(zeros)), keys_each)
    lo = (node * d).astype(np.int32)
    pos = np.asarray(draw_fn(10, False, d)(jnp.asarray(lo), jnp.full(lo.size, d, jnp.int32),
                                           random_keys(rng, lo.size), cumw=jnp.asarray(cumw)))
    rel = pos - lo[:, None]
    assert np.all(pos >= 0), f"{np.sum((pos < 0).any(1))} keys drew fewer than 10"
    assert np.all(np.take_along_axis(w[node], rel, axis=1) > 0)
    assert np.all(np.diff(np.sort(rel, axis=1), axis=1) > 0), "repeated edge"
    for k in range(0, len(zeros), 2):        # weights 0.1..10: every count is large
        first = np.bincount(rel[node == k, 0], minlength=d)
        keep = w[k] > 0
        expected = w[k, keep].astype(np.float64) / w[k].sum(dtype=np.float64) * keys_each
        assert scipy.stats.chisquare(first[keep], expected).pvalue > ALPHA


ZERO_PATTERNS = {
    "none": lambda rng, d: np.zeros(d, bool),
    "all": lambda rng, d: np.ones(d, bool),
    "a third": lambda rng, d: rng.random(d) < 1 / 3,
    "most": lambda rng, d: rng.random(d) < 7 / 8,
    "leading run": lambda rng, d: np.arange(d) < rng.integers(0, d + 1),
    "trailing run": lambda rng, d: np.arange(d) >= rng.integers(0, d + 1),
    "every other": lambda rng, d: np.arange(d) % 2 == rng.integers(0, 2),
}
SPREADS = {
    "ones": lambda rng, d: np.ones(d),
    "integers": lambda rng, d: rng.integers(1, 6, d).astype(np.float64),
    "six decades": lambda rng, d: 10.0 ** rng.uniform(-3, 3, d),
    "1e-6 and 1e6": lambda rng, d: rng.choice([1e-6, 1e6], d),
    "1e-6 under 1e6": lambda rng, d: np.where(np.arange(d) == 0, 1e6, 1e-6),
    "near float32's least": lambda rng, d: 10.0 ** rng.uniform(-40, -36, d),
    "near float32's top": lambda rng, d: 10.0 ** rng.uniform(30, 36, d),
}


@pytest.fixture(scope="module")
def random_rows():
    """2,048 rows: degree 1..64, every zero pattern and spread, and half of them the
    second relation of their node (after 1..5 edges of another relation, node_lo)."""
    rng = np.random.default_rng(150)
    rows, before = [], []
    for i in range(2048):
        d = int(rng.integers(1, 65))
        w = list(SPREADS.values())[i % len(SPREADS)](rng, d)
        w[list(ZERO_PATTERNS.values())[(i // len(SPREADS)) % len(ZERO_PATTERNS)](rng, d)] = 0
        rows.append(w)
        before.append(10.0 ** rng.uniform(-3, 3, int(rng.integers(1, 6))) if i % 2 else [])
    sizes = np.array([len(b) + len(w) for b, w in zip(before, rows)])
    indptr = np.concatenate([[0], np.cumsum(sizes)])
    cumw = running_weights(np.concatenate([np.concatenate([b, w]) for b, w in zip(before, rows)]),
                           indptr)
    node_lo = indptr[:-1].astype(np.int32)
    lo = (node_lo + [len(b) for b in before]).astype(np.int32)
    deg = np.array([w.size for w in rows], np.int32)
    return rows, jnp.asarray(lo), jnp.asarray(deg), jnp.asarray(node_lo), jnp.asarray(cumw), rng


def test_random_rows_cover_degrees_zero_patterns_and_hidden_float32_weights(random_rows):
    rows = random_rows[0]
    degrees = {w.size for w in rows}
    assert min(degrees) == 1 and max(degrees) == 64
    positive = np.array([np.sum(w > 0) for w in rows])
    assert (positive == 0).any() and (positive == 1).any() and (positive > 24).any()
    # rows where a plain float32 running sum hides a positive weight
    hidden = [np.any((w > 0) & (np.diff(np.cumsum(w, dtype=np.float32), prepend=0) <= 0))
              for w in rows]
    assert sum(hidden) > 100


@pytest.mark.parametrize("fanout", [3, 24])
def test_random_rows_draw_min_fanout_positive_distinct_positive_weight_edges(
        random_rows, fanout):
    rows, lo, deg, node_lo, cumw, rng = random_rows
    pos = np.asarray(draw_fn(fanout, False, 64)(lo, deg, random_keys(rng, len(rows)), cumw=cumw,
                                                node_lo=node_lo))
    assert_min_fanout_distinct_positive(pos, np.asarray(lo), rows, fanout)


def test_random_rows_with_replacement_draw_only_positive_weight_edges(random_rows):
    rows, lo, deg, node_lo, cumw, rng = random_rows
    pos = np.asarray(draw_fn(6, True, 64)(lo, deg, random_keys(rng, len(rows)), cumw=cumw,
                                          node_lo=node_lo))
    for i, w in enumerate(rows):
        rel = pos[i] - int(lo[i])
        if (w > 0).any():
            assert np.all(pos[i] >= 0) and np.all(w[rel] > 0), (i, w.tolist(), rel.tolist())
        else:
            assert np.all(pos[i] == -1)


def test_random_rows_take_all_is_exactly_the_positive_weight_edges(random_rows):
    rows, lo, deg, node_lo, cumw, _ = random_rows
    pos = np.asarray(jax.jit(weighted_edges, static_argnums=2)(lo, deg, 64, cumw, node_lo))
    for i, w in enumerate(rows):
        np.testing.assert_array_equal(pos[i][pos[i] >= 0] - int(lo[i]), np.flatnonzero(w > 0))


# -- the weighted sampler on 8 devices ---------------------------------------------------------


def check_weighted(sample, ref, seeds, mask, fanout, replace, check):
    """check_sample's invariants with positive-weight neighbours as the population:
    returns {node: positions (into its in-edges) drawn, in draw order}."""
    check(sample, ref, seeds, mask, [fanout], replace=replace, counts=False)
    block = sample.hops[0]
    drawn = {}
    for k, i in zip(*np.nonzero(block.dst >= 0)):
        v = int(block.dst[k, i])
        got = block.sampled(k, i)
        true, w = ref.nbrs(v), ref.weight[ref.edges(v)]
        pos = np.searchsorted(true, got)       # sources of a node are distinct, sorted
        assert np.all(w[pos] > 0), f"node {v}: drew an edge of weight 0"
        positive = int(np.sum(w > 0))
        if replace:
            assert got.size == (fanout if positive else 0)
        else:
            assert np.unique(got).size == got.size, f"node {v}: repeated neighbours"
            assert got.size == min(positive, fanout)
            if positive <= fanout:
                np.testing.assert_array_equal(np.sort(pos), np.flatnonzero(w > 0))
        drawn[v] = pos
    return drawn


def pooled_chisquare(counts: dict, weights: dict) -> float:
    """p-value of the sum of per-node chi-square statistics (positive-weight edges)."""
    stat, dof = 0.0, 0
    for v, c in counts.items():
        w = weights[v]
        keep = w > 0
        if keep.sum() < 2:
            continue
        expected = w[keep] / w[keep].sum() * c.sum()
        stat += np.sum((c[keep] - expected) ** 2 / expected)
        dof += int(keep.sum()) - 1
    assert dof > 50
    return float(scipy.stats.chi2.sf(stat, dof))


def test_weighted_sampler_with_replacement_draws_true_positive_edges_in_proportion(
        weighted, runner_cls, check):
    dg, ref, cumw = weighted
    sampler = NeighborSampler((2,), replace=True, weighted=True)
    run = runner_cls(dg, sampler, edge_weights=cumw)
    seeds, mask = every_node()
    counts = {v: np.zeros(ref.degree(v)) for v in range(N)}
    for step in range(100):
        drawn = check_weighted(run(seeds, mask, seed=3, step=step), ref, seeds, mask, 2,
                               True, check)
        for v, pos in drawn.items():
            np.add.at(counts[v], pos, 1)
    five = int(dg.parts.node_map_inv()[5])                  # all its weights are 0
    assert ref.degree(five) > 0 and counts[five].sum() == 0
    weights = {v: ref.weight[ref.edges(v)] for v in range(N)}
    assert pooled_chisquare(counts, weights) > ALPHA


def test_weighted_sampler_without_replacement_never_repeats_and_first_draw_follows_weights(
        weighted, runner_cls, check):
    dg, ref, cumw = weighted
    sampler = NeighborSampler((2,), weighted=True)
    run = runner_cls(dg, sampler, edge_weights=cumw)
    seeds, mask = every_node()
    first = {v: np.zeros(ref.degree(v)) for v in range(N)}
    for step in range(100):
        drawn = check_weighted(run(seeds, mask, seed=4, step=step), ref, seeds, mask, 2,
                               False, check)
        for v, pos in drawn.items():
            if pos.size:
                first[v][pos[0]] += 1           # slot 0 is the first successive draw
    positive = np.array([np.sum(ref.weight[ref.edges(v)] > 0) for v in range(N)])
    assert (positive > 2).any() and ((positive > 0) & (positive <= 2)).any()
    weights = {v: ref.weight[ref.edges(v)] for v in range(N)}
    assert pooled_chisquare(first, weights) > ALPHA


# -- weighted, per relation --------------------------------------------------------------------


@pytest.fixture(scope="module")
def weighted_relational(mesh8, tmp_path_factory, reference_of):
    """Two relations over 48 nodes; each node has 0..5 sources per relation, weights as
    above; relation 0's edges come first in each node's in-edges."""
    rng = np.random.default_rng(31)
    edges, edge_data = {}, {}
    for r in range(2):
        src, dst = [], []
        for v in range(48):
            d = int(rng.integers(0, 6))
            src.append(rng.choice(np.delete(np.arange(48), v), d, replace=False))
            dst.append(np.full(d, v))
        rel = ("_N", f"r{r}", "_N")
        edges[rel] = np.stack([np.concatenate(src), np.concatenate(dst)])
        edge_data[rel] = {"weight": rng.choice(WEIGHTS, edges[rel].shape[1]).astype(np.float32)}
    graph = Graph(name="wrel", num_nodes={"_N": 48}, edges=edges, edge_data=edge_data)
    out = tmp_path_factory.mktemp("wrel8") / "parts"
    partition_graph(graph, P, "random", out)
    dg = DistGraph(open_partitions(out), mesh8)
    return dg, reference_of(graph, dg, weight="weight"), edge_weight_cumsum(dg, "weight")


@pytest.mark.slow       # some 7 s: the fast tier stays under 4 minutes
def test_weighted_per_relation_draws_follow_the_weights_within_each_relation(
        weighted_relational, runner_cls):
    """With replacement, 2 draws per relation: each relation's draws are its own
    positive-weight edges, with frequencies proportional to their weights."""
    dg, ref, cumw = weighted_relational
    sampler = NeighborSampler(((2, 2),), replace=True, weighted=True)
    run = runner_cls(dg, sampler, edge_weights=cumw)
    seeds = np.arange(48).reshape(P, -1)
    mask = np.ones(seeds.shape, bool)
    counts = {(v, r): np.zeros(ref.nbrs(v, r).size) for v in range(48) for r in range(2)}
    for step in range(80):
        block = run(seeds, mask, seed=5, step=step).hops[0]
        for k, i in zip(*np.nonzero(block.dst >= 0)):
            v = int(block.dst[k, i])
            for r in range(2):
                cols = slice(2 * r, 2 * r + 2)
                m = block.mask[k, i, cols]
                assert np.all(block.etype[k, i, cols][m] == r)
                got = block.src[k][block.nbr[k, i, cols][m]]
                true = ref.nbrs(v, r)
                w = ref.weight[ref.edges(v)][ref.etype[ref.edges(v)] == r]
                assert np.isin(got, true).all(), f"node {v}: not an r{r} in-neighbour"
                pos = np.searchsorted(true, got)
                assert np.all(w[pos] > 0), f"node {v}: drew an r{r} edge of weight 0"
                assert got.size == (2 if (w > 0).any() else 0)
                np.add.at(counts[(v, r)], pos, 1)
    weights = {(v, r): ref.weight[ref.edges(v)][ref.etype[ref.edges(v)] == r]
               for v in range(48) for r in range(2)}
    assert pooled_chisquare(counts, weights) > ALPHA
