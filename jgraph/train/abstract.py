"""A run built from a graph's counts, not its data: `jgraph compile --abstract`.

To plan a job too big for this machine (papers100M on 64 H100s), the training step is
built from shapes alone: `synthetic:nodes=111M,edges=1.6B,feat=128,classes=172` gives
the counts, partitioning is assumed to meet its balance tolerance (the largest
partition holds (1 + tolerance) x the mean of nodes, in-edges and training seeds, as
`jgraph partition` guarantees), and every array is a shape, never generated. The step
is the one `jgraph train` would build for such a partitioning: the same model, sampler,
exchange and loader, so its compiled memory is what each device would need.

Homogeneous graphs with features and fixed fanouts (a -1 fanout needs the graph's
largest in-degree, which counts do not give).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from jgraph.config import ConfigError
from jgraph.data.synthetic import parse_spec
from jgraph.exchange import Exchange
from jgraph.mesh import REPLICATED, ROWS
from jgraph.partition import PartitionBook
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sharded.graph import ShardedGraph, check_int32
from jgraph.sharded.layout import RowLayout
from jgraph.sharded.tensor import DistTensor
from jgraph.target import Target, abstract_like, target_mesh
from jgraph.train.compile import Workload, compile_into
from jgraph.train.experiment import Experiment
from jgraph.train.inputs import NodeInputs
from jgraph.train.run import build_model, dense_optimizer
from jgraph.train.step import NodeClassification, TrainState

# What partitioning guarantees: every balanced count within this of the mean (the
# default --balance-tolerance of `jgraph partition`).
BALANCE_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class Counts:
    """The sizes an abstract run is built from. Partition 0 is the largest (the most
    nodes, in-edges and training seeds the tolerance allows); the rest share what is
    left evenly."""

    nodes: int
    edges: int
    feat: int
    classes: int
    train: int
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
    """The counts `config.data.path` (a synthetic spec) names."""
    path = config.data.path
    if not path.startswith("synthetic:"):
        raise ConfigError(f"jgraph compile --abstract builds shapes from counts: data.path "
                          f"must be synthetic:nodes=...,edges=...,feat=...,classes=..., "
                          f"got {path!r}")
    spec = parse_spec(path)
    if spec.feat < 1:
        raise ConfigError("jgraph compile --abstract needs node features (feat >= 1)")
    edges = spec.edges * (2 if config.data.symmetrize else 1)
    return Counts(spec.nodes, edges, spec.feat, spec.classes,
                  int(round(spec.train * spec.nodes)), parts)


def _struct(mesh, spec, shape, dtype):
    return abstract_like(jax.ShapeDtypeStruct(shape, dtype), spec, mesh)


def abstract_job(config: Experiment, counts: Counts, mesh, platform: str):
    """(job, graph, params): the `NodeClassification` job, the `ShardedGraph` of shape
    structs and the model's parameters of a run on `counts`, placed on `mesh`."""
    t, P = config.train, counts.parts
    if any(f == -1 for f in t.fanouts):
        raise ConfigError("jgraph compile --abstract: train.fanouts has -1 (every "
                          "neighbour), whose width is the graph's largest in-degree; give "
                          "fixed fanouts")
    sizes = counts.split(counts.nodes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    book = PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], axis=1), ("_N",))
    n, e = int(sizes.max()), counts.largest(counts.edges)
    try:
        check_int32(counts.nodes, e, f"data.path {config.data.path!r} on {P} device(s)")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    graph = ShardedGraph(
        indptr=_struct(mesh, ROWS, (P * (n + 1),), jnp.int32),
        indices=_struct(mesh, ROWS, (P * e,), jnp.int32),
        etype=_struct(mesh, ROWS, (P * e,), jnp.int32),
        edge_mask=_struct(mesh, ROWS, (P * e,), jnp.bool_),
        in_degree=_struct(mesh, ROWS, (P * n,), jnp.int32),
        node_mask=_struct(mesh, ROWS, (P * n,), jnp.bool_),
        offsets=_struct(mesh, REPLICATED, (P + 1,), jnp.int32),
        num_nodes=counts.nodes, nodes_per_part=n, edges_per_part=e, num_relations=1,
        max_in_degree=0)
    layout = RowLayout.of(book)
    features = DistTensor(_struct(mesh, ROWS, (P * n, counts.feat), jnp.float32), layout,
                          config.data.feature, mesh)
    labels = DistTensor(_struct(mesh, ROWS, (P * n,), jnp.int32), layout, config.data.label,
                        mesh)
    inputs = NodeInputs({"_N": features}, {}, {"_N": layout})
    train = counts.split(counts.train)
    per_device = max(-(-int(train.max()) // t.batch_size), 1) * t.batch_size
    loader = NodeLoader(_struct(mesh, ROWS, (P * per_device,), jnp.int32), train,
                        t.batch_size, t.drop_last, t.seed, mesh)
    model = build_model(config, inputs, counts.classes, 1)
    graphdef, params = nnx.split(model, nnx.Param)
    job = NodeClassification(graphdef, dense_optimizer(config), NeighborSampler(t.fanouts),
                             loader, Exchange(offsets, config.exchange, platform=platform),
                             inputs, labels, seed=t.seed, compute_dtype=t.precision.dtype)
    return job, graph, params


def abstract_train_args(job: NodeClassification, graph: ShardedGraph, params, mesh):
    """The training step's arguments as shape structs on `mesh` (no embeddings)."""
    state = jax.eval_shape(lambda p: TrainState(p, job.tx.init(p), {},
                                                jnp.zeros((), jnp.int32),
                                                jnp.zeros((), jnp.int32)), params)
    P = mesh.size
    return (abstract_like(state, job.state_specs(), mesh),
            abstract_like(job.data(graph), job.data_specs(graph), mesh),
            job.loader.seeds, _struct(mesh, PartitionSpec(), (), jnp.int32),
            _struct(mesh, ROWS, (P,), jnp.int32))


def compile_abstract(config: Experiment, target: Target, devices: int,
                     progress: Progress | None = None) -> dict:
    """Compile the training step of `config` on `devices` devices of `target` from the
    counts its synthetic data.path names; the report of `compile_step`, plus the counts
    and what each device holds of the graph."""
    progress = progress or Progress(enabled=False)
    counts = counts_of(config, devices)
    mesh = target_mesh(target, devices)
    platform = "gpu" if target.is_gpu else "cpu"
    job, graph, params = abstract_job(config, counts, mesh, platform)
    report = {"ok": False, "target": target.value, "devices": devices, "abstract": True,
              "config": config.name, "graph": config.data.path, "nodes": counts.nodes,
              "edges": counts.edges, "nodes_per_device": graph.nodes_per_part,
              "edges_per_device": graph.edges_per_part,
              "train_seeds_per_device": int(counts.split(counts.train).max()),
              "strategy": job.exchange.config.strategy.value}
    return compile_into(report, target, job.compile_train(graph, mesh=mesh),
                        lambda: abstract_train_args(job, graph, params, mesh), progress,
                        Workload.of(config, job), " from counts")
