"""DGL's chunked graph format, converted to jgraph's chunked format a block at a time.

DGL's distributed partitioning pipeline, and GraphStorm's GSProcessing that writes for
it, take a graph as a directory in DGL's "Chunked Graph Format" (DGL user guide 7.1,
`docs/source/guide/distributed-preprocessing.rst`):

    DIR/metadata.json
      {"graph_name": "mag240m",
       "node_type": ["author", "paper"],               # their order numbers the ids
       "num_nodes_per_chunk": [[4, 3], [6, 6]],        # per node type, per chunk
       "edge_type": ["author:writes:paper"],           # "src type:relation:dst type"
       "num_edges_per_chunk": [[9, 9]],                # per edge type, per edges file
       "edges": {"author:writes:paper": {"format": {"name": "csv", "delimiter": " "},
                                          "data": ["edges/writes-0.csv", ...]}},
       "node_data": {"paper": {"feat": {"format": {"name": "numpy"},
                                        "data": ["paper-feat-0.npy", ...]}}},
       "edge_data": {"author:writes:paper": {"year": {"format": {"name": "parquet"},
                                                      "data": [...]}}}}

An edges file holds one edge per row, two columns: source and destination, ids local to
their node types; as CSV without a header (DGL writes a space as the delimiter, the
default here), numpy [E, 2], or parquet (two columns, any names). Node and edge data
are numpy or parquet files of rows, chunked freely: only their total must match the
type's count. File paths are relative to DIR, or absolute. GraphStorm writes
`num_nodes_per_type` / `num_edges_per_type` (totals) beside or instead of the per-chunk
counts, and `row_counts` per file entry: all that are given must agree.

Parquet rows are read as DGL reads them: one column holding a list per row is a matrix;
numeric columns are [rows, columns], reshaped by a "shape" entry in the schema's
metadata where DGL's writer left one; a single numeric column without it is one value
per row. Parquet needs pyarrow.

The jgraph graph keeps DGL's node types in their order and the edge types as its
relations, each relation's edges in file order (so edge ids follow DGL's edge types laid
end to end). The masks `train_mask`, `val_mask`, `test_mask` (0/1 or booleans per node,
as DGL's and GraphStorm's data name them) become the splits `train`, `val`, `test`;
every other array keeps its name. What jgraph's format cannot hold is refused, never
dropped: relation names repeated across edge types, or an edge array given for some
edge types only. Every file is found and its header read before anything is written;
the output appears only once complete (`ChunkedWriter`).
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from jgraph.data.chunked import METADATA, ChunkedWriter, check_chunked_out, npy_header
from jgraph.data.graph import GraphError, Relation, _check_name
from jgraph.data.npz import DatasetError
from jgraph.progress import Progress

MASKS = {"train_mask": "train", "val_mask": "val", "test_mask": "test"}
"""DGL's mask arrays and the jgraph splits they become."""
EDGE_FORMATS, DATA_FORMATS = ("csv", "numpy", "parquet"), ("numpy", "parquet")
_CSV_BLOCK_BYTES = 1 << 24      # CSV text parsed per step: bounds the parser's buffers
_NOTE_EVERY = 10.0              # seconds between progress lines while edges stream


def is_dgl_chunked_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory with a DGL chunked graph's metadata.json."""
    meta = os.path.join(path, METADATA)
    if not os.path.isfile(meta):
        return False
    try:
        with open(meta) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and all(k in raw for k in ("node_type", "edge_type", "edges"))


# -- metadata.json, checked against every file's header ---------------------------------


class Files(NamedTuple):
    """One array of a DGL chunked graph. field: where metadata.json names it; fmt: numpy,
    csv or parquet; delimiter: csv's; paths: its files in order; rows: what each file
    must hold, from its header (numpy, parquet) or metadata.json (csv), None if unknown."""

    field: str
    fmt: str
    delimiter: str
    paths: tuple[str, ...]
    rows: tuple[int | None, ...]


