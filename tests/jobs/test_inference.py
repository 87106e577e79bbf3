"""Layer-wise full-graph inference (`jgraph.jobs.inference`) on simulated devices equals
the same model applied on one device to the whole graph, every node reading all of its
in-neighbours (a dense reference built here from the partitions' CSC, with masks):

  * GraphSAGE (mean, pool) and GAT on cora, 8 METIS parts on 8 devices, with windows
    small enough that every layer walks many windows and hubs' in-edges span several
    (GAT's softmax then runs across windows);
  * R-GCN (basis and block decomposition) with learnable embeddings on AIFB (inverse
    relations added), 4 parts on the first 4 devices;
  * the full-graph evaluation scores cora's val and test splits exactly as the sampled
    evaluator with every neighbour (fanouts -1, -1) does.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jgraph.bench.exchange import global_csc
from jgraph.data import add_reverse_relations, load_dataset, load_npz
from jgraph.jobs import build_run
from jgraph.jobs.dataset import run_mesh
from jgraph.jobs.evaluate import SampledEvaluator, evaluate_splits
from jgraph.jobs.experiment import (
    DataConfig,
    Experiment,
    Inference,
    ModelConfig,
    TrainConfig,
)
from jgraph.jobs.inference import edge_window, full_graph_logits
from jgraph.models import Aggregator, Decomposition, Neighbourhood, OneHotRelGraphConv
from jgraph.partition import partition_graph
from jgraph.sharded import REPLICATED, ROWS, DistGraph, ExchangeConfig

pytestmark = pytest.mark.slow     # full-graph programs of several models

# Small windows: many per layer, and a hub's in-edges span several of them.
WINDOW_FLOATS, SMALLEST_WINDOW = 64, 16
# Neighbour slots per chunk of the dense reference (bounds the rows it gathers at once).
REFERENCE_SLOTS = 1 << 14
# Every exchange strategy and ladder gives the same rows; two rungs per transfer keep
# the compiled programs (one lax.switch branch per rung) small.
EXCHANGE = ExchangeConfig(growth=2.0, relay=False, max_rungs=2)


# -- helpers ---------------------------------------------------------------------------

# (id of the Run, window_floats, smallest_window) -> (the Run, kept alive so that its id
# is not reused, and its jitted function).
_COMPILED = {}


def sharded_logits(run, params, embeddings, window_floats=WINDOW_FLOATS,
                   smallest_window=SMALLEST_WINDOW):
    """(logits float[N, C] by global id, ids lost by the exchange) from
    `full_graph_logits` under shard_map on the run's mesh."""
    job, dg = run.job, run.dg
    key = (id(run), window_floats, smallest_window)
    if key not in _COMPILED:
        def per_device(params, embeddings, data):
            model = nnx.merge(job.graphdef, params)
            # `lost` sums the exchange's statistics, already summed over devices.
            return full_graph_logits(model, job.inputs, data.features, embeddings,
                                     data.graph, job.exchange, window_floats,
                                     smallest_window)

        _COMPILED[key] = run, jax.jit(jax.shard_map(
            per_device, mesh=job.mesh,
            in_specs=(REPLICATED, job.inputs.embedding_specs(), job.data_specs(dg.graph)),
            out_specs=(ROWS, REPLICATED)))
    blocks, lost = _COMPILED[key][1](params, embeddings, job.data(dg.graph))
    n = dg.graph.nodes_per_part
    blocks = np.asarray(blocks).reshape(dg.num_parts, n, -1)
    offsets = np.asarray(dg.book.offsets)
    # Device k's local row i is global id offsets[k] + i; rows past the size are padding.
    logits = np.concatenate([blocks[k, :offsets[k + 1] - offsets[k]]
                             for k in range(dg.num_parts)])
    assert logits.shape[0] == dg.meta.num_nodes
    return logits, int(lost)


def global_etype(dg) -> np.ndarray:
    """int[E]: relation of every in-edge, in `global_csc` order."""
    return np.concatenate([np.asarray(dg.parts.part(k).etype) for k in range(dg.num_parts)])


