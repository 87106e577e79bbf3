"""Full-batch training's loss and gradients (`jgraph.jobs.windows`, the windows walked
again in the backward pass) equal, to 1e-5:

  * the same model on one device over the whole graph, differentiated by JAX: every
    node reads all of its in-neighbours through the layers of sampled training
    (padded neighbourhoods in degree tiers), the loss a sum over the training nodes;
  * the same full-batch program on one device of a one-part partition;
  * the one-shot variant (every window's fetched rows kept for the backward pass);
  * for GraphSAGE (mean) and GAT, a reference that shares no code with jgraph
    (`reference_float64.py`: segment sums and a segment softmax over cora's raw edge
    list, in float64, in a process of its own).

GraphSAGE (mean, pool) and GAT on cora in 8 METIS parts, with windows small enough that
hubs' in-edges span many; R-GCN with learnable embeddings on AIFB in 8 parts (the
embedding rows' gradients too, by original node id against 1 device).
"""
import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from jgraph.bench.exchange import global_csc
from jgraph.data import add_reverse_relations, load_dataset, load_npz
from jgraph.data.datasets import builtin_path
from jgraph.jobs import build_run
from jgraph.jobs.dataset import run_mesh
from jgraph.jobs.experiment import DataConfig, Experiment, ModelConfig, TrainConfig
from jgraph.jobs.step import masked_cross_entropy
from jgraph.jobs.windows import edge_window, full_graph_logits, labelled_rows
from jgraph.mesh import REPLICATED, ROWS
from jgraph.models import Aggregator, Neighbourhood
from jgraph.partition import partition_graph
from jgraph.sharded import DistGraph, ExchangeConfig
from tests.optimised import optimised

pytestmark = pytest.mark.slow

WINDOW_FLOATS, SMALLEST_WINDOW = 64, 16        # many windows; hubs span several
EXCHANGE = ExchangeConfig(growth=2.0, relay=False, max_rungs=2)
TOLERANCE = 1e-5


def sharded_loss_and_gradients(run, params, embeddings, remat=True,
                               window_floats=WINDOW_FLOATS, smallest=SMALLEST_WINDOW,
                               seed=None, many=False):
    """(loss summed over the training nodes, their count, parameter gradients,
    {ntype: embedding table gradients [P * rows, dim]}) of full-batch training; seed:
    dropout keyed by it (None: none); many: a program the test runs many times,
    compiled `optimised`."""
    settings = (id(run), remat, window_floats, smallest, seed is not None)
    key = jax.random.key(0 if seed is None else seed)
    train = run.dg.split_mask("train", run.target).array
    args = (params, embeddings, run.job.data(run.dg.graph), train, key)
    if (*settings, many) not in _COMPILED:  # the run kept alive: its id is not reused
        fn = _loss_and_gradients(run, *settings[1:], tuple(embeddings))
        _COMPILED[(*settings, many)] = run, optimised(fn, *args) if many else fn
    fn = _COMPILED[(*settings, many)][1]
    total, count, lost, grads, table_grads = fn(*args)
    assert int(lost) == 0
    return float(total), int(count), grads, table_grads


_COMPILED = {}


def _loss_and_gradients(run, remat, window_floats, smallest, dropout, types):
    job, dg = run.job, run.dg
    inputs, exchange, layout = job.inputs, job.exchange, job.labels.layout

    def per_device(params, embeddings, data, train, key):
        def loss(params, tables):
            model = nnx.merge(job.graphdef, params)
            states = {t: embeddings[t]._replace(table=tables[t]) for t in tables}
            logits, lost = full_graph_logits(model, inputs, data.features, states,
                                             data.graph, exchange, window_floats, smallest,
                                             key=key if dropout else None, remat=remat)
            target, real = labelled_rows(logits, data.graph, layout, data.labels,
                                         exchange.axis)
            ok = real & train & (data.labels >= 0)
            total, _, count = masked_cross_entropy(target, data.labels, ok)
            return total, (count, lost)

        tables = {t: e.table for t, e in embeddings.items()}
        (total, (count, lost)), (grads, table_grads) = jax.value_and_grad(
            loss, argnums=(0, 1), has_aux=True)(params, tables)
        axis = exchange.axis
        return lax.psum(total, axis), lax.psum(count, axis), lost, grads, table_grads

    return jax.jit(jax.shard_map(
        per_device, mesh=job.mesh,
        in_specs=(REPLICATED, inputs.embedding_specs(), job.data_specs(dg.graph), ROWS,
                  REPLICATED),
        out_specs=(REPLICATED, REPLICATED, REPLICATED, REPLICATED,
                   dict.fromkeys(types, ROWS))))


