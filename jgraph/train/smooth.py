"""Correct & Smooth after a node-classification run: `jgraph smooth WORKDIR`, or
`smooth.after_training` at the end of `jgraph train`.

The run's class probabilities for every labelled node (the base predictor: the model's
by layer-wise full-graph inference, or label propagation's; `JobKind.class_scores`) are
corrected and smoothed (`jgraph.jobs.propagation.CorrectAndSmooth`, Huang et al., ICLR
2021): the training nodes' errors spread, then their labels, over the partitioned graph
on the run's devices. The two alphas are chosen on the validation split from a grid
that holds both at 0, the base predictions themselves, so the validation accuracy never
falls below the base's. Writes WORKDIR/correct_and_smooth.json, which `jgraph embed
--smoothed` and `jgraph.load_run(WORKDIR, smoothed=True)` read to answer with the
smoothed predictions.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jgraph.config import ConfigError
from jgraph.data.outputs import What
from jgraph.jobs.experiment import SmoothConfig
from jgraph.jobs.metrics import accuracy
from jgraph.jobs.propagation import CorrectAndSmooth, placed_rows, rows_summing_to_one
from jgraph.jobs.run import Run
from jgraph.progress import Progress
from jgraph.sharded.tensor import DistTensor
from jgraph.train.model import open_trained
from jgraph.train.report import write_json

RESULT = "correct_and_smooth.json"


def smooth_run(workdir: str, changes: Mapping | None = None,
               progress: Progress | None = None) -> dict:
    """Correct & Smooth of the run in `workdir` (see the module) with the run's `smooth`
    settings, `changes` (fields of `SmoothConfig`) replacing some; returns and writes
    its result."""
    progress = progress or Progress()
    run, params, embeddings = open_trained(workdir, progress)
    try:
        settings = dataclasses.replace(run.config.smooth, **(changes or {}))
    except ConfigError as e:
        raise ConfigError(f"Correct & Smooth of {workdir}: {e}") from None
    return smooth_trained(run, params, embeddings, workdir, settings, progress)


def smooth_trained(run: Run, params, embeddings, workdir: str, settings: SmoothConfig,
                   progress: Progress | None = None) -> dict:
    """Correct & Smooth of `run`'s predictions with `params` and `embeddings`; returns
    and writes (WORKDIR/correct_and_smooth.json) the base's and the chosen alphas' val
    and test accuracy, the alphas, the settings, every grid point's validation accuracy
    and the seconds it took."""
    progress = progress or Progress(enabled=False)
    start = time.perf_counter()
    if not run.kind.classifies:
        raise ConfigError(f"{workdir}: a {run.kind.title} run has no classes to correct; "
                          f"Correct & Smooth follows node classification")
    if not run.has_split("val"):
        raise ConfigError(f"{workdir}: the graph has no validation split, which chooses "
                          f"Correct & Smooth's alphas")
    dg, labels = run.dg, run.job.labels
    with progress.phase("the base predictions, over the whole graph"):
        probs = run.kind.class_scores(run, params, embeddings)
    masks = {s: dg.split_mask(s, run.target).array for s in ("val", "test")
             if run.has_split(s)}
    score = lambda scores, split: (accuracy(scores.array, labels.array, masks[split])
                                   if split in masks else None)
    corrected = _corrector(run, settings)
    grid, best, out = [], None, None
    with progress.phase(f"correcting and smoothing: {len(settings.correct_alphas)} x "
                        f"{len(settings.smooth_alphas)} alphas"):
        for a in settings.correct_alphas:
            for b in settings.smooth_alphas:
                tried = corrected(probs, a, b, settings.scale)
                grid.append({"correct_alpha": a, "smooth_alpha": b,
                             "val_acc": score(tried, "val")})
                if best is None or grid[-1]["val_acc"] > best["val_acc"]:
                    best, out = grid[-1], tried      # the first of those tied
    chosen = {k: v for k, v in dataclasses.asdict(settings).items() if k != "after_training"}
    result = {"base_val_acc": score(probs, "val"), "base_test_acc": score(probs, "test"),
              "val_acc": best["val_acc"], "test_acc": score(out, "test"),
              "correct_alpha": best["correct_alpha"], "smooth_alpha": best["smooth_alpha"],
              **chosen, "grid": grid, "seconds": time.perf_counter() - start}
    if jax.process_index() == 0:
        write_json(os.path.join(workdir, RESULT), result)
    return result


def smoothed_scores(run: Run, params, embeddings, workdir: str) -> DistTensor:
    """The run's class probabilities after the Correct & Smooth that
    WORKDIR/correct_and_smooth.json records (its settings and chosen alphas): float32
    [rows, classes] of every labelled node, each row divided by its sum."""
    path = os.path.join(workdir, RESULT)
    if not os.path.exists(path):
        raise ConfigError(f"{workdir}: not smoothed ({RESULT} is missing); run `jgraph "
                          f"smooth {workdir}` first, or train with "
                          f"smooth.after_training=true")
    try:
        with open(path) as f:
            record = json.load(f)
        fields = {f.name for f in dataclasses.fields(SmoothConfig)} - {"after_training"}
        settings = SmoothConfig(**{k: (tuple(v) if isinstance(v, list) else v)
                                   for k, v in record.items() if k in fields})
        alphas = float(record["correct_alpha"]), float(record["smooth_alpha"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is unreadable ({type(e).__name__}: {e}); run `jgraph "
                          f"smooth {workdir}` again") from None
    probs = run.kind.class_scores(run, params, embeddings)
    return rows_summing_to_one(_corrector(run, settings)(probs, *alphas, settings.scale))


def _corrector(run: Run, settings: SmoothConfig) -> CorrectAndSmooth:
    return CorrectAndSmooth(run.dg, run.job.labels, run.dg.split_mask("train", run.target),
                            run.num_classes, correct_steps=settings.correct_steps,
                            smooth_steps=settings.smooth_steps,
                            autoscale=settings.autoscale)



def predicted_scores(run: Run, params, embeddings, workdir: str, smoothed: bool,
                     progress: Progress | None = None) -> DistTensor | None:
    """The class probabilities of every labelled node where they are not the model's
    layers' own: Correct & Smooth's (`smoothed`: as WORKDIR/correct_and_smooth.json
    chose), or those of a kind that learns nothing (label propagation's); None: the
    model's (full-graph inference gives them, with its other outputs)."""
    progress = progress or Progress(enabled=False)
    if smoothed:
        with progress.phase("correcting and smoothing, as chosen"):
            return smoothed_scores(run, params, embeddings, workdir)
    if not run.kind.learns:
        with progress.phase(run.kind.title):
            return run.kind.class_scores(run, params, embeddings)
    return None


def every_node_rows(dg, scores: DistTensor, what: What):
    """`scores` (class probabilities of the labelled type) as `what` asks (themselves,
    or their argmax for predictions), in each device's block of every node
    (row-sharded [P * nodes_per_part, ...]; zeros in other types' rows), as full-graph
    inference gives a model's outputs."""
    rows = scores.array
    if What(what) is What.PREDICTIONS:
        rows = jnp.argmax(rows, axis=-1).astype(jnp.int32)
    return placed_rows(dg, scores.layout, rows)
