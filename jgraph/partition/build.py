"""`partition_graph`: assign, relabel (`jgraph.partition.relabel`), and write the
partition directory.

Writing is atomic: the directory is written as a sibling `<out>.partial-<host>-<pid>`
and renamed to `out` once complete (meta.json last), so a killed write never leaves a
half directory at `out`; the next write to `out` deletes what a killed one left.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping

import numpy as np

from jgraph.atomic import atomic_dir, occupied
from jgraph.data.graph import Graph
from jgraph.data.links import EdgeSet
from jgraph.data.prepare import Preparation
from jgraph.data.sparse import SparseRows
from jgraph.partition.assignment import (
    Method,
    PartitionError,
    assign,
    assignment_dtype,
    balance,
    check_given,
    check_request,
    constraints_for,
    parse_method,
    undirected_adjacency,
)
from jgraph.partition.metis import Backend
from jgraph.partition.numbering import partition_meta
from jgraph.partition.relabel import Part, part, relabel, relabel_edges, split_parts
from jgraph.partition.store import (
    ASSIGNMENT,
    READABLE_KINDS,
    ArraySpec,
    PartitionMeta,
    part_dir,
    save_array,
    write_meta,
)
from jgraph.progress import Progress


class OutputExistsError(PartitionError):
    """The output path holds something `partition_graph` will not replace.

    path: the output path; reason: what is there; replaceable: True when
    `overwrite=True` would replace it (callers with other flags rephrase the hint).
    """

    def __init__(self, path: str, reason: str, replaceable: bool):
        self.path, self.reason, self.replaceable = path, reason, replaceable
        super().__init__(f"{path}: {reason}"
                         + ("; pass overwrite=True to replace it" if replaceable else ""))


def partition_graph(graph: Graph, num_parts: int, method: Method | str, out_dir: str | os.PathLike,
                    *, seed: int = 0, tolerance: float = 0.05, rebalance: bool = True,
                    overwrite: bool = False, backend: Backend | None = None,
                    progress: Progress | None = None,
                    edge_splits: Mapping[str, EdgeSet] | None = None,
                    assignment: np.ndarray | None = None,
                    preparation: Preparation | None = None) -> PartitionMeta:
    """Partition `graph` into `num_parts` and write the directory `out_dir`.

    Returns the metadata that `out_dir/meta.json` holds. `tolerance` is the allowed
    max/mean - 1 of every balance constraint; `rebalance=False` keeps the raw METIS or
    random assignment (its balance is still measured and reported). `out_dir` must be
    absent, empty, or (with `overwrite`) a partition directory, which is replaced
    whole once the new one is complete. edge_splits: link prediction's positive edges
    by split (`jgraph.data.links.split_edges`), stored with the partition of their
    destination. assignment: with method "given", each node's partition (homogeneous
    ids), made elsewhere: by ParMETIS across hosts for a graph too large to partition
    on one machine, or by any other tool. preparation: what was done to `graph` before
    (`jgraph.data.prepare.prepare`), recorded in meta.json; None: nothing.
    """
    start = time.perf_counter()
    progress = progress or Progress(enabled=False)
    method = parse_method(method)
    # Every refusal before anything is written.
    check_request(graph, num_parts, tolerance)
    assignment = check_given(method, assignment, graph.total_nodes, num_parts)
    edge_splits = dict(edge_splits or {})
    _check_edge_splits(graph, edge_splits)
    out_dir = os.fspath(out_dir)
    check_out_dir(out_dir, overwrite)
    edge_data = _homogeneous_edge_data(graph)
    node_specs = {t: {name: _spec(f"node data {name!r} of type {t!r}", v)
                      for name, v in data.items()}
                  for t, data in graph.node_data.items() if data}
    edge_specs = {name: _spec(f"edge data {name!r}", v) for name, v in edge_data.items()}
    # Renames act on the directory itself, not on a link to it.
    real = os.path.realpath(out_dir)
    with atomic_dir(real, lambda: check_out_dir(real, overwrite)) as staging:
        return _write(graph, num_parts, method, staging, seed=seed, tolerance=tolerance,
                      rebalance=rebalance, backend=backend, progress=progress,
                      edge_data=edge_data, node_specs=node_specs, edge_specs=edge_specs,
                      start=start, edge_splits=edge_splits, assignment=assignment,
                      preparation=preparation or Preparation())


def _write(graph: Graph, num_parts: int, method: Method, out_dir: str, *, seed: int,
           tolerance: float, rebalance: bool, backend: Backend | None, progress: Progress,
           edge_data: dict, node_specs: dict, edge_specs: dict, start: float,
           edge_splits: dict, assignment: np.ndarray | None,
           preparation: Preparation) -> PartitionMeta:
    """Assign, relabel and write every file into the new directory `out_dir`, one
    partition at a time (only one partition's arrays are held at once)."""
    with progress.phase("constraints and adjacency"):
        constraints = constraints_for(graph)
        adjacency = (undirected_adjacency(graph)
                     if (method in (Method.METIS, Method.MULTILEVEL) or rebalance)
                     and num_parts > 1 else None)
    with progress.phase(f"assigning nodes ({method.value})"):
        parts = assign(graph, num_parts, method, seed=seed, tolerance=tolerance,
                       rebalance=rebalance, constraints=constraints, adjacency=adjacency,
                       backend=backend, spill_dir=out_dir, given=assignment)
    del adjacency

    with progress.phase("relabelling"):
        relabelling = relabel(graph, parts, num_parts)
        save_array(os.path.join(out_dir, "node_map.npy"), relabelling.node_map)
        save_array(os.path.join(out_dir, "node_map_inv.npy"), relabelling.inverse)
        save_array(os.path.join(out_dir, ASSIGNMENT), parts.astype(assignment_dtype(num_parts)))
        for t, ids in graph.ids.items():
            save_array(os.path.join(out_dir, "ids", f"{t}.npy"), ids)
    with progress.phase("sorting edges by destination"):
        edges = relabel_edges(graph, parts, relabelling)

    part_info = []
    splits = split_parts(graph, relabelling)
    for k in progress.iterate(range(num_parts), "writing partitions", num_parts):
        one = part(graph, relabelling, edges, edge_data, k, edge_splits, splits)
        _save_part(part_dir(out_dir, k), one)
        part_info.append(one.info)

    meta = partition_meta(
        graph, relabelling.counts, part_info, method=method.value,
        num_edges_per_relation=[int(e.shape[1]) for e in graph.edges.values()],
        node_data=node_specs,
        edge_data=edge_specs,
        edge_cut_fraction=edges.cut,
        balance=balance(parts, constraints, num_parts),
        balance_tolerance=tolerance,
        seed=seed,
        seconds=time.perf_counter() - start,
        edge_splits={name: {"negatives": 0 if s.negatives is None else int(s.negatives.shape[1])}
                     for name, s in edge_splits.items()},
        preparation=preparation.to_json(),
        ids={t: ids.dtype.str for t, ids in graph.ids.items()},
    )
    write_meta(out_dir, meta)
    return meta


def _save_part(d: str, one: Part) -> None:
    """Write partition `one`'s files into its directory `d`."""
    for name in ("indptr", "indices", "etype", "edge_ids", "halo"):
        save_array(os.path.join(d, f"{name}.npy"), getattr(one, name))
    for name, values in one.edge_data.items():
        save_array(os.path.join(d, "edge", f"{name}.npy"), values)
    for (ntype, name), values in one.node_data.items():
        path = os.path.join(d, "node", ntype, name)
        if isinstance(values, SparseRows):
            save_array(os.path.join(path, "indices.npy"), values.indices)
            save_array(os.path.join(path, "values.npy"), values.values)
        else:
            save_array(path + ".npy", values)
    for ntype, named in one.splits.items():
        for name, ids in named.items():
            save_array(os.path.join(d, "split", ntype, f"{name}.npy"), ids)
    for split, arrays in one.edge_splits.items():
        for name, values in arrays.items():
            save_array(os.path.join(d, "edges", split, f"{name}.npy"), values)


def _check_edge_splits(graph: Graph, edge_splits: dict) -> None:
    """Refuse edge splits with bad names, or ids outside the graph's nodes."""
    n, r = graph.total_nodes, len(graph.relations)
    for name, s in edge_splits.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise PartitionError(f"edge split name {name!r}: use letters, digits and _")
        sizes = {field: np.asarray(getattr(s, field)).shape for field in ("src", "dst", "etype")}
        if len(set(sizes.values())) != 1 or len(sizes["src"]) != 1:
            raise PartitionError(f"edge split {name!r}: src, dst and etype must be 1-D and "
                                 f"of one length, got shapes {sizes}")
        checks = [("src", s.src, n), ("dst", s.dst, n), ("etype", s.etype, r)]
        if s.negatives is not None:
            checks.append(("negatives", s.negatives, n))
        for field, ids, limit in checks:
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= limit):
                bad = ids.min() if ids.min() < 0 else ids.max()
                raise PartitionError(f"edge split {name!r}: {field} holds {int(bad)}, "
                                     f"outside [0, {limit})")
        if s.negatives is not None and s.negatives.shape[0] != s.src.size:
            raise PartitionError(f"edge split {name!r}: negatives has "
                                 f"{s.negatives.shape[0]} rows for {s.src.size} positives")


