"""The host-side graph container: one class for heterogeneous and homogeneous graphs.

A homogeneous graph is the one-node-type, one-relation case of the heterogeneous one
(DGL's `_N` / `_E` convention), so every stage of jgraph has a single code path. A
relational (RDF) graph such as AIFB is one node type with many relations.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

import jgraph.segments as segments
from jgraph.data.sparse import SparseRows

DEFAULT_NTYPE = "_N"
DEFAULT_REL = "_E"

# Names of node types, relations and data arrays become parts of file names in a
# partition directory, so they are limited to a portable character set. Relation names
# are exempt: on disk relations are numbered, and RDF relation names are URIs.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*$")


class Relation(NamedTuple):
    """An edge type `(src_type, name, dst_type)`; a plain tuple, so it compares to one."""

    src_type: str
    name: str
    dst_type: str

    def __str__(self) -> str:
        return f"{self.src_type}--{self.name}->{self.dst_type}"


class GraphError(ValueError):
    """A graph whose arrays are inconsistent; the message names the offending field."""


def check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _SAFE_NAME.match(name):
        raise GraphError(
            f"{kind} name {name!r} is not allowed: use letters, digits and _ . @ + - "
            f"(not starting with a dot)")


def check_ids(ids: np.ndarray, limit: int, what: str) -> None:
    """Raise if any id is negative or >= limit, naming the first offender."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= limit:
        bad = int(np.flatnonzero((ids < 0) | (ids >= limit))[0])
        raise GraphError(
            f"{what}: id {int(ids.reshape(-1)[bad])} at position {bad} is out of range "
            f"[0, {limit})")


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """A graph in host numpy arrays, ready to be transformed, saved or partitioned.

    Fields:
      name: str — dataset name, used in partition metadata and summaries.
      num_nodes: {node_type: int} — node count per type; its order fixes the type ids.
      edges: {Relation: int64[2, E_r]} — row 0 source, row 1 destination, as indices
        local to the relation's source and destination node types.
      node_data: {node_type: {name: array[num_nodes[type], ...]}} — features
        (`feat`), labels (`label`, -1 where unlabelled) and any other per-node arrays;
        a `SparseRows` in place of a matrix holds sparse rows (bag-of-words features).
      edge_data: {Relation: {name: array[E_r, ...]}} — per-edge arrays (e.g. `weight`).
      splits: {node_type: {name: int64[k]}} — sorted, unique node indices of each split
        (`train`, `val`, `test`, and any other named node set).
      ids: {node_type: int64[n] or bytes_[n]} — the user's own id of each node (integers,
        or UTF-8 strings) for types built from the user's tables (`jgraph convert
        SCHEMA.yaml OUT`); node i of the type is the user's `ids[type][i]`. Unique per type.
        A type without an entry is known by its jgraph ids 0..n-1. Carried to the
        partition directory, so embeddings and predictions answer in the user's ids.

    Construction validates every array (ids in range, row counts, dtypes, finite floats,
    `label` integers >= -1, `feat` a matrix) and raises a `GraphError` naming the field
    at fault.
    """

    name: str
    num_nodes: Mapping[str, int]
    edges: Mapping[Relation, np.ndarray]
    node_data: Mapping[str, Mapping[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    edge_data: Mapping[Relation, Mapping[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    splits: Mapping[str, Mapping[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    ids: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        num_nodes = {}
        for ntype, n in self.num_nodes.items():
            check_name("node type", ntype)
            if int(n) != n or n < 0:
                raise GraphError(f"num_nodes[{ntype!r}] = {n!r} is not a non-negative integer")
            num_nodes[ntype] = int(n)
        if not num_nodes:
            raise GraphError("a graph needs at least one node type")
        if not sum(num_nodes.values()):
            raise GraphError(f"the graph has no nodes (num_nodes {num_nodes})")

        edges = {}
        for rel, index in self.edges.items():
            rel = Relation(*rel)
            for t in (rel.src_type, rel.dst_type):
                if t not in num_nodes:
                    raise GraphError(f"relation {tuple(rel)}: unknown node type {t!r}; "
                                     f"node types are {list(num_nodes)}")
            if rel in edges:
                raise GraphError(f"relation {tuple(rel)} is given twice")
            index = np.asarray(index)
            if index.ndim != 2 or index.shape[0] != 2:
                raise GraphError(f"edges of relation {tuple(rel)} must have shape [2, E], "
                                 f"got {list(index.shape)}")
            if not np.issubdtype(index.dtype, np.integer):
                raise GraphError(f"edges of relation {tuple(rel)} must be integers, "
                                 f"got {index.dtype}")
            index = np.ascontiguousarray(index, dtype=np.int64)
            check_ids(index[0], num_nodes[rel.src_type], f"relation {tuple(rel)} source")
            check_ids(index[1], num_nodes[rel.dst_type], f"relation {tuple(rel)} destination")
            edges[rel] = index
        if len({r.name for r in edges}) != len(edges):
            raise GraphError(f"relation names must be unique, got {[r.name for r in edges]}")

        node_data = {}
        for ntype, arrays in self.node_data.items():
            if ntype not in num_nodes:
                raise GraphError(f"node data for unknown node type {ntype!r}")
            node_data[ntype] = row_arrays(arrays, num_nodes[ntype], "node", f"type {ntype!r}")
            check_conventions(node_data[ntype], f"type {ntype!r}")

        edge_data = {}
        for rel, arrays in self.edge_data.items():
            rel = Relation(*rel)
            if rel not in edges:
                raise GraphError(f"edge data for unknown relation {tuple(rel)}")
            edge_data[rel] = row_arrays(arrays, edges[rel].shape[1], "edge",
                                         f"relation {tuple(rel)}")

        splits = {}
        for ntype, named in self.splits.items():
            if ntype not in num_nodes:
                raise GraphError(f"split for unknown node type {ntype!r}")
            splits[ntype] = {}
            for key, idx in named.items():
                check_name("split", key)
                idx = np.asarray(idx)
                if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
                    raise GraphError(f"split {key!r} of type {ntype!r} must be a 1-D integer "
                                     f"array, got {idx.dtype}{list(idx.shape)}")
                idx = idx.astype(np.int64)
                check_ids(idx, num_nodes[ntype], f"split {key!r} of type {ntype!r}")
                unique = segments.distinct(idx)
                if unique.size != idx.size:
                    raise GraphError(f"split {key!r} of type {ntype!r} lists "
                                     f"{idx.size - unique.size} node(s) more than once")
                splits[ntype][key] = unique

        ids = {}
        for ntype, values in self.ids.items():
            if ntype not in num_nodes:
                raise GraphError(f"ids for unknown node type {ntype!r}")
            ids[ntype] = check_user_ids(values, num_nodes[ntype], f"ids of type {ntype!r}")

        for field, value in (("num_nodes", num_nodes), ("edges", edges),
                             ("node_data", node_data), ("edge_data", edge_data),
                             ("splits", splits), ("ids", ids)):
            object.__setattr__(self, field, value)

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def homogeneous(cls, src, dst, num_nodes: int | None = None, *, name: str = "graph",
                    node_data: Mapping[str, np.ndarray] | None = None,
                    edge_data: Mapping[str, np.ndarray] | None = None,
                    splits: Mapping[str, np.ndarray] | None = None) -> Graph:
        """A one-type, one-relation graph from an edge list `src -> dst`."""
        src, dst = np.asarray(src), np.asarray(dst)
        if src.shape != dst.shape or src.ndim != 1:
            raise GraphError(f"src and dst must be 1-D and of equal length, got shapes "
                             f"{list(src.shape)} and {list(dst.shape)}")
        if num_nodes is None:
            sizes = [len(v) for v in (node_data or {}).values()]
            largest = max(src.max(initial=-1), dst.max(initial=-1))
            num_nodes = sizes[0] if sizes else int(largest + 1)
        rel = Relation(DEFAULT_NTYPE, DEFAULT_REL, DEFAULT_NTYPE)
        return cls(name=name, num_nodes={DEFAULT_NTYPE: num_nodes},
                   edges={rel: np.stack([src, dst])},
                   node_data={DEFAULT_NTYPE: dict(node_data or {})},
                   edge_data={rel: dict(edge_data)} if edge_data else {},
                   splits={DEFAULT_NTYPE: dict(splits or {})})

    def replace(self, **changes) -> Graph:
        return dataclasses.replace(self, **changes)

    # -- views --------------------------------------------------------------------------

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.edges)

    @property
    def is_homogeneous(self) -> bool:
        return len(self.num_nodes) == 1 and len(self.edges) == 1

    @property
    def total_nodes(self) -> int:
        return sum(self.num_nodes.values())

    @property
    def num_edges(self) -> int:
        return sum(e.shape[1] for e in self.edges.values())

    def type_offsets(self) -> np.ndarray:
        """int64[T+1]: node type t has homogeneous ids [offsets[t], offsets[t+1])."""
        return segments.offsets(list(self.num_nodes.values()))

    def node_type_ids(self) -> np.ndarray:
        """int32[total_nodes]: the type id of each node in the homogeneous id space."""
        return segments.segment_ids(list(self.num_nodes.values()), np.int32)

    def homogeneous_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, etype): every edge in homogeneous ids, relations in order.

        Node type t's local id i becomes `type_offsets()[t] + i`; `etype` is the index of
        the edge's relation in `relations`. Edge k of the result is edge k of the
        relations' edge lists laid end to end (the "homogeneous edge id").
        """
        offsets = dict(zip(self.node_types, self.type_offsets()))
        src = [e[0] + offsets[r.src_type] for r, e in self.edges.items()]
        dst = [e[1] + offsets[r.dst_type] for r, e in self.edges.items()]
        etype = [np.full(e.shape[1], i, np.int32) for i, e in enumerate(self.edges.values())]
        cat = lambda xs, dtype: np.concatenate(xs) if xs else np.zeros(0, dtype)
        return cat(src, np.int64), cat(dst, np.int64), cat(etype, np.int32)

    def __repr__(self) -> str:
        lines = [f"Graph {self.name!r}: {self.total_nodes:,} nodes, {self.num_edges:,} edges"]
        for ntype, n in self.num_nodes.items():
            data = ", ".join(f"{k} {_describe(v)}"
                             for k, v in self.node_data.get(ntype, {}).items())
            splits = ", ".join(f"{k} {len(v):,}" for k, v in self.splits.get(ntype, {}).items())
            lines.append(f"  nodes {ntype}: {n:,}" + (f"; {data}" if data else "")
                         + (f"; splits {splits}" if splits else ""))
        for rel, e in list(self.edges.items())[:12]:
            data = ", ".join(f"{k} {_describe(v)}" for k, v in self.edge_data.get(rel, {}).items())
            lines.append(f"  edges {rel}: {e.shape[1]:,}" + (f"; {data}" if data else ""))
        if len(self.edges) > 12:
            lines.append(f"  ... and {len(self.edges) - 12} more relations")
        return "\n".join(lines)


def check_user_ids(values, count: int, what: str) -> np.ndarray:
    """A type's user ids as stored: int64[count], or bytes_[count] (UTF-8; numpy str
    arrays are encoded), unique; GraphError naming `what` and a repeated id otherwise."""
    values = np.asarray(values)
    if values.dtype.kind == "U":
        values = np.char.encode(values, "utf-8")
    elif values.dtype.kind in "iu":
        values = values.astype(np.int64)
    elif values.dtype.kind != "S":
        raise GraphError(f"{what}: user ids are integers or strings, got {values.dtype}")
    if values.shape != (count,):
        raise GraphError(f"{what}: {list(values.shape)} ids for {count} nodes (one per node)")
    from jgraph.data.ids import repeats  # which imports this module
    first, _ = repeats(values)
    if first.size:
        raise GraphError(f"{what}: id {shown_id(values[first[0]])} names more than one "
                         f"node ({first.size} repeated id(s))")
    return values


def shown_id(value) -> str:
    """A user id as a message shows it: strings decoded and quoted."""
    return repr(value.decode("utf-8", "replace")) if isinstance(value, bytes) else str(value)


def row_arrays(arrays: Mapping[str, np.ndarray], rows: int, unit: str,
                owner: str) -> dict[str, np.ndarray]:
    """Per-node or per-edge arrays, checked: safe names, one row per node (edge),
    numbers (or booleans), and no NaN or infinity."""
    out = {}
    for key, value in arrays.items():
        check_name(f"{unit} data", key)
        what = f"{unit} data {key!r} of {owner}"
        if isinstance(value, SparseRows):
            out[key] = _sparse_rows(value, rows, unit, what)
            continue
        value = np.asarray(value)
        if value.ndim == 0 or value.shape[0] != rows:
            count = value.shape[0] if value.ndim else "no"
            raise GraphError(f"{what} has {count} rows, expected {rows} (one per {unit})")
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
            raise GraphError(f"{what} has dtype {value.dtype}; per-{unit} arrays hold numbers "
                             f"(encode strings or categories as integers first)")
        if np.issubdtype(value.dtype, np.complexfloating):
            raise GraphError(f"{what} has complex dtype {value.dtype}")
        if np.issubdtype(value.dtype, np.floating):
            finite = np.isfinite(value)
            if not finite.all():
                at = tuple(int(i) for i in np.unravel_index(int(np.argmin(finite)),
                                                            value.shape))
                raise GraphError(f"{what} holds {value[at]} at {unit} {at[0]}"
                                 f"{' (index ' + str(list(at)) + ')' if value.ndim > 1 else ''}"
                                 f"; NaN and infinity are not valid {unit} values")
        out[key] = value
    return out


def _sparse_rows(value: SparseRows, rows: int, unit: str, what: str) -> SparseRows:
    """Sparse rows, checked as `row_arrays` checks dense ones, and their columns."""
    idx, val = np.asarray(value.indices), np.asarray(value.values)
    if idx.ndim != 2 or idx.shape != val.shape or idx.shape[0] != rows:
        raise GraphError(f"{what}: sparse indices {list(idx.shape)} and values "
                         f"{list(val.shape)} must both be [{rows}, K] (one row per {unit})")
    if not np.issubdtype(idx.dtype, np.integer):
        raise GraphError(f"{what}: sparse indices have dtype {idx.dtype}, expected integers")
    if not (np.issubdtype(val.dtype, np.floating) or np.issubdtype(val.dtype, np.integer)):
        raise GraphError(f"{what}: sparse values have dtype {val.dtype}; they hold numbers")
    if idx.size and (idx.min() < 0 or idx.max() >= value.width):
        at = np.unravel_index(int(np.argmax((idx < 0) | (idx >= value.width))), idx.shape)
        raise GraphError(f"{what}: column {int(idx[at])} of {unit} {int(at[0])} is out of "
                         f"range [0, {value.width})")
    if np.issubdtype(val.dtype, np.floating) and not np.isfinite(val).all():
        at = np.unravel_index(int(np.argmin(np.isfinite(val))), val.shape)
        raise GraphError(f"{what} holds {val[at]} at {unit} {int(at[0])}; NaN and infinity "
                         f"are not valid {unit} values")
    return SparseRows(idx.astype(np.int32, copy=False), val, value.width)


def check_conventions(arrays: Mapping[str, np.ndarray], owner: str) -> None:
    """The node arrays with documented meanings: `label` one integer class per node
    (-1 = unlabelled), `feat` one feature row per node."""
    label = arrays.get("label")
    if label is not None:
        if label.ndim != 1 or not np.issubdtype(label.dtype, np.integer):
            hint = (" (one-hot? store each node's class index, e.g. argmax over axis 1)"
                    if label.ndim == 2 else
                    " (store class indices 0..C-1 as integers)" if label.ndim == 1 else "")
            raise GraphError(f"node data 'label' of {owner} must be one integer class per "
                             f"node, got {label.dtype}{list(label.shape)}{hint}")
        if label.size and label.min() < -1:
            bad = int(np.argmin(label))
            raise GraphError(f"node data 'label' of {owner} holds {int(label[bad])} at node "
                             f"{bad}; labels are classes 0..C-1, or -1 for unlabelled")
    feat = arrays.get("feat")
    if feat is not None and feat.ndim != 2:
        raise GraphError(f"node data 'feat' of {owner} has shape {list(feat.shape)}; features "
                         f"are one row per node, [num_nodes, width]"
                         + (" (reshape a single feature to [N, 1])" if feat.ndim == 1 else ""))


def _describe(a: np.ndarray) -> str:
    if isinstance(a, SparseRows):
        return f"{a.dtype}[{a.width}] sparse ({a.nnz_per_row} per row)"
    return f"{a.dtype}{list(a.shape[1:])}" if a.ndim > 1 else str(a.dtype)
