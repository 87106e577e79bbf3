"""Correct & Smooth after a node-classification run: `jgraph smooth WORKDIR`.

The run's saved model gives every labelled node's class probabilities by layer-wise
full-graph inference (the base predictor). Correct & Smooth
(`jgraph.jobs.propagation.CorrectAndSmooth`, Huang et al., ICLR 2021) then spreads the
training nodes' errors and smooths with their labels, over the partitioned graph on the
run's devices. Its two alphas are chosen on the validation split from a grid that holds
both at 0, the base predictions themselves, so the validation accuracy never falls
below the base's. Writes WORKDIR/correct_and_smooth.json.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax

from jgraph.config import ConfigError
from jgraph.data.outputs import What
from jgraph.jobs.inference import full_graph_rows_program
from jgraph.jobs.metrics import accuracy
from jgraph.jobs.propagation import CorrectAndSmooth, labelled_rows
from jgraph.progress import Progress
from jgraph.train.model import open_trained
from jgraph.train.report import write_json

RESULT = "correct_and_smooth.json"


@dataclasses.dataclass(frozen=True)
class SmoothSettings:
    """correct_steps, smooth_steps: the propagations' steps (PyG's examples: 50);
    correct_alphas, smooth_alphas: the grid the validation split chooses from (0 in
    both: the base predictions); autoscale: scale each row's correction to the
    training rows' mean absolute error (else by `scale`)."""

    correct_steps: int = 50
    smooth_steps: int = 50
    correct_alphas: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0)
    smooth_alphas: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0)
    autoscale: bool = True
    scale: float = 1.0

    def __post_init__(self):
        for name in ("correct_steps", "smooth_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("correct_alphas", "smooth_alphas"):
            alphas = getattr(self, name)
            if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
                raise ConfigError(f"{name} are alphas in [0, 1], got {list(alphas)}")


def smooth_run(workdir: str, settings: SmoothSettings = SmoothSettings(),
               progress: Progress | None = None) -> dict:
    """Correct & Smooth of the run in `workdir` (see the module); returns and writes
    its result: the base's and the chosen alphas' val and test accuracy, the alphas,
    every grid point's validation accuracy and the seconds it took."""
    progress = progress or Progress()
    start = time.perf_counter()
    run, params, embeddings = open_trained(workdir, progress)
    if not run.kind.classifies:
        raise ConfigError(f"{workdir}: a {run.kind.title} run has no classes to correct; "
                          f"Correct & Smooth follows node classification")
    if not run.has_split("val"):
        raise ConfigError(f"{workdir}: the graph has no validation split, which chooses "
                          f"Correct & Smooth's alphas")
    dg, labels = run.dg, run.job.labels
    with progress.phase("the base predictions, by full-graph inference"):
        rows, lost = full_graph_rows_program(run.job, dg.graph, What.PROBABILITIES, None)(
            params, embeddings, run.job.data(dg.graph))
        if int(lost):
            raise RuntimeError(f"{workdir}: full-graph inference lost {int(lost)} ids")
        probs = labelled_rows(dg, labels.layout, rows)
    masks = {s: dg.split_mask(s, run.target).array for s in ("val", "test")
             if run.has_split(s)}
    score = lambda scores, split: (accuracy(scores.array, labels.array, masks[split])
                                   if split in masks else None)
    corrected = CorrectAndSmooth(dg, labels, dg.split_mask("train", run.target),
                                 run.num_classes, correct_steps=settings.correct_steps,
                                 smooth_steps=settings.smooth_steps,
                                 autoscale=settings.autoscale)
    grid = []
    with progress.phase(f"correcting and smoothing: {len(settings.correct_alphas)} x "
                        f"{len(settings.smooth_alphas)} alphas"):
        for a in settings.correct_alphas:
            for b in settings.smooth_alphas:
                out = corrected(probs, a, b, settings.scale)
                grid.append({"correct_alpha": a, "smooth_alpha": b,
                             "val_acc": score(out, "val")})
    best = max(grid, key=lambda point: point["val_acc"])     # the first of those tied
    out = corrected(probs, best["correct_alpha"], best["smooth_alpha"], settings.scale)
    result = {"base_val_acc": score(probs, "val"), "base_test_acc": score(probs, "test"),
              "val_acc": best["val_acc"], "test_acc": score(out, "test"),
              "correct_alpha": best["correct_alpha"], "smooth_alpha": best["smooth_alpha"],
              **dataclasses.asdict(settings), "grid": grid,
              "seconds": time.perf_counter() - start}
    if jax.process_index() == 0:
        write_json(os.path.join(workdir, RESULT), result)
    return result
