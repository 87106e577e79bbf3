"""DGL's chunked graph format (DGL user guide 7.1, "Chunked Graph Format") converted to
jgraph's chunked format: the same graph as the same data saved as jgraph's `.npz`, edge
for edge, and bad input refused with a DatasetError naming the file, nothing written."""
import json
import os
import sys

import numpy as np
import pytest

from jgraph.cli.main import main
from jgraph.data import DatasetError, Graph, load_chunked, load_dataset, load_npz, save_npz
from jgraph.data.chunked import is_chunked_dir, is_dgl_chunked_dir, open_chunked
from jgraph.ingest import convert_dgl
from jgraph.ingest.convert import convert

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NODES = {"author": [4, 3], "paper": [4, 4, 3], "venue": [2, 3]}        # per chunk
# edge type -> (format of its edges files, edges per file); one csv file is empty
EDGES = {"author:writes:paper": ("csv", [5, 0, 4]),
         "paper:cites:paper": ("numpy", [6, 5]),
         "paper:published_in:venue": ("parquet", [7, 4])}


def split_rows(array: np.ndarray, counts) -> list[np.ndarray]:
    return np.split(array, np.cumsum(counts)[:-1])


def write_parquet(path, array: np.ndarray, vector_rows: bool = False) -> None:
    """As DGL's ParquetArrayParser writes: a column per value with the array's shape in
    the schema's metadata, or one list column per row (GraphStorm, `vector_rows`)."""
    if vector_rows:
        table = pa.table({"vector": pa.array(list(array))})
    else:
        flat = array.reshape(len(array), -1)
        table = pa.table({str(i): flat[:, i] for i in range(flat.shape[1])})
        table = table.replace_schema_metadata({"shape": str(array.shape)})
    pq.write_table(table, path)


def write_files(root, stem: str, fmt: str, pieces: list[np.ndarray], **kw) -> list[str]:
    """Chunk files under root (paths relative to it, as metadata.json gives them)."""
    names = []
    for i, piece in enumerate(pieces):
        name = f"{stem}-{i}." + {"numpy": "npy", "parquet": "parquet", "csv": "csv"}[fmt]
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        path = os.path.join(root, name)
        if fmt == "numpy":
            np.save(path, piece)
        elif fmt == "parquet":
            write_parquet(path, piece, **kw)
        else:
            np.savetxt(path, piece, fmt="%d", delimiter=" ")
        names.append(name)
    return names


def make_graph() -> Graph:
    rng = np.random.default_rng(0)
    num_nodes = {t: sum(c) for t, c in NODES.items()}
    edges, edge_data = {}, {}
    for key, (_, counts) in EDGES.items():
        src_type, rel, dst_type = key.split(":")
        e = sum(counts)
        edges[(src_type, rel, dst_type)] = np.stack([rng.integers(0, num_nodes[src_type], e),
                                                     rng.integers(0, num_nodes[dst_type], e)])
        edge_data[(src_type, rel, dst_type)] = {
            "weight": rng.random(e).astype(np.float32)}
    paper = num_nodes["paper"]
    node_data = {
        "author": {"feat": rng.random((num_nodes["author"], 2)).astype(np.float32)},
        "paper": {"feat": rng.random((paper, 3)).astype(np.float32),
                  "label": rng.integers(0, 4, paper),
                  "year": rng.integers(2000, 2024, paper)},
        "venue": {"feat": rng.random((num_nodes["venue"], 4)).astype(np.float32)},
    }
    splits = {"paper": {"train": np.array([0, 1, 2, 5, 6, 9]), "val": np.array([3, 7]),
                        "test": np.array([4, 8, 10])}}
    return Graph(name="tiny_mag", num_nodes=num_nodes, edges=edges, node_data=node_data,
                 edge_data=edge_data, splits=splits)


