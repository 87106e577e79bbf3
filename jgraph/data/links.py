"""Edge splits for link prediction: train/val/test positive edges, and the graph the
model may see.

`split_edges(graph, ...)` holds out a seeded fraction of the edges (per relation) as
validation and test positives and removes them from the graph the model samples, with
their reverse edges when the graph is undirected: an undirected edge is held out as a
pair, both of its directions leave the graph. Apply `symmetrize` or
`add_reverse_relations` to the returned graph, not before: then the reverse of a
held-out edge is never made (a relation's inverse is only ever built from the edges
that remain). Each validation and test positive gets `eval_negatives` fixed negative
destinations, drawn uniformly from the nodes of its destination type (OGB's protocol:
every model is ranked against the same negatives).

Every draw is a hash, not a stream of random numbers: a relation's distinct edges (or
pairs) are ranked by `mix64` of (seed, relation, the edge's unordered pair), then by
their key (a directed graph's two directions of a pair are drawn side by side), the
lowest going to validation, the next to test; a positive's negatives are hashes of
(seed, split, relation, its key, j). So the split depends on the seed and the edges
alone, not on their order, their chunks or how many processes read them: the streamed
preparation of a chunked graph (`jgraph.data.held_out`) draws the same one, bucket by
bucket of hash values.

The rest of the edges are the training positives, once per undirected pair. Each set
lists its positives relation by relation, in the order they were ranked. Self-loops
stay in the graph but are never positives (a node scored against itself says nothing).
Ids are original homogeneous ids (type t's local id i is `type_offsets()[t] + i`);
`jgraph.partition.partition_graph(..., edge_splits=...)` stores them with the
partition, in its ids, so the split is the same on any mesh.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import jgraph.segments as segments
from jgraph.data.graph import Graph, GraphError

EDGE_SPLITS = ("train", "val", "test")


def mix64(*parts) -> np.ndarray:
    """uint64 hash of the integer arrays (or scalars) `parts`, combined in order:
    splitmix64's finaliser after each one, so every bit of every part moves every bit
    of the result. Broadcasts like numpy arithmetic."""
    h = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for part in parts:
            h = np.asarray(h, np.uint64) ^ np.asarray(part).astype(np.uint64)
            h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = h ^ (h >> np.uint64(31))
    return h


def edge_keys(src: np.ndarray, dst: np.ndarray, num_dst, same_type, undirected: bool
              ) -> tuple[np.ndarray, np.ndarray]:
    """(key, pair) int64 of the edges src -> dst (type-local ids): key names the
    positive (the unordered pair where the relation is undirected, else the edge), pair
    the unordered pair (the edge itself between two node types), which the hash ranks
    by. num_dst (the destination type's node count) and same_type (whether the relation
    joins a type to itself) are the relation's, or arrays of each edge's."""
    n = np.maximum(np.asarray(num_dst, np.int64), 1)
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    edge = src * n + dst
    pair = np.where(same_type, np.minimum(src, dst) * n + np.maximum(src, dst), edge)
    return (pair if undirected else edge), pair


def held_out_hash(seed: int, relation: int, pairs: np.ndarray) -> np.ndarray:
    """The hash that ranks a relation's positives (by their `pairs`, `edge_keys`)."""
    return mix64(seed, relation, pairs)


def held_out_order(keys: np.ndarray, pairs: np.ndarray, seed: int, relation: int
                   ) -> np.ndarray:
    """Positions of the distinct `keys` of one relation (with their `pairs`) in the
    order they are held out: validation takes the first, test the next."""
    return np.lexsort((keys, held_out_hash(seed, relation, pairs)))


def check_fractions(val_fraction: float, test_fraction: float, eval_negatives: int) -> None:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1
            and val_fraction + test_fraction < 1):
        raise GraphError(f"edge split fractions val {val_fraction} and test "
                         f"{test_fraction} must be >= 0 and leave edges to train on")
    if eval_negatives < 1:
        raise GraphError(f"eval_negatives must be >= 1, got {eval_negatives}")


def held_out_counts(distinct: int, val_fraction: float, test_fraction: float
                    ) -> tuple[int, int]:
    """(validation, test) positives of a relation with `distinct` keys."""
    return int(round(val_fraction * distinct)), int(round(test_fraction * distinct))


