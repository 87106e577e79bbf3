"""What a run is built from (its graph on the mesh: `jgraph.jobs.dataset`): the model,
the optimizers, the parts every kind of job shares (`node_parts`, `seed_loader`,
`with_caches`) and the calibration of its capacities. Each kind builds its `Run` from these
(`jgraph.jobs.table.build_run`). Shared by training, evaluation and benchmarks."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jgraph.config import ConfigError
from jgraph.exchange import CacheBy, ExchangeStats, Sizing, sizing
from jgraph.jobs.dataset import check_mesh_fits
from jgraph.jobs.experiment import (
    DataConfig,
    Experiment,
    Optimizer,
    SparseOptimizerKind,
)
from jgraph.jobs.inputs import NodeInputs
from jgraph.jobs.step import Job
from jgraph.mesh import REPLICATED, ROWS
from jgraph.models import InputEncoder, ModelSpec, NodeClassifier, one_hot_width
from jgraph.models.registry import build as build_model_named
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sampling.capacity import calibrate, sample_first_batches
from jgraph.sampling.sampler import SampleStats
from jgraph.sharded import DistGraph
from jgraph.sharded.cache import HotCache, request_counts
from jgraph.sharded.sparse_optim import SparseAdagrad, SparseAdam
from jgraph.sharded.tensor import DistTensor

if TYPE_CHECKING:
    from jgraph.jobs.kind import JobKind  # which builds runs: it imports this module

# -- Data --------------------------------------------------------------------------------

def target_type(config: Experiment, dg: DistGraph) -> str:
    """The labelled node type: data.target_type, the only type, or the one with labels."""
    if config.data.target_type is not None:
        if config.data.target_type not in dg.node_types:
            raise ConfigError(f"data.target_type {config.data.target_type!r} is not a node "
                              f"type of the graph; it has {list(dg.node_types)}")
        return config.data.target_type
    labelled = [t for t in dg.node_types if config.data.label in dg.meta.node_data.get(t, {})]
    if len(labelled) != 1:
        raise ConfigError(f"data.label {config.data.label!r} is held by node types "
                          f"{labelled}; name one with data.target_type")
    return labelled[0]


# -- Model and step --------------------------------------------------------------------

def dense_optimizer(config: Experiment) -> optax.GradientTransformation:
    t = config.train
    if t.optimizer is Optimizer.ADAMW:
        return optax.adamw(t.lr, weight_decay=t.weight_decay)
    base = optax.adam(t.lr) if t.optimizer is Optimizer.ADAM else optax.sgd(t.lr)
    # Adam/SGD with weight decay as PyTorch: an L2 term added to the gradient.
    return optax.chain(optax.add_decayed_weights(t.weight_decay), base) if t.weight_decay else base


def job_fields(config: Experiment, exchange, inputs: NodeInputs, fanouts=None) -> dict:
    """The fields every kind's job takes from its config, its exchange and its inputs
    (`Job`'s but the graph definition and the loader), built alike from a partitioned
    graph and from counts (`jgraph.jobs.abstract`); fanouts: the sampler's (default
    train.fanouts)."""
    t = config.train
    return dict(tx=dense_optimizer(config), sampler=NeighborSampler(fanouts or t.fanouts),
                exchange=exchange, inputs=inputs, seed=t.seed,
                compute_dtype=t.precision.dtype)


def sparse_optimizer(config: Experiment):
    t = config.train
    if t.embedding_optimizer is SparseOptimizerKind.ADAGRAD:
        return SparseAdagrad(learning_rate=t.embedding_lr)
    return SparseAdam(learning_rate=t.embedding_lr)


def build_model(config: Experiment, inputs: NodeInputs, num_classes: int,
                num_relations: int, rngs: nnx.Rngs | None = None) -> NodeClassifier:
    """The input encoder and the GNN of `config.model`, `num_classes` wide at the output
    (link prediction: model.hidden, the node embedding), drawn from `rngs` (a fresh
    stream of train.seed by default; a caller that draws more from it passes its own)."""
    m = config.model
    rngs = rngs or nnx.Rngs(config.train.seed)
    encoder = InputEncoder(inputs.widths(), tuple(inputs.features),
                           input_width(config, num_classes, num_relations), rngs=rngs)
    spec = ModelSpec(encoder.width, m.hidden, num_classes, m.num_layers, num_relations,
                     dropout=m.dropout, input_dropout=m.input_dropout, norm=m.norm, options=m)
    try:
        gnn = build_model_named(m.kind, spec, rngs)
    except KeyError as err:
        raise ConfigError(err.args[0]) from None
    return NodeClassifier(encoder, gnn)


def input_width(config: Experiment, num_classes: int, num_relations: int) -> int:
    """Width of embeddings (and of projected features with several node types)."""
    m = config.model
    if m.one_hot_inputs:
        return one_hot_width(m.hidden, num_classes, m.num_layers, num_relations, m.self_loop)
    return m.embedding_dim


@dataclasses.dataclass
class Run:
    """Everything a run holds on the host between steps: its config, graph, labelled
    node type (None for link prediction) and class count, the job's kind (`JobKind`:
    how the run is built, evaluated and planned), the job (its compiled step's) and the
    model's initial parameters."""

    config: Experiment
    dg: DistGraph
    target: str | None
    num_classes: int
    job: Job
    params: object
    kind: JobKind

    def loader(self, split: str, batch_size: int, shuffle_seed: int = 0,
               most: int | None = None) -> NodeLoader:
        """The seeds of `split`; most: as `NodeLoader.from_parts`."""
        return NodeLoader.from_split(self.dg, split, self.target, batch_size=batch_size,
                                     seed=shuffle_seed, most=most)

    def has_split(self, split: str) -> bool:
        return self.kind.has_split(self, split)


class NodeParts(NamedTuple):
    """What every node classification job is built from: the labelled node type, its
    class count and labels, the inputs, the model's graph definition and parameters."""

    target: str
    num_classes: int
    labels: DistTensor
    inputs: NodeInputs
    graphdef: object
    params: object


def node_parts(config: Experiment, dg: DistGraph) -> NodeParts:
    """The labelled node type (checked: training nodes, features, labels), its inputs
    and the model, for a node classification job of any kind."""
    target = target_type(config, dg)
    sizes = {s: sum(p.splits[target].get(s, 0) for p in dg.meta.parts)
             for s in dg.meta.splits.get(target, [])}
    if not sizes.get("train"):
        raise ConfigError(f"{config.data.path}: node type {target!r} has no training nodes "
                          f"(split 'train' is missing or empty); its splits: {sizes}")
    check_mesh_fits(sizes["train"], dg.mesh.size, config.data.path)
    check_features(config, dg)
    labels = dg.ndata(config.data.label, target)
    num_classes = check_labels(config, dg, target, labels)
    num_relations = dg.graph.num_relations
    inputs = NodeInputs.of(dg, feature=config.data.feature,
                           embedding_dim=input_width(config, num_classes, num_relations),
                           optimizer=sparse_optimizer(config),
                           learnable=config.model.learnable_inputs)
    check_one_hot(config, inputs)
    model = build_model(config, inputs, num_classes, num_relations)
    graphdef, params = nnx.split(model, nnx.Param)
    return NodeParts(target, num_classes, labels, inputs, graphdef, params)


def seed_loader(config: Experiment, dg: DistGraph, target: str, batch_size: int,
                drop_last: bool) -> NodeLoader:
    """The training seeds of `target`, dealt to their devices `batch_size` at a time."""
    try:
        return NodeLoader.from_split(dg, "train", target, batch_size=batch_size,
                                     drop_last=drop_last, seed=config.train.seed)
    except ValueError as e:
        raise ConfigError(f"train.batch_size: {e}") from None


def with_caches(config: Experiment, dg: DistGraph, job: Job) -> Job:
    """`job` with its inputs' hot-node caches (exchange.cache > 0 and features)."""
    if config.exchange.cache > 0 and job.inputs.features:
        if dg.abstract:
            raise ConfigError(f"exchange.cache={config.exchange.cache}: the cached nodes are "
                              f"chosen by their degrees or requests, which a graph of "
                              f"shapes ({dg.parts.root}) does not have; set "
                              f"exchange.cache=0")
        job = dataclasses.replace(job, inputs=dataclasses.replace(
            job.inputs, caches=hot_caches(config, dg, job)))
    return job


def check_one_hot(config: Experiment, inputs: NodeInputs) -> None:
    """One-hot inputs replace a featured graph's features only when asked to."""
    if config.model.one_hot_inputs and inputs.features and len(inputs.node_types) == 1:
        raise ConfigError(
            f"model.one_hot_inputs: node type {inputs.node_types[0]!r} of {config.data.path} "
            f"has {config.data.feature!r} features, which one-hot inputs would replace by "
            f"learned rows; set model.learnable_inputs=true to train without them")


CALIBRATION_BATCHES = 8  # first training batches whose exchanges size the capacities
CACHE_BATCHES = 8       # training batches whose requests rank nodes for cache_by=frequency


def hot_caches(config: Experiment, dg: DistGraph, job: Job) -> dict:
    """{ntype: HotCache} of each feature type: the exchange.cache fraction of its nodes
    with the highest out-degree, or the most requests over the first CACHE_BATCHES
    training batches' input nodes (exchange.cache_by)."""
    x = config.exchange
    if x.cache_by is CacheBy.DEGREE:
        scores = dg.degrees()[1]
    else:
        scores = request_counts(sampled_inputs(job, dg.graph, CACHE_BATCHES),
                                dg.meta.num_nodes)
    everyone = jnp.arange(dg.meta.num_nodes, dtype=jnp.int32)
    caches = {}
    for ntype in job.inputs.features:
        mine = np.asarray(job.inputs.layouts[ntype].contains(everyone))
        caches[ntype] = HotCache.top(np.where(mine, scores, -1),
                                     int(round(x.cache * int(mine.sum()))))
    return caches


def sampled_inputs(job: Job, graph, batches: int) -> list[np.ndarray]:
    """Per device and batch, the input nodes (blocks[0].src) it asked other devices
    for, over the first `batches` training batches of epoch 0."""
    offsets = job.exchange.offsets
    out = []
    for got in sample_first_batches(job.sampler, graph, job.exchange, job.loader,
                                    lambda s: s.input_nodes, ROWS, seed=job.seed,
                                    batches=batches, batch_seeds=job.batch_seeds):
        got = np.asarray(got).reshape(job.mesh.size, -1)
        out += [ids[(ids >= 0) & ((ids < offsets[k]) | (ids >= offsets[k + 1]))]
                for k, ids in enumerate(got)]
    return out


def calibrated_sampler(run: Run, progress: Progress) -> Job:
    """The run's job with sampling capacities measured from its graph (see
    `jgraph.sampling.capacity`) instead of the worst case."""
    job, t = run.job, run.config.train
    worst = job.sampler.worst_case(run.dg.graph, job.seeds_per_step)
    with progress.phase("measuring the sampled frontiers"):
        sampler = calibrate(job.sampler, run.dg.graph, job.exchange, job.loader,
                            seed=t.seed, headroom=t.capacity_headroom,
                            batch_seeds=job.batch_seeds, num_seeds=job.seeds_per_step)
    progress.detail(f"src rows per hop: {list(sampler.capacities)} (worst case {worst})")
    return dataclasses.replace(job, sampler=sampler)


def calibrated_exchange(job: Job, graph, embeddings=None,
                        progress: Progress | None = None) -> Job:
    """`job` with its exchange's capacities fitted to what its first training batches
    send (`Exchange.fitted`, measured with the job's sampler capacities, so calibrate
    those first); itself where there is nothing to measure (one device, or
    exchange.sizing bound). embeddings: the tables the batches read (their values do
    not matter; default: freshly drawn ones)."""
    exchange = job.exchange
    if exchange.num_parts == 1 or exchange.config.sizing is not Sizing.CALIBRATED:
        return job
    progress = progress or Progress(enabled=False)
    if embeddings is None:
        embeddings = job.inputs.init_embeddings(job.mesh, jax.random.key(job.seed))
    with progress.phase("measuring the exchange"):
        exchange = exchange.fitted(measure_exchange(job, graph, embeddings))
    progress.detail(f"exchange capacities by route and request length: "
                  f"{sizing.dump(exchange.capacities)}")
    return dataclasses.replace(job, exchange=exchange)


def measure_exchange(job: Job, graph, embeddings,
                     batches: int = CALIBRATION_BATCHES) -> list:
    """The statistics of every exchange of the job's first `batches` training batches
    of epoch 0 (`batch_of`, sampled and fetched as the step does, no model), on the
    host: a list of the batches' stats pytrees. Where scatters move otherwise than
    gathers (`Exchange.scatters_straight`: their capacities have keys of their own),
    learnable embeddings' gradients are routed back too, as zeros; elsewhere the
    lookup of the same rows measured it."""
    scatters = job.exchange.scatters_straight

    def one(embeddings, data, order, index):
        batch = job.batch_of(data, embeddings, order, index, index)
        return batch.stats, (job.route_embedding_gradients(batch, None)[1] if scatters
                             else [])

    program = jax.jit(jax.shard_map(
        one, mesh=job.mesh, in_specs=(job.inputs.embedding_specs(), job.data_specs(graph),
                                      ROWS, REPLICATED), out_specs=REPLICATED))
    data, order = job.data(graph), job.loader.epoch_order(0)
    return [jax.device_get(program(embeddings, data, order, jnp.int32(i)))
            for i in range(min(batches, job.loader.steps_per_epoch))]


def check_features(config: Experiment, dg: DistGraph) -> None:
    """Raise ConfigError unless data.feature names feature matrices of the graph.

    A node type without the array learns an embedding; a name that no node type holds
    is an error, except the default `feat` (a featureless graph such as AIFB)."""
    name = config.data.feature
    held = {t: specs[name] for t, specs in dg.meta.node_data.items() if name in specs}
    if not held and name != DataConfig().feature and not config.model.learnable_inputs:
        arrays = {t: sorted(specs) for t, specs in dg.meta.node_data.items()}
        raise ConfigError(f"data.feature {name!r} is not a node array of {dg.parts.root}; "
                          f"its node arrays are {arrays}")
    # Only the shape: opening the partition already refused data that is not numbers.
    for ntype, spec in held.items():
        if len(spec.shape) != 1:
            raise ConfigError(
                f"data.feature {name!r} of node type {ntype!r} in {dg.parts.root} is "
                f"{spec.dtype}{['N', *spec.shape]}; features are one row per node "
                f"([N, width])")


def check_labels(config: Experiment, dg: DistGraph, target: str, labels: DistTensor) -> int:
    """The number of classes, after checking data.label: integer classes 0..C-1 (-1 =
    unlabelled), and a label on every node of the train, val and test splits (a graph
    of shapes: the classes its counts give)."""
    name, root = config.data.label, dg.parts.root
    spec = dg.meta.node_data[target][name]
    if spec.shape or not np.issubdtype(np.dtype(spec.dtype), np.integer):
        raise ConfigError(f"data.label {name!r} of node type {target!r} in {root} is "
                          f"{spec.dtype}{['N', *spec.shape]}; labels are one integer "
                          f"class per node")
    if dg.abstract:
        return dg.shapes.classes
    labels = labels.to_numpy()
    if labels.size and labels.min() < -1:
        raise ConfigError(f"data.label {name!r} of node type {target!r} in {root} holds "
                          f"{int(labels.min())}; labels are classes 0..C-1, or -1 for "
                          f"unlabelled nodes")
    for split in ("train", "val", "test"):
        if split not in dg.meta.splits.get(target, []):
            continue
        held = split_labels(dg, target, split, labels)
        missing = int(np.sum(held < 0))
        if missing:
            raise ConfigError(f"split {split!r} of node type {target!r} in {root} has "
                              f"{missing} of its {held.size} nodes without a label (-1 in "
                              f"data.label {name!r})")
    return int(labels.max(initial=0)) + 1


def split_labels(dg: DistGraph, target: str, split: str, labels: np.ndarray) -> np.ndarray:
    """The labels (`labels`: every row of node type `target`, host) of the nodes of
    `split`, in partition order."""
    ids = np.concatenate([np.asarray(dg.parts.part(k).splits[target][split])
                          for k in range(dg.num_parts)])
    _, rows = dg.book.to_type_local(ids)
    return labels[rows]


def check_stats(stats) -> None:
    """Raise if any exchange in a step lost ids (capacity overflow, ids out of range)."""
    for leaf in jax.tree.leaves(stats, is_leaf=lambda x: isinstance(x, (ExchangeStats,
                                                                        SampleStats))):
        if isinstance(leaf, (ExchangeStats, SampleStats)):
            leaf.check()
