"""Synthetic graphs: determinism, exact simple edge sets, splits, a learnable signal, specs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jgraph.data import (
    DEFAULT_NTYPE,
    DEFAULT_REL,
    DatasetError,
    Graph,
    Kind,
    Relation,
    SyntheticSpec,
    generate,
    load_dataset,
    parse_spec,
)

N = DEFAULT_NTYPE
E = Relation(N, DEFAULT_REL, N)

SMALL = "synthetic:nodes=3000,edges=20000,feat=16,classes=5"


def _arrays(g: Graph) -> dict[str, np.ndarray]:
    out = {"edges": g.edges[E]}
    out.update({f"node/{k}": v for k, v in g.node_data[N].items()})
    out.update({f"split/{k}": v for k, v in g.splits[N].items()})
    return out


def _homophily(g: Graph) -> float:
    src, dst = g.edges[E]
    label = g.node_data[N]["label"]
    return float(np.mean(label[src] == label[dst]))


def _assortativity(g: Graph) -> float:
    """Newman's assortativity coefficient of the labels over the directed edges."""
    src, dst = g.edges[E]
    label = g.node_data[N]["label"]
    c = int(label.max()) + 1
    a = np.bincount(label[src], minlength=c) / src.size
    b = np.bincount(label[dst], minlength=c) / dst.size
    chance = float(a @ b)
    return (_homophily(g) - chance) / (1 - chance)


def _nearest_centroid_accuracy(g: Graph) -> float:
    x, y = g.node_data[N]["feat"].astype(np.float64), g.node_data[N]["label"]
    train, test = g.splits[N]["train"], g.splits[N]["test"]
    classes = int(y.max()) + 1
    centroids = np.stack([x[train][y[train] == c].mean(0) for c in range(classes)])
    dist = ((x[test][:, None, :] - centroids[None]) ** 2).sum(-1)
    return float(np.mean(dist.argmin(1) == y[test]))


# -- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["powerlaw", "uniform", "rmat"])
def test_same_spec_gives_identical_graph(kind):
    a, b = generate(f"{SMALL},kind={kind}"), generate(f"{SMALL},kind={kind}")
    assert a.name == b.name
    xa, xb = _arrays(a), _arrays(b)
    assert sorted(xa) == sorted(xb)
    for k in xa:
        assert xa[k].dtype == xb[k].dtype
        np.testing.assert_array_equal(xa[k], xb[k], err_msg=k)


def test_spec_object_and_string_give_the_same_graph():
    a = generate(SyntheticSpec(nodes=3000, edges=20000, feat=16, classes=5, seed=4))
    b = generate(f"{SMALL},seed=4")
    for k, v in _arrays(a).items():
        np.testing.assert_array_equal(v, _arrays(b)[k], err_msg=k)


@pytest.mark.parametrize("kind", ["powerlaw", "uniform", "rmat"])
def test_different_seed_gives_different_graph(kind):
    a = generate(f"{SMALL},kind={kind},seed=0")
    b = generate(f"{SMALL},kind={kind},seed=1")
    assert a.name != b.name
    assert a.edges[E].shape == b.edges[E].shape
    assert not np.array_equal(a.edges[E], b.edges[E])
    assert not np.array_equal(a.node_data[N]["feat"], b.node_data[N]["feat"])
    assert not np.array_equal(a.splits[N]["train"], b.splits[N]["train"])
    set_a = set(zip(*a.edges[E].tolist()))
    set_b = set(zip(*b.edges[E].tolist()))
    assert len(set_a ^ set_b) > 0.1 * len(set_a)


# -- edges --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["powerlaw", "uniform", "rmat"])
@pytest.mark.parametrize("nodes,edges", [(3000, 20000), (1000, 1), (777, 4321), (2, 2)])
def test_exact_edge_count_without_self_loops_or_duplicates(kind, nodes, edges):
    g = generate(f"synthetic:nodes={nodes},edges={edges},kind={kind},feat=4,classes=2")
    src, dst = g.edges[E]
    assert g.num_nodes == {N: nodes}
    assert src.size == edges
    assert not np.any(src == dst)
    assert len(set(zip(src.tolist(), dst.tolist()))) == edges
    assert src.min() >= 0 and max(src.max(), dst.max()) < nodes


