"""A run's compiled programs as things to build: which one (`Program`), what it is
built from (`Programs`: a job, its graph, its parameters, its evaluation), and each
ready to lower for a mesh (`Lowering`), the job's own or one of other hardware
described by `jgraph.target` (`jgraph compile`)."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jgraph.config import ConfigError
from jgraph.jobs.propagation import smoothing_program
from jgraph.jobs.step import Job
from jgraph.mesh import REPLICATED, ROWS, struct_on
from jgraph.sharded.graph import ShardedGraph
from jgraph.target import abstract_like


class Program(str, enum.Enum):
    """Which of a run's programs `jgraph compile` builds (`--program`); each for the
    config's task, node classification or link prediction."""

    TRAIN = "train"             # one training step
    EVAL = "eval"               # one batch of sampled evaluation: train.eval_batch_size
                                # seeds of a split, train.eval_fanouts (link prediction:
                                # the embeddings of a batch of nodes, which ranking reads)
    FULL_GRAPH = "full_graph"   # layer-wise full-graph inference (train.inference full):
                                # every owned node, in windows of in-edges
    SMOOTH = "correct_and_smooth"   # Correct & Smooth of node classification's class
                                    # probabilities (the smooth section's steps)

    @property
    def title(self) -> str:
        return {Program.TRAIN: "training step", Program.EVAL: "sampled evaluation step",
                Program.FULL_GRAPH: "full-graph inference",
                Program.SMOOTH: "Correct & Smooth"}[self]


class Lowering(NamedTuple):
    """A program ready to compile: fn (jitted), args (its arguments as shape structs
    placed on the target mesh), calls (how many an epoch makes: training or
    evaluation batches; 1 for full-graph inference, which covers the whole graph)."""

    fn: Any
    args: tuple
    calls: int


@dataclasses.dataclass(frozen=True)
class Programs:
    """What a run's programs are built from: a partitioned graph (`JobKind.programs`)
    or a graph of shapes made from counts (`jgraph.sharded.abstract`).

    job: the training job (`NodeClassification` or `LinkPrediction`); graph: its
    `ShardedGraph` (arrays or shape structs); params: the model's parameters (arrays or
    shape structs); evaluation: the job of sampled evaluation (`job.evaluating`: a
    split's nodes, or every node for link prediction's embeddings); masks: {split:
    bool row-sharded [P * rows]} of the labelled nodes full-graph inference scores
    (None for link prediction, whose full-graph program embeds every node); smooth:
    Correct & Smooth's settings (`SmoothConfig`; None for link prediction, which has no
    classes to correct) and classes, the labels' count."""

    job: Job
    graph: ShardedGraph
    params: Any
    evaluation: Job
    masks: dict | None
    smooth: Any = None
    classes: int = 0

    def lowering(self, program: Program, mesh) -> Lowering:
        """`program` built for `mesh` (the job's, or one of other hardware described by
        `jgraph.target`)."""
        job, graph = self.job, self.graph
        if program is Program.SMOOTH:
            return self._smoothing(mesh)
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
        # Node classification's scores the masks' splits; link prediction's embeds.
        masks = () if self.masks is None else (abstract_like(self.masks, ROWS, mesh),)
        return Lowering(job.full_graph_program(graph, self.masks, mesh), (*model, *masks), 1)


    def _smoothing(self, mesh) -> Lowering:
        """Correct & Smooth for `mesh`: one call corrects and smooths every labelled node
        (the grid of alphas calls it once a point)."""
        if self.smooth is None:
            raise ConfigError(f"--program {Program.SMOOTH.value}: Correct & Smooth corrects "
                              f"node classification's class probabilities; this run has "
                              f"none")
        job, graph, s = self.job, self.graph, self.smooth
        layout = job.labels.layout
        classes = self.classes
        fn = smoothing_program(graph, job.exchange, layout, classes, mesh,
                               correct_steps=s.correct_steps, smooth_steps=s.smooth_steps,
                               autoscale=s.autoscale)
        rows = (layout.num_parts * layout.rows_per_part,)
        args = (abstract_like(graph, graph.specs(), mesh),
                struct_on(mesh, ROWS, (*rows, classes), jnp.float32),
                struct_on(mesh, ROWS, rows, job.labels.array.dtype),
                struct_on(mesh, ROWS, rows, bool),
                struct_on(mesh, REPLICATED, (3,), jnp.float32))
        return Lowering(fn, args, 1)


def _index(mesh):
    return struct_on(mesh, REPLICATED, (), jnp.int32)


def _order(loader, mesh):
    """The shapes of an epoch's order of `loader` (`NodeLoader` or `EdgeLoader`)."""
    return abstract_like(jax.eval_shape(loader.epoch_order, 0), ROWS, mesh)
