"""Labelled nodes that no signal reaches predict the class prior (jgraph/jobs/signal.py).

The graph: items (labelled, no features) and tags (no features). Component A holds the
training items, each tagged twice; a chain of items hangs off one of A's tags; component
B has no training item at all, and its items are mostly of a class that the training
labels do not favour (class 3: none at all). A 2-layer R-GCN learns embeddings for
every node; with every neighbour sampled, training touches exactly the rows 2 hops
upstream of a training item, and a labelled node is reached when such a row lies 2 hops
upstream of it: A's items and the chain's first links are, the chain's far end and all
of B are not.

Checked: the reach against a numpy breadth-first search over the partition's in-edges
(and the rows training touched against the rows that left their initial draw); without
the prior, B's predictions are the noise of their embeddings (not all one class); with
it, every unreached item predicts the training majority with the prior as its
probabilities, every reached item keeps the model's own logits, and sampled evaluation,
full-graph evaluation, the output programs (`jgraph embed`, `load_run`) agree; on 1 and
4 devices; full-batch training (which hands every row to the optimizer) included."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.bench.exchange import global_csc
from jgraph.data import Graph
from jgraph.data.outputs import What
from jgraph.jobs import build_run
from jgraph.jobs.dataset import run_mesh
from jgraph.jobs.evaluate import SampledEvaluator
from jgraph.jobs.experiment import (
    DataConfig,
    Experiment,
    Inference,
    ModelConfig,
    SparseOptimizerKind,
    TrainConfig,
)
from jgraph.jobs.inference import FullGraphEvaluator, full_graph_rows_program
from jgraph.jobs.propagation import labelled_rows
from jgraph.jobs.signal import Reach, host_signal, touched, with_prior
from jgraph.mesh import ROWS
from jgraph.partition import partition_graph
from jgraph.sampling import NodeLoader
from jgraph.sharded import DistGraph
from jgraph.sharded.tensor import DistTensor

DEPTH = 2
A_ITEMS, A_TAGS, CHAIN, B_ITEMS, B_TAGS = 40, 8, 12, 28, 4
TRAIN = 12                   # A's first items
CLASSES = 4
EPOCHS = 10                  # enough for the far items' noise to outweigh the biases


def far_graph(features: bool = False) -> Graph:
    """See the module. Item ids: A 0..39, the chain 40..51 (40 tagged by tag 0), B
    52..79; tag ids: A 0..7, B 8..11. Relations: tagged (tag -> item), tags (item ->
    tag), next and previous along the chain."""
    rng = np.random.default_rng(0)
    a = np.arange(A_ITEMS)
    b = A_ITEMS + CHAIN + np.arange(B_ITEMS)
    chain = A_ITEMS + np.arange(CHAIN)
    pairs = [np.stack([rng.choice(A_TAGS, 2, replace=False), [i, i]]) for i in a]
    pairs += [np.stack([A_TAGS + rng.choice(B_TAGS, 2, replace=False), [i, i]]) for i in b]
    pairs.append(np.array([[0], [chain[0]]]))
    tagged = np.concatenate(pairs, axis=1)
    links = np.stack([chain[:-1], chain[1:]])
    labels = np.empty(A_ITEMS + CHAIN + B_ITEMS, np.int64)
    labels[a] = rng.integers(0, 3, A_ITEMS)
    labels[:TRAIN] = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 0]         # majority: class 0
    labels[chain] = 2
    labels[b] = np.where(rng.random(B_ITEMS) < 0.3, 3, 2)
    node_data = {"item": {"label": labels}}
    if features:
        node_data["item"]["feat"] = rng.random((labels.size, 5)).astype(np.float32)
    val = np.concatenate([a[TRAIN:TRAIN + 8], b[:8]])
    test = np.setdiff1d(np.arange(labels.size), np.concatenate([a[:TRAIN], val]))
    return Graph(
        name="far", num_nodes={"item": labels.size, "tag": A_TAGS + B_TAGS},
        edges={("tag", "tagged", "item"): tagged, ("item", "tags", "tag"): tagged[::-1],
               ("item", "next", "item"): links, ("item", "previous", "item"): links[::-1]},
        node_data=node_data,
        splits={"item": {"train": a[:TRAIN], "val": val, "test": np.sort(test)}})


@functools.cache
def partitioned(parts: int, root: str, features: bool = False) -> str:
    path = f"{root}/far{parts}{'-feat' if features else ''}"
    partition_graph(far_graph(features), parts, "random", path)
    return path


def config(path: str, parts: int, mode: str = "sampled",
           optimizer: SparseOptimizerKind = SparseOptimizerKind.ADAM) -> Experiment:
    return Experiment(
        name="far", data=DataConfig(path=path, num_parts=parts),
        model=ModelConfig(kind="rgcn", hidden=16, num_layers=DEPTH, embedding_dim=16,
                          num_bases=2, dropout=0.0),
        train=TrainConfig(fanouts=(-1, -1), eval_fanouts=(-1, -1), batch_size=4,
                          eval_batch_size=32, lr=0.1, embedding_lr=0.1, seed=0,
                          mode=mode, embedding_optimizer=optimizer))


def trained(run, epochs: int):
    """The run's state after `epochs` epochs of its training step."""
    job = run.job
    state, step = job.init(run.params), job.compile_train(run.dg.graph)
    data = job.data(run.dg.graph)
    for epoch in range(epochs):
        order = job.loader.epoch_order(epoch)
        for index in range(job.loader.steps_per_epoch):
            state, metrics = step(state, data, order, jnp.int32(index), job.stop_votes())
            assert bool(metrics["applied"])
    return state


