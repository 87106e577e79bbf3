"""The Graph container: validation errors that name the culprit, and the homogeneous views."""
from __future__ import annotations

import re

import numpy as np
import pytest

from jgraph.data import DEFAULT_NTYPE, DEFAULT_REL, Graph, GraphError, Relation

N = DEFAULT_NTYPE
E = Relation(N, DEFAULT_REL, N)


def _raises(match_parts, fn, *args, **kwargs) -> str:
    """Call fn, expect a GraphError, and check that every part is in its message."""
    with pytest.raises(GraphError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    for part in match_parts:
        assert part in msg, f"{part!r} not in error message {msg!r}"
    return msg


# -- edge ids -------------------------------------------------------------------------------


def test_edge_destination_id_equal_to_num_nodes_is_rejected_naming_id_and_relation():
    msg = _raises(["destination", "id 5", "[0, 5)", str(tuple(E))],
                  Graph.homogeneous, [0, 1, 2], [1, 5, 3], 5)
    assert "position 1" in msg


def test_edge_source_id_beyond_num_nodes_is_rejected_naming_id_and_relation():
    _raises(["source", "id 17", "position 2", str(tuple(E))],
            Graph.homogeneous, [0, 1, 17, 3], [1, 2, 3, 0], 5)


def test_negative_edge_id_is_rejected_naming_id_and_relation():
    msg = _raises(["source", "id -3", "position 0", str(tuple(E))],
                  Graph.homogeneous, [-3, 1], [1, 2], 4)
    assert "destination" not in msg


def test_out_of_range_id_checked_against_the_relations_own_node_types():
    # 'item' has 2 nodes: id 2 is fine as a user (3 nodes) but not as an item.
    rel = Relation("user", "buys", "item")
    ok = Graph(name="g", num_nodes={"user": 3, "item": 2}, edges={rel: [[2, 0], [1, 0]]})
    assert ok.num_edges == 2
    _raises(["destination", "id 2", "[0, 2)", str(tuple(rel))],
            Graph, name="g", num_nodes={"user": 3, "item": 2}, edges={rel: [[0, 1], [1, 2]]})
    rev = Relation("item", "bought_by", "user")
    _raises(["source", "id 2", "[0, 2)", str(tuple(rev))],
            Graph, name="g", num_nodes={"user": 3, "item": 2}, edges={rev: [[2, 0], [0, 0]]})


def test_edges_of_wrong_shape_or_float_dtype_are_rejected():
    _raises(["shape [2, E]", "[3, 2]"],
            Graph, name="g", num_nodes={N: 4}, edges={E: np.zeros((3, 2), np.int64)})
    _raises(["must be integers", "float"],
            Graph, name="g", num_nodes={N: 4}, edges={E: np.zeros((2, 2), np.float32)})


# -- node and edge data ---------------------------------------------------------------------


def test_node_data_with_wrong_row_count_is_rejected_naming_array_and_counts():
    msg = _raises(["'feat'", repr(N), "4 rows", "expected 5"],
                  Graph.homogeneous, [0, 1], [1, 2], 5, node_data={"feat": np.zeros((4, 3))})
    assert "one per node" in msg


def test_node_data_scalar_is_rejected():
    _raises(["'label'", "no rows", "expected 3"],
            Graph, name="g", num_nodes={N: 3}, edges={E: [[0], [1]]},
            node_data={N: {"label": np.int64(1)}})


def test_node_data_of_second_type_checked_against_that_types_count():
    rel = Relation("user", "buys", "item")
    _raises(["'feat'", "'item'", "3 rows", "expected 2"],
            Graph, name="g", num_nodes={"user": 3, "item": 2}, edges={rel: [[0], [1]]},
            node_data={"user": {"feat": np.zeros((3, 4))}, "item": {"feat": np.zeros((3, 4))}})


def test_node_data_for_unknown_type_is_rejected():
    _raises(["unknown node type", "'ghost'"],
            Graph, name="g", num_nodes={N: 3}, edges={E: [[0], [1]]},
            node_data={"ghost": {"feat": np.zeros((3, 1))}})


def test_edge_data_with_wrong_row_count_is_rejected_naming_array_relation_and_counts():
    msg = _raises(["'weight'", str(tuple(E)), "2 rows", "expected 3"],
                  Graph.homogeneous, [0, 1, 2], [1, 2, 0], 3,
                  edge_data={"weight": np.ones(2, np.float32)})
    assert "one per edge" in msg


def test_edge_data_for_unknown_relation_is_rejected():
    _raises(["edge data for unknown relation", "'nope'"],
            Graph, name="g", num_nodes={N: 3}, edges={E: [[0], [1]]},
            edge_data={(N, "nope", N): {"w": np.ones(1)}})


# -- splits ---------------------------------------------------------------------------------


def test_split_id_out_of_range_is_rejected_naming_split_and_id():
    _raises(["split 'train'", repr(N), "id 9", "position 1", "[0, 6)"],
            Graph.homogeneous, [0, 1], [1, 2], 6, splits={"train": np.array([2, 9, 4])})


def test_negative_split_id_is_rejected_naming_split_and_id():
    _raises(["split 'test'", "id -1"],
            Graph.homogeneous, [0, 1], [1, 2], 6, splits={"test": np.array([3, -1])})


def test_duplicated_split_id_is_rejected_with_count_of_repeats():
    _raises(["split 'val'", "2 node(s) more than once"],
            Graph.homogeneous, [0, 1], [1, 2], 6, splits={"val": np.array([1, 4, 1, 4, 5])})


def test_split_must_be_one_dimensional_integers():
    _raises(["split 'train'", "1-D integer"],
            Graph.homogeneous, [0, 1], [1, 2], 6, splits={"train": np.array([0.0, 1.0])})
    _raises(["split 'train'", "1-D integer"],
            Graph.homogeneous, [0, 1], [1, 2], 6, splits={"train": np.array([[0, 1]])})


def test_split_for_unknown_type_is_rejected():
    _raises(["split for unknown node type", "'ghost'"],
            Graph, name="g", num_nodes={N: 3}, edges={E: [[0], [1]]},
            splits={"ghost": {"train": np.array([0])}})


def test_unsorted_split_is_stored_sorted_as_int64():
    g = Graph.homogeneous([0, 1], [1, 2], 6, splits={"train": np.array([5, 0, 3], np.int32)})
    out = g.splits[N]["train"]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [0, 3, 5])


