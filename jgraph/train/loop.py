"""`train_and_evaluate(config, workdir)`: the whole run behind `jgraph train`.

Sections: Mesh and data / Model and step / Resume / Loop / Report. The host only loads,
logs, evaluates and checkpoints; every training step is one compiled SPMD program
(`NodeClassification.train_step`) and the run counts how many times it was compiled.

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

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jgraph.config import to_dict
from jgraph.mesh import host_sync
from jgraph.progress import Progress
from jgraph.sampling.capacity import grow
from jgraph.sampling.loader import LoaderState
from jgraph.train.checkpoint import CheckpointError, Checkpoints, StopRequest
from jgraph.train.evaluate import SampledEvaluator, evaluate_splits, save_model
from jgraph.train.experiment import Experiment
from jgraph.train.report import JsonLog, plot_curves, read_json_lines, write_json
from jgraph.train.resume import Best, EpochSums, Resume, run_identity, starting_point, state_dict
from jgraph.train.run import build_run, calibrated_job, check_stats, open_graph, run_mesh
from jgraph.train.trace import StepTrace
from jgraph.train.workdir import WorkdirLock, prepare

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
    config.check()
    prepare(workdir)
    c = config.checkpoint
    # The first process holds the workdir for the whole job (the others share it).
    # Leaving `Checkpoints`, on an error too, finishes the save in flight and stops
    # orbax's threads (left running, they print a traceback at exit).
    with WorkdirLock(workdir, enabled=jax.process_index() == 0), \
            Checkpoints(workdir, c.keep, c.asynchronous, say=progress.note) as ckpts:
        return _train_and_evaluate(config, workdir, progress, resume, on_step, ckpts)


def _train_and_evaluate(config: Experiment, workdir: str, progress: Progress,
                        resume: Resume, on_step: Callable[[int], None] | None,
                        ckpts: Checkpoints) -> dict:
    start = time.perf_counter()
    writer = jax.process_index() == 0
    t, c = config.train, config.checkpoint

    # -- Mesh and data ------------------------------------------------------------------
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

    # -- Model and step -----------------------------------------------------------------
    traces = {"train_step": 0, "eval_step": 0}

    def counter(name):
        def bump():
            traces[name] += 1
        return bump

    data = job.data(dg.graph)
    val_eval = (SampledEvaluator(run, "val", counter("eval_step"), progress)
                if run.has_split("val") else None)
    progress.note(f"{config.name}: {dg.meta.num_nodes:,} nodes on {mesh.size} device(s), "
                  f"{job.loader.num_seeds:,} training seeds, {job.loader.steps_per_epoch} "
                  f"steps per epoch, {run.num_classes} classes")

    # -- Resume -------------------------------------------------------------------------
    identity = run_identity(config, dg)
    begin = starting_point(run, mesh, ckpts, resume, identity, workdir, progress)
    restored, state, best = begin.restored, begin.state, begin.best
    position, sums, rows, step = begin.position, begin.sums, begin.rows, begin.step
    meta = restored.meta if restored is not None else {}
    if writer:
        with open(os.path.join(workdir, "config.yaml"), "w") as f:
            yaml.safe_dump(to_dict(config), f, sort_keys=False)
    # The sampler's capacities: those the checkpoint's run had grown to (so a resumed
    # run computes with the same shapes), else measured from the graph.
    if restored is not None and meta.get("capacities"):
        job = dataclasses.replace(job, sampler=dataclasses.replace(
            job.sampler, capacities=tuple(meta["capacities"])))
    elif t.calibrate_capacities:
        job = calibrated_job(run, progress)

    def compile_train(job):
        # Compiled before the first step, so that users see it and epoch 0's seconds
        # are the steps' own.
        with progress.phase(f"compiling the training step for {mesh.size} device(s)"):
            begin = time.perf_counter()
            train = job.compile_train(dg.graph, on_trace=counter("train_step")).lower(
                state, data, job.loader.epoch_order(position.epoch), jnp.int32(position.step),
                job.stop_votes()).compile()
            return train, time.perf_counter() - begin
    train, compile_seconds = compile_train(job)
    regrown = []                  # each capacity growth: step, needed, old, new
    log = JsonLog(os.path.join(workdir, "metrics.jsonl"), writer, rows)
    step_log = JsonLog(os.path.join(workdir, "steps.jsonl"), writer,
                       [r for r in read_json_lines(os.path.join(workdir, "steps.jsonl"))
                        if r["step"] <= step] if restored is not None else [])

    # -- Loop ---------------------------------------------------------------------------
    # Steps are dispatched without waiting for each other; the host reads their metrics
    # (and the stop votes) at flush points: every FLUSH_STEPS batches, before a save
    # and at an epoch's end, all of them determined by the step count, so every process
    # flushes, and stops, after the same steps.
    steps = job.loader.steps_per_epoch
    pending: list = []            # (step, epoch, batch, metrics) not yet on the host
    tick = time.perf_counter()

    def flush(keep_last: bool = False):
        """Bring the pending steps' metrics to the host: check, log and sum them (and
        the seconds since the last flush, which the epoch's steps took). keep_last:
        leave the newest step running (the device stays busy while the host reads).

        Returns (refused, vote): the first step the device refused (its sample
        overflowed the capacities; None if none), with its metrics, and the largest
        stop vote read."""
        nonlocal tick
        if keep_last and len(pending) < 2:
            return None, 0
        now_pending = pending[:-1] if keep_last else list(pending)
        del pending[:len(now_pending)]
        vote = 0
        for s, e, i, m in jax.device_get(now_pending):
            vote = max(vote, int(m["stop"]))
            if not bool(m["applied"]):
                pending.clear()         # it and every later step are run again
                return (s, e, i, m), vote
            check_stats(m["stats"])
            sums.add(m)
            step_log.write({"step": s, "epoch": e, "batch": i, "loss": float(m["loss"]),
                            "count": int(m["count"]), "correct": int(m["correct"])})
            if not math.isfinite(float(m["loss"])):
                # Checked at every flush, and so before every save.
                raise TrainingDiverged(
                    f"the training loss became {float(m['loss'])} at step {s} (epoch {e}); "
                    f"the run stops, keeping the checkpoints saved before it. Lower "
                    f"train.lr (now {t.lr:g}) or check the inputs")
        now = time.perf_counter()
        sums.seconds += now - tick
        tick = now
        return None, vote

    saved = None if restored is None else restored.step

    def save(position: LoaderState, wait: bool = False):
        nonlocal saved
        if step == saved:
            # Stopped after an epoch's last batch and resumed there: the epoch's end
            # runs again, at a step whose checkpoint already exists (and holds it).
            return
        saved = step
        best_state = best.state or (state.params, state.embeddings)
        ckpts.save(step, state_dict(state),
                   {"params": best_state[0], "embeddings": best_state[1]},
                   {"step": step, "position": list(position),
                    "sums": dataclasses.asdict(sums), "rows": log.rows,
                    "best": {"val_acc": best.val_acc, "epoch": best.epoch},
                    "rng": {"seed": t.seed, "step": step},
                    "capacities": list(job.sampler.capacities or ()), **identity},
                   wait=wait)

    def due(s: int) -> bool:
        return c.every_steps > 0 and s % c.every_steps == 0

    def settle(keep_last: bool = False) -> int:
        """flush(); if the device refused a step, grow the capacities, recompile, and
        rewind to it (`step`, `index`), with the state it left untouched. Returns the
        largest stop vote read."""
        nonlocal job, train, compile_seconds, state, step, index, tick
        refused, vote = flush(keep_last)
        if refused is None:
            return vote
        s, _, i, m = refused
        sample = m["stats"][0]
        needed = [int(x) for x in sample.needed]
        old = job.sampler.capacities
        job = dataclasses.replace(job, sampler=grow(
            job.sampler, dg.graph, job.loader.batch_size, sample.needed, sample.capacity,
            t.capacity_headroom))
        progress.note(f"step {s}: its sample needed {needed} rows per hop, more than the "
                      f"capacities {list(old or ())}; running it again with "
                      f"{list(job.sampler.capacities)}")
        regrown.append({"step": s, "needed": needed,
                        "capacities": list(job.sampler.capacities)})
        state = dataclasses.replace(state, halted=jax.device_put(
            jnp.zeros((), jnp.int32), state.halted.sharding))
        train, seconds = compile_train(job)
        compile_seconds += seconds
        tick = time.perf_counter()          # the epoch's seconds are its steps' own
        step, index = s - 1, i
        return vote

    stop = StopRequest()
    trace = StepTrace(t.profile and os.path.join(workdir, t.profile), t.profile_steps)
    start_step = step
    with stop, contextlib.closing(trace):
        epoch, index = position
        while epoch < t.epochs:
            order = job.loader.epoch_order(epoch)
            tick = time.perf_counter()
            bar = progress.iterate(None, f"epoch {epoch}", total=steps, initial=index)
            stopping: signal.Signals | None = None
            while index < steps:
                state, metrics = train(state, data, order, jnp.int32(index),
                                       job.stop_votes(stop.requested or 0))
                step += 1
                index += 1
                trace.after(step - start_step, (state, metrics))
                pending.append((step, epoch, index - 1, metrics))
                if on_step is not None:
                    on_step(step)
                save_now = due(step) and index < steps
                if save_now or index == steps or index % FLUSH_STEPS == 0:
                    vote = settle(keep_last=not (save_now or index == steps))
                    if vote:
                        # Every process read the same votes: all stop here.
                        settle()
                        stopping = signal.Signals(vote)
                        break
                    if save_now and not pending:
                        save(LoaderState(epoch, index))
                    if step_log.rows:
                        bar.set_postfix(loss=f"{step_log.rows[-1]['loss']:.4f}")
                bar.n = index
                bar.refresh()
            bar.close()
            if stopping is not None:
                save(LoaderState(epoch, index), wait=True)
                ckpts.close()
                host_sync("jgraph stopped")
                raise RunStopped(stopping, step,
                                 f"{ckpts.directory}/{step}")
            count = max(sums.count, 1)
            row = {"epoch": epoch, "step": step, "loss": sums.loss / count,
                   "train_acc": sums.correct / count, "val_acc": None,
                   "epoch_seconds": sums.seconds,
                   "seeds_per_s": sums.count / max(sums.seconds, 1e-9),
                   "compile_seconds": compile_seconds}
            if val_eval is not None:
                val = val_eval(state.params, state.embeddings)
                row.update(val_acc=val["acc"], val_macro_f1=val["macro_f1"],
                           val_loss=val["loss"])
                if val["acc"] > best.val_acc:
                    best = Best(val["acc"], epoch,
                                jax.tree.map(jnp.copy, (state.params, state.embeddings)))
            log.write(row)
            progress.note(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in row.items()))
            epoch, index, sums = epoch + 1, 0, EpochSums()
            if c.every_steps == 0 or due(step) or epoch == t.epochs:
                save(LoaderState(epoch, 0))
    ckpts.close()

    # -- Report -------------------------------------------------------------------------
    # The final evaluation scores the best epoch by validation accuracy (the last
    # without a val split), on val and test, sampled or full-graph.
    if best.state is None:
        best = Best(best.val_acc, t.epochs - 1, (state.params, state.embeddings))
    params, embeddings = best.state
    with progress.phase(f"evaluating ({t.inference.value})"):
        final = evaluate_splits(run, params, embeddings, ("val", "test"), t.inference,
                                {"val": val_eval}, counter("eval_step"), progress)

    def pick(split, key):
        return None if final[split] is None else final[split][key]
    rows = log.rows
    result = {
        "val_acc": pick("val", "acc"), "test_acc": pick("test", "acc"),
        "val_macro_f1": pick("val", "macro_f1"), "test_macro_f1": pick("test", "macro_f1"),
        "best_epoch": best.epoch, "final_loss": rows[-1]["loss"] if rows else None,
        "compiles": traces["train_step"], "compiles_by_step": dict(traces),
        "capacities": list(job.sampler.capacities or ()), "capacity_growths": regrown,
        "compile_seconds": compile_seconds,
        "eval_compile_seconds": val_eval.compile_seconds if val_eval is not None else None,
        "seconds": time.perf_counter() - start,
        "seeds_per_s": float(np.median([r["seeds_per_s"] for r in rows])) if rows else None,
        "devices": mesh.size, "graph": dg.meta.graph_name, "inference": t.inference.value,
        "steps": step, "resumed_from_step": None if restored is None else restored.step,
        "checkpoints": dict(ckpts.timings),
        "config": to_dict(config),
    }
    save_model(workdir, params, embeddings)
    if writer:
        write_json(os.path.join(workdir, "result.json"), result)
        if rows:
            plot_curves(rows, os.path.join(workdir, "curves.png"),
                        f"{config.name}: {dg.meta.graph_name} on {mesh.size} device(s)")
    return result