@dataclasses.dataclass(frozen=True)
class DGLChunked:
    """An opened DGL chunked graph directory. name; num_nodes {type: n} in DGL's order;
    relations in edge_type order; edges {Relation: Files}; node_data {type: {name:
    Files}}; edge_data {Relation: {name: Files}}, the same names on every relation."""

    name: str
    num_nodes: dict[str, int]
    relations: list[Relation]
    edges: dict[Relation, Files]
    node_data: dict[str, dict[str, Files]]
    edge_data: dict[Relation, dict[str, Files]]


def open_dgl_chunked(path: str | os.PathLike) -> DGLChunked:
    """Read a DGL chunked graph's metadata.json and check it against every file named
    there (present, a readable header, the rows the counts say): DatasetErrors name the
    file or the field."""
    root = os.fspath(path)
    meta = os.path.join(root, METADATA)
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such directory")
    if not os.path.isfile(meta):
        raise DatasetError(f"{meta}: missing; not a DGL chunked graph directory")
    try:
        with open(meta) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise DatasetError(f"{meta}: not readable JSON ({e})") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{meta}: holds {type(raw).__name__}, expected a JSON object")
    try:
        return _parse(root, meta, raw)
    except DatasetError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, GraphError) as e:
        raise DatasetError(f"{meta}: a field is missing or has the wrong form "
                           f"({type(e).__name__}: {e})") from None


def _parse(root: str, meta: str, raw: Mapping) -> DGLChunked:
    def fail(field: str, message: str):
        raise DatasetError(f"{meta}: {field}: {message}")

    ntypes = _names(raw, "node_type", fail)
    num_nodes = dict(zip(ntypes, _counts(raw, "num_nodes", ntypes, fail)[0]))
    relations = []
    for key in _names(raw, "edge_type", fail, check=False):
        parts = key.split(":")
        if len(parts) != 3:
            fail("edge_type", f"{key!r} is not 'src type:relation:dst type'")
        for t in (parts[0], parts[2]):
            if t not in num_nodes:
                fail("edge_type", f"{key!r}: unknown node type {t!r}; node_type is {ntypes}")
        _named(fail, "edge_type", "relation", parts[1])
        relations.append(Relation(*parts))
    names = [r.name for r in relations]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        fail("edge_type", f"relation names {twice} are used by more than one edge type; "
                          f"jgraph names each relation once: rename them in metadata.json")
    keys = {":".join(r): r for r in relations}
    totals, per_chunk = _counts(raw, "num_edges", list(keys), fail)
    num_edges = dict(zip(relations, totals))

    edges_raw = _mapping(raw, "edges", fail)
    for key in edges_raw:
        if key not in keys:
            fail("edges", f"{key!r} is not one of edge_type {list(keys)}")
    edges = {}
    for i, (key, rel) in enumerate(keys.items()):
        field = f"edges[{key!r}]"
        if key not in edges_raw:
            fail("edges", f"no entry for edge type {key!r}")
        declared = per_chunk[i] if per_chunk else None
        edges[rel] = _files(root, fail, field, edges_raw[key], EDGE_FORMATS, declared,
                            edges=True)
        _check_total(edges[rel], num_edges[rel], f"edge type {key!r} has {num_edges[rel]} edges")

    node_data: dict[str, dict[str, Files]] = {}
    for t, named in _mapping(raw, "node_data", fail, optional=True).items():
        if t not in num_nodes:
            fail("node_data", f"unknown node type {t!r}; node_type is {ntypes}")
        for name, entry in named.items():
            field = f"node_data[{t!r}][{name!r}]"
            _named(fail, field, "node data", name)
            files = _files(root, fail, field, entry, DATA_FORMATS)
            if files.paths:         # DGL skips an array listed without files
                _check_total(files, num_nodes[t], f"type {t!r} has {num_nodes[t]} nodes")
                node_data.setdefault(t, {})[name] = files

    edge_data: dict[Relation, dict[str, Files]] = {}
    for key, named in _mapping(raw, "edge_data", fail, optional=True).items():
        if key not in keys:
            fail("edge_data", f"{key!r} is not one of edge_type {list(keys)}")
        rel = keys[key]
        for name, entry in named.items():
            field = f"edge_data[{key!r}][{name!r}]"
            _named(fail, field, "edge data", name)
            files = _files(root, fail, field, entry, DATA_FORMATS)
            if files.paths:
                _check_total(files, num_edges[rel], f"edge type {key!r} has "
                                                    f"{num_edges[rel]} edges")
                edge_data.setdefault(rel, {})[name] = files
    for name in sorted({n for named in edge_data.values() for n in named}):
        lacking = [":".join(r) for r in relations if name not in edge_data.get(r, {})]
        if lacking:
            fail("edge_data", f"{name!r} is not given for {lacking}; jgraph's chunked format "
                              f"holds each edge array for every relation: give it for every "
                              f"edge type, or remove it from metadata.json to leave it out")
    name = raw.get("graph_name") or os.path.basename(os.path.normpath(root))
    return DGLChunked(str(name), num_nodes, relations, edges, node_data, edge_data)