# -- relations and node types ---------------------------------------------------------------


def test_relation_with_unknown_source_type_is_rejected_listing_known_types():
    rel = Relation("user", "likes", "movie")
    _raises(["unknown node type 'movie'", "['user', 'item']", str(tuple(rel))],
            Graph, name="g", num_nodes={"user": 3, "item": 2}, edges={rel: [[0], [0]]})


def test_relation_with_unknown_destination_type_is_rejected():
    rel = Relation("actor", "likes", "item")
    _raises(["unknown node type 'actor'"],
            Graph, name="g", num_nodes={"user": 3, "item": 2}, edges={rel: [[0], [0]]})


def test_relation_names_must_be_unique_across_types():
    _raises(["relation names must be unique"],
            Graph, name="g", num_nodes={"user": 3, "item": 2},
            edges={("user", "r", "item"): [[0], [0]], ("item", "r", "user"): [[0], [0]]})


def test_graph_without_node_types_is_rejected():
    _raises(["at least one node type"], Graph, name="g", num_nodes={}, edges={})


@pytest.mark.parametrize("n", [-1, 2.5])
def test_num_nodes_must_be_a_non_negative_integer(n):
    _raises([f"num_nodes[{N!r}]", repr(n)], Graph, name="g", num_nodes={N: n}, edges={})


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a/b", ".hidden", "", "sp ace", "x:y", "é"])
def test_bad_node_type_name_is_rejected_naming_it(bad):
    _raises(["node type name", repr(bad), "not allowed"],
            Graph, name="g", num_nodes={bad: 2}, edges={})


@pytest.mark.parametrize("bad", ["feat/x", "..", "a b"])
def test_bad_node_data_name_is_rejected_naming_it(bad):
    _raises(["node data name", repr(bad)],
            Graph.homogeneous, [0], [1], 2, node_data={bad: np.zeros(2)})


def test_bad_edge_data_and_split_names_are_rejected_naming_them():
    _raises(["edge data name", "'w/1'"],
            Graph.homogeneous, [0], [1], 2, edge_data={"w/1": np.zeros(1)})
    _raises(["split name", "'../train'"],
            Graph.homogeneous, [0], [1], 2, splits={"../train": np.array([0])})


