"""Checks of a partition directory against its format: each raises a
`PartitionFormatError` naming the file, the entry and the value.

`check_part` is what a training step relies on (run when a partition is opened for
training), `check_directory` everything (`jgraph info --check`). Arrays are read a
block of CHECK_BLOCK elements at a time, so a check holds little memory.
"""
from __future__ import annotations

import os

import numpy as np

import jgraph.segments as segments
from jgraph.data.sparse import SparseRows
from jgraph.partition.store import Partition, PartitionedGraph, PartitionFormatError

# Elements a check reads at a time: bounds the memory of its temporaries (a check of
# an array of 10^9 entries must not allocate 10^9 booleans).
CHECK_BLOCK = 1 << 20


def check_part(pg: PartitionedGraph, k: int, deep: bool = False) -> Partition:
    """Check partition k's contents and return it.

    Always, what a training step relies on (one vectorised pass over each array):
    CSC offsets that do not decrease, sources that are node ids, relations in
    range, splits sorted, unique and of the part's nodes of their type, integer
    node data inside the range meta.json records, sparse rows' columns inside their
    width. deep=True adds the halo, the
    (relation, source) order of each node's in-edges, edge ids in range, integer
    edge data in range, and finite float data.
    """
    meta, book, part = pg.meta, pg.book, pg.part(k)
    n, r = meta.num_nodes, len(meta.relations)
    _check_sorted(pg.array_path(k, "indptr"), part.indptr, strict=False,
                  rule="CSC offsets must not decrease")
    _check_range(pg.array_path(k, "indices"), part.indices, 0, n - 1,
                 f"source node ids are in [0, {n})")
    _check_range(pg.array_path(k, "etype"), part.etype, 0, r - 1,
                 f"relations are in [0, {r})")
    for t, ntype in enumerate(meta.node_types):
        lo, hi = int(book.ntype_offsets[k, t]), int(book.ntype_offsets[k, t + 1])
        for name, ids in part.splits.get(ntype, {}).items():
            path = pg.array_path(k, "split", ntype, name)
            _check_sorted(path, ids, strict=True, rule="split ids must be sorted and unique")
            _check_range(path, ids, lo, hi - 1,
                         f"part {k}'s nodes of type {ntype!r} are [{lo}, {hi})")
        for name, values in part.node_data[ntype].items():
            spec = meta.node_data[ntype][name]
            paths = pg.node_paths(k, ntype, name, spec)
            if isinstance(values, SparseRows):
                _check_range(paths[0], values.indices, 0, values.width - 1,
                             f"sparse rows of width {values.width} hold columns "
                             f"[0, {values.width})")
                values = values.values
            _check_values(paths[-1], values, spec, deep)
    lo, hi = book.part_range(k)
    for split, arrays in part.edge_splits.items():
        path = lambda name, split=split: pg.array_path(k, "edges", split, name)
        _check_sorted(path("eid"), arrays["eid"], strict=True,
                      rule="edge ids of a split must be sorted and unique")
        _check_range(path("src"), arrays["src"], 0, n - 1, f"node ids are in [0, {n})")
        _check_range(path("dst"), arrays["dst"], lo, hi - 1,
                     f"part {k} holds the positives whose destination it owns, [{lo}, {hi})")
        _check_range(path("etype"), arrays["etype"], 0, r - 1, f"relations are in [0, {r})")
        if "negatives" in arrays:
            _check_range(path("negatives"), arrays["negatives"], 0, n - 1,
                         f"node ids are in [0, {n})")
    if deep:
        _check_range(pg.array_path(k, "edge_ids"), part.edge_ids, 0, meta.num_edges - 1,
                     f"edge ids are in [0, {meta.num_edges})")
        _check_halo(pg.array_path(k, "halo"), part)
        _check_halo_by_owner(pg, k, part)
        _check_edge_order(pg.array_path(k, "indices"), part)
        for name, values in part.edge_data.items():
            _check_values(pg.array_path(k, "edge", name), values,
                          meta.edge_data[name], deep)
    return part