def write_dgl(root, graph: Graph) -> dict:
    """`graph` in DGL's chunked format under root, as DGL's chunk_graph lays it out (edges
    in csv, numpy and parquet; node data in numpy and both parquet styles, chunked
    otherwise than the nodes; masks of three dtypes). Returns its metadata."""
    root = str(root)
    meta = {"graph_name": graph.name, "node_type": list(NODES),
            "num_nodes_per_chunk": list(NODES.values()),
            "edge_type": list(EDGES), "num_edges_per_chunk": [c for _, c in EDGES.values()],
            "edges": {}, "node_data": {}, "edge_data": {}}
    for key, (fmt, counts) in EDGES.items():
        rel = tuple(key.split(":"))
        pairs = graph.edges[rel].T.copy()
        spec = {"name": fmt, "delimiter": " "} if fmt == "csv" else {"name": fmt}
        meta["edges"][key] = {"format": spec, "data": write_files(
            root, f"edge_index/{key}", fmt, split_rows(pairs, counts))}
        # edge data chunked otherwise than the edges: one file, or thirds
        weight = graph.edge_data[rel]["weight"]
        wfmt = "parquet" if fmt == "numpy" else "numpy"
        pieces = [weight] if fmt == "csv" else np.array_split(weight, 3)
        meta["edge_data"][key] = {"weight": {"format": {"name": wfmt}, "data": write_files(
            root, f"edge_data/{key}/weight", wfmt, pieces)}}
    nd = graph.node_data
    n_paper = graph.num_nodes["paper"]
    masks = {name: np.isin(np.arange(n_paper), graph.splits["paper"][split])
             for name, split in (("train_mask", "train"), ("val_mask", "val"),
                                 ("test_mask", "test"))}
    arrays = {
        "author": {"feat": ("parquet", nd["author"]["feat"], NODES["author"], {})},
        "paper": {"feat": ("numpy", nd["paper"]["feat"], NODES["paper"], {}),
                  "label": ("numpy", nd["paper"]["label"], NODES["paper"], {}),
                  "year": ("parquet", nd["paper"]["year"], [6, 5], {}),
                  "train_mask": ("numpy", masks["train_mask"], NODES["paper"], {}),
                  "val_mask": ("parquet", masks["val_mask"].astype(np.int8), [11], {}),
                  "test_mask": ("numpy", masks["test_mask"].astype(np.uint8), [5, 6], {})},
        "venue": {"feat": ("parquet", nd["venue"]["feat"], NODES["venue"],
                           {"vector_rows": True})},
    }
    for t, named in arrays.items():
        meta["node_data"][t] = {
            name: {"format": {"name": fmt}, "data": write_files(
                root, f"node_data/{t}/{name}", fmt, split_rows(values, counts), **kw)}
            for name, (fmt, values, counts, kw) in named.items()}
    write_meta(root, meta)
    return meta


def write_meta(root, meta: dict) -> None:
    with open(os.path.join(str(root), "metadata.json"), "w") as f:
        json.dump(meta, f, indent=1)


@pytest.fixture
def dgl_dir(tmp_path):
    """(DGL chunked directory, the same graph as jgraph's .npz, its metadata.json)."""
    graph = make_graph()
    npz = tmp_path / "tiny_mag.npz"
    save_npz(graph, npz)
    meta = write_dgl(tmp_path / "dgl", graph)
    return tmp_path / "dgl", npz, meta


def assert_same_graph(got: Graph, want: Graph) -> None:
    assert list(got.num_nodes.items()) == list(want.num_nodes.items())
    assert got.relations == want.relations
    for rel in want.relations:
        np.testing.assert_array_equal(got.edges[rel], want.edges[rel])
    assert got.node_data.keys() == want.node_data.keys()
    for t, named in want.node_data.items():
        assert got.node_data[t].keys() == named.keys(), t
        for name, values in named.items():
            assert got.node_data[t][name].dtype == values.dtype, (t, name)
            np.testing.assert_array_equal(got.node_data[t][name], values)
    assert got.edge_data.keys() == want.edge_data.keys()
    for rel, named in want.edge_data.items():
        assert got.edge_data[rel].keys() == named.keys()
        for name, values in named.items():
            assert got.edge_data[rel][name].dtype == values.dtype
            np.testing.assert_array_equal(got.edge_data[rel][name], values)
    assert {t for t, s in got.splits.items() if s} == {t for t, s in want.splits.items() if s}
    for t, named in want.splits.items():
        assert got.splits.get(t, {}).keys() == named.keys(), t
        for name, ids in named.items():
            np.testing.assert_array_equal(got.splits[t][name], ids)