@pytest.mark.parametrize("kind", ["powerlaw", "uniform"])
def test_complete_digraph_when_every_pair_is_asked_for(kind):
    n = 30
    g = generate(f"synthetic:nodes={n},edges={n * (n - 1)},kind={kind},feat=0,classes=3")
    pairs = set(zip(*g.edges[E].tolist()))
    assert pairs == {(i, j) for i in range(n) for j in range(n) if i != j}


def test_zero_edges():
    g = generate("synthetic:nodes=10,edges=0,feat=3,classes=2")
    assert g.edges[E].shape == (2, 0)


def test_powerlaw_degrees_are_heavy_tailed_and_uniform_ones_are_not():
    spec = "synthetic:nodes=5000,edges=40000,feat=0,classes=5"
    pl = np.bincount(generate(spec + ",kind=powerlaw").edges[E][1], minlength=5000)
    un = np.bincount(generate(spec + ",kind=uniform").edges[E][1], minlength=5000)
    mean = 40000 / 5000
    assert un.max() < 4 * mean                 # Poisson(8): a max near 20
    assert pl.max() > 25 * mean                # Zipf weights: hubs with hundreds of edges
    assert np.sum(pl == 0) > 5 * max(np.sum(un == 0), 1)


# -- node data and splits -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["powerlaw", "uniform", "rmat"])
def test_labels_and_features_have_the_asked_shapes(kind):
    g = generate(f"synthetic:nodes=2000,edges=8000,kind={kind},feat=24,classes=6")
    label, feat = g.node_data[N]["label"], g.node_data[N]["feat"]
    assert label.shape == (2000,) and label.dtype == np.int64
    assert label.min() >= 0 and label.max() < 6
    assert feat.shape == (2000, 24) and feat.dtype == np.float32
    assert np.all(np.isfinite(feat))


def test_feat_zero_gives_a_featureless_graph():
    g = generate("synthetic:nodes=100,edges=300,feat=0")
    assert sorted(g.node_data[N]) == ["label"]


@pytest.mark.parametrize("kind", ["powerlaw", "uniform"])
def test_every_class_has_nodes(kind):
    g = generate(f"synthetic:nodes=5000,edges=20000,kind={kind},classes=7,feat=0")
    assert np.unique(g.node_data[N]["label"]).tolist() == list(range(7))


def test_rmat_every_class_has_nodes_when_nodes_is_not_a_power_of_two():
    g = generate("synthetic:nodes=5000,edges=20000,kind=rmat,classes=4,feat=0")
    assert np.unique(g.node_data[N]["label"]).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("train,val,test", [(0.1, 0.1, 0.2), (0.6, 0.2, 0.2), (0.25, 0, 0.5)])
def test_split_sizes_disjoint_sorted_and_in_range(train, val, test):
    n = 1237
    g = generate(f"synthetic:nodes={n},edges=5000,train={train},val={val},test={test}")
    s = g.splits[N]
    assert sorted(s) == ["test", "train", "val"]
    for name, frac in (("train", train), ("val", val), ("test", test)):
        assert s[name].size == int(round(frac * n)), name
        assert np.all(np.diff(s[name]) > 0), name
        assert s[name].size == 0 or (s[name][0] >= 0 and s[name][-1] < n)
    assert not set(s["train"].tolist()) & set(s["val"].tolist())
    assert not set(s["train"].tolist()) & set(s["test"].tolist())
    assert not set(s["val"].tolist()) & set(s["test"].tolist())


def test_splits_are_not_id_ranges():
    g = generate("synthetic:nodes=2000,edges=5000,train=0.5,val=0,test=0.5")
    train = g.splits[N]["train"]
    assert train.min() < 100 and train.max() > 1900   # spread over the id range


# -- the learnable signal -------------------------------------------------------------------------


