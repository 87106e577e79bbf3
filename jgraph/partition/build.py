"""`partition_graph`: assign in memory, then write the partition directory by the
bounded route's phases (`jgraph.partition.chunked`).

Writing is atomic: the directory is assembled in the bounded route's work directory
`<out>.work` and renamed to `out` once complete (meta.json last), so a killed write
never leaves a half directory at `out`.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping

import numpy as np

from jgraph.atomic import occupied, scratch_beside
from jgraph.data.chunked import save_chunked
from jgraph.data.graph import Graph
from jgraph.data.links import EdgeSet
from jgraph.data.prepare import Preparation
from jgraph.partition.assignment import (
    Method,
    assign,
    assignment_dtype,
    check_given,
    check_request,
    constraints_for,
    parse_method,
    undirected_adjacency,
)
from jgraph.partition.chunked import WORK, ChunkedOptions, partition_chunked
from jgraph.partition.errors import PartitionError
from jgraph.partition.metis import Backend
from jgraph.partition.store import ASSIGNMENT, READABLE_KINDS, PartitionMeta
from jgraph.partition.work import discard
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

    The assignment is made in memory; the directory is written by the bounded route's
    phases (`jgraph.partition.chunked`) over `graph` saved as a chunked directory in a
    scratch folder beside `out_dir`, so both routes number, write and describe a
    partition by one code path.
    """
    start = time.perf_counter()
    progress = progress or Progress(enabled=False)
    method = parse_method(method)
    # Every refusal before anything is written.
    check_request(graph, num_parts, tolerance)
    assignment = check_given(method, assignment, graph.total_nodes, num_parts)
    edge_splits = dict(edge_splits or {})
    _check_edge_splits(graph, edge_splits)
    _check_data(graph)
    out_dir = os.fspath(out_dir)
    check_out_dir(out_dir, overwrite)
    real = os.path.realpath(out_dir)        # renames act on the directory, not a link
    with scratch_beside(real, "source") as scratch:
        with progress.phase("constraints and adjacency"):
            constraints = constraints_for(graph)
            adjacency = (undirected_adjacency(graph)
                         if (method in (Method.METIS, Method.MULTILEVEL) or rebalance)
                         and num_parts > 1 else None)
        with progress.phase(f"assigning nodes ({method.value})"):
            parts = assign(graph, num_parts, method, seed=seed, tolerance=tolerance,
                           rebalance=rebalance, constraints=constraints, adjacency=adjacency,
                           backend=backend, spill_dir=scratch, given=assignment)
        del adjacency
        with progress.phase("writing the graph for the partition phases"):
            source = os.path.join(scratch, "graph")
            save_chunked(graph, source, edge_splits=edge_splits,
                         preparation=(preparation or Preparation()).to_json())
            given = os.path.join(scratch, ASSIGNMENT)
            np.save(given, parts.astype(assignment_dtype(num_parts)))
        try:
            return partition_chunked(source, real, ChunkedOptions(num_parts, seed=seed,
                                                                  tolerance=tolerance,
                                                                  assignment=given),
                                     overwrite=overwrite, progress=progress,
                                     check_out=check_out_dir, method=method, started=start)
        except BaseException:
            discard(real + WORK)        # no run resumes it: its source goes with `scratch`
            raise


def _check_data(graph: Graph) -> None:
    """Refuse node or edge data a partition cannot hold: not numbers or booleans, or
    edge data on some relations only."""
    for t, data in graph.node_data.items():
        for name, values in data.items():
            _check_dtype(f"node data {name!r} of type {t!r}", values)
    names = sorted({k for data in graph.edge_data.values() for k in data})
    for name in names:
        for rel in graph.relations:
            data = graph.edge_data.get(rel, {})
            if name not in data:
                raise PartitionError(f"edge data {name!r} is on some relations but not on "
                                     f"{tuple(rel)}; partitioned edge data must cover every "
                                     f"relation")
            _check_dtype(f"edge data {name!r}", data[name])


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


def _check_dtype(what: str, values) -> None:
    if values.dtype.kind not in READABLE_KINDS:
        raise PartitionError(f"{what} has dtype {values.dtype}; partitioned node and edge "
                             f"data must be numbers or booleans")


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
