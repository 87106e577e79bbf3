"""Control-variate sampling (`jgraph.jobs.control_variate`) against references that
share none of its code paths:

  * one training step on 8 devices equals a single-device reference over the same
    blocks, whose aggregates are computed in numpy from the whole graph's CSC: the
    loss, the gradients, and every history table after the step (each row written
    is the mean of the fresh rows the devices computed for it, the others unchanged);
  * with the parameters held fixed, after as many epochs as the model has history
    tables, the control-variate forward equals exact full-graph inference (VR-GCN's
    Theorem 1), where it did not after one epoch;
  * over many draws, the mean of the estimated logits equals the exact ones (the last
    layer is linear in its aggregate), within 5 standard errors.

Cora in 8 METIS parts, GraphSAGE with fanouts of 1 or 2; cora's hubs (in-degree up
to 168) span several in-edge chunks of the history fetch.
"""
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

from jgraph.bench.exchange import global_csc
from jgraph.data import load_dataset
from jgraph.data.sparse import SparseRows
from jgraph.jobs import build_run
from jgraph.jobs.dataset import run_mesh
from jgraph.jobs.experiment import (
    DataConfig,
    Experiment,
    HistoryInit,
    ModelConfig,
    Sampler,
    TrainConfig,
)
from jgraph.jobs.step import masked_cross_entropy
from jgraph.jobs.windows import full_graph_logits
from jgraph.mesh import REPLICATED, ROWS, rows_sharding
from jgraph.models.stack import layer_input
from jgraph.partition import partition_graph
from jgraph.sharded import DistGraph, ExchangeConfig
from tests.optimised import optimised

pytestmark = pytest.mark.slow

DEVICES = 8
EXCHANGE = ExchangeConfig(growth=2.0, relay=False, max_rungs=2)


def cv_run(path, layers=3, fanouts=None, batch_size=16, history_init=HistoryInit.INFERENCE,
           aggregator="mean", optimizer="adam", dropout=0.0, input_dropout=0.0):
    config = Experiment(
        name="cv", data=DataConfig(path=path, num_parts=DEVICES),
        model=ModelConfig(hidden=16, num_layers=layers, dropout=dropout,
                          input_dropout=input_dropout, aggregator=aggregator),
        train=TrainConfig(fanouts=fanouts or (2,) * layers, eval_fanouts=(-1,) * layers,
                          batch_size=batch_size, seed=2,
                          sampler=Sampler.CONTROL_VARIATE, history_init=history_init,
                          optimizer=optimizer),
        exchange=EXCHANGE)
    return build_run(config, DistGraph(path, run_mesh(config)))


@pytest.fixture(scope="module")
def cora8(tmp_path_factory):
    root = tmp_path_factory.mktemp("cora-cv")
    partition_graph(load_dataset("cora"), DEVICES, "metis", str(root))
    return str(root)


@pytest.fixture(scope="module")
def cora8_sparse(tmp_path_factory):
    """Cora with its features stored as sparse rows (as facebook_musae's are)."""
    root = tmp_path_factory.mktemp("cora-cv-sparse")
    graph = load_dataset("cora")
    data = graph.node_data["_N"]
    sparse = {"_N": {**data, "feat": SparseRows.from_dense(data["feat"])}}
    partition_graph(dataclasses.replace(graph, node_data=sparse), DEVICES, "metis",
                    str(root))
    return str(root)


@pytest.fixture(scope="module")
def cora8_every_node_trains(tmp_path_factory):
    """Cora with every node a training seed: a fixed-parameter epoch computes every
    node's rows (Theorem 1's setting)."""
    root = tmp_path_factory.mktemp("cora-cv-all")
    graph = load_dataset("cora")
    every = np.arange(graph.num_nodes["_N"], dtype=np.int64)
    splits = {t: {**named, "train": every} for t, named in graph.splits.items()}
    partition_graph(dataclasses.replace(graph, splits=splits), DEVICES, "metis", str(root))
    return str(root)


def global_rows(table, dg):
    """[N, F] numpy rows of a [P * nodes_per_part, F] table of the graph's node rows."""
    offsets = dg.book.offsets
    blocks = np.split(np.asarray(table, np.float32), DEVICES)
    return np.concatenate([b[:offsets[k + 1] - offsets[k]] for k, b in enumerate(blocks)])