def fixed_negatives(keys: np.ndarray, count: int, num_dst: int, seed: int, split: int,
                    relation: int) -> np.ndarray:
    """int64[k, count] negative destinations (type-local, uniform over `num_dst`) of the
    positives `keys` of one relation and split: hashes of the key, not draws."""
    j = np.arange(count, dtype=np.uint64)[None, :]
    h = mix64(seed, split, relation, np.asarray(keys)[:, None], j)
    return (h % np.uint64(max(num_dst, 1))).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class EdgeSet:
    """n positive edges in original homogeneous ids.

    src, dst: int64[n]; etype: int32[n], the relation's index in `graph.relations`;
    negatives: int64[n, K] fixed negative destinations of each positive (of its
    destination's type), or None (training positives draw theirs in the step).
    """

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    negatives: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.src.size)


@dataclasses.dataclass(frozen=True, eq=False)
class LinkSplit:
    """graph: the graph without the validation and test edges (nor their reverses);
    edges: {"train", "val", "test"} -> `EdgeSet`; undirected: whether edges were split
    as unordered pairs."""

    graph: Graph
    edges: dict
    undirected: bool


def is_symmetric(graph: Graph) -> bool:
    """Whether every same-type relation holds the reverse of each of its edges."""
    for rel, index in graph.edges.items():
        if rel.src_type != rel.dst_type:
            return False
        n = graph.num_nodes[rel.dst_type]
        forward = segments.distinct(index[0] * n + index[1])
        backward = segments.distinct(index[1] * n + index[0])
        if forward.size != backward.size or not np.array_equal(forward, backward):
            return False
    return True


def split_edges(graph: Graph, val_fraction: float = 0.1, test_fraction: float = 0.1, *,
                eval_negatives: int = 1000, seed: int = 0, undirected: bool = False
                ) -> LinkSplit:
    """Hold out `val_fraction` and `test_fraction` of each relation's positives (see
    the module doc). undirected: split the edges of same-type relations as unordered
    pairs (a symmetric graph, or one about to be symmetrised)."""
    check_fractions(val_fraction, test_fraction, eval_negatives)
    if not graph.edges:
        raise GraphError(f"graph {graph.name!r} has no relations, so no edges to split")
    offsets = dict(zip(graph.node_types, graph.type_offsets().tolist()))
    kept_edges, kept_data = {}, {}
    parts = {name: [] for name in EDGE_SPLITS}
    for r, (rel, index) in enumerate(graph.edges.items()):
        n_dst = graph.num_nodes[rel.dst_type]
        same_type = rel.src_type == rel.dst_type
        # One key per positive: the unordered pair for undirected relations.
        key, pair = edge_keys(index[0], index[1], n_dst, same_type, undirected)
        candidate = index[0] != index[1] if same_type else np.ones(index.shape[1], bool)
        keys, first = np.unique(key[candidate], return_index=True)
        first = np.flatnonzero(candidate)[first]
        order = held_out_order(keys, pair[first], seed, r)
        n_val, n_test = held_out_counts(keys.size, val_fraction, test_fraction)
        held = {"val": order[:n_val], "test": order[n_val:n_val + n_test],
                "train": order[n_val + n_test:]}
        gone = np.isin(key, keys[order[:n_val + n_test]])
        keep = np.flatnonzero(~gone)
        kept_edges[rel] = index[:, keep]
        data = {k: v[keep] for k, v in graph.edge_data.get(rel, {}).items()}
        if data:
            kept_data[rel] = data
        for s, (name, at) in enumerate(held.items()):
            pos = first[at]                 # positives in the order they were ranked
            negatives = None
            if name != "train":
                negatives = offsets[rel.dst_type] + fixed_negatives(
                    keys[at], eval_negatives, n_dst, seed, s, r)
            parts[name].append((index[0, pos] + offsets[rel.src_type],
                                index[1, pos] + offsets[rel.dst_type],
                                np.full(pos.size, r, np.int32), negatives))
    def cat(pieces: list, dtype, empty=(0,)) -> np.ndarray:
        return np.concatenate(pieces).astype(dtype) if pieces else np.zeros(empty, dtype)
    edges = {}
    for name in EDGE_SPLITS:
        src, dst, etype, negatives = zip(*parts[name]) if parts[name] else ([],) * 4
        edges[name] = EdgeSet(cat(src, np.int64), cat(dst, np.int64), cat(etype, np.int32),
                              None if name == "train"
                              else cat(negatives, np.int64, (0, eval_negatives)))
    if not len(edges["train"]):
        raise GraphError(f"graph {graph.name!r}: no training edges are left after the split")
    return LinkSplit(graph.replace(edges=kept_edges, edge_data=kept_data), edges, undirected)