# -- the same graph as the .npz ---------------------------------------------------------


def test_dgl_directory_converts_to_the_graph_the_npz_holds_edge_for_edge(dgl_dir, tmp_path):
    root, npz, _ = dgl_dir
    assert is_dgl_chunked_dir(root) and not is_chunked_dir(root)
    out = tmp_path / "out"
    convert_dgl(root, out, edges_per_chunk=2, rows_per_chunk=3)
    assert is_chunked_dir(out) and not is_dgl_chunked_dir(out)
    assert_same_graph(load_chunked(out), load_npz(npz))
    chunked = open_chunked(out)
    assert chunked.name == "tiny_mag"
    assert chunked.num_edge_chunks == (3 + 2) + (3 + 3) + (4 + 2)     # blocks of <= 2 edges
    assert max(chunked.edges["src"].rows) == 2
    assert max(max(c.rows) for named in chunked.node_data.values() for c in named.values()) <= 3


def test_chunk_sizes_do_not_change_the_graph(dgl_dir, tmp_path):
    root, npz, _ = dgl_dir
    convert_dgl(root, tmp_path / "big", edges_per_chunk=1000, rows_per_chunk=1000)
    convert_dgl(root, tmp_path / "one", edges_per_chunk=1, rows_per_chunk=1)
    for out in ("big", "one"):
        assert_same_graph(load_chunked(tmp_path / out), load_npz(npz))


def test_convert_dispatches_a_dgl_directory_to_the_streaming_reader(dgl_dir, tmp_path):
    root, npz, _ = dgl_dir
    convert(root, tmp_path / "out", edges_per_chunk=4, rows_per_chunk=5)
    assert_same_graph(load_chunked(tmp_path / "out"), load_npz(npz))


def test_csv_edges_are_read_without_pyarrow_csv_alike(dgl_dir, tmp_path, monkeypatch):
    root, npz, _ = dgl_dir
    monkeypatch.setitem(sys.modules, "pyarrow.csv", None)      # import fails: numpy reads
    convert_dgl(root, tmp_path / "out", edges_per_chunk=2, rows_per_chunk=3)
    assert_same_graph(load_chunked(tmp_path / "out"), load_npz(npz))


def test_graphstorm_counts_per_type_and_named_parquet_columns_are_read(dgl_dir, tmp_path):
    """GSProcessing writes num_nodes_per_type / num_edges_per_type and row_counts instead
    of the per-chunk counts, and parquet edges with named columns."""
    root, npz, meta = dgl_dir
    meta["num_nodes_per_type"] = [sum(c) for c in meta.pop("num_nodes_per_chunk")]
    meta["num_edges_per_type"] = [sum(c) for c in meta.pop("num_edges_per_chunk")]
    key = "paper:published_in:venue"
    for name in meta["edges"][key]["data"]:
        path = os.path.join(root, name)
        table = pq.read_table(path)
        pq.write_table(table.rename_columns(["src_int_id", "dst_int_id"]), path)
    meta["edges"][key]["row_counts"] = EDGES[key][1]
    meta["edges"][key]["format"] = {"name": "parquet", "delimiter": ""}
    write_meta(root, meta)
    convert_dgl(root, tmp_path / "out", edges_per_chunk=3, rows_per_chunk=4)
    assert_same_graph(load_chunked(tmp_path / "out"), load_npz(npz))