def node_table(rows, dg, width):
    """rows [N, F] as a row-sharded [P * nodes_per_part, F] table."""
    n, offsets = dg.graph.nodes_per_part, dg.book.offsets
    out = np.zeros((DEVICES * n, width), np.float32)
    for k in range(DEVICES):
        out[k * n:k * n + offsets[k + 1] - offsets[k]] = rows[offsets[k]:offsets[k + 1]]
    return jax.device_put(out, rows_sharding(dg.mesh))


def neighbour_sums(indptr, indices, rows):
    """[N, F]: Σ rows[u] over every in-neighbour u of each node (numpy)."""
    dst = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    out = np.zeros((indptr.size - 1, rows.shape[1]), np.float64)
    np.add.at(out, dst, rows[indices].astype(np.float64))
    return out


def batch_program(job, graph):
    """(params, histories, data, order, index, step) -> the batch's blocks, its loss
    and its gradients (over every device's seeds), and its fresh rows."""
    def per_device(params, histories, data, order, index, step):
        batch = job.batch_of(data, {}, order, index, step, histories)
        (loss, outcome), grads = jax.value_and_grad(
            job.batch_loss, has_aux=True)(params, {}, batch)
        count, (logits, fresh) = outcome.count, outcome.out
        total = lax.psum(count, job.exchange.axis).astype(jnp.float32)
        grads = jax.tree.map(lambda g: g / total, grads)
        blocks = [(b.dst, b.src, b.nbr, b.mask) for b in batch.blocks]
        return lax.psum(loss, job.exchange.axis) / total, grads, blocks, logits, fresh
    tables = tuple(ROWS for _ in job.widths)
    return jax.jit(jax.shard_map(
        per_device, mesh=job.mesh,
        in_specs=(REPLICATED, tables, job.data_specs(graph), ROWS, REPLICATED, REPLICATED),
        out_specs=(REPLICATED, REPLICATED, ROWS, ROWS, tuple(ROWS for _ in job.widths))))


def take(table, ids):
    """numpy rows of `table` at ids, zero where an id is -1."""
    return np.where((ids >= 0)[:, None], table[np.maximum(ids, 0)], 0).astype(np.float32)


def reference(job, features, labels, indptr, indices, histories, blocks):
    """device(params, k) -> (loss sum, (seed count, fresh rows)) of device k's blocks on
    one device: the exact sums of every in-neighbour's inputs and histories in numpy
    from the graph's CSC, the estimator and the layers (their own update and
    activation) in jnp. histories: [N, F] numpy per layer above the first."""
    deg = np.diff(indptr)
    input_sums = neighbour_sums(indptr, indices, features)
    history_sums = [neighbour_sums(indptr, indices, h) for h in histories]
    split = [[tuple(np.split(np.asarray(a), DEVICES)[k] for a in b) for b in blocks]
             for k in range(DEVICES)]

    def device(params, k):
        gnn = nnx.merge(job.graphdef, params).gnn
        mine = split[k]
        nodes = mine[0][0]
        degree = np.where(nodes >= 0, deg[np.maximum(nodes, 0)], 0).astype(np.float32)
        h, fresh = jnp.asarray(take(features, nodes)), []
        for i, conv in enumerate(gnn.convs):
            dst, src, nbr, mask = mine[i]
            d = degree[:dst.size]
            if i == 0:
                total = jnp.asarray(take(input_sums, nodes))
            else:
                delta = h - jnp.asarray(take(histories[i - 1], src))
                drawn = jnp.sum(jnp.where(mask[..., None], delta[np.maximum(nbr, 0)], 0),
                                axis=1)
                scale = d / np.maximum(mask.sum(1), 1)
                total = jnp.asarray(take(history_sums[i - 1], dst)) + drawn * scale[:, None]
            partial = {"sum": conv.message(total), "count": jnp.asarray(d)}
            h = gnn.post(i, conv.update(layer_input(conv, h[:dst.size]), partial))
            if i < len(gnn.convs) - 1:
                fresh.append(h)
        seeds = mine[-1][0]
        y = np.where(seeds >= 0, labels[np.maximum(seeds, 0)], -1)
        loss, _, count = masked_cross_entropy(h, jnp.asarray(y),
                                              jnp.asarray((seeds >= 0) & (y >= 0)))
        return loss, (count, fresh)
    return device, split


