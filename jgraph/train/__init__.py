"""Training: the fused SPMD step (sample, fetch, forward, backward, update)."""
from jgraph.train.inputs import NodeInputs
from jgraph.train.step import (
    Batch,
    NodeClassification,
    StepData,
    TrainState,
    class_counts,
    masked_cross_entropy,
)

__all__ = ["Batch", "NodeClassification", "NodeInputs", "StepData", "TrainState",
           "class_counts", "masked_cross_entropy"]
