"""One data preparation (jgraph.data.prepare): each step and their combinations, streamed
over a chunked graph directory (jgraph.data.prepare_chunked) with budgets small enough
for many blocks and buckets, equal to the in-memory reference (the same edges with their
data, the same rows); link prediction's held-out edges drawn by hashes, so the order of
the edges does not change them, and streamed equal to those drawn in memory; the
preparation recorded in the chunked directory and the partition directory; NaN features
and bad labels refused on the chunked route."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jgraph.data import (
    DatasetError,
    Graph,
    GraphError,
    held_out,
    load_chunked,
    load_dataset,
    open_chunked,
    save_chunked,
    split_edges,
)
from jgraph.data.graph import Relation
from jgraph.data.prepare import HeldOut, Preparation, differences, prepare
from jgraph.data.prepare_chunked import prepare_chunked
from jgraph.data.sparse import SparseRows
from jgraph.ingest.convert import convert

STREAMED = [
    Preparation(symmetrize=True),
    Preparation(dedup=True),
    Preparation(remove_self_loops=True, symmetrize=True, self_loops=True,
                normalize_features="feat"),
    Preparation(reverse_relations=True),
    Preparation(reverse_relations=True, dedup=True, self_loops=True),
    Preparation(symmetrize=True, reverse_relations=True, self_loops=True),
]


def canonical(graph: Graph) -> dict:
    """{relation: (edges sorted by (dst, src), their data in that order)}: a graph's edges
    as a set of edges with data (the streamed route writes them in bucket order)."""
    out = {}
    for rel, e in graph.edges.items():
        order = np.lexsort((e[0], e[1]))
        out[tuple(rel)] = (e[:, order],
                           {k: v[order] for k, v in graph.edge_data.get(rel, {}).items()})
    return out


def rows(x):
    return (x.indices, x.values) if isinstance(x, SparseRows) else (x,)


def assert_same_prepared(ref: Graph, got: Graph) -> None:
    assert dict(got.num_nodes) == dict(ref.num_nodes)
    a, b = canonical(ref), canonical(got)
    assert list(a) == list(b)           # relations, reverse ones after the others
    for rel in a:
        np.testing.assert_array_equal(b[rel][0], a[rel][0], err_msg=str(rel))
        assert sorted(b[rel][1]) == sorted(a[rel][1])
        for name in a[rel][1]:
            np.testing.assert_array_equal(b[rel][1][name], a[rel][1][name])
    for t, named in ref.node_data.items():
        assert sorted(got.node_data.get(t, {})) == sorted(named)
        for name, x in named.items():
            for want, have in zip(rows(x), rows(got.node_data[t][name])):
                np.testing.assert_array_equal(have, want, err_msg=f"{t}.{name}")
                assert have.dtype == want.dtype
    for t, named in ref.splits.items():
        for name, ids in named.items():
            np.testing.assert_array_equal(got.splits[t][name], ids)


def with_duplicates_and_loops(graph: Graph) -> Graph:
    """`graph` with every 7th edge of each relation repeated (its data differing, so
    keeping the first is checked) and a few self-loops, plus an edge weight."""
    edges, data = {}, {}
    for r, (rel, e) in enumerate(graph.edges.items()):
        extra = e[:, ::7]
        loops = [np.arange(0, min(graph.num_nodes[rel.src_type], 30), 3)] * 2 \
            if rel.src_type == rel.dst_type else [[], []]
        edges[rel] = np.concatenate([e, extra, np.asarray(loops, np.int64)], axis=1)
        n = edges[rel].shape[1]
        data[rel] = {"weight": (np.arange(n, dtype=np.float32) + 1000 * r)}
    return graph.replace(edges=edges, edge_data=data)


@pytest.fixture(scope="module", params=["cora", "aifb", "heco_acm"])
def graph(request, shared_data) -> Graph:
    if request.param == "cora":
        return with_duplicates_and_loops(load_dataset("cora"))
    return with_duplicates_and_loops(load_dataset(shared_data(f"{request.param}.npz")))


@pytest.mark.parametrize("preparation", STREAMED, ids=lambda p: "+".join(p.steps))
def test_each_step_streamed_equals_the_in_memory_reference(graph, preparation, tmp_path):
    p = preparation
    if p.symmetrize and any(r.src_type != r.dst_type for r in graph.relations):
        with pytest.raises(GraphError, match="cannot symmetrize relation"):
            prepare_chunked(save(graph, tmp_path), tmp_path / "out", p)
        return
    if p.normalize_features and not any("feat" in a for a in graph.node_data.values()):
        p = Preparation(**{**p.__dict__, "normalize_features": None})
    if p.self_loops and graph.edge_data and any(r.src_type == r.dst_type
                                                for r in graph.relations):
        # A relation with edge data needs a value for new self-loops: refused alike.
        with pytest.raises(GraphError, match="edge data"):
            prepare(graph, p)
        with pytest.raises(GraphError, match="edge data"):
            prepare_chunked(save(graph, tmp_path), tmp_path / "out", p)
        graph = graph.replace(edge_data={})
    ref, _ = prepare(graph, p)
    out = tmp_path / "out"
    # Budgets that make many blocks and buckets of a small graph: the large graph's path.
    prepare_chunked(save(graph, tmp_path, "plain"), out, p, block_edges=1_000,
                    bucket_edges=4_000, rows_per_chunk=500)
    got = load_chunked(out)
    assert_same_prepared(ref, got)
    with open(out / "metadata.json") as f:
        assert Preparation.from_json(json.load(f)["preparation"]) == p


def save(graph: Graph, tmp_path, name: str = "in") -> str:
    """`graph` as a chunked directory of many chunks, written once per test."""
    path = str(tmp_path / name)
    if not os.path.isdir(path):
        save_chunked(graph, path, edges_per_chunk=2_500, rows_per_chunk=700)
    return path


def test_a_prepared_directory_prepared_again_records_both_and_refuses_a_second_reverse(
        tmp_path):
    cora = load_dataset("cora")
    once, twice = tmp_path / "once", tmp_path / "twice"
    prepare_chunked(save(cora, tmp_path), once, Preparation(reverse_relations=True))
    prepare_chunked(once, twice, Preparation(self_loops=True))
    with open(twice / "metadata.json") as f:
        recorded = Preparation.from_json(json.load(f)["preparation"])
    assert recorded == Preparation(reverse_relations=True, self_loops=True)
    with pytest.raises(GraphError, match="has reverse_relations already"):
        prepare_chunked(twice, tmp_path / "thrice", Preparation(reverse_relations=True))
    assert not os.path.exists(tmp_path / "thrice")


HELD_OUT = HeldOut(0.1, 0.15, eval_negatives=6, seed=4)


def directed(graph: Graph) -> Graph:
    """`graph` with about a third of each relation's edges gone, so that most of its
    pairs hold one direction only."""
    rng = np.random.default_rng(0)
    keep = {rel: rng.random(e.shape[1]) < 0.65 for rel, e in graph.edges.items()}
    return graph.replace(edges={rel: e[:, keep[rel]] for rel, e in graph.edges.items()},
                         edge_data={rel: {k: v[keep[rel]] for k, v in named.items()}
                                    for rel, named in graph.edge_data.items()})


@pytest.mark.parametrize("shape", ["as_is", "directed"])
@pytest.mark.parametrize("preparation", [
    Preparation(held_out=HELD_OUT),
    Preparation(remove_self_loops=True, held_out=HELD_OUT, reverse_relations=True,
                dedup=True),
    Preparation(held_out=HELD_OUT, symmetrize=True),
], ids=lambda p: "+".join(p.steps))
def test_held_out_edges_streamed_equal_the_in_memory_split(graph, preparation, shape,
                                                           tmp_path):
    """The same positives in the same order, the same negatives, and the same graph
    left, through many hash buckets; pairs where the graph is symmetric (cora as it is)
    or made so, directed edges otherwise."""
    graph = directed(graph) if shape == "directed" else graph
    if preparation.symmetrize and any(r.src_type != r.dst_type for r in graph.relations):
        return                          # refused, as test_each_step_... shows
    ref, want = prepare(graph, preparation)
    out = tmp_path / "out"
    prepare_chunked(save(graph, tmp_path), out, preparation, block_edges=1_000,
                    bucket_edges=3_000)
    got = open_chunked(out)
    assert sorted(got.edge_splits) == ["test", "train", "val"]
    for split, edge_set in want.items():
        have = got.edge_set(split)
        for key in ("src", "dst", "etype", "negatives"):
            np.testing.assert_array_equal(getattr(have, key), getattr(edge_set, key),
                                          err_msg=f"{split}.{key}")
    assert_same_prepared(ref, got.to_graph(edge_splits=False))
    with pytest.raises(DatasetError, match="held-out edges"):
        got.to_graph()
    # Prepared further, the split comes along as it is.
    prepare_chunked(out, tmp_path / "again", Preparation(dedup=True))
    for split, edge_set in want.items():
        np.testing.assert_array_equal(open_chunked(tmp_path / "again").edge_set(split).dst,
                                      edge_set.dst)


def test_relations_without_candidates_and_negatives_written_in_slices(tmp_path,
                                                                       monkeypatch):
    """A relation with no edges and one of self-loops alone (no candidate for a
    positive) beside one with many; negatives drawn and written a few positives at a
    time: still the in-memory split."""
    cora = load_dataset("cora")
    (rel, e), = cora.edges.items()
    loops = np.arange(0, 2708, 5)
    graph = cora.replace(edges={rel: e, Relation("_N", "none", "_N"): np.zeros((2, 0), np.int64),
                                Relation("_N", "self", "_N"): np.stack([loops, loops])})
    monkeypatch.setattr(held_out, "NEGATIVES_AT_ONCE", 50)       # 8 positives a slice
    p = Preparation(held_out=HELD_OUT)
    ref, want = prepare(graph, p)
    prepare_chunked(save(graph, tmp_path), tmp_path / "out", p, block_edges=1_000,
                    bucket_edges=3_000)
    got = open_chunked(tmp_path / "out")
    assert len(got.edge_splits["val"]["src"].files) > 50           # many slices
    for split, edge_set in want.items():
        for key in ("src", "dst", "etype", "negatives"):
            np.testing.assert_array_equal(getattr(got.edge_set(split), key),
                                          getattr(edge_set, key), err_msg=f"{split}.{key}")
    assert_same_prepared(ref, got.to_graph(edge_splits=False))


def test_a_chunked_directory_converted_as_it_is_keeps_its_record_and_held_out_edges(
        tmp_path):
    prepared = tmp_path / "prepared"
    asked = Preparation(held_out=HeldOut(eval_negatives=3), symmetrize=True)
    prepare_chunked(save(load_dataset("cora"), tmp_path), prepared, asked)
    convert(prepared, tmp_path / "copy", edges_per_chunk=1_000)
    a, b = open_chunked(prepared), open_chunked(tmp_path / "copy")
    assert b.num_edge_chunks == 9 and b.num_edges == a.num_edges == 2 * (5278 - 2 * 528)
    with open(tmp_path / "copy" / "metadata.json") as f:
        assert Preparation.from_json(json.load(f)["preparation"]) == asked
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(b.edge_set(split).src, a.edge_set(split).src)


def test_a_directed_graph_holds_out_both_directions_of_a_pair_side_by_side():
    """Ranked by the pair's hash, then the edge: a pair's two directions are neighbours
    in the order, so they mostly fall in one split."""
    cora = directed(load_dataset("cora"))
    split = split_edges(cora, 0.2, 0.2, eval_negatives=2, seed=1)
    pair = lambda s: np.minimum(s.src, s.dst) * 10**6 + np.maximum(s.src, s.dst)
    sets = {name: set(pair(s).tolist()) for name, s in split.edges.items()}
    both = [p for p in sets["val"] if list(pair(split.edges["val"])).count(p) == 2]
    assert both                         # some pairs have both directions in validation
    straddling = (sets["val"] & sets["test"]) | (sets["val"] & sets["train"]) \
        | (sets["test"] & sets["train"])
    assert len(straddling) <= 2         # only at the two cuts


def test_the_held_out_edges_do_not_depend_on_the_order_of_the_edges():
    """Drawn by hashing each pair's key: the same split from the edges shuffled."""
    cora = load_dataset("cora")
    (rel, e), = cora.edges.items()
    shuffled = cora.replace(edges={rel: e[:, np.random.default_rng(3).permutation(e.shape[1])]})
    a = split_edges(cora, 0.1, 0.1, eval_negatives=7, seed=5, undirected=True)
    b = split_edges(shuffled, 0.1, 0.1, eval_negatives=7, seed=5, undirected=True)
    for name in ("train", "val", "test"):
        key = lambda s: np.minimum(s.src, s.dst) * 10**6 + np.maximum(s.src, s.dst)
        np.testing.assert_array_equal(key(a.edges[name]), key(b.edges[name]))
        if name != "train":
            np.testing.assert_array_equal(a.edges[name].negatives, b.edges[name].negatives)
    other = split_edges(cora, 0.1, 0.1, eval_negatives=7, seed=6, undirected=True)
    assert not np.array_equal(a.edges["val"].src, other.edges["val"].src)


