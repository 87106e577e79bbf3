"""The partitioned graph's numbering and each partition's arrays computed in memory,
whole: the reference the written directories (`jgraph.partition.chunked`, which both
`partition_graph` and `jgraph partition` write by) are compared with in the tests.

Nodes are sorted by (partition, original homogeneous id). Since the original ids number
the node types one after another, each partition's range holds its nodes type by type,
and within a type in original order. Edges are sorted by (destination, relation,
source) in the new ids, so each partition's in-edges are one slice and its CSC is that
slice's destinations.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jgraph.data.graph import Graph
from jgraph.data.links import EdgeSet
from jgraph.data.sparse import SparseRows
from jgraph.partition.numbering import owner_of, part_info, ranges_of
from jgraph.partition.store import PartInfo


def split_pieces(new_ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """A split's new ids as each partition holds them: int64, sorted, one array a
    partition."""
    ids = np.sort(np.asarray(new_ids, np.int64))
    cuts = np.searchsorted(ids, offsets)
    return [ids[cuts[k]:cuts[k + 1]] for k in range(offsets.size - 1)]


class Relabelling(NamedTuple):
    """The new node ids. N nodes, P partitions, T node types.

    node_map: int64[N] new id -> original homogeneous id; inverse: int64[N] original ->
    new; counts: int64[P, T] nodes of each type in each partition; offsets: int64[P + 1]
    partition k owns the new ids [offsets[k], offsets[k + 1]); ntype_offsets:
    int64[P, T + 1] the same per type within each partition; orig_offsets: int64[T + 1]
    the original numbering's type offsets.
    """

    node_map: np.ndarray
    inverse: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    ntype_offsets: np.ndarray
    orig_offsets: np.ndarray


def relabel(graph: Graph, parts: np.ndarray, num_parts: int) -> Relabelling:
    """The numbering of `graph` whose nodes `parts` (int[N], original homogeneous ids)
    assigns to `num_parts` partitions."""
    node_map = np.argsort(parts, kind="stable").astype(np.int64)
    inverse = np.empty_like(node_map)
    inverse[node_map] = np.arange(node_map.size)
    num_types = len(graph.node_types)
    counts = np.bincount(parts.astype(np.int64) * num_types + graph.node_type_ids(),
                         minlength=num_parts * num_types).reshape(num_parts, num_types)
    offsets, ntype_offsets = ranges_of(counts)
    return Relabelling(node_map, inverse, counts, offsets, ntype_offsets,
                       np.asarray(graph.type_offsets(), np.int64))


class Edges(NamedTuple):
    """The graph's edges in new ids, sorted by (destination, relation, source). E edges.

    src, dst: int64[E]; etype: int[E] relation index; order: int64[E] each edge's
    position in the original homogeneous edge order (its edge id); bounds: int64[P + 1]
    partition k's in-edges are [bounds[k], bounds[k + 1]); cut: the fraction of edges
    whose ends lie in different partitions.
    """

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    order: np.ndarray
    bounds: np.ndarray
    cut: float


def relabel_edges(graph: Graph, parts: np.ndarray, relabelling: Relabelling) -> Edges:
    src, dst, etype = graph.homogeneous_edges()
    cut = float(np.mean(parts[src] != parts[dst])) if src.size else 0.0
    new_src, new_dst = relabelling.inverse[src], relabelling.inverse[dst]
    del src, dst
    order = np.lexsort((new_src, etype, new_dst))
    new_dst = new_dst[order]
    return Edges(new_src[order], new_dst, etype[order], order.astype(np.int64),
                 np.searchsorted(new_dst, relabelling.offsets), cut)


class Part(NamedTuple):
    """What partition k's directory holds (`jgraph.partition.store` names the files).
    n = its nodes, e = its in-edges.

    indptr: int64[n + 1] CSC over its nodes (local destination index); indices:
    int64[e] global new source ids; etype: int[e]; edge_ids: int64[e] original edge ids;
    halo: int64[h] the distinct sources owned by other partitions; edge_data: name ->
    [e, ...]; node_data: (node type, name) -> rows of its nodes of that type, in new-id
    order (arrays or `SparseRows`); splits: node type -> split name -> sorted new ids
    it owns; info: its `PartInfo` for meta.json.
    """

    indptr: np.ndarray
    indices: np.ndarray
    etype: np.ndarray
    edge_ids: np.ndarray
    halo: np.ndarray
    edge_data: dict[str, np.ndarray]
    node_data: dict[tuple[str, str], np.ndarray | SparseRows]
    splits: dict[str, dict[str, np.ndarray]]
    edge_splits: dict[str, dict[str, np.ndarray]]
    info: PartInfo


def edge_split_part(edge_set: EdgeSet, relabelling: Relabelling, k: int) -> dict:
    """The positives of `edge_set` whose destination partition k owns, in new ids and
    in their order in the set: eid int64 (the position in the set, which keys the
    loader's shuffle on any mesh), src, dst int64, etype int32, and negatives int64[.,
    K] for evaluation sets."""
    r = relabelling
    dst = r.inverse[edge_set.dst]
    eid = np.flatnonzero(owner_of(r.offsets, dst) == k).astype(np.int64)
    out = {"eid": eid, "src": r.inverse[edge_set.src[eid]], "dst": dst[eid],
           "etype": edge_set.etype[eid].astype(np.int32)}
    if edge_set.negatives is not None:
        out["negatives"] = r.inverse[edge_set.negatives[eid]]
    return out


def split_parts(graph: Graph, relabelling: Relabelling) -> dict[str, dict[str, list]]:
    """{type: {split: its new ids in each partition}} (`split_pieces`)."""
    r = relabelling
    return {ntype: {name: split_pieces(r.inverse[r.orig_offsets[graph.node_types.index(ntype)]
                                                 + idx], r.offsets)
                    for name, idx in named.items()}
            for ntype, named in graph.splits.items()}


def part(graph: Graph, relabelling: Relabelling, edges: Edges,
         edge_data: dict[str, np.ndarray], k: int,
         edge_splits: dict[str, EdgeSet] | None = None,
         splits: dict[str, dict[str, list]] | None = None) -> Part:
    """Partition k's arrays. edge_data: the graph's edge arrays in homogeneous order;
    edge_splits: link prediction's positive edges by split (`jgraph.data.links`);
    splits: `split_parts(graph, relabelling)`, computed here if not given."""
    r = relabelling
    lo, hi = int(r.offsets[k]), int(r.offsets[k + 1])
    e0, e1 = int(edges.bounds[k]), int(edges.bounds[k + 1])
    indptr = np.searchsorted(edges.dst[e0:e1], np.arange(lo, hi + 1)).astype(np.int64)
    sources = edges.src[e0:e1]
    halo = np.unique(sources[(sources < lo) | (sources >= hi)])
    edge_ids = edges.order[e0:e1]
    node_data = {}
    for t, ntype in enumerate(graph.node_types):
        # Original type-local ids of this part's nodes of type t, in new-id order.
        rows = r.node_map[r.ntype_offsets[k, t]:r.ntype_offsets[k, t + 1]] - r.orig_offsets[t]
        for name, values in graph.node_data.get(ntype, {}).items():
            node_data[ntype, name] = values[rows]
    splits = {ntype: {name: pieces[k] for name, pieces in named.items()}
              for ntype, named in (splits or split_parts(graph, r)).items()}
    positives = {name: edge_split_part(edge_set, r, k)
                 for name, edge_set in (edge_splits or {}).items()}
    info = part_info(graph.node_types, r.counts, r.offsets, k, num_edges=e1 - e0, halo=halo,
                     splits={t: {name: int(ids.size) for name, ids in named.items()}
                             for t, named in splits.items()},
                     edge_splits={name: int(arrays["eid"].size)
                                  for name, arrays in positives.items()})
    return Part(indptr, sources, edges.etype[e0:e1], edge_ids, halo,
                {name: values[edge_ids] for name, values in edge_data.items()},
                node_data, splits, positives, info)


def homogeneous_edge_data(graph: Graph) -> dict[str, np.ndarray]:
    """Edge data laid end to end over the relations (the homogeneous edge order)."""
    names = sorted({k for data in graph.edge_data.values() for k in data})
    return {name: np.concatenate([graph.edge_data[rel][name] for rel in graph.relations])
            for name in names}
