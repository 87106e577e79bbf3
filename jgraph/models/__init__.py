"""Flax NNX graph models over fixed-width neighbourhoods (sampled Blocks or chunks of
the full graph)."""
from jgraph.models.sage import Aggregator, GraphSAGE, SAGEConv, gather_neighbours

__all__ = ["Aggregator", "GraphSAGE", "SAGEConv", "gather_neighbours"]
