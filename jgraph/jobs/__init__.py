"""The jobs: what one compiled training step is, for each kind of job (task x mode x
sampler), and how a run of it is built, evaluated and planned (`jgraph.jobs.table`)."""
from jgraph.jobs.kind import JobKind
from jgraph.jobs.table import KINDS, build_run, kind_of

__all__ = ["KINDS", "JobKind", "build_run", "kind_of"]
