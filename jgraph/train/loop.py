"""`train_and_evaluate(config, workdir)`: the whole run behind `jgraph train`.

`_train_and_evaluate` sets the run up (mesh, graph, model, where to start: see
`jgraph.train.resume`); a `Loop` runs the epochs over its `LoopState` and reports. The
host only loads, logs, evaluates and checkpoints; every training step is one compiled
SPMD program (`Job.train_step`) and the run counts how many times it
was compiled.

A run checkpoints itself (see `jgraph.train.checkpoint`) and, started again on the
same workdir, continues from its newest checkpoint exactly: the same batches, the same
random draws (all keyed by the seed and the step), the same per-step losses and final
metrics as if it had never stopped. SIGINT or SIGTERM makes it save and stop
(`RunStopped`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jgraph.config import ConfigError, to_dict
from jgraph.exchange import sizing
from jgraph.jobs import build_run
from jgraph.jobs.dataset import open_graph, run_mesh
from jgraph.jobs.evaluate import evaluate_splits
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.run import Run, check_stats
from jgraph.jobs.step import Job, TrainState
from jgraph.mesh import host_sync
from jgraph.progress import Progress
from jgraph.sampling.capacity import grow
from jgraph.sampling.loader import LoaderState
from jgraph.train.checkpoint import CheckpointError, Checkpoints, StopRequest
from jgraph.train.events import EventLog
from jgraph.train.model import save_model
from jgraph.train.report import JsonLog, plot_curves, read_json_lines, write_json
from jgraph.train.resume import (
    Best,
    EpochSums,
    Resume,
    Start,
    run_identity,
    starting_point,
    state_dict,
)
from jgraph.train.smooth import smooth_trained
from jgraph.train.trace import StepTrace
from jgraph.train.workdir import RunWorkdir

# Steps between reads of the pending steps' metrics (and the stop votes).
FLUSH_STEPS = 10


class RunStopped(Exception):
    """SIGINT or SIGTERM stopped training after a checkpoint was saved."""

    def __init__(self, signum: signal.Signals, step: int, path: str):
        super().__init__(f"{signum.name} stopped training after step {step}; checkpoint "
                         f"saved to {path}. Run the same command again to resume.")
        self.signum = int(signum)


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite; the run stops before saving it."""


def train_and_evaluate(config: Experiment, workdir: str, progress: Progress | None = None,
                       resume: Resume = Resume.AUTO,
                       on_step: Callable[[int], None] | None = None) -> dict:
    """Train `config` (continuing from WORKDIR's newest checkpoint, per `resume`), write
    metrics.jsonl, steps.jsonl, result.json and curves.png to `workdir`, and return the
    result. on_step(step): called after each training step is dispatched.

    Raises `RunStopped` when SIGINT/SIGTERM stopped it (after saving a checkpoint)."""
    progress = progress or Progress()
    c = config.checkpoint
    # The first process holds the workdir for the whole job (the others share it), and
    # removes what a run that fails before training wrote there (`RunWorkdir`).
    # Leaving `Checkpoints` first, on an error too, finishes the save in flight and
    # stops orbax's threads (left running, they print a traceback at exit).
    with RunWorkdir(workdir, enabled=jax.process_index() == 0) as held, \
            Checkpoints(workdir, c.keep, c.asynchronous, say=progress.note) as ckpts:
        return _train_and_evaluate(config, workdir, progress, resume, on_step, ckpts, held)


