"""The experiment config: what `jgraph train CONFIG` runs, as typed frozen dataclasses.

Every experiment in `experiments/*.yaml` is an `Experiment`; a YAML file sets some of
its fields, `--set section.key=value` any other, and an unknown key fails with the
valid keys (see `jgraph.config`). Each section checks its own values when it is
built, and `Experiment` hands itself to the rules of the kind of job it asks for
(`jgraph.jobs.kind.JobKind.check`), so a config that exists is one a run can use;
errors are `ConfigError`s that name the key.
"""
from __future__ import annotations

import dataclasses
import enum
import os

from jgraph.config import ConfigError
from jgraph.data import BUILTIN
from jgraph.exchange import ExchangeConfig
from jgraph.jobs.table import kind_of
from jgraph.models import is_import_path, registered_models
from jgraph.models.link import Decoder
from jgraph.models.rgcn import Decomposition, Norm
from jgraph.models.sage import Aggregator
from jgraph.partition import Method
from jgraph.sampling.edges import Negatives


class Task(enum.StrEnum):
    """What a run trains: `node` classification, or `link` prediction (the tasks of the
    kinds jgraph ships; `task` is a string so a kind registered elsewhere can name its
    own: `jgraph.jobs.table`)."""

    NODE = "node"
    LINK = "link"


class LinkLoss(enum.Enum):
    """Link prediction's loss. bce: binary cross-entropy over every score (positives
    1, negatives 0), the mean over all of them, as DGL's examples; contrastive: per
    positive, the softmax cross-entropy of the positive among its negatives (InfoNCE),
    the mean over positives."""

    BCE = "bce"
    CONTRASTIVE = "contrastive"


class Optimizer(enum.Enum):
    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"


class SparseOptimizerKind(enum.Enum):
    ADAM = "adam"
    ADAGRAD = "adagrad"


class Precision(enum.Enum):
    """What the layers compute in: `f32`, or `bf16` (bfloat16 layers over float32
    parameters, optimizer state and loss)."""

    F32 = "f32"
    BF16 = "bf16"

    @property
    def dtype(self):
        import jax.numpy as jnp
        return jnp.bfloat16 if self is Precision.BF16 else jnp.float32


class Mode(enum.StrEnum):
    """How a training step sees the graph: `sampled` blocks around a batch of seeds, or
    `full`: every layer for every node over its whole in-neighbourhood, the loss over
    every training node (one step an epoch; SAR's full-batch training). A string in the
    settings, as `Task`."""

    SAMPLED = "sampled"
    FULL = "full"


class Sampler(enum.StrEnum):
    """How a sampled step aggregates: `neighbor` (each layer over its sampled
    neighbours), or `control_variate` (VR-GCN: each layer above the first adds the exact
    sum of every neighbour's history to a correction from the sampled ones, so fanouts
    as small as 1 train as all neighbours do; `jgraph.jobs.control_variate`). A string
    in the settings, as `Task`."""

    NEIGHBOR = "neighbor"
    CONTROL_VARIATE = "control_variate"


class HistoryInit(enum.Enum):
    """How control variates' histories start: `inference` (one layer-wise full-graph
    pass with the initial parameters) or `zeros`."""

    INFERENCE = "inference"
    ZEROS = "zeros"


LABEL_PROPAGATION = "label_propagation"
"""model.kind of label propagation: a model that learns nothing (see `ModelConfig`)."""


class Inference(enum.Enum):
    """How the final evaluation runs: `sampled` with `eval_fanouts`, or `full`:
    layer-wise inference over every node's whole in-neighbourhood."""

    SAMPLED = "sampled"
    FULL = "full"


def _at_least(minimum, **values) -> None:
    """ConfigError naming the first key whose value is below `minimum`."""
    for key, value in values.items():
        if value < minimum:
            raise ConfigError(f"{key.replace('__', '.')} must be >= {minimum}, got {value}")


