"""The chunked graph format: a graph larger than memory, as a directory of `.npy` chunks.

A graph too large for one process (papers100M: 3.2B edges stored symmetric, 57 GB of
features) cannot pass through a `Graph`. Its edges and rows live in chunks that a
process reads one at a time, memory-mapped; `jgraph partition` reads such a directory
in passes (`jgraph.partition.chunked`) and never holds more than O(nodes) plus a chunk.
DistDGL's chunked graph format is the model; the differences are `.npy` chunks only,
and edges in homogeneous ids with an optional `etype` column.

Layout (format version 1):

    DIR/metadata.json                    see below; written last
    DIR/edges/src-00000.npy ...          int32/int64[E_i] homogeneous source ids
    DIR/edges/dst-00000.npy ...          int32/int64[E_i] homogeneous destination ids
    DIR/edges/etype-00000.npy ...        int[E_i] relation index (absent: one relation)
    DIR/edges/data/<name>-00000.npy ...  [E_i, ...] per-edge arrays, chunked as the edges
    DIR/nodes/<type>/<name>-00000.npy .. [n_i, ...] per-node arrays in row chunks; sparse
                                         rows (`SparseRows`) as <name>.indices-00000.npy
                                         int32[n_i, K] and <name>.values-00000.npy [n_i, K]
    DIR/splits/<type>/<name>-00000.npy   int[k_i] node ids (type-local) of a named split,
                                         sorted and unique across the chunks
    DIR/edge_splits/<split>/<key>-00000.npy  link prediction's positives of a split:
                                         src, dst int64[k_i] (homogeneous), etype
                                         int32[k_i], negatives int64[k_i, K]
    DIR/ids/<type>.npy                   int64[n] or S<k>[n] (UTF-8) the user's own id of
                                         each node of the type, whole (optional; a type
                                         without one is known by its ids 0..n-1)

Homogeneous ids number the node types one after another, in `num_nodes` order: type
t's local id i is `sum(counts of the types before t) + i`. Edge k is the k-th edge of
the chunks laid end to end (its edge id). `metadata.json`:

    {"format": "jgraph-chunked", "version": 1, "graph_name": "rmat",
     "num_nodes": {"_N": 67108864},                      # node types, in id order
     "relations": [["_N", "_E", "_N"]],                  # (src type, name, dst type)
     "edges": {"rows": [E_0, E_1, ...], "src": [files], "dst": [files],
               "etype": [files] or null},
     "edge_data": {"weight": {"dtype": "float32", "shape": [], "files": [...]}},
     "node_data": {"_N": {"feat": {"dtype": "float32", "shape": [16],
                                   "rows": [n_0, ...], "files": [...]},
                          "bow": {"dtype": "float32", "shape": [4714], "sparse": 31,
                                  "rows": [...], "files": [indices files],
                                  "value_files": [values files]}}},
     "splits": {"_N": {"train": {"rows": [k_0, ...], "files": [...]}}},
     "ids": {"_N": {"file": "ids/_N.npy", "dtype": "S12"}},     # optional; or "int64"
     "edge_splits": {"val": {"rows": [k_0, ...], "src": [files], "dst": [files],
                             "etype": [files], "negatives": [files],
                             "num_negatives": 1000}, ...},
                 # optional: link prediction's held-out positives (`jgraph.data.held_out`)
     "preparation": {"symmetrize": true, ...}}   # optional: what was done to the graph
                                                 # (`jgraph.data.prepare.Preparation`)

File names are relative to DIR, so chunks written by another tool (Spark, a SQL
export) can be listed in a hand-written metadata.json. `ChunkedWriter` writes the
directory a chunk at a time, atomically (as a sibling renamed when complete);
`open_chunked` reads it, checking every file's header against the metadata, and
`ChunkedGraph.edge_chunks` checks each chunk's ids as it is read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

import jgraph.segments as segments
from jgraph.atomic import atomic_dir, occupied
from jgraph.data.graph import (
    DEFAULT_NTYPE,
    DEFAULT_REL,
    Graph,
    GraphError,
    Relation,
    check_conventions,
    check_ids,
    check_name,
    check_user_ids,
    row_arrays,
)
from jgraph.data.links import EdgeSet
from jgraph.data.npz import DatasetError
from jgraph.data.sparse import SparseRows
from jgraph.npy import read_header

FORMAT, VERSION = "jgraph-chunked", 1
# The arrays of a held-out edge split besides its negatives: (key, dtype, row shape).
EDGE_SPLIT_ARRAYS = (("src", "int64", ()), ("dst", "int64", ()), ("etype", "int32", ()))
METADATA = "metadata.json"
_ID_KINDS = "iu"


def is_chunked_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory holding a chunked graph's metadata.json."""
    return metadata_object(path).get("format") == FORMAT


