"""The multilevel partitioner's steps under several processes (played by threads, with
`jax.distributed`'s key-value store and barriers stood in for), against the same steps
on the whole graph in one process: clusters cross the processes' node ranges and stay
within their size limit, every process ends with the same labels, and the coarse graph
and weights the processes write together are the contraction of the whole graph by
those labels."""
import os
import threading

import numpy as np
import pytest
import scipy.sparse

from jgraph.data import load_dataset, symmetrize
from jgraph.partition import metis, multilevel
from jgraph.partition.adjacency import Chained, CSRAdjacency, build_disk_adjacency
from jgraph.partition.assignment import constraints_for, undirected_adjacency
from jgraph.partition.group import Group

from .test_chunked_partition import ThreadClient, run_as_processes


def in_processes(tmp_path, constraints, adjacency, bounds, work):
    """work(group, rows, weights) in a thread for each process of `bounds` (rows
    [bounds[r], bounds[r + 1]) each, on disk), with a shared scratch folder; their
    results by rank."""
    size = len(bounds) - 1
    client, results = ThreadClient(size), {}
    (tmp_path / "sync").mkdir()

    def one(rank):
        lo, hi = bounds[rank], bounds[rank + 1]
        group = Group(rank, size, client)
        group.use_scratch(str(tmp_path / "sync"))
        results[rank] = work(group, rows_of(tmp_path, adjacency, rank, lo, hi),
                             node_weights(constraints, lo, hi))
    run_as_processes(one, size)
    return [results[r] for r in range(size)]


@pytest.fixture(scope="module")
def facebook(shared_data):
    graph = symmetrize(load_dataset(shared_data("facebook_musae.npz")))
    constraints = constraints_for(graph)
    return undirected_adjacency(graph).tocsr(), constraints


def node_weights(constraints, lo, hi):
    w = constraints.weights[lo:hi]
    return multilevel.NodeWeights(constraints.names,
                                  tuple(w[:, c] for c in range(w.shape[1])))


def rows_of(tmp_path, adjacency, rank, lo, hi):
    coo = adjacency.tocoo()
    mine = (coo.row >= lo) & (coo.row < hi)
    entries = (coo.row[mine], coo.col[mine], coo.data[mine].astype(np.int64))
    return build_disk_adjacency(str(tmp_path / f"rows-{rank}"), adjacency.shape[0],
                                np.array([lo, hi]), [entries], merge=True)


