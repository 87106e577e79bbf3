"""The partitioned graph on a device mesh: loading, node data, embeddings, the exchange.

Everything here runs the same on one device, on N local devices, and across hosts;
only the mesh differs. Library code never configures JAX: entry points do.
"""
from jgraph.dist.cache import HotCache, cache_size, request_counts
from jgraph.dist.embedding import DistEmbedding, EmbeddingState
from jgraph.dist.exchange import (Exchange, ExchangeConfig, ExchangeOverflowError, ExchangeStats,
                                  Strategy)
from jgraph.dist.graph import DistGraph, ShardedGraph, load_sharded_graph
from jgraph.dist.layout import RowLayout
from jgraph.dist.mesh import (AXIS, REPLICATED, ROWS, MeshError, check_parts, local_parts,
                              make_mesh, replicate, shard_rows)
from jgraph.dist.sparse_optim import SparseAdagrad, SparseAdam
from jgraph.dist.tensor import DistTensor

__all__ = [
    "AXIS", "DistEmbedding", "DistGraph", "DistTensor", "EmbeddingState", "Exchange",
    "ExchangeConfig", "ExchangeOverflowError", "ExchangeStats", "HotCache", "MeshError",
    "REPLICATED", "ROWS", "RowLayout", "ShardedGraph", "SparseAdagrad", "SparseAdam",
    "Strategy", "cache_size", "check_parts", "load_sharded_graph", "local_parts",
    "make_mesh", "replicate", "request_counts", "shard_rows",
]
