"""jgraph: graph neural networks on graphs partitioned across many devices, in JAX.

Importing jgraph has no side effects: nothing configures JAX or starts
`jax.distributed` until an entry point (the CLI, the launcher, a test) does.
"""
from jgraph.data import Graph, Relation, load_dataset
from jgraph.partition import PartitionBook, open_partitions, partition_graph

__version__ = "0.1.0"

__all__ = ["Graph", "PartitionBook", "Relation", "__version__", "load_dataset",
           "open_partitions", "partition_graph"]
