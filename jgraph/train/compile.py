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

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jgraph.cost import Costs, roofline
from jgraph.mesh import REPLICATED, ROWS, first_devices, make_mesh
from jgraph.progress import Progress
from jgraph.target import Analysis, Target, abstract_like, target_mesh
from jgraph.train.experiment import Experiment
from jgraph.train.run import Run, build_run, open_graph


def _index(mesh):
    return jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, REPLICATED))


def train_step_args(run: Run, mesh):
    """The training step's arguments as shape structs placed on `mesh`: what
    `compile_train(..., mesh=mesh)` is lowered with."""
    job, graph = run.job, run.dg.graph
    state = jax.eval_shape(job.init, run.params)
    return (abstract_like(state, job.state_specs(), mesh),
            abstract_like(job.data(graph), job.data_specs(graph), mesh),
            abstract_like(jax.eval_shape(job.loader.epoch_order, 0), ROWS, mesh), _index(mesh),
            abstract_like(job.stop_votes(), ROWS, mesh))


def eval_step_args(run: Run, mesh, job=None):
    """The evaluation step's arguments (of `job`, default the run's) on `mesh`."""
    job, graph = job or run.job, run.dg.graph
    state = jax.eval_shape(job.init, run.params)
    return (abstract_like(state.params, REPLICATED, mesh),
            abstract_like(state.embeddings, job.inputs.embedding_specs(), mesh),
            abstract_like(job.data(graph), job.data_specs(graph), mesh),
            abstract_like(jax.eval_shape(job.loader.epoch_order, 0), ROWS, mesh), _index(mesh))


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


def compile_step(run: Run, target: Target, progress: Progress | None = None) -> dict:
    """Compile `run`'s training step for `target` on as many devices as the run's mesh.

    Returns the report: ok, compile_seconds (trace + lower + compile) and its parts,
    and the program's `Analysis` (per-device bytes, Pallas kernels, collectives), with
    whether its peak fits the target's device memory; a program that does not compile
    gives ok False and XLA's error.
    """
    progress = progress or Progress(enabled=False)
    devices = run.dg.mesh.size
    mesh = target_mesh(target, devices)
    meta = run.dg.meta
    report = {"ok": False, "target": target.value, "devices": devices,
              "config": run.config.name, "graph": meta.graph_name, "nodes": meta.num_nodes,
              "edges": int(sum(p.num_edges for p in meta.parts)),
              "strategy": run.job.exchange.config.strategy.value}
    return compile_into(report, target, run.job.compile_train(run.dg.graph, mesh=mesh),
                        lambda: train_step_args(run, mesh), progress,
                        Workload.of(run.config, run.job))


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the roofline of a step needs besides the program: the dtype its matmuls
    run in on the target ("bf16" with train.precision bf16; float32 matmuls run as
    TF32 on Hopper GPUs by XLA's default precision) and the steps of an epoch."""

    compute: str
    steps_per_epoch: int

    @classmethod
    def of(cls, config: Experiment, job) -> Workload:
        bf16 = config.train.precision.dtype == jnp.bfloat16
        return cls("bf16" if bf16 else "tf32", job.loader.steps_per_epoch)


def compile_into(report: dict, target: Target, fn, make_args, progress: Progress,
                 workload: Workload, what: str = "") -> dict:
    """`report` completed by compiling the training step `fn` for `make_args()`: ok, the
    seconds, the program's `Analysis` and `Costs`, and on a GPU target the roofline
    lower bound of the step's and the epoch's time (`jgraph.cost.roofline`), or ok
    False and XLA's error (the answer to "does it compile?", so reported, not raised)."""
    start = time.perf_counter()
    with progress.phase(f"compiling the training step for {report['devices']} "
                        f"{target.value} device(s){what}"):
        try:
            compiled, seconds = build(fn, make_args())
        except Exception as err:
            return {**report, "compile_seconds": time.perf_counter() - start,
                    "error": f"{type(err).__name__}: {err}".strip()[:2000]}
    costs = Costs.of(compiled)
    out = {**report, "ok": True, **seconds, **report_of(Analysis.of(compiled), target),
           "flops": costs.flops, "bytes_accessed": costs.bytes_accessed,
           "collective_bytes": costs.collective_bytes}
    if target.peaks is not None:
        out["roofline"] = roofline(costs, target.peaks, report["devices"], workload.compute,
                                   workload.steps_per_epoch)
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
                   progress: Progress | None = None) -> dict:
    """Partition `config`'s graph into `devices` parts on as many (CPU) devices, build
    the run as `jgraph train` would, and compile its training step for `target`."""
    progress = progress or Progress(enabled=False)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                  num_parts=devices))
    mesh = make_mesh(devices, first_devices(devices))
    with tempfile.TemporaryDirectory(prefix="jgraph-compile-") as workdir:
        dg = open_graph(config, mesh, workdir, progress)
        run = build_run(config, dg, platform="gpu" if target.is_gpu else "cpu")
        return compile_step(run, target, progress)