def degree_tiers(deg: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """[(width, node ids)]: every node once, in the tier of the smallest width (8, 64,
    512, ...) that holds its in-degree."""
    tier = np.zeros(deg.size, np.int64)
    while np.any(deg > 8 ** (tier + 1)):
        tier = np.where(deg > 8 ** (tier + 1), tier + 1, tier)
    return [(8 ** (int(t) + 1), np.flatnonzero(tier == t)) for t in np.unique(tier)]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _dense_layer(graphdef, i, params, h, dst, nbr, mask, etype):
    """Layer i of the stack for the dst nodes `dst` over the neighbour slots (nbr, mask,
    etype) into all of h, in the Block layout: the dst rows first, then every node's."""
    gnn = nnx.merge(graphdef, params)
    hood = Neighbourhood(jnp.where(mask, nbr + dst.shape[0], -1), mask, etype)
    return gnn.layer(i, jnp.concatenate([h[dst], h]), hood)


def dense_reference(model, x, indptr, indices, etype=None, depth=None):
    """The model on one device over the whole graph: each layer's dst nodes read every
    in-neighbour, padded with a mask, with the layer code of sampled training
    (`LayerStack.layer`). The nodes go in chunks of REFERENCE_SLOTS padded slots, of a
    few fixed shapes (one per degree tier, so a handful of compilations). depth: the
    output of that many layers (default: all, the logits)."""
    graphdef, params = nnx.split(model.gnn)
    n = indptr.size - 1
    deg = np.diff(indptr)
    assert int(deg.sum()) == indices.size
    chunks = []
    for width, ids in degree_tiers(deg):
        rows = max(REFERENCE_SLOTS // width, 1)
        for lo in range(0, ids.size, rows):
            chunk = ids[lo:lo + rows]
            real = np.arange(rows) < chunk.size
            dst = np.zeros(rows, np.int64)
            dst[:chunk.size] = chunk
            slot = np.arange(width)
            mask = real[:, None] & (slot[None, :] < deg[dst][:, None])
            pos = np.where(mask, indptr[dst][:, None] + slot[None, :], 0)
            nbr = np.where(mask, indices[pos], -1).astype(np.int32)
            et = None if etype is None else jnp.asarray(np.where(mask, etype[pos], -1),
                                                        jnp.int32)
            chunks.append((chunk, jnp.asarray(dst, jnp.int32), jnp.asarray(nbr),
                           jnp.asarray(mask), et))
    assert np.array_equal(np.sort(np.concatenate([c[0] for c in chunks])), np.arange(n))
    h = jnp.asarray(x)
    for i in range(depth or model.gnn.num_layers):
        out = None
        for chunk, dst, nbr, mask, et in chunks:
            got = np.asarray(_dense_layer(graphdef, i, params, h, dst, nbr, mask, et))
            if out is None:
                out = np.zeros((n, got.shape[1]), np.float32)
            out[chunk] = got[:chunk.size]
        h = jnp.asarray(out)
    return np.asarray(h)


def message_widths(model, in_width: int) -> list[int]:
    """Columns of each layer's messages (what sets its window), as inference finds them."""
    widths, h = [], jnp.zeros((1, in_width), jnp.float32)
    for i, conv in enumerate(model.gnn.convs):
        widths.append(int(conv.message(h).shape[1]))
        m = conv.message(h)
        h = model.gnn.post(i, conv.update(h, conv.reduce(
            m[:, None, :], jnp.zeros((1, 1), bool), None, **conv.context(m))))
    return widths


def assert_logits_equal(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- cora, GraphSAGE, 8 devices ----------------------------------------------------------

CORA_DEVICES = 8


@pytest.fixture(scope="module")
def cora_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cora8-inference") / "parts"
    partition_graph(load_dataset("cora"), CORA_DEVICES, "metis", root)
    return str(root)


@pytest.fixture(scope="module")
def cora_csc(cora_dir):
    config = sage_config(cora_dir, Aggregator.MEAN)
    dg = DistGraph(cora_dir, run_mesh(config))
    return global_csc(dg)


GAT = "gat"      # in place of an aggregator: the GAT model (2 heads, then 1)


def sage_config(path: str, aggregator) -> Experiment:
    """GraphSAGE with `aggregator`, or GAT (the `GAT` marker)."""
    model = (ModelConfig(kind="gat", hidden=16, num_layers=2, heads=2, dropout=0.5,
                         attn_dropout=0.5) if aggregator == GAT else
             ModelConfig(kind="sage", hidden=16, num_layers=2, aggregator=aggregator,
                         dropout=0.5))
    return Experiment(
        name=f"sage-{getattr(aggregator, 'value', aggregator)}",
        data=DataConfig(path=path, num_parts=CORA_DEVICES),
        model=model,
        train=TrainConfig(fanouts=(5, 5), eval_fanouts=(-1, -1), batch_size=64,
                          eval_batch_size=1024, seed=1),
        exchange=EXCHANGE)


_SAGE_RUNS = {}


@pytest.fixture(scope="module")
def sage_run(cora_dir):
    """aggregator -> Run (built once per aggregator for the module)."""
    def get(aggregator: Aggregator):
        if aggregator not in _SAGE_RUNS:
            config = sage_config(cora_dir, aggregator)
            _SAGE_RUNS[aggregator] = build_run(config, DistGraph(cora_dir, run_mesh(config)))
        return _SAGE_RUNS[aggregator]
    yield get
    _SAGE_RUNS.clear()
    _COMPILED.clear()


@pytest.mark.parametrize("aggregator", [Aggregator.MEAN, Aggregator.POOL, GAT])
def test_sage_full_graph_logits_over_many_windows_equal_dense_single_device_model(
        sage_run, cora_csc, aggregator):
    run = sage_run(aggregator)
    dg, graph = run.dg, run.dg.graph
    assert dg.num_parts == CORA_DEVICES and run.job.mesh.size == CORA_DEVICES
    model = nnx.merge(run.job.graphdef, run.params)
    feat = run.job.inputs.features["_N"].to_numpy()

    # The windows are small: every layer walks many of them, and the largest in-degree
    # spans several, so partial aggregates of one node are merged across windows.
    for width in message_widths(model, feat.shape[1]):
        window = edge_window(graph.edges_per_part, width, WINDOW_FLOATS, SMALLEST_WINDOW)
        assert window == SMALLEST_WINDOW
        assert graph.edges_per_part >= 8 * window
        assert graph.max_in_degree > 2 * window

    got, lost = sharded_logits(run, run.params, {})
    assert lost == 0

    indptr, indices = cora_csc
    x = model.encoder({"_N": jnp.asarray(feat)}, {"_N": jnp.ones(feat.shape[0], bool)})
    want = dense_reference(model, x, indptr, indices)
    assert want.shape == (dg.meta.num_nodes, run.num_classes)
    assert_logits_equal(got, want)
    # Not a degenerate model: the predictions differ between nodes.
    assert np.unique(want.argmax(1)).size > 1


def test_sage_full_graph_logits_do_not_depend_on_the_window_size(sage_run):
    """One window per layer (the default budget) and 16-edge windows agree."""
    run = sage_run(Aggregator.MEAN)
    assert edge_window(run.dg.graph.edges_per_part, 16) >= run.dg.graph.edges_per_part
    small, _ = sharded_logits(run, run.params, {})
    whole, lost = sharded_logits(run, run.params, {}, window_floats=1 << 22,
                                 smallest_window=256)
    assert lost == 0
    assert_logits_equal(whole, small)


def test_full_graph_scores_equal_sampled_evaluation_with_every_neighbour(sage_run, cora_csc):
    run = sage_run(Aggregator.MEAN)
    assert run.config.train.eval_fanouts == (-1, -1)
    full = evaluate_splits(run, run.params, {}, ("val", "test"), Inference.FULL)
    evaluators = {s: SampledEvaluator(run, s) for s in ("val", "test")}
    sampled = evaluate_splits(run, run.params, {}, ("val", "test"), Inference.SAMPLED,
                              evaluators)
    for split, count in (("val", 500), ("test", 1000)):       # cora's Planetoid splits
        assert full[split]["count"] == sampled[split]["count"] == count
        assert full[split]["acc"] == sampled[split]["acc"]
        assert full[split]["macro_f1"] == sampled[split]["macro_f1"]
        np.testing.assert_allclose(full[split]["loss"], sampled[split]["loss"], rtol=1e-5)

    # And both equal the dense single-device model's accuracy on those nodes.
    model = nnx.merge(run.job.graphdef, run.params)
    feat = run.job.inputs.features["_N"].to_numpy()
    indptr, indices = cora_csc
    x = model.encoder({"_N": jnp.asarray(feat)}, {"_N": jnp.ones(feat.shape[0], bool)})
    logits = dense_reference(model, x, indptr, indices)
    labels = run.job.labels.to_numpy()
    for split in ("val", "test"):
        ids = np.concatenate([np.asarray(run.dg.parts.part(k).splits["_N"][split])
                              for k in range(run.dg.num_parts)])
        correct = int(np.sum(logits[ids].argmax(1) == labels[ids]))
        assert full[split]["acc"] == correct / ids.size
        assert 0 < correct < ids.size


# -- AIFB, R-GCN with learnable embeddings, 4 devices ------------------------------------

AIFB_DEVICES = 4


@pytest.fixture(scope="module")
def aifb_dir(shared_data, tmp_path_factory):
    graph = add_reverse_relations(load_npz(shared_data("aifb.npz")))
    root = tmp_path_factory.mktemp("aifb4-inference") / "parts"
    partition_graph(graph, AIFB_DEVICES, "metis", root)
    return str(root)


@pytest.mark.parametrize("decomposition,num_bases,one_hot", [
    (Decomposition.BASIS, 3, False), (Decomposition.BLOCK, 2, False),
    (Decomposition.BASIS, 0, True)], ids=["basis", "block", "one_hot"])
def test_rgcn_full_graph_logits_with_embeddings_equal_dense_single_device_model(
        aifb_dir, decomposition, num_bases, one_hot):
    config = Experiment(
        name=f"rgcn-{decomposition.value}",
        data=DataConfig(path=aifb_dir, num_parts=AIFB_DEVICES),
        model=ModelConfig(kind="rgcn", hidden=8, num_layers=2, embedding_dim=8,
                          decomposition=decomposition, num_bases=num_bases, dropout=0.0,
                          one_hot_inputs=one_hot),
        train=TrainConfig(fanouts=(4, 4), eval_fanouts=(4, 4), batch_size=32, seed=2),
        exchange=EXCHANGE)
    mesh = run_mesh(config)
    assert mesh.size == AIFB_DEVICES
    dg = DistGraph(aifb_dir, mesh)
    run = build_run(config, dg)
    graph = dg.graph
    assert graph.num_relations == 90                # 45 relations and their inverses
    assert list(run.job.inputs.embeddings) == ["_N"] and not run.job.inputs.features
    model = nnx.merge(run.job.graphdef, run.params)
    conv = model.gnn.convs[0]
    width = 91 * 8 if one_hot else 8                # one-hot: a slice per relation + self
    if one_hot:
        assert isinstance(conv, OneHotRelGraphConv) and conv.in_features == width
    elif decomposition is Decomposition.BASIS:
        assert not conv.per_relation and conv.bases.shape[0] == num_bases
    else:
        assert conv.blocks.shape[:2] == (90, num_bases)

    embeddings = run.job.inputs.init_embeddings(mesh, jax.random.key(5))
    window_floats, smallest = 1024, 64              # windows of 128 edges (64 one-hot): many
    window = edge_window(graph.edges_per_part, width, window_floats, smallest)
    assert graph.edges_per_part >= 8 * window and graph.max_in_degree > window
    got, lost = sharded_logits(run, run.params, embeddings, window_floats, smallest)
    assert lost == 0

    # Host reference: the embedding table read back by row id (= global id here) and
    # the relation of every in-edge.
    table = run.job.inputs.embeddings["_N"].rows(embeddings["_N"],
                                                 np.arange(dg.meta.num_nodes))
    assert table.shape == (dg.meta.num_nodes, width) and np.all(np.any(table != 0, axis=1))
    indptr, indices = global_csc(dg)
    etype = global_etype(dg)
    assert etype.min() >= 0 and etype.max() < graph.num_relations
    x = model.encoder({"_N": jnp.asarray(table)}, {"_N": jnp.ones(table.shape[0], bool)})
    want = dense_reference(model, x, indptr, indices, etype)
    assert want.shape == (dg.meta.num_nodes, run.num_classes)
    assert_logits_equal(got, want)

    # The relations matter: with every edge read as relation 0 the answer differs.
    flat = dense_reference(model, x, indptr, indices, np.zeros_like(etype))
    assert not np.allclose(flat, want, rtol=1e-4, atol=1e-5)