def test_differences_name_each_step_asked_otherwise():
    recorded = Preparation(symmetrize=True, held_out=HeldOut(eval_negatives=20))
    asked = Preparation(symmetrize=True, reverse_relations=True, held_out=HeldOut())
    found = dict(differences(recorded, asked))
    assert sorted(found) == ["held_out", "reverse_relations"]
    assert "20 negatives" in found["held_out"] and "1000 negatives" in found["held_out"]
    assert differences(recorded, recorded) == []


@pytest.mark.parametrize("bad", ["nan", "inf", "label"])
def test_a_chunked_graph_with_nan_features_or_bad_labels_is_refused_naming_file_and_node(
        bad, tmp_path):
    """As a Graph (an .npz) refuses them: on the chunked route, streamed or partitioned."""
    from jgraph.partition.chunked import ChunkedOptions, partition_chunked
    cora = load_dataset("cora")
    src = save(cora, tmp_path)
    node = 1234
    name = "label" if bad == "label" else "feat"
    with open(os.path.join(src, "metadata.json")) as f:
        meta = json.load(f)
    entry = meta["node_data"]["_N"][name]
    starts = np.cumsum([0] + entry["rows"])
    chunk = int(np.searchsorted(starts, node, side="right") - 1)
    path = os.path.join(src, entry["files"][chunk])
    values = np.load(path)
    values[node - starts[chunk]] = {"nan": np.nan, "inf": np.inf, "label": -3}[bad]
    np.save(path, values)
    with pytest.raises(DatasetError, match=rf"{entry['files'][chunk]}.*at node {node}"):
        prepare_chunked(src, tmp_path / "out", Preparation(self_loops=True))
    assert not os.path.exists(tmp_path / "out")
    with pytest.raises(DatasetError, match=rf"{entry['files'][chunk]}.*at node {node}"):
        partition_chunked(src, tmp_path / "parts", ChunkedOptions(2))
    assert not os.path.exists(tmp_path / "parts")