def _train_and_evaluate(config: Experiment, workdir: str, progress: Progress,
                        resume: Resume, on_step: Callable[[int], None] | None,
                        ckpts: Checkpoints, held: RunWorkdir) -> dict:
    start = time.perf_counter()
    mesh = run_mesh(config)
    if resume is Resume.FRESH:
        ckpts.clear()
    if resume is Resume.REQUIRE and not ckpts.steps():
        raise CheckpointError(f"{workdir}: no checkpoint to resume from (no "
                              f"{os.path.relpath(ckpts.directory, workdir)}/<step>/); "
                              f"run without --resume to start")
    dg = open_graph(config, mesh, workdir, progress, reuse=bool(ckpts.steps()))
    run = build_run(config, dg)
    job = run.job
    if not run.kind.learns:
        progress.note(f"{config.name}: {dg.meta.num_nodes:,} nodes on {mesh.size} "
                      f"device(s), {run.kind.describe(run)}")
        _write_config(config, workdir)
        held.training()
        return _without_training(run, workdir, progress, start)
    progress.note(f"{config.name}: {dg.meta.num_nodes:,} nodes on {mesh.size} device(s), "
                  f"{run.kind.describe(run)}, {job.loader.steps_per_epoch} steps per epoch")
    identity = run_identity(config, dg)
    begin = starting_point(run, mesh, ckpts, resume, identity, workdir, progress)
    _write_config(config, workdir)
    # The capacities the checkpoint's run had grown to, else measured.
    meta = begin.restored.meta if begin.restored is not None else {}
    job = run.kind.sized(run, job, meta, begin.state.embeddings, progress)
    loop = Loop(config, run, workdir, ckpts, identity, progress, on_step, begin, job, start)
    held.training()
    try:
        loop.train_epochs()
        ckpts.close()
        return loop.report(time.perf_counter() - start)
    finally:
        loop.events.close()             # what a stopped run logged stays readable


def _write_config(config: Experiment, workdir: str) -> None:
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "config.yaml"), "w") as f:
            # Its data.path absolute: loading this file resolves paths against its folder.
            yaml.safe_dump(to_dict(config.relative_to(os.getcwd())), f, sort_keys=False)


def _without_training(run: Run, workdir: str, progress: Progress, start: float) -> dict:
    """The run of a kind that learns nothing (label propagation): its splits scored at
    once, logged as one epoch of no steps, and its result written (with Correct &
    Smooth's where smooth.after_training asks)."""
    kind, config = run.kind, run.config
    with progress.phase(f"{kind.title}: scoring the splits"):
        begin = time.perf_counter()
        final = evaluate_splits(run, None, None, ("train", "val", "test"),
                                config.train.inference, progress=progress)
        seconds = time.perf_counter() - begin
    row = {"epoch": 0, "step": 0,
           "loss": final["train"]["loss"] if final["train"] else None,
           kind.train_key: final["train"]["acc"] if final["train"] else None,
           kind.validation_key: None, "epoch_seconds": seconds}
    if final["val"] is not None:
        row.update(kind.epoch_scores(final["val"])[0])
    writer = jax.process_index() == 0
    JsonLog(os.path.join(workdir, "metrics.jsonl"), writer).write(row)
    progress.note(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in row.items()))
    result = {**kind.final_scores(final, config), **kind.baselines(run),
              "best_epoch": None, "final_loss": row["loss"], "steps": 0,
              **after_training(run, None, None, workdir, progress),
              "seconds": time.perf_counter() - start, "devices": run.dg.mesh.size,
              "graph": run.dg.meta.graph_name, "config": to_dict(config)}
    if writer:
        write_json(os.path.join(workdir, "result.json"), result)
    return result


def after_training(run: Run, params, embeddings, workdir: str, progress: Progress) -> dict:
    """The result's fields of what runs after training: Correct & Smooth where
    smooth.after_training asks (its val and test accuracy, also written to
    WORKDIR/correct_and_smooth.json), else none."""
    if not run.config.smooth.after_training:
        return {}
    smoothed = smooth_trained(run, params, embeddings, workdir, run.config.smooth, progress)
    return {"smoothed_val_acc": smoothed["val_acc"], "smoothed_test_acc": smoothed["test_acc"]}


@dataclasses.dataclass
class LoopState:
    """What changes while the epochs run.

    Fields:
      job: the run's `Job` (its sampler's and exchange's capacities grow
        when a batch needs more); train: its compiled step; compile_seconds: all
        compilations of it.
      state: the `TrainState`; best: the best epoch so far (`Best`).
      epoch, index: the loader's position (the next batch); step: steps applied.
      sums: the epoch's running totals (`EpochSums`); tick: when they last took time.
      pending: (step, epoch, batch, metrics) dispatched but not yet read on the host.
      saved: the step of the newest checkpoint (None: none yet).
      regrown: each capacity growth {step, needed, capacities, exchange_capacities}.
      wider: an exchange that the applied steps read since the last growth asked
        more rounds of (None: none did); the next flush point grows to it.
    """

    job: Job
    train: Any
    compile_seconds: float
    state: TrainState
    best: Best
    epoch: int
    index: int
    step: int
    sums: EpochSums
    tick: float = 0.0
    pending: list = dataclasses.field(default_factory=list)
    saved: int | None = None
    regrown: list = dataclasses.field(default_factory=list)
    wider: Any = None