def test_relation_names_may_be_uris():
    uri = "http://example.org/ontology#knows"
    g = Graph(name="g", num_nodes={N: 3}, edges={(N, uri, N): [[0, 1], [1, 2]]})
    assert g.relations == (Relation(N, uri, N),)


@pytest.mark.parametrize("good", ["paper", "field_of_study", "a.b", "x@y+z-1", "_N", "9lives"])
def test_portable_names_are_accepted(good):
    g = Graph(name="g", num_nodes={good: 2}, edges={(good, "r", good): [[0], [1]]},
              node_data={good: {good: np.zeros(2)}})
    assert g.node_types == (good,)


# -- the homogeneous views --------------------------------------------------------------------


def _two_type_graph():
    rng = np.random.default_rng(3)
    num_nodes = {"item": 4, "user": 3}            # dict order fixes type ids: item 0, user 1
    rels = [Relation("user", "buys", "item"), Relation("item", "bought_by", "user"),
            Relation("user", "follows", "user")]
    sizes = [6, 5, 4]
    edges = {}
    for rel, e in zip(rels, sizes):
        edges[rel] = np.stack([rng.integers(num_nodes[rel.src_type], size=e),
                               rng.integers(num_nodes[rel.dst_type], size=e)])
    return Graph(name="two", num_nodes=num_nodes, edges=edges), num_nodes, rels, edges


def test_type_offsets_and_node_type_ids_follow_num_nodes_order():
    g, num_nodes, _, _ = _two_type_graph()
    offsets = g.type_offsets()
    assert offsets.dtype == np.int64
    np.testing.assert_array_equal(offsets, [0, 4, 7])
    ids = g.node_type_ids()
    expected = []
    for t, n in enumerate(num_nodes.values()):
        expected += [t] * n
    np.testing.assert_array_equal(ids, expected)
    assert ids.shape == (g.total_nodes,) == (7,)
    # Each homogeneous id in [offsets[t], offsets[t+1]) has type t.
    for t in range(len(num_nodes)):
        assert np.all(ids[offsets[t]:offsets[t + 1]] == t)


def test_homogeneous_edges_match_a_loop_over_relations():
    g, num_nodes, rels, edges = _two_type_graph()
    offset = {"item": 0, "user": 4}
    ref_src, ref_dst, ref_type = [], [], []
    for r, rel in enumerate(rels):
        for s, d in edges[rel].T:
            ref_src.append(offset[rel.src_type] + int(s))
            ref_dst.append(offset[rel.dst_type] + int(d))
            ref_type.append(r)
    src, dst, etype = g.homogeneous_edges()
    assert src.dtype == np.int64 and dst.dtype == np.int64
    np.testing.assert_array_equal(src, ref_src)
    np.testing.assert_array_equal(dst, ref_dst)
    np.testing.assert_array_equal(etype, ref_type)
    # Endpoint types agree with node_type_ids and the relation's declared types.
    types = g.node_type_ids()
    names = list(num_nodes)
    for s, d, r in zip(src, dst, etype):
        assert names[types[s]] == rels[r].src_type
        assert names[types[d]] == rels[r].dst_type


def test_homogeneous_edges_of_a_graph_without_edges_are_empty():
    g = Graph(name="g", num_nodes={"a": 2, "b": 3}, edges={})
    src, dst, etype = g.homogeneous_edges()
    assert src.shape == dst.shape == etype.shape == (0,)
    assert g.num_edges == 0 and g.total_nodes == 5 and not g.is_homogeneous


def test_homogeneous_constructor_uses_default_type_and_relation_and_int64():
    g = Graph.homogeneous(np.array([0, 3], np.int32), np.array([1, 2], np.int32))
    assert g.num_nodes == {N: 4}                  # inferred from the largest id
    assert g.relations == ((N, DEFAULT_REL, N),)
    assert g.is_homogeneous
    assert g.edges[E].dtype == np.int64
    np.testing.assert_array_equal(g.edges[E], [[0, 3], [1, 2]])


def test_homogeneous_constructor_rejects_mismatched_src_dst():
    _raises(["src and dst", "[3]", "[2]"], Graph.homogeneous, [0, 1, 2], [1, 2])


def test_repr_names_types_relations_and_counts():
    g, _, rels, _ = _two_type_graph()
    text = repr(g)
    assert re.search(r"7 nodes, 15 edges", text)
    for rel in rels:
        assert str(rel) in text