def degree_tiers(deg):
    """[(width, node ids)]: every node once, in the smallest tier (8, 64, ...) that
    holds its in-degree."""
    tier = np.zeros(deg.size, np.int64)
    while np.any(deg > 8 ** (tier + 1)):
        tier = np.where(deg > 8 ** (tier + 1), tier + 1, tier)
    return [(8 ** (int(t) + 1), np.flatnonzero(tier == t)) for t in np.unique(tier)]


def dense_loss_fn(run, indptr, indices, etype, labels, train_ids):
    """loss(params, table or None): the model on one device over the whole graph, each
    layer through `LayerStack.layer` on padded neighbourhoods of every node (one per
    degree tier), summed cross-entropy over `train_ids`."""
    deg = np.diff(indptr)
    tiers = []
    for width, ids in degree_tiers(deg):
        slot = np.arange(width)
        mask = slot[None, :] < deg[ids][:, None]
        pos = np.where(mask, indptr[ids][:, None] + slot[None, :], 0)
        nbr = np.where(mask, indices[pos] + ids.size, -1).astype(np.int32)
        et = None if etype is None else jnp.asarray(np.where(mask, etype[pos], -1), jnp.int32)
        tiers.append((jnp.asarray(ids, jnp.int32),
                      Neighbourhood(jnp.asarray(nbr), jnp.asarray(mask), et)))
    job = run.job
    n = indptr.size - 1
    features = {t: f.to_numpy() for t, f in job.inputs.features.items()}

    def loss(params, table):
        model = nnx.merge(job.graphdef, params)
        rows = {t: jnp.asarray(f) for t, f in features.items()}
        if table is not None:
            rows["_N"] = table
        h = model.encoder(rows, {t: jnp.ones(n, bool) for t in rows})
        for i in range(model.gnn.num_layers):
            out = None
            for ids, hood in tiers:
                got = model.gnn.layer(i, jnp.concatenate([h[ids], h]), hood)
                out = (jnp.zeros((n, got.shape[1]), got.dtype) if out is None else out
                       ).at[ids].set(got)
            h = out
        total, _, _ = masked_cross_entropy(h[train_ids], jnp.asarray(labels[train_ids]),
                                               jnp.ones(train_ids.size, bool))
        return total
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def train_ids(dg, ntype="_N"):
    return np.concatenate([np.asarray(dg.parts.part(k).splits[ntype]["train"])
                           for k in range(dg.num_parts)])


def assert_close(got, want, what):
    """Every leaf within TOLERANCE of the reference, relative to its largest entry."""
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w, g = np.asarray(_at(want, path)), np.asarray(g)
        scale = max(float(np.max(np.abs(w))), 1e-12)
        err = float(np.max(np.abs(g - w))) / scale
        assert err <= TOLERANCE, f"{what} {jax.tree_util.keystr(path)}: relative error {err}"


def _at(tree, path):
    for key in path:
        tree = tree[getattr(key, "key", getattr(key, "idx", None))]
    return tree


# -- cora: GraphSAGE and GAT, 8 devices and 1 -------------------------------------------

MODELS = {
    "sage_mean": dict(kind="sage", aggregator=Aggregator.MEAN),
    "sage_pool": dict(kind="sage", aggregator=Aggregator.POOL),
    "gat": dict(kind="gat", heads=2, attn_dropout=0.5),
}


@pytest.fixture(scope="module")
def cora_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cora-full-batch")
    graph = load_dataset("cora")
    for parts in (8, 1):
        partition_graph(graph, parts, "metis", root / f"p{parts}")
    return {parts: str(root / f"p{parts}") for parts in (8, 1)}


