"""load_ogb on small OGB-layout directories written here from random arrays."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from jgraph.data import (
    DEFAULT_NTYPE,
    DEFAULT_REL,
    DatasetError,
    Graph,
    Relation,
    load_dataset,
    load_ogb,
)

N = DEFAULT_NTYPE
E = Relation(N, DEFAULT_REL, N)


# -- writing OGB's files ------------------------------------------------------------------------


def _write_csv(path: Path, rows, header: list[str] | None = None) -> None:
    """A headerless (unless given) comma-separated .csv.gz, as OGB's zips unpack."""
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.asarray(rows)
    if a.ndim == 1:
        a = a[:, None]
    lines = [",".join(header)] if header else []
    for row in a:
        cells = []
        for v in row:
            if isinstance(v, (float, np.floating)):
                cells.append("nan" if np.isnan(v) else format(float(np.float32(v)), ".9g"))
            else:
                cells.append(str(int(v)))
        lines.append(",".join(cells))
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def _subset(rng, n: int, k: int) -> np.ndarray:
    """k distinct node ids in random (unsorted) order, as OGB split files list them."""
    return rng.permutation(n)[:k]


def _write_splits(directory: Path, rng, n: int) -> dict[str, np.ndarray]:
    perm = rng.permutation(n)
    parts = {"train": perm[: n // 2], "valid": perm[n // 2: 3 * n // 4], "test": perm[3 * n // 4:]}
    for name, ids in parts.items():
        _write_csv(directory / f"{name}.csv.gz", ids)
    return parts


def _write_homogeneous(root: Path, rng, n=40, e=150, d=5, nan_labels=False, edge_feat=False):
    raw = root / "raw"
    src, dst = rng.integers(n, size=e), rng.integers(n, size=e)
    feat = rng.standard_normal((n, d)).astype(np.float32)
    label = rng.integers(0, 6, size=n).astype(np.float64)
    if nan_labels:
        label[rng.random(n) < 0.4] = np.nan
    year = rng.integers(1990, 2021, size=n)
    _write_csv(raw / "edge.csv.gz", np.stack([src, dst], 1))
    _write_csv(raw / "num-node-list.csv.gz", [n])
    _write_csv(raw / "num-edge-list.csv.gz", [e])
    _write_csv(raw / "node-feat.csv.gz", feat)
    if nan_labels:
        _write_csv(raw / "node-label.csv.gz", label)
    else:
        _write_csv(raw / "node-label.csv.gz", label.astype(np.int64))
    _write_csv(raw / "node_year.csv.gz", year)
    out = dict(src=src, dst=dst, feat=feat, label=label, year=year, n=n)
    if edge_feat:
        efeat = rng.random((e, 3)).astype(np.float32)
        _write_csv(raw / "edge-feat.csv.gz", efeat)
        out["edge_feat"] = efeat
    out["splits"] = _write_splits(root / "split" / "time", rng, n)
    return out


def _expected_label(label: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(label), -1, label).astype(np.int64)


def _check_splits(splits: dict, written: dict) -> None:
    assert sorted(splits) == ["test", "train", "val"]       # OGB's 'valid' becomes 'val'
    for ogb_name, name in (("train", "train"), ("valid", "val"), ("test", "test")):
        assert splits[name].dtype == np.int64
        np.testing.assert_array_equal(splits[name], np.sort(written[ogb_name]))


def _check_homogeneous(g: Graph, w: dict) -> None:
    assert g.is_homogeneous
    assert g.num_nodes == {N: w["n"]}
    assert g.edges[E].dtype == np.int64
    np.testing.assert_array_equal(g.edges[E], np.stack([w["src"], w["dst"]]))
    nd = g.node_data[N]
    assert nd["feat"].dtype == np.float32
    np.testing.assert_array_equal(nd["feat"], w["feat"])
    assert nd["label"].dtype == np.int64 and nd["label"].shape == (w["n"],)
    np.testing.assert_array_equal(nd["label"], _expected_label(w["label"]))
    assert nd["year"].dtype == np.int64
    np.testing.assert_array_equal(nd["year"], w["year"])
    _check_splits(g.splits[N], w["splits"])


# -- homogeneous ----------------------------------------------------------------------------


def test_homogeneous_csv_dataset_loads_every_array_as_written(tmp_path):
    root = tmp_path / "ogbn_tiny"
    w = _write_homogeneous(root, np.random.default_rng(0))
    g = load_ogb(root)
    assert g.name == "ogbn_tiny"
    _check_homogeneous(g, w)
    assert sorted(g.node_data[N]) == ["feat", "label", "year"]
    assert g.edge_data == {}


def test_load_dataset_reads_an_ogb_directory_like_load_ogb(tmp_path):
    root = tmp_path / "ogbn_tiny"
    w = _write_homogeneous(root, np.random.default_rng(1))
    g = load_dataset(str(root))
    _check_homogeneous(g, w)
    assert g.name == "ogbn_tiny"


def test_nan_labels_become_minus_one(tmp_path):
    root = tmp_path / "ogbn_nan"
    w = _write_homogeneous(root, np.random.default_rng(2), nan_labels=True)
    assert np.isnan(w["label"]).sum() > 0 and (~np.isnan(w["label"])).sum() > 0
    g = load_ogb(root)
    _check_homogeneous(g, w)
    label = g.node_data[N]["label"]
    np.testing.assert_array_equal(label == -1, np.isnan(w["label"]))


def test_edge_features_load_as_float32_edge_data(tmp_path):
    root = tmp_path / "ogbn_efeat"
    w = _write_homogeneous(root, np.random.default_rng(3), edge_feat=True)
    g = load_ogb(root)
    _check_homogeneous(g, w)
    ef = g.edge_data[E]["feat"]
    assert ef.dtype == np.float32 and ef.shape == w["edge_feat"].shape
    np.testing.assert_array_equal(ef, w["edge_feat"])


def test_isolated_trailing_nodes_counted_from_num_node_list(tmp_path):
    # Nodes with no edges at the end of the id range exist only in num-node-list.
    root = tmp_path / "ogbn_iso"
    rng = np.random.default_rng(4)
    raw = root / "raw"
    _write_csv(raw / "edge.csv.gz", np.array([[0, 1], [2, 0], [1, 2]]))
    _write_csv(raw / "num-node-list.csv.gz", [10])
    _write_csv(raw / "num-edge-list.csv.gz", [3])
    parts = _write_splits(root / "split" / "time", rng, 10)
    g = load_ogb(root)
    assert g.num_nodes == {N: 10}
    np.testing.assert_array_equal(g.edges[E], [[0, 2, 1], [1, 0, 2]])
    _check_splits(g.splits[N], parts)


def test_papers100m_binary_layout_loads_every_array(tmp_path):
    rng = np.random.default_rng(5)
    n, e, d = 60, 240, 4
    root = tmp_path / "ogbn_papers_tiny"
    (root / "raw").mkdir(parents=True)
    edge_index = rng.integers(n, size=(2, e)).astype(np.int64)
    node_feat = rng.standard_normal((n, d)).astype(np.float32)
    node_year = rng.integers(1950, 2021, size=(n, 1)).astype(np.int64)
    np.savez_compressed(root / "raw" / "data.npz", edge_index=edge_index, node_feat=node_feat,
                        num_nodes_list=np.array([n], np.int64), node_year=node_year)
    label = rng.integers(0, 172, size=(n, 1)).astype(np.float32)
    label[rng.random(n) < 0.7] = np.nan
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=label)
    parts = _write_splits(root / "split" / "time", rng, n)

    for g in (load_ogb(root), load_dataset(str(root))):
        assert g.num_nodes == {N: n}
        np.testing.assert_array_equal(g.edges[E], edge_index)
        nd = g.node_data[N]
        assert nd["feat"].dtype == np.float32
        np.testing.assert_array_equal(nd["feat"], node_feat)
        assert nd["year"].shape == (n,)
        np.testing.assert_array_equal(nd["year"], node_year[:, 0])
        assert nd["label"].dtype == np.int64 and nd["label"].shape == (n,)
        np.testing.assert_array_equal(nd["label"], _expected_label(label[:, 0]))
        assert np.any(nd["label"] == -1) and np.any(nd["label"] >= 0)
        _check_splits(g.splits[N], parts)


# -- heterogeneous (ogbn-mag) ---------------------------------------------------------------------


def _write_mag(root: Path, rng):
    raw = root / "raw"
    num_nodes = {"author": 30, "field_of_study": 12, "institution": 5, "paper": 40}
    rels = [Relation("author", "affiliated_with", "institution"),
            Relation("author", "writes", "paper"),
            Relation("paper", "cites", "paper"),
            Relation("paper", "has_topic", "field_of_study")]
    _write_csv(raw / "num-node-dict.csv.gz", [list(num_nodes.values())], header=list(num_nodes))
    with gzip.open(raw / "triplet-type-list.csv.gz", "wt") as f:
        f.write("".join(",".join(r) + "\n" for r in rels))
    edges, reltype = {}, {}
    for i, rel in enumerate(rels):
        e = int(rng.integers(20, 60))
        index = np.stack([rng.integers(num_nodes[rel.src_type], size=e),
                          rng.integers(num_nodes[rel.dst_type], size=e)])
        rel_dir = raw / "relations" / "___".join(rel)
        _write_csv(rel_dir / "edge.csv.gz", index.T)
        _write_csv(rel_dir / "num-edge-list.csv.gz", [e])
        _write_csv(rel_dir / "edge_reltype.csv.gz", np.full(e, i))
        edges[rel], reltype[rel] = index, np.full(e, i)
    n_paper = num_nodes["paper"]
    feat = rng.standard_normal((n_paper, 6)).astype(np.float32)
    year = rng.integers(2010, 2020, size=n_paper)
    label = rng.integers(0, 349, size=n_paper)
    _write_csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", feat)
    _write_csv(raw / "node-feat" / "paper" / "node_year.csv.gz", year)
    _write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", label)
    parts = _write_splits(root / "split" / "time" / "paper", rng, n_paper)
    return dict(num_nodes=num_nodes, rels=rels, edges=edges, reltype=reltype, feat=feat,
                year=year, label=label, splits=parts)


def _check_mag(g: Graph, w: dict) -> None:
    assert list(g.num_nodes.items()) == list(w["num_nodes"].items())
    assert list(g.relations) == w["rels"]
    for rel in w["rels"]:
        assert g.edges[rel].dtype == np.int64
        np.testing.assert_array_equal(g.edges[rel], w["edges"][rel], err_msg=str(rel))
        assert sorted(g.edge_data[rel]) == ["edge_reltype"]
        rt = g.edge_data[rel]["edge_reltype"]
        assert rt.dtype == np.int64
        np.testing.assert_array_equal(rt, w["reltype"][rel])
    paper = g.node_data["paper"]
    assert sorted(paper) == ["feat", "label", "year"]
    assert paper["feat"].dtype == np.float32
    np.testing.assert_array_equal(paper["feat"], w["feat"])
    np.testing.assert_array_equal(paper["year"], w["year"])
    assert paper["label"].dtype == np.int64
    np.testing.assert_array_equal(paper["label"], w["label"])
    for t in ("author", "field_of_study", "institution"):
        assert g.node_data.get(t, {}) == {}
    assert [t for t, s in g.splits.items() if s] == ["paper"]
    _check_splits(g.splits["paper"], w["splits"])


def test_mag_style_heterogeneous_dataset_loads_every_array_as_written(tmp_path):
    root = tmp_path / "ogbn_mag_tiny"
    w = _write_mag(root, np.random.default_rng(6))
    g = load_ogb(root)
    assert g.name == "ogbn_mag_tiny"
    _check_mag(g, w)
    # Homogeneous ids put the types in num-node-dict order.
    np.testing.assert_array_equal(g.type_offsets(), [0, 30, 42, 47, 87])


def test_load_dataset_reads_a_mag_style_directory(tmp_path):
    root = tmp_path / "ogbn_mag_tiny"
    w = _write_mag(root, np.random.default_rng(7))
    _check_mag(load_dataset(str(root)), w)


# -- splits and errors -----------------------------------------------------------------


def test_named_split_is_chosen_and_a_missing_one_lists_the_available(tmp_path):
    root = tmp_path / "ogbn_two_splits"
    rng = np.random.default_rng(8)
    w = _write_homogeneous(root, rng)
    species = _write_splits(root / "split" / "species", rng, w["n"])
    _check_splits(load_ogb(root, split="time").splits[N], w["splits"])
    _check_splits(load_ogb(root, split="species").splits[N], species)
    with pytest.raises(DatasetError, match="no split named 'random'") as info:
        load_ogb(root, split="random")
    msg = str(info.value)
    assert "['species', 'time']" in msg
    assert str(root / "split") in msg


def test_directory_that_is_not_ogb_raises_naming_it(tmp_path):
    root = tmp_path / "not_ogb"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "readme.txt").write_text("hello")
    with pytest.raises(DatasetError, match="not an OGB dataset directory") as info:
        load_ogb(root)
    assert str(root) in str(info.value)
    with pytest.raises(DatasetError, match="not an OGB dataset directory") as info:
        load_dataset(str(root))
    assert str(root) in str(info.value)
    with pytest.raises(DatasetError, match="no such directory"):
        load_ogb(tmp_path / "absent")