def _mapping(raw: Mapping, key: str, fail, optional: bool = False) -> Mapping:
    value = raw.get(key)
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        fail(key, "missing" if value is None else f"expected an object, got {value!r:.80}")
    return value


def _names(raw: Mapping, key: str, fail, check: bool = True) -> list[str]:
    value = raw.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        fail(key, "missing" if value is None else f"expected a list of names, got "
                                                  f"{value!r:.80}")
    if len(set(value)) < len(value):
        fail(key, f"names appear more than once: {value}")
    for v in value if check else ():
        _named(fail, key, "node type", v)
    return value


def _named(fail, field: str, kind: str, name: str) -> None:
    try:
        _check_name(kind, name)
    except GraphError as e:
        fail(field, str(e))


def _counts(raw: Mapping, what: str, names: list[str], fail
            ) -> tuple[list[int], list[list[int]] | None]:
    """(total per type, counts per chunk or None) from `{what}_per_chunk` (DGL) and
    `{what}_per_type` (GraphStorm), which agree where both are given."""
    chunk_key, type_key = f"{what}_per_chunk", f"{what}_per_type"
    per_chunk, per_type = raw.get(chunk_key), raw.get(type_key)
    if per_chunk is None and per_type is None:
        fail(chunk_key, f"missing (nor is there {type_key})")
    count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0
    if per_chunk is not None and not (
            isinstance(per_chunk, list) and len(per_chunk) == len(names)
            and all(isinstance(c, list) and all(map(count, c)) for c in per_chunk)):
        fail(chunk_key, f"expected {len(names)} lists of counts (one per type in "
                        f"{names}), got {per_chunk!r:.80}")
    if per_type is not None and not (isinstance(per_type, list) and len(per_type) == len(names)
                                     and all(map(count, per_type))):
        fail(type_key, f"expected {len(names)} counts (one per type in {names}), got "
                       f"{per_type!r:.80}")
    if per_chunk is not None and per_type is not None:
        for name, chunks, total in zip(names, per_chunk, per_type):
            if sum(chunks) != total:
                fail(type_key, f"{name!r}: {total}, but {chunk_key} adds up to {sum(chunks)}")
    totals = per_type if per_chunk is None else [sum(c) for c in per_chunk]
    return totals, per_chunk


