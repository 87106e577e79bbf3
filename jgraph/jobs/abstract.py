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

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jgraph.config import ConfigError
from jgraph.data.synthetic import parse_spec
from jgraph.exchange import Exchange
from jgraph.mesh import REPLICATED, ROWS
from jgraph.models.link import LinkPredictor
from jgraph.partition import PartitionBook
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sampling.edges import EdgeLoader, EdgeOrder, NegativeSampler, TypeTable
from jgraph.sharded.embedding import DistEmbedding
from jgraph.sharded.graph import ShardedGraph, check_int32
from jgraph.sharded.layout import RowLayout
from jgraph.sharded.tensor import DistTensor
from jgraph.target import Target, target_mesh
from jgraph.train.compile import Program, Programs, compile_into, struct_on
from jgraph.train.control_variate import CHUNK, ControlVariateClassification
from jgraph.train.experiment import Experiment, HistoryInit, Mode, Sampler, Task
from jgraph.train.full import FullBatchClassification
from jgraph.train.inputs import NodeInputs
from jgraph.train.link import LinkPrediction
from jgraph.train.run import (
    build_model,
    check_one_hot,
    dense_optimizer,
    input_width,
    sparse_optimizer,
)
from jgraph.train.step import NodeClassification

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
    kept, train = 1.0, spec.train * spec.nodes
    if config.task is Task.LINK:
        kept = 1.0 - config.link.val_fraction - config.link.test_fraction
        train = kept * spec.edges
    edges = spec.edges * (2 if config.data.symmetrize else 1) * kept
    return Counts(spec.nodes, int(round(edges)), spec.feat, spec.classes, int(round(train)),
                  int(round(spec.val * spec.nodes)), parts)


def check_fanouts(name: str, fanouts) -> None:
    if -1 in fanouts:
        raise ConfigError(f"jgraph compile --abstract: {name} has -1 (every neighbour), "
                          f"whose width is the graph's largest in-degree; give fixed fanouts")


def _loader(mesh, counts: np.ndarray, batch_size: int, drop_last: bool, seed: int
            ) -> NodeLoader:
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
    offsets = np.concatenate([[0], np.cumsum(sizes)])
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
        out = config.model.hidden if config.task is Task.LINK else counts.classes
        table = DistEmbedding(layout, input_width(config, out, 1), sparse_optimizer(config),
                              name="embedding of '_N'")
        return graph, NodeInputs({}, {"_N": table}, {"_N": layout})
    features = DistTensor(struct_on(mesh, ROWS, (P * n, counts.feat), jnp.float32), layout,
                          config.data.feature, mesh)
    return graph, NodeInputs({"_N": features}, {}, {"_N": layout})


def abstract_programs(config: Experiment, counts: Counts, mesh, platform: str) -> Programs:
    """The `Programs` of a run on `counts` (its job a `NodeClassification`, or a
    `LinkPrediction` for `task: link`), every array a shape struct placed on `mesh`."""
    t = config.train
    full = t.mode is Mode.FULL
    if not full:
        check_fanouts("train.fanouts", t.fanouts)
    graph, inputs = abstract_graph(config, counts, mesh)
    check_one_hot(config, inputs)
    layout = inputs.layouts["_N"]
    train = counts.split(counts.train)
    # Full-batch training: one batch an epoch, every device's training seeds at once.
    seeds = _loader(mesh, train, max(int(train.max()), 1) if full else t.batch_size,
                    t.drop_last and not full, t.seed)
    common = dict(tx=dense_optimizer(config), sampler=NeighborSampler(t.fanouts),
                  exchange=Exchange(layout.offsets, config.exchange, platform=platform,
                                    planned=True),
                  inputs=inputs, seed=t.seed, compute_dtype=t.precision.dtype)
    if config.task is Task.LINK:
        params, job = _link_job(config, inputs, layout.offsets, seeds, common)
        every = _loader(mesh, layout.counts, t.eval_batch_size, False, t.seed)
        return Programs(job, graph, params, job.evaluating(every, t.eval_fanouts), None)
    rows = (mesh.size * graph.nodes_per_part,)
    labels = DistTensor(struct_on(mesh, ROWS, rows, jnp.int32), layout, config.data.label,
                        mesh)
    graphdef, params = nnx.split(build_model(config, inputs, counts.classes, 1), nnx.Param)
    if full:
        job = FullBatchClassification(graphdef, loader=seeds, labels=labels, **common,
                                      remat=t.rematerialize)
    elif t.sampler is Sampler.CONTROL_VARIATE:
        job = _control_variate_job(config, graph, graphdef, params, seeds, labels, common)
    else:
        job = NodeClassification(graphdef, loader=seeds, labels=labels, **common)
    val = _loader(mesh, counts.split(counts.val), t.eval_batch_size, False, t.seed)
    masks = {s: struct_on(mesh, ROWS, rows, jnp.bool_) for s in ("val", "test")}
    return Programs(job, graph, params, job.evaluating(val, t.eval_fanouts), masks)