def test_clusters_cross_processes_and_contract_as_the_whole_graph(facebook, tmp_path):
    adjacency, constraints = facebook
    n = adjacency.shape[0]
    bounds = [0, n // 5, n // 2, n]                      # unequal shares of the rows
    whole_weights = node_weights(constraints, 0, n)
    limit = whole_weights.totals()[whole_weights.size_columns()] / 8 / 4

    def process(group, rows, weights):
        # Coarse entries at half the graph's: one level, written whole (no sample).
        levels, coarse, coarse_weights, _, _ = multilevel._coarsen(
            rows, weights, 8, limit, adjacency.nnz // 2, 1, 3, str(tmp_path / "work"),
            print, group=group, entries_per_range=20_000)
        return levels[0][0], coarse, coarse_weights       # the clusters of its own rows
    results = in_processes(tmp_path, constraints, adjacency, bounds, process)
    label = np.concatenate([own for own, _, _ in results])
    assert all(own.size == b - a for (own, _, _), a, b in zip(results, bounds, bounds[1:]))
    k = int(label.max()) + 1
    assert np.array_equal(np.unique(label), np.arange(k))     # numbered 0..k-1
    # Clusters with members in several processes' ranges, none over its limit.
    home = np.searchsorted(bounds, np.arange(n), side="right") - 1
    spans = np.zeros(k, np.int64)
    for r in range(len(bounds) - 1):
        spans += np.bincount(label[home == r], minlength=k) > 0
    assert (spans > 1).sum() > k // 100, (spans > 1).sum()
    sizes = whole_weights.coarsen(label, k)
    for column, most in zip(whole_weights.size_columns(), limit):
        assert sizes.columns[column].max() <= most + 1e-9
    # The coarse graph the processes wrote is the whole graph's contraction.
    written = Chained([coarse for _, coarse, _ in results]).to_csr()
    expected = multilevel.contract(CSRAdjacency(adjacency), label, k, None).csr
    assert written.shape == expected.shape == (k, k)
    assert (written != expected).nnz == 0 and expected.nnz > 0
    for c in range(len(whole_weights.columns)):
        np.testing.assert_array_equal(
            np.concatenate([w.columns[c] for _, _, w in results]), sizes.columns[c])


@pytest.mark.slow        # one process's and four processes' clustering: 2 s
def test_clusters_across_processes_shrink_the_graph_as_one_process_does(facebook, tmp_path,
                                                                        monkeypatch):
    """The production regime's coarsening (many pieces a pass) at 4 processes leaves
    about as many clusters as one process (1.14x measured; confined to their
    processes' nodes they would stay far more), and settles: no two nodes of different
    processes swap clusters pass after pass."""
    adjacency, constraints = facebook
    n = adjacency.shape[0]
    whole_weights = node_weights(constraints, 0, n)
    limit = whole_weights.totals()[whole_weights.size_columns()] / 8 / 4
    monkeypatch.setattr(multilevel, "PIECE_ENTRIES", 4096)
    monkeypatch.setattr(multilevel, "PIECE_ROWS", 512)
    _, one, _ = multilevel.cluster(CSRAdjacency(adjacency, 20_000), whole_weights, limit,
                                   seed=5)

    def process(group, rows, weights):
        moves = []
        _, k, _ = multilevel.cluster(rows, weights, limit, seed=5, group=group,
                                     on_pass=lambda p, moved: p >= 0 and moves.append(moved))
        return k, moves
    (k, moves), *_ = in_processes(tmp_path, constraints, adjacency,
                                  [n * r // 4 for r in range(5)], process)
    assert k <= 1.2 * one, (k, one)
    assert moves[-1] < moves[0] / 4, moves                 # settles: no oscillation


@pytest.mark.slow        # one process's and four processes' refinement: 3 s
def test_refinement_across_processes_fills_freely_and_ends_within_every_limit(
        facebook, tmp_path, monkeypatch):
    """Each process moves its nodes into whatever room it sees, so together they put
    partitions over their limits (the start is within every limit: only the passes
    can); the balance moves after the last pass bring every load back within its
    limit; passes that cannot overfill follow ("polish": balance moves cost cut), and
    the cut ends near one process's refinement of the same start."""
    if metis.Backend.LIBMETIS not in metis.available_backends():
        pytest.skip("libmetis (cmeel-metis) is not installed: pymetis balances one "
                    "constraint only, and the start must be within every limit")
    adjacency, constraints = facebook
    n = adjacency.shape[0]
    monkeypatch.setattr(multilevel, "PIECE_ENTRIES", 4096)
    monkeypatch.setattr(multilevel, "PIECE_ROWS", 512)
    # As a level's start is: a good partition (METIS's, balanced to 1.01) after a
    # coarser level's moves, here a tenth of the nodes swapped at random in pairs.
    start = metis.part_kway(adjacency, constraints.weights, 8, seed=1, imbalance=0.01,
                            backend=metis.Backend.LIBMETIS)
    rng = np.random.default_rng(0)
    a, b = rng.choice(n, (2, n // 20), replace=False)
    start[a], start[b] = start[b], start[a]
    whole = node_weights(constraints, 0, n)
    limits = multilevel.balance_limits(whole.totals(), 8, 0.05)
    assert (whole.loads(start, 8) <= limits).all()
    one = multilevel.refine(CSRAdjacency(adjacency, 20_000), start.copy(), whole, 8, 0.05,
                            seed=3)
    passes = []

    def process(group, rows, weights):
        return multilevel.refine(rows, start.copy(), weights, 8, 0.05, seed=3, group=group,
                                 on_pass=lambda kind, *_: passes.append(kind))
    results = in_processes(tmp_path, constraints, adjacency,
                           [n * r // 4 for r in range(5)], process)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])      # every process's the same
    assert "balance" in passes                  # the passes overfilled a partition
    assert "polish" in passes
    loads = whole.loads(results[0], 8)
    assert (loads <= limits + 1e-9).all(), (loads / limits).max()
    cut = lambda parts: multilevel.cut_weight(CSRAdjacency(adjacency), parts)
    assert cut(results[0]) < 0.8 * cut(start)
    assert cut(results[0]) <= 1.10 * cut(one), (cut(results[0]), cut(one))    # 1.04


def test_nodes_left_alone_are_paired_by_their_best_cluster():
    """Isolated nodes, and the leaves of a hub whose cluster is full, stay singletons
    under label propagation; they are paired (two-hop clustering), so that coarsening
    a power-law graph does not stall: isolated nodes with each other, leaves with
    leaves of the same hub, two to a cluster."""
    isolated, leaves = np.arange(0, 400), np.arange(401, 800)
    hub = 400
    rows = np.concatenate([np.full(leaves.size, hub), leaves])
    cols = np.concatenate([leaves, np.full(leaves.size, hub)])
    n = 800
    adjacency = scipy.sparse.csr_matrix((np.ones(rows.size, np.int64), (rows, cols)),
                                        shape=(n, n))
    weights = multilevel.NodeWeights(("nodes", "edges"), (
        np.ones(n, np.uint8), np.diff(adjacency.indptr).astype(np.int64)))
    label, k, _ = multilevel.cluster(CSRAdjacency(adjacency), weights,
                                     np.array([50.0, 10.0**6]), seed=0)
    members = np.bincount(label, minlength=k)
    assert members.max() <= 50
    # Isolated nodes two to a cluster, with each other only.
    np.testing.assert_array_equal(members[label[isolated]], 2)
    assert set(label[isolated]).isdisjoint(label[leaves]) and hub not in isolated
    # Leaves whose hub's cluster was full are paired with each other: none alone
    # (but one of an odd count), none with an isolated node.
    small = leaves[members[label[leaves]] <= 2]
    assert small.size > 100 and (members[label[small]] == 1).sum() <= 1
    assert k <= 1 + isolated.size // 2 + (leaves.size - small.size) // 40 + -(-small.size // 2)


@pytest.mark.slow        # three levels and a partition in three threads: 3 s
def test_a_process_whose_nodes_all_join_others_clusters_owns_none(tmp_path, monkeypatch):
    """A process of one node that joins a cluster of the next process owns no cluster
    and, a level on, no rows: it still writes its (empty) share of the coarse graph
    under a file number of its own, and the processes agree on a partition that keeps
    the limits."""
    import types
    pairs = [(8 * b + j, 8 * b + j + 4, 5) for b in range(2) for j in range(4)]
    pairs += [(16, 17, 9)]
    pairs += [(18 + 8 * b + j, 18 + 8 * b + j + 4, 5) for b in range(2) for j in range(4)]
    pairs += [(i, i + 1, 1) for i in list(range(0, 15)) + list(range(18, 33))]
    n = 34
    a, b, w = (np.array(x) for x in zip(*pairs))
    adjacency = scipy.sparse.csr_matrix((np.concatenate([w, w]).astype(np.int64),
                                         (np.concatenate([a, b]), np.concatenate([b, a]))),
                                        shape=(n, n))
    degree = np.diff(adjacency.indptr)
    constraints = types.SimpleNamespace(names=("nodes", "edges"),
                                        weights=np.stack([np.ones(n, np.int64), degree], 1))
    bounds = [0, 16, 17, n]
    monkeypatch.setattr(multilevel, "PIECE_ROWS", 1)     # a row at a time: no swaps

    def process(group, rows, weights):
        levels, coarse, _, _, _ = multilevel._coarsen(
            rows, weights, 2, np.array([2.0, 1e9]), 10, 3, 3, str(tmp_path / "work"), print,
            group=group, entries_per_range=1000)
        return levels[0][0], coarse.start, coarse.stop, coarse.first
    results = in_processes(tmp_path, constraints, adjacency, bounds, process)
    label = np.concatenate([r[0] for r in results])         # each process's own rows
    assert label[16] == label[17] and label[16] != 16       # joined the next process's
    starts, stops, firsts = zip(*[r[1:] for r in results])
    assert len(set(firsts)) == 3 and list(starts[1:]) == list(stops[:-1])

    # METIS runs in a folder of its own (chdir): threads standing in for processes
    # share one working directory, so their METIS runs take turns.
    metis, real = threading.Lock(), multilevel.part_kway

    def part_kway(*args, **kwargs):
        with metis:
            return real(*args, **kwargs)
    monkeypatch.setattr(multilevel, "part_kway", part_kway)
    before = os.getcwd()

    def whole(group, rows, weights):
        return multilevel.partition(rows, weights, 2, coarse_entries=10, seed=3,
                                    workdir=str(tmp_path / "whole"),
                                    max_levels=3, range_entries=2000, group=group)[0]
    (tmp_path / "sync").rmdir()
    (tmp_path / "whole").mkdir()
    parts = in_processes(tmp_path, constraints, adjacency, bounds, whole)
    for other in parts[1:]:
        np.testing.assert_array_equal(other, parts[0])
    assert os.getcwd() == before
    loads = np.bincount(parts[0], minlength=2)
    assert parts[0].size == n and loads.max() <= max(1.05 * n / 2, np.ceil(n / 2))


def _split_in_threads(tmp_path, label, parts, bounds, owners, num_parts):
    """`_split_by_parts` in a thread for each process of the node `bounds`, each with
    its own nodes' clusters and partitions: every process's result, by rank."""
    size = len(bounds) - 1
    client, results = ThreadClient(size), {}
    (tmp_path / "sync").mkdir()

    def one(rank):
        group = Group(rank, size, client)
        group.use_scratch(str(tmp_path / "sync"))
        lo, hi = bounds[rank], bounds[rank + 1]
        results[rank] = multilevel._split_by_parts(
            label[lo:hi].copy(), parts[lo:hi].copy(), np.array(bounds), owners, num_parts,
            group)
    run_as_processes(one, size)
    return [results[r] for r in range(size)]


@pytest.mark.parametrize("node_bounds", [[0, 5000], [0, 1700, 1700, 3100, 5000]],
                         ids=["one process", "four processes, one without nodes"])
def test_a_v_cycle_splits_the_first_cycle_s_clusters_by_partition(tmp_path, node_bounds):
    """The V-cycle's finest level is the first cycle's clusters split by partition, not
    clustered again: each (cluster, partition) of the nodes is one cluster, numbered in
    cluster order, a cluster's piece in its first node's partition first, so each
    process owns the pieces of the clusters it owned; every process, from its own
    nodes alone, ends with every node's piece and every piece's partition, equal to a
    reference computed from every node at once."""
    rng = np.random.default_rng(0)
    n, k, num_parts = 5000, 300, 4
    label = rng.integers(0, k, n).astype(np.int32)
    label[rng.permutation(n)[:k]] = np.arange(k)         # every cluster has a node
    parts = rng.integers(0, num_parts, k)[label].astype(np.int32)
    moved = rng.choice(n, 200, replace=False)            # refinement's moves of single nodes
    parts[moved] = rng.integers(0, num_parts, moved.size)
    owners = np.array([0, 90, 90, 200, 300])              # the second process owns none
    owners = owners[[0, -1]] if len(node_bounds) == 2 else owners
    results = _split_in_threads(tmp_path, label, parts, node_bounds, owners, num_parts)
    (split, k2, owners2), piece_parts = results[0]
    for (other, k_other, owners_other), other_parts in results[1:]:
        np.testing.assert_array_equal(other, split)
        np.testing.assert_array_equal(other_parts, piece_parts)
        assert k_other == k2
        np.testing.assert_array_equal(owners_other, owners2)
    # The reference: every node's (cluster, partition) pieces, in cluster order, the
    # piece of the cluster's first node first, then the others by partition.
    first = {}
    for v in range(n):
        first.setdefault(int(label[v]), v)
    order = sorted(set(zip(label.tolist(), parts.tolist())),
                   key=lambda cp: (cp[0], cp[1] != parts[first[cp[0]]], cp[1]))
    number = {cp: i for i, cp in enumerate(order)}
    assert k2 == len(order)
    np.testing.assert_array_equal(split, [number[c, p] for c, p in zip(label.tolist(),
                                                                         parts.tolist())])
    np.testing.assert_array_equal(piece_parts, [p for _, p in order])
    np.testing.assert_array_equal(piece_parts[split], parts)
    for r in range(owners.size - 1):
        mine = [number[cp] for cp in order if owners[r] <= cp[0] < owners[r + 1]]
        assert all(owners2[r] <= v < owners2[r + 1] for v in mine)
    assert owners2[0] == 0 and owners2[-1] == k2


def test_sums_at_owners_are_the_sums_over_every_process(tmp_path):
    """`Group.add_at_owners`: each process gets, for the ids it owns, every process's
    values summed at those ids (columns of their own dtypes, ids at the ends of the
    owners' ranges, an owner of no ids, a process with no values)."""
    rng = np.random.default_rng(3)
    owners = np.array([0, 40, 40, 97, 130])
    ids = [rng.integers(0, 130, m) for m in (500, 0, 300, 211)]
    ids[0][:4] = [0, 39, 40, 129]
    columns = [[rng.integers(0, 3, i.size).astype(np.uint8),
                rng.integers(-2**40, 2**40, i.size)] for i in ids]
    client, results = ThreadClient(4), {}
    (tmp_path / "sync").mkdir()

    def one(rank):
        group = Group(rank, 4, client)
        group.use_scratch(str(tmp_path / "sync"))
        results[rank] = group.add_at_owners(ids[rank], columns[rank], owners, "sums")
    run_as_processes(one, 4)
    every = np.concatenate(ids)
    for c in range(2):
        whole = np.zeros(130)
        np.add.at(whole, every, np.concatenate([col[c] for col in columns]).astype(np.float64))
        np.testing.assert_array_equal(np.concatenate([results[r][:, c] for r in range(4)]),
                                      whole)
    assert results[1].shape == (0, 2)


def test_values_looked_up_at_their_owners_are_the_array_s(tmp_path):
    """`Group.look_up`: each process gets values[ids] of an array it holds only its part
    of, in the order asked (ids repeated, at the ends of the owners' ranges, an owner
    that holds nothing, a process that asks nothing)."""
    rng = np.random.default_rng(5)
    owners = np.array([0, 40, 40, 97, 130])
    values = rng.integers(-2**40, 2**40, 130)
    ids = [rng.integers(0, 130, m) for m in (500, 0, 300, 211)]
    ids[0][:5] = [0, 39, 40, 129, 39]
    client, results = ThreadClient(4), {}
    (tmp_path / "sync").mkdir()

    def one(rank):
        group = Group(rank, 4, client)
        group.use_scratch(str(tmp_path / "sync"))
        own = values[owners[rank]:owners[rank + 1]]
        results[rank] = [group.look_up(ids[rank], own, owners, "values")
                         for _ in range(2)]         # twice: a name used again
    run_as_processes(one, 4)
    for rank in range(4):
        for got in results[rank]:
            np.testing.assert_array_equal(got, values[ids[rank]])
            assert got.dtype == values.dtype
    single = Group.single()
    np.testing.assert_array_equal(single.look_up(ids[0], values, [0, 130], "v"),
                                  values[ids[0]])
