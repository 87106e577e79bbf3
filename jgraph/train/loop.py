"""`train_and_evaluate(config, workdir)`: the whole run behind `jgraph train`.

Sections: Mesh / Data / Model / Step / Evals / Loop / Report. The host only loads,
partitions, logs and evaluates; every training step is one compiled SPMD program
(`NodeClassification.train_step`) and the run counts how many times it was compiled.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml
from flax import nnx

from jgraph.config import ConfigError, to_dict
from jgraph.data import (add_reverse_relations, load_dataset, normalize_features,
                         symmetrize)
from jgraph.dist import DistGraph, make_mesh
from jgraph.dist.exchange import ExchangeStats
from jgraph.dist.mesh import first_devices
from jgraph.dist.sparse_optim import SparseAdagrad, SparseAdam
from jgraph.models import RGCN, GraphSAGE, InputEncoder, NodeClassifier, one_hot_width
from jgraph.partition import partition_graph
from jgraph.partition.store import read_meta
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sampling.sampler import SampleStats
from jgraph.train.experiment import (Experiment, Inference, ModelKind, Optimizer,
                                     SparseOptimizerKind)
from jgraph.train.inputs import NodeInputs
from jgraph.train.report import MetricsLog, plot_curves, scores, write_json
from jgraph.train.step import NodeClassification

PARTITION_DIR = "partition"


# -- Mesh and data ---------------------------------------------------------------------

def run_mesh(config: Experiment):
    """A mesh of data.num_parts devices; 0 means as many as a partition directory has
    partitions, or else every device."""
    count = config.data.num_parts
    if not count and is_partition_dir(config.data.path):
        count = read_meta(config.data.path).num_parts
    return make_mesh(None, first_devices(count or jax.device_count()))


def is_partition_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "meta.json"))


def open_graph(config: Experiment, mesh, workdir: str, progress: Progress) -> DistGraph:
    """The graph on the mesh: data.path itself when it is a partition directory, else
    the dataset loaded, transformed and partitioned into WORKDIR/partition (by the
    first process; the others wait for it)."""
    data = config.data
    if is_partition_dir(data.path):
        return DistGraph(data.path, mesh)
    root = os.path.join(workdir, PARTITION_DIR)
    if jax.process_index() == 0:
        with progress.phase(f"loading {data.path}"):
            graph = load_dataset(data.path)
            if data.symmetrize:
                graph = symmetrize(graph)
            if data.reverse_relations:
                graph = add_reverse_relations(graph)
            if data.normalize_features:
                graph = normalize_features(graph, data.feature)
        partition_graph(graph, mesh.size, data.method, root, seed=config.train.seed,
                        overwrite=True, progress=progress)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("jgraph partition written")
    return DistGraph(root, mesh)


def target_type(config: Experiment, dg: DistGraph) -> str:
    """The labelled node type: data.target_type, the only type, or the one with labels."""
    if config.data.target_type is not None:
        if config.data.target_type not in dg.node_types:
            raise ConfigError(f"data.target_type {config.data.target_type!r} is not a node "
                              f"type of the graph; it has {list(dg.node_types)}")
        return config.data.target_type
    labelled = [t for t in dg.node_types if config.data.label in dg.meta.node_data.get(t, {})]
    if len(labelled) != 1:
        raise ConfigError(f"data.label {config.data.label!r} is held by node types "
                          f"{labelled}; name one with data.target_type")
    return labelled[0]


# -- Model and step --------------------------------------------------------------------

def dense_optimizer(config: Experiment) -> optax.GradientTransformation:
    t = config.train
    if t.optimizer is Optimizer.ADAMW:
        return optax.adamw(t.lr, weight_decay=t.weight_decay)
    base = optax.adam(t.lr) if t.optimizer is Optimizer.ADAM else optax.sgd(t.lr)
    # Adam/SGD with weight decay as PyTorch: an L2 term added to the gradient.
    return optax.chain(optax.add_decayed_weights(t.weight_decay), base) if t.weight_decay else base


def sparse_optimizer(config: Experiment):
    t = config.train
    if t.embedding_optimizer is SparseOptimizerKind.ADAGRAD:
        return SparseAdagrad(learning_rate=t.embedding_lr)
    return SparseAdam(learning_rate=t.embedding_lr)


def build_model(config: Experiment, inputs: NodeInputs, num_classes: int,
                num_relations: int) -> NodeClassifier:
    m = config.model
    rngs = nnx.Rngs(config.train.seed)
    encoder = InputEncoder(inputs.widths(), tuple(inputs.features),
                           input_width(config, num_classes, num_relations), rngs=rngs)
    if m.kind is ModelKind.SAGE:
        gnn = GraphSAGE(encoder.width, m.hidden, num_classes, m.num_layers,
                        aggregator=m.aggregator, dropout=m.dropout,
                        input_dropout=m.input_dropout, norm=m.norm, rngs=rngs)
    else:
        gnn = RGCN(encoder.width, m.hidden, num_classes, m.num_layers, num_relations,
                   decomposition=m.decomposition, num_bases=m.num_bases,
                   self_loop=m.self_loop, normalization=m.normalization,
                   dropout=m.dropout, input_dropout=m.input_dropout, norm=m.norm,
                   one_hot_inputs=m.one_hot_inputs, rngs=rngs)
    return NodeClassifier(encoder, gnn)


def input_width(config: Experiment, num_classes: int, num_relations: int) -> int:
    """Width of embeddings (and of projected features with several node types)."""
    m = config.model
    if m.one_hot_inputs:
        return one_hot_width(m.hidden, num_classes, m.num_layers, num_relations, m.self_loop)
    return m.embedding_dim


@dataclasses.dataclass
class Run:
    """Everything a run holds on the host between steps."""

    config: Experiment
    dg: DistGraph
    target: str
    num_classes: int
    job: NodeClassification
    params: object

    def loader(self, split: str, batch_size: int, shuffle_seed: int = 0) -> NodeLoader:
        return NodeLoader.from_split(self.dg, split, self.target, batch_size=batch_size,
                                     seed=shuffle_seed)

    def has_split(self, split: str) -> bool:
        return split in self.dg.meta.splits.get(self.target, [])


def build_run(config: Experiment, dg: DistGraph) -> Run:
    t = config.train
    target = target_type(config, dg)
    sizes = {s: sum(p["splits"][target].get(s, 0) for p in dg.meta.parts)
             for s in dg.meta.splits.get(target, [])}
    if not sizes.get("train"):
        raise ConfigError(f"{config.data.path}: node type {target!r} has no training nodes "
                          f"(split 'train' is missing or empty); its splits: {sizes}")
    labels = dg.ndata(config.data.label, target)
    num_classes = int(labels.to_numpy().max(initial=0)) + 1
    num_relations = dg.graph.num_relations
    inputs = NodeInputs.of(dg, feature=config.data.feature,
                           embedding_dim=input_width(config, num_classes, num_relations),
                           optimizer=sparse_optimizer(config),
                           learnable=config.model.learnable_inputs)
    if config.model.one_hot_inputs and inputs.features and len(inputs.node_types) == 1:
        raise ConfigError(
            f"model.one_hot_inputs: node type {inputs.node_types[0]!r} of {config.data.path} "
            f"has {config.data.feature!r} features, which one-hot inputs would replace by "
            f"learned rows; set model.learnable_inputs=true to train without them")
    model = build_model(config, inputs, num_classes, num_relations)
    graphdef, params = nnx.split(model, nnx.Param)
    loader = NodeLoader.from_split(dg, "train", target, batch_size=t.batch_size,
                                   drop_last=t.drop_last, seed=t.seed)
    job = NodeClassification(graphdef, dense_optimizer(config), NeighborSampler(t.fanouts),
                             loader, dg.exchange(config.exchange), inputs, labels, seed=t.seed)
    return Run(config, dg, target, num_classes, job, params)


# -- Evals -----------------------------------------------------------------------------

def check_stats(stats) -> None:
    """Raise if any exchange in a step lost ids (capacity overflow, ids out of range)."""
    for leaf in jax.tree.leaves(stats, is_leaf=lambda x: isinstance(x, (ExchangeStats,
                                                                        SampleStats))):
        if isinstance(leaf, (ExchangeStats, SampleStats)):
            leaf.check()


class SampledEvaluator:
    """Evaluates a split with the evaluation fanouts, batch by batch (one compilation
    per split)."""

    def __init__(self, run: Run, split: str, on_trace=None):
        t = run.config.train
        self.job = dataclasses.replace(run.job, loader=run.loader(split, t.eval_batch_size),
                                       sampler=NeighborSampler(t.eval_fanouts))
        self.step = self.job.compile_eval(run.dg.graph, on_trace)
        self.data = self.job.data(run.dg.graph)
        self.order = self.job.loader.epoch_order(0)

    def __call__(self, params, embeddings) -> dict:
        outs = [self.step(params, embeddings, self.data, self.order, jnp.int32(i))
                for i in range(self.job.loader.steps_per_epoch)]
        confusion = sum(np.asarray(o["confusion"]) for o in outs)
        loss = sum(float(o["loss"]) for o in outs)
        result = scores(confusion)
        result["loss"] = loss / max(result["count"], 1)
        return result


def evaluate_splits(run: Run, params, embeddings, splits, inference: Inference,
                    evaluators=None, on_trace=None) -> dict:
    """{split: scores or None (the graph has no such split)}, sampled or full-graph.
    evaluators: already compiled `SampledEvaluator`s to reuse, by split."""
    present = [s for s in splits if run.has_split(s)]
    out = {s: None for s in splits}
    if inference is Inference.FULL:
        from jgraph.train.inference import full_graph_scores
        if present:
            out.update(full_graph_scores(run, params, embeddings, present))
        return out
    for split in present:
        evaluator = (evaluators or {}).get(split) or SampledEvaluator(run, split, on_trace)
        out[split] = evaluator(params, embeddings)
    return out


# -- Loop ------------------------------------------------------------------------------

def train_and_evaluate(config: Experiment, workdir: str, progress: Progress | None = None
                       ) -> dict:
    """Train `config`, write metrics.jsonl, result.json and curves.png to `workdir`, and
    return the result."""
    progress = progress or Progress()
    config.check()
    start = time.perf_counter()
    writer = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)

    mesh = run_mesh(config)
    dg = open_graph(config, mesh, workdir, progress)
    run = build_run(config, dg)
    job, t = run.job, config.train
    traces = {"train_step": 0, "eval_step": 0}

    def counter(name):
        def bump():
            traces[name] += 1
        return bump

    train = job.compile_train(dg.graph, on_trace=counter("train_step"))
    data = job.data(dg.graph)
    state = job.init(run.params)
    val_eval = (SampledEvaluator(run, "val", counter("eval_step"))
                if run.has_split("val") else None)
    progress.note(f"{config.name}: {dg.meta.num_nodes:,} nodes on {mesh.size} device(s), "
                  f"{job.loader.num_seeds:,} training seeds, {job.loader.steps_per_epoch} "
                  f"steps per epoch, {run.num_classes} classes")

    log = MetricsLog(workdir, enabled=writer)
    if writer:
        with open(os.path.join(workdir, "config.yaml"), "w") as f:
            yaml.safe_dump(to_dict(config), f, sort_keys=False)
    best = {"val_acc": -1.0, "epoch": None, "state": None}
    steps = job.loader.steps_per_epoch
    for epoch in range(t.epochs):
        order = job.loader.epoch_order(epoch)
        tick = time.perf_counter()
        step_metrics = []
        bar = progress.iterate(range(steps), f"epoch {epoch}", total=steps)
        for index in bar:
            state, metrics = train(state, data, order, jnp.int32(index))
            step_metrics.append(metrics)
            if index % max(steps // 10, 1) == 0:
                bar.set_postfix(loss=f"{float(metrics['loss']):.4f}")
        step_metrics = jax.device_get(step_metrics)
        epoch_seconds = time.perf_counter() - tick
        for m in step_metrics:
            check_stats(m["stats"])
        count = sum(int(m["count"]) for m in step_metrics)
        loss = sum(float(m["loss"]) * int(m["count"]) for m in step_metrics) / max(count, 1)
        row = {"epoch": epoch, "step": int(state.step), "loss": loss,
               "train_acc": sum(int(m["correct"]) for m in step_metrics) / max(count, 1),
               "val_acc": None, "epoch_seconds": epoch_seconds,
               "seeds_per_s": count / epoch_seconds}
        if val_eval is not None:
            val = val_eval(state.params, state.embeddings)
            row.update(val_acc=val["acc"], val_macro_f1=val["macro_f1"], val_loss=val["loss"])
            if val["acc"] > best["val_acc"]:
                best = {"val_acc": val["acc"], "epoch": epoch,
                        "state": jax.tree.map(jnp.copy, (state.params, state.embeddings))}
        log.write(row)
        progress.note(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()))

    # -- final evaluation: the best epoch by validation accuracy (the last without a val
    # split), on val and test, sampled or full-graph.
    if best["state"] is None:
        best = {"epoch": t.epochs - 1, "state": (state.params, state.embeddings)}
    params, embeddings = best["state"]
    with progress.phase(f"evaluating ({t.inference.value})"):
        final = evaluate_splits(run, params, embeddings, ("val", "test"), t.inference,
                                {"val": val_eval}, counter("eval_step"))

    def pick(split, key):
        return None if final[split] is None else final[split][key]
    rows = log.rows
    result = {
        "val_acc": pick("val", "acc"), "test_acc": pick("test", "acc"),
        "val_macro_f1": pick("val", "macro_f1"), "test_macro_f1": pick("test", "macro_f1"),
        "best_epoch": best["epoch"], "final_loss": rows[-1]["loss"] if rows else None,
        "compiles": traces["train_step"], "compiles_by_step": dict(traces),
        "seconds": time.perf_counter() - start,
        "seeds_per_s": float(np.median([r["seeds_per_s"] for r in rows])) if rows else None,
        "devices": mesh.size, "graph": dg.meta.graph_name, "inference": t.inference.value,
        "config": to_dict(config),
    }
    save_model(workdir, params, embeddings)
    if writer:
        write_json(os.path.join(workdir, "result.json"), result)
        if rows:
            plot_curves(rows, os.path.join(workdir, "curves.png"),
                        f"{config.name}: {dg.meta.graph_name} on {mesh.size} device(s)")
    return result


# -- The trained model on disk (what `jgraph eval` reads) ------------------------------

MODEL_DIR = "model"


def save_model(workdir: str, params, embeddings) -> str:
    """Write the model's parameters and embedding tables to WORKDIR/model (orbax)."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, {"params": params, "embeddings": embeddings}, force=True)
    return path


