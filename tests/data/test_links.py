"""Edge splits for link prediction (`jgraph.data.links`) and their storage with the
partition, against numpy computations on the original graphs' edge lists.

They show: the train/val/test positives are each distinct pair once (unordered on
undirected graphs, per relation on relational ones), split by the requested fractions;
self-loops stay in the graph and are never positives; neither a held-out edge nor its
reverse is left in the graph the model sees, before or after `symmetrize` /
`add_reverse_relations` (as a run applies them); a seed fixes the split; the fixed
negatives are nodes of the destination's type, drawn uniformly; a partition stores
each positive once, with the part owning its destination, in its ids; bad inputs and
corrupted files fail with errors naming the value and the file.
"""
import dataclasses
import os
import re
import shutil

import numpy as np
import pytest
import scipy.stats

from jgraph.data import (
    Graph,
    GraphError,
    Relation,
    add_reverse_relations,
    is_symmetric,
    load_dataset,
    load_npz,
    split_edges,
    symmetrize,
)
from jgraph.data.prepare import prepare
from jgraph.jobs.dataset import preparation
from jgraph.jobs.experiment import DataConfig, Experiment, LinkConfig, Task
from jgraph.partition import PartitionError, PartitionFormatError, open_partitions, partition_graph
from jgraph.partition.check import check_part

VAL, TEST = 0.1, 0.05           # unequal, so a swap of the two is seen
K = 20                          # fixed negatives per validation and test positive
HELD_OUT = ("val", "test")