def test_a_step_that_comes_before_one_already_done_is_refused():
    """self-loops, then remove_self_loops, would leave none: the record would lie."""
    with pytest.raises(GraphError, match="remove_self_loops cannot follow self_loops"):
        Preparation(self_loops=True).then(Preparation(remove_self_loops=True))
    both = Preparation(symmetrize=True).then(Preparation(symmetrize=True, self_loops=True))
    assert both == Preparation(symmetrize=True, self_loops=True)     # repeats change nothing


def test_a_config_asks_the_whole_preparation_of_a_graph_that_has_some_of_it():
    recorded = Preparation(reverse_relations=True)
    whole = Preparation(reverse_relations=True, self_loops=True)
    assert whole.still_to_do(recorded) == Preparation(self_loops=True)
    with pytest.raises(GraphError, match="reverse_relations: asked no, the graph has yes"):
        Preparation(self_loops=True).still_to_do(recorded)
    with pytest.raises(GraphError, match="held_out"):
        Preparation(held_out=HeldOut(seed=1)).still_to_do(Preparation(held_out=HeldOut()))


def test_a_partition_directory_asked_for_another_preparation_is_refused_by_name(tmp_path):
    from jgraph.config import ConfigError
    from jgraph.jobs.dataset import check_prepared
    from jgraph.partition import partition_graph
    cora = load_dataset("cora")
    made = Preparation(self_loops=True)
    partition_graph(prepare(cora, made)[0], 2, "metis", tmp_path / "parts", preparation=made)
    check_prepared(str(tmp_path / "parts"), made)                   # as asked: accepted
    with pytest.raises(ConfigError, match=r"data.reverse_relations: asked yes, the graph "
                                          r"has no.*data.self_loops: asked no"):
        check_prepared(str(tmp_path / "parts"), Preparation(reverse_relations=True))
    # A directory written before jgraph recorded its preparation: refused if asked any.
    partition_graph(cora, 2, "metis", tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    del meta["preparation"]
    (tmp_path / "old" / "meta.json").write_text(json.dumps(meta))
    check_prepared(str(tmp_path / "old"), Preparation())
    with pytest.raises(ConfigError, match="records no preparation.*data.symmetrize"):
        check_prepared(str(tmp_path / "old"), Preparation(symmetrize=True))


def test_convert_with_a_preparation_writes_it_and_leaves_nothing_else(tmp_path, capsys):
    """The raw conversion goes to a scratch folder beside OUT; a folder of the user's
    beside OUT, even one named like it, is never touched."""
    from jgraph.cli.main import main
    (tmp_path / "out.raw").mkdir()
    (tmp_path / "out.raw" / "notes.txt").write_text("mine")
    assert main(["convert", "cora", str(tmp_path / "out"), "--symmetrize",
                 "--self-loops"]) == 0
    ref, _ = prepare(load_dataset("cora"), Preparation(symmetrize=True, self_loops=True))
    assert_same_prepared(ref, load_chunked(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["out", "out.raw"]
    assert (tmp_path / "out.raw" / "notes.txt").read_text() == "mine"
    capsys.readouterr()


def test_convert_prepares_a_chunked_graph_streamed_never_loading_it(tmp_path, monkeypatch,
                                                                      capsys):
    """papers100M's way: its chunked directory, symmetrized by `jgraph convert`."""
    import jgraph.ingest.convert as convert_module
    from jgraph.cli.main import main
    src = save(load_dataset("cora"), tmp_path)

    def whole(spec):
        raise AssertionError(f"{spec} was loaded whole")
    monkeypatch.setattr(convert_module, "load_dataset", whole)
    assert main(["convert", src, str(tmp_path / "sym"), "--symmetrize"]) == 0
    ref, _ = prepare(load_dataset("cora"), Preparation(symmetrize=True))
    assert_same_prepared(ref, load_chunked(tmp_path / "sym"))
    capsys.readouterr()