def check_directory(pg: PartitionedGraph) -> None:
    """Check the whole directory: every file present; node_map.npy and
    node_map_inv.npy inverse permutations that keep node types; every part
    (`check_part(pg, k, deep=True)`); each original edge stored once, and as many
    edges of each relation as meta.json records."""
    meta, root = pg.meta, pg.root
    pg.check_files()
    _check_node_maps(pg)
    _check_assignment(pg)
    per_relation = np.zeros(len(meta.relations), np.int64)
    # Distinct edge ids in range, as many as meta.json's num_edges (checked on
    # opening): each original edge stored exactly once.
    stored = np.zeros(meta.num_edges, bool)
    for k in range(meta.num_parts):
        part = check_part(pg, k, deep=True)
        for _, etype in _block_views(part.etype):
            per_relation += np.bincount(etype, minlength=per_relation.size)
        for start, ids in _block_views(part.edge_ids):
            again = stored[ids] | _repeated(ids)
            if again.any():
                i = int(np.argmax(again))
                raise PartitionFormatError(
                    f"{pg.array_path(k, 'edge_ids')}: entry {start + i} is {ids[i]}, an "
                    f"edge stored before; each original edge is stored once")
            stored[ids] = True
    recorded = np.asarray(meta.num_edges_per_relation, np.int64)
    if not np.array_equal(per_relation, recorded):
        i = int(np.argmax(per_relation != recorded))
        raise PartitionFormatError(
            f"{os.path.join(root, 'meta.json')}: num_edges_per_relation[{i}] is "
            f"{recorded[i]}, the parts' etype.npy hold {per_relation[i]} edges of "
            f"relation {i}")


def _check_assignment(pg: PartitionedGraph) -> None:
    """assignment.npy (where there is one) names the partition that owns each node."""
    given = pg.assignment()
    if given is None:
        return
    inverse = pg.node_map_inv()
    for start, parts in _block_views(given):
        owner = pg.book.owner(np.asarray(inverse[start:start + parts.size]))
        if not np.array_equal(owner, parts):
            i = int(np.argmax(owner != parts))
            raise PartitionFormatError(
                f"{os.path.join(pg.root, 'assignment.npy')}: node {start + i} is given "
                f"partition {parts[i]}, but partition {owner[i]} holds it")


def _check_node_maps(pg: PartitionedGraph) -> None:
    meta, types = pg.meta, pg.meta.node_types
    forward, inverse = pg.node_map(), pg.node_map_inv()
    f_path, i_path = (os.path.join(pg.root, f"{name}.npy")
                      for name in ("node_map", "node_map_inv"))
    n = meta.num_nodes
    _check_range(f_path, forward, 0, n - 1, f"node ids are in [0, {n})")
    orig_offsets = np.asarray(meta.orig_type_offsets)
    for start, orig in _block_views(forward):
        new = np.arange(start, start + orig.size)
        back = np.asarray(inverse[orig])
        if not np.array_equal(back, new):
            i = int(np.argmax(back != new))
            raise PartitionFormatError(
                f"{f_path}: entry {new[i]} is {orig[i]}, but {i_path} maps {orig[i]} to "
                f"{back[i]}; the two must be inverse permutations")
        new_type = pg.book.ntype(new)
        orig_type = segments.segment_of(orig_offsets, orig)
        if not np.array_equal(new_type, orig_type):
            i = int(np.argmax(new_type != orig_type))
            raise PartitionFormatError(
                f"{f_path}: entry {new[i]} is {orig[i]}, a node of type "
                f"{types[orig_type[i]]!r}, but new id {new[i]} is of type "
                f"{types[new_type[i]]!r}")


# -- checks of one array, a block of rows at a time -------------------------------------