def changed_rows(run, state, drawn: bool = True) -> np.ndarray:
    """bool[N] by global id: the nodes whose embedding row training touched (the
    optimizer's state, `touched`); drawn: check them equal to the rows that differ
    from their initial draw (the run's first state)."""
    dg, inputs = run.dg, run.job.inputs
    fresh = run.job.init(run.params).embeddings if drawn else None
    out = np.zeros(dg.meta.num_nodes, bool)
    for t, table in inputs.embeddings.items():
        by_slots = jax.jit(jax.shard_map(lambda s, table=table: touched(table, s),
                                         mesh=dg.mesh, in_specs=(table.specs(),),
                                         out_specs=ROWS))(state.embeddings[t])
        got = DistTensor(by_slots, table.layout, "touched", dg.mesh).to_numpy()
        if drawn:
            rows = np.arange(table.num_rows)
            assert np.array_equal(got, np.any(table.rows(state.embeddings[t], rows)
                                              != table.rows(fresh[t], rows), axis=1))
        out[table.layout.global_ids()] = got
    return out


def bfs(indptr, indices, start: np.ndarray, steps: int, upstream: bool = False
        ) -> np.ndarray:
    """bool[N]: nodes within `steps` hops of `start` along in-edges (messages' way:
    source to destination), or against them (`upstream`)."""
    dst = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    src = np.asarray(indices)
    if upstream:
        src, dst = dst, src
    got = start.copy()
    for _ in range(steps):
        nxt = got.copy()
        nxt[dst[got[src]]] = True
        got = nxt
    return got


def outputs(run, params, embeddings, what: What, signal):
    """Every item's `what` (of the last layer) by full-graph inference, in row order."""
    rows, lost = full_graph_rows_program(run.job, run.dg.graph, what, DEPTH)(
        params, embeddings, run.job.data(run.dg.graph), signal=signal)
    assert int(lost) == 0
    return labelled_rows(run.dg, run.job.labels.layout, rows).to_numpy()


def sampled_outputs(run, params, embeddings, what: What, signal) -> np.ndarray:
    """Every item's `what` over sampled blocks (`load_run`'s program), in row order."""
    dg, layout = run.dg, run.job.labels.layout
    counts = np.asarray(layout.counts)
    loader = NodeLoader.from_parts(dg.mesh, counts,
                                   lambda k: layout.starts[k] + np.arange(counts[k]),
                                   batch_size=64, most=64)
    job = run.job.evaluating(loader, (-1,) * DEPTH)
    program = job.compile_outputs(dg.graph, what, DEPTH)
    seeds, got = [], []
    order = loader.epoch_order(0)
    for i in range(loader.steps_per_epoch):
        s, h, _ = program(params, embeddings, job.data(dg.graph), order, jnp.int32(i),
                          signal=signal)
        s, h = np.asarray(s), np.asarray(h)
        seeds.append(s[s >= 0])
        got.append(h[s >= 0])
    seeds, got = np.concatenate(seeds), np.concatenate(got)
    return got[np.argsort(seeds)][np.searchsorted(np.sort(seeds), layout.global_ids())]