def test_powerlaw_homophily_08_gives_mostly_same_label_edges():
    classes = 5
    g = generate(f"synthetic:nodes=5000,edges=40000,kind=powerlaw,homophily=0.8,"
                 f"classes={classes},feat=0")
    # A source of dst's class w.p. 0.8, else one drawn from everyone (of dst's class 1 in
    # `classes` times): 0.84 of the edges drawn. Duplicates are redrawn, and more
    # same-class edges repeat (fewer nodes to draw from): seeds 0-3 keep 0.811-0.814.
    drawn = 0.8 + 0.2 / classes
    assert drawn - 0.04 < _homophily(g) <= drawn + 0.005


def test_powerlaw_homophily_0_gives_chance_level_same_label_edges():
    classes = 5
    g = generate(f"synthetic:nodes=5000,edges=40000,kind=powerlaw,homophily=0,"
                 f"classes={classes},feat=0")
    assert abs(_homophily(g) - 1 / classes) < 0.03
    assert abs(_assortativity(g)) < 0.03


def test_uniform_kind_is_homophilous_too():
    g = generate("synthetic:nodes=5000,edges=40000,kind=uniform,homophily=0.7,classes=5,feat=0")
    # Same class w.p. 0.7, else a uniform source: same class w.p. 1/5 of the rest.
    assert abs(_homophily(g) - (0.7 + 0.3 / 5)) < 0.03


def test_rmat_labels_are_assortative_as_the_default_homophily_asks():
    """With probability 0.7 (the default homophily) an edge's source is replaced by a
    node of its destination's class, otherwise R-MAT's (label-blind): an assortativity
    of 0.7. Its sampling error over 40,000 edges: the same-class share's binomial
    sd sqrt(0.85 * 0.15 / 40000) = 0.0018, over 1 - chance (0.5): 0.0036; measured
    over seeds 0-39, 0.7035 +- 0.0039 (0.693-0.714; seed 0: 0.703). 0.02 is 5 sd."""
    g = generate("synthetic:nodes=8192,edges=40000,kind=rmat,classes=2,feat=0")
    assert abs(_assortativity(g) - 0.7) < 0.02


@pytest.mark.parametrize("kind", ["powerlaw", "uniform", "rmat"])
def test_nearest_centroid_on_features_beats_chance(kind):
    classes = 5
    g = generate(f"synthetic:nodes=5000,edges=20000,kind={kind},classes={classes},feat=32,"
                 f"train=0.5,val=0,test=0.5")
    present = np.unique(g.node_data[N]["label"]).size
    assert _nearest_centroid_accuracy(g) > 2.0 / present


def test_features_without_signal_are_at_chance():
    classes = 5
    g = generate(f"synthetic:nodes=5000,edges=20000,classes={classes},feat=32,signal=0,"
                 f"train=0.5,val=0,test=0.5")
    assert _nearest_centroid_accuracy(g) < 1.4 / classes


def test_neighbourhood_features_are_a_stronger_signal_than_own_features():
    g = generate("synthetic:nodes=5000,edges=40000,kind=powerlaw,homophily=0.8,classes=5,"
                 "feat=32,train=0.5,val=0,test=0.5")
    own = _nearest_centroid_accuracy(g)
    src, dst = g.edges[E]
    x = g.node_data[N]["feat"].astype(np.float64)
    agg = np.zeros_like(x)
    np.add.at(agg, dst, x[src])
    deg = np.bincount(dst, minlength=x.shape[0])[:, None]
    mixed = (x + agg) / (1 + deg)
    g2 = g.replace(node_data={N: {"feat": mixed, "label": g.node_data[N]["label"]}})
    assert _nearest_centroid_accuracy(g2) > own + 0.05


# -- load_dataset and the big one ----------------------------------------------------------------


def test_load_dataset_generates_synthetic_specs():
    a = load_dataset("synthetic:nodes=500,edges=2000,seed=3")
    b = generate("synthetic:nodes=500,edges=2000,seed=3")
    assert a.name == b.name == "synthetic-powerlaw-n500-e2000-s3"
    np.testing.assert_array_equal(a.edges[E], b.edges[E])