def _files(root: str, fail, field: str, entry, formats: Sequence[str],
           declared: Sequence[int] | None = None, edges: bool = False) -> Files:
    """One array's entry: its format, its files (each present, with a readable header)
    and the rows each holds, where its header or the metadata says."""
    if not isinstance(entry, dict):
        fail(field, f"expected {{'format': ..., 'data': [...]}}, got {entry!r:.80}")
    fmt = entry.get("format")
    name = fmt.get("name") if isinstance(fmt, dict) else None
    if name not in formats:
        fail(field, f"format {name!r} is not one that is read here; expected one of "
                    f"{list(formats)}" + (" (DGL's pipeline reads node and edge data as "
                                          "numpy or parquet)" if name == "csv" else ""))
    data = entry.get("data")
    if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
        fail(field, f"'data' must be a list of file paths, got {data!r:.80}")
    if declared is not None and len(declared) != len(data):
        fail(field, f"names {len(data)} files, but num_edges_per_chunk gives {len(declared)} "
                    f"counts for it (one per file)")
    row_counts = entry.get("row_counts")        # GraphStorm's
    if row_counts is not None and (not isinstance(row_counts, list) or len(row_counts) != len(data)
                                   or not all(isinstance(c, int) for c in row_counts)):
        fail(field, f"'row_counts' must give one count per file ({len(data)}), got "
                    f"{row_counts!r:.80}")
    paths = tuple(p if os.path.isabs(p) else os.path.join(root, p) for p in data)
    rows = []
    for i, path in enumerate(paths):
        said = [c[i] for c in (declared, row_counts) if c is not None]
        found = _header_rows(path, name, field, edges)
        for count in said:
            if found is not None and found != count:
                raise DatasetError(f"{path}: {field} file {i} holds {found} rows, metadata.json "
                                   f"says {count}")
        rows.append(found if found is not None else (said[0] if said else None))
    return Files(field, name, fmt.get("delimiter") or " ", paths, tuple(rows))


