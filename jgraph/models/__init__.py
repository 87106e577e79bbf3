"""Flax NNX graph models over fixed-width neighbourhoods (sampled Blocks, or windows of
the full graph in layer-wise inference)."""
from jgraph.models.encoder import InputEncoder, NodeClassifier
from jgraph.models.rgcn import (
    RGCN,
    Decomposition,
    Norm,
    OneHotRelGraphConv,
    RelGraphConv,
    one_hot_width,
)
from jgraph.models.sage import Aggregator, GraphSAGE, SAGEConv
from jgraph.models.stack import LayerStack, MessagePassing, Neighbourhood, gather_neighbours

__all__ = [
    "RGCN",
    "Aggregator",
    "Decomposition",
    "GraphSAGE",
    "InputEncoder",
    "LayerStack",
    "MessagePassing",
    "Neighbourhood",
    "NodeClassifier",
    "Norm",
    "OneHotRelGraphConv",
    "RelGraphConv",
    "SAGEConv",
    "gather_neighbours",
    "one_hot_width",
]
