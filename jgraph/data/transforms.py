"""Graph transforms: each takes a `Graph` and returns a new one; inputs are not changed.

Edge data follows its edges: reversed edges copy the data of the edge they reverse,
deduplication keeps the data of the first occurrence, and new self-loops take a fill
value that the caller must give when the relation carries edge data.
"""
from __future__ import annotations

import numpy as np

from jgraph.data.graph import Graph, GraphError, Relation
from jgraph.data.sparse import SparseRows


def _select(graph: Graph, rel: Relation, keep: np.ndarray):
    """The edges of `rel` (and their edge data) at positions `keep`."""
    data = {k: v[keep] for k, v in graph.edge_data.get(rel, {}).items()}
    return graph.edges[rel][:, keep], data


def _first_occurrences(index: np.ndarray, num_dst: int) -> np.ndarray:
    """Sorted positions of the first occurrence of each distinct (src, dst) pair."""
    key = index[0] * np.int64(max(num_dst, 1)) + index[1]
    _, first = np.unique(key, return_index=True)
    return np.sort(first)


def deduplicate(graph: Graph) -> Graph:
    """Keep one edge per distinct (src, dst) pair in every relation (the first one)."""
    edges, edge_data = {}, {}
    for rel in graph.relations:
        keep = _first_occurrences(graph.edges[rel], graph.num_nodes[rel.dst_type])
        edges[rel], edge_data[rel] = _select(graph, rel, keep)
    return graph.replace(edges=edges, edge_data=_nonempty(edge_data))


def symmetrize(graph: Graph) -> Graph:
    """Make every relation undirected: add each edge's reverse, then deduplicate.

    Only relations whose source and destination types are the same can be made
    undirected; for the others use `add_reverse_relations`.
    """
    edges, edge_data = {}, {}
    for rel in graph.relations:
        if rel.src_type != rel.dst_type:
            raise GraphError(f"cannot symmetrize relation {tuple(rel)}: its source and "
                             f"destination types differ; use add_reverse_relations instead")
        index = graph.edges[rel]
        both = np.concatenate([index, index[::-1]], axis=1)
        keep = _first_occurrences(both, graph.num_nodes[rel.dst_type])
        edges[rel] = both[:, keep]
        edge_data[rel] = {k: np.concatenate([v, v])[keep]
                          for k, v in graph.edge_data.get(rel, {}).items()}
    return graph.replace(edges=edges, edge_data=_nonempty(edge_data))


def add_reverse_relations(graph: Graph, prefix: str = "rev_") -> Graph:
    """For every relation (s, r, d) add (d, prefix + r, s) holding the reversed edges.

    This is R-GCN's inverse relation (and PyG's `ToUndirected` naming for distinct types).
    """
    edges, edge_data = dict(graph.edges), dict(graph.edge_data)
    for rel in graph.relations:
        rev = Relation(rel.dst_type, prefix + rel.name, rel.src_type)
        if rev in edges or any(r.name == rev.name for r in edges):
            raise GraphError(f"cannot add reverse relation {tuple(rev)}: a relation with "
                             f"that name exists already")
        edges[rev] = graph.edges[rel][::-1].copy()
        if rel in graph.edge_data:
            edge_data[rev] = dict(graph.edge_data[rel])
    return graph.replace(edges=edges, edge_data=edge_data)


def remove_self_loops(graph: Graph) -> Graph:
    """Drop edges whose source equals their destination (same-type relations only)."""
    edges, edge_data = {}, {}
    for rel in graph.relations:
        index = graph.edges[rel]
        keep = np.arange(index.shape[1])
        if rel.src_type == rel.dst_type:
            keep = np.flatnonzero(index[0] != index[1])
        edges[rel], edge_data[rel] = _select(graph, rel, keep)
    return graph.replace(edges=edges, edge_data=_nonempty(edge_data))


def add_self_loops(graph: Graph, fill_value=None) -> Graph:
    """Give every node of every same-type relation a self-loop, once.

    Nodes that already have one keep it and get no second (PyG's
    `add_remaining_self_loops`). New edges are appended after the existing ones. A
    relation with edge data needs `fill_value` for the new edges' data.
    """
    edges, edge_data = dict(graph.edges), dict(graph.edge_data)
    for rel in graph.relations:
        if rel.src_type != rel.dst_type:
            continue
        index = graph.edges[rel]
        has_loop = np.zeros(graph.num_nodes[rel.src_type], bool)
        has_loop[index[0][index[0] == index[1]]] = True
        new = np.flatnonzero(~has_loop)
        edges[rel] = np.concatenate([index, np.stack([new, new])], axis=1)
        if graph.edge_data.get(rel):
            if fill_value is None:
                raise GraphError(f"relation {tuple(rel)} has edge data "
                                 f"{sorted(graph.edge_data[rel])}: pass fill_value for the "
                                 f"new self-loops")
            edge_data[rel] = {k: np.concatenate([v, np.full((new.size,) + v.shape[1:],
                                                            fill_value, v.dtype)])
                              for k, v in graph.edge_data[rel].items()}
    return graph.replace(edges=edges, edge_data=edge_data)


def _nonempty(edge_data: dict) -> dict:
    return {rel: data for rel, data in edge_data.items() if data}


def normalize_features(graph: Graph, name: str = "feat") -> Graph:
    """Scale each node's `name` row to sum 1 (rows of zeros stay zero), as GCN's
    preprocessing of the Planetoid features; float arrays only."""
    if not any(name in arrays for arrays in graph.node_data.values()):
        raise GraphError(f"normalize_features: no node type holds an array {name!r}; the "
                         f"graph has { {t: sorted(a) for t, a in graph.node_data.items()} }")
    node_data = {}
    for ntype, arrays in graph.node_data.items():
        arrays = dict(arrays)
        if name in arrays:
            x = arrays[name]
            # Sparse rows: their stored values are the row's non-zeros.
            arrays[name] = (x.with_values(normalized_rows(x.values))
                            if isinstance(x, SparseRows) else normalized_rows(x))
        node_data[ntype] = arrays
    return graph.replace(node_data=node_data)


def normalized_rows(values) -> np.ndarray:
    """Rows scaled to sum 1 in absolute value (zero rows stay zero), as floats."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.floating):
        values = values.astype(np.float32)
    total = np.abs(values.reshape(values.shape[0], -1)).sum(1).reshape(
        (-1,) + (1,) * (values.ndim - 1))
    return (values / np.where(total == 0, 1, total)).astype(values.dtype)