def _spec(what: str, values: np.ndarray) -> ArraySpec:
    """meta.json's entry for a node or edge array: dtype, row shape, and for integers
    the value range (which checks of the written directory hold each part to)."""
    if values.dtype.kind not in READABLE_KINDS:
        raise PartitionError(f"{what} has dtype {values.dtype}; partitioned node and edge "
                             f"data must be numbers or booleans")
    shape = tuple(int(d) for d in values.shape[1:])
    if isinstance(values, SparseRows):
        return ArraySpec(values.dtype.name, shape, sparse=values.nnz_per_row)
    if values.dtype.kind in "iu" and values.size:
        return ArraySpec(values.dtype.name, shape, int(values.min()), int(values.max()))
    return ArraySpec(values.dtype.name, shape)


def _homogeneous_edge_data(graph: Graph) -> dict[str, np.ndarray]:
    """Edge data laid end to end over the relations (the homogeneous edge order)."""
    names = sorted({k for data in graph.edge_data.values() for k in data})
    out = {}
    for name in names:
        pieces = []
        for rel in graph.relations:
            data = graph.edge_data.get(rel, {})
            if name not in data:
                raise PartitionError(f"edge data {name!r} is on some relations but not on "
                                     f"{tuple(rel)}; partitioned edge data must cover every "
                                     f"relation")
            pieces.append(data[name])
        out[name] = np.concatenate(pieces)
    return out


def check_out_dir(out: str, overwrite: bool) -> None:
    """Raise an OutputExistsError unless `out` may receive a partition: absent, an empty
    directory, or a partition directory that `overwrite` allows to replace.
    (`partition_graph` checks it; a caller may too before loading a large graph.)"""
    found = occupied(out, _holds_partition, "a jgraph partition directory", overwrite)
    if found:
        raise OutputExistsError(out, *found)


def _holds_partition(path: str) -> bool:
    """A complete partition directory, or an incomplete one that an older jgraph (which
    wrote in place) left: only the format's names in it."""
    names = set(os.listdir(path))
    return "meta.json" in names or all(
        name in ("meta.json.tmp", "node_map.npy", "node_map_inv.npy")
        or (name.startswith("part-") and name[5:].isdigit()) for name in names)