def test_a_parquet_edges_file_of_several_row_groups_is_read_a_row_group_at_a_time(
        dgl_dir, tmp_path, monkeypatch):
    """pyarrow keeps every row group a reader has decoded until that reader ends: each
    reader must cover one block's row groups, not the whole file."""
    root, npz, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["paper:published_in:venue"]["data"][0])
    pq.write_table(pq.read_table(path), path, row_group_size=2)     # 7 edges: 2+2+2+1
    with pq.ParquetFile(path) as f:
        assert f.num_row_groups == 4
    read, readers = pq.ParquetFile.iter_batches, []

    def iter_batches(self, *args, row_groups=None, **kwargs):
        if self.num_row_groups > 1:     # the file rewritten above: rows each reader covers
            groups = range(self.num_row_groups) if row_groups is None else row_groups
            readers.append(sum(self.metadata.row_group(g).num_rows for g in groups))
        return read(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    convert_dgl(root, tmp_path / "out", edges_per_chunk=2, rows_per_chunk=3)
    assert readers == [2, 2, 2, 1]
    assert_same_graph(load_chunked(tmp_path / "out"), load_npz(npz))


def test_absolute_paths_in_metadata_are_read_as_given(dgl_dir, tmp_path):
    root, npz, meta = dgl_dir
    entry = meta["node_data"]["paper"]["feat"]
    entry["data"] = [os.path.join(str(root), p) for p in entry["data"]]
    write_meta(root, meta)
    convert_dgl(root, tmp_path / "out")
    assert_same_graph(load_chunked(tmp_path / "out"), load_npz(npz))


def test_load_dataset_refuses_a_dgl_directory_naming_the_convert_command(dgl_dir):
    root, _, _ = dgl_dir
    with pytest.raises(DatasetError, match="jgraph convert"):
        load_dataset(str(root))


def test_cli_convert_reads_a_dgl_directory(dgl_dir, tmp_path, capsys):
    root, npz, _ = dgl_dir
    out = tmp_path / "out"
    code = main(["convert", str(root), str(out), "--edges-per-chunk", "4"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "tiny_mag: 23 nodes, 31 edges" in printed
    assert_same_graph(load_chunked(out), load_npz(npz))


# -- bad input: a DatasetError naming the file, nothing written ------------------------


def refused(root, out, *words) -> str:
    with pytest.raises(DatasetError) as caught:
        convert_dgl(root, out, edges_per_chunk=2, rows_per_chunk=3)
    message = str(caught.value)
    for word in words:
        assert str(word) in message, (word, message)
    assert not os.path.exists(out)
    return message


def test_a_missing_edges_file_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["paper:cites:paper"]["data"][1])
    os.remove(path)
    refused(root, tmp_path / "out", path, "missing", "edges['paper:cites:paper']")


def test_a_missing_node_data_file_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["node_data"]["author"]["feat"]["data"][0])
    os.remove(path)
    refused(root, tmp_path / "out", path, "missing")


def test_a_csv_chunk_longer_than_num_edges_per_chunk_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["author:writes:paper"]["data"][2])
    with open(path, "a") as f:
        f.write("0 0\n")
    refused(root, tmp_path / "out", path, "holds more than the 4 rows")


def test_a_numpy_chunk_that_disagrees_with_num_edges_per_chunk_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    meta["num_edges_per_chunk"][1] = [5, 6]
    write_meta(root, meta)
    path = os.path.join(root, meta["edges"]["paper:cites:paper"]["data"][0])
    refused(root, tmp_path / "out", path, "holds 6 rows", "says 5")


def test_node_data_rows_that_disagree_with_num_nodes_per_chunk_are_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    meta["num_nodes_per_chunk"][1] = [4, 4, 2]      # paper: 10 nodes, its files hold 11
    write_meta(root, meta)
    refused(root, tmp_path / "out", "node_data['paper']", "10 nodes", "11 rows")


def test_counts_per_type_that_disagree_with_counts_per_chunk_are_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    meta["num_nodes_per_type"] = [7, 12, 5]
    write_meta(root, meta)
    refused(root, tmp_path / "out", "metadata.json", "num_nodes_per_type", "'paper'")


def test_edge_data_rows_that_disagree_with_the_edges_are_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    entry = meta["edge_data"]["author:writes:paper"]["weight"]
    path = os.path.join(root, entry["data"][0])
    np.save(path, np.zeros(10, np.float32))
    refused(root, tmp_path / "out", path, "edge_data['author:writes:paper']['weight']",
            "9 edges")


