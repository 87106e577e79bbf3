"""The partition book against brute force, and every bad input as a clear error."""
import json
import os

import numpy as np
import pytest

from jgraph.data import Graph, GraphError, load_dataset
from jgraph.partition import (
    IdRangeError,
    PartitionBook,
    PartitionError,
    PartitionFormatError,
    open_partitions,
    partition_graph,
)


def random_book(rng, num_parts=5, num_types=3):
    counts = rng.integers(0, 6, size=(num_parts, num_types))
    counts[:, 0] += 1                                   # no empty partition
    counts[2, 1] = 0                                    # a part without type 1
    offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    ntype_offsets = offsets[:-1, None] + np.concatenate(
        [np.zeros((num_parts, 1), int), np.cumsum(counts, axis=1)], axis=1)
    return PartitionBook(offsets, ntype_offsets, tuple(f"t{i}" for i in range(num_types))), counts


def test_book_lookups_equal_brute_force():
    rng = np.random.default_rng(0)
    book, counts = random_book(rng)
    owner, ntype, local = [], [], []
    seen = np.zeros(counts.shape[1], int)
    for p in range(counts.shape[0]):
        for t in range(counts.shape[1]):
            for _ in range(counts[p, t]):
                owner.append(p), ntype.append(t), local.append(seen[t])
                seen[t] += 1
    ids = np.arange(book.num_nodes)
    assert book.owner(ids).tolist() == owner
    assert book.ntype(ids).tolist() == ntype
    t, loc = book.to_type_local(ids)
    assert t.tolist() == ntype and loc.tolist() == local
    for ti in range(counts.shape[1]):
        mine = ids[np.array(ntype) == ti]
        assert np.array_equal(book.to_global(ti, np.arange(mine.size)), mine)


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_book_rejects_ids_out_of_range(bad):
    book, _ = random_book(np.random.default_rng(1))
    with pytest.raises(IdRangeError, match=str(bad)):
        book.owner([0, bad])


# -- bad input -----------------------------------------------------------------------

@pytest.mark.parametrize("src,dst,what", [([0, 5], [1, 2], "5"), ([0, -1], [1, 2], "-1")])
def test_edge_id_out_of_range_is_a_clear_error(src, dst, what):
    with pytest.raises(GraphError, match=rf"id {what}\b.*out of range \[0, 5\)"):
        Graph.homogeneous(src, dst, num_nodes=5)


def test_feature_rows_must_match_node_count():
    with pytest.raises(GraphError, match=r"'feat'.*4 rows, expected 5"):
        Graph.homogeneous([0], [1], num_nodes=5, node_data={"feat": np.zeros((4, 2))})


@pytest.mark.parametrize("num_parts", [0, -2, 2709])
def test_num_parts_out_of_range_is_a_clear_error(tmp_path, num_parts):
    with pytest.raises(PartitionError, match=str(num_parts)):
        partition_graph(load_dataset("cora"), num_parts, "metis", tmp_path / "p")
    assert not (tmp_path / "p").exists()           # rejected before anything is written


def test_unknown_method_is_a_clear_error(tmp_path):
    with pytest.raises(PartitionError, match="'spectral'.*metis.*random"):
        partition_graph(load_dataset("cora"), 2, "spectral", tmp_path / "p")


def test_refuses_to_overwrite_unless_asked(tmp_path):
    graph = load_dataset("cora")
    partition_graph(graph, 2, "random", tmp_path / "p")
    with pytest.raises(PartitionError, match="not empty"):
        partition_graph(graph, 3, "random", tmp_path / "p")
    partition_graph(graph, 3, "random", tmp_path / "p", overwrite=True)
    assert open_partitions(tmp_path / "p").num_parts == 3
    assert not os.path.exists(tmp_path / "p" / "part-3")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(PartitionError, match="not a jgraph partition directory"):
        partition_graph(graph, 2, "random", tmp_path / "other", overwrite=True)


# -- corrupt or missing partition directories ------------------------------------------

@pytest.fixture
def cora_parts(tmp_path):
    partition_graph(load_dataset("cora"), 3, "metis", tmp_path / "p")
    return tmp_path / "p"


def test_missing_directory(tmp_path):
    with pytest.raises(PartitionFormatError, match="no such partition directory"):
        open_partitions(tmp_path / "nowhere")


def test_missing_meta_json(cora_parts):
    os.remove(cora_parts / "meta.json")
    with pytest.raises(PartitionFormatError, match="meta.json: missing"):
        open_partitions(cora_parts)


def test_corrupt_meta_json(cora_parts):
    (cora_parts / "meta.json").write_text('{"format_version": 1, "num_p')
    with pytest.raises(PartitionFormatError, match="meta.json: not valid JSON"):
        open_partitions(cora_parts)


def test_unknown_format_version(cora_parts):
    meta = json.loads((cora_parts / "meta.json").read_text())
    meta["format_version"] = 99
    (cora_parts / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match="format_version 99 is not supported"):
        open_partitions(cora_parts)


def test_missing_partition_file_is_named(cora_parts):
    os.remove(cora_parts / "part-1" / "indices.npy")
    pg = open_partitions(cora_parts)
    pg.part(0)                                    # other partitions still load
    with pytest.raises(PartitionFormatError, match=r"part-1/indices.npy: missing"):
        pg.part(1)


def test_truncated_partition_file_is_named(cora_parts):
    path = cora_parts / "part-2" / "node" / "_N" / "feat.npy"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PartitionFormatError,
                       match=r"part-2/node/_N/feat.npy: corrupt or truncated"):
        open_partitions(cora_parts).part(2)


def test_wrong_shape_partition_file_is_named(cora_parts):
    np.save(cora_parts / "part-0" / "halo.npy", np.arange(3, dtype=np.int64))
    with pytest.raises(PartitionFormatError, match=r"part-0/halo.npy: shape \[3\], expected"):
        open_partitions(cora_parts).part(0)


def test_partition_index_out_of_range(cora_parts):
    with pytest.raises(PartitionFormatError, match="partition 3 does not exist"):
        open_partitions(cora_parts).part(3)


def test_one_partition_loads_without_reading_the_others(cora_parts):
    for k in (0, 2):
        for root, _, files in os.walk(cora_parts / f"part-{k}"):
            for f in files:
                os.remove(os.path.join(root, f))
    part = open_partitions(cora_parts).part(1)
    assert isinstance(part.indices, np.memmap)
    assert part.num_nodes == open_partitions(cora_parts).meta.parts[1].num_nodes