@functools.cache
def cora_run(path, parts, model):
    """The run of `model` on the partition at `path` (one per test session: the tests
    share its compiled programs)."""
    config = Experiment(
        name=f"full-{model}", data=DataConfig(path=path, num_parts=parts),
        model=ModelConfig(hidden=16, num_layers=2, dropout=0.5, **MODELS[model]),
        train=TrainConfig(fanouts=(5, 5), batch_size=64, seed=1), exchange=EXCHANGE)
    return build_run(config, DistGraph(path, run_mesh(config)))


@functools.cache
def cora_reference(path, parts, model):
    run = cora_run(path, parts, model)
    indptr, indices = global_csc(run.dg)
    fn = dense_loss_fn(run, indptr, indices, None, run.job.labels.to_numpy(),
                       train_ids(run.dg))
    (total, (grads, _)) = fn(run.params, None)
    return run, float(total), grads


@pytest.mark.parametrize("model", sorted(MODELS))
def test_full_batch_loss_and_gradients_on_8_devices_equal_one_device_and_dense(
        cora_dirs, model):
    run, dense_total, dense_grads = cora_reference(cora_dirs[8], 8, model)
    graph = run.dg.graph
    assert run.job.mesh.size == 8
    width = 16 * (1 if model == "sage_mean" else 2)
    assert graph.max_in_degree > 4 * edge_window(graph.edges_per_part, width,
                                                 WINDOW_FLOATS, SMALLEST_WINDOW)
    total, count, grads, _ = sharded_loss_and_gradients(run, run.params, {})
    assert count == 140                                   # cora's training nodes
    np.testing.assert_allclose(total, dense_total, rtol=TOLERANCE)
    assert_close(grads, dense_grads, "8 devices vs dense")
    assert any(float(np.max(np.abs(g))) > 0 for g in jax.tree.leaves(grads))

    # The one-part run starts from the same parameters: the dense reference above is
    # its own too (a sum over the same training nodes, however they are numbered).
    one = cora_run(cora_dirs[1], 1, model)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(run.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    total1, count1, grads1, _ = sharded_loss_and_gradients(one, one.params, {})
    assert count1 == 140
    np.testing.assert_allclose(total1, dense_total, rtol=TOLERANCE)
    assert_close(grads1, dense_grads, "1 device vs dense")
    np.testing.assert_allclose(total1, total, rtol=TOLERANCE)
    assert_close(grads1, grads, "1 device vs 8")


def test_rematerialised_and_one_shot_gradients_are_identical(cora_dirs):
    run = cora_run(cora_dirs[8], 8, "gat")
    total, _, grads, _ = sharded_loss_and_gradients(run, run.params, {}, remat=True)
    total_kept, _, grads_kept, _ = sharded_loss_and_gradients(run, run.params, {},
                                                              remat=False)
    assert total == total_kept
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_kept)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("model", ["gat", "sage_pool"])
def test_gradients_with_dropout_are_the_losss_directional_derivatives(cora_dirs, model):
    """With dropout keyed (attention, between layers, of the inputs), the backward pass
    draws the masks the forward drew: the gradient's inner product with a direction of
    the parameters equals the loss's central difference along it (the loss drawn with
    the same key), along the gradient itself and along a random direction."""
    run = cora_run(cora_dirs[8], 8, model)
    assert run.config.model.dropout > 0
    _, _, grads, _ = sharded_loss_and_gradients(run, run.params, {}, seed=3, many=True)
    leaves, tree = jax.tree.flatten(grads)
    rng = np.random.default_rng(0)
    norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in leaves))
    for direction in (leaves, [rng.standard_normal(g.shape) for g in leaves]):
        scale = np.sqrt(sum(float(np.sum(np.square(d))) for d in direction))
        unit = [np.asarray(d, np.float64) / scale for d in direction]
        along = sum(float(np.sum(np.asarray(g, np.float64) * u)) for g, u in zip(leaves, unit))
        eps = 1e-3

        def loss_at(t, unit=unit):
            moved = jax.tree.map(lambda p, v: p + jnp.asarray(t * v, p.dtype), run.params,
                                 jax.tree.unflatten(tree, unit))
            return sharded_loss_and_gradients(run, moved, {}, seed=3, many=True)[0]
        numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
        assert abs(numeric - along) <= 2e-2 * norm, (numeric, along, norm)