def _control_variate_job(config: Experiment, graph: ShardedGraph, graphdef, params,
                         seeds: NodeLoader, labels: DistTensor, common: dict
                         ) -> ControlVariateClassification:
    """The control-variate job of a graph of `graph`'s shapes: its P X sums and chunk
    starts as shape structs, every partition's in-edge chunks at their bound (one per
    node plus one per `CHUNK` edges), histories started from zeros (their shapes are
    what the program reads)."""
    t, mesh = config.train, seeds.mesh
    n, e, parts = graph.nodes_per_part, graph.edges_per_part, mesh.size
    model = nnx.merge(graphdef, params)
    width = model.gnn.convs[0].fc_neigh.in_features
    common = {**common, "sampler": NeighborSampler(t.fanouts[:-1])}
    return ControlVariateClassification(
        graphdef, loader=seeds, labels=labels, **common, graph=graph,
        input_sums=struct_on(mesh, ROWS, (parts * n, width), jnp.float32),
        chunk_start=struct_on(mesh, ROWS, (parts * n,), jnp.int32),
        chunk_offsets=np.arange(parts + 1, dtype=np.int64) * (n + e // CHUNK),
        widths=tuple(conv.fc_neigh.in_features for conv in model.gnn.convs[1:]),
        history_init=HistoryInit.ZEROS, history_dtype=t.history_precision.dtype)


def _link_job(config: Experiment, inputs: NodeInputs, offsets: np.ndarray,
              seeds: NodeLoader, common: dict):
    """(params, the `LinkPrediction` job) over positives dealt as `seeds` says, its
    model reading `inputs`, nodes owned as `offsets` says; `common`: the fields it
    shares with `NodeClassification`."""
    link, hidden = config.link, config.model.hidden
    # A node classifier of model.hidden classes has the link predictor's encoder and
    # GNN: both embed nodes model.hidden wide.
    classifier = build_model(config, inputs, hidden, 1)
    model = LinkPredictor(classifier.encoder, classifier.gnn, link.decoder, hidden, 1,
                          rngs=nnx.Rngs(config.train.seed))
    graphdef, params = nnx.split(model, nnx.Param)
    column = lambda: struct_on(seeds.mesh, ROWS, seeds.seeds.shape, jnp.int32)
    # One node type: partition p's first id, and the nodes before each partition.
    starts = offsets.astype(np.int32)
    table = TypeTable(starts[:-1, None], starts[None], np.zeros(1, np.int32))
    return params, LinkPrediction(
        graphdef, loader=EdgeLoader(seeds, EdgeOrder(seeds.seeds, column(), column(),
                                                     column())),
        labels=None, **common, negatives=NegativeSampler(link.negatives,
                                                         link.negative_sampler),
        table=table, loss=link.loss, exclude=link.exclude)


def compile_abstract(config: Experiment, target: Target, devices: int,
                     progress: Progress | None = None,
                     program: Program = Program.TRAIN) -> dict:
    """Compile `program` (the training step by default) of `config` on `devices`
    devices of `target` from the counts its synthetic data.path names; the report of
    `compile_step`, plus the counts and what each device holds of the graph."""
    progress = progress or Progress(enabled=False)
    if program is Program.EVAL:
        check_fanouts("train.eval_fanouts", config.train.eval_fanouts)
    counts = counts_of(config, devices)
    mesh = target_mesh(target, devices)
    platform = "gpu" if target.is_gpu else "cpu"
    programs = abstract_programs(config, counts, mesh, platform)
    report = {"ok": False, "target": target.value, "devices": devices, "abstract": True,
              "config": config.name, "graph": config.data.path, "nodes": counts.nodes,
              "edges": counts.edges, "nodes_per_device": programs.graph.nodes_per_part,
              "edges_per_device": programs.graph.edges_per_part,
              "train_seeds_per_device": int(counts.split(counts.train).max()),
              "strategy": programs.job.exchange.config.strategy.value}
    return compile_into(report, target, programs, program, config, progress,
                        " from counts")