@pytest.mark.slow      # a ten-million-edge graph
@pytest.mark.slow
def test_ten_million_edges_on_a_million_nodes():
    g = generate("synthetic:nodes=1M,edges=10M")
    src, dst = g.edges[E]
    assert g.num_nodes == {N: 1_000_000}
    assert src.size == 10_000_000
    assert not np.any(src == dst)
    keys = np.sort(src * 1_000_000 + dst)           # sort: np.unique hashes, slowly
    assert np.all(keys[1:] != keys[:-1])
    assert g.node_data[N]["feat"].shape == (1_000_000, 64)


# -- parse_spec -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text,nodes", [("200k", 200_000), ("4M", 4_000_000), ("1e6", 1_000_000),
                                         ("2.5k", 2_500), ("1G", 10**9), ("12345", 12_345),
                                         ("3m", 3_000_000), ("5E3", 5_000)])
def test_parse_spec_size_forms(text, nodes):
    spec = parse_spec(f"synthetic:nodes={text},edges=0")
    assert spec.nodes == nodes and isinstance(spec.nodes, int)


def test_parse_spec_reads_every_key():
    spec = parse_spec("synthetic:nodes=200k,edges=4M,kind=rmat,classes=47,feat=100,"
                      "homophily=0.8,alpha=2.5,signal=2,train=0.5,val=0.25,test=0.25,seed=9")
    assert spec == SyntheticSpec(nodes=200_000, edges=4_000_000, kind=Kind.RMAT, classes=47,
                                 feat=100, homophily=0.8, alpha=2.5, signal=2.0, train=0.5,
                                 val=0.25, test=0.25, seed=9)
    assert isinstance(spec.signal, float) and isinstance(spec.seed, int)


def test_parse_spec_defaults_and_whitespace():
    assert parse_spec("synthetic") == SyntheticSpec()
    assert parse_spec("synthetic:") == SyntheticSpec()
    assert parse_spec("synthetic: nodes=10 , edges=20 ,") == SyntheticSpec(nodes=10, edges=20)


def test_parse_spec_rejects_unknown_key_listing_valid_keys():
    with pytest.raises(DatasetError, match="'nodez=5'") as info:
        parse_spec("synthetic:nodez=5")
    msg = str(info.value)
    for field in dataclasses.fields(SyntheticSpec):
        assert field.name in msg


def test_parse_spec_rejects_entry_without_value():
    with pytest.raises(DatasetError, match="malformed entry 'nodes'"):
        parse_spec("synthetic:nodes,edges=5")


def test_parse_spec_rejects_bad_kind_listing_kinds():
    with pytest.raises(DatasetError, match="kind='scalefree'") as info:
        parse_spec("synthetic:kind=scalefree")
    for kind in ("powerlaw", "uniform", "rmat"):
        assert kind in str(info.value)


@pytest.mark.parametrize("entry", ["nodes=1.5", "nodes=abc", "edges=4X", "seed=1e", "nodes="])
def test_parse_spec_rejects_bad_numbers(entry):
    key = entry.split("=")[0]
    with pytest.raises(DatasetError, match=f"{key}=") as info:
        parse_spec(f"synthetic:{entry}")
    assert "not a valid" in str(info.value)


def test_parse_spec_rejects_non_synthetic_head():
    with pytest.raises(DatasetError, match="not a synthetic spec"):
        parse_spec("synth:nodes=5")


@pytest.mark.parametrize("spec,words", [
    ("synthetic:nodes=1", "nodes=1"),
    ("synthetic:nodes=5,edges=21", "edges=21"),
    ("synthetic:homophily=1.5", "homophily"),
    ("synthetic:alpha=1", "alpha"),
    ("synthetic:train=0.6,val=0.3,test=0.2", "sum to <= 1"),
    ("synthetic:classes=0", "classes"),
])
def test_invalid_spec_values_are_rejected(spec, words):
    with pytest.raises(DatasetError, match=words.replace("+", r"\+")):
        parse_spec(spec)