def unordered(src, dst, n: int) -> np.ndarray:
    """int64 key of each unordered pair {src, dst} of ids below n."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    return np.minimum(src, dst) * n + np.maximum(src, dst)


def directed(src, dst, n: int) -> np.ndarray:
    """int64 key of each ordered pair (src, dst) of ids below n."""
    return np.asarray(src, np.int64) * n + np.asarray(dst, np.int64)


def load(name: str, shared_data) -> Graph:
    """Cora from the package (stored symmetric), the others from ../shared/data."""
    return load_dataset("cora") if name == "cora" else load_npz(shared_data(f"{name}.npz"))


def only_edges(graph: Graph) -> np.ndarray:
    """The edge list [2, E] of a one-relation graph."""
    (index,) = graph.edges.values()
    return index


# -- undirected graphs: positives as unordered pairs ---------------------------------------


@pytest.fixture(scope="module", params=["facebook_musae", "cora"])
def undirected(request, shared_data):
    """(graph, its undirected split): Facebook lists each pair once and has 179
    self-loops; Cora lists both directions of each pair."""
    graph = load(request.param, shared_data)
    return graph, split_edges(graph, VAL, TEST, eval_negatives=K, seed=0, undirected=True)


def test_undirected_positives_are_every_distinct_pair_once_split_by_the_fractions(undirected):
    graph, split = undirected
    n = graph.total_nodes
    src, dst = only_edges(graph)
    loop = src == dst
    pairs = np.unique(unordered(src[~loop], dst[~loop], n))
    keys = {name: unordered(es.src, es.dst, n) for name, es in split.edges.items()}
    for name, es in split.edges.items():
        assert es.src.dtype == es.dst.dtype == np.int64 and es.etype.dtype == np.int32
        assert np.all(es.etype == 0), name
        assert np.unique(keys[name]).size == keys[name].size, f"{name} lists a pair twice"
        assert not np.any(es.src == es.dst), f"{name} holds a self-loop"
        # Each positive is an edge of the graph, in a direction the graph stores.
        assert np.isin(directed(es.src, es.dst, n), directed(src, dst, n)).all(), name
    # Disjoint, and together every distinct pair.
    np.testing.assert_array_equal(np.sort(np.concatenate(list(keys.values()))), pairs)
    assert len(split.edges["val"]) == round(VAL * pairs.size)
    assert len(split.edges["test"]) == round(TEST * pairs.size)
    assert split.undirected


def test_held_out_pairs_leave_the_graph_in_both_directions_and_the_rest_stays(undirected):
    graph, split = undirected
    n = graph.total_nodes
    src, dst = only_edges(graph)
    held = np.concatenate([unordered(split.edges[s].src, split.edges[s].dst, n)
                           for s in HELD_OUT])
    kept_src, kept_dst = only_edges(split.graph)
    # The graph is the original edge list less every edge of a held-out pair, in
    # either direction; self-loops, training pairs and their multiplicity stay.
    gone = np.isin(unordered(src, dst, n), held)
    np.testing.assert_array_equal(np.sort(directed(kept_src, kept_dst, n)),
                                  np.sort(directed(src[~gone], dst[~gone], n)))
    assert not np.isin(unordered(kept_src, kept_dst, n), held).any()
    assert np.sum(kept_src == kept_dst) == np.sum(src == dst)
    train = split.edges["train"]
    assert np.isin(unordered(train.src, train.dst, n), unordered(kept_src, kept_dst, n)).all()
    # Symmetrising afterwards brings no held-out pair back, and gives each training
    # pair both directions.
    sym_src, sym_dst = only_edges(symmetrize(split.graph))
    assert not np.isin(unordered(sym_src, sym_dst, n), held).any()
    both = directed(sym_src, sym_dst, n)
    assert np.isin(directed(train.src, train.dst, n), both).all()
    assert np.isin(directed(train.dst, train.src, n), both).all()


def test_the_same_seed_gives_the_same_split_and_another_seed_another():
    graph = load_dataset("cora")
    first, again, other = (split_edges(graph, VAL, TEST, eval_negatives=K, seed=seed,
                                       undirected=True) for seed in (3, 3, 4))
    for name in first.edges:
        for field in ("src", "dst", "etype", "negatives"):
            a, b = getattr(first.edges[name], field), getattr(again.edges[name], field)
            assert (a is None and b is None) or np.array_equal(a, b), (name, field)
    np.testing.assert_array_equal(only_edges(first.graph), only_edges(again.graph))
    n = graph.total_nodes
    val = [np.sort(unordered(s.edges["val"].src, s.edges["val"].dst, n)) for s in (first, other)]
    assert val[0].size == val[1].size and not np.array_equal(*val)


def test_a_run_splits_pairs_before_symmetrizing_so_no_held_out_pair_returns():
    """The preparation `open_graph` applies: on a graph stored partly one way
    round, partly both (neither symmetric nor one edge per pair) with
    data.symmetrize, and on Cora (symmetric) without it."""
    cora = load_dataset("cora")
    src, dst = only_edges(cora)
    one_way = (src < dst) | ((src + dst) % 2 == 0)
    mixed = Graph.homogeneous(src[one_way], dst[one_way], cora.total_nodes, name="mixed")
    assert not is_symmetric(mixed)
    for graph, sym in ((mixed, True), (cora, False)):
        config = Experiment(task=Task.LINK, data=DataConfig(symmetrize=sym),
                            link=LinkConfig(val_fraction=VAL, test_fraction=TEST,
                                            eval_negatives=K))
        seen, edge_splits = prepare(graph, preparation(config))
        n = graph.total_nodes
        s, d = only_edges(graph)
        keys = [unordered(edge_splits[name].src, edge_splits[name].dst, n)
                for name in ("train", *HELD_OUT)]
        np.testing.assert_array_equal(np.sort(np.concatenate(keys)),
                                      np.unique(unordered(s[s != d], d[s != d], n)))
        assert not np.isin(unordered(*only_edges(seen), n), np.concatenate(keys[1:])).any()


@pytest.mark.parametrize("name, transform, symmetric", [
    ("cora", None, True),
    ("facebook_musae", None, False),
    ("facebook_musae", symmetrize, True),
    ("aifb", None, False),
    ("aifb", symmetrize, True),
    ("heco_acm", None, False),
], ids=["cora", "facebook", "facebook-symmetrized", "aifb", "aifb-symmetrized", "acm"])
def test_is_symmetric_says_whether_every_relation_holds_each_reverse(
        name, transform, symmetric, shared_data):
    graph = load(name, shared_data)
    graph = transform(graph) if transform else graph
    n = graph.total_nodes
    expected = all(
        rel.src_type == rel.dst_type
        and np.array_equal(np.unique(directed(s, d, n)), np.unique(directed(d, s, n)))
        for rel, (s, d) in graph.edges.items())
    assert expected == symmetric        # the case is what its parameters say
    assert is_symmetric(graph) == expected


def test_a_relation_between_two_types_is_never_symmetric():
    """Even when its local ids read the same both ways round."""
    ids = np.array([[0, 1, 2], [1, 0, 2]])
    for types in (("paper", "paper"), ("paper", "author")):
        graph = Graph(name="g", num_nodes={"paper": 3, "author": 3},
                      edges={(types[0], "links", types[1]): ids})
        assert is_symmetric(graph) == (types[0] == types[1]), types


# -- relational graphs: positives as triples ------------------------------------------------


@pytest.fixture(scope="module")
def relational(shared_data):
    """(AIFB, its directed split). AIFB stores neither duplicate triples nor
    self-loops: its three largest relations get 30 duplicated triples and 10 self-loops
    each, shuffled in; every edge carries its position as edge data."""
    graph = load_npz(shared_data("aifb.npz"))
    assert all(rel.src_type == rel.dst_type for rel in graph.relations)
    rng = np.random.default_rng(0)
    n = graph.total_nodes
    edges = dict(graph.edges)
    for rel in sorted(edges, key=lambda r: -edges[r].shape[1])[:3]:
        index = edges[rel]
        copies = index[:, rng.integers(0, index.shape[1], 30)]
        loops = np.tile(rng.integers(0, n, 10), (2, 1))
        noisy = np.concatenate([index, copies, loops], axis=1)
        edges[rel] = noisy[:, rng.permutation(noisy.shape[1])]
    graph = graph.replace(edges=edges, edge_data={
        rel: {"position": np.arange(index.shape[1])} for rel, index in edges.items()})
    return graph, split_edges(graph, VAL, TEST, eval_negatives=K, seed=1, undirected=False)


def held_triples(split, r: int, names=HELD_OUT) -> np.ndarray:
    """Directed keys of relation r's positives in the splits `names` (one node type)."""
    sets = [split.edges[name] for name in names]
    n = split.graph.total_nodes
    return np.concatenate([directed(es.src[es.etype == r], es.dst[es.etype == r], n)
                           for es in sets])


