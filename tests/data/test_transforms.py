"""Graph transforms against plain-Python set/list references, with edge data following edges."""
from __future__ import annotations

import numpy as np
import pytest

from jgraph.data import (
    DEFAULT_NTYPE,
    DEFAULT_REL,
    Graph,
    GraphError,
    Relation,
    add_reverse_relations,
    add_self_loops,
    deduplicate,
    remove_self_loops,
    symmetrize,
)

N = DEFAULT_NTYPE
E = Relation(N, DEFAULT_REL, N)
SEEDS = [0, 1, 2, 3]


def _random_graph(seed: int, n: int = 12, e: int = 60, loops: bool = True) -> Graph:
    """A small multigraph with duplicates, self-loops and two edge-data arrays."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(n, size=e), rng.integers(n, size=e)
    if loops:
        src[:3] = dst[:3]                                # a few sure self-loops
    src[-5:], dst[-5:] = src[:5], dst[:5]                # and sure duplicates
    return Graph.homogeneous(src, dst, n, name="rand", edge_data={
        "w": rng.random(e).astype(np.float32),
        "vec": rng.integers(0, 1000, size=(e, 2)).astype(np.int32)})


def _hetero_graph(seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    nn = {"user": 7, "item": 5}
    rels = [Relation("user", "follows", "user"), Relation("user", "buys", "item")]
    edges = {}
    for rel in rels:
        e = 30
        edges[rel] = np.stack([rng.integers(nn[rel.src_type], size=e),
                               rng.integers(nn[rel.dst_type], size=e)])
    # user i buys item i: equal local ids, but not self-loops (different types).
    edges[rels[1]][:, :4] = np.arange(4)
    return Graph(name="het", num_nodes=nn, edges=edges,
                 edge_data={rels[1]: {"price": rng.random(30)}})


def _edge_list(g: Graph, rel=E) -> list[tuple]:
    """[(src, dst, {name: data row as tuple}), ...] in stored order."""
    index = g.edges[rel]
    data = g.edge_data.get(rel, {})
    out = []
    for k in range(index.shape[1]):
        row = {name: tuple(np.atleast_1d(v[k]).tolist()) for name, v in data.items()}
        out.append((int(index[0, k]), int(index[1, k]), row))
    return out


def _first_occurrences(items: list[tuple]) -> list[tuple]:
    seen, out = set(), []
    for s, d, row in items:
        if (s, d) not in seen:
            seen.add((s, d))
            out.append((s, d, row))
    return out


def _snapshot(g: Graph):
    return ({r: e.copy() for r, e in g.edges.items()},
            {r: {k: v.copy() for k, v in d.items()} for r, d in g.edge_data.items()})


def _assert_unchanged(g: Graph, snap) -> None:
    edges, edata = snap
    for r, e in edges.items():
        np.testing.assert_array_equal(g.edges[r], e)
    for r, d in edata.items():
        for k, v in d.items():
            np.testing.assert_array_equal(g.edge_data[r][k], v)


def _assert_dtypes_kept(before: Graph, after: Graph) -> None:
    for rel, d in before.edge_data.items():
        for k, v in d.items():
            assert after.edge_data[rel][k].dtype == v.dtype
            assert after.edge_data[rel][k].shape[1:] == v.shape[1:]


# -- deduplicate ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_deduplicate_keeps_first_occurrence_of_each_pair_with_its_data(seed):
    g = _random_graph(seed)
    snap = _snapshot(g)
    out = deduplicate(g)
    before = _edge_list(g)
    assert len({(s, d) for s, d, _ in before}) < len(before)     # there were duplicates
    assert _edge_list(out) == _first_occurrences(before)
    _assert_dtypes_kept(g, out)
    _assert_unchanged(g, snap)


def test_deduplicate_keeps_self_loops_and_leaves_a_simple_graph_alone():
    g = Graph.homogeneous([0, 1, 1, 2], [0, 2, 0, 1], 3)
    np.testing.assert_array_equal(deduplicate(g).edges[E], g.edges[E])


def test_deduplicate_on_heterogeneous_relations_uses_each_relations_types():
    g = _hetero_graph(0)
    out = deduplicate(g)
    for rel in g.relations:
        assert _edge_list(out, rel) == _first_occurrences(_edge_list(g, rel))


# -- symmetrize ---------------------------------------------------------------------------------


def _symmetrize_reference(items: list[tuple]) -> list[tuple]:
    reversed_items = [(d, s, row) for s, d, row in items]
    return _first_occurrences(items + reversed_items)


@pytest.mark.parametrize("seed", SEEDS)
def test_symmetrize_adds_reverses_once_with_the_data_of_the_edge_they_reverse(seed):
    g = _random_graph(seed)
    snap = _snapshot(g)
    out = symmetrize(g)
    got = _edge_list(out)
    assert got == _symmetrize_reference(_edge_list(g))
    pairs = {(s, d) for s, d, _ in got}
    assert pairs == {(s, d) for s, d, _ in _edge_list(g)} | {(d, s) for s, d, _ in _edge_list(g)}
    assert len(pairs) == len(got)
    assert all((d, s) in pairs for s, d in pairs)
    _assert_dtypes_kept(g, out)
    _assert_unchanged(g, snap)


def test_symmetrize_of_an_already_symmetric_simple_graph_is_the_same_set():
    g = Graph.homogeneous([0, 1, 1, 2], [1, 0, 2, 1], 3)
    np.testing.assert_array_equal(symmetrize(g).edges[E], g.edges[E])


def test_symmetrize_on_a_two_type_relation_raises_naming_it():
    g = _hetero_graph(1)
    with pytest.raises(GraphError, match="add_reverse_relations") as info:
        symmetrize(g)
    assert str(("user", "buys", "item")) in str(info.value)


def test_symmetrize_relational_graph_treats_each_relation_separately():
    rels = [Relation(N, "a", N), Relation(N, "b", N)]
    g = Graph(name="r", num_nodes={N: 4}, edges={rels[0]: [[0, 1], [1, 2]], rels[1]: [[3], [0]]})
    out = symmetrize(g)
    assert {tuple(p) for p in out.edges[rels[0]].T.tolist()} == {(0, 1), (1, 0), (1, 2), (2, 1)}
    assert {tuple(p) for p in out.edges[rels[1]].T.tolist()} == {(3, 0), (0, 3)}


# -- add_reverse_relations ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_add_reverse_relations_adds_reversed_edges_with_copied_data(seed):
    g = _hetero_graph(seed)
    snap = _snapshot(g)
    out = add_reverse_relations(g)
    rev = {Relation("user", "rev_follows", "user"): Relation("user", "follows", "user"),
           Relation("item", "rev_buys", "user"): Relation("user", "buys", "item")}
    assert list(out.relations) == list(g.relations) + list(rev)
    for r_new, r_old in rev.items():
        assert _edge_list(out, r_new) == [(d, s, row) for s, d, row in _edge_list(g, r_old)]
    for rel in g.relations:                                  # originals untouched
        assert _edge_list(out, rel) == _edge_list(g, rel)
    assert Relation("user", "rev_follows", "user") not in out.edge_data
    _assert_unchanged(g, snap)


def test_add_reverse_relations_with_custom_prefix_on_relational_graph():
    g = _random_graph(5)
    out = add_reverse_relations(g, prefix="inv-")
    rev = Relation(N, "inv-" + DEFAULT_REL, N)
    assert out.relations == (E, rev)
    assert _edge_list(out, rev) == [(d, s, row) for s, d, row in _edge_list(g)]
    assert out.num_edges == 2 * g.num_edges


def test_add_reverse_relations_refuses_a_name_that_exists():
    g = Graph(name="g", num_nodes={N: 3},
              edges={(N, "r", N): [[0], [1]], (N, "rev_r", N): [[1], [2]]})
    with pytest.raises(GraphError, match="rev_r"):
        add_reverse_relations(g)


# -- remove_self_loops ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_remove_self_loops_drops_exactly_the_loops_and_their_data(seed):
    g = _random_graph(seed)
    snap = _snapshot(g)
    out = remove_self_loops(g)
    before = _edge_list(g)
    assert any(s == d for s, d, _ in before)
    assert _edge_list(out) == [item for item in before if item[0] != item[1]]
    _assert_dtypes_kept(g, out)
    _assert_unchanged(g, snap)


def test_remove_self_loops_leaves_two_type_relations_with_equal_local_ids():
    g = _hetero_graph(2)
    out = remove_self_loops(g)
    buys = Relation("user", "buys", "item")
    assert _edge_list(out, buys) == _edge_list(g, buys)
    follows = Relation("user", "follows", "user")
    assert _edge_list(out, follows) == [t for t in _edge_list(g, follows) if t[0] != t[1]]


# -- add_self_loops -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_add_self_loops_only_for_nodes_lacking_one_with_fill_value(seed):
    g = _random_graph(seed)
    snap = _snapshot(g)
    out = add_self_loops(g, fill_value=7)
    before = _edge_list(g)
    has_loop = {s for s, d, _ in before if s == d}
    assert 0 < len(has_loop) < g.num_nodes[N]
    fill = {"w": (7.0,), "vec": (7, 7)}
    expected = before + [(i, i, fill) for i in range(g.num_nodes[N]) if i not in has_loop]
    assert _edge_list(out) == expected
    loops = [s for s, d, _ in _edge_list(out) if s == d]
    # Every node has a loop; nodes that had several duplicates keep them, none gets more.
    assert set(loops) == set(range(g.num_nodes[N]))
    for i in range(g.num_nodes[N]):
        assert loops.count(i) == max(1, sum(1 for s, d, _ in before if s == d == i))
    _assert_dtypes_kept(g, out)
    _assert_unchanged(g, snap)


def test_add_self_loops_requires_fill_value_when_edge_data_exists():
    g = _random_graph(0)
    with pytest.raises(GraphError, match="fill_value") as info:
        add_self_loops(g)
    assert "'vec'" in str(info.value) and "'w'" in str(info.value)


def test_add_self_loops_without_edge_data_needs_no_fill_value():
    g = Graph.homogeneous([0, 1, 2], [1, 1, 0], 4)
    out = add_self_loops(g)
    assert _edge_list(out) == [(0, 1, {}), (1, 1, {}), (2, 0, {}),
                               (0, 0, {}), (2, 2, {}), (3, 3, {})]


def test_add_self_loops_then_remove_gives_back_the_loopless_graph():
    g = _random_graph(3)
    a = remove_self_loops(add_self_loops(g, fill_value=0))
    assert _edge_list(a) == _edge_list(remove_self_loops(g))


def test_add_self_loops_skips_two_type_relations():
    g = _hetero_graph(3)
    out = add_self_loops(g, fill_value=0.0)
    buys = Relation("user", "buys", "item")
    follows = Relation("user", "follows", "user")
    assert _edge_list(out, buys) == _edge_list(g, buys)
    before = _edge_list(g, follows)
    has = {s for s, d, _ in before if s == d}
    assert _edge_list(out, follows) == before + [(i, i, {}) for i in range(7) if i not in has]


def test_transforms_keep_nodes_data_and_splits():
    g = Graph.homogeneous([0, 1, 1], [1, 1, 2], 3, node_data={"feat": np.eye(3)},
                          splits={"train": np.array([0, 2])})
    for fn in (deduplicate, symmetrize, remove_self_loops, add_self_loops,
               add_reverse_relations):
        out = fn(g)
        assert out.num_nodes == g.num_nodes
        np.testing.assert_array_equal(out.node_data[N]["feat"], np.eye(3))
        np.testing.assert_array_equal(out.splits[N]["train"], [0, 2])