# -- cora: a float64 reference that shares no code with jgraph ----------------------------

REFERENCE = Path(__file__).with_name("reference_float64.py")


def float64_reference(tmp_path, run, kind):
    """{"": (loss, {name: gradient}) of `reference_float64.py` in float64, "32": the
    same in float32}, on cora's raw edge list, features and training nodes (the file
    jgraph's partition was made from, in its original numbering: the summed loss and
    the parameters' gradients do not depend on how nodes are numbered) with `run`'s
    parameters. The reference runs in a process of its own: x64 is process-wide."""
    params = {parameter_name(path): np.asarray(leaf)
              for path, leaf in jax.tree_util.tree_leaves_with_path(run.params)}
    np.savez(tmp_path / "params.npz", **params)
    env = {**os.environ, "JAX_ENABLE_X64": "1"}
    done = subprocess.run(
        [sys.executable, str(REFERENCE), kind, builtin_path("cora"),
         str(tmp_path / "params.npz"), str(tmp_path / "reference.npz"),
         "--slope", str(run.config.model.negative_slope)],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out = np.load(tmp_path / "reference.npz")
    return {bits: (float(out[f"loss{bits}"]), {k: out[f"grad{bits}:{k}"] for k in params})
            for bits in ("", "32")}


def parameter_name(path) -> str:
    """`convs.0.fc_self.kernel` of a leaf of the model's parameters (the GNN's: a graph
    of one node type has no input projection)."""
    keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
    assert keys[0] == "gnn", keys
    return ".".join(keys[1:])


def relative_error(got, want) -> float:
    """The largest difference, relative to the reference's largest entry."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-300)


@pytest.mark.parametrize("model", ["sage_mean", "gat"])
def test_full_batch_loss_and_gradients_on_8_devices_equal_a_float64_reference(
        cora_dirs, model, tmp_path):
    """jgraph's full-batch loss and every parameter's gradient, on 8 devices, against
    segment sums (GraphSAGE's mean) and a segment softmax (GAT's attention, 2 heads)
    over cora's 10,556 raw edges in float64.

    Tolerance: TOLERANCE (1e-5) of each leaf's largest entry, the figure every other
    test here holds float32 to. It suits float32: a float32 operation rounds by up to
    2^-24 (6e-8); the longest sums here are the first layer's 1433-term dot products
    and a hub's 168 in-edges, whose rounding grows as the square root of their length
    (40 x 6e-8 = 2.4e-6, a quarter of the tolerance). The reference's own float32
    arithmetic is held to the same bound, so the bound is float32's, not jgraph's."""
    run = cora_run(cora_dirs[8], 8, model)
    assert run.job.mesh.size == 8
    total, count, grads, _ = sharded_loss_and_gradients(run, run.params, {})
    reference = float64_reference(tmp_path, run, "sage" if model.startswith("sage") else "gat")
    loss64, grads64 = reference[""]
    loss32, grads32 = reference["32"]
    assert count == 140                                   # cora's training nodes
    got = {parameter_name(path): g for path, g in jax.tree_util.tree_leaves_with_path(grads)}
    assert got.keys() == grads64.keys()
    # float32 arithmetic itself, in the reference's order, is within the tolerance ...
    assert abs(loss32 - loss64) <= TOLERANCE * abs(loss64)
    for name, want in grads64.items():
        assert relative_error(grads32[name], want) <= TOLERANCE, name
    # ... and so is jgraph's, in its order: windows of in-edges, 8 devices, the rows of
    # other devices fetched through the exchange.
    assert abs(total - loss64) <= TOLERANCE * abs(loss64), (total, loss64)
    for name, want in grads64.items():
        assert float(np.max(np.abs(want))) > 0, name     # every leaf is checked on values
        err = relative_error(got[name], want)
        assert err <= TOLERANCE, f"{name}: relative error {err:.2e}"


# -- AIFB: R-GCN with learnable embeddings, 4 devices ------------------------------------


@pytest.fixture(scope="module")
def aifb_dirs(shared_data, tmp_path_factory):
    graph = add_reverse_relations(load_npz(shared_data("aifb.npz")))
    root = tmp_path_factory.mktemp("aifb-full-batch")
    for parts in (8, 1):
        partition_graph(graph, parts, "metis", root / f"p{parts}")
    return {parts: str(root / f"p{parts}") for parts in (8, 1)}


def rgcn_loss_and_gradients(path, parts, by_original=None):
    """(full-batch (total, count, grads, embedding row grads by row id), the dense
    model's (total, grads, table grads), the graph, its embedding table by row id) of
    R-GCN with learnable embeddings; by_original: the embedding table by original node
    id (default: drawn)."""
    config = Experiment(
        name="full-rgcn", data=DataConfig(path=path, num_parts=parts),
        model=ModelConfig(kind="rgcn", hidden=8, num_layers=2, embedding_dim=8,
                          num_bases=3, dropout=0.0),
        train=TrainConfig(fanouts=(4, 4), batch_size=32, seed=2), exchange=EXCHANGE)
    dg = DistGraph(path, run_mesh(config))
    run = build_run(config, dg)
    embeddings = run.job.inputs.init_embeddings(run.job.mesh, jax.random.key(5))
    n = dg.meta.num_nodes
    emb = run.job.inputs.embeddings["_N"]
    if by_original is not None:
        at = jnp.asarray(emb.layout.padded_of_rows(np.arange(n)), jnp.int32)
        table = embeddings["_N"].table.at[at].set(by_original[dg.parts.node_map()])
        embeddings = {"_N": embeddings["_N"]._replace(table=table)}
    total, count, grads, table_grads = sharded_loss_and_gradients(
        run, run.params, embeddings, window_floats=1024, smallest=64)
    table = emb.rows(embeddings["_N"], np.arange(n))
    rows = emb.rows(embeddings["_N"]._replace(table=table_grads["_N"]), np.arange(n))
    indptr, indices = global_csc(dg)
    etype = np.concatenate([np.asarray(dg.parts.part(k).etype) for k in range(dg.num_parts)])
    fn = dense_loss_fn(run, indptr, indices, etype, run.job.labels.to_numpy(), train_ids(dg))
    dense_total, (dense_grads, dense_table) = fn(run.params, jnp.asarray(table))
    return ((total, count, grads, rows),
            (float(dense_total), dense_grads, np.asarray(dense_table)), dg, table)


def test_rgcn_full_batch_gradients_with_embeddings_on_8_devices_equal_1_and_dense(
        aifb_dirs):
    (total, count, grads, rows), (d_total, d_grads, d_table), dg, table = \
        rgcn_loss_and_gradients(aifb_dirs[8], 8)
    assert count > 0 and dg.num_parts == 8
    np.testing.assert_allclose(total, d_total, rtol=TOLERANCE)
    assert_close(grads, d_grads, "R-GCN 8 devices vs dense")
    assert_close({"t": rows}, {"t": d_table}, "embedding rows")
    assert np.count_nonzero(np.any(rows != 0, axis=1)) > 100

    # One device, the same embedding rows by original node id.
    by_orig = lambda g, d: g[np.asarray(d.parts.node_map_inv())]
    (total1, count1, grads1, rows1), (d_total1, _, _), dg1, _ = \
        rgcn_loss_and_gradients(aifb_dirs[1], 1, by_orig(table, dg))
    assert count1 == count
    np.testing.assert_allclose(total1, d_total1, rtol=TOLERANCE)
    np.testing.assert_allclose(total1, total, rtol=TOLERANCE)
    assert_close(grads1, grads, "R-GCN 1 device vs 8")
    # The same node's embedding gradient under either numbering.
    assert_close({"t": by_orig(rows1, dg1)}, {"t": by_orig(rows, dg)}, "rows, 1 vs 8")