def test_relational_split_holds_out_each_relations_fraction_of_its_distinct_pairs(relational):
    graph, split = relational
    n = graph.total_nodes
    assert split.graph.relations == graph.relations and not split.undirected
    for name, es in split.edges.items():
        assert es.etype.dtype == np.int32
        assert np.all((es.etype >= 0) & (es.etype < len(graph.relations))), name
    held_duplicates = 0
    for r, (s, d) in enumerate(graph.edges.values()):
        keys = directed(s, d, n)
        distinct, copies = np.unique(keys[s != d], return_counts=True)
        per_split = {name: held_triples(split, r, [name]) for name in split.edges}
        # Each distinct (src, dst) once over the three splits; no self-loop.
        np.testing.assert_array_equal(np.sort(np.concatenate(list(per_split.values()))),
                                      distinct, err_msg=str(graph.relations[r]))
        assert per_split["val"].size == round(VAL * distinct.size), graph.relations[r]
        assert per_split["test"].size == round(TEST * distinct.size), graph.relations[r]
        held = np.concatenate([per_split[name] for name in HELD_OUT])
        held_duplicates += np.isin(distinct[copies > 1], held).sum()
    assert held_duplicates, "the fixture should hold out at least one duplicated triple"


def test_held_out_triples_leave_their_relation_and_the_reverse_relation(relational):
    graph, split = relational
    n = graph.total_nodes
    reversed_graph = add_reverse_relations(split.graph)
    for r, (rel, (s, d)) in enumerate(graph.edges.items()):
        held = held_triples(split, r)
        kept = split.graph.edges[rel]
        # The relation less every copy of a held-out triple; self-loops stay.
        gone = np.isin(directed(s, d, n), held)
        np.testing.assert_array_equal(np.sort(directed(*kept, n)),
                                      np.sort(directed(s[~gone], d[~gone], n)))
        assert np.sum(kept[0] == kept[1]) == np.sum(s == d), rel
        # Edge data still belongs to its edge.
        position = split.graph.edge_data[rel]["position"]
        np.testing.assert_array_equal(graph.edges[rel][:, position], kept)
        # The inverse relation, built afterwards, holds no held-out triple reversed,
        # and holds every training triple reversed.
        rev = reversed_graph.edges[Relation(rel.dst_type, "rev_" + rel.name, rel.src_type)]
        assert not np.isin(directed(rev[1], rev[0], n), held).any(), rel
        assert np.isin(held_triples(split, r, ["train"]), directed(rev[1], rev[0], n)).all()


