"""The job table: every kind of job jgraph trains, registered in one place.

A new kind is a module holding its job class (filling in the step template of
`NodeClassification.train_step`) and its `JobKind` (build, abstract build, programs,
evaluation), plus one line here.
"""
from __future__ import annotations

from jgraph.config import ConfigError
from jgraph.jobs.control_variate import ControlVariateNodes
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.full import FullBatchNodes
from jgraph.jobs.kind import JobKind
from jgraph.jobs.link import LinkPredictions
from jgraph.jobs.run import Run
from jgraph.jobs.sampled import SampledNodes
from jgraph.sharded import DistGraph

KINDS: dict[tuple, JobKind] = {kind.key: kind for kind in (
    SampledNodes(),
    FullBatchNodes(),
    ControlVariateNodes(),
    LinkPredictions(),
)}
"""{(task, train.mode, train.sampler): its kind}."""


def kind_of(config: Experiment) -> JobKind:
    """The kind of job `config` asks for."""
    key = (config.task, config.train.mode, config.train.sampler)
    if key not in KINDS:
        raise ConfigError(f"no kind of job trains task {key[0].value} with train.mode "
                          f"{key[1].value} and train.sampler {key[2].value}; jgraph trains "
                          f"{[kind.name for kind in KINDS.values()]}")
    return KINDS[key]


def build_run(config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
    """The run of `config` on `dg`, as its kind builds it; platform: the one its
    program is built for (default: the mesh's), which chooses the exchange's AUTO
    strategy."""
    return kind_of(config).build(config, dg, platform)
