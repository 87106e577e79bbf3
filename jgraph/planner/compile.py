"""Build a run's programs for a target without its hardware (`jgraph compile`).

The steps are built exactly as `jgraph train` builds them, from the same config and
graph, then lowered for a mesh of the target's devices (`jgraph.target`): an H100 or
H200 mesh is described, not present, and XLA compiles the GPU program on this machine.
The report says whether it compiles, how long that took, what each device must hold
(arguments, outputs, temporaries) and what the program contains (Pallas kernel calls,
collectives by kind): "will this fit on 8 H100s?" answered before anyone rents them.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import jax.numpy as jnp

from jgraph.cost import Costs, roofline
from jgraph.jobs import build_run, kind_of
from jgraph.jobs.abstract import abstract_graph, check_fanouts, counts_of
from jgraph.jobs.dataset import open_graph
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.programs import Program, Programs
from jgraph.jobs.run import Run
from jgraph.mesh import first_devices, make_mesh
from jgraph.progress import Progress
from jgraph.target import Analysis, Target, target_mesh


def build(fn, args) -> tuple[object, dict]:
    """(compiled, {"trace_seconds", "lower_seconds", "xla_seconds",
    "compile_seconds"}): `fn` (a jitted function) traced, lowered and compiled for
    `args` (shape structs placed on the target mesh)."""
    start = time.perf_counter()
    traced = fn.trace(*args)
    t_trace = time.perf_counter()
    lowered = traced.lower()
    t_lower = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    return compiled, {"compile_seconds": done - start, "trace_seconds": t_trace - start,
                      "lower_seconds": t_lower - t_trace, "xla_seconds": done - t_lower}


def compile_step(run: Run, target: Target, progress: Progress | None = None,
                 program: Program = Program.TRAIN) -> dict:
    """Compile `run`'s `program` (its training step by default) for `target` on as
    many devices as the run's mesh.

    Returns the report: ok, compile_seconds (trace + lower + compile) and its parts,
    and the program's `Analysis` (per-device bytes, Pallas kernels, collectives), with
    whether its peak fits the target's device memory; a program that does not compile
    gives ok False and XLA's error.
    """
    progress = progress or Progress(enabled=False)
    devices = run.dg.mesh.size
    meta = run.dg.meta
    report = {"ok": False, "target": target.value, "devices": devices,
              "config": run.config.name, "graph": meta.graph_name, "nodes": meta.num_nodes,
              "edges": int(sum(p.num_edges for p in meta.parts)),
              "strategy": run.job.exchange.config.strategy.value}
    return compile_into(report, target, run.kind.programs(run), program, run.config, progress)


def compile_into(report: dict, target: Target, programs: Programs, program: Program,
                 config: Experiment, progress: Progress, what: str = "") -> dict:
    """`report` completed by compiling `program` of `programs` for `target`: its name,
    ok, the seconds, the program's `Analysis` and `Costs`, and on a GPU target the
    roofline lower bound of one call's and an epoch's time (`jgraph.cost.roofline`;
    its matmuls in bf16 with train.precision bf16, else as TF32, XLA's default for
    float32 on Hopper GPUs), or ok False and XLA's error (the answer to "does it
    compile?", so reported, not raised)."""
    devices = report["devices"]
    report = {**report, "program": program.value}
    start = time.perf_counter()
    with progress.phase(f"compiling the {program.title} for {devices} {target.value} "
                        f"device(s){what}"):
        try:
            lowering = programs.lowering(program, target_mesh(target, devices))
            compiled, seconds = build(lowering.fn, lowering.args)
        except Exception as err:
            return {**report, "compile_seconds": time.perf_counter() - start,
                    "error": f"{type(err).__name__}: {err}".strip()[:2000]}
    costs = Costs.of(compiled)
    out = {**report, "ok": True, **seconds, **report_of(Analysis.of(compiled), target),
           "flops": costs.flops, "bytes_accessed": costs.bytes_accessed,
           "collective_bytes": costs.collective_bytes}
    if target.peaks is not None:
        bf16 = config.train.precision.dtype == jnp.bfloat16
        out["roofline"] = roofline(costs, target.peaks, devices, "bf16" if bf16 else "tf32",
                                   lowering.calls)
    return out


def report_of(analysis: Analysis, target: Target) -> dict:
    """The report's figures: per-device bytes, and on a GPU target whether the peak fits
    what JAX lets a program use there (`usable_bytes`: the device memory times JAX's
    allocator fraction, 0.75 unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise)."""
    memory = target.memory_bytes
    usable = None if memory is None else int(memory * memory_fraction())
    return dict(
        argument_bytes=analysis.argument_bytes, output_bytes=analysis.output_bytes,
        temp_bytes=analysis.temp_bytes, alias_bytes=analysis.alias_bytes,
        peak_bytes=analysis.peak_bytes, device_memory_bytes=memory, usable_bytes=usable,
        fits=None if usable is None else analysis.peak_bytes <= usable,
        pallas_kernels=analysis.pallas_kernels, collectives=analysis.collectives,
        hlo_bytes=analysis.hlo_bytes)


def memory_fraction() -> float:
    """The share of a GPU's memory JAX's allocator takes (JAX's default: 0.75)."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))


def compile_config(config: Experiment, target: Target, devices: int,
                   progress: Progress | None = None, program: Program = Program.TRAIN
                   ) -> dict:
    """Partition `config`'s graph into `devices` parts on as many (CPU) devices, build
    the run as `jgraph train` would, and compile its `program` for `target`."""
    progress = progress or Progress(enabled=False)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                  num_parts=devices))
    mesh = make_mesh(devices, first_devices(devices))
    with tempfile.TemporaryDirectory(prefix="jgraph-compile-") as workdir:
        dg = open_graph(config, mesh, workdir, progress)
        run = build_run(config, dg, platform="gpu" if target.is_gpu else "cpu")
        return compile_step(run, target, progress, program)


def compile_abstract(config: Experiment, target: Target, devices: int,
                     progress: Progress | None = None,
                     program: Program = Program.TRAIN) -> dict:
    """Compile `program` (the training step by default) of `config` on `devices`
    devices of `target` from the counts its synthetic data.path names; the report of
    `compile_step`, plus the counts and what each device holds of the graph."""
    progress = progress or Progress(enabled=False)
    kind = kind_of(config)
    if kind.samples:
        check_fanouts("train.fanouts", config.train.fanouts)
    if program is Program.EVAL:
        check_fanouts("train.eval_fanouts", config.train.eval_fanouts)
    counts = counts_of(config, devices)
    mesh = target_mesh(target, devices)
    run = kind.build(config, abstract_graph(config, counts, mesh),
                     platform="gpu" if target.is_gpu else "cpu")
    programs = kind.programs(run)
    seeds = counts.positives or counts.splits["train"]
    report = {"ok": False, "target": target.value, "devices": devices, "abstract": True,
              "config": config.name, "graph": config.data.path, "nodes": counts.nodes,
              "edges": counts.edges, "nodes_per_device": programs.graph.nodes_per_part,
              "edges_per_device": programs.graph.edges_per_part,
              "train_seeds_per_device": int(counts.split(seeds).max()),
              "strategy": programs.job.exchange.config.strategy.value}
    return compile_into(report, target, programs, program, config, progress,
                        " from counts")
