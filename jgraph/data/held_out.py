"""Link prediction's held-out edges drawn from a chunked graph, streamed: the split that
`jgraph.data.links.split_edges` draws in memory (the same positives, in the same order,
with the same negatives), in memory bounded by a bucket of edges.

Every candidate edge (not a self-loop) of relation r goes to a bucket file of a range of
its hash (`links.held_out_hash`): r's buckets split [0, 2^64) into B_r equal ranges, B_r
from r's edge count and `bucket_edges` (the hashes are uniform, so the buckets are alike
in size), so reading r's buckets in order reads its keys in the order they are ranked.
Two passes over the buckets follow:

1. each bucket's distinct keys are counted, as unordered pairs and as directed edges. The
   graph is symmetric (`links.is_symmetric`) when every relation joins a type to itself
   and has twice as many directed edges as pairs; then (or when it is about to be
   symmetrised) a positive is a pair.
2. a relation's key of rank i (its bucket's first rank plus its place in the sorted
   bucket) goes to validation, test or training as in memory, with the direction of its
   first edge and, for evaluation, its negatives. The chunks go to the graph being
   written in that order.

What leaves the graph is then one comparison per edge (`Cut.held`): an edge is held out
when its (hash, key) is below its relation's cut, the (hash, key) of its first training
positive.

Memory: a bucket of edges, with its keys and sort orders (some 100 bytes an edge). The
buckets are alike in size because distinct pairs hash uniformly; the repeats of one
pair (a multigraph's) share a bucket, so a pair repeated millions of times makes its
bucket that much larger.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import jgraph.segments as segments
from jgraph.data.buckets import BucketFiles, EdgeBlock
from jgraph.data.chunked import ChunkedGraph, ChunkedWriter
from jgraph.data.graph import GraphError
from jgraph.data.links import (
    EDGE_SPLITS,
    check_fractions,
    edge_keys,
    fixed_negatives,
    held_out_counts,
    held_out_hash,
)
from jgraph.data.prepare import HeldOut
from jgraph.progress import Progress

# Negatives drawn (and written as one chunk) at a time.
NEGATIVES_AT_ONCE = 1 << 22


@dataclasses.dataclass(frozen=True)
class Relations:
    """What the keys of each relation's edges need, per relation index: its source and
    destination types' first homogeneous ids, the destination type's node count, and
    whether it joins a type to itself."""

    src_offset: np.ndarray
    dst_offset: np.ndarray
    num_dst: np.ndarray
    same_type: np.ndarray

    @classmethod
    def of(cls, graph: ChunkedGraph) -> Relations:
        offsets = dict(zip(graph.node_types, graph.type_offsets().tolist()))
        rels = graph.relations
        return cls(np.array([offsets[r.src_type] for r in rels], np.int64),
                   np.array([offsets[r.dst_type] for r in rels], np.int64),
                   np.array([graph.num_nodes[r.dst_type] for r in rels], np.int64),
                   np.array([r.src_type == r.dst_type for r in rels], bool))

    def keys(self, src, dst, etype, undirected: bool) -> tuple[np.ndarray, np.ndarray]:
        """(key, pair) of edges in homogeneous ids (`links.edge_keys`)."""
        return edge_keys(src - self.src_offset[etype], dst - self.dst_offset[etype],
                         self.num_dst[etype], self.same_type[etype], undirected)


@dataclasses.dataclass(frozen=True)
class Cut:
    """Which edges a drawn split takes out of the graph: per relation, the (hash, key)
    of its first training positive, or `every` where it has none."""

    held_out: HeldOut
    undirected: bool
    relations: Relations
    hash: np.ndarray
    key: np.ndarray
    every: np.ndarray

    def held(self, src: np.ndarray, dst: np.ndarray, etype: np.ndarray) -> np.ndarray:
        """bool[e]: whether each edge (homogeneous ids) is a held-out positive or one of
        its pair."""
        key, pair = self.relations.keys(src, dst, etype, self.undirected)
        h = held_out_hash(self.held_out.seed, etype, pair)
        cut_h, cut_k = self.hash[etype], self.key[etype]
        below = (h < cut_h) | ((h == cut_h) & (key < cut_k)) | self.every[etype]
        return below & (src != dst)


def draw(graph: ChunkedGraph, held_out: HeldOut, symmetrize: bool, w: ChunkedWriter,
         scratch: str, *, block_edges: int, bucket_edges: int, progress: Progress) -> Cut:
    """Draw the split of `graph`'s edges (made undirected where `symmetrize`), writing
    its positives into `w` (`ChunkedWriter.add_edge_split`), through bucket files under
    `scratch`; the cut that takes them out of the graph (see the module doc)."""
    h = held_out
    check_fractions(h.val_fraction, h.test_fraction, h.eval_negatives)
    relations = Relations.of(graph)
    per_relation = np.maximum(1, -(-_relation_edges(graph) // bucket_edges))
    first = segments.offsets(per_relation)
    relation_of = segments.segment_ids(per_relation)
    files = BucketFiles(scratch)
    count = sum(-(-rows // block_edges) for rows in graph.edges["src"].rows)
    for _, _, chunk in progress.iterate(graph.edge_blocks(block_edges),
                                        "holding out edges", count):
        on = np.flatnonzero(chunk.src != chunk.dst)         # self-loops are never positives
        b = EdgeBlock(chunk.src[on], chunk.dst[on], chunk.etype[on], chunk.start + on, {})
        _, pair = relations.keys(b.src, b.dst, b.etype, True)
        hashed = held_out_hash(h.seed, b.etype, pair)
        # The bucket of each hash's range: floor(hash / 2^64 * B_r), monotone in the hash.
        within = ((hashed >> np.uint64(32)) * per_relation[b.etype].astype(np.uint64)
                  ) >> np.uint64(32)
        files.scatter(first[b.etype] + within.astype(np.int64), int(first[-1]), b)
    buckets = range(int(first[-1]))
    pairs, edges = np.zeros((2, len(buckets)), np.int64)
    for k in progress.iterate(buckets, "counting held-out candidates", len(buckets)):
        b = files.read(k)
        key, pair = relations.keys(b.src, b.dst, b.etype, False)
        pairs[k], edges[k] = _distinct(pair), _distinct(key)
    per_pairs = np.add.reduceat(pairs, first[:-1])
    per_edges = np.add.reduceat(edges, first[:-1])
    undirected = symmetrize or bool(relations.same_type.all()
                                    and np.array_equal(per_edges, 2 * per_pairs))
    distinct = pairs if undirected else edges
    totals = np.add.reduceat(distinct, first[:-1])
    # Each bucket's first rank among its relation's keys.
    before = segments.exclusive_sum(distinct)
    rank0 = before - before[first[:-1]][relation_of]
    counts = [held_out_counts(int(c), h.val_fraction, h.test_fraction) for c in totals]
    cut_hash = np.zeros(per_relation.size, np.uint64)
    cut_key = np.zeros(per_relation.size, np.int64)
    every = np.array([v + t >= c for (v, t), c in zip(counts, totals)], bool)
    written = dict.fromkeys(EDGE_SPLITS, 0)
    for k in progress.iterate(buckets, "writing held-out edges", len(buckets)):
        r = int(relation_of[k])
        b = files.read(k)
        key, pair = relations.keys(b.src, b.dst, b.etype, undirected)
        at, hashed = _ranked_firsts(key, pair, b.pos, h.seed, r)
        key = key[at]
        rank = rank0[k] + np.arange(at.size)
        n_val, n_test = counts[r]
        held = n_val + n_test
        if rank0[k] <= held < rank0[k] + at.size:
            cut_hash[r], cut_key[r] = hashed[held - rank0[k]], key[held - rank0[k]]
        for s, (name, sel) in enumerate(zip(("val", "test", "train"),
                                            (rank < n_val, (rank >= n_val) & (rank < held),
                                             rank >= held))):
            if not sel.any():
                continue
            e, keys = at[sel], key[sel]
            # Evaluation positives a slice at a time: K negatives each.
            step = e.size if name == "train" else max(1, NEGATIVES_AT_ONCE // h.eval_negatives)
            for a in range(0, e.size, step):
                part = e[a:a + step]
                negatives = None if name == "train" else relations.dst_offset[r] + \
                    fixed_negatives(keys[a:a + step], h.eval_negatives,
                                    int(relations.num_dst[r]), h.seed, s, r)
                w.add_edge_split(name, b.src[part], b.dst[part],
                                 np.full(part.size, r, np.int32), negatives)
            written[name] += int(e.size)
    if not written["train"]:
        raise GraphError(f"graph {graph.name!r}: no training edges are left after the split")
    for name in (name for name, n in written.items() if not n):   # there, and empty
        w.add_edge_split(name, *np.zeros((3, 0), np.int64),
                         None if name == "train" else np.zeros((0, h.eval_negatives), np.int64))
    return Cut(held_out, undirected, relations, cut_hash, cut_key, every)


def _distinct(values: np.ndarray) -> int:
    """How many distinct values (a sort: numpy's hashing unique is slower at this size)."""
    s = np.sort(values)
    return int(s.size and np.count_nonzero(s[1:] != s[:-1]) + 1)


def _ranked_firsts(key: np.ndarray, pair: np.ndarray, pos: np.ndarray, seed: int,
                   relation: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions of each distinct key's first edge (lowest `pos`; a bucket holds its
    edges in edge order), ordered by (hash of the pair, key); those hashes)."""
    if not key.size:                        # a relation with no candidate in this range
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    if pos.size > 1 and not (pos[1:] > pos[:-1]).all():
        raise RuntimeError("a held-out bucket's edges are out of edge order")
    order = np.argsort(key)
    sorted_keys = key[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]))
    # Positions follow the edge order, so a key's first edge has its lowest position.
    at = np.minimum.reduceat(order, starts) if starts.size else np.zeros(0, np.int64)
    hashed = held_out_hash(seed, relation, pair[at])
    ranked = np.argsort(hashed)             # keys ascending, so ties (improbable) by key:
    if (hashed[ranked][1:] == hashed[ranked][:-1]).any():
        ranked = np.lexsort((sorted_keys[starts], hashed))
    return at[ranked], hashed[ranked]


def _relation_edges(graph: ChunkedGraph) -> np.ndarray:
    """int64[R]: each relation's edge count, from the etype chunks alone."""
    r = len(graph.relations)
    if "etype" not in graph.edges:
        return np.array([graph.num_edges], np.int64)
    total = np.zeros(r, np.int64)
    for f in graph.edges["etype"].files:
        etype = graph.load(f)
        for a in range(0, etype.size, 1 << 24):
            total += np.bincount(np.asarray(etype[a:a + (1 << 24)]), minlength=r)[:r]
    return total
