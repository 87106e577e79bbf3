"""Graph data on the host: the `Graph` container, loaders, generators and transforms."""
from jgraph.data.chunked import (
    ChunkedGraph,
    ChunkedWriter,
    is_chunked_dir,
    load_chunked,
    open_chunked,
    save_chunked,
)
from jgraph.data.datasets import BUILTIN, load_dataset
from jgraph.data.graph import DEFAULT_NTYPE, DEFAULT_REL, Graph, GraphError, Relation
from jgraph.data.links import EDGE_SPLITS, EdgeSet, LinkSplit, is_symmetric, split_edges
from jgraph.data.npz import DatasetError, load_npz, save_npz
from jgraph.data.ogb import load_ogb
from jgraph.data.outputs import OutputsError, read_embeddings
from jgraph.data.sparse import SparseRows
from jgraph.data.synthetic import Kind, SyntheticSpec, generate, generate_chunked, parse_spec
from jgraph.data.transforms import (
    add_reverse_relations,
    add_self_loops,
    deduplicate,
    normalize_features,
    remove_self_loops,
    symmetrize,
)

__all__ = [
    "BUILTIN",
    "DEFAULT_NTYPE",
    "DEFAULT_REL",
    "EDGE_SPLITS",
    "ChunkedGraph",
    "ChunkedWriter",
    "DatasetError",
    "EdgeSet",
    "Graph",
    "GraphError",
    "Kind",
    "LinkSplit",
    "OutputsError",
    "Relation",
    "SparseRows",
    "SyntheticSpec",
    "add_reverse_relations",
    "add_self_loops",
    "deduplicate",
    "generate",
    "generate_chunked",
    "is_chunked_dir",
    "is_symmetric",
    "load_chunked",
    "load_dataset",
    "load_npz",
    "load_ogb",
    "normalize_features",
    "open_chunked",
    "parse_spec",
    "read_embeddings",
    "remove_self_loops",
    "save_chunked",
    "save_npz",
    "split_edges",
    "symmetrize",
]
