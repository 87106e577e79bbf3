"""load_npz on the shared real datasets, save_npz/load_npz round trips, and bad files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse

from jgraph.data import (
    DEFAULT_NTYPE,
    DEFAULT_REL,
    DatasetError,
    Graph,
    Relation,
    SparseRows,
    load_dataset,
    load_npz,
    save_npz,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
N = DEFAULT_NTYPE
E = Relation(N, DEFAULT_REL, N)


def _shared(name: str) -> Path:
    path = DATA / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"shared dataset {name}.npz not found at {path}")
    return path


def _raw(name: str) -> dict:
    with np.load(_shared(name), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def assert_graphs_equal(a: Graph, b: Graph) -> None:
    """Every array of two graphs equal, with the same keys, order, dtypes and shapes."""
    assert a.name == b.name
    assert list(a.num_nodes.items()) == list(b.num_nodes.items())
    assert list(a.edges) == list(b.edges)
    for rel in a.edges:
        assert a.edges[rel].dtype == b.edges[rel].dtype
        np.testing.assert_array_equal(a.edges[rel], b.edges[rel], err_msg=str(rel))
    assert {t for t, d in a.node_data.items() if d} == {t for t, d in b.node_data.items() if d}
    for t in a.num_nodes:
        da, db = a.node_data.get(t, {}), b.node_data.get(t, {})
        assert sorted(da) == sorted(db), t
        for k in da:
            assert da[k].dtype == db[k].dtype, (t, k)
            assert da[k].shape == db[k].shape, (t, k)
            assert isinstance(da[k], SparseRows) == isinstance(db[k], SparseRows), (t, k)
            if isinstance(da[k], SparseRows):
                da[k], db[k] = da[k].toarray(), db[k].toarray()
            np.testing.assert_array_equal(da[k], db[k], err_msg=f"node data {t}/{k}")
    assert {r for r, d in a.edge_data.items() if d} == {r for r, d in b.edge_data.items() if d}
    for rel, da in a.edge_data.items():
        db = b.edge_data.get(rel, {})
        assert sorted(da) == sorted(db), rel
        for k in da:
            assert da[k].dtype == db[k].dtype, (rel, k)
            np.testing.assert_array_equal(da[k], db[k], err_msg=f"edge data {rel}/{k}")
    assert {t for t, s in a.splits.items() if s} == {t for t, s in b.splits.items() if s}
    for t, sa in a.splits.items():
        sb = b.splits.get(t, {})
        assert sorted(sa) == sorted(sb), t
        for k in sa:
            assert sa[k].dtype == sb[k].dtype
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=f"split {t}/{k}")


def _split_sizes(g: Graph, ntype: str) -> dict[str, int]:
    return {k: len(v) for k, v in g.splits[ntype].items()}


# -- the shared datasets ----------------------------------------------------------------------


def _check_cora(g: Graph, raw: dict | None = None) -> None:
    assert g.is_homogeneous
    assert g.num_nodes == {N: 2708}
    assert g.edges[E].shape == (2, 10556)
    feat = g.node_data[N]["feat"]
    assert feat.shape == (2708, 1433) and feat.dtype == np.float32
    assert set(np.unique(feat)) <= {0.0, 1.0}
    label = g.node_data[N]["label"]
    assert label.shape == (2708,) and np.unique(label).tolist() == list(range(7))
    sizes = _split_sizes(g, N)
    assert (sizes["train"], sizes["val"], sizes["test"]) == (140, 500, 1000)
    # Cora is stored symmetric, without self-loops or duplicates.
    src, dst = g.edges[E]
    pairs = set(zip(src.tolist(), dst.tolist()))
    assert len(pairs) == 10556
    assert all((d, s) in pairs for s, d in pairs)
    assert not np.any(src == dst)
    if raw is not None:
        np.testing.assert_array_equal(g.edges[E], np.stack([raw["src"], raw["dst"]]))
        np.testing.assert_array_equal(feat, raw["feat"])
        np.testing.assert_array_equal(label, raw["label"])
        for k in ("train", "val", "test"):
            np.testing.assert_array_equal(g.splits[N][k], raw[f"{k}_idx"])


def test_builtin_cora_loads_with_planetoid_counts():
    g = load_dataset("cora")
    assert g.name == "cora"
    _check_cora(g)


def test_shared_cora_loads_with_readme_counts_and_matches_builtin():
    path = _shared("cora")
    g = load_npz(path)
    assert g.name == "cora"
    _check_cora(g, _raw("cora"))
    assert_graphs_equal(g, load_dataset("cora"))


def test_load_dataset_accepts_an_npz_path():
    path = _shared("cora")
    assert_graphs_equal(load_dataset(str(path)), load_npz(path))


@pytest.mark.slow      # a 100 MB dense reference
def test_facebook_musae_loads_sparse_features_equal_to_scipys_matrix():
    raw = _raw("facebook_musae")
    g = load_npz(_shared("facebook_musae"))
    assert g.num_nodes == {N: 22470}
    assert g.edges[E].shape == (2, 171002)
    src, dst = g.edges[E]
    assert int(np.sum(src == dst)) == 179
    np.testing.assert_array_equal(src, raw["src"])
    np.testing.assert_array_equal(dst, raw["dst"])
    feat = g.node_data[N]["feat"]
    # At most 31 non-zeros of 4,714 per node: the features stay sparse.
    assert isinstance(feat, SparseRows) and feat.nnz_per_row == 31
    assert feat.shape == (22470, 4714)
    assert feat.dtype == np.float32
    ref = scipy.sparse.csr_matrix(
        (raw["feat_data"], raw["feat_indices"], raw["feat_indptr"]),
        shape=tuple(raw["feat_shape"])).toarray()
    np.testing.assert_array_equal(feat.toarray(), ref)
    assert int(np.count_nonzero(feat.values)) == raw["feat_data"].size
    assert np.unique(g.node_data[N]["label"]).tolist() == [0, 1, 2, 3]
    sizes = _split_sizes(g, N)
    assert (sizes["train"], sizes["val"], sizes["test"]) == (13482, 4494, 4494)
    assert "feat_indptr" not in g.node_data[N]


def test_aifb_loads_45_relations_with_edges_per_relation_as_in_raw_file():
    raw = _raw("aifb")
    g = load_npz(_shared("aifb"))
    assert g.num_nodes == {N: 8285}
    assert len(g.relations) == 45
    assert g.num_edges == 29043
    rel_names = [str(r) for r in raw["rel_names"]]
    assert [r.name for r in g.relations] == rel_names
    assert all(r.src_type == N and r.dst_type == N for r in g.relations)
    counts = np.bincount(raw["etype"], minlength=45)
    for r, rel in enumerate(g.relations):
        assert g.edges[rel].shape == (2, counts[r]), rel.name
        sel = raw["etype"] == r
        np.testing.assert_array_equal(g.edges[rel][0], raw["src"][sel])
        np.testing.assert_array_equal(g.edges[rel][1], raw["dst"][sel])
    label = g.node_data[N]["label"]
    assert label.shape == (8285,)
    assert sorted(np.unique(label).tolist()) == [-1, 0, 1, 2, 3]
    np.testing.assert_array_equal(g.node_data[N]["is_literal"], raw["node_is_literal"])
    sizes = _split_sizes(g, N)
    assert sizes == {"train": 140, "test": 36}
    assert np.all(label[g.splits[N]["train"]] >= 0)
    assert np.all(label[g.splits[N]["test"]] >= 0)
    src, dst, etype = g.homogeneous_edges()
    assert sorted(zip(src.tolist(), dst.tolist(), etype.tolist())) == sorted(
        zip(raw["src"].tolist(), raw["dst"].tolist(), raw["etype"].tolist()))


def test_heco_acm_loads_types_counts_and_dense_author_features():
    raw = _raw("heco_acm")
    g = load_npz(_shared("heco_acm"))
    assert list(g.num_nodes.items()) == [("paper", 4019), ("author", 7167), ("subject", 60)]
    assert g.relations == (("paper", "pa", "author"), ("paper", "ps", "subject"))
    assert g.edges[("paper", "pa", "author")].shape == (2, 13407)
    assert g.edges[("paper", "ps", "subject")].shape == (2, 4019)
    paper = g.node_data["paper"]["feat"]
    assert paper.shape == (4019, 1902) and paper.dtype == np.float32
    np.testing.assert_allclose(paper.sum(1), 1.0, rtol=1e-5)
    author = g.node_data["author"]["feat"]
    # One author has 1,290 non-zeros: padding every row to that would take more memory
    # than the dense matrix, so the loader makes it dense.
    assert isinstance(author, np.ndarray)
    assert author.shape == (7167, 1902) and author.dtype == np.float32
    ref = scipy.sparse.csr_matrix(
        (raw["featcsr__author__data"], raw["featcsr__author__indices"],
         raw["featcsr__author__indptr"]), shape=tuple(raw["featcsr__author__shape"])).toarray()
    np.testing.assert_array_equal(author, ref)
    assert "feat" not in g.node_data["subject"]
    assert set(g.node_data["author"]) == {"feat"}
    assert np.unique(g.node_data["paper"]["label"]).tolist() == [0, 1, 2]
    assert list(g.splits) == ["paper"]
    sizes = _split_sizes(g, "paper")
    assert (sizes["train"], sizes["val"], sizes["test"]) == (60, 1000, 1000)
    assert (sizes["train_20"], sizes["train_40"], sizes["train_60"]) == (60, 120, 180)
    np.testing.assert_array_equal(g.splits["paper"]["train"], g.splits["paper"]["train_20"])
    np.testing.assert_array_equal(g.splits["paper"]["val_40"], np.sort(raw["val_idx__40"]))


def test_heco_freebase_loads_featureless_types():
    g = load_npz(_shared("heco_freebase"))
    assert list(g.num_nodes.items()) == [("movie", 3492), ("director", 2502),
                                         ("actor", 33401), ("writer", 4459)]
    expected = {("movie", "ma", "actor"): 65341, ("movie", "md", "director"): 3762,
                ("movie", "mw", "writer"): 6414}
    assert {rel: e.shape[1] for rel, e in g.edges.items()} == expected
    for t in g.node_types:
        assert "feat" not in g.node_data.get(t, {}), t
    assert set(g.node_data["movie"]) == {"label"}
    assert np.unique(g.node_data["movie"]["label"]).tolist() == [0, 1, 2]
    sizes = _split_sizes(g, "movie")
    assert (sizes["train"], sizes["val"], sizes["test"]) == (60, 1000, 1000)


@pytest.mark.slow
def test_kgbench_am_wip_loads_a_million_nodes_and_12_relations():
    raw = _raw("kgbench_am_wip")
    g = load_npz(_shared("kgbench_am_wip"))
    assert g.num_nodes == {N: 1_080_876}
    assert len(g.relations) == 12
    assert g.num_edges == 1_360_749
    counts = np.bincount(raw["etype"], minlength=12)
    assert [g.edges[rel].shape[1] for rel in g.relations] == counts.tolist()
    assert [r.name for r in g.relations] == [str(r) for r in raw["rel_names"]]
    label = g.node_data[N]["label"]
    assert np.unique(label[label >= 0]).tolist() == list(range(8))
    sizes = _split_sizes(g, N)
    assert sizes == {"train": 13423, "val": 20000, "test": 20000, "meta_test": 20000}


# -- round trips ------------------------------------------------------------------------------


def test_round_trip_homogeneous_graph_with_extra_node_and_edge_data(tmp_path):
    rng = np.random.default_rng(0)
    n, e = 50, 200
    g = Graph.homogeneous(
        rng.integers(n, size=e), rng.integers(n, size=e), n, name="rt",
        node_data={"feat": rng.standard_normal((n, 7)).astype(np.float32),
                   "label": rng.integers(-1, 5, size=n),
                   "year": rng.integers(1990, 2020, size=n).astype(np.int32),
                   "mask": rng.random(n) < 0.5,
                   "emb": rng.standard_normal((n, 2, 3))},
        edge_data={"weight": rng.random(e).astype(np.float32),
                   "kind": rng.integers(3, size=(e, 2)).astype(np.int16)},
        splits={"train": rng.choice(n, 10, replace=False), "val": np.arange(10, 20),
                "test": np.arange(30, 45), "extra": np.array([1, 49])})
    save_npz(g, tmp_path / "rt.npz")
    h = load_npz(tmp_path / "rt.npz")
    assert h.is_homogeneous
    assert_graphs_equal(g, h)
    # The homogeneous layout is the one cora uses, so plain numpy readers see src/dst/feat.
    with np.load(tmp_path / "rt.npz") as z:
        np.testing.assert_array_equal(z["src"], g.edges[E][0])
        np.testing.assert_array_equal(z["feat"], g.node_data[N]["feat"])


def test_round_trip_compressed_homogeneous_graph(tmp_path):
    rng = np.random.default_rng(1)
    g = Graph.homogeneous(rng.integers(30, size=90), rng.integers(30, size=90), 30, name="c",
                          node_data={"label": rng.integers(3, size=30)},
                          splits={"train": np.arange(5)})
    save_npz(g, tmp_path / "c.npz", compress=True)
    assert_graphs_equal(g, load_npz(tmp_path / "c.npz"))


def test_round_trip_keeps_node_data_whose_name_ends_in_idx(tmp_path):
    g = Graph.homogeneous([0, 1, 2], [1, 2, 0], 3, name="g",
                          node_data={"orig_idx": np.array([0, 2, 1])},
                          splits={"train": np.array([0])})
    save_npz(g, tmp_path / "g.npz")
    assert_graphs_equal(g, load_npz(tmp_path / "g.npz"))


def test_round_trip_relational_aifb(tmp_path):
    g = load_npz(_shared("aifb"))
    save_npz(g, tmp_path / "aifb.npz")
    h = load_npz(tmp_path / "aifb.npz")
    assert len(h.relations) == 45
    assert_graphs_equal(g, h)


def test_round_trip_relational_graph_with_edge_data(tmp_path):
    rng = np.random.default_rng(2)
    n = 20
    edges, edge_data = {}, {}
    for i, e in enumerate([5, 0, 8]):
        rel = Relation(N, f"http://x.org/r{i}", N)
        edges[rel] = rng.integers(n, size=(2, e))
        edge_data[rel] = {"w": rng.random(e).astype(np.float32)}
    g = Graph(name="rel", num_nodes={N: n}, edges=edges, edge_data=edge_data,
              node_data={N: {"label": rng.integers(2, size=n)}},
              splits={N: {"train": np.array([1, 2, 3])}})
    save_npz(g, tmp_path / "rel.npz")
    h = load_npz(tmp_path / "rel.npz")
    assert_graphs_equal(g, h)


def test_round_trip_heterogeneous_heco_acm(tmp_path):
    g = load_npz(_shared("heco_acm"))
    save_npz(g, tmp_path / "heco_acm.npz")
    h = load_npz(tmp_path / "heco_acm.npz")
    assert_graphs_equal(g, h)


def test_round_trip_heterogeneous_graph_with_edge_and_extra_node_data(tmp_path):
    rng = np.random.default_rng(4)
    nn = {"user": 6, "item": 9}
    rels = [Relation("user", "buys", "item"), Relation("item", "bought_by", "user"),
            Relation("user", "follows", "user")]
    edges = {r: np.stack([rng.integers(nn[r.src_type], size=7),
                          rng.integers(nn[r.dst_type], size=7)]) for r in rels}
    g = Graph(name="het", num_nodes=nn, edges=edges,
              node_data={"user": {"feat": rng.random((6, 3)).astype(np.float32),
                                  "label": rng.integers(2, size=6)},
                         "item": {"price": rng.random(9)}},
              edge_data={rels[0]: {"when": rng.integers(100, size=7)}},
              splits={"user": {"train": np.array([0, 4]), "test": np.array([5])}})
    save_npz(g, tmp_path / "het.npz")
    assert_graphs_equal(g, load_npz(tmp_path / "het.npz"))


# -- bad files --------------------------------------------------------------------------------


def test_corrupt_file_of_random_bytes_raises_dataset_error_naming_path(tmp_path):
    path = tmp_path / "garbage.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DatasetError, match="not a readable") as info:
        load_npz(path)
    assert str(path) in str(info.value)


def test_truncated_zip_raises_dataset_error_naming_path(tmp_path):
    good = tmp_path / "good.npz"
    save_npz(Graph.homogeneous([0, 1], [1, 0], 2), good)
    bad = tmp_path / "truncated.npz"
    bad.write_bytes(good.read_bytes()[:100])
    with pytest.raises(DatasetError) as info:
        load_npz(bad)
    assert str(bad) in str(info.value)


def test_missing_file_raises_dataset_error_naming_path(tmp_path):
    path = tmp_path / "nope" / "missing.npz"
    with pytest.raises(DatasetError, match="no such file") as info:
        load_npz(path)
    assert str(path) in str(info.value)
    with pytest.raises(DatasetError) as info:
        load_dataset(str(path))
    assert str(path) in str(info.value)


def test_npz_with_unknown_keys_raises_dataset_error_naming_path_and_keys(tmp_path):
    path = tmp_path / "odd.npz"
    np.savez(path, foo=np.arange(3), bar=np.zeros(2))
    with pytest.raises(DatasetError, match="not a graph layout") as info:
        load_npz(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "['bar', 'foo']" in msg


def test_npz_with_missing_array_raises_dataset_error_naming_path_and_array(tmp_path):
    path = tmp_path / "rel.npz"
    np.savez(path, src=np.array([0]), dst=np.array([1]), etype=np.array([0]))
    with pytest.raises(DatasetError, match="missing array 'num_relations'") as info:
        load_npz(path)
    assert str(path) in str(info.value)


def test_npz_with_out_of_range_edge_raises_dataset_error_with_graph_detail(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 7]), num_nodes=np.int64(3))
    with pytest.raises(DatasetError) as info:
        load_npz(path)
    msg = str(info.value)
    assert str(path) in msg and "id 7" in msg and "destination" in msg


def test_unknown_dataset_name_raises_listing_the_forms():
    with pytest.raises(DatasetError, match="not found") as info:
        load_dataset("no-such-dataset")
    assert "cora" in str(info.value)