# -- negatives --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def heterogeneous(shared_data):
    """(ACM, its split): paper->author and paper->subject, types of different sizes."""
    graph = load_npz(shared_data("heco_acm.npz"))
    return graph, split_edges(graph, VAL, TEST, eval_negatives=K, seed=2)


def test_relations_between_types_split_every_pair_even_with_equal_local_ids(heterogeneous):
    """Between two types, equal local ids are two different nodes, not a self-loop."""
    graph, split = heterogeneous
    offsets = graph.type_offsets()
    equal_ids = 0
    for r, (rel, (s, d)) in enumerate(graph.edges.items()):
        n_dst = graph.num_nodes[rel.dst_type]
        distinct = np.unique(directed(s, d, n_dst))
        equal_ids += np.sum(s == d)
        lo_src = offsets[graph.node_types.index(rel.src_type)]
        lo_dst = offsets[graph.node_types.index(rel.dst_type)]
        per_split = {}
        for name, es in split.edges.items():
            mine = es.etype == r
            per_split[name] = directed(es.src[mine] - lo_src, es.dst[mine] - lo_dst, n_dst)
        np.testing.assert_array_equal(np.sort(np.concatenate(list(per_split.values()))),
                                      distinct, err_msg=str(rel))
        assert per_split["val"].size == round(VAL * distinct.size), rel
        assert per_split["test"].size == round(TEST * distinct.size), rel
    assert equal_ids, "ACM should hold edges between equal local ids"


def test_negatives_are_nodes_of_the_positives_destination_type(heterogeneous):
    graph, split = heterogeneous
    offsets = graph.type_offsets()
    dst_type = np.array([graph.node_types.index(rel.dst_type) for rel in graph.relations])
    src_type = np.array([graph.node_types.index(rel.src_type) for rel in graph.relations])
    assert split.edges["train"].negatives is None
    for name in HELD_OUT:
        es = split.edges[name]
        assert set(es.etype.tolist()) == set(range(len(graph.relations))), name
        assert es.negatives.shape == (len(es), K) and es.negatives.dtype == np.int64
        t, u = dst_type[es.etype], src_type[es.etype]
        assert np.all((es.src >= offsets[u]) & (es.src < offsets[u + 1])), name
        assert np.all((es.dst >= offsets[t]) & (es.dst < offsets[t + 1])), name
        lo, hi = offsets[t][:, None], offsets[t + 1][:, None]
        assert np.all((es.negatives >= lo) & (es.negatives < hi)), name


@pytest.mark.parametrize("name", ["cora", "heco_acm"])
def test_negatives_are_uniform_over_the_destination_type(name, shared_data):
    """Per destination type, the count of each node among all validation and test
    negatives passes a chi-square test of uniformity (Cora: the one-type case)."""
    graph = load(name, shared_data)
    split = split_edges(graph, VAL, TEST, eval_negatives=50, seed=5,
                        undirected=graph.is_homogeneous)
    offsets = graph.type_offsets()
    dst_type = np.array([graph.node_types.index(rel.dst_type) for rel in graph.relations])
    for t, ntype in enumerate(graph.node_types):
        negatives = np.concatenate([split.edges[s].negatives[dst_type[split.edges[s].etype] == t]
                                    for s in HELD_OUT]).ravel()
        if not negatives.size:
            continue
        counts = np.bincount(negatives - offsets[t], minlength=graph.num_nodes[ntype])
        assert counts.size == graph.num_nodes[ntype]
        assert negatives.size / counts.size >= 5, "too few draws for the test"
        p = scipy.stats.chisquare(counts).pvalue
        assert p > 1e-4, f"{ntype}: negatives not uniform (chi-square p = {p:.2e})"


# -- storage with the partition ---------------------------------------------------------------


@pytest.fixture(scope="module", params=[("cora", 1), ("cora", 4), ("heco_acm", 1),
                                        ("heco_acm", 4)], ids=lambda p: f"{p[0]}-{p[1]}")
