"""A run built from a graph's counts, not its data: `jgraph compile --abstract`.

To plan a job too big for this machine (papers100M on 64 H100s), a run's programs (its
training step, sampled evaluation step or full-graph inference: `Program`) are built
from shapes alone: `synthetic:nodes=111M,edges=1.6B,feat=128,classes=172` gives the
counts, partitioning is assumed to meet its balance tolerance (the largest partition
holds (1 + tolerance) x the mean of nodes, in-edges and training seeds, as `jgraph
partition` guarantees), and every array is a shape, never generated. Each program is
the one `jgraph train` would build for such a partitioning, for node classification or
link prediction (`task: link`): the same model, sampler, exchange and loaders, so its
compiled memory is what each device would need.

Homogeneous graphs with features and fixed fanouts (a -1 fanout needs the graph's
largest in-degree, which counts do not give).
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jgraph.segments as segments
from jgraph.config import ConfigError
from jgraph.data.synthetic import parse_spec
from jgraph.exchange import Exchange
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.inputs import NodeInputs
from jgraph.jobs.programs import Programs, struct_on
from jgraph.jobs.run import (
    build_model,
    check_one_hot,
    input_width,
    job_fields,
    sparse_optimizer,
)
from jgraph.jobs.table import kind_of
from jgraph.mesh import REPLICATED, ROWS
from jgraph.partition import PartitionBook
from jgraph.sampling import NodeLoader
from jgraph.sharded.embedding import DistEmbedding
from jgraph.sharded.graph import ShardedGraph, check_int32
from jgraph.sharded.layout import RowLayout
from jgraph.sharded.tensor import DistTensor

# What partitioning guarantees: every balanced count within this of the mean (the
# default --balance-tolerance of `jgraph partition`).
BALANCE_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class Counts:
    """The sizes an abstract run is built from: nodes, in-edges (those the model
    samples), feature width, classes, training seeds (link prediction: positive
    edges), validation nodes (what sampled evaluation scores) and partitions.
    Partition 0 is the largest (the most nodes, in-edges and seeds the tolerance
    allows); the rest share what is left evenly."""

    nodes: int
    edges: int
    feat: int
    classes: int
    train: int
    val: int
    parts: int

    def largest(self, total: int) -> int:
        mean = total / self.parts
        return min(total, max(math.ceil(mean * (1 + BALANCE_TOLERANCE)), math.ceil(mean)))

    def split(self, total: int) -> np.ndarray:
        """int64[P]: partition 0 the largest, the others even, summing to total."""
        first = self.largest(total)
        if self.parts == 1:
            return np.array([total], np.int64)
        rest = total - first
        sizes = np.full(self.parts - 1, rest // (self.parts - 1), np.int64)
        sizes[:rest % (self.parts - 1)] += 1
        return np.concatenate([[first], sizes])


def counts_of(config: Experiment, parts: int) -> Counts:
    """The counts `config.data.path` (a synthetic spec) names. For link prediction the
    training positives are the edges (pairs, when the graph is made undirected) not
    held out, and the held-out ones and their reverses leave the sampled graph."""
    path = config.data.path
    if not path.startswith("synthetic:"):
        raise ConfigError(f"jgraph compile --abstract builds shapes from counts: data.path "
                          f"must be synthetic:nodes=...,edges=...,feat=...,classes=..., "
                          f"got {path!r}")
    spec = parse_spec(path)
    if spec.feat < 1:
        raise ConfigError("jgraph compile --abstract needs node features (feat >= 1)")
    kind = kind_of(config)
    held = kind.preparation(config).held_out
    kept = 1.0 if held is None else 1.0 - held.val_fraction - held.test_fraction
    train = spec.train * spec.nodes if kind.node_splits else kept * spec.edges
    edges = spec.edges * (2 if config.data.symmetrize else 1) * kept
    return Counts(spec.nodes, int(round(edges)), spec.feat, spec.classes, int(round(train)),
                  int(round(spec.val * spec.nodes)), parts)


def check_fanouts(name: str, fanouts) -> None:
    if -1 in fanouts:
        raise ConfigError(f"jgraph compile --abstract: {name} has -1 (every neighbour), "
                          f"whose width is the graph's largest in-degree; give fixed fanouts")


def abstract_loader(mesh, counts: np.ndarray, batch_size: int, drop_last: bool,
                    seed: int) -> NodeLoader:
    """A `NodeLoader` of `counts[k]` seeds on device k, the seeds shape structs."""
    per_device = max(-(-int(counts.max()) // batch_size), 1) * batch_size
    return NodeLoader(struct_on(mesh, ROWS, (counts.size * per_device,), jnp.int32), counts,
                      batch_size, drop_last, seed, mesh)


def abstract_graph(config: Experiment, counts: Counts, mesh) -> tuple[ShardedGraph,
                                                                         NodeInputs]:
    """(graph, inputs): the `ShardedGraph` of a partitioning of `counts` and its node
    features (with `model.learnable_inputs`, a learnable embedding table instead, as a
    run builds it), shape structs placed on `mesh`."""
    P = counts.parts
    sizes = counts.split(counts.nodes)
    offsets = segments.offsets(sizes)
    book = PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], axis=1), ("_N",))
    n, e = int(sizes.max()), counts.largest(counts.edges)
    try:
        check_int32(counts.nodes, e, f"data.path {config.data.path!r} on {P} device(s)")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    graph = ShardedGraph(
        indptr=struct_on(mesh, ROWS, (P * (n + 1),), jnp.int32),
        indices=struct_on(mesh, ROWS, (P * e,), jnp.int32),
        etype=struct_on(mesh, ROWS, (P * e,), jnp.int32),
        edge_mask=struct_on(mesh, ROWS, (P * e,), jnp.bool_),
        in_degree=struct_on(mesh, ROWS, (P * n,), jnp.int32),
        node_mask=struct_on(mesh, ROWS, (P * n,), jnp.bool_),
        offsets=struct_on(mesh, REPLICATED, (P + 1,), jnp.int32),
        num_nodes=counts.nodes, nodes_per_part=n, edges_per_part=e, num_relations=1,
        max_in_degree=0)
    layout = RowLayout.of(book)
    if config.model.learnable_inputs:
        # The width a run gives it: one-hot rows sized for the output (the classes, or
        # link prediction's node embedding), else model.embedding_dim.
        out = kind_of(config).output_width(config, counts.classes)
        table = DistEmbedding(layout, input_width(config, out, 1), sparse_optimizer(config),
                              name="embedding of '_N'")
        return graph, NodeInputs({}, {"_N": table}, {"_N": layout})
    features = DistTensor(struct_on(mesh, ROWS, (P * n, counts.feat), jnp.float32), layout,
                          config.data.feature, mesh)
    return graph, NodeInputs({"_N": features}, {}, {"_N": layout})


class AbstractParts(NamedTuple):
    """What every kind's abstract job is built from: the graph and its inputs (shape
    structs), the training seeds' loader, and the job fields the kinds share (`tx`,
    `sampler`, `exchange`, `inputs`, `seed`, `compute_dtype`)."""

    graph: ShardedGraph
    inputs: NodeInputs
    seeds: NodeLoader
    common: dict


def abstract_parts(config: Experiment, counts: Counts, mesh, platform: str,
                   full: bool = False) -> AbstractParts:
    """The `AbstractParts` of a run on `counts`; full: one batch an epoch, every
    device's training seeds at once (full-batch training, which samples nothing)."""
    t = config.train
    if not full:
        check_fanouts("train.fanouts", t.fanouts)
    graph, inputs = abstract_graph(config, counts, mesh)
    check_one_hot(config, inputs)
    layout = inputs.layouts["_N"]
    train = counts.split(counts.train)
    seeds = abstract_loader(mesh, train, max(int(train.max()), 1) if full else t.batch_size,
                            t.drop_last and not full, t.seed)
    exchange = Exchange(layout.offsets, config.exchange, platform=platform, planned=True)
    return AbstractParts(graph, inputs, seeds, job_fields(config, exchange, inputs))


def abstract_node_programs(config: Experiment, counts: Counts, parts: AbstractParts,
                           make_job) -> Programs:
    """The `Programs` of a node classification run on `counts`: the model, the labels,
    the job `make_job(graphdef, params, labels)` makes, sampled evaluation of the
    validation split and full-graph inference of val and test."""
    t, graph, mesh = config.train, parts.graph, parts.seeds.mesh
    layout = parts.inputs.layouts["_N"]
    rows = (mesh.size * graph.nodes_per_part,)
    labels = DistTensor(struct_on(mesh, ROWS, rows, jnp.int32), layout, config.data.label,
                        mesh)
    graphdef, params = nnx.split(build_model(config, parts.inputs, counts.classes, 1),
                                 nnx.Param)
    job = make_job(graphdef, params, labels)
    val = abstract_loader(mesh, counts.split(counts.val), t.eval_batch_size, False, t.seed)
    masks = {s: struct_on(mesh, ROWS, rows, jnp.bool_) for s in ("val", "test")}
    return Programs(job, graph, params, job.evaluating(val, t.eval_fanouts), masks)