def _header_rows(path: str, fmt: str, field: str, edges: bool) -> int | None:
    """The rows a file holds, from its header (numpy) or footer (parquet); None for csv."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: missing ({field} names it)")
    if fmt == "numpy":
        shape, dtype = npy_header(path)
        if not shape:
            raise DatasetError(f"{path}: {field}: a scalar, not an array of rows")
        if edges and (len(shape) != 2 or shape[1] != 2 or dtype.kind not in "iu"):
            raise DatasetError(f"{path}: {field}: {dtype}{list(shape)}, expected integer "
                               f"ids [E, 2] (source, destination)")
        return shape[0]
    if fmt == "parquet":
        meta = _parquet(path).metadata
        if edges and meta.num_columns != 2:
            raise DatasetError(f"{path}: {field}: {meta.num_columns} columns, expected 2 "
                               f"(source, destination)")
        return meta.num_rows
    return None


def _check_total(files: Files, expected: int, what: str) -> None:
    """The files' rows, where known, add up to `expected`; the error names the file at
    which they went over, or the last one."""
    total = 0
    for path, rows in zip(files.paths, files.rows):
        if rows is None:
            return
        total += rows
        if total > expected:
            raise DatasetError(f"{path}: {files.field}: the files up to this one hold {total} "
                               f"rows; {what}")
    if total != expected:
        last = files.paths[-1] if files.paths else "(no files)"
        raise DatasetError(f"{last}: {files.field}: the files hold {total} rows; {what}")


# -- reading files in blocks ------------------------------------------------------------


def _pyarrow(path: str):
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)"
                           ) from None
    return pyarrow


def _parquet(path: str):
    pa = _pyarrow(path)
    try:
        return pa.parquet.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: not a readable parquet file, or truncated ({e})") from None


def blocks(files: Files, rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
    """(path, first row's position in that file, block) of at most `rows` rows, every
    file in order; each file's rows checked against `files.rows`."""
    read = {"numpy": _numpy_blocks, "csv": _csv_blocks, "parquet": _parquet_blocks}[files.fmt]
    for path, expected in zip(files.paths, files.rows):
        start = 0
        for block in read(path, rows, files):
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


def _numpy_blocks(path: str, rows: int, files: Files) -> Iterator[np.ndarray]:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        for a in range(0, len(array), rows):
            yield np.asarray(array[a:a + rows])
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: {files.field}: cannot be read ({e})") from None


def _csv_blocks(path: str, rows: int, files: Files) -> Iterator[np.ndarray]:
    """[k, 2] int64 pairs, parsed by pyarrow where installed (as DGL reads them), by
    numpy otherwise. An empty file is a chunk without edges, as DGL reads it."""
    if os.path.getsize(path) == 0:
        return
    line = 0
    try:
        import pyarrow
        import pyarrow.csv
    except ImportError:
        pyarrow = None
    try:
        if pyarrow is not None:
            ints = {"f0": pyarrow.int64(), "f1": pyarrow.int64()}
            with pyarrow.csv.open_csv(
                    path, read_options=pyarrow.csv.ReadOptions(
                        autogenerate_column_names=True, block_size=_CSV_BLOCK_BYTES),
                    parse_options=pyarrow.csv.ParseOptions(delimiter=files.delimiter),
                    convert_options=pyarrow.csv.ConvertOptions(column_types=ints)) as reader:
                for batch in reader:
                    if batch.num_columns != 2:
                        raise DatasetError(f"{path}: {files.field}: {batch.num_columns} "
                                           f"columns after line {line}, expected 2 "
                                           f"(source, destination)")
                    yield _columns(batch, path, files)
                    line += batch.num_rows
            return
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
    except DatasetError:
        raise
    except (OSError, ValueError) as e:      # pyarrow's ArrowInvalid is a ValueError
        after = f" after line {line}" if line else ""
        raise DatasetError(f"{path}: {files.field}: cannot be read as integer pairs{after} "
                           f"({type(e).__name__}: {e})") from None


def _parquet_blocks(path: str, rows: int, files: Files) -> Iterator[np.ndarray]:
    pa = _pyarrow(path)
    table = _parquet(path)
    shape = (table.schema_arrow.metadata or {}).get(b"shape")     # DGL's writer leaves it
    if shape is not None:
        try:
            shape = tuple(ast.literal_eval(shape.decode()))
            if not shape or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise ValueError(shape)
        except (ValueError, SyntaxError, TypeError, UnicodeDecodeError):
            raise DatasetError(f"{path}: {files.field}: its schema's 'shape' {shape!r} is not "
                               f"a tuple of sizes") from None
        if shape[0] != table.metadata.num_rows:
            raise DatasetError(f"{path}: {files.field}: its schema's 'shape' {list(shape)} "
                               f"says {shape[0]} rows, the file holds "
                               f"{table.metadata.num_rows}")
    try:
        for batch in table.iter_batches(batch_size=rows):
            yield _columns(batch, path, files, shape)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: {files.field}: cannot be read ({e})") from None


def _columns(batch, path: str, files: Files, shape: tuple[int, ...] | None = None
             ) -> np.ndarray:
    """A record batch as numbers, rows first: one list column's lists as a matrix;
    otherwise the columns side by side, reshaped to the file's `shape`, or one value per
    row for a single column without one. Nulls and non-numbers are refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    where = f"{path}: {files.field}"
    if any(c.null_count for c in batch.columns):
        raise DatasetError(f"{where}: holds nulls (empty fields); every row needs values")
    kinds = batch.schema.types
    if len(kinds) == 1 and (pa.types.is_list(kinds[0]) or pa.types.is_large_list(kinds[0])
                            or pa.types.is_fixed_size_list(kinds[0])):
        column = batch.column(0)
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise DatasetError(f"{where}: rows of different lengths ({int(lengths.min())} to "
                               f"{int(lengths.max())}); a vector column needs one width")
        values = column.flatten()
        if values.null_count:
            raise DatasetError(f"{where}: holds nulls inside its vectors")
        block = values.to_numpy(zero_copy_only=False).reshape(len(column), -1)
    else:
        block = np.stack([c.to_numpy(zero_copy_only=False) for c in batch.columns], axis=1)
        if shape is not None:
            if int(np.prod(shape[1:])) != block.shape[1]:
                raise DatasetError(f"{where}: rows of {block.shape[1]} values cannot take the "
                                   f"schema's shape {list(shape)}")
            block = block.reshape(len(block), *shape[1:])
        elif block.shape[1] == 1:
            block = block[:, 0]
    if block.dtype.kind not in "biuf":
        raise DatasetError(f"{where}: holds {kinds} ({block.dtype}); arrays hold numbers")
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


@contextlib.contextmanager
def _blame(where: str):
    """What the writer finds wrong in the data becomes a DatasetError naming its file."""
    try:
        yield
    except GraphError as e:
        raise DatasetError(f"{where}: {e}") from None


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
        with _blame(", ".join(f"{rows.path}: {rows.files.field}" for rows in data.values())
                    or path):
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
            with _blame(f"{path}: {files.field}"):
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
