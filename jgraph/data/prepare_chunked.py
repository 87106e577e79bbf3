"""The data preparation of a chunked graph directory, streamed: a graph larger than
memory gets the same steps as one in memory (`jgraph.data.prepare`), in bounded memory.

`prepare_chunked(source, out, preparation)` reads `source` a block of edges at a time and
writes the prepared graph as another chunked directory, `out`:

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
and data as in memory, not in the same order. Held-out link prediction edges are not
drawn on this route (refused by name).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import numpy as np

from jgraph.atomic import scratch_beside
from jgraph.data.chunked import ChunkedGraph, ChunkedWriter, open_chunked
from jgraph.data.graph import GraphError, Relation
from jgraph.data.prepare import Preparation, recorded_preparation
from jgraph.data.sparse import SparseRows
from jgraph.data.transforms import normalized_rows
from jgraph.progress import Progress

BLOCK_EDGES = 1 << 23
BUCKET_EDGES = 1 << 25


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
    if p.held_out is not None:
        raise GraphError(f"{graph.root}: link prediction's held-out edges are not drawn on "
                         f"the streamed route; load the graph whole (--method metis, "
                         f"data.method: metis)")
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


@dataclasses.dataclass
class _Block:
    """Edges on their way out: homogeneous src, dst (int64), etype (int32), pos (int64:
    the edge's place in the in-memory edge order of its relation, for keeping the first
    of duplicates) and {name: edge data rows}."""

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    pos: np.ndarray
    data: dict

    def take(self, keep: np.ndarray) -> _Block:
        return _Block(self.src[keep], self.dst[keep], self.etype[keep], self.pos[keep],
                      {k: v[keep] for k, v in self.data.items()})

    @staticmethod
    def cat(blocks: list[_Block]) -> _Block:
        return _Block(*(np.concatenate([getattr(b, f) for b in blocks])
                        for f in ("src", "dst", "etype", "pos")),
                      {k: np.concatenate([b.data[k] for b in blocks])
                       for k in blocks[0].data})


class _Edges:
    """The edge steps of one preparation, from `graph` into the writer `w`."""

    def __init__(self, graph: ChunkedGraph, p: Preparation, w: ChunkedWriter,
                 block_edges: int, progress: Progress):
        self.graph, self.p, self.w = graph, p, w
        self.block_edges, self.progress = block_edges, progress
        self.num_relations = len(graph.relations)
        self.offsets = dict(zip(graph.node_types, graph.type_offsets().tolist()))
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
            b = _Block(chunk.src, chunk.dst, chunk.etype,
                       chunk.start + np.arange(chunk.src.size, dtype=np.int64), data)
            if p.remove_self_loops:
                b = b.take(np.flatnonzero(b.src != b.dst))
            if p.symmetrize:        # the reverses follow every edge, as in memory
                b = _Block.cat([b, _Block(b.dst, b.src, b.etype, b.pos + E, b.data)])
            if p.reverse_relations:
                b = _Block.cat([b, _Block(b.dst, b.src, b.etype + self.num_relations,
                                          b.pos, b.data)])
            yield b

    def write(self, b: _Block) -> None:
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
            files = _BucketFiles(scratch, len(bounds) - 1)
            for b in self.blocks():
                which = np.searchsorted(bounds, b.dst, side="right") - 1
                order = np.argsort(which, kind="stable")
                cuts = np.searchsorted(which[order], np.arange(len(bounds)))
                for k in range(len(bounds) - 1):
                    files.append(k, b.take(order[cuts[k]:cuts[k + 1]]))
            for k in self.progress.iterate(range(len(bounds) - 1), "deduplicating",
                                           len(bounds) - 1):
                b = files.read(k, self.graph)
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
        total = np.cumsum(degree)
        bounds = [0]
        while bounds[-1] < degree.size:
            start = total[bounds[-1] - 1] if bounds[-1] else 0
            end = int(np.searchsorted(total, start + bucket_edges, side="right"))
            bounds.append(max(end, bounds[-1] + 1))
        return np.asarray(bounds, np.int64)

    def self_loops(self) -> None:
        """A self-loop for every node of a same-type relation that has none yet."""
        for k, flags in self.loops.items():
            start = self.offsets[self.w.relations[k].src_type]
            missing = np.flatnonzero(~flags)
            for a in range(0, missing.size, self.block_edges):
                ids = start + missing[a:a + self.block_edges]
                self.w.add_edges(ids, ids, etype=np.full(ids.size, k, np.int32))


class _BucketFiles:
    """Append-only raw files of each bucket's edges: src, dst, etype, pos and every edge
    data array, read back whole one bucket at a time."""

    FIELDS = (("src", np.int64), ("dst", np.int64), ("etype", np.int32), ("pos", np.int64))

    def __init__(self, root: str, buckets: int):
        self.root, self.buckets = root, buckets

    def _path(self, k: int, field: str) -> str:
        return os.path.join(self.root, f"{k:06d}.{field}")

    def append(self, k: int, b: _Block) -> None:
        if not b.src.size:
            return
        arrays = {f: getattr(b, f) for f, _ in self.FIELDS}
        for name, values in b.data.items():
            arrays["data." + name] = values
        for field, values in arrays.items():
            with open(self._path(k, field), "ab") as f:
                np.ascontiguousarray(values).tofile(f)

    def read(self, k: int, graph: ChunkedGraph) -> _Block:
        def load(field: str, dtype, shape=()) -> np.ndarray:
            path = self._path(k, field)
            if not os.path.exists(path):
                return np.zeros((0, *shape), dtype)
            return np.fromfile(path, dtype).reshape(-1, *shape)
        out = [load(f, dt) for f, dt in self.FIELDS]
        data = {name: load("data." + name, np.dtype(c.dtype), tuple(c.shape))
                for name, c in graph.edge_data.items()}
        return _Block(*out, data)


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
