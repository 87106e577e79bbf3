"""The partitioned graph stored on a device mesh: the sharded graph, node data
(`DistTensor`), learnable embeddings (`DistEmbedding`) and the hot-node cache; their
reads and writes by global id go through `jgraph.exchange`. The mesh helpers
(`jgraph.mesh`) and the exchange's names are exported here too, so that one import
serves a program on the mesh.

Everything here runs the same on one device, on N local devices, and across hosts;
only the mesh differs. Library code never configures JAX: entry points do.
"""
from jgraph.exchange import Exchange, ExchangeConfig, ExchangeOverflowError, ExchangeStats, Strategy
from jgraph.mesh import (
    AXIS,
    REPLICATED,
    ROWS,
    MeshError,
    check_parts,
    local_parts,
    make_mesh,
    replicate,
    shard_rows,
)
from jgraph.sharded.cache import HotCache, cache_size, request_counts
from jgraph.sharded.embedding import DistEmbedding, EmbeddingState
from jgraph.sharded.graph import DistGraph, ShardedGraph, load_sharded_graph
from jgraph.sharded.layout import RowLayout
from jgraph.sharded.sparse_optim import SparseAdagrad, SparseAdam
from jgraph.sharded.tensor import DistTensor

__all__ = [
    "AXIS",
    "REPLICATED",
    "ROWS",
    "DistEmbedding",
    "DistGraph",
    "DistTensor",
    "EmbeddingState",
    "Exchange",
    "ExchangeConfig",
    "ExchangeOverflowError",
    "ExchangeStats",
    "HotCache",
    "MeshError",
    "RowLayout",
    "ShardedGraph",
    "SparseAdagrad",
    "SparseAdam",
    "Strategy",
    "cache_size",
    "check_parts",
    "load_sharded_graph",
    "local_parts",
    "make_mesh",
    "replicate",
    "request_counts",
    "shard_rows",
]
