"""The job table: every kind of job jgraph trains, each registered by its own module.

A kind of job is one module holding its job class (filling in the step template of
`Job.train_step`) and its `JobKind` (its settings' rules, the graph it
prepares, build, programs, evaluation, baselines, bench fields), ending with one
line: `register(TheKind())`. `jgraph.jobs` imports the modules of the kinds jgraph
ships; a kind defined elsewhere registers itself when its module is imported.

This module sits below the kinds and the settings (it imports neither), so that an
`Experiment` can hand itself to its kind's rules as it is made.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from jgraph.config import ConfigError

if TYPE_CHECKING:
    from jgraph.jobs.experiment import Experiment
    from jgraph.jobs.kind import JobKind
    from jgraph.jobs.run import Run
    from jgraph.sharded import DistGraph

KINDS: dict[tuple, JobKind] = {}
"""{(task, train.mode, train.sampler): its kind}, in the order registered; a model that
is a job of its own (label propagation, which learns nothing) under (task, "model.kind",
its model.kind), whatever train.mode and train.sampler say."""


def register(kind: JobKind) -> JobKind:
    """Add `kind` to the table under its key (`JobKind.key`); a key registered twice
    is refused. Returns the kind."""
    if kind.key in KINDS:
        raise ValueError(f"{kind.name} is registered already (as "
                         f"{type(KINDS[kind.key]).__name__})")
    KINDS[kind.key] = kind
    return kind


def unregister(kind: JobKind) -> None:
    """Take `kind` out of the table (a kind registered for a while, as a test's)."""
    if KINDS.get(kind.key) is kind:
        del KINDS[kind.key]


def kind_of(config: Experiment) -> JobKind:
    """The kind of job `config` asks for: its model's own, else its task's, mode's and
    sampler's."""
    own = (config.task, "model.kind", config.model.kind)
    if own in KINDS:
        return KINDS[own]
    key = (config.task, config.train.mode, config.train.sampler)
    if key not in KINDS:
        raise ConfigError(f"no kind of job trains task {key[0]} with train.mode {key[1]} "
                          f"and train.sampler {key[2]}; jgraph trains "
                          f"{[kind.name for kind in KINDS.values()]}")
    return KINDS[key]


def build_run(config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
    """The run of `config` on `dg`, as its kind builds it; platform: the one its
    program is built for (default: the mesh's), which chooses the exchange's AUTO
    strategy."""
    return kind_of(config).build(config, dg, platform)