def assert_close(got, want, what, tolerance=1e-5):
    """Within `tolerance` of the reference, relative to its largest entry."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-12)
    err = float(np.max(np.abs(got - want))) / scale
    assert err <= tolerance, f"{what}: relative error {err}"


def test_one_step_on_8_devices_equals_one_device_over_the_same_blocks(cora8):
    run = cv_run(cora8)
    job, dg = run.job, run.dg
    graph, data = dg.graph, job.data(dg.graph)
    indptr, indices = global_csc(dg)
    features = np.asarray(job.inputs.features["_N"].to_numpy(), np.float32)
    labels = job.labels.to_numpy()
    rng = np.random.default_rng(0)
    histories = [rng.normal(size=(indptr.size - 1, w)).astype(np.float32)
                 for w in job.widths]
    tables = lambda: tuple(node_table(h, dg, h.shape[1]) for h in histories)
    order, index, step = job.loader.epoch_order(0), 1, 5

    loss8, grads8, blocks, _, _ = batch_program(job, graph)(
        run.params, tables(), data, order, jnp.int32(index), jnp.int32(step))
    device, split = reference(job, features, labels, indptr, indices, histories, blocks)
    outs = [device(run.params, k) for k in range(DEVICES)]
    total = sum(int(count) for _, (count, _) in outs)
    assert total == sum(int(np.sum(s[-1][0] >= 0)) for s in split) > 0
    assert_close(loss8, sum(float(loss) for loss, _ in outs) / total, "loss")
    grads1 = jax.tree.map(lambda *g: sum(g) / total, *[
        jax.grad(lambda p, k=k: device(p, k)[0])(run.params) for k in range(DEVICES)])
    for path, g8 in jax.tree_util.tree_leaves_with_path(grads8):
        assert_close(g8, _at(grads1, path), f"gradient {jax.tree_util.keystr(path)}")

    # The step itself: the same loss, and the histories of every row it computed.
    state = job.init(run.params)
    state = dataclasses.replace(state, extra=tables(),
                                step=jax.device_put(jnp.int32(step), state.step.sharding))
    state, metrics = job.compile_train(graph)(state, data, order, jnp.int32(index),
                                              job.stop_votes())
    assert bool(metrics["applied"])
    assert_close(metrics["loss"], sum(float(loss) for loss, _ in outs) / total, "step loss")
    for layer, table in enumerate(state.extra, start=1):
        sums = np.zeros_like(histories[layer - 1], np.float64)
        count = np.zeros(sums.shape[0])
        for k, (_, (_, fresh)) in enumerate(outs):
            src = split[k][layer][1]
            ok = src >= 0
            np.add.at(sums, src[ok], np.asarray(fresh[layer - 1])[ok])
            np.add.at(count, src[ok], 1)
        assert count.sum() > 0
        want = np.where((count > 0)[:, None], sums / np.maximum(count, 1)[:, None],
                        histories[layer - 1])
        assert_close(global_rows(table, dg), want, f"histories of layer {layer}")


def _at(tree, path):
    for key in path:
        tree = tree[getattr(key, "key", getattr(key, "idx", None))]
    return tree


def exact_logits(job, dg, params):
    """[N, C]: full-graph inference's logits, by original partition id."""
    def per_device(params, data):
        model = nnx.merge(job.graphdef, params)
        return full_graph_logits(model, job.inputs, data.features, {}, data.graph,
                                 job.exchange)[0]
    out = jax.jit(jax.shard_map(per_device, mesh=job.mesh,
                                in_specs=(REPLICATED, job.data_specs(dg.graph)),
                                out_specs=ROWS))(params, job.data(dg.graph))
    return global_rows(out, dg)


def seed_logits(logits, blocks):
    """(seed ids, their logits) of a batch_program's results (real seeds only)."""
    seeds = np.asarray(blocks[-1][0])
    logits = np.asarray(logits)
    return seeds[seeds >= 0], logits[seeds >= 0]


def test_with_fixed_parameters_the_forward_is_exact_after_one_epoch_per_history(
        cora8_every_node_trains):
    # The gcn aggregator here (mean elsewhere): its own row joins the neighbours' sum.
    run = cv_run(cora8_every_node_trains, layers=3, fanouts=(1, 1, 1), batch_size=64,
                 history_init=HistoryInit.ZEROS, aggregator="gcn")
    job = dataclasses.replace(run.job, tx=optax.set_to_zero())     # parameters fixed
    dg = run.dg
    graph, data = dg.graph, job.data(dg.graph)
    exact = exact_logits(job, dg, run.params)
    state = job.init(run.params)
    train, forward = job.compile_train(graph), batch_program(job, graph)
    errors = []
    for epoch in range(len(job.widths)):
        order = job.loader.epoch_order(epoch)
        for index in range(job.loader.steps_per_epoch):
            state, metrics = train(state, data, order, jnp.int32(index), job.stop_votes())
            assert bool(metrics["applied"])
        _, _, blocks, logits, _ = forward(state.params, state.extra, data,
                                          job.loader.epoch_order(epoch + 1), jnp.int32(0),
                                          state.step)
        seeds, got = seed_logits(logits, blocks)
        scale = float(np.max(np.abs(exact[seeds])))
        errors.append(float(np.max(np.abs(got - exact[seeds]))) / scale)
    assert errors[0] > 1e-2, errors           # one epoch: layer 2's histories still stale
    assert errors[-1] <= 1e-4, errors


