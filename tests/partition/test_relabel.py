"""The in-memory reference of the numbering (`relabel_reference`) against a sort written
out plainly and each part's edges against the input graph; the written directory
holding exactly the arrays it computes."""
from collections import Counter

import numpy as np

from jgraph.data import add_reverse_relations, load_npz
from jgraph.partition import open_partitions, partition_graph

from .relabel_reference import homogeneous_edge_data, part, relabel, relabel_edges


def test_new_ids_sort_nodes_by_partition_then_original_id(shared_data):
    graph = load_npz(shared_data("heco_acm.npz"))
    parts = np.random.default_rng(0).integers(0, 5, graph.total_nodes)
    r = relabel(graph, parts, 5)
    expected = sorted(range(graph.total_nodes), key=lambda i: (parts[i], i))
    assert r.node_map.tolist() == expected
    assert np.array_equal(r.inverse[r.node_map], np.arange(graph.total_nodes))
    type_of = graph.node_type_ids()
    for k in range(5):
        mine = r.node_map[r.offsets[k]:r.offsets[k + 1]]
        assert np.all(parts[mine] == k)
        for t in range(len(graph.node_types)):
            span = r.node_map[r.ntype_offsets[k, t]:r.ntype_offsets[k, t + 1]]
            assert np.all(type_of[span] == t) and span.size == r.counts[k, t]


def test_parts_hold_every_edge_once_with_its_data_and_split(shared_data):
    graph = add_reverse_relations(load_npz(shared_data("heco_acm.npz")))
    parts = np.random.default_rng(1).integers(0, 3, graph.total_nodes)
    r = relabel(graph, parts, 3)
    edges = relabel_edges(graph, parts, r)
    src, dst, etype = graph.homogeneous_edges()
    assert edges.cut == np.mean(parts[src] != parts[dst])
    seen = Counter()
    for k in range(3):
        p = part(graph, r, edges, {}, k)
        lo = r.offsets[k]
        new_dst = lo + np.repeat(np.arange(p.info.num_nodes), np.diff(p.indptr))
        seen.update(zip(r.node_map[p.indices].tolist(), r.node_map[new_dst].tolist(),
                        p.etype.tolist()))
        assert np.array_equal(src[p.edge_ids], r.node_map[p.indices])
        for (ntype, name), rows in p.node_data.items():
            t = graph.node_types.index(ntype)
            ids = r.node_map[r.ntype_offsets[k, t]:r.ntype_offsets[k, t + 1]] - r.orig_offsets[t]
            assert np.array_equal(rows, graph.node_data[ntype][name][ids])
        for ntype, named in p.splits.items():
            t = graph.node_types.index(ntype)
            for name, ids in named.items():
                assert np.array_equal(np.sort(r.node_map[ids] - r.orig_offsets[t]),
                                      np.intersect1d(graph.splits[ntype][name],
                                                     r.node_map[lo:r.offsets[k + 1]]
                                                     - r.orig_offsets[t]))
    assert seen == Counter(zip(src.tolist(), dst.tolist(), etype.tolist()))


def test_the_written_directory_holds_exactly_what_relabelling_computes(tmp_path, shared_data):
    graph = load_npz(shared_data("heco_acm.npz"))
    partition_graph(graph, 4, "random", tmp_path / "p", seed=2)
    pg = open_partitions(tmp_path / "p")
    node_map = np.asarray(pg.node_map())
    parts = np.empty(graph.total_nodes, np.int64)
    parts[node_map] = pg.book.owner(np.arange(graph.total_nodes))
    r = relabel(graph, parts, 4)
    assert np.array_equal(r.node_map, node_map)
    edges = relabel_edges(graph, parts, r)
    for k in range(4):
        want, got = part(graph, r, edges, homogeneous_edge_data(graph), k), pg.part(k)
        for name in ("indptr", "indices", "etype", "edge_ids", "halo"):
            assert np.array_equal(getattr(want, name), np.asarray(getattr(got, name))), name
        for (ntype, name), rows in want.node_data.items():
            assert np.array_equal(rows, np.asarray(got.node_data[ntype][name]))
        assert want.info == pg.meta.parts[k]