def run_on(tmp_path_factory, parts: int, **kw):
    """The far graph's run on `parts` devices (`config`'s settings, `kw` changed)."""
    path = partitioned(parts, str(tmp_path_factory.getbasetemp()))
    cfg = config(path, parts, **kw)
    return build_run(cfg, DistGraph(path, run_mesh(cfg)))


def check_reach(run, state, drawn: bool = True):
    """(reached, prior) of the run's `Signal` for `state`, checked: the prior is the
    training labels' frequencies; the rows training changed are those 2 hops upstream
    of a training item (every neighbour is drawn); the reach is a breadth-first search
    from them; A and the chain's first links are reached, the rest not."""
    reached, prior = host_signal(run, Reach(run)(state.embeddings))
    labels = run.job.labels.to_numpy()
    train = run.dg.split_mask("train", "item").to_numpy()
    np.testing.assert_allclose(prior, np.bincount(labels[train], minlength=CLASSES)
                               / train.sum(), rtol=1e-6)
    assert prior[3] == 0 and np.argmax(prior) == 0

    indptr, indices = global_csc(run.dg)
    changed = changed_rows(run, state, drawn)
    items = run.job.labels.layout.global_ids()
    start = np.zeros(run.dg.meta.num_nodes, bool)
    start[items[train]] = True
    assert np.array_equal(changed, bfs(indptr, indices, start, DEPTH, upstream=True))
    assert np.array_equal(reached, bfs(indptr, indices, changed, DEPTH)[items])
    orig = original_ids(run, "item")
    assert np.all(reached[orig < A_ITEMS]) and not np.any(reached[orig >= A_ITEMS + CHAIN])
    links = np.flatnonzero((orig >= A_ITEMS) & (orig < A_ITEMS + CHAIN))
    assert np.array_equal(reached[links[np.argsort(orig[links])]],
                          np.arange(CHAIN) <= DEPTH)
    return reached, prior


@pytest.mark.slow       # trains, then compiles every evaluation program twice, twice
def test_unreached_items_predict_the_prior_and_reached_ones_keep_the_model(
        tmp_path_factory):
    run = run_on(tmp_path_factory, 4)
    state = trained(run, epochs=EPOCHS)
    params, embeddings = state.params, state.embeddings
    labels = run.job.labels.to_numpy()
    reached, prior = check_reach(run, state)
    far = ~reached
    signal = Reach(run)(embeddings)

    # Without the prior, the far items answer with their embeddings' noise.
    before = outputs(run, params, embeddings, What.PROBABILITIES, None)
    assert np.unique(before[far].argmax(1)).size > 1
    # With it: the majority class, the prior's probabilities, the model's own outputs
    # elsewhere; the same over sampled blocks (`load_run`). Embeddings stay as they are.
    probs = outputs(run, params, embeddings, What.PROBABILITIES, signal)
    assert np.array_equal(probs[reached], before[reached])
    np.testing.assert_allclose(probs[far], np.broadcast_to(prior, probs[far].shape),
                               atol=1e-7)
    predictions = outputs(run, params, embeddings, What.PREDICTIONS, signal)
    assert np.all(predictions[far] == 0)
    assert np.array_equal(predictions, probs.argmax(1))
    assert np.array_equal(outputs(run, params, embeddings, What.EMBEDDINGS, signal),
                          outputs(run, params, embeddings, What.EMBEDDINGS, None))
    sampled = sampled_outputs(run, params, embeddings, What.PROBABILITIES, signal)
    np.testing.assert_allclose(sampled, probs, rtol=1e-5, atol=1e-6)
    assert np.array_equal(sampled.argmax(1), predictions)

    # Evaluation, sampled and full-graph, scores those predictions (a finite loss,
    # though no training item has class 3).
    full = FullGraphEvaluator(run, ("val", "test"))(params, embeddings)
    evaluator = SampledEvaluator(run, "val")
    for split in ("val", "test"):
        mask = run.dg.split_mask(split, "item").to_numpy()
        assert (mask & far).any() and (mask & reached).any()
        scores = (evaluator if split == "val" else evaluator.of(run, split))(params,
                                                                            embeddings)
        assert full[split]["acc"] == scores["acc"] == pytest.approx(
            np.mean(predictions[mask] == labels[mask]))
        assert np.isfinite(full[split]["loss"])
        np.testing.assert_allclose(full[split]["loss"], scores["loss"], rtol=1e-5)

    # One device, with the same model (its rows moved to the one partition), answers
    # as four.
    one = run_on(tmp_path_factory, 1)
    moved = moved_state(one, run, state)
    here, there = (np.argsort(original_ids(r, "item")) for r in (run, one))
    assert np.array_equal(check_reach(one, moved, drawn=False)[0][there], reached[here])
    np.testing.assert_allclose(
        outputs(one, moved.params, moved.embeddings, What.PROBABILITIES,
                Reach(one)(moved.embeddings))[there], probs[here], rtol=1e-5, atol=1e-6)
    assert one.kind.evaluate(one, moved.params, moved.embeddings, ("test",),
                             Inference.SAMPLED)["test"]["acc"] == full["test"]["acc"]


