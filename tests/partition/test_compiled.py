"""The compiled label-propagation kernels (`jgraph.partition.compiled`, numba) propose
what the numpy reference proposes, bit for bit: the same clusters and the same
partitions, on unweighted and weighted (coarse) graphs, with and without partitions to
stay in, in refinement and in balance moves, in one process's rows and in a slice of
them."""
import numpy as np
import pytest
import scipy.sparse

from jgraph.data import load_dataset, symmetrize
from jgraph.partition import compiled
from jgraph.partition.adjacency import CSRAdjacency, Rows
from jgraph.partition.multilevel import NodeWeights, cluster, contract, refine


@pytest.fixture(scope="module")
def facebook(shared_data):
    graph = symmetrize(load_dataset(shared_data("facebook_musae.npz")))
    src, dst, _ = graph.homogeneous_edges()
    n = graph.total_nodes
    keep = src != dst
    csr = scipy.sparse.csr_matrix((np.ones(int(keep.sum()), np.int64), (src[keep], dst[keep])),
                                  shape=(n, n))
    adjacency = CSRAdjacency(csr, 20_000)
    train = np.zeros(n, np.uint8)
    train[graph.splits["_N"]["train"]] = 1
    weights = NodeWeights(("nodes", "train", "edges"),
                          (np.ones(n, np.uint8), train,
                           np.asarray(csr.sum(axis=0)).ravel().astype(np.int64)))
    return adjacency, weights


def both(monkeypatch, run):
    """run() with the kernels, then with numpy."""
    assert compiled.enabled(), "numba is part of the test extra"
    first = run()
    monkeypatch.setenv("JGRAPH_PARTITION_KERNELS", "numpy")
    assert not compiled.enabled()
    second = run()
    monkeypatch.delenv("JGRAPH_PARTITION_KERNELS")
    return first, second


def test_clusters_are_the_numpy_clusters(facebook, monkeypatch):
    adjacency, weights = facebook
    limit = weights.totals()[weights.size_columns()] / 8 / 4
    parts = (np.arange(adjacency.num_nodes) * 7 % 5).astype(np.int32)
    for given in (None, parts):
        (a, ka, _), (b, kb, _) = both(monkeypatch, lambda given=given: cluster(
            adjacency, weights, limit, seed=3, parts=given))
        np.testing.assert_array_equal(a, b)
        assert ka == kb < adjacency.num_nodes
    # Weighted: a contracted graph, clustered again.
    label, k, _ = cluster(adjacency, weights, limit, seed=1)
    coarse = contract(adjacency, label, k, None)
    assert coarse.weighted
    coarse_weights = weights.coarsen(label, k)
    (a, _, _), (b, _, _) = both(monkeypatch, lambda: cluster(coarse, coarse_weights, limit,
                                                             seed=5))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("start", ["spread", "lopsided"])
def test_refinement_and_balance_moves_are_the_numpy_moves(facebook, monkeypatch, start):
    adjacency, weights = facebook
    n = adjacency.num_nodes
    rng = np.random.default_rng(0)
    # lopsided: most nodes in two partitions, so balance moves run too.
    initial = (rng.integers(0, 8, n) if start == "spread"
               else np.where(rng.random(n) < 0.8, rng.integers(0, 2, n), rng.integers(0, 8, n)))
    a, b = both(monkeypatch, lambda: refine(adjacency, initial.astype(np.int32).copy(),
                                            weights, 8, 0.05, seed=2))
    np.testing.assert_array_equal(a, b)
    assert (a != initial).sum() > n // 100                 # nodes moved