def is_dgl_chunked_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory with a DGL chunked graph's metadata.json (DGL's
    format, converted by `jgraph.ingest.dgl`)."""
    raw = metadata_object(path)
    return all(k in raw for k in ("node_type", "edge_type", "edges"))


def metadata_object(path: str | os.PathLike) -> dict:
    """The JSON object of DIR/metadata.json (a chunked graph's, jgraph's or DGL's), or
    {} where there is none that reads as one: for telling formats apart."""
    try:
        with open(os.path.join(path, METADATA)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


# -- reading ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Chunks:
    """One array stored as row chunks. files: paths relative to the directory; rows:
    rows per chunk; dtype: numpy dtype name; shape: the row shape; sparse: for sparse
    rows, the stored entries per row K (then `files` hold int32[n_i, K] indices,
    `value_files` the values and `shape` is [width])."""

    files: tuple[str, ...]
    rows: tuple[int, ...]
    dtype: str
    shape: tuple[int, ...]
    sparse: int | None = None
    value_files: tuple[str, ...] = ()

    @property
    def starts(self) -> np.ndarray:
        """int64[chunks + 1]: chunk i holds rows [starts[i], starts[i + 1])."""
        return segments.offsets(self.rows)

    @property
    def num_rows(self) -> int:
        return int(sum(self.rows))

    def to_json(self, with_rows: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if with_rows:
            out["rows"] = list(self.rows)
        out["files"] = list(self.files)
        if self.sparse is not None:
            out["sparse"], out["value_files"] = self.sparse, list(self.value_files)
        return out


class EdgeChunk(NamedTuple):
    """Edges [start, start + len(src)) of a chunked graph, homogeneous ids, checked.

    src, dst: int64[e]; etype: int32[e] relation index (zeros for one relation)."""

    start: int
    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray


def npy_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) that a .npy file's header names, or a DatasetError naming it:
    missing, unreadable, or shorter than its header says (truncated)."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: missing chunk file")
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{path}: not a readable .npy file ({e})") from None
    if fortran and len(shape) > 1:
        raise DatasetError(f"{path}: stored in Fortran order; write chunks in C order")
    if dtype.hasobject:
        raise DatasetError(f"{path}: holds Python objects; chunks hold numbers")
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < expected:
        raise DatasetError(f"{path}: truncated: {size} bytes, its header "
                           f"{dtype}{list(shape)} needs {expected}")
    return tuple(int(s) for s in shape), dtype


class ChunkedGraph:
    """An opened chunked graph directory (`open_chunked`). Nothing is read but headers
    until asked; arrays come back memory-mapped.

    Fields: root; name; num_nodes {type: n} in id order; relations [Relation];
    edges: {"src", "dst", "etype"?: Chunks}; edge_data {name: Chunks}; node_data
    {type: {name: Chunks}}; splits {type: {name: Chunks}}; ids {type: (file, dtype)}
    of the types that keep the user's own ids (`node_ids`); edge_splits {split: {"src",
    "dst", "etype", "negatives"?: Chunks}}, link prediction's held-out positives.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        path = os.path.join(self.root, METADATA)
        if not os.path.isdir(self.root):
            raise DatasetError(f"{self.root}: no such directory")
        if not os.path.isfile(path):
            raise DatasetError(f"{path}: missing; not a chunked graph directory (or one whose "
                               f"writing did not finish)")
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise DatasetError(f"{path}: not readable JSON ({e})") from None
        try:
            self._parse(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, DatasetError):
                raise
            raise DatasetError(f"{path}: a field is missing or has the wrong form "
                               f"({type(e).__name__}: {e})") from None
        self._check_headers()

    # -- metadata ---------------------------------------------------------------------

    def _where(self, field: str) -> str:
        return f"{os.path.join(self.root, METADATA)}: {field}"

    def _parse(self, raw: Mapping) -> None:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DatasetError(self._where(f"'format' is {raw.get('format')!r}, expected "
                                           f"{FORMAT!r}"))
        if raw.get("version") != VERSION:
            raise DatasetError(self._where(f"version {raw.get('version')!r} is not supported "
                                           f"(this jgraph reads version {VERSION})"))
        self.name = str(raw.get("graph_name", os.path.basename(os.path.normpath(self.root))))
        num_nodes = raw["num_nodes"]
        if not isinstance(num_nodes, dict) or not num_nodes:
            raise DatasetError(self._where("'num_nodes' must map node types to counts"))
        for t, n in num_nodes.items():
            try:
                check_name("node type", t)
            except GraphError as e:
                raise DatasetError(self._where(str(e))) from None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise DatasetError(self._where(f"num_nodes[{t!r}] = {n!r} is not a count"))
        self.num_nodes = dict(num_nodes)
        self.relations = [Relation(*r) for r in raw["relations"]]
        if not self.relations:
            raise DatasetError(self._where("'relations' is empty"))
        names = [r.name for r in self.relations]
        if len(set(names)) != len(names):
            twice = sorted({x for x in names if names.count(x) > 1})
            raise DatasetError(self._where(f"relations: names must be unique, {twice} "
                                           f"appear more than once"))
        for r in self.relations:
            for t in (r.src_type, r.dst_type):
                if t not in self.num_nodes:
                    raise DatasetError(self._where(f"relation {tuple(r)}: unknown node type "
                                                   f"{t!r}"))
        edges = raw["edges"]
        rows = self._rows(edges["rows"], "edges.rows")
        self.edges = {key: self._chunks(f"edges.{key}", {"files": edges[key], "rows": rows},
                                        rows_given=True)
                      for key in ("src", "dst")}
        if edges.get("etype") is not None:
            self.edges["etype"] = self._chunks("edges.etype",
                                               {"files": edges["etype"], "rows": rows}, True)
        elif len(self.relations) > 1:
            raise DatasetError(self._where(f"{len(self.relations)} relations but no "
                                           f"edges.etype files"))
        self.edge_data = {name: self._chunks(f"edge_data.{name}", {**entry, "rows": rows},
                                             rows_given=True)
                          for name, entry in raw.get("edge_data", {}).items()}
        self.node_data = {}
        for t, named in raw.get("node_data", {}).items():
            self._known_type(t, "node_data")
            self.node_data[t] = {name: self._chunks(f"node_data.{t}.{name}", entry)
                                 for name, entry in named.items()}
            for name, c in self.node_data[t].items():
                if c.num_rows != self.num_nodes[t]:
                    raise DatasetError(self._where(
                        f"node_data.{t}.{name}: chunks hold {c.num_rows} rows, type {t!r} "
                        f"has {self.num_nodes[t]} nodes"))
        self.splits = {}
        for t, named in raw.get("splits", {}).items():
            self._known_type(t, "splits")
            self.splits[t] = {name: self._chunks(f"splits.{t}.{name}",
                                                 {**entry, "dtype": "int64", "shape": []})
                              for name, entry in named.items()}
        self.ids = {}
        for t, entry in raw.get("ids", {}).items():
            self._known_type(t, "ids")
            file, dtype = entry["file"], np.dtype(entry["dtype"])
            if not isinstance(file, str) or not (dtype == np.int64 or dtype.kind == "S"):
                raise DatasetError(self._where(f"ids.{t}: expected a file name and dtype int64 "
                                               f"or S<k> (UTF-8 bytes), got {entry}"))
            self.ids[t] = (file, dtype)
        self.edge_splits = {}
        for name, entry in raw.get("edge_splits", {}).items():
            try:
                check_name("edge split", name)
            except GraphError as e:
                raise DatasetError(self._where(str(e))) from None
            rows = self._rows(entry["rows"], f"edge_splits.{name}.rows")
            arrays = {key: self._chunks(f"edge_splits.{name}.{key}",
                                        {"files": entry[key], "rows": rows, "dtype": dtype,
                                         "shape": shape}, rows_given=True)
                      for key, dtype, shape in EDGE_SPLIT_ARRAYS}
            if entry.get("negatives") is not None:
                k = entry["num_negatives"]
                if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                    raise DatasetError(self._where(f"edge_splits.{name}.num_negatives = "
                                                   f"{k!r} is not a count"))
                arrays["negatives"] = self._chunks(
                    f"edge_splits.{name}.negatives", {"files": entry["negatives"],
                                                      "rows": rows, "shape": [k]}, True)
            self.edge_splits[name] = arrays

    def _known_type(self, t: str, field: str) -> None:
        if t not in self.num_nodes:
            raise DatasetError(self._where(f"{field}: unknown node type {t!r}; node types are "
                                           f"{list(self.num_nodes)}"))

    def _rows(self, rows, field: str) -> tuple[int, ...]:
        if not isinstance(rows, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rows):
            raise DatasetError(self._where(f"{field} must be a list of row counts, got "
                                           f"{str(rows)[:80]}"))
        return tuple(rows)

    def _chunks(self, field: str, entry: Mapping, rows_given: bool = False) -> Chunks:
        name = field.rsplit(".", 1)[-1]
        if field.startswith(("node_data", "edge_data", "splits")):
            try:
                check_name(field.split(".")[0].replace("_", " "), name)
            except GraphError as e:
                raise DatasetError(self._where(str(e))) from None
        rows = entry["rows"] if rows_given else self._rows(entry["rows"], f"{field}.rows")
        files = entry["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise DatasetError(self._where(f"{field}.files must be a list of file names"))
        if len(files) != len(rows):
            raise DatasetError(self._where(f"{field}: {len(files)} files for {len(rows)} "
                                           f"chunks"))
        sparse = entry.get("sparse")
        value_files = tuple(entry.get("value_files", ()))
        if sparse is not None and len(value_files) != len(files):
            raise DatasetError(self._where(f"{field}: sparse rows need one value file per "
                                           f"indices file"))
        dtype = entry.get("dtype", "int64")
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            kind = None
        if kind is None or kind not in "biuf":
            raise DatasetError(self._where(f"{field}: dtype {dtype!r} is not a number type"))
        return Chunks(tuple(files), tuple(rows), np.dtype(dtype).name,
                      tuple(int(s) for s in entry.get("shape", [])), sparse, value_files)

    def _check_headers(self) -> None:
        """Every file exists, is a whole .npy, and has the rows, row shape and dtype kind
        the metadata gives: a stat and a header read per file."""
        def check(field: str, c: Chunks, ids: bool = False):
            for i, (f, rows) in enumerate(zip(c.files, c.rows)):
                row_shape = (c.sparse,) if c.sparse is not None else c.shape
                shape, dtype = npy_header(os.path.join(self.root, f))
                expect = (rows, *row_shape)
                if shape != expect:
                    raise DatasetError(f"{os.path.join(self.root, f)}: {field} chunk {i} has "
                                       f"shape {list(shape)}, metadata.json says "
                                       f"{list(expect)}")
                if ids and dtype.kind not in _ID_KINDS:
                    raise DatasetError(f"{os.path.join(self.root, f)}: {field} holds "
                                       f"{dtype}, expected integer ids")
                if not ids and c.sparse is None and dtype != np.dtype(c.dtype):
                    raise DatasetError(f"{os.path.join(self.root, f)}: {field} holds {dtype}, "
                                       f"metadata.json says {c.dtype}")
                if c.sparse is not None and dtype != np.dtype(np.int32):
                    raise DatasetError(f"{os.path.join(self.root, f)}: {field} sparse indices "
                                       f"hold {dtype}, expected int32 columns")
                if c.sparse is not None:
                    vpath = os.path.join(self.root, c.value_files[i])
                    vshape, vdtype = npy_header(vpath)
                    if vshape != expect or vdtype != np.dtype(c.dtype):
                        raise DatasetError(f"{vpath}: {field} values are "
                                           f"{vdtype}{list(vshape)}, expected "
                                           f"{c.dtype}{list(expect)}")
        for key, c in self.edges.items():
            check(f"edges.{key}", c, ids=True)
        for name, c in self.edge_data.items():
            check(f"edge_data.{name}", c)
        for t, named in self.node_data.items():
            for name, c in named.items():
                check(f"node_data.{t}.{name}", c)
        for t, named in self.splits.items():
            for name, c in named.items():
                check(f"splits.{t}.{name}", c, ids=True)
        for name, arrays in self.edge_splits.items():
            for key, c in arrays.items():
                check(f"edge_splits.{name}.{key}", c)
        for t, (file, dtype) in self.ids.items():
            shape, stored = npy_header(os.path.join(self.root, file))
            if shape != (self.num_nodes[t],) or stored != dtype:
                raise DatasetError(f"{os.path.join(self.root, file)}: ids.{t} hold "
                                   f"{stored}{list(shape)}, expected {dtype}"
                                   f"[{self.num_nodes[t]}] (one id per node)")

    # -- views ------------------------------------------------------------------------

    def all_chunks(self) -> list[Chunks]:
        """Every array's chunks: edges, edge data, node data, splits, edge splits."""
        return [*self.edges.values(), *self.edge_data.values(),
                *(c for named in self.node_data.values() for c in named.values()),
                *(c for named in self.splits.values() for c in named.values()),
                *(c for arrays in self.edge_splits.values() for c in arrays.values())]

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def total_nodes(self) -> int:
        return sum(self.num_nodes.values())

    @property
    def num_edges(self) -> int:
        return self.edges["src"].num_rows

    @property
    def num_edge_chunks(self) -> int:
        return len(self.edges["src"].rows)

    def type_offsets(self) -> np.ndarray:
        """int64[T+1]: node type t has homogeneous ids [offsets[t], offsets[t+1])."""
        return segments.offsets(list(self.num_nodes.values()))

    def path(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    def load(self, relative: str) -> np.ndarray:
        """One chunk file, memory-mapped (its header was checked on opening)."""
        try:
            return np.load(self.path(relative), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DatasetError(f"{self.path(relative)}: cannot be read ({e})") from None

    def edge_chunk(self, i: int, check: bool = True, rows: slice = slice(None)) -> EdgeChunk:
        """Edge chunk i (or its `rows`), its ids as int64 (etype int32) and, with
        `check`, in range: src and dst below the node count, etype a relation whose node
        types hold them."""
        c = self.edges["src"]
        start = int(c.starts[i]) + (rows.start or 0)
        src = np.asarray(self.load(c.files[i])[rows], dtype=np.int64)
        dst = np.asarray(self.load(self.edges["dst"].files[i])[rows], dtype=np.int64)
        if "etype" in self.edges:
            etype = np.asarray(self.load(self.edges["etype"].files[i])[rows])
            if check and etype.size and (etype.min() < 0 or etype.max() >= len(self.relations)):
                self._check_edges(i, start, src, dst, etype.astype(np.int64))
            etype = etype.astype(np.int32)
        else:
            etype = np.zeros(src.size, np.int32)
        if check:
            self._check_edges(i, start, src, dst, etype)
        return EdgeChunk(start, src, dst, etype)

    def edge_blocks(self, max_edges: int, check: bool = True
                    ) -> Iterator[tuple[int, slice, EdgeChunk]]:
        """(chunk i, rows of it, those edges) for every chunk read in blocks of at most
        `max_edges`: memory bounded whatever size the chunks were written in."""
        for i, rows in enumerate(self.edges["src"].rows):
            for a in range(0, rows, max_edges):
                block = slice(a, min(a + max_edges, rows))
                yield i, block, self.edge_chunk(i, check, block)

    def edge_chunks(self, check: bool = True, chunks: Sequence[int] | None = None
                    ) -> Iterator[EdgeChunk]:
        """The edge chunks (all, or those listed) in order, one at a time."""
        for i in range(self.num_edge_chunks) if chunks is None else chunks:
            yield self.edge_chunk(i, check)

    def _check_edges(self, i: int, start: int, src, dst, etype) -> None:
        n, r = self.total_nodes, len(self.relations)
        for key, ids, limit in (("src", src, n), ("dst", dst, n), ("etype", etype, r)):
            if ids.size and (ids.min() < 0 or ids.max() >= limit):
                at = int(np.flatnonzero((ids < 0) | (ids >= limit))[0])
                raise DatasetError(f"{self.path(self.edges[key].files[i])}: {key} "
                                   f"{int(ids[at])} at edge {start + at} is out of range "
                                   f"[0, {limit})")
        if r == 1 and len(self.num_nodes) == 1:
            return
        offsets = self.type_offsets()
        types = {t: k for k, t in enumerate(self.node_types)}
        src_type = np.array([types[rel.src_type] for rel in self.relations])[etype]
        dst_type = np.array([types[rel.dst_type] for rel in self.relations])[etype]
        for key, ids, want in (("src", src, src_type), ("dst", dst, dst_type)):
            wrong = (ids < offsets[want]) | (ids >= offsets[want + 1])
            if wrong.any():
                at = int(np.flatnonzero(wrong)[0])
                rel = self.relations[int(etype[at])]
                raise DatasetError(
                    f"{self.path(self.edges[key].files[i])}: {key} {int(ids[at])} at edge "
                    f"{start + at} is not a node of type "
                    f"{rel.src_type if key == 'src' else rel.dst_type!r}, which relation "
                    f"{tuple(rel)} (etype {int(etype[at])}) needs")

    def node_rows(self, ntype: str, name: str, ids: np.ndarray | None = None):
        """Rows of node array `name` of type `ntype` (type-local ids), whole or at the
        sorted `ids`, read chunk by chunk: an array, or `SparseRows` for sparse rows."""
        c = self.node_data[ntype][name]
        starts = c.starts
        ids = np.arange(c.num_rows) if ids is None else np.asarray(ids, np.int64)
        pieces, values = [], []
        bounds = np.searchsorted(ids, starts)
        for i in range(len(c.files)):
            local = ids[bounds[i]:bounds[i + 1]] - starts[i]
            if not local.size:
                continue
            pieces.append(np.asarray(self.load(c.files[i])[local]))
            if c.sparse is not None:
                values.append(np.asarray(self.load(c.value_files[i])[local]))
            self.check_rows(c.value_files[i] if c.sparse is not None else c.files[i],
                             ntype, name, values[-1] if c.sparse is not None else pieces[-1],
                             local + starts[i])
        if c.sparse is not None:
            empty = lambda dt: np.zeros((0, c.sparse), dt)
            idx = np.concatenate(pieces) if pieces else empty(np.int32)
            val = np.concatenate(values) if values else empty(c.dtype)
            return SparseRows(idx.astype(np.int32, copy=False), val, c.shape[0])
        return (np.concatenate(pieces) if pieces
                else np.zeros((0, *c.shape), c.dtype))

    def check_rows(self, file: str, ntype: str, name: str, rows: np.ndarray,
                    ids: np.ndarray) -> None:
        """What `Graph` checks of node arrays, on rows as they are read: no NaN or
        infinity, and `label` classes of -1 (unlabelled) or more; a DatasetError naming
        the file and the node (type-local id) otherwise."""
        where = f"{self.path(file)}: node data {name!r} of type {ntype!r}"
        if rows.dtype.kind == "f":
            bad = ~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)
            if bad.any():
                at = int(np.flatnonzero(bad)[0])
                row = rows[at].reshape(-1)
                raise DatasetError(f"{where} holds {row[~np.isfinite(row)][0]} at node "
                                   f"{int(ids[at])}; NaN and infinity are not valid node "
                                   f"values")
        if name == "label" and rows.dtype.kind not in "iu":
            raise DatasetError(f"{where} holds {rows.dtype}; labels are one integer class "
                               f"per node (-1 = unlabelled)")
        if name == "label" and rows.size and rows.min() < -1:
            at = int(np.argmin(rows))
            raise DatasetError(f"{where} holds {rows[at]} at node {int(ids[at])}; labels are "
                               f"classes 0..C-1, or -1 for unlabelled")

    def split(self, ntype: str, name: str, lo: int = 0, hi: int | None = None
              ) -> np.ndarray:
        """int64: the split's node ids (type-local), those in [lo, hi) (every one by
        default), checked sorted, unique and in range. A range is cut from each chunk
        (memory-mapped) by binary search, so reading it costs what it holds; the chunks'
        order is checked whole by `check_split`."""
        n = self.num_nodes[ntype]
        hi = n if hi is None else min(hi, n)
        files = self.splits[ntype][name].files
        pieces, before = [], None
        for i, f in enumerate(files):
            chunk = self.load(f)
            if (lo, hi) != (0, n):
                chunk = chunk[np.searchsorted(chunk, lo):np.searchsorted(chunk, hi)]
            ids = np.asarray(chunk, np.int64)
            self._check_split_ids(ntype, name, i, ids, before)
            before = int(ids[-1]) if ids.size else before
            pieces.append(ids)
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def check_split(self, ntype: str, name: str, chunks: Sequence[int] | None = None
                    ) -> None:
        """Check the split's `chunks` (every one by default), a chunk at a time: node ids
        in range, sorted and unique within each and after the chunk before it (its
        last id, read alone). Several processes each check a share of the chunks."""
        files = self.splits[ntype][name].files
        for i in range(len(files)) if chunks is None else chunks:
            before = None
            for j in range(i - 1, -1, -1):                  # the last id before chunk i
                earlier = self.load(files[j])
                if earlier.size:
                    before = int(earlier[-1])
                    break
            self._check_split_ids(ntype, name, i, np.asarray(self.load(files[i]), np.int64),
                                  before)

    def _check_split_ids(self, ntype: str, name: str, i: int, ids: np.ndarray,
                         before: int | None) -> None:
        """Chunk i's ids (or a run of them) in range and increasing, after `before`."""
        where = f"{self.root}: splits.{ntype}.{name}"
        n = self.num_nodes[ntype]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise DatasetError(f"{where}: node {int(bad)} is out of range [0, {n})")
        if before is not None and ids.size:
            ids = np.concatenate([[before], ids])
        if ids.size > 1 and not (np.diff(ids) > 0).all():
            at = int(np.flatnonzero(np.diff(ids) <= 0)[0])
            raise DatasetError(f"{where}: ids must be sorted and unique across the chunks; "
                               f"{int(ids[at])} is followed by {int(ids[at + 1])} (chunk "
                               f"{self.path(self.splits[ntype][name].files[i])})")

    def node_ids(self, ntype: str) -> np.ndarray | None:
        """The user's id of each node of `ntype` (int64[n] or S<k>[n], memory-mapped), or
        None for a type known by its ids 0..n-1."""
        if ntype not in self.num_nodes:
            raise DatasetError(self._where(f"unknown node type {ntype!r}; node types are "
                                           f"{list(self.num_nodes)}"))
        return self.load(self.ids[ntype][0]) if ntype in self.ids else None

    def edge_set(self, split: str) -> EdgeSet:
        """The held-out positives of edge split `split`, whole, in memory."""
        if split not in self.edge_splits:
            raise DatasetError(self._where(f"edge_splits: no split {split!r}; the graph has "
                                           f"{sorted(self.edge_splits) or 'none'}"))
        arrays = self.edge_splits[split]

        def whole(key: str) -> np.ndarray:
            c = arrays[key]
            return np.concatenate([np.zeros((0, *c.shape), c.dtype),
                                   *(np.asarray(self.load(f)) for f in c.files)])
        return EdgeSet(whole("src"), whole("dst"), whole("etype"),
                       whole("negatives") if "negatives" in arrays else None)

    def to_graph(self, *, edge_splits: bool = True) -> Graph:
        """The whole graph in memory (for graphs that fit: `--method metis`). A graph with
        held-out link edges is refused (a `Graph` does not carry them) unless
        `edge_splits` is False: then they are left aside (`edge_set` reads them)."""
        if self.edge_splits and edge_splits:
            raise DatasetError(f"{self.root}: holds link prediction's held-out edges "
                               f"({', '.join(self.edge_splits)}), which a graph in memory "
                               f"does not carry; partition it in bounded memory "
                               f"(--method multilevel, data.method: multilevel)")
        chunks = list(self.edge_chunks())
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt)
        src, dst = cat([c.src for c in chunks], np.int64), cat([c.dst for c in chunks], np.int64)
        etype = cat([c.etype for c in chunks], np.int32)
        del chunks
        offsets = dict(zip(self.node_types, self.type_offsets()))
        # Relations are grouped in relation order (stable), so the in-memory edge ids
        # equal the stored ones wherever the chunks store relations one after another.
        order, bounds = segments.group_by(etype, len(self.relations))
        edges, edge_data = {}, {}
        data = {name: cat([np.asarray(self.load(f)) for f in c.files],
                          c.dtype).reshape(-1, *c.shape)
                for name, c in self.edge_data.items()}
        for k, rel in enumerate(self.relations):
            sel = order[bounds[k]:bounds[k + 1]]
            edges[rel] = np.stack([src[sel] - offsets[rel.src_type],
                                   dst[sel] - offsets[rel.dst_type]])
            if data:
                edge_data[rel] = {name: values[sel] for name, values in data.items()}
        return Graph(
            name=self.name, num_nodes=self.num_nodes, edges=edges,
            node_data={t: {name: self.node_rows(t, name) for name in named}
                       for t, named in self.node_data.items()},
            edge_data=edge_data,
            splits={t: {name: self.split(t, name) for name in named}
                    for t, named in self.splits.items()},
            ids={t: np.asarray(self.node_ids(t)) for t in self.ids})


def open_chunked(root: str | os.PathLike) -> ChunkedGraph:
    """Open a chunked graph directory, checking metadata.json and every file's header."""
    return ChunkedGraph(root)


def load_chunked(root: str | os.PathLike) -> Graph:
    """A chunked graph directory read whole into a `Graph`."""
    return open_chunked(root).to_graph()


# -- writing ----------------------------------------------------------------------------


class ChunkedWriter:
    """Writes a chunked graph directory a chunk at a time; use it as a context manager.

        with ChunkedWriter("data/mygraph", num_nodes=n) as w:
            for src, dst in my_edge_batches():          # homogeneous ids
                w.add_edges(src, dst)
            for rows in my_feature_batches():           # in row order
                w.add_node_data("feat", rows)
            w.add_node_data("label", labels)
            w.add_split("train", train_ids)             # sorted, unique, in order

    Each call writes one chunk. For several node types give `num_nodes` as
    {type: count} (their order numbers the homogeneous ids) and `relations` as
    (src_type, name, dst_type) triples; `add_edges(..., relation=r)` then takes ids
    local to r's types, or `etype=` with homogeneous ids. The directory appears at
    `out` only when the block ends without an error, with metadata.json written last.
    """

    def __init__(self, out: str | os.PathLike, num_nodes: int | Mapping[str, int], *,
                 name: str = "graph", relations: Sequence[Sequence[str]] | None = None,
                 overwrite: bool = False, preparation: Mapping | None = None):
        self.out = os.path.realpath(os.fspath(out))
        if isinstance(num_nodes, Mapping):
            self.num_nodes = {t: int(n) for t, n in num_nodes.items()}
        else:
            self.num_nodes = {DEFAULT_NTYPE: int(num_nodes)}
        for t, n in self.num_nodes.items():
            check_name("node type", t)
            if n < 0:
                raise GraphError(f"num_nodes[{t!r}] = {n} is negative")
        if relations is None:
            if len(self.num_nodes) != 1:
                raise GraphError("several node types need their relations: "
                                 "relations=[(src_type, name, dst_type), ...]")
            (t,) = self.num_nodes
            relations = [(t, DEFAULT_REL, t)]
        self.relations = [Relation(*r) for r in relations]
        for r in self.relations:
            for t in (r.src_type, r.dst_type):
                if t not in self.num_nodes:
                    raise GraphError(f"relation {tuple(r)}: unknown node type {t!r}")
        if len({r.name for r in self.relations}) != len(self.relations):
            raise GraphError(f"relation names must be unique, got "
                             f"{[r.name for r in self.relations]}")
        self.name = name
        self.overwrite = overwrite
        # What was done to the graph before it was written (`jgraph.data.prepare`).
        self.preparation = dict(preparation) if preparation else None
        self._offsets = dict(zip(self.num_nodes,
                                 segments.offsets(list(self.num_nodes.values()))))
        self._total = sum(self.num_nodes.values())
        self._edges: dict[str, list] = {"rows": [], "src": [], "dst": [], "etype": []}
        self._edge_data: dict[str, dict] = {}
        self._node_data: dict[str, dict[str, dict]] = {}
        self._splits: dict[str, dict[str, dict]] = {}
        self._ids: dict[str, dict[str, str]] = {}
        self._split_last: dict[tuple[str, str], int] = {}
        self._edge_splits: dict[str, dict] = {}
        self._stack = contextlib.ExitStack()
        self._dir: str | None = None

    def __enter__(self) -> ChunkedWriter:
        check_chunked_out(self.out, self.overwrite)
        self._dir = self._stack.enter_context(
            atomic_dir(self.out, lambda: check_chunked_out(self.out, self.overwrite)))
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            try:
                self._finish()
            except BaseException:
                self._stack.__exit__(*sys.exc_info())
                raise
        return self._stack.__exit__(kind, value, traceback)

    def _save(self, relative: str, array: np.ndarray) -> str:
        if self._dir is None:
            raise RuntimeError("use ChunkedWriter as a context manager: with ChunkedWriter(...)")
        path = os.path.join(self._dir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, np.ascontiguousarray(array))
        return relative

    @staticmethod
    def _id_dtype(limit: int):
        return np.int32 if limit < 2**31 else np.int64

    def add_edges(self, src, dst, *, etype=None, relation: Sequence[str] | None = None,
                  data: Mapping[str, np.ndarray] | None = None) -> None:
        """One chunk of edges src -> dst, with per-edge `data` arrays (the same names in
        every call). Ids are homogeneous, or local to `relation`'s node types."""
        src, dst = np.asarray(src), np.asarray(dst)
        k = len(self._edges["rows"])
        what = f"edge chunk {k}"
        if src.ndim != 1 or src.shape != dst.shape:
            raise GraphError(f"{what}: src and dst must be 1-D and of one length, got "
                             f"{list(src.shape)} and {list(dst.shape)}")
        for key, a in (("src", src), ("dst", dst)):
            if a.dtype.kind not in _ID_KINDS and a.size:
                raise GraphError(f"{what}: {key} must be integers, got {a.dtype}")
        if relation is not None and etype is not None:
            raise GraphError(f"{what}: give relation= or etype=, not both")
        if relation is not None:
            r = Relation(*relation)
            if r not in self.relations:
                raise GraphError(f"{what}: relation {tuple(r)} is not one of "
                                 f"{[tuple(x) for x in self.relations]}")
            i = self.relations.index(r)
            for key, a, t in (("src", src, r.src_type), ("dst", dst, r.dst_type)):
                check_ids(a, self.num_nodes[t], f"{what}: {key} (type {t!r})")
            src = src.astype(np.int64) + self._offsets[r.src_type]
            dst = dst.astype(np.int64) + self._offsets[r.dst_type]
            etype = np.full(src.size, i, np.int32)
        else:
            for key, a in (("src", src), ("dst", dst)):
                check_ids(a, self._total, f"{what}: {key}")
            if etype is None:
                if len(self.relations) > 1:
                    raise GraphError(f"{what}: the graph has {len(self.relations)} relations: "
                                     f"give relation= or etype=")
                etype = np.zeros(src.size, np.int32)
            etype = np.asarray(etype)
            if etype.shape != src.shape or (etype.dtype.kind not in _ID_KINDS and etype.size):
                raise GraphError(f"{what}: etype must be integers of src's length, got "
                                 f"{etype.dtype}{list(etype.shape)}")
            check_ids(etype, len(self.relations), f"{what}: etype")
        data = dict(data or {})
        if k and set(data) != set(self._edge_data):
            raise GraphError(f"{what}: edge data {sorted(data)}, but the first chunk had "
                             f"{sorted(self._edge_data)}; every chunk carries the same")
        checked = row_arrays(data, src.size, "edge", what)
        for name, values in checked.items():
            entry = self._edge_data.setdefault(
                name, {"dtype": values.dtype.name, "shape": list(values.shape[1:]),
                       "files": []})
            if values.dtype.name != entry["dtype"] or list(values.shape[1:]) != entry["shape"]:
                raise GraphError(f"{what}: edge data {name!r} is {values.dtype}"
                                 f"{list(values.shape[1:])}, earlier chunks "
                                 f"{entry['dtype']}{entry['shape']}")
            entry["files"].append(self._save(f"edges/data/{name}-{k:05d}.npy", values))
        ids = self._id_dtype(self._total)
        self._edges["rows"].append(int(src.size))
        self._edges["src"].append(self._save(f"edges/src-{k:05d}.npy", src.astype(ids)))
        self._edges["dst"].append(self._save(f"edges/dst-{k:05d}.npy", dst.astype(ids)))
        if len(self.relations) > 1:
            kind = np.int8 if len(self.relations) < 128 else np.int32
            self._edges["etype"].append(self._save(f"edges/etype-{k:05d}.npy",
                                                   etype.astype(kind)))

    def add_node_data(self, name: str, rows, *, ntype: str | None = None) -> None:
        """The next rows (in id order) of node array `name` of type `ntype`: an array,
        or `SparseRows` for sparse rows."""
        ntype = self._type(ntype)
        if name.endswith((".indices", ".values")):
            raise GraphError(f"node data {name!r}: names ending in .indices or .values are "
                             f"kept for the files of sparse rows")
        entry = self._node_data.setdefault(ntype, {}).get(name)
        start = sum(entry["rows"]) if entry else 0
        what = f"type {ntype!r} rows {start}.."
        try:
            checked = row_arrays({name: rows}, len(rows), "node", what)
            check_conventions(checked, what)
        except GraphError as e:
            raise GraphError(f"node data {name!r}: {e}") from None
        values = checked[name]
        sparse = isinstance(values, SparseRows)
        spec = {"dtype": values.dtype.name,
                "shape": [values.width] if sparse else list(values.shape[1:])}
        if sparse:
            spec["sparse"] = int(values.indices.shape[1])
        if entry is None:
            entry = self._node_data[ntype][name] = {**spec, "rows": [], "files": []}
            if sparse:
                entry["value_files"] = []
        elif any(entry.get(key) != v for key, v in spec.items()):
            raise GraphError(f"node data {name!r} of type {ntype!r}: rows from {start} are "
                             f"{spec}, earlier rows {({k: entry.get(k) for k in spec})}")
        if start + len(values) > self.num_nodes[ntype]:
            raise GraphError(f"node data {name!r} of type {ntype!r}: {start + len(values)} "
                             f"rows given, the type has {self.num_nodes[ntype]} nodes")
        k = len(entry["rows"])
        stem = f"nodes/{ntype}/{name}"
        if sparse:
            entry["files"].append(self._save(f"{stem}.indices-{k:05d}.npy", values.indices))
            entry["value_files"].append(self._save(f"{stem}.values-{k:05d}.npy", values.values))
        else:
            entry["files"].append(self._save(f"{stem}-{k:05d}.npy", values))
        entry["rows"].append(len(values))

    def add_split(self, name: str, ids, *, ntype: str | None = None) -> None:
        """The next ids (type-local, sorted, unique, above those given before) of the
        named node set `name` (train, val, test, ...)."""
        ntype = self._type(ntype)
        check_name("split", name)
        ids = np.asarray(ids)
        what = f"split {name!r} of type {ntype!r}"
        if ids.ndim != 1 or (ids.dtype.kind not in _ID_KINDS and ids.size):
            raise GraphError(f"{what}: ids must be a 1-D integer array, got "
                             f"{ids.dtype}{list(ids.shape)}")
        check_ids(ids, self.num_nodes[ntype], what)
        last = self._split_last.get((ntype, name), -1)
        ids = ids.astype(np.int64)
        if ids.size and (ids[0] <= last or (np.diff(ids) <= 0).any()):
            raise GraphError(f"{what}: ids must be sorted, unique and above those of earlier "
                             f"chunks (last {last})")
        entry = self._splits.setdefault(ntype, {}).setdefault(name, {"rows": [], "files": []})
        k = len(entry["rows"])
        entry["files"].append(self._save(f"splits/{ntype}/{name}-{k:05d}.npy",
                                         ids.astype(self._id_dtype(self.num_nodes[ntype]))))
        entry["rows"].append(int(ids.size))
        if ids.size:
            self._split_last[ntype, name] = int(ids[-1])

    def add_edge_split(self, name: str, src, dst, etype, negatives=None) -> None:
        """The next positives of link prediction's edge split `name` (train, val, test):
        homogeneous src, dst, their relation's index etype, and for an evaluation split
        negatives int[k, K], fixed negative destinations (homogeneous)."""
        check_name("edge split", name)
        arrays = {"src": np.asarray(src), "dst": np.asarray(dst), "etype": np.asarray(etype)}
        what = f"edge split {name!r}"
        if any(a.ndim != 1 or a.shape != arrays["src"].shape for a in arrays.values()):
            raise GraphError(f"{what}: src, dst and etype must be 1-D and of one length, got "
                             f"{ {k: list(a.shape) for k, a in arrays.items()} }")
        for key, limit in (("src", self._total), ("dst", self._total),
                           ("etype", len(self.relations))):
            check_ids(arrays[key], limit, f"{what}: {key}")
        entry = self._edge_splits.setdefault(
            name, {"rows": [], **{key: [] for key, _, _ in EDGE_SPLIT_ARRAYS},
                   "negatives": None if negatives is None else []})
        if (negatives is None) != (entry["negatives"] is None):
            raise GraphError(f"{what}: negatives given for some chunks and not others")
        if negatives is not None:
            negatives = np.asarray(negatives)
            if negatives.ndim != 2 or negatives.shape[0] != arrays["src"].size:
                raise GraphError(f"{what}: negatives must be [{arrays['src'].size}, K], got "
                                 f"{list(negatives.shape)}")
            if entry.setdefault("num_negatives", negatives.shape[1]) != negatives.shape[1]:
                raise GraphError(f"{what}: {negatives.shape[1]} negatives each, earlier "
                                 f"chunks {entry['num_negatives']}")
            check_ids(negatives, self._total, f"{what}: negatives")
            arrays["negatives"] = negatives
        k = len(entry["rows"])
        for key, dtype, _ in (*EDGE_SPLIT_ARRAYS, ("negatives", "int64", ())):
            if key in arrays:
                entry[key].append(self._save(f"edge_splits/{name}/{key}-{k:05d}.npy",
                                             arrays[key].astype(dtype)))
        entry["rows"].append(int(arrays["src"].size))

    def add_ids(self, ids, *, ntype: str | None = None) -> None:
        """The user's own id of every node of `ntype`, whole, in node order: integers
        (stored int64) or strings (stored as UTF-8 bytes S<k>); unique."""
        ntype = self._type(ntype)
        if ntype in self._ids:
            raise GraphError(f"ids of type {ntype!r} are given twice")
        ids = check_user_ids(ids, self.num_nodes[ntype], f"ids of type {ntype!r}")
        dtype = "int64" if ids.dtype.kind == "i" else f"S{ids.dtype.itemsize}"
        self._ids[ntype] = {"file": self._save(f"ids/{ntype}.npy", ids), "dtype": dtype}

    def _type(self, ntype: str | None) -> str:
        if ntype is None:
            if len(self.num_nodes) != 1:
                raise GraphError(f"the graph has node types {list(self.num_nodes)}: name one "
                                 f"with ntype=")
            (ntype,) = self.num_nodes
        if ntype not in self.num_nodes:
            raise GraphError(f"unknown node type {ntype!r}; node types are "
                             f"{list(self.num_nodes)}")
        return ntype

    def _finish(self) -> None:
        for t, named in self._node_data.items():
            for name, entry in named.items():
                if sum(entry["rows"]) != self.num_nodes[t]:
                    raise GraphError(f"node data {name!r} of type {t!r}: {sum(entry['rows'])} "
                                     f"rows written, the type has {self.num_nodes[t]} nodes")
        meta = {
            "format": FORMAT, "version": VERSION, "graph_name": self.name,
            "num_nodes": self.num_nodes,
            "relations": [list(r) for r in self.relations],
            "edges": {"rows": self._edges["rows"], "src": self._edges["src"],
                      "dst": self._edges["dst"],
                      "etype": self._edges["etype"] if len(self.relations) > 1 else None},
            "edge_data": self._edge_data,
            "node_data": self._node_data,
            "splits": self._splits,
        }
        if self._ids:
            meta["ids"] = self._ids
        if self._edge_splits:
            meta["edge_splits"] = self._edge_splits
        if self.preparation:
            meta["preparation"] = self.preparation
        path = os.path.join(self._dir, METADATA)
        with open(path + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(path + ".tmp", path)


def check_chunked_out(out: str, overwrite: bool) -> None:
    """Raise a DatasetError unless `out` may receive a chunked graph: absent, an empty
    directory, or (with `overwrite`) a chunked graph directory."""
    found = occupied(out, is_chunked_dir, "a chunked graph directory", overwrite)
    if found:
        reason, replaceable = found
        raise DatasetError(f"{out}: {reason}" + ("; pass overwrite=True (--overwrite) to "
                                                 "replace it" if replaceable else ""))


def save_chunked(graph: Graph, out: str | os.PathLike, *, edges_per_chunk: int = 1 << 24,
                 rows_per_chunk: int = 1 << 20, overwrite: bool = False,
                 edge_splits: Mapping[str, Any] | None = None,
                 preparation: Mapping | None = None) -> None:
    """Write an in-memory `graph` as a chunked directory (relations in order, so the
    edge ids are the graph's homogeneous edge ids). edge_splits: link prediction's
    positives by split (`jgraph.data.links.EdgeSet`s); preparation: what was done to
    `graph` before (`Preparation.to_json()`), recorded in metadata.json."""
    # An edge array of one name is one column over the relations: its dtype the one
    # that holds every relation's values.
    dtypes = {}
    for data in graph.edge_data.values():
        for name, values in data.items():
            dtypes[name] = np.result_type(dtypes.get(name, values.dtype), values.dtype)
    with ChunkedWriter(out, graph.num_nodes, name=graph.name, relations=graph.relations,
                       overwrite=overwrite, preparation=preparation) as w:
        for rel, index in graph.edges.items():
            data = graph.edge_data.get(rel, {})
            for a in range(0, index.shape[1], edges_per_chunk):
                sl = slice(a, a + edges_per_chunk)
                w.add_edges(index[0, sl], index[1, sl], relation=rel,
                            data={k: v[sl].astype(dtypes[k], copy=False)
                                  for k, v in data.items()})
        for t, named in graph.node_data.items():
            for name, values in named.items():
                for a in range(0, max(len(values), 1), rows_per_chunk):
                    w.add_node_data(name, values[a:a + rows_per_chunk], ntype=t)
        for t, named in graph.splits.items():
            for name, ids in named.items():
                w.add_split(name, ids, ntype=t)
        for t, ids in graph.ids.items():
            w.add_ids(ids, ntype=t)
        for name, split in (edge_splits or {}).items():
            w.add_edge_split(name, split.src, split.dst, split.etype, split.negatives)
