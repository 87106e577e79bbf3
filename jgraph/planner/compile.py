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
import enum
import os
import tempfile
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jgraph.cost import Costs, roofline
from jgraph.mesh import REPLICATED, ROWS, first_devices, make_mesh
from jgraph.progress import Progress
from jgraph.sharded.graph import ShardedGraph
from jgraph.target import Analysis, Target, abstract_like, target_mesh
from jgraph.train.evaluate import SampledEvaluator
from jgraph.train.experiment import Experiment, Task
from jgraph.train.inference import full_graph_program, split_masks
from jgraph.train.link import NodeEmbedder, full_graph_embedding_program
from jgraph.train.run import Run, build_run, open_graph
from jgraph.train.step import NodeClassification


class Program(str, enum.Enum):
    """Which of a run's programs `jgraph compile` builds (`--program`); each for the
    config's task, node classification or link prediction."""

    TRAIN = "train"             # one training step
    EVAL = "eval"               # one batch of sampled evaluation: train.eval_batch_size
                                # seeds of a split, train.eval_fanouts (link prediction:
                                # the embeddings of a batch of nodes, which ranking reads)
    FULL_GRAPH = "full_graph"   # layer-wise full-graph inference (train.inference full):
                                # every owned node, in windows of in-edges

    @property
    def title(self) -> str:
        return {Program.TRAIN: "training step", Program.EVAL: "sampled evaluation step",
                Program.FULL_GRAPH: "full-graph inference"}[self]


class Lowering(NamedTuple):
    """A program ready to compile: fn (jitted), args (its arguments as shape structs
    placed on the target mesh), calls (how many an epoch makes: training or
    evaluation batches; 1 for full-graph inference, which covers the whole graph)."""

    fn: Any
    args: tuple
    calls: int


@dataclasses.dataclass(frozen=True)
class Programs:
    """What a run's programs are built from: a partitioned graph (`programs_of`) or a
    graph's counts (`jgraph.train.abstract`).

    job: the training job (`NodeClassification` or `LinkPrediction`); graph: its
    `ShardedGraph` (arrays or shape structs); params: the model's parameters (arrays or
    shape structs); evaluation: the job of sampled evaluation (`job.evaluating`: a
    split's nodes, or every node for link prediction's embeddings); masks: {split:
    bool row-sharded [P * rows]} of the labelled nodes full-graph inference scores
    (None for link prediction, whose full-graph program embeds every node)."""

    job: NodeClassification
    graph: ShardedGraph
    params: Any
    evaluation: NodeClassification
    masks: dict | None

    def lowering(self, program: Program, mesh) -> Lowering:
        """`program` built for `mesh` (the job's, or one of other hardware described by
        `jgraph.target`)."""
        job, graph = self.job, self.graph
        state = jax.eval_shape(job.init, self.params)
        data = abstract_like(job.data(graph), job.data_specs(graph), mesh)
        if program is Program.TRAIN:
            votes = struct_on(mesh, ROWS, (mesh.size,), jnp.int32)     # `stop_votes`
            args = (abstract_like(state, job.state_specs(), mesh), data,
                    _order(job.loader, mesh), _index(mesh), votes)
            return Lowering(job.compile_train(graph, mesh=mesh), args,
                            job.loader.steps_per_epoch)
        # Evaluation reads the parameters and embedding tables, never the optimizer.
        model = (abstract_like(state.params, REPLICATED, mesh),
                 abstract_like(state.embeddings, job.inputs.embedding_specs(), mesh), data)
        if program is Program.EVAL:
            loader = self.evaluation.loader
            return Lowering(self.evaluation.compile_eval(graph, mesh=mesh),
                            (*model, _order(loader, mesh), _index(mesh)),
                            loader.steps_per_epoch)
        if self.masks is None:
            return Lowering(full_graph_embedding_program(job, graph, mesh), model, 1)
        return Lowering(full_graph_program(job, graph, tuple(self.masks), mesh),
                        (*model, abstract_like(self.masks, ROWS, mesh)), 1)


def programs_of(run: Run) -> Programs:
    """The `Programs` of a run built from a partitioned graph: sampled evaluation of
    its validation split (else its test split), full-graph inference of both."""
    if run.config.task is Task.LINK:
        return Programs(run.job, run.dg.graph, run.params, NodeEmbedder(run).job, None)
    splits = [s for s in ("val", "test") if run.has_split(s)] or ["train"]
    return Programs(run.job, run.dg.graph, run.params,
                    SampledEvaluator(run, splits[0]).job, split_masks(run, splits))


def struct_on(mesh, spec, shape, dtype) -> jax.ShapeDtypeStruct:
    """An array's shape and dtype, placed on `mesh` by `spec`."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def _index(mesh):
    return struct_on(mesh, REPLICATED, (), jnp.int32)


def _order(loader, mesh):
    """The shapes of an epoch's order of `loader` (`NodeLoader` or `EdgeLoader`)."""
    return abstract_like(jax.eval_shape(loader.epoch_order, 0), ROWS, mesh)


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
    return compile_into(report, target, programs_of(run), program, run.config, progress)


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