def test_a_slice_of_the_rows_proposes_as_numpy_does(facebook, monkeypatch):
    """One process's rows (lo > 0), with neighbours outside them (whose clusters may be
    anywhere), weighted entries."""
    adjacency, _ = facebook
    csr = adjacency.csr
    lo, hi = 5000, 12000
    sub = csr[lo:hi]
    piece = Rows(lo, sub.indptr.astype(np.int64), sub.indices,
                 np.arange(sub.nnz, dtype=np.int64) % 3 + 1)
    label = (np.arange(csr.shape[0]) // 2 * 2).astype(np.int32)
    from jgraph.partition.multilevel import _cluster_proposal
    a, b = both(monkeypatch, lambda: _cluster_proposal(piece, label, 11, None))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a[0].size > 0


@pytest.mark.parametrize("keep", [1.0, 0.3])
def test_contraction_is_the_numpy_contraction(facebook, monkeypatch, keep):
    """The coarse graph's entries (sampled or whole, unweighted and weighted) and the
    disk CSR they are written into: the same with the kernels as with numpy."""
    adjacency, weights = facebook
    limit = weights.totals()[weights.size_columns()] / 8 / 4
    label, k, _ = cluster(adjacency, weights, limit, seed=1)
    a, b = both(monkeypatch, lambda: contract(adjacency, label, k, None, keep=keep, seed=4))
    assert (a.csr != b.csr).nnz == 0 and a.csr.nnz > 0
    # Weighted rows, kept by the hash of their ends.
    coarse = a
    label2, k2, _ = cluster(coarse, weights.coarsen(label, k), limit, seed=2)
    a2, b2 = both(monkeypatch, lambda: contract(coarse, label2, k2, None, keep=keep, seed=5))
    assert (a2.csr != b2.csr).nnz == 0 and a2.csr.nnz > 0
    assert k2 < k


def test_counting_is_bincount(monkeypatch):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 1000, 50_000).astype(np.int32)

    def run():
        counts = np.full(1000, 7, np.int32)
        compiled.count_into(counts, ids)
        compiled.count_into(counts, ids[::3])
        return counts
    a, b = both(monkeypatch, run)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, 7 + np.bincount(ids, minlength=1000)
                                  + np.bincount(ids[::3], minlength=1000))


def test_counting_a_range_counts_only_its_ids(monkeypatch):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 1000, 50_000).astype(np.int32)

    def run():
        counts = np.zeros(300, np.int64)
        compiled.count_into(counts, ids, lo=600)
        compiled.count_into(counts, ids, lo=600)
        return counts
    a, b = both(monkeypatch, run)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, 2 * np.bincount(ids, minlength=1000)[600:900])