@pytest.fixture(scope="module")
def two_layers(cora8):
    """(run, its exact logits) of a 2-layer model drawing one neighbour a layer, from
    zero histories: the refresh starts from them, the estimate's test gives its own."""
    run = cv_run(cora8, layers=2, fanouts=(1, 1), batch_size=32,
                 history_init=HistoryInit.ZEROS)
    return run, exact_logits(run.job, run.dg, run.params)


def test_a_refresh_makes_the_forward_exact_at_once(two_layers):
    # Parameters fixed: a refresh (`inferred_histories`, what train.history_refresh
    # runs) gives every node its exact rows, so the next batch's logits are exact at
    # once, not after an epoch per history as above; from zero histories they are not.
    run, exact = two_layers
    job, dg = run.job, run.dg
    graph, data = dg.graph, job.data(dg.graph)
    state = job.init(run.params)
    forward = batch_program(job, graph)
    order = job.loader.epoch_order(0)

    def error(histories):
        _, _, blocks, logits, _ = forward(run.params, histories, data, order, jnp.int32(0),
                                          jnp.int32(3))
        seeds, got = seed_logits(logits, blocks)
        return float(np.max(np.abs(got - exact[seeds]))) / float(np.max(np.abs(exact[seeds])))
    stale = error(state.extra)
    # The loop refreshes with a job it replaced (calibrated capacities): it shares the
    # one compiled program with the job that made the first histories.
    calibrated = dataclasses.replace(job, exchange=job.exchange)
    fresh = error(calibrated.inferred_histories(state))
    assert stale > 1e-2 and fresh <= 1e-4, (stale, fresh)
    assert job.history_programs.keys() == {"inference"}
    assert job.history_programs is calibrated.history_programs


def test_the_estimated_logits_average_to_the_exact_ones(two_layers):
    run, exact = two_layers                 # the histories: random tables, not the run's
    job, dg = run.job, run.dg
    graph, data = dg.graph, job.data(dg.graph)
    rng = np.random.default_rng(1)
    tables = tuple(node_table(rng.normal(size=(graph.num_nodes, w)).astype(np.float32) * 3,
                              dg, w) for w in job.widths)
    order = job.loader.epoch_order(0)
    forward = optimised(batch_program(job, graph), run.params, tables, data, order,
                        jnp.int32(0), jnp.int32(0))                 # run 200 times
    draws = []
    for step in range(200):
        _, _, blocks, logits, _ = forward(run.params, tables, data, order, jnp.int32(0),
                                          jnp.int32(step))
        seeds, got = seed_logits(logits, blocks)
        draws.append(got)
    draws = np.stack(draws).astype(np.float64)
    mean, error = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(draws.shape[0])
    want = exact[seeds]
    # The draws do differ (the mean's test is not a comparison of equal numbers).
    assert np.max(draws.std(0)) > 1e-2 * np.max(np.abs(want))
    assert np.all(np.abs(mean - want) <= 5 * error + 1e-5 * np.max(np.abs(want)))


def cvd_program(job, graph):
    """(params, histories, data, order, index, step) -> the batch's mean loss and
    gradients over every device's seeds, and each device's (seed ids, logits), trained
    as a step trains: with the step's dropout key (CVD)."""
    def per_device(params, histories, data, order, index, step):
        batch = job.batch_of(data, {}, order, index, step, histories)
        (loss, outcome), grads = jax.value_and_grad(job.batch_loss, has_aux=True)(
            params, {}, batch, job.dropout_key(step))
        total = lax.psum(outcome.count, job.exchange.axis).astype(jnp.float32)
        return (lax.psum(loss, job.exchange.axis) / total,
                jax.tree.map(lambda g: lax.psum(g, job.exchange.axis) / total, grads),
                batch.blocks[-1].dst, outcome.out[0])
    tables = tuple(ROWS for _ in job.widths)
    return jax.jit(jax.shard_map(
        per_device, mesh=job.mesh,
        in_specs=(REPLICATED, tables, job.data_specs(graph), ROWS, REPLICATED, REPLICATED),
        out_specs=(REPLICATED, REPLICATED, ROWS, ROWS)))


