"""The partition directory: writing it, and opening one partition without the others.

Layout (format version 1):

    DIR/meta.json                  see `PartitionMeta`
    DIR/node_map.npy               int64[N]  new global id -> original homogeneous id
    DIR/node_map_inv.npy           int64[N]  original homogeneous id -> new global id
    DIR/assignment.npy             int16/int32[N]  original homogeneous id -> its partition
                                   (what `jgraph partition --assignment` reads; written
                                   by every route, absent in directories written before)
    DIR/part-K/indptr.npy          int64[n_K + 1]  in-edge CSC over the part's nodes
    DIR/part-K/indices.npy         int64[E_K]  global id of each in-edge's source
    DIR/part-K/etype.npy           int32[E_K]  relation index of each in-edge
    DIR/part-K/edge_ids.npy        int64[E_K]  original homogeneous edge id
    DIR/part-K/halo.npy            int64[H_K]  sorted remote in-neighbours (1-hop halo)
    DIR/part-K/node/<type>/<name>.npy   per-node arrays of the part's nodes of <type>,
                                        in global-id order
    DIR/part-K/edge/<name>.npy     per-edge arrays, aligned with indices.npy
    DIR/part-K/split/<type>/<name>.npy  sorted global ids of the part's nodes in a split
    DIR/part-K/edges/<split>/{eid,src,dst,etype}.npy  link prediction's positive edges
                                   whose destination the part owns (see `EDGE_ARRAYS`)
    DIR/part-K/edges/<split>/negatives.npy  int64[n, K] their fixed negatives (val, test)

A node's original homogeneous id numbers the original graph's node types one after
another: type t's local id i is `orig_type_offsets[t] + i`. In-edges of each node are
sorted by (relation, source), so one relation's neighbours are contiguous.
Every array opens as a read-only memory map. Node and edge data hold numbers or
booleans only (`READABLE_KINDS`).

Opening a directory checks meta.json against itself, and each array's shape and
dtype; `PartitionedGraph.check_part(k)` checks what a training step relies on in
partition k (`DistGraph` runs it on its partitions), `PartitionedGraph.check()` checks
everything (`jgraph info --check`). A directory is written whole or not at all
(`jgraph.partition.chunked`, which every route writes by).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

import jgraph.segments as segments
from jgraph.data.ids import IdMap
from jgraph.data.sparse import SparseRows
from jgraph.npy import read_header
from jgraph.partition.book import PartitionBook

FORMAT_VERSION = 1
ASSIGNMENT = "assignment.npy"

# numpy dtype kinds that node and edge data may have: bool, signed and unsigned
# integers, floats. Anything else (strings, objects, ...) cannot be memory-mapped or
# fed to a model, so it is refused when written and reported when read.
READABLE_KINDS = "biuf"

# The arrays every part has, by file name (without .npy).
PART_ARRAYS = ("indptr", "indices", "etype", "edge_ids", "halo")

# The arrays of one edge split in a part: eid int64 (position in the split, the same
# on any mesh), src and dst int64 global ids, etype int32 relation index; evaluation
# splits add negatives int64[n, K].
EDGE_ARRAYS = {"eid": np.int64, "src": np.int64, "dst": np.int64, "etype": np.int32}

class PartitionFormatError(ValueError):
    """A partition directory that is missing, incomplete or corrupt; names the file."""


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """meta.json's entry for one node or edge array.

    Fields:
      dtype: numpy dtype name; shape: the row shape (for sparse rows: [width]).
      min, max: the value range of integer arrays (None for others, and in directories
        written before ranges were recorded).
      sparse: for sparse rows (`SparseRows`), the stored entries per row K; else None.
    """

    dtype: str
    shape: tuple[int, ...]
    min: int | None = None
    max: int | None = None
    sparse: int | None = None

    @classmethod
    def from_json(cls, entry: Mapping) -> ArraySpec:
        """From a checked meta.json entry (see `_spec_problem`)."""
        return cls(entry["dtype"], tuple(entry["shape"]), entry.get("min"), entry.get("max"),
                   entry.get("sparse"))

    def to_json(self) -> dict[str, Any]:
        out = {"dtype": self.dtype, "shape": list(self.shape)}
        if self.min is not None:
            out["min"], out["max"] = self.min, self.max
        if self.sparse is not None:
            out["sparse"] = self.sparse
        return out

    @property
    def has_range(self) -> bool:
        return self.min is not None


@dataclasses.dataclass(frozen=True)
class PartInfo:
    """meta.json's entry for one partition: its node count (and per type), stored
    in-edges, halo size, the size of each split there ({type: {split: count}}), of
    each edge split ({split: positives whose destination it owns}) and its halo by
    owner ([P]: how many of its halo nodes each partition owns; empty in partitions
    written before it was recorded)."""

    num_nodes: int
    num_nodes_per_type: dict[str, int]
    num_edges: int
    num_halo: int
    splits: dict[str, dict[str, int]]
    edge_splits: dict[str, int] = dataclasses.field(default_factory=dict)
    halo_by_owner: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def from_json(cls, entry: Mapping) -> PartInfo:
        return cls(**{f.name: entry[f.name] for f in dataclasses.fields(cls)
                      if f.name in entry or f.default_factory is dataclasses.MISSING})


@dataclasses.dataclass(frozen=True)
class PartitionMeta:
    """The contents of meta.json.

    Fields:
      graph_name, num_parts, method: what was partitioned, into how many, and how.
      node_types: [T] names; relations: [R] (src_type, name, dst_type) triples.
      num_nodes, num_edges: totals; num_nodes_per_type {type: n};
        num_edges_per_relation [R].
      offsets: [P+1]; ntype_offsets: [P][T+1] (see `PartitionBook`);
        orig_type_offsets: [T+1] for original homogeneous ids.
      node_data: {type: {name: ArraySpec}}; sparse rows (`ArraySpec.sparse`) are
        stored as node/<type>/<name>/indices.npy int32[n, K] and values.npy [n, K];
        edge_data: {name: ArraySpec}; splits: {type: [names]}.
      parts: [PartInfo] per partition.
      edge_cut_fraction: stored edges whose ends are in different partitions / all.
      balance: {constraint: max/mean over partitions}; balance_tolerance: the target.
      seed, seconds, format_version.
      edge_splits: {split: {"negatives": K}} link prediction's positive edges (K = 0:
        none stored; see `jgraph.data.links`); empty for a graph without them.
      build: how the directory was made: each phase's seconds and peak RSS
        (`jgraph.partition.chunked`).
      preparation: what was done to the graph before it was partitioned
        (`jgraph.data.prepare.Preparation.to_json()`); empty in a directory written
        before jgraph recorded it.
      ids: {type: dtype string ("<i8", "|S12")} of the types whose nodes have the user's own ids,
        stored as ids/<type>.npy in original (type-local) order (`Graph.ids`).
    """

    format_version: int
    graph_name: str
    num_parts: int
    method: str
    node_types: list
    relations: list
    num_nodes: int
    num_edges: int
    num_nodes_per_type: dict
    num_edges_per_relation: list
    offsets: list
    ntype_offsets: list
    orig_type_offsets: list
    node_data: dict
    edge_data: dict
    splits: dict
    parts: list
    edge_cut_fraction: float
    balance: dict
    balance_tolerance: float
    seed: int
    seconds: float
    edge_splits: dict = dataclasses.field(default_factory=dict)
    build: dict = dataclasses.field(default_factory=dict)
    preparation: dict = dataclasses.field(default_factory=dict)
    ids: dict = dataclasses.field(default_factory=dict)

    def book(self) -> PartitionBook:
        return PartitionBook(np.asarray(self.offsets), np.asarray(self.ntype_offsets),
                             tuple(self.node_types))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["node_data"] = {t: {name: spec.to_json() for name, spec in named.items()}
                            for t, named in self.node_data.items()}
        out["edge_data"] = {name: spec.to_json() for name, spec in self.edge_data.items()}
        out["parts"] = [dataclasses.asdict(info) for info in self.parts]
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Partition:
    """One partition, memory-mapped from disk.

    Fields:
      part_id: int; book: PartitionBook of the whole graph.
      indptr: int64[n + 1] — in-edges of local node i (global id `lo + i`) are
        `indices[indptr[i]:indptr[i+1]]`.
      indices: int64[E] — global id of each in-edge's source.
      etype: int32[E] — relation index; edge_ids: int64[E] — original edge id.
      halo: int64[H] — sorted global ids of in-neighbours owned by other partitions.
      node_data: {type: {name: array[n_type, ...] or SparseRows}};
        edge_data: {name: array[E, ...]}.
      splits: {type: {name: int64[k]}} — sorted global ids.
      edge_splits: {split: {"eid", "src", "dst", "etype"[, "negatives"]}} — link
        prediction's positives whose destination the part owns (`EDGE_ARRAYS`).
    """

    part_id: int
    book: PartitionBook
    indptr: np.ndarray
    indices: np.ndarray
    etype: np.ndarray
    edge_ids: np.ndarray
    halo: np.ndarray
    node_data: Mapping[str, Mapping[str, np.ndarray]]
    edge_data: Mapping[str, np.ndarray]
    splits: Mapping[str, Mapping[str, np.ndarray]]
    edge_splits: Mapping[str, Mapping[str, np.ndarray]] = dataclasses.field(
        default_factory=dict)

    @property
    def node_range(self) -> tuple[int, int]:
        return self.book.part_range(self.part_id)

    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    @property
    def num_edges(self) -> int:
        return self.indices.size


# -- writing ---------------------------------------------------------------------------


def part_dir(root: str, k: int) -> str:
    return os.path.join(root, f"part-{k}")


def save_array(path: str, array: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Native byte order: meta.json records dtype names, which do not carry it.
    array = np.asarray(array)
    np.save(path, np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")),
            allow_pickle=False)


def write_meta(root: str, meta: PartitionMeta) -> None:
    """Written last, through a rename, so a directory with meta.json is complete."""
    tmp = os.path.join(root, "meta.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta.to_json(), f, indent=1)
    os.replace(tmp, os.path.join(root, "meta.json"))


# -- reading ---------------------------------------------------------------------------


def read_meta(root: str | os.PathLike) -> PartitionMeta:
    """meta.json of `root`, checked to agree with itself (the arrays are not read)."""
    root = os.fspath(root)
    path = os.path.join(root, "meta.json")
    if not os.path.isdir(root):
        raise PartitionFormatError(f"{root}: no such partition directory")
    if not os.path.exists(path):
        # A `jgraph train` workdir keeps the partition it trained on in WORKDIR/partition.
        inner = os.path.join(root, "partition")
        hint = (f" (a training run's workdir: its partition is {inner})"
                if os.path.exists(os.path.join(inner, "meta.json")) else "")
        raise PartitionFormatError(f"{path}: missing; {root} is not a (complete) jgraph "
                                   f"partition directory{hint}")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PartitionFormatError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise PartitionFormatError(f"{path}: expected a JSON object")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise PartitionFormatError(f"{path}: format_version {version!r} is not supported "
                                   f"(this jgraph reads version {FORMAT_VERSION}); "
                                   f"partition the graph again")
    fields = {f.name for f in dataclasses.fields(PartitionMeta)}
    optional = {f.name for f in dataclasses.fields(PartitionMeta)
                if f.default_factory is not dataclasses.MISSING}
    missing = sorted(fields - optional - set(raw))
    if missing:
        raise PartitionFormatError(f"{path}: missing field(s) {', '.join(missing)}")
    meta = PartitionMeta(**{k: raw[k] for k in fields if k in raw})
    try:
        meta.book()
    except ValueError as e:
        raise PartitionFormatError(f"{path}: inconsistent offsets ({e})") from e
    try:
        problem = _meta_problem(meta)
    except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
        problem = f"a field has the wrong form ({type(e).__name__}: {e})"
    if problem:
        raise PartitionFormatError(f"{path}: {problem}")
    try:
        return dataclasses.replace(
            meta,
            node_data={t: {name: ArraySpec.from_json(spec) for name, spec in named.items()}
                       for t, named in meta.node_data.items()},
            edge_data={name: ArraySpec.from_json(spec)
                       for name, spec in meta.edge_data.items()},
            parts=[PartInfo.from_json(info) for info in meta.parts])
    except (TypeError, KeyError) as e:
        raise PartitionFormatError(f"{path}: a field has the wrong form "
                                   f"({type(e).__name__}: {e})") from e


def _meta_problem(meta: PartitionMeta) -> str | None:
    """The first way meta.json contradicts itself, or None (`meta` as read: its
    entries still JSON dicts)."""
    book, types = meta.book(), list(meta.node_types)
    if len(meta.parts) != meta.num_parts:
        return f"'parts' lists {len(meta.parts)} partitions, num_parts is {meta.num_parts}"
    if book.num_nodes != meta.num_nodes:
        return f"offsets end at {book.num_nodes}, num_nodes is {meta.num_nodes}"
    per_type = [meta.num_nodes_per_type[t] for t in types]
    if sum(per_type) != meta.num_nodes:
        return f"num_nodes_per_type sums to {sum(per_type)}, num_nodes is {meta.num_nodes}"
    if list(meta.orig_type_offsets) != segments.offsets(per_type).tolist():
        return (f"orig_type_offsets {meta.orig_type_offsets} do not follow from "
                f"num_nodes_per_type {per_type}")
    if len(meta.num_edges_per_relation) != len(meta.relations):
        return (f"num_edges_per_relation has {len(meta.num_edges_per_relation)} entries for "
                f"{len(meta.relations)} relations")
    if sum(meta.num_edges_per_relation) != meta.num_edges:
        return (f"num_edges_per_relation sums to {sum(meta.num_edges_per_relation)}, "
                f"num_edges is {meta.num_edges}")
    part_edges = sum(info["num_edges"] for info in meta.parts)
    if part_edges != meta.num_edges:
        return f"the parts' num_edges sum to {part_edges}, num_edges is {meta.num_edges}"
    counts = book.type_counts()
    if counts.sum(axis=0).tolist() != per_type:
        return (f"ntype_offsets hold {counts.sum(axis=0).tolist()} nodes per type, "
                f"num_nodes_per_type says {per_type}")
    for t in (*meta.node_data, *meta.splits):
        if t not in types:
            return f"node data or splits of node type {t!r}, which is not one of {types}"
    for k, info in enumerate(meta.parts):
        if info["num_nodes"] != book.part_sizes()[k]:
            return (f"part {k} has {info['num_nodes']} nodes, offsets say "
                    f"{book.part_sizes()[k]}")
        got = [info["num_nodes_per_type"][t] for t in types]
        if got != counts[k].tolist():
            return (f"part {k} has {got} nodes per type, ntype_offsets say "
                    f"{counts[k].tolist()}")
        for t, names in meta.splits.items():
            for name in names:
                if not isinstance(info["splits"].get(t, {}).get(name), int):
                    return f"part {k} records no size for split {t}.{name}"
        for name in meta.edge_splits:
            if not isinstance(info.get("edge_splits", {}).get(name), int):
                return f"part {k} records no size for edge split {name!r}"
    for name, entry in meta.edge_splits.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("negatives"), int)
                and entry["negatives"] >= 0):
            return f"edge split {name!r}: needs 'negatives' >= 0, got {entry!r}"
    specs = [(f"node data {t}.{name}", spec) for t, named in meta.node_data.items()
             for name, spec in named.items()]
    specs += [(f"edge data {name}", spec) for name, spec in meta.edge_data.items()]
    for what, spec in specs:
        problem = _spec_problem(spec)
        if problem:
            return f"{what}: {problem}"
    return None


def _spec_problem(spec) -> str | None:
    """What is wrong with one node_data or edge_data entry of meta.json, or None."""
    if not isinstance(spec, dict) or not {"dtype", "shape"} <= set(spec):
        return f"needs 'dtype' and 'shape', got {spec!r}"
    try:
        kind = np.dtype(spec["dtype"]).kind
    except (TypeError, ValueError):
        kind = None
    if kind is None or kind not in READABLE_KINDS:
        return (f"dtype {spec['dtype']!r} cannot be read: node and edge data hold numbers "
                f"or booleans")
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"shape {shape!r} is not a list of sizes"
    if "sparse" in spec:
        k = spec["sparse"]
        if not (isinstance(k, int) and k >= 1 and len(shape) == 1):
            return (f"sparse rows need one width in 'shape' and 'sparse' >= 1 entries per "
                    f"row, got shape {shape!r}, sparse {k!r}")
    if "min" in spec or "max" in spec:
        lo, hi = spec.get("min"), spec.get("max")
        if not (isinstance(lo, int) and isinstance(hi, int) and lo <= hi):
            return f"value range min={lo!r}, max={hi!r} is not a pair of integers min <= max"
    return None


def load_array(path: str, shape: tuple, dtype: str | np.dtype | None = None,
               mmap: bool = True, kinds: str = READABLE_KINDS) -> np.ndarray:
    """Memory-map one .npy file and check its shape (and dtype); `kinds`: the dtype
    kinds it may hold (numbers and booleans; user ids add "S", UTF-8 bytes)."""
    if not os.path.exists(path):
        raise PartitionFormatError(f"{path}: missing")
    try:
        a = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        stored = _stored_dtype(path)
        if stored is not None and stored.kind not in kinds:
            raise PartitionFormatError(f"{path}: dtype {stored} cannot be read: partition "
                                       f"arrays hold numbers or booleans") from e
        raise PartitionFormatError(f"{path}: corrupt or truncated ({e})") from e
    if a.dtype.kind not in kinds:
        raise PartitionFormatError(f"{path}: dtype {a.dtype} cannot be read: partition "
                                   f"arrays hold numbers or booleans")
    if tuple(a.shape) != tuple(shape):
        raise PartitionFormatError(f"{path}: shape {list(a.shape)}, expected {list(shape)}")
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise PartitionFormatError(f"{path}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    return a


def _stored_dtype(path: str) -> np.dtype | None:
    """The dtype a .npy file's header names, or None when the header is unreadable."""
    try:
        with open(path, "rb") as f:
            return read_header(f)[2]
    except (OSError, ValueError, EOFError):
        return None