def stored(request, shared_data, tmp_path_factory):
    """As a run does it: split, then symmetrize (Cora) or add inverse relations (ACM),
    then partition with the splits. (split, graph partitioned, reverse_of, meta,
    opened directory); reverse_of[r]: the relation holding relation r's reverses."""
    name, num_parts = request.param
    graph = load(name, shared_data)
    split = split_edges(graph, VAL, TEST, eval_negatives=K, seed=0,
                        undirected=graph.is_homogeneous)
    r = len(graph.relations)
    if name == "cora":
        seen, reverse_of = symmetrize(split.graph), np.arange(r)
    else:
        seen, reverse_of = add_reverse_relations(split.graph), np.arange(r) + r
    out = tmp_path_factory.mktemp("links") / "p"
    meta = partition_graph(seen, num_parts, "metis", out, edge_splits=split.edges)
    return split, seen, reverse_of, meta, open_partitions(out)


def test_each_part_stores_the_positives_whose_destination_it_owns_in_its_ids(stored):
    split, _, _, meta, pg = stored
    node_map, inverse = np.asarray(pg.node_map()), np.asarray(pg.node_map_inv())
    for name, es in split.edges.items():
        owner = np.searchsorted(np.asarray(meta.offsets), inverse[es.dst], side="right") - 1
        eids = []
        for k in range(pg.num_parts):
            arrays = pg.part(k).edge_splits[name]
            eid = np.asarray(arrays["eid"])
            assert np.all(np.diff(eid) > 0), (name, k)
            np.testing.assert_array_equal(eid, np.flatnonzero(owner == k), err_msg=name)
            assert meta.parts[k].edge_splits[name] == eid.size
            for field in ("src", "dst"):
                assert arrays[field].dtype == np.int64
                np.testing.assert_array_equal(node_map[arrays[field]],
                                              getattr(es, field)[eid], err_msg=(name, field))
            assert arrays["etype"].dtype == np.int32
            np.testing.assert_array_equal(arrays["etype"], es.etype[eid])
            if es.negatives is None:
                assert "negatives" not in arrays
            else:
                assert arrays["negatives"].dtype == np.int64
                np.testing.assert_array_equal(node_map[arrays["negatives"]],
                                              es.negatives[eid], err_msg=name)
            eids.append(eid)
        # Each positive stored once over the parts.
        np.testing.assert_array_equal(np.sort(np.concatenate(eids)), np.arange(len(es)))


def test_meta_records_each_split_with_its_negatives_and_the_directory_checks(stored):
    _, _, _, meta, pg = stored
    expected = {"train": {"negatives": 0}, "val": {"negatives": K}, "test": {"negatives": K}}
    assert meta.edge_splits == expected
    assert pg.meta.edge_splits == expected
    for k in range(pg.num_parts):
        assert not os.path.exists(pg.array_path(k, "edges", "train", "negatives"))
        assert os.path.isfile(pg.array_path(k, "edges", "val", "negatives"))
    pg.check()


def test_no_stored_edge_is_a_held_out_edge_or_its_reverse(stored):
    split, seen, reverse_of, meta, pg = stored
    n = meta.num_nodes
    for r, rel in enumerate(split.graph.relations):
        rev = seen.relations[reverse_of[r]]
        assert (rev.src_type, rev.dst_type) == (rel.dst_type, rel.src_type)
    triple = lambda etype, s, d: (np.asarray(etype, np.int64) * n + s) * n + d
    node_map = np.asarray(pg.node_map())
    stored_keys = []
    for k in range(pg.num_parts):
        part = pg.part(k)
        lo, _ = part.node_range
        dst = lo + np.repeat(np.arange(part.num_nodes), np.diff(part.indptr))
        stored_keys.append(triple(part.etype, node_map[part.indices], node_map[dst]))
    stored_keys = np.concatenate(stored_keys)
    assert stored_keys.size == seen.num_edges
    for name in HELD_OUT:
        es = split.edges[name]
        assert not np.isin(triple(es.etype, es.src, es.dst), stored_keys).any(), name
        reverse = triple(reverse_of[es.etype], es.dst, es.src)
        assert not np.isin(reverse, stored_keys).any(), name
    train = split.edges["train"]
    assert np.isin(triple(train.etype, train.src, train.dst), stored_keys).all()