def dropout_program(job, graph):
    """The same for plain sampled training with dropout (`job`, a NodeClassification):
    exact dropout over the blocks it draws."""
    def per_device(params, data, order, index, step):
        seeds, mask = job.loader.batch(order, index)
        batch = job.fetch(data, {}, seeds, mask, step)
        (loss, outcome), grads = jax.value_and_grad(job.batch_loss, has_aux=True)(
            params, {}, batch, job.dropout_key(step))
        total = lax.psum(outcome.count, job.exchange.axis).astype(jnp.float32)
        return (lax.psum(loss, job.exchange.axis) / total,
                jax.tree.map(lambda g: lax.psum(g, job.exchange.axis) / total, grads),
                batch.blocks[-1].dst, outcome.out)
    return jax.jit(jax.shard_map(
        per_device, mesh=job.mesh,
        in_specs=(REPLICATED, job.data_specs(graph), ROWS, REPLICATED, REPLICATED),
        out_specs=(REPLICATED, REPLICATED, ROWS, ROWS)))


@pytest.mark.parametrize("input_dropout,features", [(0.0, "dense"), (0.3, "sparse")])
def test_cvd_with_every_neighbour_drawn_is_exact_dropout_training(request, input_dropout,
                                                                  features):
    # Fanout -1 draws every in-neighbour: CVD's estimate is then the exact sum of the
    # dropped rows, whatever the histories, and its loss and gradients those of plain
    # training with dropout (the same masks: the same rows, the same key). Sparse input
    # rows keep their non-zeros through input dropout's noise term (an embedding bag).
    cora8 = request.getfixturevalue("cora8" if features == "dense" else "cora8_sparse")
    run = cv_run(cora8, layers=2, fanouts=(-1, -1), batch_size=32, dropout=0.5,
                 input_dropout=input_dropout)
    job, dg = run.job, run.dg
    graph = dg.graph
    assert job.input_hop == (input_dropout > 0)
    stored = job.data(graph).features["_N"]
    assert isinstance(stored, SparseRows) == (features == "sparse")
    plain = job.evaluating(job.loader, (-1, -1))
    rng = np.random.default_rng(3)
    tables = tuple(node_table(rng.normal(size=(graph.num_nodes, w)).astype(np.float32) * 3,
                              dg, w) for w in job.widths)
    order, index, step = job.loader.epoch_order(0), jnp.int32(1), jnp.int32(7)
    cvd = cvd_program(job, graph)
    loss, grads, seeds, logits = cvd(run.params, tables, job.data(graph), order, index, step)
    want_loss, want_grads, want_seeds, want_logits = dropout_program(plain, graph)(
        run.params, plain.data(graph), order, index, step)
    np.testing.assert_array_equal(np.asarray(seeds), np.asarray(want_seeds))
    assert_close(loss, want_loss, "loss")
    assert_close(logits, want_logits, "logits")
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert_close(g, _at(want_grads, path), f"gradient {jax.tree_util.keystr(path)}")
    # Dropout did act: another step's key, over the same blocks (every neighbour, the
    # same seeds; the estimate exact whatever the histories), gives other logits, where
    # without dropout the logits would not depend on the key (the same program: no
    # second model to compile).
    *_, other_seeds, other = cvd(run.params, tables, job.data(graph), order, index,
                                 step + 1)
    np.testing.assert_array_equal(np.asarray(other_seeds), np.asarray(seeds))
    scale = float(np.max(np.abs(np.asarray(logits))))
    assert float(np.max(np.abs(np.asarray(other) - np.asarray(logits)))) > 0.1 * scale