def original_ids(run, ntype: str) -> np.ndarray:
    """The original (type-local) id of each row of `ntype`'s layout, in row order."""
    dg = run.dg
    new = dg.layout(ntype).global_ids()
    return dg.parts.node_map()[new] - dg.meta.orig_type_offsets[dg.node_types.index(ntype)]


def moved_state(run, other, state):
    """`state` of `other`'s run (the same config on another partitioning) as `run`'s:
    its parameters, and every embedding table's rows and optimizer state moved to the
    rows of the same nodes."""
    embeddings = {}
    for t, table in run.job.inputs.embeddings.items():
        theirs = other.job.inputs.embeddings[t].layout
        at = np.argsort(original_ids(other, t))[original_ids(run, t)]

        def move(x, theirs=theirs, table=table, at=at):
            rows = DistTensor(x, theirs, "moved", other.dg.mesh).to_numpy()[at]
            return DistTensor.from_numpy(run.dg.mesh, table.layout, rows).array
        embeddings[t] = jax.tree.map(move, state.embeddings[t])
    return dataclasses.replace(state, params=jax.device_get(state.params),
                               embeddings=embeddings)


@pytest.mark.slow       # trains full-batch
@pytest.mark.parametrize("optimizer", list(SparseOptimizerKind))
def test_full_batch_training_touches_only_the_rows_with_a_gradient(tmp_path_factory,
                                                                   optimizer):
    """Full-batch training hands every row to the sparse optimizer, zero gradients
    included (Adam counts every row's steps), yet rows without a gradient neither move
    nor count as touched; the reach and the prior are as sampled training's, and the
    far items predict the prior."""
    run = run_on(tmp_path_factory, 4, mode="full", optimizer=optimizer)
    state = trained(run, epochs=EPOCHS)
    slots = state.embeddings["item"].slots
    if "step" in slots:
        steps = DistTensor(slots["step"], run.job.inputs.embeddings["item"].layout, "step",
                           run.dg.mesh).to_numpy()
        assert np.all(steps == EPOCHS)
    reached, prior = check_reach(run, state)
    signal = Reach(run)(state.embeddings)
    probs = outputs(run, state.params, state.embeddings, What.PROBABILITIES, signal)
    np.testing.assert_allclose(probs[~reached], np.broadcast_to(prior, probs[~reached].shape),
                               atol=1e-7)


def test_a_labelled_type_with_features_computes_nothing(tmp_path_factory):
    """Every labelled node is reached: no signal, so every program is the one it was."""
    path = partitioned(1, str(tmp_path_factory.getbasetemp()), features=True)
    cfg = config(path, 1)
    run = build_run(cfg, DistGraph(path, run_mesh(cfg)))
    assert "item" in run.job.inputs.features and "tag" in run.job.inputs.embeddings
    reach = Reach(run)
    assert not reach.needed and reach(None) is None
    # And a program given no signal is the program it was: no input added.
    state = run.job.init(run.params)
    program = full_graph_rows_program(run.job, run.dg.graph, What.PREDICTIONS, None)
    args = (state.params, state.embeddings, run.job.data(run.dg.graph))
    assert program.lower(*args, signal=None).as_text() == program.lower(*args).as_text()


def test_with_prior_replaces_unreached_rows_by_the_log_prior_and_stays_finite():
    logits = jnp.asarray([[3.0, 1.0, 0.0], [0.5, 2.0, 1.0]])
    prior = jnp.asarray([0.25, 0.75, 0.0])
    out = np.asarray(with_prior(logits, jnp.asarray([True, False]), prior))
    np.testing.assert_array_equal(out[0], logits[0])
    assert np.all(np.isfinite(out)) and out[1].argmax() == 1
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(out[1])), prior, atol=1e-7)
    loss = -jax.nn.log_softmax(out[1])[2]
    assert np.isfinite(float(loss))
