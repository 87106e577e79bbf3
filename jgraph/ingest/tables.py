"""Converting the user's tables, as a schema file names them (`jgraph.ingest.schema`), into
a chunked graph directory (`jgraph.data.chunked`): `convert_tables`.

A node type's nodes are numbered 0..n-1 in the order its files list them (a type
without node files: its distinct ids in the edge files, sorted), and the user's ids
are kept (`Graph.ids`, the directory's ids/<type>.npy). Memory follows the node count
and the batch, never the edge count: every file is read in batches
(`jgraph.ingest.table_reader`), ids are mapped a batch at a time (`IdMap`), and the
edges are written a chunk at a time: `edges_per_chunk` edges of one relation a chunk,
a relation's last chunk the rest. Split fractions are drawn here (`fraction_codes`),
from each node's number, so that a split does not depend on the batches.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

import jgraph.segments as segments
from jgraph.data.chunked import ChunkedWriter, check_chunked_out
from jgraph.data.graph import GraphError, shown_id
from jgraph.data.ids import IdMap, repeats
from jgraph.data.links import mix64
from jgraph.data.npz import DatasetError, as_dataset_errors
from jgraph.ingest.convert import EDGES_PER_CHUNK, ROWS_PER_CHUNK
from jgraph.ingest.schema import EdgeTable, IdType, NodeTable, Schema, is_schema_file, load_schema
from jgraph.ingest.table_reader import (
    SPLITS,
    Column,
    Table,
    import_pyarrow,
    labels,
    list_rows,
    numbers,
    split_codes,
    table_files,
    user_ids,
)
from jgraph.progress import Progress

# What callers use from here; is_schema_file and load_schema, from jgraph.ingest.schema,
# are kept importable from here for the CLI.
__all__ = ["convert_tables", "fraction_codes", "is_schema_file", "load_schema"]

READ_ROWS = 1 << 20             # rows of a file converted at a time, at most


def fraction_codes(positions: np.ndarray, fractions, seed: int) -> np.ndarray:
    """int8 indices of SPLITS (-1: none) drawn for the nodes at `positions`: a hash of
    (seed, position) as u in [0, 1), against the fractions' running sums."""
    u = (mix64(seed, positions) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    bounds = np.cumsum(fractions)
    if bounds[-1] > 1 - 1e-9:       # shares adding up to 1 leave no node out, rounding aside
        bounds[-1] = np.inf
    codes = np.searchsorted(bounds, u, side="right")
    return np.where(codes < len(SPLITS), codes, -1).astype(np.int8)


# -- conversion ---------------------------------------------------------------------------


class _Distinct:
    """The distinct values of a stream of batches, sorted, in memory proportional to
    them plus a batch: the batches' distinct values are merged once they outnumber
    what is merged."""

    def __init__(self, kind: str):
        self.merged = np.zeros(0, np.int64 if kind == "i" else "S1")
        self.pending: list[np.ndarray] = []
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        self.pending.append(segments.distinct(values))
        self.count += self.pending[-1].size
        if self.count > max(self.merged.size, READ_ROWS):
            self.result()

    def result(self) -> np.ndarray:
        if self.pending:
            self.merged = segments.distinct(np.concatenate([self.merged, *self.pending]))
            self.pending, self.count = [], 0
        return self.merged


def _rechunk(batches: Iterable[tuple[np.ndarray, ...]], size: int
             ) -> Iterator[tuple[np.ndarray, ...]]:
    """The rows of `batches` (tuples of arrays of one length) as tuples of `size` rows,
    the last one the rest."""
    held: list[tuple[np.ndarray, ...]] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += len(batch[0])
        while count >= size:
            joined = held[0] if len(held) == 1 else tuple(
                np.concatenate(parts) for parts in zip(*held))
            yield tuple(a[:size] for a in joined)
            held, count = [tuple(a[size:] for a in joined)], count - size
    if count:
        yield held[0] if len(held) == 1 else tuple(np.concatenate(p) for p in zip(*held))


class _Plan(NamedTuple):
    """What a conversion reads: node files per type ([] for a type whose nodes come
    from the edge files), edge files per relation, and each type's id kind."""

    types: list[str]
    node_files: dict[str, list[str]]
    edge_files: list[list[str]]
    kinds: dict[str, str]


def _plan(pa, schema: Schema) -> _Plan:
    types = schema.node_types()
    node_files = {}
    for t in types:
        table = schema.table(t)
        node_files[t] = table_files(table.files, f"nodes {t!r} files") if table else []
    edge_files = [table_files(e.files, f"relation {e.relation[1]!r} files")
                  for e in schema.edges]
    kinds = {}
    for t in types:
        table = schema.table(t)
        if table is not None and table.id_type is not None:
            kinds[t] = "i" if table.id_type is IdType.INT else "S"
        elif node_files[t]:
            kinds[t] = Table(pa, node_files[t][0]).id_kind(table.id)
        else:
            e, files = next((e, f) for e, f in zip(schema.edges, edge_files)
                            if t in (e.relation[0], e.relation[2]))
            kinds[t] = Table(pa, files[0]).id_kind(
                e.source if e.relation[0] == t else e.destination)
    return _Plan(types, node_files, edge_files, kinds)


def _listed_ids(pa, table: NodeTable, files: list[str], kind: str) -> np.ndarray:
    """A type's ids as its node files list them; a DatasetError naming both places of
    an id listed twice."""
    parts, starts, position = [], [], 0         # starts: each file's first node
    for path in files:
        starts.append(position)
        for batch in Table(pa, path).batches([table.id], READ_ROWS):
            parts.append(user_ids(pa, batch[table.id], kind))
            position += parts[-1].size
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64 if kind == "i" else "S1")
    earlier, later = repeats(ids)
    if earlier.size:
        first, again = earlier[0], later[0]

        def place(position):
            f = int(segments.segment_of(starts, position))
            return f"{files[f]}: column {table.id!r} row {int(position - starts[f])}"
        raise DatasetError(f"{place(again)}: id {shown_id(ids[again])} is listed again (first at "
                           f"{place(first)}); a node type's ids are unique")
    return ids