def test_cvd_averages_to_exact_dropout_with_exact_dropouts_variance(cora8):
    # One neighbour drawn of each node's n; layer 0 exact, layer 1 linear in its rows:
    # over masks and samples the logits' mean is the model's without dropout, as exact
    # dropout's is, and with exact histories (parameters fixed) their variance is exact
    # dropout's: the noise term's sqrt(n/D) scale (n/D would multiply it by about n).
    run = cv_run(cora8, layers=2, fanouts=(1, 1), batch_size=32, dropout=0.5)
    job, dg = run.job, run.dg
    graph = dg.graph
    exact = exact_logits(job, dg, run.params)               # no dropout
    state = job.init(run.params)                            # histories by inference
    plain = job.evaluating(job.loader, (-1, -1))
    order = job.loader.epoch_order(0)
    cvd = cvd_program(job, graph)
    # Every neighbour of cora's hubs: a costly program, run 40 times.
    dropped = optimised(dropout_program(plain, graph), run.params, plain.data(graph), order,
                        jnp.int32(0), jnp.int32(0))
    draws = {"cvd": [], "exact dropout": []}
    for step in range(40):
        _, _, seeds, got = cvd(run.params, state.extra, job.data(graph), order,
                               jnp.int32(0), jnp.int32(step))
        draws["cvd"].append(np.asarray(got))
        _, _, want_seeds, want = dropped(run.params, plain.data(graph), order, jnp.int32(0),
                                         jnp.int32(step))
        draws["exact dropout"].append(np.asarray(want))
    seeds = np.asarray(seeds)
    np.testing.assert_array_equal(seeds, np.asarray(want_seeds))
    real = seeds >= 0
    want = exact[seeds[real]]
    variance = {}
    for name, got in draws.items():
        got = np.stack(got)[:, real].astype(np.float64)
        mean, error = got.mean(0), got.std(0, ddof=1) / np.sqrt(got.shape[0])
        assert np.all(np.abs(mean - want) <= 5 * error + 1e-5 * np.max(np.abs(want))), name
        variance[name] = float(got.var(0, ddof=1).sum())
    # Measured: 1.00 (quarters of 25 draws: 0.99-1.01); with an n/D scale, 1.41.
    ratio = variance["cvd"] / variance["exact dropout"]
    assert variance["exact dropout"] > 0 and 0.9 <= ratio <= 1.1, variance


class Stop(Exception):
    """Raised by a run's on_step hook: the process dies between two steps."""


def test_a_stopped_run_resumes_with_its_bf16_histories_and_the_same_losses(tmp_path):
    import json

    from jgraph.config import load
    from jgraph.jobs.experiment import Experiment as Config
    from jgraph.progress import Progress
    from jgraph.train.loop import train_and_evaluate

    settings = ["data.num_parts=2", "train.epochs=3", "train.batch_size=32",
                "model.hidden=16", "checkpoint.every_steps=2", "checkpoint.asynchronous=false",
                "train.history_init=zeros", "train.history_precision=bf16",
                "train.history_refresh=1",
                # One capacity rung: one compiled branch a transfer, the same numbers.
                "exchange.max_rungs=1"]
    experiment = str(Path(__file__).resolve().parents[2] / "experiments" / "cv_sage_cora.yaml")
    config = load(Config, experiment, settings)
    quiet = Progress(enabled=False)
    reference = train_and_evaluate(config, str(tmp_path / "whole"), quiet)

    def stop_at_5(step):
        if step == 5:
            raise Stop
    with pytest.raises(Stop):
        train_and_evaluate(config, str(tmp_path / "stopped"), quiet, on_step=stop_at_5)
    resumed = train_and_evaluate(config, str(tmp_path / "stopped"), quiet)
    assert resumed["resumed_from_step"] == 4

    def lines(run, name):
        return [json.loads(line) for line in (tmp_path / run / name).read_text().splitlines()]
    assert lines("stopped", "steps.jsonl") == lines("whole", "steps.jsonl")
    timings = {"epoch_seconds", "seeds_per_s", "compile_seconds", "history_refresh_seconds"}

    def epochs(run):
        return [{k: v for k, v in r.items() if k not in timings}
                for r in lines(run, "metrics.jsonl")]
    assert epochs("stopped") == epochs("whole")
    assert resumed["test_acc"] == reference["test_acc"]
    # The histories were refreshed after epochs 1 and 2 (not after the last).
    refreshed = [r["history_refresh_seconds"] for r in lines("whole", "metrics.jsonl")]
    assert [s is not None and s > 0 for s in refreshed] == [True, True, False], refreshed

    # The saved model answers for a few nodes (its evaluation is plain sampling): with
    # every neighbour, the test nodes' predictions score the run's test accuracy.
    from jgraph import load_dataset, load_run
    cora = load_dataset("cora")
    test = np.asarray(cora.splits["_N"]["test"])
    labels = np.asarray(cora.node_data["_N"]["label"])[test]
    predicted = load_run(str(tmp_path / "whole")).predict(test, fanouts=[-1, -1])
    assert np.mean(predicted == labels) == pytest.approx(reference["test_acc"], abs=1e-12)
