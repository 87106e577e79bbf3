"""Evaluation of a run: sampled (batch by batch with the evaluation fanouts) or
full-graph, the trained model on disk (WORKDIR/model) and `jgraph eval`."""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.config import ConfigError
from jgraph.mesh import all_processes, host_sync
from jgraph.progress import Progress
from jgraph.sampling.loader import shared_shape
from jgraph.sharded import DistGraph
from jgraph.train.checkpoint import (
    ModelError,
    check_space,
    checksums,
    mismatched,
    quiet_abandoned_reads,
    read_failure,
    refused_writes,
)
from jgraph.train.experiment import Experiment, Inference, Task
from jgraph.train.report import scores
from jgraph.train.run import PARTITION_DIR, Run, build_run, is_partition_dir, open_graph, run_mesh

# -- Sampled and full-graph evaluation ---------------------------------------------------

EVALUATED = ("val", "test")
"""The splits a run evaluates: their loaders share one shape, so one compiled program
evaluates both (`SampledEvaluator.of`)."""


class SampledEvaluator:
    """Evaluates a split with the evaluation fanouts, batch by batch: compiled at the
    first call (`compile_seconds`), once for val and test (their batches are shaped
    alike; `of` makes the other split's evaluator from the compiled one)."""

    def __init__(self, run: Run, split: str, on_trace=None, progress: Progress | None = None):
        t = run.config.train
        most = shared_shape(run.dg, EVALUATED, run.target) if split in EVALUATED else None
        self.job = run.job.evaluating(run.loader(split, t.eval_batch_size, most=most),
                                      t.eval_fanouts)
        self.step = self.job.compile_eval(run.dg.graph, on_trace)
        self.data = self.job.data(run.dg.graph)
        self.order = self.job.loader.epoch_order(0)
        self.progress = progress or Progress(enabled=False)
        self.split = split
        self.compiled = None
        self.compile_seconds: float | None = None

    def of(self, run: Run, split: str, on_trace=None) -> SampledEvaluator:
        """The evaluator of another of `EVALUATED`, running the program this one has
        compiled (a fresh evaluator, traced with `on_trace`, if it has not yet or if the
        shapes differ)."""
        t = run.config.train
        loader = run.loader(split, t.eval_batch_size,
                            most=shared_shape(run.dg, EVALUATED, run.target))
        same = (self.compiled is not None and loader.batch_size == self.job.loader.batch_size
                and loader.per_device == self.job.loader.per_device)
        if not same or split not in EVALUATED or self.split not in EVALUATED:
            return SampledEvaluator(run, split, on_trace, self.progress)
        other = object.__new__(SampledEvaluator)
        other.__dict__.update(self.__dict__)
        other.job = self.job.evaluating(loader, t.eval_fanouts)
        other.order, other.split = loader.epoch_order(0), split
        other.compile_seconds = 0.0
        return other

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
    evaluators: already compiled evaluators to reuse, by split (`SampledEvaluator`s; a
    link run's "val" one is its `LinkEvaluator`, which ranks any split)."""
    present = [s for s in splits if run.has_split(s)]
    out = dict.fromkeys(splits)
    if run.config.task is Task.LINK:
        from jgraph.train.link import LinkEvaluator
        evaluator = (evaluators or {}).get("val")
        if inference is not Inference.SAMPLED or not isinstance(evaluator, LinkEvaluator):
            evaluator = LinkEvaluator(run, inference, on_trace)
        if present:
            out.update(evaluator(params, embeddings, present))
        return out
    if inference is Inference.FULL:
        from jgraph.train.inference import full_graph_scores
        if present:
            out.update(full_graph_scores(run, params, embeddings, present))
        return out
    known = dict(evaluators or {})
    for split in present:
        evaluator = known.get(split)
        if evaluator is None:
            # Another split's compiled program evaluates this one where they share shapes.
            compiled = next((e for e in known.values() if isinstance(e, SampledEvaluator)),
                            None)
            evaluator = (compiled.of(run, split, on_trace) if compiled is not None
                         else SampledEvaluator(run, split, on_trace, progress))
            known[split] = evaluator
        out[split] = evaluator(params, embeddings)
    return out


# -- The trained model on disk (what `jgraph eval` reads) ------------------------------
#
# WORKDIR/model is an orbax checkpoint of {"params", "embeddings"} plus CHECKSUMS_FILE,
# {"format", "checksums": {leaf path: checksum}} (the checkpoints' checksums), written
# once the arrays are on disk. Orbax reads some damaged files without complaint and
# returns wrong numbers, so a model is only used once its values match.

MODEL_DIR = "model"
CHECKSUMS_FILE = "jgraph_checksums.json"
MODEL_FORMAT = 1


def save_model(workdir: str, params, embeddings) -> str:
    """Write the model's parameters and embedding tables to WORKDIR/model (orbax), then
    their checksums."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    tree = {"params": params, "embeddings": embeddings}
    record = {"format": MODEL_FORMAT, "checksums": checksums(tree)}
    check_space(path, tree, "the trained model")
    with refused_writes(path), ocp.StandardCheckpointer() as ckpt:   # leaving waits
        ckpt.save(path, tree, force=True)
    if jax.process_index() == 0:
        # tmp + rename: a crash leaves no checksums at all rather than half of them.
        tmp = os.path.join(path, CHECKSUMS_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, CHECKSUMS_FILE))
    host_sync("jgraph model saved")
    return path


def rewrite_hint(workdir: str) -> str:
    return (f"write it again with `jgraph train {os.path.join(workdir, 'config.yaml')} "
            f"--workdir {workdir}` (with the run's --devices): it resumes from the run's "
            f"last checkpoint and saves the model without training again")


def saved_checksums(workdir: str) -> dict[str, int]:
    """The checksums `save_model` wrote beside the model, or `ModelError`."""
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR, CHECKSUMS_FILE))
    if not os.path.exists(path):
        raise ModelError(f"{os.path.dirname(path)} has no checksums ({CHECKSUMS_FILE}: "
                         f"saved by an older jgraph, or its save was interrupted), so its "
                         f"values cannot be verified; {rewrite_hint(workdir)}")
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record, dict) or record.get("format") != MODEL_FORMAT:
            raise ValueError(f"not of format {MODEL_FORMAT}, the one this jgraph reads")
        sums = record.get("checksums")
        if not (isinstance(sums, dict) and all(isinstance(v, int) for v in sums.values())):
            raise ValueError("no table of checksums")
    except ValueError as e:         # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{path} is unreadable ({type(e).__name__}: {e}); "
                         f"{rewrite_hint(workdir)}") from None
    return sums


def load_model(workdir: str, run: Run):
    """(params, embeddings) saved by `save_model`, placed like a fresh run's; raises
    `ModelError` unless they can be read and match their checksums. Every process of a
    job raises, or none."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    if not os.path.isdir(path):
        raise ConfigError(f"{workdir}: no trained model ({MODEL_DIR}/ is missing); "
                          f"train with `jgraph train CONFIG --workdir {workdir}` first")

    def agree(error: ModelError | None) -> None:
        if not all_processes(error is None):
            raise error or ModelError(f"{path} is unreadable on another process; "
                                      f"{rewrite_hint(workdir)}")

    saved, error = None, None
    try:
        saved = saved_checksums(workdir)
    except ModelError as e:
        error = e
    agree(error)
    fresh = run.job.init(run.params)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                          {"params": fresh.params, "embeddings": fresh.embeddings})
    try:
        with ocp.StandardCheckpointer() as ckpt:
            got = ckpt.restore(path, target)
    except Exception as e:
        error = ModelError(f"{path} is unreadable ({read_failure(e)}); {rewrite_hint(workdir)}")
        quiet_abandoned_reads()
    agree(error)
    bad = mismatched(saved, got)       # the same on every process (global arrays)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ModelError(f"{path} is damaged: the values of {bad[0]}{more} differ from "
                         f"those saved (checksums); {rewrite_hint(workdir)}")
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
