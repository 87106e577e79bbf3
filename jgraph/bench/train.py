"""`jgraph bench train`: throughput of the whole training step.

Partition GRAPH into one partition per device and train GraphSAGE (3 layers, hidden
256, mean aggregator, fanouts 15,10,5, batch 1024 per device, Adam) on its `train_idx`
with the fused step `jgraph train` uses: sample, fetch features and labels through
the exchange, forward, backward, update. The step is compiled (timed on its own), one
warm-up epoch runs, then `epochs` measured ones (or, with `steps`, one warm-up step
and that many measured steps: a graph whose epoch is long).

Figures: `seeds_per_s` (real training seeds, padding excluded), `step_seconds` (mean
wall time of a step), `compile_seconds` (of which `lower_seconds` traced and lowered
it, the rest is XLA's compile). With `breakdown` (or `profile`), also
`phase_seconds`: seconds per step of each phase (see `jgraph.bench.profile`); with
`profile`, a JAX profiler trace of a few more steps is written there (open it in
Perfetto or TensorBoard).
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.bench.common import partition_on_mesh
from jgraph.bench.config import TrainBench
from jgraph.bench.profile import phase_breakdown
from jgraph.exchange import ExchangeStats
from jgraph.jobs import build_run, kind_of
from jgraph.jobs.run import check_stats
from jgraph.memory import peak_rss_bytes
from jgraph.progress import Progress

PROFILE_STEPS = 5


def is_exchange_stats(x) -> bool:
    return isinstance(x, ExchangeStats)


def bench_train(cfg: TrainBench, progress: Progress) -> dict:
    kind = kind_of(cfg)
    splits, node_data = (("train",), ("feat", "label")) if kind.node_splits else ((), ("feat",))
    with partition_on_mesh(cfg.data, seed=cfg.train.seed, bench="train", progress=progress,
                           splits=splits, node_data=node_data,
                           held_out=kind.preparation(cfg).held_out) as (meta, dg):
        run = build_run(cfg.experiment(dg.parts.root), dg)
        job = kind.sized(run, run.job, {}, progress=progress)
    loader = job.loader
    step = job.compile_train(dg.graph)
    data = job.data(dg.graph)
    state = job.init(run.params)
    steps = loader.steps_per_epoch

    with progress.phase(f"compiling the training step for {dg.mesh.size} device(s)"):
        start = time.perf_counter()
        lowered = step.lower(state, data, loader.epoch_order(0), jnp.int32(0),
                             job.stop_votes())
        lower_s = time.perf_counter() - start
        step = lowered.compile()
        compile_s = time.perf_counter() - start

    def epoch(e, state, indices):
        order = loader.epoch_order(e)
        outs = []
        for i in progress.iterate(indices, f"epoch {e}"):
            state, metrics = step(state, data, order, jnp.int32(i % steps), job.stop_votes())
            outs.append(metrics)
        jax.block_until_ready((state, outs))
        return state, outs

    if cfg.steps:                     # a few steps, not whole epochs
        with progress.phase("warm-up step"):
            state, _ = epoch(0, state, [0])
        with progress.phase(f"{cfg.steps} measured step(s)"):
            start = time.perf_counter()
            state, outs = epoch(1, state, range(cfg.steps))
            seconds = time.perf_counter() - start
    else:
        with progress.phase("warm-up epoch"):
            state, _ = epoch(0, state, range(steps))
        with progress.phase(f"{cfg.train.epochs} measured epoch(s)"):
            start = time.perf_counter()
            outs = []
            for e in range(1, cfg.train.epochs + 1):
                state, got = epoch(e, state, range(steps))
                outs += got
            seconds = time.perf_counter() - start
    outs = jax.device_get(outs)
    # A step whose sample outgrew the capacities is refused (and, in `jgraph train`,
    # run again): count the seeds of the applied steps only.
    applied = [m for m in outs if bool(m["applied"])]
    for m in applied:
        check_stats(m["stats"])
    seeds = sum(int(m["count"]) for m in applied)       # what the loader deals
    exchanges = [[s for s in jax.tree.leaves(m["stats"], is_leaf=is_exchange_stats)
                  if is_exchange_stats(s)] for m in applied]
    extra = {}
    if cfg.train.profile:
        with (progress.phase(f"tracing {min(steps, PROFILE_STEPS)} steps into {cfg.train.profile}"),
              jax.profiler.trace(cfg.train.profile)):
            order = loader.epoch_order(cfg.train.epochs + 1)
            for i in range(min(steps, PROFILE_STEPS)):
                state, m = step(state, data, order, jnp.int32(i), job.stop_votes())
            jax.block_until_ready((state, m))
        # The optimised program, so the trace's kernel names can be read as source lines.
        with open(os.path.join(cfg.train.profile, "train_step.hlo.txt"), "w") as f:
            f.write(step.as_text())
        extra["profile"] = cfg.train.profile
    if cfg.breakdown or cfg.train.profile:
        with progress.phase("timing each phase of the step"):
            phases = phase_breakdown(job, data, state, step, loader.epoch_order(0),
                                     seconds / len(outs))
        extra["phase_seconds"] = phases
    return {
        "bench": "train", "graph": meta.graph_name, "devices": dg.mesh.size,
        "method": meta.method, "task": cfg.task, "mode": cfg.train.mode,
        "model": cfg.model.kind, "layers": cfg.model.num_layers,
        "hidden": cfg.model.hidden, "aggregator": cfg.model.aggregator.value,
        "optimizer": cfg.train.optimizer.value,
        "epochs": 0 if cfg.steps else cfg.train.epochs,
        "steps": len(outs),
        "seconds": seconds, kind.rate: seeds / seconds,
        "step_seconds": seconds / len(outs),
        "compile_seconds": compile_s, "lower_seconds": lower_s,
        # The process's peak memory: the host's copy of the partitions and, on CPU,
        # the simulated devices' buffers.
        "peak_rss_bytes": peak_rss_bytes(),
        "final_loss": float(outs[-1]["loss"]),
        "strategy": job.exchange.config.strategy.value, "precision": cfg.train.precision.value,
        "sampler": cfg.train.sampler,
        **kind.bench_fields(run, job, state),
        "refused_steps": len(outs) - len(applied),
        "cache": cfg.exchange.cache, "cache_by": cfg.exchange.cache_by.value,
        "cache_rows": sum(len(c) for c in job.inputs.caches.values()),
        "wire_bytes_per_step": float(np.mean([sum(float(s.wire_bytes) for s in e)
                                              for e in exchanges])) if exchanges else 0.0,
        "cached_per_step": float(np.mean([sum(int(s.cached) for s in e)
                                          for e in exchanges])) if exchanges else 0.0,
        "backend": jax.default_backend(), **extra,
    }