def _block_views(a: np.ndarray, overlap: int = 0):
    """(first row, rows) of `a`, CHECK_BLOCK elements at a time; each block also holds
    the next block's first `overlap` rows."""
    rows = max(1, CHECK_BLOCK // max(1, int(np.prod(a.shape[1:]))))
    for start in range(0, max(len(a) - overlap, 0), rows):
        yield start, np.asarray(a[start:start + rows + overlap])


def _entry(position) -> str:
    position = [int(i) for i in position]
    return f"entry {position[0]}" if len(position) == 1 else f"entry {position}"


def _check_range(path: str, a: np.ndarray, lo: int, hi: int, allowed: str) -> None:
    """Every value in [lo, hi]; else names the first one outside and `allowed`."""
    for start, x in _block_views(a):
        if x.size and (x.min() < lo or x.max() > hi):
            position = np.argwhere((x < lo) | (x > hi))[0]
            raise PartitionFormatError(f"{path}: {_entry([start + position[0], *position[1:]])}"
                                       f" is {x[tuple(position)]}; {allowed}")


def _check_sorted(path: str, a: np.ndarray, strict: bool, rule: str) -> None:
    for start, x in _block_views(a, overlap=1):
        step = np.diff(x)
        bad = step <= 0 if strict else step < 0
        if bad.any():
            i = start + int(np.argmax(bad))
            raise PartitionFormatError(f"{path}: entry {i + 1} is {a[i + 1]} after {a[i]} at "
                                       f"entry {i}; {rule}")


def _check_values(path: str, values: np.ndarray, spec: dict, deep: bool) -> None:
    """Integers inside the range meta.json records; with deep, floats finite."""
    if spec.has_range:
        _check_range(path, values, spec.min, spec.max,
                     f"meta.json records the range [{spec.min}, {spec.max}] for it")
    if deep and values.dtype.kind == "f":
        for start, x in _block_views(values):
            bad = ~np.isfinite(x)
            if bad.any():
                position = np.argwhere(bad)[0]
                raise PartitionFormatError(
                    f"{path}: {_entry([start + position[0], *position[1:]])} is "
                    f"{x[tuple(position)]}; float data must be finite")


def _repeated(values: np.ndarray) -> np.ndarray:
    """bool[n]: True where the value occurs at an earlier position."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    out = np.empty(values.size, bool)
    out[order] = np.concatenate([[False], ordered[1:] == ordered[:-1]])
    return out


def _check_halo(path: str, part: Partition) -> None:
    """halo.npy: exactly the sorted, distinct sources owned by other partitions."""
    lo, hi = part.node_range
    remote = [segments.distinct(x[(x < lo) | (x >= hi)]) for _, x in _block_views(part.indices)]
    expected = segments.distinct(np.concatenate(remote)) if remote else np.zeros(0, np.int64)
    halo = np.asarray(part.halo)
    if not np.array_equal(halo, expected):
        both = min(halo.size, expected.size)
        differ = np.flatnonzero(halo[:both] != expected[:both])
        i = int(differ[0]) if differ.size else both
        got = halo[i] if i < halo.size else "absent"
        want = expected[i] if i < expected.size else "absent"
        raise PartitionFormatError(f"{path}: entry {i} is {got}, expected {want}; the halo "
                                   f"is the sorted, distinct sources in indices.npy outside "
                                   f"the part's nodes [{lo}, {hi})")


def _check_halo_by_owner(pg: PartitionedGraph, k: int, part: Partition) -> None:
    """meta.json's halo_by_owner of part k (when recorded): its halo counted by owner."""
    recorded = pg.meta.parts[k].halo_by_owner
    if not recorded:
        return
    offsets = np.asarray(pg.meta.offsets)
    counted = np.bincount(segments.segment_of(offsets, np.asarray(part.halo)),
                          minlength=pg.meta.num_parts)
    if len(recorded) != counted.size or not np.array_equal(recorded, counted):
        meta = os.path.join(pg.root, "meta.json")
        raise PartitionFormatError(
            f"{meta}: parts[{k}].halo_by_owner is {list(recorded)}, but part {k}'s "
            f"halo.npy counts {counted.tolist()} nodes per owning partition")


def _check_edge_order(path: str, part: Partition) -> None:
    """Each node's in-edges sorted by (relation, source), as the format promises."""
    indptr = part.indptr
    for start, etype in _block_views(part.etype, overlap=1):
        src = np.asarray(part.indices[start:start + etype.size])
        # Pair j compares edges start+j and start+j+1; skip pairs that cross a node.
        stop = start + etype.size - 1
        first = indptr[np.searchsorted(indptr, start, "right"):
                       np.searchsorted(indptr, stop, "right")]
        same_node = np.ones(etype.size - 1, bool)
        same_node[np.asarray(first) - start - 1] = False
        later = (etype[1:] < etype[:-1]) | ((etype[1:] == etype[:-1]) & (src[1:] < src[:-1]))
        bad = same_node & later
        if bad.any():
            i = start + int(np.argmax(bad))
            node = part.node_range[0] + int(segments.segment_of(indptr, i))
            raise PartitionFormatError(
                f"{path}: in-edges {i} and {i + 1} of node {node} are out of order: (relation "
                f"{part.etype[i]}, source {part.indices[i]}) before (relation "
                f"{part.etype[i + 1]}, source {part.indices[i + 1]}); etype.npy and "
                f"indices.npy sort each node's in-edges by (relation, source)")