@pytest.mark.parametrize("fmt_key", ["author:writes:paper", "paper:cites:paper",
                                     "paper:published_in:venue"])
def test_an_id_out_of_range_for_its_type_is_named(dgl_dir, tmp_path, fmt_key):
    root, _, meta = dgl_dir
    fmt, counts = EDGES[fmt_key]
    path = os.path.join(root, meta["edges"][fmt_key]["data"][-1])
    pairs = np.zeros((counts[-1], 2), np.int64)
    pairs[-1, 1] = 11 if fmt_key.endswith("paper") else 5       # one past the last node
    if fmt == "csv":
        np.savetxt(path, pairs, fmt="%d", delimiter=" ")
    elif fmt == "numpy":
        np.save(path, pairs)
    else:
        write_parquet(path, pairs)
    dst_type = fmt_key.split(":")[2]
    refused(root, tmp_path / "out", path, "destination id", "out of range",
            f"node type {dst_type!r}", "line 4" if fmt == "csv" else f"row {counts[-1] - 1}")


def test_a_negative_source_id_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["author:writes:paper"]["data"][0])
    with open(path) as f:
        lines = f.read().splitlines()
    lines[1] = "-1 " + lines[1].split()[1]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    refused(root, tmp_path / "out", path, "source id -1 at line 2", "'author'")


def test_an_unknown_format_name_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    meta["node_data"]["paper"]["year"]["format"] = {"name": "hdf5"}
    write_meta(root, meta)
    refused(root, tmp_path / "out", "metadata.json", "node_data['paper']['year']", "'hdf5'",
            "numpy")


def test_a_truncated_npy_file_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["node_data"]["paper"]["feat"]["data"][1])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 8)
    refused(root, tmp_path / "out", path, "truncated")


def test_a_truncated_parquet_file_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["paper:published_in:venue"]["data"][0])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    refused(root, tmp_path / "out", path, "parquet")


def test_a_mask_holding_other_values_than_0_and_1_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["node_data"]["paper"]["test_mask"]["data"][1])
    np.save(path, np.array([0, 1, 2, 0, 0, 1], np.uint8))
    refused(root, tmp_path / "out", path, "test_mask", "0 or 1", "node 7")


def test_a_malformed_csv_line_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    path = os.path.join(root, meta["edges"]["author:writes:paper"]["data"][0])
    with open(path, "a") as f:
        f.write("3 x\n")
    refused(root, tmp_path / "out", path)


def test_relation_names_used_by_two_edge_types_are_refused(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    key = "paper:published_in:venue"
    renamed = "paper:cites:venue"
    meta["edge_type"][2] = renamed
    meta["edges"][renamed] = meta["edges"].pop(key)
    meta["edge_data"][renamed] = meta["edge_data"].pop(key)
    write_meta(root, meta)
    refused(root, tmp_path / "out", "metadata.json", "['cites']", "more than one edge type")


def test_edge_data_given_for_some_edge_types_only_is_refused(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    del meta["edge_data"]["paper:cites:paper"]
    write_meta(root, meta)
    refused(root, tmp_path / "out", "metadata.json", "'weight'", "paper:cites:paper")


def test_an_unknown_node_type_in_edge_type_is_named(dgl_dir, tmp_path):
    root, _, meta = dgl_dir
    meta["edge_type"][0] = "writer:writes:paper"
    write_meta(root, meta)
    refused(root, tmp_path / "out", "metadata.json", "'writer'")


def test_an_existing_output_is_kept_unless_overwrite(dgl_dir, tmp_path):
    root, npz, _ = dgl_dir
    out = tmp_path / "out"
    convert_dgl(root, out)
    with pytest.raises(DatasetError, match="overwrite"):
        convert_dgl(root, out)
    convert_dgl(root, out, overwrite=True, edges_per_chunk=5)
    assert_same_graph(load_chunked(out), load_npz(npz))
