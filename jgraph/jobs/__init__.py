"""The jobs: what one compiled training step is, for each kind of job (task x mode x
sampler), and how a run of it is built, evaluated and planned. Each kind's module
registers it in the job table (`jgraph.jobs.table`); importing this package imports
the modules of the kinds jgraph ships."""
from jgraph.jobs import (  # noqa: F401 (they register)
    control_variate,
    full,
    label_propagation,
    link,
    sampled,
)
from jgraph.jobs.kind import JobKind
from jgraph.jobs.table import KINDS, build_run, kind_of, register, unregister

__all__ = ["KINDS", "JobKind", "build_run", "kind_of", "register", "unregister"]
