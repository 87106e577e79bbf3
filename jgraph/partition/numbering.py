"""What a partition directory says of its numbering (`jgraph.partition.chunked` writes
every partition directory, `partition_graph`'s included): the partitions' id ranges,
which partition owns an id, each partition's facts, and meta.json.

New ids number the nodes partition by partition, and within a partition type by type,
each type's nodes in original order. The job counts the nodes of each type in each
partition (`counts` int64[P, T]) and derives the rest here.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import jgraph.segments as segments
from jgraph.partition.adjacency import bucket_of
from jgraph.partition.store import FORMAT_VERSION, PartInfo, PartitionMeta


def ranges_of(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[P + 1]: partition k owns the new ids [offsets[k], offsets[k + 1]);
    ntype_offsets int64[P, T + 1]: the same per type within each partition) of the
    node counts `counts` int64[P, T]."""
    counts = np.asarray(counts, np.int64)
    offsets = segments.offsets(counts.sum(axis=1))
    ntype_offsets = offsets[:-1, None] + segments.offsets(counts, axis=1)
    return offsets, ntype_offsets


def owner_of(offsets: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """The partition owning each new id (uint16 where there are few enough)."""
    return bucket_of(offsets, new_ids)


def part_info(node_types: Sequence[str], counts: np.ndarray, offsets: np.ndarray, k: int,
              *, num_edges: int, halo: np.ndarray,
              splits: dict[str, dict[str, int]] | None = None,
              edge_splits: dict[str, int] | None = None) -> PartInfo:
    """meta.json's entry for partition k: `halo` its halo (new ids), `splits` {type:
    {split: ids it holds}}, `edge_splits` {split: positives whose destination it owns}
    (none where not given)."""
    return PartInfo(
        num_nodes=int(offsets[k + 1] - offsets[k]),
        num_nodes_per_type=dict(zip(node_types, np.asarray(counts[k]).tolist())),
        num_edges=int(num_edges),
        num_halo=int(halo.size),
        splits=splits or {},
        edge_splits=edge_splits or {},
        halo_by_owner=np.bincount(owner_of(offsets, halo),
                                  minlength=offsets.size - 1).tolist())


def partition_meta(graph, counts: np.ndarray, parts: list[PartInfo], *, method: str,
                   **facts) -> PartitionMeta:
    """meta.json of a partition of `graph` (a `Graph` or a `ChunkedGraph`: what both
    say of themselves is read here) whose partitions hold `counts` nodes of each type;
    `facts`: the rest of `PartitionMeta`'s fields, which only the route knows (cut,
    balance, seed, seconds, array specs, ...)."""
    offsets, ntype_offsets = ranges_of(counts)
    return PartitionMeta(
        format_version=FORMAT_VERSION,
        graph_name=graph.name,
        num_parts=len(parts),
        method=method,
        node_types=list(graph.node_types),
        relations=[list(r) for r in graph.relations],
        num_nodes=int(graph.total_nodes),
        num_edges=int(graph.num_edges),
        num_nodes_per_type=dict(graph.num_nodes),
        offsets=offsets.tolist(),
        ntype_offsets=ntype_offsets.tolist(),
        orig_type_offsets=np.asarray(graph.type_offsets(), np.int64).tolist(),
        splits={t: list(named) for t, named in graph.splits.items() if named},
        parts=parts,
        **facts)
