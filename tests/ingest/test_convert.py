"""Conversion into the chunked format (jgraph.ingest.convert): the streaming `.npz`
member reader, and OGB directories converted a chunk at a time into the graph load_ogb
reads, in memory bounded by the chunks; a bad layout refused naming the file and array,
nothing left at the output."""
from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import jgraph.ingest.convert as convert_module
from jgraph.data import DEFAULT_NTYPE, load_chunked, load_ogb, open_chunked
from jgraph.ingest.convert import NpzMember, convert, npz_edge_index, npz_rows

from ..data.test_chunked import assert_same_graph, nothing_left, refused

N = DEFAULT_NTYPE


# -- the streaming .npz member reader ---------------------------------------------------------


ARRAYS = {
    "int64 1-D": np.arange(-50, 53, dtype=np.int64) * 3,
    "float32 2-D": np.random.default_rng(0).standard_normal((41, 5)).astype(np.float32),
    "int32 3-D": np.arange(23 * 2 * 3, dtype=np.int32).reshape(23, 2, 3),
    "big-endian int64": np.arange(17, dtype=">i8"),
    "empty rows": np.zeros((0, 4), np.float32),
}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
@pytest.mark.parametrize("case", sorted(ARRAYS))
@pytest.mark.parametrize("rows", [1, 3, 10, 1000])
def test_npz_rows_reads_a_member_back_exactly_in_blocks(save, case, rows, tmp_path):
    array = ARRAYS[case]
    save(tmp_path / "a.npz", other=np.ones(3), x=array)
    blocks = list(npz_rows(tmp_path / "a.npz", "x", rows))
    assert all(len(b) <= rows for b in blocks)
    assert len(blocks) == -(-len(array) // rows)
    back = np.concatenate(blocks) if blocks else np.zeros((0, *array.shape[1:]), array.dtype)
    assert back.dtype == array.dtype.newbyteorder("=") and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npz_edge_index_streams_sources_and_destinations_in_lockstep(save, order, tmp_path):
    index = np.asarray(np.random.default_rng(0).integers(1000, size=(2, 101)), order=order)
    save(tmp_path / "a.npz", edge_index=index)
    blocks = list(npz_edge_index(tmp_path / "a.npz", "edge_index", 8))
    assert [len(s) for s, _ in blocks] == [8] * 12 + [5]
    np.testing.assert_array_equal(np.concatenate([s for s, _ in blocks]), index[0])
    np.testing.assert_array_equal(np.concatenate([d for _, d in blocks]), index[1])


def test_npz_member_read_and_skip_keep_their_place(tmp_path):
    np.savez_compressed(tmp_path / "a.npz", x=np.arange(100))
    with NpzMember(tmp_path / "a.npz", "x") as member:
        assert member.shape == (100,) and member.dtype == np.int64
        np.testing.assert_array_equal(member.read(10), np.arange(10))
        member.skip(80)
        np.testing.assert_array_equal(member.read(50), np.arange(90, 100))
        assert member.read(5).size == 0


def test_a_truncated_or_corrupt_npz_is_refused_naming_it(tmp_path):
    path = tmp_path / "a.npz"
    np.savez_compressed(path, x=np.random.default_rng(0).standard_normal(5000))
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2])          # the zip's directory is at the end
    refused([str(path), "not a readable .npz"], list, npz_rows(path, "x", 100))
    # Damage inside the deflated data: the zip opens, the member does not read.
    path.write_bytes(whole[:200] + bytes(b ^ 0x5A for b in whole[200:400]) + whole[400:])
    refused([str(path), "x"], list, npz_rows(path, "x", 100))
    np.savez(path, x=np.arange(1000))                   # stored: the CRC catches it
    whole = path.read_bytes()
    path.write_bytes(whole[:500] + b"\x00" * 8 + whole[508:])
    refused([str(path), "x", "CRC"], list, npz_rows(path, "x", 64))
    refused([str(path), "no array 'y'", "['x']"], list, npz_rows(path, "y", 64))
    refused([str(tmp_path / "absent.npz"), "no such file"], list,
            npz_rows(tmp_path / "absent.npz", "x", 1))


# -- OGB directories, converted a chunk at a time ----------------------------------------------


def _csv(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.asarray(rows)
    a = a[:, None] if a.ndim == 1 else a
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(repr(v.item()) for v in row) + "\n" for row in a))


def papers_like(root: Path, n: int = 300, e: int = 2000, save=np.savez_compressed,
                order: str = "C", **changes) -> Path:
    """ogbn-papers100M's layout on a small graph: raw/data.npz, raw/node-label.npz with
    NaN for unlabelled nodes, and split/time/*.csv.gz in no particular order."""
    rng = np.random.default_rng(0)
    label = rng.integers(0, 17, size=(n, 1)).astype(np.float64)
    label[rng.random(n) < 0.7] = np.nan
    arrays = {"edge_index": np.asarray(rng.integers(n, size=(2, e)), order=order),
              "node_feat": rng.standard_normal((n, 8)).astype(np.float32),
              "node_year": rng.integers(1990, 2021, size=(n, 1)),
              "num_nodes_list": np.array([n]), "num_edges_list": np.array([e]),
              "node_label": label, **changes}
    (root / "raw").mkdir(parents=True)
    save(root / "raw" / "node-label.npz", node_label=arrays.pop("node_label"))
    save(root / "raw" / "data.npz", **{k: v for k, v in arrays.items() if v is not None})
    perm = rng.permutation(n)
    for name, ids in (("train", perm[:100]), ("valid", perm[100:130]), ("test", perm[130:160])):
        _csv(root / "split" / "time" / f"{name}.csv.gz", ids)
    return root