def _edge_ids(pa, schema: Schema, plan: _Plan, types: list[str]) -> dict[str, np.ndarray]:
    """The distinct ids, sorted, that the edge files give each of `types`: one pass
    over the edge files that name them."""
    found = {t: _Distinct(plan.kinds[t]) for t in types}
    for e, files in zip(schema.edges, plan.edge_files):
        wanted = [(c, t) for c, t in ((e.source, e.relation[0]), (e.destination, e.relation[2]))
                  if t in found]
        for path in files if wanted else ():
            for batch in Table(pa, path).batches([c for c, _ in wanted], READ_ROWS):
                for c, t in wanted:
                    found[t].add(user_ids(pa, batch[c], plan.kinds[t]))
    return {t: d.result() for t, d in found.items()}


def _positions(pa, ids: IdMap, col: Column, ntype: str) -> np.ndarray:
    """int64 positions of a column of ids of type `ntype`; a DatasetError naming the
    first id that no node file lists."""
    values = user_ids(pa, col, ids.kind)
    pos = ids.find(values)
    if (pos < 0).any():
        at = int(np.flatnonzero(pos < 0)[0])
        raise DatasetError(f"{col.at(at)}: id {shown_id(values[at])} is not a node of type "
                           f"{ntype!r}: no node file lists it")
    return pos


def _edge_batches(pa, e: EdgeTable, files: list[str], maps: dict[str, IdMap],
                  rows: int) -> Iterator[tuple[np.ndarray, ...]]:
    """(src, dst, *edge data) of a relation's files, a batch at a time."""
    data = e.columns()
    src_type, _, dst_type = e.relation
    for path in files:
        for batch in Table(pa, path).batches([e.source, e.destination, *(c for _, c in data)],
                                             rows):
            yield (_positions(pa, maps[src_type], batch[e.source], src_type),
                   _positions(pa, maps[dst_type], batch[e.destination], dst_type),
                   *(numbers(pa, batch[c]) for _, c in data))


def _node_batches(pa, table: NodeTable, files: list[str], rows: int
                  ) -> Iterator[tuple[np.ndarray, ...]]:
    """(*feature arrays, label?, split codes?) of a type's node files, a batch at a
    time (the split codes where a column holds the split)."""
    features = table.arrays()
    columns = [c for f in features for c in f.columns]
    columns += [table.label.column] if table.label else []
    by_column = table.split is not None and table.split.column is not None
    columns += [table.split.column] if by_column else []
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        for batch in Table(pa, path).batches(columns, rows):
            arrays = []
            for f in features:
                first = batch[f.columns[0]]
                if f.matrix:
                    rows_of = np.stack([numbers(pa, batch[c]) for c in f.columns], axis=1)
                elif pa.types.is_list(first.values.type) or pa.types.is_large_list(
                        first.values.type) or pa.types.is_fixed_size_list(first.values.type):
                    rows_of = list_rows(pa, first)
                else:
                    rows_of = numbers(pa, first)
                if f.name == "feat" and rows_of.ndim == 1:     # feat is a matrix, always
                    rows_of = rows_of[:, None]
                if shapes.setdefault(f.name, rows_of.shape[1:]) != rows_of.shape[1:]:
                    raise DatasetError(f"{first.at(0)}: feature {f.name!r} rows are "
                                       f"{list(rows_of.shape[1:])} here, "
                                       f"{list(shapes[f.name])} before")
                arrays.append(rows_of)
            if table.label:
                arrays.append(labels(pa, batch[table.label.column], table.label))
            if by_column:
                arrays.append(split_codes(pa, batch[table.split.column]))
            yield tuple(arrays)


