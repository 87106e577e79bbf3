"""Evaluation of a run: sampled (batch by batch with the evaluation fanouts) or
full-graph, each split scored as its job kind scores it."""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from jgraph.jobs.experiment import Inference
from jgraph.jobs.metrics import scores
from jgraph.jobs.run import Run
from jgraph.jobs.signal import Reach
from jgraph.progress import Progress
from jgraph.sampling.loader import shared_shape

# -- Sampled and full-graph evaluation ---------------------------------------------------

EVALUATED = ("val", "test")
"""The splits a run evaluates: their loaders share one shape, so one compiled program
evaluates both (`SampledEvaluator.of`)."""


def evaluation(run: Run, split: str):
    """The run's job evaluating `split` with the evaluation fanouts, its batches shaped
    alike for each of `EVALUATED`."""
    t = run.config.train
    most = shared_shape(run.dg, EVALUATED, run.target) if split in EVALUATED else None
    return run.job.evaluating(run.loader(split, t.eval_batch_size, most=most), t.eval_fanouts)


class SampledEvaluator:
    """Evaluates a split with the evaluation fanouts, batch by batch: compiled at the
    first call (`compile_seconds`), once for val and test (their batches are shaped
    alike; `of` makes the other split's evaluator from the compiled one)."""

    def __init__(self, run: Run, split: str, on_trace=None, progress: Progress | None = None):
        self.job = evaluation(run, split)
        self.step = self.job.compile_eval(run.dg.graph, on_trace)
        self.data = self.job.data(run.dg.graph)
        self.reach = Reach(run)
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
        # Nodes no signal reaches score the prior (None: the labelled type has features).
        signal = self.reach(embeddings)
        if self.compiled is None:
            start = time.perf_counter()
            with self.progress.phase(f"compiling the {self.split} evaluation step for "
                                     f"{self.job.mesh.size} device(s)"):
                self.compiled = self.step.lower(params, embeddings, self.data, self.order,
                                                jnp.int32(0), signal=signal).compile()
            self.compile_seconds = time.perf_counter() - start
        outs = [self.compiled(params, embeddings, self.data, self.order, jnp.int32(i),
                              signal=signal)
                for i in range(self.job.loader.steps_per_epoch)]
        classes = sum(np.asarray(o["classes"]) for o in outs)
        loss = sum(float(o["loss"]) for o in outs)
        result = scores(classes)
        result["loss"] = loss / max(result["count"], 1)
        return result


def evaluate_splits(run: Run, params, embeddings, splits, inference: Inference,
                    evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
    """{split: scores or None (the graph has no such split)}, sampled or full-graph, as
    the run's kind scores them (`JobKind.evaluate`). evaluators: already compiled
    evaluators to reuse, by split, where they evaluate as asked."""
    return run.kind.evaluate(run, params, embeddings, splits, inference, evaluators,
                             on_trace, progress)
