"""DGL's chunked graph format: a directory's metadata.json, checked against its files.

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

Parquet rows are read as DGL reads them: one column holding a list per row is a matrix
(float32, as jgraph's table reader reads vectors); numeric columns are [rows, columns],
reshaped by a "shape" entry in the schema's metadata where DGL's writer left one; a
single numeric column without it is one value per row. Parquet needs pyarrow; CSV is
read by pyarrow where installed, else by numpy.

Here the directory is opened and checked: metadata.json parsed into `DGLChunked`, and
every file it names found, its header (numpy) or footer (parquet) read and its rows
checked against the counts, before anything is converted (`jgraph.ingest.dgl`).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from jgraph.data.chunked import METADATA, npy_header
from jgraph.data.graph import GraphError, Relation, check_name
from jgraph.data.npz import DatasetError
from jgraph.ingest.table_reader import import_pyarrow

EDGE_FORMATS, DATA_FORMATS = ("csv", "numpy", "parquet"), ("numpy", "parquet")


class Files(NamedTuple):
    """One array of a DGL chunked graph. field: where metadata.json names it; fmt: numpy,
    csv or parquet; delimiter: csv's; paths: its files in order; rows: what each file
    must hold, from its header (numpy, parquet) or metadata.json (csv), None if unknown;
    shapes: each parquet file's array shape from its schema's "shape" entry (which DGL's
    writer leaves), None where there is none."""

    field: str
    fmt: str
    delimiter: str
    paths: tuple[str, ...]
    rows: tuple[int | None, ...]
    shapes: tuple[tuple[int, ...] | None, ...]


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
        check_name(kind, name)
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
    rows, shapes = [], []
    for i, path in enumerate(paths):
        said = [c[i] for c in (declared, row_counts) if c is not None]
        found, shape = _header(path, name, field, edges)
        shapes.append(shape)
        for count in said:
            if found is not None and found != count:
                raise DatasetError(f"{path}: {field} file {i} holds {found} rows, metadata.json "
                                   f"says {count}")
        rows.append(found if found is not None else (said[0] if said else None))
    return Files(field, name, fmt.get("delimiter") or " ", paths, tuple(rows), tuple(shapes))


def _header(path: str, fmt: str, field: str, edges: bool
            ) -> tuple[int | None, tuple[int, ...] | None]:
    """(the rows a file holds, its parquet "shape"), from its header (numpy) or footer
    (parquet); the rows are None for csv."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: missing ({field} names it)")
    if fmt == "numpy":
        shape, dtype = npy_header(path)
        if not shape:
            raise DatasetError(f"{path}: {field}: a scalar, not an array of rows")
        if edges and (len(shape) != 2 or shape[1] != 2 or dtype.kind not in "iu"):
            raise DatasetError(f"{path}: {field}: {dtype}{list(shape)}, expected integer "
                               f"ids [E, 2] (source, destination)")
        return shape[0], None
    if fmt == "parquet":
        return _parquet_footer(path, field, edges)
    return None, None


def _parquet_footer(path: str, field: str, edges: bool) -> tuple[int, tuple[int, ...] | None]:
    """(rows, "shape" or None) from a Parquet file's footer, the shape checked against
    the rows; an edges file holds two columns."""
    pa = import_pyarrow(csv=False)
    try:
        with pa.parquet.ParquetFile(path) as f:
            meta, schema = f.metadata, f.schema_arrow
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: not a readable parquet file, or truncated ({e})") from None
    if edges and meta.num_columns != 2:
        raise DatasetError(f"{path}: {field}: {meta.num_columns} columns, expected 2 "
                           f"(source, destination)")
    shape = (schema.metadata or {}).get(b"shape")
    if shape is None:
        return meta.num_rows, None
    try:
        shape = tuple(ast.literal_eval(shape.decode()))
        if not shape or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError(shape)
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError):
        raise DatasetError(f"{path}: {field}: its schema's 'shape' {shape!r} is not a tuple "
                           f"of sizes") from None
    if shape[0] != meta.num_rows:
        raise DatasetError(f"{path}: {field}: its schema's 'shape' {list(shape)} says "
                           f"{shape[0]} rows, the file holds {meta.num_rows}")
    return meta.num_rows, shape


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
