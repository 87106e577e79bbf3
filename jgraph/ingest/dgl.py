"""DGL's chunked graph format (`jgraph.ingest.dgl_metadata`) converted to jgraph's chunked
format a block at a time.

The jgraph graph keeps DGL's node types in their order and the edge types as its
relations, each relation's edges in file order (so edge ids follow DGL's edge types laid
end to end). The masks `train_mask`, `val_mask`, `test_mask` (0/1 or booleans per node,
as DGL's and GraphStorm's data name them) become the splits `train`, `val`, `test`;
every other array keeps its name. What jgraph's format cannot hold is refused, never
dropped: relation names repeated across edge types, or an edge array given for some
edge types only. Every file is found and its header read before anything is written;
the output appears only once complete (`ChunkedWriter`).

CSV and Parquet files are read through `jgraph.ingest.table_reader.Table`, a batch of at
most a block's rows at a time (a Parquet file a run of row groups at a time), so memory
is bounded by the blocks, not by the files.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator

import numpy as np

from jgraph.data.chunked import ChunkedWriter, check_chunked_out
from jgraph.data.graph import GraphError, Relation
from jgraph.data.npz import DatasetError, as_dataset_errors
from jgraph.ingest.dgl_metadata import DGLChunked, Files, open_dgl_chunked
from jgraph.ingest.table_reader import Column, Table, import_pyarrow, list_rows
from jgraph.progress import Progress

MASKS = {"train_mask": "train", "val_mask": "val", "test_mask": "test"}
"""DGL's mask arrays and the jgraph splits they become."""
_NOTE_EVERY = 10.0              # seconds between progress lines while edges stream


# -- reading files in blocks ------------------------------------------------------------


