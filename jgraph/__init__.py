"""jgraph: graph neural networks on graphs partitioned across many devices, in JAX.

The Python API, in the order of a run (each name is documented where it lives):

  graphs         Graph, Relation, load_dataset, load_npz, save_npz, symmetrize,
                 add_reverse_relations, SparseRows, split_edges,
                 Preparation, HeldOut, prepare (what is done to a graph before it
                 is partitioned, recorded with the partition),
                 ChunkedWriter, open_chunked (graphs larger than memory) (jgraph.data)
  partitioning   partition_graph, open_partitions, PartitionBook     (jgraph.partition)
  devices        use_devices (simulate N CPU devices / join a multi-process job),
                 make_mesh, DistGraph, DistTensor, DistEmbedding, HotCache,
                 SparseAdam, SparseAdagrad, ExchangeConfig            (jgraph.sharded)
  sampling       NodeLoader, NeighborSampler                          (jgraph.sampling)
  models         GraphSAGE, RGCN, LayerStack, MessagePassing, ModelSpec,
                 register_model                                       (jgraph.models)
  training       Experiment, DataConfig, ModelConfig, TrainConfig, CheckpointConfig,
                 LinkConfig, SmoothConfig, load_config, train(config, workdir),
                 evaluate(workdir), smooth(workdir) (Correct & Smooth
                 after a node classification run)                     (jgraph.train)
  outputs        embed(workdir, out) (every node's embedding or prediction on disk),
                 read_embeddings(out), load_run(workdir) (a trained model: predict,
                 embed or score a few nodes)             (jgraph.train, jgraph.data)

Importing jgraph has no side effects: nothing configures JAX or starts
`jax.distributed` until an entry point (the CLI, the launcher, a test, or your call of
`use_devices`) does. Names from modules that import JAX load on first use.
"""
import importlib

from jgraph.data import (
    ChunkedWriter,
    Graph,
    Relation,
    SparseRows,
    add_reverse_relations,
    load_dataset,
    load_npz,
    open_chunked,
    read_embeddings,
    save_npz,
    split_edges,
    symmetrize,
)
from jgraph.data.prepare import HeldOut, Preparation, prepare
from jgraph.partition import PartitionBook, open_partitions, partition_graph

__version__ = "0.1.0"

# name -> module that defines it; imported when the name is first used.
_LAZY = {
    **dict.fromkeys(["DistEmbedding", "DistGraph", "DistTensor", "ExchangeConfig", "HotCache",
                     "SparseAdagrad", "SparseAdam", "make_mesh"], "jgraph.sharded"),
    **dict.fromkeys(["NeighborSampler", "NodeLoader"], "jgraph.sampling"),
    **dict.fromkeys(["GraphSAGE", "LayerStack", "MessagePassing", "ModelSpec", "RGCN",
                     "register_model"], "jgraph.models"),
    **dict.fromkeys(["CheckpointConfig", "DataConfig", "Experiment", "LinkConfig",
                     "ModelConfig", "SmoothConfig", "TrainConfig"], "jgraph.jobs.experiment"),
    **dict.fromkeys(["TrainedRun", "load_run"], "jgraph.train.trained"),
    "embed": "jgraph.train.api",
    "smooth": "jgraph.train.api",
    "evaluate": "jgraph.train.api",
    "load_config": "jgraph.train.api",
    "use_devices": "jgraph.cli.devices",
}


def __getattr__(name: str):
    if name == "train":             # the subpackage, which is callable: jgraph.train(config)
        return importlib.import_module("jgraph.train")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jgraph' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"train"})


__all__ = [  # noqa: RUF022  (in the docstring's order)
    "Graph", "Relation", "load_dataset", "load_npz", "save_npz", "symmetrize",
    "add_reverse_relations", "SparseRows", "split_edges", "Preparation", "HeldOut", "prepare",
    "ChunkedWriter", "open_chunked", "partition_graph", "open_partitions", "PartitionBook",
    "use_devices", "make_mesh", "DistGraph", "DistTensor", "DistEmbedding", "HotCache",
    "SparseAdam", "SparseAdagrad", "ExchangeConfig",
    "NodeLoader", "NeighborSampler",
    "GraphSAGE", "RGCN", "LayerStack", "MessagePassing", "ModelSpec", "register_model",
    "Experiment", "DataConfig", "ModelConfig", "TrainConfig", "CheckpointConfig",
    "LinkConfig", "SmoothConfig", "load_config", "train", "evaluate", "smooth", "embed",
    "read_embeddings",
    "__version__",
]