class Loop:
    """The epochs of one run. Steps are dispatched without waiting for each other; the
    host reads their metrics (and the stop votes) at flush points: every FLUSH_STEPS
    batches, before a save and at an epoch's end, all of them determined by the step
    count, so every process flushes, and stops, after the same steps."""

    def __init__(self, config: Experiment, run: Run, workdir: str, ckpts: Checkpoints,
                 identity: dict, progress: Progress, on_step: Callable[[int], None] | None,
                 begin: Start, job: Job, started: float):
        self.config, self.run, self.workdir, self.ckpts = config, run, workdir, ckpts
        self.identity, self.progress, self.on_step = identity, progress, on_step
        self.dg, self.mesh = run.dg, run.dg.mesh
        self.restored = begin.restored
        self.traces = {"train_step": 0, "eval_step": 0}
        self.data = job.data(self.dg.graph)
        self.kind = run.kind
        self.val_eval = self.kind.validation(run, self.counter("eval_step"), progress)
        if self.val_eval is None and config.train.patience is not None:
            raise ConfigError(f"train.patience={config.train.patience}: early stopping "
                              f"watches the validation score, and {config.data.path} has "
                              f"no validation split; leave train.patience out")
        writer = jax.process_index() == 0
        self.log = JsonLog(os.path.join(workdir, "metrics.jsonl"), writer, begin.rows)
        steps_file = os.path.join(workdir, "steps.jsonl")
        self.step_log = JsonLog(steps_file, writer,
                                [r for r in read_json_lines(steps_file)
                                 if r["step"] <= begin.step] if begin.restored else [])
        # Step k's events are logged at k; a resumed run drops those a stopped one
        # logged after its checkpoint's step, as steps.jsonl does.
        self.events = EventLog(workdir, writer,
                               purge_step=begin.step + 1 if begin.restored else None)
        self.s = LoopState(job, None, 0.0, begin.state, begin.best, begin.position.epoch,
                           begin.position.step, begin.step, begin.sums,
                           saved=None if begin.restored is None else begin.restored.step)
        self.s.train, self.s.compile_seconds = self.compile(job)
        # From the run's start (`started`, perf_counter) to its first step.
        self.setup_seconds = time.perf_counter() - started

    def counter(self, name: str) -> Callable[[], None]:
        def bump():
            self.traces[name] += 1
        return bump

    def compile(self, job: Job):
        """(compiled step, seconds), before the first step, so that users see it and
        epoch 0's seconds are the steps' own."""
        s = self.s
        with self.progress.phase(f"compiling the training step for {self.mesh.size} "
                                 f"device(s)"):
            begin = time.perf_counter()
            train = job.compile_train(self.dg.graph, on_trace=self.counter("train_step")).lower(
                s.state, self.data, job.loader.epoch_order(s.epoch), jnp.int32(s.index),
                job.stop_votes()).compile()
            return train, time.perf_counter() - begin

    # -- flush points -------------------------------------------------------------------

    def flush(self, keep_last: bool = False):
        """Bring the pending steps' metrics to the host: check, log and sum them (and
        the seconds since the last flush, which the epoch's steps took). keep_last:
        leave the newest step running (the device stays busy while the host reads).

        Returns (refused, vote): the first step the device refused (its sample
        overflowed the capacities; None if none), with its metrics, and the largest
        stop vote read."""
        s = self.s
        if keep_last and len(s.pending) < 2:
            return None, 0
        now_pending = s.pending[:-1] if keep_last else list(s.pending)
        del s.pending[:len(now_pending)]
        vote = 0
        for step, e, i, m in jax.device_get(now_pending):
            vote = max(vote, int(m["stop"]))
            if not bool(m["applied"]):
                s.pending.clear()         # it and every later step are run again
                return (step, e, i, m), vote
            check_stats(m["stats"])
            # Gathers that needed more than their capacity took further rounds (the
            # step is right, only slower): the capacities grow at this flush.
            exchange = s.wider or s.job.exchange
            wider = exchange.grown(m["stats"])
            if wider is not exchange:
                s.wider = wider
            s.sums.add(m)
            self.step_log.write({"step": step, "epoch": e, "batch": i,
                                 "loss": float(m["loss"]), "count": int(m["count"]),
                                 "correct": int(m["correct"])})
            self.events.step(step, float(m["loss"]), m["stats"])
            if not math.isfinite(float(m["loss"])):
                # Checked at every flush, and so before every save.
                raise TrainingDiverged(
                    f"the training loss became {float(m['loss'])} at step {step} (epoch "
                    f"{e}); the run stops, keeping the checkpoints saved before it. Lower "
                    f"train.lr (now {self.config.train.lr:g}) or check the inputs")
        now = time.perf_counter()
        s.sums.seconds += now - s.tick
        s.tick = now
        return None, vote

    def settle(self, keep_last: bool = False) -> int:
        """flush(); if the device refused a step, grow the capacities, recompile, and
        rewind to it (`step`, `index`), with the state it left untouched; if applied
        steps needed more exchange rounds than one, grow the exchange and recompile.
        Returns the largest stop vote read."""
        s = self.s
        refused, vote = self.flush(keep_last)
        if refused is None:
            if s.wider is not None:
                self.regrow(s.step + 1, dataclasses.replace(s.job, exchange=s.wider), None)
            return vote
        step, _, i, m = refused
        self.regrow(step, self.grown(m["stats"]), m["stats"])
        s.state = dataclasses.replace(s.state, halted=jax.device_put(
            jnp.zeros((), jnp.int32), s.state.halted.sharding))
        s.step, s.index = step - 1, i
        return vote

    def grown(self, stats) -> Job:
        """The job with larger capacities wherever the refused step's `stats` needed
        more: the sampler's hops (its sample overflowed) and the exchange's lengths
        (a scatter_add overflowed). Raises what `check_stats` raises when nothing can
        grow (a capacity held by exchange.max_capacity)."""
        s, sample = self.s, stats[0]
        job = s.job
        if int(sample.overflow):
            job = dataclasses.replace(job, sampler=grow(
                job.sampler, self.dg.graph, job.seeds_per_step, sample.needed,
                sample.capacity, self.config.train.capacity_headroom))
        job = dataclasses.replace(job, exchange=(s.wider or job.exchange).grown(stats))
        if (job.sampler == s.job.sampler
                and job.exchange.capacities == s.job.exchange.capacities):
            check_stats(stats)
            raise RuntimeError(f"a training step was refused, but no capacity can grow: "
                               f"{stats}")
        return job

    def regrow(self, step: int, job: Job, stats) -> None:
        """Recompile the step for `job`'s capacities (from step `step` on) and say so."""
        s = self.s
        said = []
        if job.sampler.capacities != s.job.sampler.capacities:
            said.append(f"its sample needed {[int(x) for x in stats[0].needed]} rows per "
                        f"hop, more than the capacities "
                        f"{list(s.job.sampler.capacities or ())}; sampling with "
                        f"{list(job.sampler.capacities)}")
        if job.exchange.capacities != s.job.exchange.capacities:
            said.append(f"the exchange needed more than its capacities; now "
                        f"{sizing.dump(job.exchange.capacities)} by route and request "
                        f"length")
        self.progress.note(f"step {step}: " + "; ".join(said) + (
            "; running it again" if stats is not None else " from here on"))
        s.regrown.append({
            "step": step, "needed": [int(x) for x in (stats[0].needed if stats is not None
                                                      else ())],
            "capacities": list(job.sampler.capacities or ()),
            "exchange_capacities": sizing.dump(job.exchange.capacities)})
        s.job, s.wider = job, None
        s.train, seconds = self.compile(s.job)
        s.compile_seconds += seconds
        s.tick = time.perf_counter()          # the epoch's seconds are its steps' own

    def save(self, position: LoaderState, wait: bool = False) -> None:
        s = self.s
        if s.step == s.saved:
            # Stopped after an epoch's last batch and resumed there: the epoch's end
            # runs again, at a step whose checkpoint already exists (and holds it).
            return
        s.saved = s.step
        best_state = s.best.state or (s.state.params, s.state.embeddings)
        self.ckpts.save(
            s.step, state_dict(s.state),
            {"params": best_state[0], "embeddings": best_state[1]},
            {"step": s.step, "position": list(position), "sums": dataclasses.asdict(s.sums),
             "rows": self.log.rows,
             "best": {"score": s.best.score, "epoch": s.best.epoch},
             "rng": {"seed": self.config.train.seed, "step": s.step},
             "capacities": list(s.job.sampler.capacities or ()),
             "exchange_capacities": sizing.dump(s.job.exchange.capacities), **self.identity},
            wait=wait)

    def due(self, step: int) -> bool:
        every = self.config.checkpoint.every_steps
        return every > 0 and step % every == 0

    # -- the epochs ---------------------------------------------------------------------

    def train_epochs(self) -> None:
        """Train to `train.epochs`; raises `RunStopped` after saving when a stop vote
        (SIGINT/SIGTERM on any process) is read."""
        t, s = self.config.train, self.s
        stop = StopRequest()
        trace = StepTrace(t.profile and os.path.join(self.workdir, t.profile),
                          t.profile_steps)
        start_step = s.step
        with stop, contextlib.closing(trace):
            while s.epoch < t.epochs and not self.patience_spent():
                stopping = self.epoch(stop, trace, start_step)
                if stopping is not None:
                    self.save(LoaderState(s.epoch, s.index), wait=True)
                    self.ckpts.close()
                    host_sync("jgraph stopped")
                    raise RunStopped(stopping, s.step, f"{self.ckpts.directory}/{s.step}")
                self.end_epoch()

    def patience_spent(self) -> bool:
        """train.patience epochs in a row have not bettered the best validation score
        (read at an epoch's start, so a resumed run stops where it stopped)."""
        patience, best = self.config.train.patience, self.s.best
        return (patience is not None and best.epoch is not None
                and self.s.epoch - 1 - best.epoch >= patience)

    def epoch(self, stop: StopRequest, trace: StepTrace, start_step: int
              ) -> signal.Signals | None:
        """The rest of the current epoch's batches; the signal that stopped it, if any."""
        s = self.s
        steps = s.job.loader.steps_per_epoch
        order = s.job.loader.epoch_order(s.epoch)
        s.tick = time.perf_counter()
        bar = self.progress.iterate(None, f"epoch {s.epoch}", total=steps, initial=s.index)
        try:
            while s.index < steps:
                s.state, metrics = s.train(s.state, self.data, order, jnp.int32(s.index),
                                           s.job.stop_votes(stop.requested or 0))
                s.step += 1
                s.index += 1
                trace.after(s.step - start_step, (s.state, metrics))
                s.pending.append((s.step, s.epoch, s.index - 1, metrics))
                if self.on_step is not None:
                    self.on_step(s.step)
                save_now = self.due(s.step) and s.index < steps
                if save_now or s.index == steps or s.index % FLUSH_STEPS == 0:
                    vote = self.settle(keep_last=not (save_now or s.index == steps))
                    if vote:
                        # Every process read the same votes: all stop here.
                        self.settle()
                        return signal.Signals(vote)
                    if save_now and not s.pending:
                        self.save(LoaderState(s.epoch, s.index))
                    if self.step_log.rows:
                        bar.set_postfix(loss=f"{self.step_log.rows[-1]['loss']:.4f}")
                bar.n = s.index
                bar.refresh()
            return None
        finally:
            bar.close()

    def end_epoch(self) -> None:
        """Log the epoch (with its sampled validation), keep the best, checkpoint."""
        s, t = self.s, self.config.train
        count = max(s.sums.count, 1)
        row = {"epoch": s.epoch, "step": s.step, "loss": s.sums.loss / count,
               **self.kind.epoch_fields(s.sums.correct, s.sums.count),
               self.kind.validation_key: None,
               "epoch_seconds": s.sums.seconds,
               self.kind.rate: s.sums.count / max(s.sums.seconds, 1e-9),
               "compile_seconds": s.compile_seconds}
        s.state, renewed = self.kind.end_epoch(self.run, s.job, s.state, s.epoch)
        row.update(renewed)
        if self.val_eval is not None:
            scores = self.val_eval(s.state.params, s.state.embeddings)
            fields, score = self.kind.epoch_scores(scores)
            row.update(fields)
            if score > s.best.score:
                s.best = Best(score, s.epoch,
                              jax.tree.map(jnp.copy, (s.state.params, s.state.embeddings)),
                              scores)
        self.log.write(row)
        self.events.epoch(row, {"train/lr": t.lr, "train/embedding_lr": t.embedding_lr,
                                **{f"compiles/{k}": v for k, v in self.traces.items()}})
        self.progress.note(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                    for k, v in row.items()))
        s.epoch, s.index, s.sums = s.epoch + 1, 0, EpochSums()
        if (self.config.checkpoint.every_steps == 0 or self.due(s.step)
                or s.epoch == t.epochs or self.patience_spent()):
            self.save(LoaderState(s.epoch, 0))
        if self.patience_spent():
            self.progress.note(f"stopping early: {t.patience} epoch(s) without a better "
                               f"{self.kind.validation_key} than epoch {s.best.epoch}'s")

    # -- the report ---------------------------------------------------------------------

    def report(self, seconds: float) -> dict:
        """Score the best epoch by validation accuracy (the last without a val split) on
        val and test, sampled or full-graph; write result.json, curves.png and the
        model; return the result."""
        s, t, config, dg = self.s, self.config.train, self.config, self.dg
        best = s.best
        if best.state is None:
            best = Best(best.score, s.epoch - 1, (s.state.params, s.state.embeddings))
        params, embeddings = best.state
        # The best epoch's validation scores are the final ones where the final
        # evaluation would run the same program on these parameters again (the
        # evaluation fanouts draw alike on every call).
        known = ({} if best.scores is None else
                 self.kind.validated_splits(best.scores, self.val_eval, t.inference))
        with self.progress.phase(f"evaluating ({t.inference.value})"):
            # The per-epoch validation's evaluator is reused where it evaluates as
            # asked (a full-batch run's is full-graph).
            final = {**known, **evaluate_splits(
                self.run, params, embeddings, [s for s in ("val", "test") if s not in known],
                t.inference, {"val": self.val_eval}, self.counter("eval_step"),
                self.progress)}
        rows = self.log.rows
        val_eval = self.val_eval
        rate = self.kind.rate
        result = {
            **self.kind.final_scores(final, config),
            **self.kind.baselines(self.run),
            **self.kind.reach(self.run, embeddings),
            "best_epoch": best.epoch, "final_loss": rows[-1]["loss"] if rows else None,
            "epochs_trained": s.epoch,
            "compiles": self.traces["train_step"], "compiles_by_step": dict(self.traces),
            "capacities": list(s.job.sampler.capacities or ()),
            "exchange_capacities": sizing.dump(s.job.exchange.capacities),
            "capacity_growths": s.regrown,
            "compile_seconds": s.compile_seconds,
            "setup_seconds": self.setup_seconds,
            "eval_compile_seconds": val_eval.compile_seconds if val_eval is not None else None,
            "seconds": seconds,
            rate: float(np.median([r[rate] for r in rows])) if rows else None,
            "devices": self.mesh.size, "graph": dg.meta.graph_name,
            "inference": t.inference.value, "steps": s.step,
            "resumed_from_step": None if self.restored is None else self.restored.step,
            "checkpoints": dict(self.ckpts.timings),
            "config": to_dict(config),
        }
        save_model(self.workdir, params, embeddings)
        result.update(after_training(self.run, params, embeddings, self.workdir,
                                     self.progress))
        if jax.process_index() == 0:
            write_json(os.path.join(self.workdir, "result.json"), result)
            if rows and not plot_curves(rows, os.path.join(self.workdir, "curves.png"),
                                        f"{config.name}: {dg.meta.graph_name} on "
                                        f"{self.mesh.size} device(s)",
                                        (self.kind.train_key, self.kind.validation_key)):
                self.progress.note(f"curves.png not written: matplotlib is not installed "
                                   f"(pip install \"jgraph[plots]\"); the event files show "
                                   f"the curves: tensorboard --logdir {self.workdir}")
        return result
