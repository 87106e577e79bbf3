"""Training: the loop and its state (checkpoints, resuming, the workdir, reports, the
saved model) and the Python entry points; the steps it runs are the jobs'
(`jgraph.jobs`), re-exported here. The package itself can be called:
`jgraph.train(config, workdir)` is `jgraph.train.api.train`."""
import sys
import types

from jgraph.jobs.inputs import NodeInputs
from jgraph.jobs.step import (
    Batch,
    Job,
    NodeClassification,
    StepData,
    TrainState,
    class_counts,
    masked_cross_entropy,
)
from jgraph.train.api import evaluate, load_config
from jgraph.train.api import train as _train

__all__ = ["Batch", "Job", "NodeClassification", "NodeInputs", "StepData", "TrainState",
           "class_counts", "evaluate", "load_config", "masked_cross_entropy"]


class _CallablePackage(types.ModuleType):
    """`jgraph.train(...)` runs `jgraph.train.api.train(...)`; `jgraph.train.loop` and the
    other modules stay reachable as usual."""

    def __call__(self, *args, **kwargs):
        return _train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