def load_model(workdir: str, run: Run):
    """(params, embeddings) saved by `save_model`, placed like a fresh run's."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    if not os.path.isdir(path):
        raise ConfigError(f"{workdir}: no trained model ({MODEL_DIR}/ is missing); "
                          f"train with `jgraph train CONFIG --workdir {workdir}` first")
    fresh = run.job.init(run.params)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                          {"params": fresh.params, "embeddings": fresh.embeddings})
    with ocp.StandardCheckpointer() as ckpt:
        got = ckpt.restore(path, target)
    return got["params"], got["embeddings"]


def evaluate_run(workdir: str, splits=("val", "test"), inference: Inference | None = None,
                 progress: Progress | None = None) -> dict:
    """Scores of the model a run saved, on `splits`, with the run's config (its
    inference unless `inference` is given)."""
    from jgraph.config import load
    progress = progress or Progress()
    if not os.path.exists(os.path.join(workdir, "config.yaml")):
        raise ConfigError(f"{workdir}: not a trained run (no config.yaml); train with "
                          f"`jgraph train CONFIG --workdir {workdir}` first")
    config = load(Experiment, os.path.join(workdir, "config.yaml"))
    mesh = run_mesh(config)
    dg = open_graph(config, mesh, workdir, progress) if is_partition_dir(config.data.path) \
        else DistGraph(os.path.join(workdir, PARTITION_DIR), mesh)
    run = build_run(config, dg)
    params, embeddings = load_model(workdir, run)
    for split in splits:
        if not run.has_split(split):
            raise ConfigError(f"split {split!r} is not in the graph; it has "
                              f"{sorted(dg.meta.splits.get(run.target, []))}")
    return evaluate_splits(run, params, embeddings, splits,
                           inference or config.train.inference)