def _fanouts(key: str, fanouts: tuple[int, ...]) -> None:
    bad = [f for f in fanouts if f < 1 and f != -1]
    if not fanouts or bad:
        raise ConfigError(f"{key} = {list(fanouts)}: a fanout is a neighbour count >= 1, "
                          f"or -1 for every neighbour; got {bad[0] if bad else 'none'}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """path: a built-in name (cora), an .npz in the layouts of jgraph's datasets, an
      OGB directory, `synthetic:...`, or a partition directory from `jgraph partition`;
      a relative path in a config file is relative to that file.
    num_parts: partitions = devices of the mesh; 0 = every device JAX has.
    method: partitioning (ignored for a partition directory); None: multilevel for a
      chunked graph directory (read in passes, in memory bounded by its nodes), metis
      otherwise.
    remove_self_loops, symmetrize, reverse_relations, dedup, self_loops,
      normalize_features: the graph's preparation before partitioning, in this order
      (`jgraph.data.prepare`; the same on a chunked graph directory, streamed); a
      partition directory as data.path records its own, and a config that asks for
      another is refused. remove_self_loops: drop edges from a node to itself.
    symmetrize: add each edge's reverse, once (homogeneous graphs stored one way round).
    reverse_relations: add an inverse relation per relation (R-GCN).
    dedup: keep one edge per (source, destination) in every relation.
    self_loops: give every node one self-loop edge in same-type relations (GAT's
      neighbourhood includes the node itself).
    normalize_features: scale each row of data.feature to sum 1 (GCN's Planetoid
      preprocessing).
    target_type: the labelled node type; None = the only type, or the one with labels.
    feature: the node array of input features ([N, width] numbers); a node type
      without it learns an embedding (model.embedding_dim). A name no node type holds
      is an error, except the default `feat` (a featureless graph).
    label: the node array of classes 0..C-1 (-1 = unlabelled; every node of the train,
      val and test splits needs one).
    """

    path: str = "cora"
    num_parts: int = 0
    method: Method | None = None
    remove_self_loops: bool = False
    symmetrize: bool = False
    reverse_relations: bool = False
    dedup: bool = False
    self_loops: bool = False
    normalize_features: bool = False
    target_type: str | None = None
    feature: str = "feat"
    label: str = "label"

    def __post_init__(self):
        if self.num_parts < 0:
            raise ConfigError(f"data.num_parts must be >= 0 (0 = every device), got "
                              f"{self.num_parts}")
        if self.method is Method.GIVEN:
            raise ConfigError("data.method: given is for `jgraph partition --assignment "
                              "FILE.npy`; partition so, then set data.path to the partition "
                              "directory")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """kind: the model: "sage" (GraphSAGE), "rgcn" (R-GCN), "gat", a name given to
      `jgraph.models.register_model`, or "module:function" (a builder that jgraph
      imports; see `jgraph.models.registry`); or "label_propagation", which learns
      nothing: the training labels propagated over the graph (Zhou et al., 2004;
      `jgraph.jobs.label_propagation`), num_layers steps with `alpha` (the other
      model keys are moot for it). hidden, num_layers: widths and depth (one layer
      per hop).
    aggregator: GraphSAGE's. decomposition, num_bases, self_loop: R-GCN's (num_bases
      is the block count for block decomposition; 0 = a full weight per relation).
    normalization: R-GCN's neighbour normalisation: `relation` (default, the paper's)
      divides each relation's sum by that relation's neighbour count; `node` divides
      the whole sum by the in-degree over all relations (DGL's examples).
    dropout, norm: between layers (layer norm when norm); input_dropout: on the input
      rows.
    embedding_dim: width of learnable embeddings for featureless node types (and of
      the projected inputs of graphs with several node types).
    learnable_inputs: give every node type an embedding, even where features exist.
    one_hot_inputs: R-GCN's first layer as on one-hot inputs, the paper's featureless
      model: each node learns one hidden-wide row per relation and one for itself
      (embedding_dim is then (relations + 1) x hidden; see `OneHotRelGraphConv`).
    alpha: label propagation's: the share of each step taken from the neighbours (the
      rest from the training labels), in (0, 1].
    """

    kind: str = "sage"
    hidden: int = 256
    num_layers: int = 2
    aggregator: Aggregator = Aggregator.MEAN
    decomposition: Decomposition = Decomposition.BASIS
    num_bases: int = 0
    self_loop: bool = True
    normalization: Norm = Norm.RELATION
    dropout: float = 0.5
    input_dropout: float = 0.0
    norm: bool = False
    embedding_dim: int = 64
    learnable_inputs: bool = False
    one_hot_inputs: bool = False
    heads: int = 8
    out_heads: int = 1
    attn_dropout: float = 0.0
    negative_slope: float = 0.2
    residual: bool = False
    alpha: float = 0.9

    def __post_init__(self):
        known = [*registered_models(), LABEL_PROPAGATION]
        if self.kind not in known and not is_import_path(self.kind):
            raise ConfigError(f"model.kind {self.kind!r} is not a model: one of "
                              f"{known} (jgraph.models.register_model adds "
                              f"one), or 'module:function' naming a model builder")
        if not 0.0 < self.alpha <= 1.0:
            raise ConfigError(f"model.alpha must be in (0, 1], got {self.alpha}")
        _at_least(1, model__hidden=self.hidden, model__num_layers=self.num_layers,
                  model__embedding_dim=self.embedding_dim, model__heads=self.heads,
                  model__out_heads=self.out_heads)
        if self.kind == "gat" and self.num_layers > 1 and self.hidden % self.heads:
            raise ConfigError(f"model.hidden ({self.hidden}) must be a multiple of "
                              f"model.heads ({self.heads}): GAT concatenates its heads")
        if self.num_bases < 0:
            raise ConfigError(f"model.num_bases must be >= 0 (0 = a full weight per "
                              f"relation), got {self.num_bases}")
        for key, rate in (("model.dropout", self.dropout),
                          ("model.input_dropout", self.input_dropout),
                          ("model.attn_dropout", self.attn_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {rate}")
        if self.one_hot_inputs and self.kind not in ("rgcn", LABEL_PROPAGATION):
            # label propagation reads no inputs, so an R-GCN config's one-hot inputs
            # are moot there, as its widths are
            raise ConfigError(f"model.one_hot_inputs is an R-GCN input layer; model.kind is "
                              f"{self.kind!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """fanouts: per hop from the seeds outward (as PyG); -1 = every neighbour.
    eval_fanouts: the same for sampled evaluation.
    inference: how the final val/test evaluation runs (sampled or full).
    mode: sampled (minibatches of seeds with sampled neighbourhoods) or full
      (full-batch: one step an epoch over the whole graph, each layer walking every
      in-edge in windows; `jgraph.jobs.full`). batch_size, fanouts and the sampler's
      capacities do not apply to it. A kind of job registered elsewhere may name
      another mode, or another sampler.
    rematerialize: full-batch training's backward pass fetches each window's rows
      again instead of keeping them (per-device memory: the partition's own rows plus
      one window); false keeps them (the one-shot variant: no second fetch, more
      memory).
    optimizer, lr, weight_decay: dense parameters (optax).
    embedding_optimizer, embedding_lr: the sparse optimizer of learnable embeddings.
    batch_size: training seeds (link prediction: positive edges) per device per step;
      the global batch is batch_size x devices. eval_batch_size: nodes per device per
      step of sampled evaluation.
    epochs, drop_last, seed: as usual; seed fixes the model's initialisation, the
      shuffles, the sampling and dropout.
    precision: f32, or bf16 (the layers in bfloat16; parameters, optimizer state and
      loss stay float32).
    calibrate_capacities: size the sampled blocks from frontiers measured on the graph
      (plus capacity_headroom, a fraction) instead of the worst case; a batch that
      needs more is run again with more room, never cut (jgraph.sampling.capacity).
    profile: a directory ("" = none; relative: in the workdir) to write a JAX profiler
      trace of `profile_steps` training steps into, from the run's second step on.
    sampler: neighbor, or control_variate (GraphSAGE mean or gcn, dropout through
      VR-GCN's CVD; the input layer's aggregate is exact, computed once, so fanouts'
      last entry, the input layer's, is drawn only for input dropout's noise term).
    history_init, history_precision: control variates' histories start from one
      full-graph inference pass (or zeros) and are stored in f32 (or bf16).
    history_refresh: control variates recompute every history by full-graph inference
      every this many epochs (left out: only at the start); a refresh lowers the
      estimator's variance, never its mean, and its seconds are logged.
    patience: stop early once this many epochs in a row have not bettered the best
      validation score (left out: train every epoch); the best epoch's model is the
      run's either way. Needs a validation split.
    """

    fanouts: tuple[int, ...] = (10, 10)
    eval_fanouts: tuple[int, ...] = (-1, -1)
    inference: Inference = Inference.SAMPLED
    mode: str = Mode.SAMPLED.value
    rematerialize: bool = True
    optimizer: Optimizer = Optimizer.ADAM
    lr: float = 0.01
    weight_decay: float = 0.0
    embedding_optimizer: SparseOptimizerKind = SparseOptimizerKind.ADAM
    embedding_lr: float = 0.01
    epochs: int = 20
    batch_size: int = 1024
    eval_batch_size: int = 1024
    drop_last: bool = False
    seed: int = 0
    precision: Precision = Precision.F32
    calibrate_capacities: bool = True
    capacity_headroom: float = 0.1
    profile: str = ""
    profile_steps: int = 5
    sampler: str = Sampler.NEIGHBOR.value
    history_init: HistoryInit = HistoryInit.INFERENCE
    history_precision: Precision = Precision.F32
    history_refresh: int | None = None
    patience: int | None = None

    def __post_init__(self):
        _fanouts("train.fanouts", self.fanouts)
        _fanouts("train.eval_fanouts", self.eval_fanouts)
        for key, value in (("train.lr", self.lr), ("train.embedding_lr", self.embedding_lr)):
            if value <= 0:
                raise ConfigError(f"{key} must be > 0, got {value}")
        _at_least(0, train__capacity_headroom=self.capacity_headroom,
                  train__weight_decay=self.weight_decay)
        _at_least(1, train__epochs=self.epochs, train__batch_size=self.batch_size,
                  train__eval_batch_size=self.eval_batch_size,
                  train__profile_steps=self.profile_steps)
        if self.history_refresh is not None and (isinstance(self.history_refresh, bool)
                                                 or self.history_refresh < 1):
            raise ConfigError(f"train.history_refresh: a period of at least 1 epoch (or "
                              f"leave it out: no refresh), got {self.history_refresh}")
        if self.patience is not None and (isinstance(self.patience, bool)
                                          or self.patience < 1):
            raise ConfigError(f"train.patience: epochs without a better validation score "
                              f"before stopping, at least 1 (or leave it out: no early "
                              f"stop), got {self.patience}")


@dataclasses.dataclass(frozen=True)
class LinkConfig:
    """Link prediction (`task: link`).

    val_fraction, test_fraction: the edges of each relation held out for validation
      and test (undirected graphs: pairs); they and their reverses leave the graph
      the model samples (`jgraph.data.links`).
    negatives: negatives per training positive; negative_sampler: how they are drawn
      (uniform, local, joint, in_batch: see `jgraph.sampling.edges.Negatives`).
    decoder: dot or distmult (one diagonal per relation); loss: bce or contrastive.
    exclude: leave each training batch's positive edges, and their reverses, out of
      its sampled neighbourhoods (DGL's exclude="reverse_id").
    eval_negatives: fixed negatives per validation and test positive (OGB's protocol),
      stored with the partition; hits: the k of the reported Hits@k.
    split_seed: seeds the held-out edges and their negatives (apart from train.seed,
      so runs of several seeds are ranked on one split).
    """

    val_fraction: float = 0.1
    test_fraction: float = 0.1
    negatives: int = 1
    negative_sampler: Negatives = Negatives.UNIFORM
    decoder: Decoder = Decoder.DOT
    loss: LinkLoss = LinkLoss.BCE
    exclude: bool = True
    eval_negatives: int = 1000
    hits: tuple[int, ...] = (1, 10, 50)
    split_seed: int = 0

    def __post_init__(self):
        for key, value in (("link.val_fraction", self.val_fraction),
                           ("link.test_fraction", self.test_fraction)):
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {value}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ConfigError(f"link.val_fraction + link.test_fraction = "
                              f"{self.val_fraction + self.test_fraction:g} leaves no edges "
                              f"to train on")
        _at_least(1, link__negatives=self.negatives, link__eval_negatives=self.eval_negatives)
        if not self.hits or min(self.hits) < 1:
            raise ConfigError(f"link.hits = {list(self.hits)}: give one or more k >= 1")


@dataclasses.dataclass(frozen=True)
class SmoothConfig:
    """Correct & Smooth (Huang et al., ICLR 2021) of a node classification run's
    predictions (`jgraph.train.smooth`; `jgraph smooth WORKDIR` runs it on a finished
    run with these settings unless its flags say otherwise).
    after_training: run it at the end of `jgraph train` (the result then holds
      smoothed_val_acc and smoothed_test_acc beside the model's).
    correct_steps, smooth_steps: the two propagations' steps (PyG's examples: 50).
    correct_alphas, smooth_alphas: the grid the validation split chooses the alphas
      from; 0 in both is the base predictions, so validation accuracy never falls.
    autoscale: scale each row's correction to the training rows' mean absolute error
      (the paper's "autoscale"); false: scale every row by `scale` ("FDiff-scale").
    """

    after_training: bool = False
    correct_steps: int = 50
    smooth_steps: int = 50
    correct_alphas: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0)
    smooth_alphas: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0)
    autoscale: bool = True
    scale: float = 1.0

    def __post_init__(self):
        _at_least(0, smooth__correct_steps=self.correct_steps,
                  smooth__smooth_steps=self.smooth_steps)
        for key, alphas in (("smooth.correct_alphas", self.correct_alphas),
                            ("smooth.smooth_alphas", self.smooth_alphas)):
            if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
                raise ConfigError(f"{key} are alphas in [0, 1], got {list(alphas)}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """every_steps: save a checkpoint every this many training steps; 0 = at the end of
      every epoch. One is also saved at the end of training, and when SIGINT or SIGTERM
      stops the run.
    keep: how many of the newest checkpoints stay on disk.
    asynchronous: write them in the background while training goes on.
    """

    every_steps: int = 0
    keep: int = 3
    asynchronous: bool = True

    def __post_init__(self):
        _at_least(1, checkpoint__keep=self.keep)
        if self.every_steps < 0:
            raise ConfigError(f"checkpoint.every_steps must be >= 0 (0 = every epoch), got "
                              f"{self.every_steps}")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """name: for logs. task: node (classification) or link (prediction), or the task of
    a kind of job registered elsewhere (`jgraph.jobs.register`). data, model,
    train: as above; link: link prediction's settings; smooth: Correct & Smooth's.
    exchange: how rows travel between devices (its defaults compile fastest).
    checkpoint: when the run saves itself (WORKDIR/checkpoints)."""

    name: str = "experiment"
    task: str = Task.NODE.value
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    exchange: ExchangeConfig = ExchangeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    link: LinkConfig = LinkConfig()
    smooth: SmoothConfig = SmoothConfig()

    def __post_init__(self):
        # The rules of the kind of job it asks for (none: an error naming the kinds).
        kind_of(self).check(self)

    def relative_to(self, folder: str) -> Experiment:
        """This config with a relative `data.path` taken from `folder` (the config
        file's, when one is loaded): built-in names and synthetic:... stay as they are."""
        path = self.data.path
        if os.path.isabs(path) or path in BUILTIN or path.startswith("synthetic:"):
            return self
        data = dataclasses.replace(self.data, path=os.path.normpath(os.path.join(folder, path)))
        return dataclasses.replace(self, data=data)
