"""The partition directory: writing it, and opening one partition without the others.

Layout (format version 1):

    DIR/meta.json                  see `PartitionMeta`
    DIR/node_map.npy               int64[N]  new global id -> original homogeneous id
    DIR/node_map_inv.npy           int64[N]  original homogeneous id -> new global id
    DIR/part-K/indptr.npy          int64[n_K + 1]  in-edge CSC over the part's nodes
    DIR/part-K/indices.npy         int64[E_K]  global id of each in-edge's source
    DIR/part-K/etype.npy           int32[E_K]  relation index of each in-edge
    DIR/part-K/edge_ids.npy        int64[E_K]  original homogeneous edge id
    DIR/part-K/halo.npy            int64[H_K]  sorted remote in-neighbours (1-hop halo)
    DIR/part-K/node/<type>/<name>.npy   per-node arrays of the part's nodes of <type>,
                                        in global-id order
    DIR/part-K/edge/<name>.npy     per-edge arrays, aligned with indices.npy
    DIR/part-K/split/<type>/<name>.npy  sorted global ids of the part's nodes in a split

A node's original homogeneous id numbers the original graph's node types one after
another: type t's local id i is `orig_type_offsets[t] + i`. In-edges of each node are
sorted by (relation, source), so one relation's neighbours are contiguous.
Every array opens as a read-only memory map.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import numpy as np

from jgraph.partition.book import PartitionBook

FORMAT_VERSION = 1


class PartitionFormatError(ValueError):
    """A partition directory that is missing, incomplete or corrupt; names the file."""


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
      node_data: {type: {name: {"dtype": str, "shape": [row shape]}}};
        edge_data: {name: {"dtype", "shape"}}; splits: {type: [names]}.
      parts: per partition {"num_nodes", "num_nodes_per_type", "num_edges",
        "num_halo", "splits": {type: {name: count}}}.
      edge_cut_fraction: stored edges whose ends are in different partitions / all.
      balance: {constraint: max/mean over partitions}; balance_tolerance: the target.
      seed, seconds, format_version.
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

    def book(self) -> PartitionBook:
        return PartitionBook(np.asarray(self.offsets), np.asarray(self.ntype_offsets),
                             tuple(self.node_types))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
      node_data: {type: {name: array[n_type, ...]}}; edge_data: {name: array[E, ...]}.
      splits: {type: {name: int64[k]}} — sorted global ids.
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
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)


def write_meta(root: str, meta: PartitionMeta) -> None:
    """Written last, through a rename, so a directory with meta.json is complete."""
    tmp = os.path.join(root, "meta.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta.to_json(), f, indent=1)
    os.replace(tmp, os.path.join(root, "meta.json"))


# -- reading ---------------------------------------------------------------------------


def read_meta(root: str | os.PathLike) -> PartitionMeta:
    root = os.fspath(root)
    path = os.path.join(root, "meta.json")
    if not os.path.isdir(root):
        raise PartitionFormatError(f"{root}: no such partition directory")
    if not os.path.exists(path):
        raise PartitionFormatError(f"{path}: missing; {root} is not a (complete) jgraph "
                                   f"partition directory")
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
    missing = sorted(fields - set(raw))
    if missing:
        raise PartitionFormatError(f"{path}: missing field(s) {', '.join(missing)}")
    meta = PartitionMeta(**{k: raw[k] for k in fields})
    try:
        meta.book()
    except ValueError as e:
        raise PartitionFormatError(f"{path}: inconsistent offsets ({e})") from e
    if len(meta.parts) != meta.num_parts:
        raise PartitionFormatError(f"{path}: 'parts' lists {len(meta.parts)} partitions, "
                                   f"num_parts is {meta.num_parts}")
    return meta


def load_array(path: str, shape: tuple, dtype: str | np.dtype | None = None,
               mmap: bool = True) -> np.ndarray:
    """Memory-map one .npy file and check its shape (and dtype)."""
    if not os.path.exists(path):
        raise PartitionFormatError(f"{path}: missing")
    try:
        a = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise PartitionFormatError(f"{path}: corrupt or truncated ({e})") from e
    if tuple(a.shape) != tuple(shape):
        raise PartitionFormatError(f"{path}: shape {list(a.shape)}, expected {list(shape)}")
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise PartitionFormatError(f"{path}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    return a


class PartitionedGraph:
    """An opened partition directory; `part(k)` loads partition k alone."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self.meta = read_meta(self.root)
        self.book = self.meta.book()

    @property
    def num_parts(self) -> int:
        return self.meta.num_parts

    def node_map(self) -> np.ndarray:
        """int64[N]: new global id -> original homogeneous id (memory-mapped)."""
        return load_array(os.path.join(self.root, "node_map.npy"), (self.meta.num_nodes,),
                          np.int64)

    def node_map_inv(self) -> np.ndarray:
        """int64[N]: original homogeneous id -> new global id (memory-mapped)."""
        return load_array(os.path.join(self.root, "node_map_inv.npy"), (self.meta.num_nodes,),
                          np.int64)

    def to_new(self, ntype: str, orig_ids) -> np.ndarray:
        """Global ids of nodes given by their original type-local ids."""
        t = self.meta.node_types.index(ntype)
        return np.asarray(self.node_map_inv()[self.meta.orig_type_offsets[t] + np.asarray(orig_ids)])

    def part(self, k: int) -> Partition:
        meta = self.meta
        if not 0 <= k < meta.num_parts:
            raise PartitionFormatError(f"{self.root}: partition {k} does not exist "
                                       f"(num_parts={meta.num_parts})")
        d = part_dir(self.root, k)
        info = meta.parts[k]
        n, e = info["num_nodes"], info["num_edges"]
        if n != self.book.part_sizes()[k]:
            raise PartitionFormatError(f"{os.path.join(self.root, 'meta.json')}: part {k} has "
                                       f"{n} nodes, offsets say {self.book.part_sizes()[k]}")
        indptr = load_array(os.path.join(d, "indptr.npy"), (n + 1,), np.int64)
        if indptr[0] != 0 or indptr[-1] != e:
            raise PartitionFormatError(f"{os.path.join(d, 'indptr.npy')}: must run from 0 to "
                                       f"{e}, runs from {indptr[0]} to {indptr[-1]}")
        counts = self.book.type_counts()[k]
        node_data = {
            t: {name: load_array(os.path.join(d, "node", t, f"{name}.npy"),
                                 (int(counts[i]), *spec["shape"]), spec["dtype"])
                for name, spec in meta.node_data.get(t, {}).items()}
            for i, t in enumerate(meta.node_types)}
        edge_data = {name: load_array(os.path.join(d, "edge", f"{name}.npy"),
                                      (e, *spec["shape"]), spec["dtype"])
                     for name, spec in meta.edge_data.items()}
        splits = {t: {name: load_array(os.path.join(d, "split", t, f"{name}.npy"),
                                       (info["splits"][t][name],), np.int64)
                      for name in names}
                  for t, names in meta.splits.items()}
        return Partition(
            part_id=k, book=self.book, indptr=indptr,
            indices=load_array(os.path.join(d, "indices.npy"), (e,), np.int64),
            etype=load_array(os.path.join(d, "etype.npy"), (e,), np.int32),
            edge_ids=load_array(os.path.join(d, "edge_ids.npy"), (e,), np.int64),
            halo=load_array(os.path.join(d, "halo.npy"), (info["num_halo"],), np.int64),
            node_data=node_data, edge_data=edge_data, splits=splits)


def open_partitions(root: str | os.PathLike) -> PartitionedGraph:
    """Open a partition directory written by `jgraph partition` (validates meta.json)."""
    return PartitionedGraph(root)
