"""The data preparation of a chunked graph directory, streamed: a graph larger than
memory gets the same steps as one in memory (`jgraph.data.prepare`), in bounded memory.

`prepare_chunked(source, out, preparation)` reads `source` a block of edges at a time and
writes the prepared graph as another chunked directory, `out`:

- held_out (link prediction): drawn first through buckets of hash ranges
  (`jgraph.data.held_out`), its positives written as the graph's edge splits; then every
  block's held-out edges leave it by one comparison each.
- remove_self_loops, reverse_relations: per block (a reversed edge carries its edge's
  data, relation rev_<name> after the others, as `add_reverse_relations`).
- symmetrize and dedup: every edge (and, to symmetrize, its reverse) goes to a bucket
  file of its destination's node range, sized from the in-degrees counted in a first
  pass so no bucket holds more than `bucket_edges` edges (a node with more in-edges has
  a bucket of its own); each bucket is then sorted on its own and keeps the first
  occurrence of every (relation, source, destination), as the in-memory transform
  keeps the first in edge order (its data with it).
- self_loops: a flag per node of each same-type relation, set from the written edges;
  the nodes without one get theirs at the end.
- normalize_features: the array's rows scaled chunk by chunk.

Node arrays are copied chunk by chunk and checked as they pass (NaN, infinity, labels
below -1 are refused, naming the array and the node), splits and user ids copied.
Memory: O(nodes) counters and flags, plus a block of edges or one bucket. The edges come
out grouped by relation only within a chunk and by bucket across chunks: the same edges
and data as in memory, not in the same order (the held-out positives come in the same
order). Edge splits drawn before are copied.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

import jgraph.segments as segments
from jgraph.atomic import scratch_beside
from jgraph.data.buckets import BucketFiles, EdgeBlock
from jgraph.data.chunked import ChunkedGraph, ChunkedWriter, open_chunked
from jgraph.data.graph import GraphError, Relation
from jgraph.data.held_out import Cut, draw
from jgraph.data.prepare import Preparation, recorded_preparation
from jgraph.data.sparse import SparseRows
from jgraph.data.transforms import normalized_rows
from jgraph.progress import Progress

BLOCK_EDGES = 1 << 23
BUCKET_EDGES = 1 << 25
# A held-out bucket's edges each carry keys, a hash and sort orders besides the edge
# (about 100 bytes an edge at the peak): smaller buckets.
HELD_OUT_BUCKET_EDGES = 1 << 23


def prepare_chunked(source: str | os.PathLike, out: str | os.PathLike,
                    preparation: Preparation, *, overwrite: bool = False,
                    progress: Progress | None = None, block_edges: int = BLOCK_EDGES,
                    bucket_edges: int = BUCKET_EDGES, rows_per_chunk: int = 1 << 20) -> None:
    """Write the chunked graph at `source`, prepared as `preparation` asks, to `out`
    (see the module doc). `out` records what was done to the graph: the source's own
    record, then `preparation`."""
    progress = progress or Progress(enabled=False)
    graph = open_chunked(source)
    p = preparation
    done = recorded_preparation(graph.root).then(p)
    relations = list(graph.relations)
    if p.symmetrize:
        mixed = [tuple(r) for r in relations if r.src_type != r.dst_type]
        if mixed:
            raise GraphError(f"cannot symmetrize relation {mixed[0]}: its source and "
                             f"destination types differ; use add_reverse_relations instead")
    if p.reverse_relations:
        names = {r.name for r in relations}
        for r in graph.relations:
            rev = Relation(r.dst_type, "rev_" + r.name, r.src_type)
            if rev.name in names:
                raise GraphError(f"cannot add reverse relation {tuple(rev)}: a relation with "
                                 f"that name exists already")
            relations.append(rev)
    if p.self_loops:
        with_data = [tuple(r) for r in relations if r.src_type == r.dst_type]
        if graph.edge_data and with_data:
            raise GraphError(f"relation {with_data[0]} has edge data {sorted(graph.edge_data)}: "
                             f"self-loops added to a chunked graph would need a value for it")
    _check_feature(graph, p.normalize_features)
    with ChunkedWriter(out, graph.num_nodes, name=graph.name, relations=relations,
                       overwrite=overwrite, preparation=done.to_json()) as w:
        job = _Edges(graph, p, w, block_edges, progress)
        if p.held_out is not None:
            with scratch_beside(w.out, "held-out") as scratch:
                job.cut = draw(graph, p.held_out, p.symmetrize, w, scratch,
                               block_edges=block_edges,
                               bucket_edges=min(bucket_edges, HELD_OUT_BUCKET_EDGES),
                               progress=progress)
        _copy_edge_splits(graph, w)
        if p.symmetrize or p.dedup:
            job.bucketed(bucket_edges)
        else:
            job.streamed()
        if p.self_loops:
            job.self_loops()
        _copy_nodes(graph, w, p.normalize_features, rows_per_chunk)


@contextlib.contextmanager
def prepared(source: str | os.PathLike, preparation: Preparation, beside: str, *,
             progress: Progress | None = None) -> Iterator[str]:
    """The chunked graph at `source` prepared as `preparation`, written into a scratch
    folder beside `beside` (the output it is for) and removed when the block ends; or
    `source` itself where nothing is asked."""
    if not preparation.steps:
        yield os.fspath(source)
        return
    with scratch_beside(beside, "prepared") as folder:
        out = os.path.join(folder, "graph")
        with (progress or Progress(enabled=False)).phase(
                f"preparing ({', '.join(preparation.steps)})"):
            prepare_chunked(source, out, preparation, progress=progress)
        yield out


def _check_feature(graph: ChunkedGraph, name: str | None) -> None:
    if name and not any(name in named for named in graph.node_data.values()):
        raise GraphError(f"{graph.root}: normalize_features: no node type holds an array "
                         f"{name!r}; the graph has "
                         f"{ {t: sorted(named) for t, named in graph.node_data.items()} }")


class _Edges:
    """The edge steps of one preparation, from `graph` into the writer `w`."""

    def __init__(self, graph: ChunkedGraph, p: Preparation, w: ChunkedWriter,
                 block_edges: int, progress: Progress):
        self.graph, self.p, self.w = graph, p, w
        self.block_edges, self.progress = block_edges, progress
        self.num_relations = len(graph.relations)
        self.offsets = dict(zip(graph.node_types, graph.type_offsets().tolist()))
        self.cut: Cut | None = None         # the held-out edges, once drawn
        self.loops = ({k: np.zeros(graph.num_nodes[r.src_type], bool)
                       for k, r in enumerate(w.relations) if r.src_type == r.dst_type}
                      if p.self_loops else {})

    def blocks(self):
        """The prepared edges, a block of input edges at a time (before deduplication)."""
        g, p, E = self.graph, self.p, self.graph.num_edges
        count = sum(-(-rows // self.block_edges) for rows in g.edges["src"].rows)
        for i, rows, chunk in self.progress.iterate(g.edge_blocks(self.block_edges),
                                                    "preparing edges", count):
            data = {name: np.asarray(g.load(c.files[i])[rows])
                    for name, c in g.edge_data.items()}
            b = EdgeBlock(chunk.src, chunk.dst, chunk.etype,
                       chunk.start + np.arange(chunk.src.size, dtype=np.int64), data)
            if p.remove_self_loops:
                b = b.take(np.flatnonzero(b.src != b.dst))
            if self.cut is not None:
                b = b.take(np.flatnonzero(~self.cut.held(b.src, b.dst, b.etype)))
            if p.symmetrize:        # the reverses follow every edge, as in memory
                b = EdgeBlock.cat([b, EdgeBlock(b.dst, b.src, b.etype, b.pos + E, b.data)])
            if p.reverse_relations:
                b = EdgeBlock.cat([b, EdgeBlock(b.dst, b.src, b.etype + self.num_relations,
                                          b.pos, b.data)])
            yield b

    def write(self, b: EdgeBlock) -> None:
        if not b.src.size:
            return
        for k, flags in self.loops.items():
            on = (b.etype == k) & (b.src == b.dst)
            flags[b.src[on] - self.offsets[self.w.relations[k].src_type]] = True
        self.w.add_edges(b.src, b.dst, etype=b.etype, data=b.data)

    def streamed(self) -> None:
        for b in self.blocks():
            self.write(b)

    def bucketed(self, bucket_edges: int) -> None:
        """Deduplicated through dst-range buckets on disk (see the module doc)."""
        bounds = self._bucket_bounds(bucket_edges)
        with scratch_beside(self.w.out, "buckets") as scratch:
            files = BucketFiles(scratch, {name: (c.dtype, c.shape)
                                          for name, c in self.graph.edge_data.items()})
            for b in self.blocks():
                files.scatter(segments.segment_of(bounds, b.dst), len(bounds) - 1, b)
            for k in self.progress.iterate(range(len(bounds) - 1), "deduplicating",
                                           len(bounds) - 1):
                b = files.read(k)
                # The first of each (relation, dst, src) in edge order.
                order = np.lexsort((b.pos, b.src, b.dst, b.etype))
                b = b.take(order)
                first = np.ones(b.src.size, bool)
                first[1:] = ((b.etype[1:] != b.etype[:-1]) | (b.dst[1:] != b.dst[:-1])
                             | (b.src[1:] != b.src[:-1]))
                self.write(b.take(np.flatnonzero(first)))

    def _bucket_bounds(self, bucket_edges: int) -> np.ndarray:
        """int64[B + 1] destination ranges holding at most `bucket_edges` prepared edges
        each (a node with more holds a range of its own): a first pass of in-degrees."""
        degree = np.zeros(self.graph.total_nodes, np.int64)
        for b in self.blocks():
            degree += np.bincount(b.dst, minlength=degree.size)
        return segments.range_bounds(degree, bucket_edges)

    def self_loops(self) -> None:
        """A self-loop for every node of a same-type relation that has none yet."""
        for k, flags in self.loops.items():
            start = self.offsets[self.w.relations[k].src_type]
            missing = np.flatnonzero(~flags)
            for a in range(0, missing.size, self.block_edges):
                ids = start + missing[a:a + self.block_edges]
                self.w.add_edges(ids, ids, etype=np.full(ids.size, k, np.int32))


def _copy_edge_splits(graph: ChunkedGraph, w: ChunkedWriter) -> None:
    """Held-out edges drawn before, chunk by chunk as they are."""
    for name, arrays in graph.edge_splits.items():
        for i in range(len(arrays["src"].files)):
            w.add_edge_split(name, *(graph.load(arrays[key].files[i])
                                     for key in ("src", "dst", "etype")),
                             graph.load(arrays["negatives"].files[i])
                             if "negatives" in arrays else None)


def _copy_nodes(graph: ChunkedGraph, w: ChunkedWriter, normalize: str | None,
                rows_per_chunk: int) -> None:
    """Node arrays (checked as written; `normalize` scaled), splits and user ids."""
    for t, named in graph.node_data.items():
        for name, c in named.items():
            for a in range(0, max(c.num_rows, 1), rows_per_chunk):
                ids = np.arange(a, min(a + rows_per_chunk, c.num_rows))
                rows = graph.node_rows(t, name, ids)
                if name == normalize:
                    rows = (rows.with_values(normalized_rows(rows.values))
                            if isinstance(rows, SparseRows) else normalized_rows(rows))
                w.add_node_data(name, rows, ntype=t)
    for t, named in graph.splits.items():
        for name in named:
            w.add_split(name, graph.split(t, name), ntype=t)
    for t in graph.node_types:
        ids = graph.node_ids(t)
        if ids is not None:
            w.add_ids(ids, ntype=t)