@pytest.mark.parametrize("save,order", [(np.savez_compressed, "C"), (np.savez, "C"),
                                        (np.savez_compressed, "F")],
                         ids=["deflated", "stored", "fortran-order"])
def test_papers100m_layout_converts_in_chunks_to_the_graph_load_ogb_reads(save, order, tmp_path):
    root = papers_like(tmp_path / "papers", save=save, order=order)
    convert(root, tmp_path / "out", edges_per_chunk=150, rows_per_chunk=64)
    chunked = open_chunked(tmp_path / "out")
    assert chunked.edges["src"].rows == (150,) * 13 + (50,)
    assert chunked.node_data[N]["feat"].rows == (64,) * 4 + (44,)
    graph = load_chunked(tmp_path / "out")
    assert (graph.node_data[N]["label"] == -1).sum() > 100
    assert sorted(graph.splits[N]) == ["test", "train", "val"]
    assert_same_graph(load_ogb(root), graph)


def test_papers100m_layout_converts_in_memory_bounded_by_the_chunks(tmp_path, monkeypatch):
    # 200k edges (3.2 MB of edge_index) and 50k x 8 features (1.6 MB), in chunks of 5k
    # edges and 2k rows: what numpy and Python allocate at once stays near a chunk's size.
    root = papers_like(tmp_path / "papers", n=50_000, e=200_000)
    monkeypatch.setattr(convert_module, "_PIECE", 1 << 16)
    tracemalloc.start()
    try:
        convert(root, tmp_path / "out", edges_per_chunk=5000, rows_per_chunk=2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    assert open_chunked(tmp_path / "out").num_edges == 200_000


def test_without_num_nodes_list_the_node_count_is_the_rows_of_the_node_arrays(tmp_path):
    root = papers_like(tmp_path / "papers", num_nodes_list=None, num_edges_list=None)
    convert(root, tmp_path / "out", edges_per_chunk=500)
    assert open_chunked(tmp_path / "out").num_nodes == {N: 300}
    assert_same_graph(load_ogb(root), load_chunked(tmp_path / "out"))


BAD_PAPERS = {
    "edge id out of range": (dict(edge_index=np.array([[0, 5, 300], [1, 2, 3]]),
                                  num_edges_list=np.array([3])),
                             ["data.npz: edge_index", "edge chunk 0", "id 300", "[0, 300)"]),
    "edge count disagrees": (dict(num_edges_list=np.array([7])),
                             ["data.npz", "num_edges_list says 7", "holds 2000"]),
    "label below -1": (dict(node_label=np.full((300, 1), -3.0)),
                       ["node-label.npz: node_label", "'label'", "-3"]),
    "edge_index not [2, E]": (dict(edge_index=np.zeros((3, 4), np.int64)),
                              ["data.npz", "edge_index", "[3, 4]", "[2, E]"]),
    "features of another length": (dict(node_feat=np.ones((299, 8), np.float32)),
                                   ["data.npz: node_feat", "'feat'", "299 rows", "300 nodes"]),
    "NaN feature": (dict(node_feat=np.full((300, 8), np.nan, np.float32)),
                    ["data.npz: node_feat", "'feat'", "nan"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PAPERS))
def test_a_bad_papers100m_layout_is_refused_naming_the_file_and_array(case, tmp_path):
    changes, words = BAD_PAPERS[case]
    root = papers_like(tmp_path / "papers", **changes)
    refused(words, convert, root, tmp_path / "out", edges_per_chunk=100, rows_per_chunk=50)
    assert nothing_left(tmp_path / "out")


def arxiv_like(root: Path, n: int = 120, e: int = 700) -> Path:
    """ogbn-arxiv's csv layout, with per-edge features as ogbn-proteins has them."""
    rng = np.random.default_rng(2)
    _csv(root / "raw" / "edge.csv.gz", rng.integers(n, size=(e, 2)))
    _csv(root / "raw" / "edge-feat.csv.gz", rng.random((e, 3)).round(3))
    _csv(root / "raw" / "num-node-list.csv.gz", [n])
    _csv(root / "raw" / "node-feat.csv.gz", rng.standard_normal((n, 4)).round(4))
    _csv(root / "raw" / "node-label.csv.gz", rng.integers(0, 40, size=n))
    _csv(root / "raw" / "node_year.csv.gz", rng.integers(1990, 2021, size=n))
    perm = rng.permutation(n)
    for name, ids in (("train", perm[:60]), ("valid", perm[60:90]), ("test", perm[90:])):
        _csv(root / "split" / "time" / f"{name}.csv.gz", ids)
    return root


def test_the_csv_layout_converts_in_chunks_to_the_graph_load_ogb_reads(tmp_path):
    root = arxiv_like(tmp_path / "arxiv")
    convert(root, tmp_path / "out", edges_per_chunk=100, rows_per_chunk=50)
    assert open_chunked(tmp_path / "out").num_edge_chunks == 7
    assert_same_graph(load_ogb(root), load_chunked(tmp_path / "out"))


def test_a_split_listing_a_node_twice_is_refused_naming_its_file(tmp_path):
    root = papers_like(tmp_path / "papers")
    _csv(root / "split" / "time" / "valid.csv.gz", [3, 9, 3])
    refused(["valid.csv.gz", "more than once"], convert, root, tmp_path / "out")
