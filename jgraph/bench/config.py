"""Settings of `jgraph bench`, written in the experiment's own sections.

Each bench's settings are a frozen dataclass of the sections an `Experiment` has
(`DataConfig`: the graph and the devices; `TrainConfig`: the fanouts, batch and epochs;
`ModelConfig`; `ExchangeConfig`) plus the few fields only that bench has. Every
setting has one default: the section's own, except those of the benchmark workload
(`WORKLOAD_*` below) that all benches share. Values are checked where they are built,
by the sections and by the benches' `__post_init__`, so an invalid setting cannot
exist; the CLI only names the keys its flags set (`jgraph.cli.bench`).
"""
from __future__ import annotations

import dataclasses

from jgraph.config import ConfigError
from jgraph.exchange import ExchangeConfig, Strategy
from jgraph.jobs import kind_of
from jgraph.jobs.experiment import (
    DataConfig,
    Experiment,
    ModelConfig,
    TrainConfig,
)
from jgraph.kernels.sample import IMPLS

# The benchmark workload: DGL's GraphSAGE reference on one device, the setting the peer
# benchmarks (`../shared/peers`) run: 3 layers of fanouts 15, 10, 5, batches of 1024
# seeds per device, hidden 256, Adam at 0.003, no dropout; one measured epoch.
WORKLOAD_DATA = DataConfig(path="cora", num_parts=1)
WORKLOAD_TRAIN = TrainConfig(fanouts=(15, 10, 5), eval_fanouts=(15, 10, 5), lr=0.003,
                             epochs=1, batch_size=1024)
WORKLOAD_MODEL = ModelConfig(hidden=256, num_layers=3, dropout=0.0)


def _check_devices(data: DataConfig) -> None:
    if data.num_parts < 1:
        raise ConfigError(f"data.num_parts (the devices, one partition each) must be >= 1 "
                          f"for a benchmark, got {data.num_parts}")


@dataclasses.dataclass(frozen=True)
class SampleBench:
    """`jgraph bench sample`: the node loader and neighbour sampler over whole epochs.

    data: the graph (path), devices (num_parts), method, symmetrize. train: fanouts
    (-1 = every neighbour), batch_size, epochs, seed. exchange: strategy and growth of
    the frontier's exchange. replace: sample with replacement. impl: the draw kernel
    ("auto": Pallas in a program for a GPU, XLA elsewhere; "xla"; "pallas").
    """

    data: DataConfig = WORKLOAD_DATA
    train: TrainConfig = WORKLOAD_TRAIN
    exchange: ExchangeConfig = ExchangeConfig()
    replace: bool = False
    impl: str = "auto"

    def __post_init__(self):
        _check_devices(self.data)
        if self.impl not in IMPLS:
            raise ConfigError(f"impl must be one of {list(IMPLS)}, got {self.impl!r}")


@dataclasses.dataclass(frozen=True)
class TrainBench(Experiment):
    """`jgraph bench train`: the whole training step over whole epochs.

    The experiment's own sections and task (`Experiment`: the run it times is the one
    `jgraph train` would build from them), with the benchmark workload's data, model
    and train defaults (train.profile: a directory for a JAX profiler trace, "" =
    none). breakdown: also time each phase of the step (`jgraph.bench.profile`; node
    classification). steps: time this many steps (after one warm-up step) instead of
    whole epochs (0), for graphs whose epoch is long: each is a step of the same epoch
    order.
    """

    name: str = "bench_train"
    data: DataConfig = WORKLOAD_DATA
    model: ModelConfig = WORKLOAD_MODEL
    train: TrainConfig = WORKLOAD_TRAIN
    breakdown: bool = False
    steps: int = 0

    def __post_init__(self):
        _check_devices(self.data)
        super().__post_init__()                     # its kind's rules
        if self.steps < 0:
            raise ConfigError(f"steps is {self.steps}: the steps to time (0 = whole "
                              f"epochs), not negative")
        kind = kind_of(self)
        if not kind.timed_by_phase and (self.breakdown or self.train.profile):
            raise ConfigError(f"breakdown (and profile, which implies it) times the phases "
                              f"of node classification's step; run {kind.title} without it")

    def experiment(self, partition_dir: str) -> Experiment:
        """The experiment the bench trains, on the partitions in `partition_dir`."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(Experiment)}
        return Experiment(**{**own, "data": dataclasses.replace(self.data,
                                                                path=partition_dir)})


@dataclasses.dataclass(frozen=True)
class ExchangeBench:
    """`jgraph bench exchange`: feature fetches with each strategy, and embedding steps.

    data: the graph, num_parts (= devices), method, symmetrize. train: fanouts and
    batch_size of the sampled neighbourhoods, seed. exchange: the ladder (growth, ...)
    and hot-node cache (cache, cache_by) every strategy runs with. strategies: those to
    measure (() = every one this backend has). batches: calls measured per strategy.
    embedding_rows: table sizes of the embedding step (() = none); embedding_dim,
    embedding_batch (ids per device per step), embedding_steps: its shape and length.
    """

    data: DataConfig = dataclasses.replace(WORKLOAD_DATA, num_parts=8)
    train: TrainConfig = WORKLOAD_TRAIN
    exchange: ExchangeConfig = ExchangeConfig()
    strategies: tuple[Strategy, ...] = ()
    batches: int = 8
    embedding_rows: tuple[int, ...] = (1_000_000, 10_000_000)
    embedding_dim: int = 32
    embedding_batch: int = 8192
    embedding_steps: int = 10

    def __post_init__(self):
        _check_devices(self.data)
        if any(f < 1 for f in self.train.fanouts):
            raise ConfigError(f"train.fanouts = {list(self.train.fanouts)}: the exchange "
                              f"bench samples a neighbour count >= 1 per hop")
        for key in ("batches", "embedding_dim", "embedding_batch", "embedding_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if any(rows < 1 for rows in self.embedding_rows):
            raise ConfigError(f"embedding_rows must be >= 1, got {list(self.embedding_rows)}")

    def exchange_for(self, strategy: Strategy) -> ExchangeConfig:
        return dataclasses.replace(self.exchange, strategy=strategy)