def blocks(files: Files, rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
    """(path, first row's position in that file, block) of at most `rows` rows, every
    file in order; each file's rows checked against `files.rows`."""
    read = {"numpy": _numpy_blocks, "csv": _csv_blocks, "parquet": _parquet_blocks}[files.fmt]
    for i, (path, expected) in enumerate(zip(files.paths, files.rows)):
        start = 0
        for block in read(files, i, rows):
            for a in range(0, len(block), rows):
                piece = block[a:a + rows]
                if expected is not None and start + len(piece) > expected:
                    raise DatasetError(f"{path}: {files.field}: holds more than the "
                                       f"{expected} rows metadata.json says")
                yield path, start, piece
                start += len(piece)
        if expected is not None and start != expected:
            raise DatasetError(f"{path}: {files.field}: holds {start} rows, metadata.json "
                               f"says {expected}")


def _numpy_blocks(files: Files, i: int, rows: int) -> Iterator[np.ndarray]:
    path = files.paths[i]
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        for a in range(0, len(array), rows):
            yield np.asarray(array[a:a + rows])
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: {files.field}: cannot be read ({e})") from None


def _csv_blocks(files: Files, i: int, rows: int) -> Iterator[np.ndarray]:
    """[k, 2] int64 pairs, parsed by pyarrow where installed (as DGL reads them), by
    numpy otherwise. An empty file is a chunk without edges, as DGL reads it."""
    path = files.paths[i]
    if os.path.getsize(path) == 0:
        return
    try:
        pa = import_pyarrow()
    except DatasetError:
        yield from _loadtxt_blocks(files, i, rows)
        return
    table = Table(pa, path, fmt="csv", delimiter=files.delimiter, header=False)
    names = table.columns()
    if len(names) != 2:
        raise DatasetError(f"{path}: {files.field}: {len(names)} columns, expected 2 "
                           f"(source, destination)")
    for batch in table.batches(names, rows):
        yield np.stack([_csv_ids(pa, batch[c], files.field) for c in names], axis=1)


def _csv_ids(pa, col: Column, field: str) -> np.ndarray:
    """A CSV column of ids (read as strings) as int64; an error names the first bad line."""
    try:
        return pa.compute.cast(col.values, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid as e:
        ok = pa.compute.match_substring_regex(col.values, r"^-?[0-9]+$")
        bad = np.flatnonzero(~ok.to_numpy(zero_copy_only=False))
        if not bad.size:        # integers, but past int64
            raise DatasetError(f"{col.path}: {field}: cannot be read as integer pairs after "
                               f"line {col.start} ({e})") from None
        at = int(bad[0])
        raise DatasetError(f"{col.path}: {field}: line {col.start + at + 1}: "
                           f"{col.values[at].as_py()!r} is not an integer id") from None


def _loadtxt_blocks(files: Files, i: int, rows: int) -> Iterator[np.ndarray]:
    """DGL's CSV edges read by numpy, where pyarrow is not installed."""
    path, line = files.paths[i], 0
    try:
        with open(path) as f:
            while True:
                with warnings.catch_warnings():     # "input contained no data", at the end
                    warnings.simplefilter("ignore", UserWarning)
                    block = np.loadtxt(f, delimiter=files.delimiter, dtype=np.int64,
                                       ndmin=2, max_rows=rows)
                if not len(block):
                    return
                if block.shape[1] != 2:
                    raise DatasetError(f"{path}: {files.field}: {block.shape[1]} columns "
                                       f"after line {line}, expected 2 (source, destination)")
                line += len(block)
                yield block
    except (OSError, ValueError) as e:
        after = f" after line {line}" if line else ""
        raise DatasetError(f"{path}: {files.field}: cannot be read as integer pairs{after} "
                           f"({type(e).__name__}: {e})") from None


def _parquet_blocks(files: Files, i: int, rows: int) -> Iterator[np.ndarray]:
    pa = import_pyarrow(csv=False)
    table = Table(pa, files.paths[i], fmt="parquet")
    names = table.columns()
    for batch in table.batches(names, rows):
        yield _numbers(pa, [batch[c] for c in names], files.field, files.shapes[i])


def _numbers(pa, columns: list[Column], field: str, shape: tuple[int, ...] | None
             ) -> np.ndarray:
    """A batch's columns as numbers, rows first: one list column's lists as a matrix;
    otherwise the columns side by side, reshaped to the file's `shape`, or one value per
    row for a single column without one. Nulls and non-numbers are refused."""
    kind = columns[0].values.type
    if len(columns) == 1 and (pa.types.is_list(kind) or pa.types.is_large_list(kind)
                              or pa.types.is_fixed_size_list(kind)):
        return list_rows(pa, columns[0])
    where = f"{columns[0].path}: {field}"
    if any(c.values.null_count for c in columns):
        raise DatasetError(f"{where}: holds nulls (empty fields); every row needs values")
    block = np.stack([c.values.to_numpy(zero_copy_only=False) for c in columns], axis=1)
    if shape is not None:
        if int(np.prod(shape[1:])) != block.shape[1]:
            raise DatasetError(f"{where}: rows of {block.shape[1]} values cannot take the "
                               f"schema's shape {list(shape)}")
        block = block.reshape(len(block), *shape[1:])
    elif block.shape[1] == 1:
        block = block[:, 0]
    if block.dtype.kind not in "biuf":
        raise DatasetError(f"{where}: holds {[c.values.type for c in columns]} "
                           f"({block.dtype}); arrays hold numbers")
    return block


class _Rows:
    """An array's files read in order, handed out in blocks of exactly the rows asked
    for (edge data, whose files need not be chunked as the edges are)."""

    def __init__(self, files: Files, rows: int):
        self.files, self._blocks = files, blocks(files, rows)
        self._left, self.path = None, files.paths[0]

    def take(self, count: int) -> np.ndarray:
        parts, have = [], 0
        while have < count:
            if self._left is None or not len(self._left):
                nxt = next(self._blocks, None)
                if nxt is None:
                    raise DatasetError(f"{self.path}: {self.files.field}: the files end "
                                       f"before the edges do")
                self.path, _, self._left = nxt
            parts.append(self._left[:count - have])
            self._left = self._left[count - have:]
            have += len(parts[-1])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def finish(self) -> None:
        if (self._left is not None and len(self._left)) or next(self._blocks, None):
            raise DatasetError(f"{self.path}: {self.files.field}: the files hold more rows "
                               f"than the edge type has edges")


# -- converting -------------------------------------------------------------------------


def convert_dgl(path: str | os.PathLike, out: str | os.PathLike, *,
                edges_per_chunk: int = 1 << 24, rows_per_chunk: int = 1 << 20,
                overwrite: bool = False, progress: Progress | None = None) -> None:
    """Write the DGL chunked graph directory `path` as a jgraph chunked graph directory
    `out`, one block (at most `edges_per_chunk` edges, `rows_per_chunk` rows) at a
    time: memory is bounded by the blocks, not by the graph."""
    progress = progress or Progress(enabled=False)
    for flag, value in (("edges_per_chunk", edges_per_chunk), ("rows_per_chunk", rows_per_chunk)):
        if value < 1:
            raise GraphError(f"{flag} must be at least 1, got {value}")
    check_chunked_out(os.path.realpath(os.fspath(out)), overwrite)
    with progress.phase("reading metadata.json and file headers"):
        graph = open_dgl_chunked(path)
    with ChunkedWriter(out, graph.num_nodes, name=graph.name, relations=graph.relations,
                       overwrite=overwrite) as w:
        with progress.phase("edges"):
            for rel in graph.relations:
                _write_edges(w, graph, rel, edges_per_chunk, progress)
        with progress.phase("node data"):
            for t in graph.num_nodes:
                for name, files in graph.node_data.get(t, {}).items():
                    _write_node_array(w, t, name, files, rows_per_chunk)


def _write_edges(w: ChunkedWriter, graph: DGLChunked, rel: Relation, edges_per_chunk: int,
                 progress: Progress) -> None:
    files = graph.edges[rel]
    data = {name: _Rows(f, edges_per_chunk) for name, f in graph.edge_data.get(rel, {}).items()}
    line = files.fmt == "csv"       # positions said as 1-based lines of a csv file
    count, noted = 0, time.perf_counter()
    for path, start, block in blocks(files, edges_per_chunk):
        if block.dtype.kind not in "iu":
            raise DatasetError(f"{path}: {files.field}: ids are {block.dtype}, expected "
                               f"integers")
        for column, t in ((0, rel.src_type), (1, rel.dst_type)):
            ids, n = block[:, column], graph.num_nodes[t]
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                at = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
                raise DatasetError(
                    f"{path}: {files.field}: {('source', 'destination')[column]} id "
                    f"{int(ids[at])} at {'line' if line else 'row'} {start + at + line} is "
                    f"out of range for node type {t!r} ({n} nodes)")
        values = {name: rows.take(len(block)) for name, rows in data.items()}
        # the ids are checked above: what the writer refuses is in the edge data
        where = ", ".join(f"{rows.path}: {rows.files.field}" for rows in data.values())
        with as_dataset_errors(where or path):
            w.add_edges(block[:, 0], block[:, 1], relation=rel, data=values)
        count += len(block)
        if time.perf_counter() - noted >= _NOTE_EVERY:
            progress.note(f"{':'.join(rel)}: {count:,} edges so far")
            noted = time.perf_counter()
    for rows in data.values():
        rows.finish()
    progress.note(f"{':'.join(rel)}: {count:,} edges")


def _write_node_array(w: ChunkedWriter, ntype: str, name: str, files: Files,
                      rows_per_chunk: int) -> None:
    """Node array `name` of `ntype` in row blocks: a mask as its split's node ids, any
    other array as node data of that name."""
    split, start, found = MASKS.get(name), 0, 0
    for path, _, block in blocks(files, rows_per_chunk):
        if (split or name == "label") and block.ndim == 2 and block.shape[1] == 1:
            block = block[:, 0]     # one value per node, stored as a column
        if split is None:
            with as_dataset_errors(f"{path}: {files.field}"):
                w.add_node_data(name, block, ntype=ntype)
        else:
            if block.ndim != 1 or not (block.size == 0 or np.isin(block, (0, 1)).all()):
                at = 0 if block.ndim != 1 else int(np.flatnonzero(~np.isin(block, (0, 1)))[0])
                bad = (f"shape {list(block.shape)}" if block.ndim != 1 else
                       f"{block[at].item()!r} at node {start + at}")
                raise DatasetError(f"{path}: {files.field}: holds {bad}; a mask holds 0 or 1 "
                                   f"(or booleans), one per node")
            ids = np.flatnonzero(block) + start
            if ids.size:
                w.add_split(split, ids, ntype=ntype)
            found += ids.size
        start += len(block)
    if split is not None and not found:
        w.add_split(split, np.zeros(0, np.int64), ntype=ntype)

