"""The chunked graph format (jgraph.data.chunked): round trips of the shared datasets in
many chunks, the writer's two ways of naming edges, and every damaged directory refused
naming its file and field. Conversion into it is tested in tests/ingest."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from jgraph.data import (
    DEFAULT_NTYPE,
    ChunkedWriter,
    DatasetError,
    Graph,
    GraphError,
    SparseRows,
    load_chunked,
    load_dataset,
    open_chunked,
    save_chunked,
)

N = DEFAULT_NTYPE


def assert_same_graph(a: Graph, b: Graph) -> None:
    """Every array of two graphs equal, with the same keys, dtypes and shapes (sparse rows
    compared by their stored indices and values)."""
    assert a.name == b.name
    assert list(a.num_nodes.items()) == list(b.num_nodes.items())
    assert list(a.edges) == list(b.edges)
    for rel in a.edges:
        assert a.edges[rel].dtype == b.edges[rel].dtype, rel
        np.testing.assert_array_equal(a.edges[rel], b.edges[rel], err_msg=str(rel))
    filled = lambda tree: {k: v for k, v in tree.items() if v}
    for what, x, y in (("node data", filled(a.node_data), filled(b.node_data)),
                       ("edge data", filled(a.edge_data), filled(b.edge_data)),
                       ("split", filled(a.splits), filled(b.splits))):
        assert list(x) == list(y), what
        for owner in x:
            assert sorted(x[owner]) == sorted(y[owner]), (what, owner)
            for name, u in x[owner].items():
                v = y[owner][name]
                assert isinstance(u, SparseRows) == isinstance(v, SparseRows), (owner, name)
                pairs = ([(u.indices, v.indices), (u.values, v.values)]
                         if isinstance(u, SparseRows) else [(u, v)])
                assert u.shape == v.shape, (what, owner, name)
                for p, q in pairs:
                    assert p.dtype == q.dtype, (what, owner, name)
                    np.testing.assert_array_equal(p, q, err_msg=f"{what} {owner}/{name}")


def ring(n: int = 50, **node_data) -> Graph:
    """A small homogeneous graph: a ring with chords, features, labels, splits and a
    per-edge weight."""
    src = np.concatenate([np.arange(n), np.arange(n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, (np.arange(n) * 7) % n])
    rng = np.random.default_rng(0)
    data = {"feat": rng.standard_normal((n, 4)).astype(np.float32),
            "label": np.arange(n) % 3, **node_data}
    return Graph.homogeneous(src, dst, n, name="ring", node_data=data,
                             edge_data={"weight": rng.random(2 * n).astype(np.float32)},
                             splits={"train": np.arange(0, n, 2), "test": np.arange(1, n, 2)})


def written(tmp_path: Path, graph: Graph | None = None, **chunks) -> Path:
    """`graph` (the ring) saved as a chunked directory in small chunks."""
    out = tmp_path / "g"
    save_chunked(graph or ring(), out, **{"edges_per_chunk": 30, "rows_per_chunk": 20, **chunks})
    return out


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cora", "facebook_musae", "aifb", "heco_acm"])
def test_save_then_load_gives_the_same_graph_in_many_chunks(name, tmp_path, shared_data):
    graph = load_dataset(name if name == "cora" else shared_data(f"{name}.npz"))
    out = tmp_path / name
    save_chunked(graph, out, edges_per_chunk=2500, rows_per_chunk=1500)
    chunked = open_chunked(out)
    assert chunked.num_edge_chunks > 3
    assert chunked.num_edges == graph.num_edges and chunked.total_nodes == graph.total_nodes
    assert_same_graph(graph, load_chunked(out))
    assert_same_graph(graph, load_dataset(out))        # load_dataset reads the directory


def test_edge_data_node_data_of_every_kind_and_empty_splits_round_trip(tmp_path):
    graph = ring(extra=np.arange(50 * 6).reshape(50, 2, 3).astype(np.int16),
                 flag=np.arange(50) % 2 == 0)
    graph = graph.replace(splits={N: {**graph.splits[N], "val": np.zeros(0, np.int64)}})
    assert_same_graph(graph, load_chunked(written(tmp_path, graph)))


def test_metadata_lists_the_chunks_and_edge_ids_are_positions_in_them(tmp_path):
    out = written(tmp_path, edges_per_chunk=40)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["format"] == "jgraph-chunked" and meta["num_nodes"] == {N: 50}
    assert meta["edges"]["rows"] == [40, 40, 20] and meta["edges"]["etype"] is None
    assert meta["node_data"][N]["feat"]["rows"] == [20, 20, 10]
    chunk = open_chunked(out).edge_chunk(1)
    assert chunk.start == 40
    np.testing.assert_array_equal(chunk.src, ring().edges[next(iter(ring().edges))][0, 40:80])


def hetero() -> Graph:
    """Two node types, three relations, one edge array."""
    rng = np.random.default_rng(1)
    num_nodes = {"paper": 30, "author": 20}
    rels = {("author", "writes", "paper"): (20, 30, 70), ("paper", "cites", "paper"): (30, 30, 90),
            ("paper", "by", "author"): (30, 20, 70)}
    edges = {r: np.stack([rng.integers(s, size=e), rng.integers(d, size=e)])
             for r, (s, d, e) in rels.items()}
    return Graph(name="hetero", num_nodes=num_nodes, edges=edges,
                 node_data={"paper": {"label": rng.integers(3, size=30)}},
                 edge_data={r: {"w": rng.random(e).astype(np.float32)}
                            for r, (_, _, e) in rels.items()},
                 splits={"paper": {"train": np.arange(10)}})


def test_writer_with_relation_local_ids_and_with_etype_homogeneous_ids_gives_one_graph(tmp_path):
    graph = hetero()
    offsets = {"paper": 0, "author": 30}
    with ChunkedWriter(tmp_path / "local", graph.num_nodes, name="hetero",
                       relations=graph.relations) as w:
        for rel, index in graph.edges.items():
            for a in range(0, index.shape[1], 25):
                w.add_edges(index[0, a:a + 25], index[1, a:a + 25], relation=rel,
                            data={"w": graph.edge_data[rel]["w"][a:a + 25]})
        w.add_node_data("label", graph.node_data["paper"]["label"], ntype="paper")
        w.add_split("train", np.arange(10), ntype="paper")
    # Every relation's edges in one stream of homogeneous ids, cut into chunks that mix
    # relations: grouped again by relation on reading, in their order.
    src = np.concatenate([i[0] + offsets[r[0]] for r, i in graph.edges.items()])
    dst = np.concatenate([i[1] + offsets[r[2]] for r, i in graph.edges.items()])
    etype = np.repeat(np.arange(3), [i.shape[1] for i in graph.edges.values()])
    weight = np.concatenate([d["w"] for d in graph.edge_data.values()])
    with ChunkedWriter(tmp_path / "global", graph.num_nodes, name="hetero",
                       relations=graph.relations) as w:
        for a in range(0, src.size, 33):
            sl = slice(a, a + 33)
            w.add_edges(src[sl], dst[sl], etype=etype[sl], data={"w": weight[sl]})
        w.add_node_data("label", graph.node_data["paper"]["label"], ntype="paper")
        w.add_split("train", np.arange(5), ntype="paper")
        w.add_split("train", np.arange(5, 10), ntype="paper")
    assert open_chunked(tmp_path / "global").num_edge_chunks == 7
    assert_same_graph(graph, load_chunked(tmp_path / "local"))
    assert_same_graph(graph, load_chunked(tmp_path / "global"))


# -- damaged directories: each refused, naming the file and the field --------------------------


def edit_metadata(out: Path, change) -> None:
    meta = json.loads((out / "metadata.json").read_text())
    change(meta)
    (out / "metadata.json").write_text(json.dumps(meta))


def refused(words, call, *args, **kwargs):
    """`call` raises a DatasetError or GraphError whose message holds every word."""
    with pytest.raises((DatasetError, GraphError)) as e:
        call(*args, **kwargs)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    return e.value


def test_src_and_dst_chunks_of_different_lengths_are_refused(tmp_path):
    out = written(tmp_path)
    np.save(out / "edges" / "dst-00001.npy", np.zeros(29, np.int32))
    refused(["dst-00001.npy", "edges.dst chunk 1", "[29]", "[30]"], open_chunked, out)


def test_an_id_out_of_range_is_refused_when_its_chunk_is_read(tmp_path):
    out = written(tmp_path)
    dst = np.load(out / "edges" / "dst-00002.npy")
    dst[5] = 50
    np.save(out / "edges" / "dst-00002.npy", dst)
    graph = open_chunked(out)           # headers are fine
    graph.edge_chunk(1)
    refused(["dst-00002.npy", "dst 50 at edge 65", "[0, 50)"], graph.edge_chunk, 2)
    refused(["dst-00002.npy", "dst 50"], load_chunked, out)


def test_a_missing_chunk_file_is_refused(tmp_path):
    out = written(tmp_path)
    os.remove(out / "edges" / "src-00001.npy")
    refused(["src-00001.npy", "missing"], open_chunked, out)


def test_a_truncated_chunk_file_is_refused(tmp_path):
    out = written(tmp_path)
    path = out / "nodes" / N / "feat-00001.npy"
    path.write_bytes(path.read_bytes()[:-6])
    refused(["feat-00001.npy", "truncated"], open_chunked, out)


def test_a_truncated_sparse_values_file_is_refused(tmp_path):
    graph = ring(bow=SparseRows.from_dense(np.eye(50, 9, dtype=np.float32)))
    out = written(tmp_path, graph)
    assert_same_graph(graph, load_chunked(out))
    path = out / "nodes" / N / "bow.values-00002.npy"
    path.write_bytes(path.read_bytes()[:-1])
    refused(["bow.values-00002.npy", "truncated"], open_chunked, out)


BAD_METADATA = {
    "edge rows wrong": (lambda m: m["edges"]["rows"].__setitem__(0, 31),
                        ["src-00000.npy", "edges.src chunk 0", "metadata.json says [31]"]),
    "node rows not summing to num_nodes": (
        lambda m: m["node_data"][N]["feat"]["rows"].__setitem__(-1, 9),
        ["metadata.json", "node_data._N.feat", "49 rows", "50 nodes"]),
    "unknown node type": (lambda m: m["node_data"].__setitem__("paper", {}),
                          ["metadata.json", "node_data", "unknown node type 'paper'"]),
    "not a number type": (lambda m: m["node_data"][N]["feat"].__setitem__("dtype", "str"),
                          ["metadata.json", "node_data._N.feat", "'str'", "not a number"]),
    "dtype other than the file's": (
        lambda m: m["node_data"][N]["feat"].__setitem__("dtype", "float64"),
        ["feat-00000.npy", "node_data._N.feat", "float32", "says float64"]),
    "fewer files than chunks": (lambda m: m["edges"]["dst"].pop(),
                                ["metadata.json", "edges.dst", "3 files for 4 chunks"]),
    "a field missing": (lambda m: m.pop("relations"), ["metadata.json", "relations"]),
    "another version": (lambda m: m.__setitem__("version", 7), ["metadata.json", "version 7"]),
    "relation of an unknown type": (
        lambda m: m.__setitem__("relations", [["_N", "_E", "paper"]]),
        ["metadata.json", "unknown node type 'paper'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_METADATA))
def test_metadata_that_disagrees_with_the_chunks_is_refused(case, tmp_path):
    change, words = BAD_METADATA[case]
    out = written(tmp_path)
    edit_metadata(out, change)
    refused(words, open_chunked, out)


def test_split_ids_unsorted_across_chunks_are_refused(tmp_path):
    with ChunkedWriter(tmp_path / "g", 10) as w:
        w.add_edges([0, 1], [1, 2])
        w.add_split("train", [0, 1, 2])
        w.add_split("train", [5, 6, 7])
    splits = tmp_path / "g" / "splits" / N
    first = np.load(splits / "train-00000.npy")
    np.save(splits / "train-00000.npy", np.load(splits / "train-00001.npy"))
    np.save(splits / "train-00001.npy", first)
    graph = open_chunked(tmp_path / "g")
    refused(["splits._N.train", "sorted", "7 is followed by 0"], graph.split, N, "train")
    refused(["splits._N.train"], load_chunked, tmp_path / "g")
    # checked a share of the chunks at a time: the second chunk against the first's end
    graph.check_split(N, "train", [0])
    refused(["splits._N.train", "7 is followed by 0", "train-00001.npy"], graph.check_split,
            N, "train", [1])


def test_a_range_of_a_split_is_its_ids_in_that_range(tmp_path):
    """`ChunkedGraph.split(ntype, name, lo, hi)`: the split's ids in [lo, hi), cut from
    each chunk, for ranges inside a chunk, across chunks, empty and past the end."""
    ids = np.sort(np.random.default_rng(0).choice(100, 40, replace=False))
    with ChunkedWriter(tmp_path / "g", 100) as w:
        w.add_edges([0, 1], [1, 2])
        for piece in np.split(ids, [7, 7, 25]):              # an empty chunk among them
            w.add_split("train", piece)
    graph = open_chunked(tmp_path / "g")
    np.testing.assert_array_equal(graph.split(N, "train"), ids)
    for lo, hi in [(0, 100), (0, 1), (int(ids[7]), int(ids[30]) + 1), (50, 50), (60, 40),
                   (97, 500), (int(ids[3]), int(ids[4]))]:
        got = graph.split(N, "train", lo, hi)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, ids[(ids >= lo) & (ids < hi)], err_msg=(lo, hi))


def test_an_edge_whose_source_is_not_of_its_relations_source_type_is_refused(tmp_path):
    graph = hetero()
    with ChunkedWriter(tmp_path / "g", graph.num_nodes, relations=graph.relations) as w:
        # relation 0 is author -> paper; homogeneous id 3 is a paper
        w.add_edges([30, 3], [0, 1], etype=[0, 0], data={"w": np.ones(2, np.float32)})
    refused(["src-00000.npy", "src 3 at edge 1", "not a node of type 'author'",
             "('author', 'writes', 'paper')"], open_chunked(tmp_path / "g").edge_chunk, 0)


def nothing_left(out: Path) -> bool:
    return not out.exists() and not [p for p in out.parent.iterdir()
                                      if p.name.startswith(out.name + ".partial-")]


WRITER_MISUSE = {
    "split out of order": (lambda w: (w.add_split("train", [4, 5]), w.add_split("train", [3])),
                           ["split 'train'", "sorted", "last 5"]),
    "split unsorted in a chunk": (lambda w: w.add_split("train", [4, 2]), ["sorted"]),
    "node rows past num_nodes": (lambda w: (w.add_node_data("feat", np.ones((6, 2))),
                                            w.add_node_data("feat", np.ones((5, 2)))),
                                 ["'feat'", "11 rows given", "10 nodes"]),
    "node rows missing at close": (lambda w: w.add_node_data("feat", np.ones((6, 2))),
                                   ["'feat'", "6 rows written", "10 nodes"]),
    "edge id out of range": (lambda w: w.add_edges([0, 10], [1, 2]),
                             ["edge chunk 1", "src", "id 10", "[0, 10)"]),
    "src and dst of different lengths": (lambda w: w.add_edges([0, 1], [1]),
                                         ["edge chunk 1", "one length"]),
    "unknown relation": (lambda w: w.add_edges([0], [1], relation=("_N", "x", "_N")),
                         ["relation", "'x'"]),
    "edge data names change": (lambda w: (w.add_edges([0], [1], data={"w": [1.0]}),
                                          w.add_edges([0], [1])),
                               ["edge chunk 1", "'w'"]),
    "node data dtype changes": (lambda w: (w.add_node_data("feat", np.ones((5, 2), np.float32)),
                                           w.add_node_data("feat", np.ones((5, 2)))),
                                ["'feat'", "rows from 5", "float64"]),
}


@pytest.mark.parametrize("case", sorted(WRITER_MISUSE))
def test_writer_misuse_is_refused_and_leaves_nothing_at_out(case, tmp_path):
    misuse, words = WRITER_MISUSE[case]
    out = tmp_path / "g"

    def write():
        with ChunkedWriter(out, 10) as w:
            w.add_edges([0, 1, 2], [1, 2, 3])
            misuse(w)
    refused(words, write)
    assert nothing_left(out)


def test_an_existing_directory_at_out_is_kept_unless_overwrite(tmp_path):
    out = written(tmp_path)
    refused([str(out), "overwrite"], save_chunked, ring(), out)
    save_chunked(ring(), out, edges_per_chunk=1000, overwrite=True)
    assert open_chunked(out).num_edge_chunks == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    refused(["other", "not a chunked graph directory"], save_chunked, ring(),
            tmp_path / "other", overwrite=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_relations_named_twice_in_hand_written_metadata_are_refused(tmp_path):
    save_chunked(hetero(), tmp_path / "g")
    edit_metadata(tmp_path / "g", lambda m: m["relations"].__setitem__(
        1, [m["relations"][1][0], m["relations"][0][1], m["relations"][1][2]]))
    refused(["metadata.json", "relations", "unique", "'writes'"], open_chunked, tmp_path / "g")


def test_a_relation_id_past_int32_is_refused_not_wrapped(tmp_path):
    save_chunked(hetero(), tmp_path / "g")
    etype = tmp_path / "g" / "edges" / "etype-00000.npy"
    values = np.load(etype).astype(np.int64)
    values[2] = 2**32 + 1                     # would wrap to relation 1 as int32
    np.save(etype, values)
    refused(["etype-00000.npy", f"etype {2**32 + 1} at edge 2", "out of range"],
            open_chunked(tmp_path / "g").edge_chunk, 0)


def test_sparse_indices_that_are_not_int32_are_refused(tmp_path):
    graph = ring(words=SparseRows.from_dense(np.eye(50, dtype=np.float32)))
    save_chunked(graph, tmp_path / "g")
    files = sorted((tmp_path / "g" / "nodes" / "_N").glob("words.indices-*.npy"))
    np.save(files[0], np.load(files[0]).astype(np.float32))
    refused([files[0].name, "sparse indices", "float32"], open_chunked, tmp_path / "g")


def test_dense_node_data_may_not_take_a_sparse_arrays_file_names(tmp_path):
    with pytest.raises(GraphError, match="kept for the files of sparse rows"), \
            ChunkedWriter(tmp_path / "g", 4) as w:
        w.add_node_data("feat.indices", np.zeros((4, 2), np.float32))
    assert nothing_left(tmp_path / "g")