# -- bad inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("val, test", [(0.5, 0.5), (0.7, 0.4), (-0.1, 0.2), (0.2, 1.0)])
def test_fractions_that_leave_nothing_to_train_are_refused_naming_them(val, test):
    with pytest.raises(GraphError) as raised:
        split_edges(load_dataset("cora"), val, test)
    assert f"val {val}" in str(raised.value) and f"test {test}" in str(raised.value)


def test_a_graph_whose_rounding_leaves_no_training_pair_is_refused():
    tiny = Graph.homogeneous([0, 1], [1, 2], 3, name="tiny")   # 2 pairs: 1 val, 1 test
    with pytest.raises(GraphError, match="'tiny': no training edges are left"):
        split_edges(tiny, 0.45, 0.45)


@pytest.mark.parametrize("count", [0, -3])
def test_fewer_than_one_eval_negative_is_refused(count):
    with pytest.raises(GraphError, match=f"eval_negatives must be >= 1, got {count}"):
        split_edges(load_dataset("cora"), eval_negatives=count)


@pytest.fixture(scope="module")
def cora_split():
    return split_edges(load_dataset("cora"), VAL, TEST, eval_negatives=K, undirected=True)


@pytest.mark.parametrize("field, at, bad", [
    ("src", 3, lambda g: g.total_nodes), ("dst", 0, lambda g: g.total_nodes),
    ("etype", 5, lambda g: len(g.relations)), ("negatives", (2, 1), lambda g: -1)],
    ids=["src", "dst", "etype", "negatives"])
def test_edge_split_ids_outside_the_graph_are_refused_before_writing(
        cora_split, tmp_path, field, at, bad):
    graph = cora_split.graph
    limit = len(graph.relations) if field == "etype" else graph.total_nodes
    values = getattr(cora_split.edges["val"], field).copy()
    values[at] = bad(graph)
    edge_splits = {**cora_split.edges,
                   "val": dataclasses.replace(cora_split.edges["val"], **{field: values})}
    out = tmp_path / "p"
    with pytest.raises(PartitionError, match=rf"edge split 'val': {field} holds {bad(graph)}, "
                                             rf"outside \[0, {limit}\)"):
        partition_graph(graph, 2, "random", out, edge_splits=edge_splits)
    assert not out.exists()


@pytest.fixture(scope="module")
def written(cora_split, tmp_path_factory):
    out = tmp_path_factory.mktemp("links-written") / "p"
    partition_graph(cora_split.graph, 2, "random", out, edge_splits=cora_split.edges)
    return out


# Corruptions of one array of part 1's validation split: each changes the array in
# place and returns the message (after the file's path) that the check must give.


def negative_outside_the_graph(a, n, lo):
    a[3, 2] = n
    return rf"entry \[3, 2\] is {n}; node ids are in \[0, {n}\)"


def destination_of_part_0(a, n, lo):
    a[1] = lo - 1
    return rf"entry 1 is {lo - 1}; part 1 holds the positives whose destination it owns"


def edge_ids_out_of_order(a, n, lo):
    a[:2] = a[1::-1].copy()
    return rf"entry 1 is {a[1]} after {a[0]} at entry 0; edge ids of a split must be sorted"


@pytest.mark.parametrize("array, corrupt", [("negatives", negative_outside_the_graph),
                                            ("dst", destination_of_part_0),
                                            ("eid", edge_ids_out_of_order)])
def test_a_corrupted_edge_split_file_is_found_naming_the_file(written, tmp_path, array,
                                                                corrupt):
    """`check_part` (run when a part is opened for training) and the full check both
    name the file and the entry."""
    root = tmp_path / "p"
    shutil.copytree(written, root)
    pg = open_partitions(root)
    path = pg.array_path(1, "edges", "val", array)
    a = np.load(path)
    rule = corrupt(a, pg.meta.num_nodes, pg.book.part_range(1)[0])
    np.save(path, a)
    message = f"^{re.escape(path)}: {rule}"
    with pytest.raises(PartitionFormatError, match=message):
        check_part(pg, 1)
    with pytest.raises(PartitionFormatError, match=message):
        open_partitions(root).check()
