"""A partition directory holds the input graph exactly: every node once, every edge once,
data and splits with their nodes, contiguous ranges; checked against the input graph."""
from collections import Counter

import numpy as np
import pytest

from jgraph.data import add_reverse_relations, load_dataset, load_npz, symmetrize
from jgraph.partition import open_partitions, partition_graph


def _partition(graph, tmp_path, num_parts, method, **kw):
    out = tmp_path / f"{graph.name}-{method}-{num_parts}"
    meta = partition_graph(graph, num_parts, method, out, **kw)
    return meta, open_partitions(out)


def assert_partition_holds_graph(graph, pg):
    """Every invariant of a partition directory, against the graph it came from."""
    meta, book = pg.meta, pg.book
    n = graph.total_nodes
    node_map, inverse = np.asarray(pg.node_map()), np.asarray(pg.node_map_inv())
    # Every node in exactly one partition: node_map is a permutation, inverse its inverse.
    assert np.array_equal(np.sort(node_map), np.arange(n))
    assert np.array_equal(inverse[node_map], np.arange(n))
    assert book.offsets[0] == 0 and book.offsets[-1] == n
    orig_offsets = graph.type_offsets()
    orig_type = np.searchsorted(orig_offsets, node_map, side="right") - 1

    src, dst, etype = graph.homogeneous_edges()
    expected_edges = Counter(zip(src.tolist(), dst.tolist(), etype.tolist()))
    seen_edges = Counter()
    for k in range(pg.num_parts):
        part = pg.part(k)
        lo, hi = part.node_range
        ids = np.arange(lo, hi)
        # Contiguous range owned by k, type by type.
        assert np.all(book.owner(ids) == k)
        assert np.array_equal(book.ntype(ids), orig_type[lo:hi])
        # Edges: in-edges of owned nodes, mapped back through node_map.
        local_dst = np.repeat(np.arange(part.num_nodes), np.diff(part.indptr))
        new_dst = lo + local_dst
        orig_src = node_map[np.asarray(part.indices)]
        orig_dst = node_map[new_dst]
        seen_edges.update(zip(orig_src.tolist(), orig_dst.tolist(),
                              np.asarray(part.etype).tolist()))
        # edge_ids point at the very edges stored.
        eids = np.asarray(part.edge_ids)
        assert np.array_equal(src[eids], orig_src) and np.array_equal(dst[eids], orig_dst)
        # In-edges of each node sorted by (relation, source).
        key = new_dst * (len(graph.relations) + 1) + np.asarray(part.etype)
        order = np.lexsort((np.asarray(part.indices), key))
        assert np.array_equal(order, np.arange(order.size))
        # Halo: exactly the remote in-neighbours.
        srcs = np.asarray(part.indices)
        assert np.array_equal(part.halo, np.unique(srcs[(srcs < lo) | (srcs >= hi)]))
        # Node data and splits follow their nodes.
        for t, ntype in enumerate(graph.node_types):
            t_lo, t_hi = book.ntype_offsets[k, t], book.ntype_offsets[k, t + 1]
            rows = node_map[t_lo:t_hi] - orig_offsets[t]
            for name, values in graph.node_data.get(ntype, {}).items():
                assert np.array_equal(part.node_data[ntype][name], values[rows]), (ntype, name)
            for name, idx in graph.splits.get(ntype, {}).items():
                mine = np.asarray(part.splits[ntype][name])
                assert np.all((mine >= lo) & (mine < hi))
                assert np.array_equal(np.sort(node_map[mine] - orig_offsets[t]),
                                      np.intersect1d(idx, rows))
        assert meta.parts[k].num_edges == part.num_edges
    assert seen_edges == expected_edges
    for ntype, named in graph.splits.items():
        for name, idx in named.items():
            assert sum(p.splits[ntype][name] for p in meta.parts) == idx.size
    pg.check()          # the directory's own check (`jgraph info --check`) finds nothing


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("num_parts", [1, 3, 8])
def test_cora_partition_holds_every_node_edge_and_feature(tmp_path, method, num_parts):
    graph = load_dataset("cora")
    _, pg = _partition(graph, tmp_path, num_parts, method)
    assert_partition_holds_graph(graph, pg)


@pytest.mark.slow      # partitions facebook_musae
def test_facebook_partition_holds_graph(tmp_path, shared_data):
    graph = symmetrize(load_npz(shared_data("facebook_musae.npz")))
    _, pg = _partition(graph, tmp_path, 5, "metis")
    assert_partition_holds_graph(graph, pg)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_aifb_relational_partition_with_reverse_relations(tmp_path, shared_data, method):
    graph = add_reverse_relations(load_npz(shared_data("aifb.npz")))
    assert len(graph.relations) == 90
    meta, pg = _partition(graph, tmp_path, 4, method)
    assert meta.num_edges == 58086
    assert_partition_holds_graph(graph, pg)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_heco_acm_heterogeneous_partition_keeps_types_contiguous(tmp_path, shared_data, method):
    graph = add_reverse_relations(load_npz(shared_data("heco_acm.npz")))
    meta, pg = _partition(graph, tmp_path, 6, method)
    assert_partition_holds_graph(graph, pg)
    counts = pg.book.type_counts()
    assert counts.sum(axis=0).tolist() == [4019, 7167, 60]
    assert meta.num_nodes_per_type == {"paper": 4019, "author": 7167, "subject": 60}


def test_heco_freebase_featureless_types_partition(tmp_path, shared_data):
    graph = add_reverse_relations(load_npz(shared_data("heco_freebase.npz")))
    _, pg = _partition(graph, tmp_path, 4, "metis")
    assert_partition_holds_graph(graph, pg)
    assert set(pg.meta.node_data) == {"movie"}


def test_edge_data_follows_its_edges(tmp_path):
    base = load_dataset("cora")
    rel = base.relations[0]
    weight = np.random.default_rng(0).random(base.num_edges).astype(np.float32)
    graph = base.replace(edge_data={rel: {"weight": weight}})
    _, pg = _partition(graph, tmp_path, 4, "metis")
    for k in range(4):
        part = pg.part(k)
        assert np.array_equal(part.edge_data["weight"], weight[np.asarray(part.edge_ids)])


def test_same_seed_gives_identical_partitions(tmp_path):
    graph = load_dataset("cora")
    a = partition_graph(graph, 4, "random", tmp_path / "a", seed=3)
    b = partition_graph(graph, 4, "random", tmp_path / "b", seed=3)
    assert a.offsets == b.offsets
    assert np.array_equal(open_partitions(tmp_path / "a").node_map(),
                          open_partitions(tmp_path / "b").node_map())