@pytest.mark.parametrize("counts", ["all twice", "some thrice"])
def test_ranges_that_store_repeated_pairs_once_propose_as_numpy_does(facebook, monkeypatch,
                                                                     tmp_path, counts):
    """A finest range on disk that stores each repeated pair once with its count (one
    value broadcast, or uint8 counts) gives the kernels the same proposals as numpy."""
    from jgraph.partition.adjacency import build_disk_adjacency
    adjacency, weights = facebook
    coo = adjacency.csr.tocoo()
    rows, cols = np.repeat(coo.row, 2), np.repeat(coo.col, 2)
    if counts == "some thrice":
        rows, cols = np.concatenate([rows, coo.row[::7]]), np.concatenate([cols, coo.col[::7]])
    n = adjacency.num_nodes
    disk = build_disk_adjacency(str(tmp_path / "a"), n, np.array([0, n // 3, n]),
                                [(rows, cols, None)], merge=False)
    kinds = {(p.weights.dtype.str, p.weights.strides[0] == 0) for p in disk.ranges()}
    assert kinds == ({("|u1", True)} if counts == "all twice" else {("|u1", False)})
    limit = weights.totals()[weights.size_columns()] / 8 / 4
    (a, _, _), (b, _, _) = both(monkeypatch, lambda: cluster(disk, weights, limit, seed=3))
    np.testing.assert_array_equal(a, b)
    initial = (np.arange(n) * 7 % 8).astype(np.int32)
    a, b = both(monkeypatch, lambda: refine(disk, initial.copy(), weights, 8, 0.05, seed=2))
    np.testing.assert_array_equal(a, b)


# Marking the movers' neighbours however many move (1.0), and as jgraph does: the
# passes after one that moved many nodes visit every node.
MARKED = [1.0, None]


@pytest.mark.parametrize("marked", MARKED)
@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_skipping_settled_nodes_moves_the_same_nodes(facebook, monkeypatch, kernels, marked):
    """Refinement that visits only the nodes that may move (those that would gain by a
    move, and the moved nodes' neighbours) makes the moves that visiting every node
    every pass makes, bit for bit, and visits fewer nodes once few move."""
    import jgraph.partition.multilevel as multilevel
    if kernels == "numpy":
        monkeypatch.setenv("JGRAPH_PARTITION_KERNELS", "numpy")
    if marked is not None:
        monkeypatch.setattr(multilevel, "MARKED_MOVES_AT_MOST", marked)
    adjacency, weights = facebook
    n = adjacency.num_nodes
    # Blocks of ids with a fifth of the nodes scattered: many moves, then few.
    rng = np.random.default_rng(5)
    initial = np.where(rng.random(n) < 0.2, rng.integers(0, 8, n),
                       np.arange(n) * 8 // n).astype(np.int32)

    def run(skip):
        monkeypatch.setattr(multilevel, "SKIP_SETTLED", skip)
        heard = []
        parts = refine(adjacency, initial.copy(), weights, 8, 0.05, seed=4, passes=8,
                       on_pass=lambda *a: heard.append(a))
        return parts, heard
    full, heard_full = run(False)
    skipped, heard_skipped = run(True)
    np.testing.assert_array_equal(full, skipped)
    label = [h for h in heard_skipped if h[0] == "refine"]
    assert [h[:4] for h in label] == [h[:4] for h in heard_full if h[0] == "refine"]
    assert len(label) >= 3 and label[0][5] is None             # the first visits all
    visited = [h[5] for h in label[1:]]
    if marked == 1.0:
        assert all(v is not None and v < n for v in visited), visited
    else:
        # A pass after one that moved more than MARKED_MOVES_AT_MOST visits every node.
        moved = [h[2] for h in label[:-1]]
        many = [m > multilevel.MARKED_MOVES_AT_MOST * n for m in moved]
        assert [v is None for v in visited] == many and not all(many), (moved, visited)
    assert (full != initial).sum() > n // 20


@pytest.mark.parametrize("marked", MARKED)
@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_skipping_settled_nodes_joins_the_same_clusters(facebook, monkeypatch, kernels,
                                                        marked):
    """Coarsening's label propagation that visits, after its first pass, only the nodes
    whose best cluster was another and the joiners' neighbours forms the clusters that
    visiting every node every pass forms, with and without partitions to stay in."""
    import jgraph.partition.multilevel as multilevel
    if kernels == "numpy":
        monkeypatch.setenv("JGRAPH_PARTITION_KERNELS", "numpy")
    if marked is not None:
        monkeypatch.setattr(multilevel, "MARKED_MOVES_AT_MOST", marked)
    visited = []
    rows = compiled.cluster_rows
    monkeypatch.setattr(compiled, "cluster_rows", lambda piece, label, salt, parts, visit: (
        visited.append((salt, len(visit))), rows(piece, label, salt, parts, visit))[1])
    adjacency, weights = facebook
    n = adjacency.num_nodes
    limit = weights.totals()[weights.size_columns()] / 8 / 16
    parts = (np.arange(n) * 8 // n).astype(np.int32)
    for given in (None, parts):
        out = []
        for skip in (False, True):
            monkeypatch.setattr(multilevel, "SKIP_SETTLED", skip)
            heard = []
            visited.clear()
            out.append((cluster(adjacency, weights, limit, seed=3, parts=given, passes=6,
                                on_pass=lambda p, moved, heard=heard: heard.append(moved)),
                        heard))
        (a, heard_a), (b, heard_b) = out
        np.testing.assert_array_equal(a.label, b.label)
        assert heard_a == heard_b and len(heard_a) >= 3 and heard_a[1] > 0, heard_a
        if kernels == "numba":      # the rows each pass gave the kernel, skipping
            per_pass: dict = {}
            for salt, k in visited:
                per_pass[salt] = per_pass.get(salt, 0) + k
            counts = list(per_pass.values())
            # The first pass visits every node, and so does one after a pass that
            # moved more than MARKED_MOVES_AT_MOST of them.
            many = [True] + [m > multilevel.MARKED_MOVES_AT_MOST * n for m in heard_b]
            assert all(c == n for c, m in zip(counts, many) if m), (heard_b, counts)
            if given is None:
                assert counts[-1] < n, (heard_b, counts)
