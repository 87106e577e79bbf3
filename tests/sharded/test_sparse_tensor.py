"""Sparse node features on the mesh: a partition's sparse rows open as a DistTensor of
`SparseRows`, read by row id on the host and by global id through the exchange (with
and without the hot-node cache) exactly as the dense features, while the exchange moves
only the stored entries."""
import functools

import jax
import numpy as np
import pytest

from jgraph.data import SparseRows
from jgraph.partition import open_partitions, partition_graph
from jgraph.sharded import REPLICATED, ROWS, DistGraph, ExchangeConfig, HotCache

P, n = 8, 24


@pytest.fixture(scope="module")
def setup(cora, mesh, tmp_path_factory):
    dense = cora.node_data["_N"]["feat"]
    sparse = cora.replace(node_data={"_N": {**cora.node_data["_N"],
                                            "feat": SparseRows.from_dense(dense)}})
    out = tmp_path_factory.mktemp("cora_sparse8") / "parts"
    partition_graph(sparse, P, "metis", out)
    dg = DistGraph(open_partitions(out), mesh)
    # Features in the partition's (new) id order.
    values = dense[np.asarray(dg.parts.node_map())]
    return dg, dg.ndata("feat"), values, dg.exchange(ExchangeConfig(relay=False))


@functools.cache
def lookup_fn(tensor, exchange, with_cache):
    def body(shard, ids, valid, *cache):
        rows, stats = tensor.lookup(exchange, shard, ids, valid, cache=cache if cache else None)
        return rows.todense(), stats
    specs = (ROWS, ROWS, ROWS) + ((REPLICATED, REPLICATED) if with_cache else ())
    return jax.jit(jax.shard_map(body, mesh=tensor.mesh, in_specs=specs,
                                 out_specs=(ROWS, REPLICATED)))


def test_sparse_features_open_as_sparse_rows_with_the_dense_shape(setup):
    _, feat, values, _ = setup
    assert feat.sparse and isinstance(feat.array, SparseRows)
    assert feat.shape == values.shape and feat.dtype == np.float32
    assert feat.array.nnz_per_row == int((values != 0).sum(1).max())
    np.testing.assert_array_equal(feat[:], values)
    ids = np.array([5, 0, 2707, 5])
    np.testing.assert_array_equal(feat[ids], values[ids])
    with pytest.raises(TypeError, match="feat: sparse rows are read-only"):
        feat[0] = 1.0


@pytest.mark.parametrize("cached", [False, True])
def test_lookup_through_the_exchange_returns_the_dense_rows(setup, cached):
    dg, feat, values, exchange = setup
    rng = np.random.default_rng(0)
    ids = rng.integers(0, dg.meta.num_nodes, P * n).astype(np.int32)
    valid = rng.random(P * n) < 0.9
    args = (feat.array, ids, valid)
    if cached:
        _, out_degree = dg.degrees()
        args += HotCache.top(out_degree, 0.2).device_args(feat)
    rows, stats = lookup_fn(feat, exchange, cached)(*args)
    np.testing.assert_array_equal(np.asarray(rows), np.where(valid[:, None], values[ids], 0))
    assert int(stats.overflow) == 0 and int(stats.non_local) > 0
    assert int(stats.cached) > 0 if cached else int(stats.cached) == 0


def test_the_exchange_moves_the_stored_entries_not_the_dense_rows(setup):
    dg, feat, values, exchange = setup
    rng = np.random.default_rng(1)
    ids = rng.integers(0, dg.meta.num_nodes, P * n).astype(np.int32)
    valid = np.ones(P * n, bool)
    _, stats = lookup_fn(feat, exchange, False)(feat.array, ids, valid)
    k = feat.array.nnz_per_row
    # Each remote row costs its id (4 bytes) out and its K indices and K values back;
    # a dense row would be 1,433 floats.
    assert k * 8 < values.shape[1] * 4
    wire = float(stats.wire_bytes)
    assert wire > 0 and wire % (4 + 8 * k) == 0, (wire, k)
