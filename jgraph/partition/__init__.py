"""Offline partitioning: METIS or random assignment, relabelling, the on-disk format."""
from jgraph.partition.assignment import (
    Constraints,
    Method,
    assign,
    balance,
    constraints_for,
    edge_cut_fraction,
)
from jgraph.partition.book import IdRangeError, PartitionBook
from jgraph.partition.build import partition_graph
from jgraph.partition.errors import PartitionError
from jgraph.partition.metis import Backend, available_backends
from jgraph.partition.store import (
    FORMAT_VERSION,
    Partition,
    PartitionedGraph,
    PartitionFormatError,
    PartitionMeta,
    open_partitions,
)

__all__ = [
    "FORMAT_VERSION",
    "Backend",
    "Constraints",
    "IdRangeError",
    "Method",
    "Partition",
    "PartitionBook",
    "PartitionError",
    "PartitionFormatError",
    "PartitionMeta",
    "PartitionedGraph",
    "assign",
    "available_backends",
    "balance",
    "constraints_for",
    "edge_cut_fraction",
    "open_partitions",
    "partition_graph",
]