def test_unreadable_edge_csv_raises_naming_the_file(tmp_path):
    root = tmp_path / "ogbn_bad"
    raw = root / "raw"
    raw.mkdir(parents=True)
    with gzip.open(raw / "edge.csv.gz", "wt") as f:
        f.write("0,1\nx,y\n")
    _write_csv(raw / "num-node-list.csv.gz", [3])
    with pytest.raises(DatasetError, match="cannot be read as numbers") as info:
        load_ogb(root)
    assert str(raw / "edge.csv.gz") in str(info.value)


def test_edge_id_beyond_num_node_list_raises_naming_directory_and_id(tmp_path):
    root = tmp_path / "ogbn_range"
    raw = root / "raw"
    _write_csv(raw / "edge.csv.gz", np.array([[0, 1], [1, 4]]))
    _write_csv(raw / "num-node-list.csv.gz", [3])
    with pytest.raises(DatasetError) as info:
        load_ogb(root)
    msg = str(info.value)
    assert str(root) in msg and "id 4" in msg and "destination" in msg


@pytest.mark.parametrize("rows", [None, 3])
def test_pandas_and_numpy_read_the_same_arrays(tmp_path, monkeypatch, rows):
    """OGB's csv files parse through pandas where installed (the `ogb` extra) and numpy's
    loadtxt otherwise: the same arrays either way, whole or in blocks, NaNs kept, and
    the same error naming the file."""
    import sys

    from jgraph.data.ogb import csv_blocks
    pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    floats = rng.standard_normal((10, 4)).astype(np.float32)
    floats[3, 1] = np.nan
    _write_csv(tmp_path / "feat.csv.gz", floats)
    _write_csv(tmp_path / "edge.csv.gz", rng.integers(0, 2**40, size=(7, 2)))
    (tmp_path / "empty.csv.gz").write_bytes(gzip.compress(b""))
    cases = [("feat.csv.gz", np.float64), ("edge.csv.gz", np.int64),
             ("empty.csv.gz", np.int64)]
    by_pandas = [list(csv_blocks(str(tmp_path / f), t, rows)) for f, t in cases]
    monkeypatch.setitem(sys.modules, "pandas", None)           # import raises ImportError
    by_numpy = [list(csv_blocks(str(tmp_path / f), t, rows)) for f, t in cases]
    for (name, dtype), a, b in zip(cases, by_pandas, by_numpy):
        assert [x.shape for x in a] == [x.shape for x in b], name
        for x, y in zip(a, b):
            assert x.dtype == y.dtype == dtype
            np.testing.assert_array_equal(x, y)
    assert np.isnan(np.concatenate(by_pandas[0])[3, 1])
    assert len(by_pandas[0]) == (1 if rows is None else 4)
    assert by_pandas[2][0].shape == (0, 1)