def _write_nodes(pa, w: ChunkedWriter, table: NodeTable, files: list[str], n: int,
                 rows: int) -> None:
    """A node type's arrays and splits, `rows` nodes a chunk."""
    names = [f.name for f in table.arrays()] + (["label"] if table.label else [])
    split = table.split
    if names or (split is not None and split.column is not None):
        chunks = _rechunk(_node_batches(pa, table, files, min(rows, READ_ROWS)), rows)
    else:       # split fractions alone: nothing to read
        chunks = (() for _ in range(0, n, rows))
    start, written = 0, set()
    for arrays in chunks:
        k = len(arrays[0]) if arrays else min(rows, n - start)
        positions = np.arange(start, start + k, dtype=np.int64)
        for name, values in zip(names, arrays):
            w.add_node_data(name, values, ntype=table.type)
        if split is not None:
            if split.column is not None:
                codes = arrays[-1]
            else:
                codes = fraction_codes(positions, split.fractions, split.seed)
                if table.label:         # only labelled nodes are drawn
                    codes = np.where(arrays[names.index("label")] >= 0, codes, -1)
            for i, name in enumerate(SPLITS):
                if (codes == i).any() or name not in written:      # each named at once
                    w.add_split(name, positions[codes == i], ntype=table.type)
                    written.add(name)
        start += k
    if start != n:
        raise DatasetError(f"nodes {table.type!r}: {start} rows of data read, {n} ids; did "
                           f"the files change while they were read?")
    for name in SPLITS if split is not None else ():
        if name not in written:
            w.add_split(name, np.zeros(0, np.int64), ntype=table.type)


def convert_tables(schema_path: str | os.PathLike, out: str | os.PathLike, *,
                   edges_per_chunk: int = EDGES_PER_CHUNK, rows_per_chunk: int = ROWS_PER_CHUNK,
                   overwrite: bool = False, progress: Progress | None = None) -> None:
    """Write the graph that the schema file `schema_path` describes (see the module's
    docstring) as a chunked graph directory `out`, in memory O(nodes + a chunk)."""
    progress = progress or Progress(enabled=False)
    for flag, value in (("edges_per_chunk", edges_per_chunk), ("rows_per_chunk", rows_per_chunk)):
        if value < 1:
            raise GraphError(f"{flag} must be at least 1, got {value}")
    pa = import_pyarrow()
    schema = load_schema(schema_path)
    check_chunked_out(os.path.realpath(os.fspath(out)), overwrite)     # before a long read
    plan = _plan(pa, schema)
    with progress.phase("node ids"):
        ids = _edge_ids(pa, schema, plan, [t for t in plan.types if not plan.node_files[t]])
        for t in plan.types:
            if plan.node_files[t]:
                ids[t] = _listed_ids(pa, schema.table(t), plan.node_files[t], plan.kinds[t])
            how = (f"{len(plan.node_files[t])} node file(s)" if plan.node_files[t]
                   else "the edge files")
            progress.note(f"{t}: {ids[t].size:,} nodes from {how}")
        maps = {t: IdMap(ids[t]) for t in plan.types}
    # What the writer finds wrong is named as the schema's (the data's own errors name
    # their files before the writer sees them).
    with as_dataset_errors(os.fspath(schema_path)), ChunkedWriter(
            out, {t: ids[t].size for t in plan.types}, name=schema.name,
            relations=[e.rel for e in schema.edges], overwrite=overwrite) as w:
        for t in plan.types:
            w.add_ids(ids[t], ntype=t)
        with progress.phase("edges"):
            for e, files in zip(schema.edges, plan.edge_files):
                names = [name for name, _ in e.columns()]
                meter, count = progress.meter(f"edges of {e.rel}", 0, "edges"), 0
                batches = _edge_batches(pa, e, files, maps, min(edges_per_chunk, READ_ROWS))
                for src, dst, *data in _rechunk(batches, edges_per_chunk):
                    w.add_edges(src, dst, relation=e.rel, data=dict(zip(names, data)))
                    count += src.size
                    meter.update(src.size)
                progress.note(f"{e.rel}: {count:,} edges from {len(files)} file(s)")
        with progress.phase("node data"):
            for t in plan.types:
                table = schema.table(t)
                if table is not None and (table.arrays() or table.label or table.split):
                    _write_nodes(pa, w, table, plan.node_files[t], ids[t].size, rows_per_chunk)
