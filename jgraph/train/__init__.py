"""Training: the fused SPMD step (sample, fetch, forward, backward, update)."""
from jgraph.train.step import NodeClassification, TrainState, masked_cross_entropy

__all__ = ["NodeClassification", "TrainState", "masked_cross_entropy"]
