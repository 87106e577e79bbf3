"""Evaluation of a run: sampled (batch by batch with the evaluation fanouts) or
full-graph, the trained model on disk (WORKDIR/model) and `jgraph eval`."""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.config import ConfigError
from jgraph.dist import DistGraph
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler
from jgraph.train.experiment import Experiment, Inference
from jgraph.train.report import scores
from jgraph.train.run import PARTITION_DIR, Run, build_run, is_partition_dir, open_graph, run_mesh

# -- Sampled and full-graph evaluation -----------------------------------------------------------------------------

class SampledEvaluator:
    """Evaluates a split with the evaluation fanouts, batch by batch (one compilation
    per split, at the first call: `compile_seconds`)."""

    def __init__(self, run: Run, split: str, on_trace=None, progress: Progress | None = None):
        t = run.config.train
        self.job = dataclasses.replace(run.job, loader=run.loader(split, t.eval_batch_size),
                                       sampler=NeighborSampler(t.eval_fanouts))
        self.step = self.job.compile_eval(run.dg.graph, on_trace)
        self.data = self.job.data(run.dg.graph)
        self.order = self.job.loader.epoch_order(0)
        self.progress = progress or Progress(enabled=False)
        self.split = split
        self.compiled = None
        self.compile_seconds: float | None = None

    def __call__(self, params, embeddings) -> dict:
        if self.compiled is None:
            start = time.perf_counter()
            with self.progress.phase(f"compiling the {self.split} evaluation step for "
                                     f"{self.job.mesh.size} device(s)"):
                self.compiled = self.step.lower(params, embeddings, self.data, self.order,
                                                jnp.int32(0)).compile()
            self.compile_seconds = time.perf_counter() - start
        outs = [self.compiled(params, embeddings, self.data, self.order, jnp.int32(i))
                for i in range(self.job.loader.steps_per_epoch)]
        classes = sum(np.asarray(o["classes"]) for o in outs)
        loss = sum(float(o["loss"]) for o in outs)
        result = scores(classes)
        result["loss"] = loss / max(result["count"], 1)
        return result


def evaluate_splits(run: Run, params, embeddings, splits, inference: Inference,
                    evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
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
        evaluator = (evaluators or {}).get(split) or SampledEvaluator(run, split, on_trace,
                                                                       progress)
        out[split] = evaluator(params, embeddings)
    return out


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
                           inference or config.train.inference, progress=progress)