class PartitionedGraph:
    """An opened partition directory; `part(k)` loads partition k alone."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self.meta = read_meta(self.root)
        self.book = self.meta.book()

    @property
    def num_parts(self) -> int:
        return self.meta.num_parts

    def array_path(self, k: int, *names: str) -> str:
        """DIR/part-k/<names...>.npy, e.g. `array_path(0, "node", "_N", "label")`."""
        return os.path.join(part_dir(self.root, k), *names[:-1], f"{names[-1]}.npy")

    def files(self, parts=None) -> list[str]:
        """Every file the format names: meta.json, the node maps and each array of the
        partitions `parts` (default: all)."""
        meta = self.meta
        out = [os.path.join(self.root, name)
               for name in ("meta.json", "node_map.npy", "node_map_inv.npy")]
        out += [self.ids_path(t) for t in meta.ids]
        if os.path.exists(os.path.join(self.root, ASSIGNMENT)):
            out.append(os.path.join(self.root, ASSIGNMENT))
        for k in range(meta.num_parts) if parts is None else parts:
            out += [self.array_path(k, name) for name in PART_ARRAYS]
            out += [path for t, named in meta.node_data.items()
                    for name, spec in named.items()
                    for path in self.node_paths(k, t, name, spec)]
            out += [self.array_path(k, "edge", name) for name in meta.edge_data]
            out += [self.array_path(k, "split", t, name)
                    for t, names in meta.splits.items() for name in names]
            out += [self.array_path(k, "edges", split, name)
                    for split, entry in meta.edge_splits.items()
                    for name in (*EDGE_ARRAYS, *(["negatives"] if entry["negatives"] else []))]
        return out

    def node_paths(self, k: int, ntype: str, name: str, spec: ArraySpec) -> list[str]:
        """The files of one node array of partition k: <name>.npy, or for sparse rows
        <name>/indices.npy and <name>/values.npy."""
        if spec.sparse is not None:
            return [self.array_path(k, "node", ntype, name, leaf)
                    for leaf in ("indices", "values")]
        return [self.array_path(k, "node", ntype, name)]

    def _node_array(self, k: int, ntype: str, name: str, spec: ArraySpec, rows: int):
        paths = self.node_paths(k, ntype, name, spec)
        if spec.sparse is not None:
            shape = (rows, spec.sparse)
            return SparseRows(load_array(paths[0], shape, np.int32),
                              load_array(paths[1], shape, spec.dtype), spec.shape[0])
        return load_array(paths[0], (rows, *spec.shape), spec.dtype)

    def node_map(self) -> np.ndarray:
        """int64[N]: new global id -> original homogeneous id (memory-mapped)."""
        return load_array(os.path.join(self.root, "node_map.npy"), (self.meta.num_nodes,),
                          np.int64)

    def assignment(self) -> np.ndarray | None:
        """int[N]: each original homogeneous id's partition (memory-mapped), or None for
        a directory written before assignment.npy was."""
        path = os.path.join(self.root, ASSIGNMENT)
        if not os.path.exists(path):
            return None
        return load_array(path, (self.meta.num_nodes,), kinds="iu")

    def node_map_inv(self) -> np.ndarray:
        """int64[N]: original homogeneous id -> new global id (memory-mapped)."""
        return load_array(os.path.join(self.root, "node_map_inv.npy"), (self.meta.num_nodes,),
                          np.int64)

    def ids_path(self, ntype: str) -> str:
        return os.path.join(self.root, "ids", f"{ntype}.npy")

    def user_ids(self, ntype: str) -> np.ndarray | None:
        """int64[n] or bytes_[n]: the user's id of each node of `ntype` by original
        (type-local) id (memory-mapped), or None where the type has jgraph's ids."""
        if ntype not in self.meta.ids:
            return None
        return load_array(self.ids_path(ntype), (self.meta.num_nodes_per_type[ntype],),
                          self.meta.ids[ntype], kinds="iS")

    def id_map(self, ntype: str) -> IdMap:
        """The lookup from the user's ids of `ntype` to original ids (`user_ids`), built
        once per opened directory."""
        maps = self.__dict__.setdefault("_id_maps", {})
        if ntype not in maps:
            ids = self.user_ids(ntype)
            if ids is None:
                raise PartitionFormatError(f"{self.root}: type {ntype!r} has no user ids")
            maps[ntype] = IdMap(np.asarray(ids))
        return maps[ntype]

    def to_new(self, ntype: str, orig_ids) -> np.ndarray:
        """Global ids of nodes given by their original type-local ids."""
        t = self.meta.node_types.index(ntype)
        start = self.meta.orig_type_offsets[t]
        return np.asarray(self.node_map_inv()[start + np.asarray(orig_ids)])

    def part(self, k: int) -> Partition:
        """Partition k, memory-mapped; shapes and dtypes checked against meta.json."""
        meta = self.meta
        if not 0 <= k < meta.num_parts:
            raise PartitionFormatError(f"{self.root}: partition {k} does not exist "
                                       f"(num_parts={meta.num_parts})")
        info = meta.parts[k]
        n, e = info.num_nodes, info.num_edges
        indptr = load_array(self.array_path(k, "indptr"), (n + 1,), np.int64)
        if indptr[0] != 0 or indptr[-1] != e:
            raise PartitionFormatError(f"{self.array_path(k, 'indptr')}: must run from 0 to "
                                       f"{e}, runs from {indptr[0]} to {indptr[-1]}")
        counts = self.book.type_counts()[k]
        node_data = {
            t: {name: self._node_array(k, t, name, spec, int(counts[i]))
                for name, spec in meta.node_data.get(t, {}).items()}
            for i, t in enumerate(meta.node_types)}
        edge_data = {name: load_array(self.array_path(k, "edge", name),
                                      (e, *spec.shape), spec.dtype)
                     for name, spec in meta.edge_data.items()}
        splits = {t: {name: load_array(self.array_path(k, "split", t, name),
                                       (info.splits[t][name],), np.int64)
                      for name in names}
                  for t, names in meta.splits.items()}
        edge_splits = {}
        for split, entry in meta.edge_splits.items():
            n_pos = info.edge_splits[split]
            arrays = {name: load_array(self.array_path(k, "edges", split, name), (n_pos,),
                                       dtype) for name, dtype in EDGE_ARRAYS.items()}
            if entry["negatives"]:
                arrays["negatives"] = load_array(self.array_path(k, "edges", split,
                                                                 "negatives"),
                                                 (n_pos, entry["negatives"]), np.int64)
            edge_splits[split] = arrays
        return Partition(
            part_id=k, book=self.book, indptr=indptr,
            indices=load_array(self.array_path(k, "indices"), (e,), np.int64),
            etype=load_array(self.array_path(k, "etype"), (e,), np.int32),
            edge_ids=load_array(self.array_path(k, "edge_ids"), (e,), np.int64),
            halo=load_array(self.array_path(k, "halo"), (info.num_halo,), np.int64),
            node_data=node_data, edge_data=edge_data, splits=splits,
            edge_splits=edge_splits)

    # -- checks: each raises a PartitionFormatError naming the file and the value -------

    def check_files(self, parts=None) -> None:
        """That every file the format names exists (`files(parts)`); a stat per file."""
        for path in self.files(parts):
            if not os.path.isfile(path):
                raise PartitionFormatError(f"{path}: missing")

    def check_part(self, k: int, deep: bool = False) -> Partition:
        """Partition k, after checking what a step relies on (deep: everything); see
        `jgraph.partition.check.check_part`."""
        from jgraph.partition.check import check_part
        return check_part(self, k, deep)

    def check(self) -> None:
        """Check the whole directory (`jgraph.partition.check.check_directory`)."""
        from jgraph.partition.check import check_directory
        check_directory(self)


def open_partitions(root: str | os.PathLike) -> PartitionedGraph:
    """Open a partition directory written by `jgraph partition` (validates meta.json)."""
    return PartitionedGraph(root)
