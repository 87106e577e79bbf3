"""On-device multi-hop neighbour sampling and the node loader.

`NeighborSampler.sample` turns seeds into `Block`s inside the compiled step; remote
frontier nodes are sampled by their owners through the exchange. `NodeLoader` deals
each device's own training seeds, shuffled per epoch, in fixed-size batches.
"""
from jgraph.sampling.blocks import Block, build_block
from jgraph.sampling.loader import LoaderState, NodeLoader
from jgraph.sampling.sampler import NeighborSampler, Sample, SampleStats, stream_key
from jgraph.sampling.weighted import edge_weight_cumsum, weighted_positions

__all__ = [
    "Block", "LoaderState", "NeighborSampler", "NodeLoader", "Sample", "SampleStats",
    "build_block", "edge_weight_cumsum", "stream_key", "weighted_positions",
]
