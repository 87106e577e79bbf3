"""Assign every node to a partition: METIS or stratified random, then rebalance.

Balance follows DistDGL: node count per node type, train/val/test counts, and edges
(in-degree, since each edge is stored with its destination) are all kept within a
tolerance of the mean. METIS balances them all at once where its multi-constraint
mode is available (`jgraph.partition.metis`), and a refinement pass then moves nodes
out of any partition still over a constraint's limit (tiny constraints, such as 60
nodes of one type, or the single combined weight that pymetis allows), preferring the
moves that cut the fewest extra edges.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import math
import os

import numpy as np
import scipy.sparse

import jgraph.segments as segments
from jgraph.data.chunked import ChunkedGraph
from jgraph.data.graph import Graph
from jgraph.partition.adjacency import CSRAdjacency
from jgraph.partition.errors import PartitionError
from jgraph.partition.excess import RefineStats, over_limits, relieve
from jgraph.partition.metis import Backend, part_kway
from jgraph.partition.multilevel import NodeWeights, balance_limits
from jgraph.partition.multilevel import partition as multilevel

BALANCED_SPLITS = ("train", "val", "test")
# The most partitions: the phases that write a partition directory (`jgraph.partition.
# chunked`) keep an edge bucket file open for each partition at least.
MAX_PARTS = 2**15


class Method(enum.Enum):
    METIS = "metis"
    # Label-propagation coarsening, METIS on the coarse graph, label-propagation
    # refinement (`jgraph.partition.multilevel`): the chunked route's partitioner, in
    # memory bounded by the nodes; in memory here.
    MULTILEVEL = "multilevel"
    RANDOM = "random"
    GIVEN = "given"     # an assignment made elsewhere (ParMETIS, a file): `assign(given=)`


@dataclasses.dataclass(frozen=True)
class Constraints:
    """Per-node weights to balance across partitions.

    Fields:
      names: tuple[str, ...] — C constraint names (`nodes` or `nodes:<type>`, `train`,
        `val`, `test`, `edges`).
      weights: float64[N, C] — each node's weight in each constraint, homogeneous ids.
    """

    names: tuple[str, ...]
    weights: np.ndarray

    def limits(self, num_parts: int, tolerance: float) -> np.ndarray:
        """float64[C]: the most any partition may hold of each constraint
        (`jgraph.partition.multilevel.balance_limits`)."""
        return balance_limits(self.weights.sum(axis=0), num_parts, tolerance)


def constraints_for(graph: Graph) -> Constraints:
    """Node count per type, train/val/test counts, and in-degree, as weights."""
    type_ids = graph.node_type_ids()
    offsets = graph.type_offsets()
    names, columns = [], []
    for t, ntype in enumerate(graph.node_types):
        names.append("nodes" if len(graph.num_nodes) == 1 else f"nodes:{ntype}")
        columns.append((type_ids == t).astype(np.float64))
    for split in BALANCED_SPLITS:
        member = np.zeros(graph.total_nodes)
        for t, ntype in enumerate(graph.node_types):
            idx = graph.splits.get(ntype, {}).get(split)
            if idx is not None:
                member[offsets[t] + idx] = 1.0
        if member.any():
            names.append(split)
            columns.append(member)
    _, dst, _ = graph.homogeneous_edges()
    names.append("edges")
    columns.append(np.bincount(dst, minlength=graph.total_nodes).astype(np.float64))
    return Constraints(tuple(names), np.stack(columns, axis=1))


def undirected_adjacency(graph: Graph) -> scipy.sparse.csr_matrix:
    """Symmetric CSR over homogeneous ids, no self-loops; values count the edges
    (either direction, any relation) between each pair."""
    src, dst, _ = graph.homogeneous_edges()
    keep = src != dst
    src, dst = src[keep], dst[keep]
    n = graph.total_nodes
    ones = np.ones(src.size, np.int32)
    adj = scipy.sparse.coo_matrix((ones, (src, dst)), shape=(n, n)).tocsr()
    adj = (adj + adj.T).tocsr()
    adj.sum_duplicates()
    return adj


def balance(parts: np.ndarray, constraints: Constraints, num_parts: int) -> dict[str, float]:
    """{constraint: max over partitions / mean} (1.0 is perfect)."""
    loads = _loads(parts, constraints.weights, num_parts)
    mean = constraints.weights.sum(axis=0) / num_parts
    return {name: float(loads[:, c].max() / mean[c]) if mean[c] > 0 else 1.0
            for c, name in enumerate(constraints.names)}


def edge_cut_fraction(graph: Graph, parts: np.ndarray) -> float:
    """Fraction of stored edges whose endpoints lie in different partitions."""
    src, dst, _ = graph.homogeneous_edges()
    return float(np.mean(parts[src] != parts[dst])) if src.size else 0.0


def assign(graph: Graph, num_parts: int, method: Method | str, *, seed: int = 0,
           tolerance: float = 0.05, rebalance: bool = True,
           constraints: Constraints | None = None,
           adjacency: scipy.sparse.csr_matrix | None = None,
           backend: Backend | None = None, spill_dir: str | None = None,
           given: np.ndarray | None = None) -> np.ndarray:
    """int32[N]: the partition of each node (homogeneous ids).

    `constraints` and `adjacency` default to `constraints_for(graph)` and
    `undirected_adjacency(graph)`; pass them when they are already built.
    `backend` picks the METIS binding (default: the best available); `spill_dir` is
    where METIS keeps its finer coarsening levels on disk (`part_kway`). `given`: the
    assignment of method GIVEN (int[N], every partition in [0, num_parts) holding a
    node; `check_given`), rebalanced like the others unless `rebalance` is False.
    """
    method = parse_method(method)
    check_request(graph, num_parts, tolerance)
    n = graph.total_nodes
    given = check_given(method, given, n, num_parts)
    constraints = constraints or constraints_for(graph)
    if num_parts == 1:
        return np.zeros(n, np.int32)
    if adjacency is None and (method in (Method.METIS, Method.MULTILEVEL) or rebalance):
        adjacency = undirected_adjacency(graph)
    if method is Method.MULTILEVEL:
        w = constraints.weights
        parts, _ = multilevel(CSRAdjacency(adjacency),
                             NodeWeights(constraints.names,
                                         tuple(w[:, c] for c in range(w.shape[1]))),
                             num_parts, tolerance=tolerance, seed=seed, workdir=None)
        parts = fill_empty(parts, num_parts)
    elif method is Method.METIS:
        parts = fill_empty(part_kway(adjacency, constraints.weights, num_parts, seed=seed,
                                      imbalance=tolerance, backend=backend,
                                      spill_dir=spill_dir), num_parts)
    elif method is Method.GIVEN:
        parts = given
    else:
        parts = _stratified_random(constraints, num_parts, seed)
    if rebalance:
        parts, stats = refine(adjacency, parts, constraints, num_parts, tolerance)
        if not stats.converged:
            warn_over_limits(graph.name, constraints.names,
                             _loads(parts, constraints.weights, num_parts),
                             constraints.limits(num_parts, tolerance), tolerance)
    return parts


def warn_over_limits(what: str, names, loads: np.ndarray, limits: np.ndarray,
                     tolerance: float) -> None:
    """Say (through the `jgraph.partition` logger) which loads an assignment leaves over
    their balance limits, where no move or swap could bring them within: a constraint
    no assignment meets (one node heavier than a limit), or one the search cannot."""
    logging.getLogger("jgraph.partition").warning(
        "%s: after rebalancing, loads are still over their balance limits (tolerance "
        "%g; meta.json's balance records each constraint's max/mean): %s", what,
        tolerance, over_limits(names, loads, limits))


def read_assignment(path: str | os.PathLike) -> np.ndarray:
    """The assignment in a file (one partition per node, homogeneous ids): a .npy array
    (memory-mapped), or text with one integer per line (ParMETIS's output); a
    PartitionError naming the file otherwise. `check_given` checks it against a graph."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise PartitionError(f"--assignment {path}: no such file")
    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False, mmap_mode="r")
        return np.loadtxt(path, dtype=np.int64, ndmin=1, comments="#")
    except (OSError, ValueError) as e:
        kind = ".npy array" if path.endswith(".npy") else "text file of one integer per line"
        raise PartitionError(f"--assignment {path}: not a readable {kind} ({e})") from None


def assignment_dtype(num_parts: int) -> np.dtype:
    """The integer type an assignment of `num_parts` partitions is stored in."""
    return np.dtype(np.int16 if num_parts <= 2**15 else np.int32)


def check_given(method: Method, given, num_nodes: int, num_parts: int,
                what: str = "assignment") -> np.ndarray | None:
    """int32[N]: `given` (one partition per node, homogeneous ids) if it is one for a
    graph of `num_nodes` nodes in `num_parts` partitions, each holding a node; None
    where no assignment is given. A PartitionError naming `what` and the value at fault
    otherwise, or where an assignment comes with another method than GIVEN (or none
    with GIVEN)."""
    if (method is Method.GIVEN) != (given is not None):
        raise PartitionError(f"an assignment goes with method {Method.GIVEN.value!r} and "
                             f"only with it: method {method.value!r}, "
                             f"{'an' if given is not None else 'no'} assignment")
    if given is None:
        return None
    given = np.asarray(given)
    if given.ndim != 1 or given.shape[0] != num_nodes:
        raise PartitionError(f"{what}: expected one partition per node, {num_nodes} "
                             f"values, got shape {given.shape}")
    if given.dtype.kind not in "iu":
        raise PartitionError(f"{what}: partitions must be integers, got dtype {given.dtype}")
    if given.size and (given.min() < 0 or given.max() >= num_parts):
        node = int(np.flatnonzero((given < 0) | (given >= num_parts))[0])
        raise PartitionError(f"{what}: node {node} is assigned partition {int(given[node])}, "
                             f"outside [0, {num_parts})")
    empty = np.flatnonzero(np.bincount(given, minlength=num_parts) == 0)
    if empty.size:
        raise PartitionError(f"{what}: partition {int(empty[0])} of {num_parts} is given "
                             f"no node")
    return given.astype(np.int32)


def check_request(graph: Graph | ChunkedGraph, num_parts, tolerance: float) -> None:
    """Raise a PartitionError unless `num_parts` and `tolerance` make sense for `graph`
    (in memory or chunked)."""
    if (isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer))
            or num_parts < 1):
        raise PartitionError(f"num_parts must be a positive integer, got {_shown(num_parts)}")
    if num_parts > MAX_PARTS:
        raise PartitionError(f"num_parts={num_parts}: at most {MAX_PARTS} parts (the "
                             f"phases that write a partition directory keep a file open "
                             f"for each)")
    if num_parts > graph.total_nodes:
        raise PartitionError(f"num_parts={num_parts} is more than the graph's "
                             f"{graph.total_nodes} nodes")
    if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.number))
            or not math.isfinite(tolerance) or tolerance < 0):
        raise PartitionError(f"balance tolerance must be a finite number >= 0, got "
                             f"{_shown(tolerance)}")


def _shown(value) -> str:
    """A value as the user wrote it: 2.5, nan, '3' (numpy scalars as Python ones)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def parse_method(method: Method | str) -> Method:
    if isinstance(method, Method):
        return method
    try:
        return Method(method)
    except ValueError:
        raise PartitionError(f"unknown partition method {method!r}; choose one of "
                             f"{[m.value for m in Method]}") from None


def fill_empty(parts: np.ndarray, num_parts: int) -> np.ndarray:
    """METIS may leave a partition empty on tiny or disconnected graphs; give it a node."""
    sizes = np.bincount(parts, minlength=num_parts)
    for p in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        v = np.flatnonzero(parts == donor)[0]
        parts[v] = p
        sizes[donor] -= 1
        sizes[p] += 1
    return parts


def _stratified_random(constraints: Constraints, num_parts: int, seed: int) -> np.ndarray:
    """Random assignment dealt round-robin within strata of alike nodes.

    Nodes are grouped by their constraint membership (type, split) and in-degree
    bucket; each group is shuffled and dealt to the partitions in turn from a random
    start, so every count constraint is balanced to within one node.
    """
    rng = np.random.default_rng(seed)
    w = constraints.weights
    edge_col = constraints.names.index("edges")
    unit = np.delete(w, edge_col, axis=1) > 0
    degree_bucket = np.floor(np.log2(1 + w[:, edge_col])).astype(np.int64)
    key = np.concatenate([unit, degree_bucket[:, None]], axis=1)
    _, stratum = np.unique(key, axis=0, return_inverse=True)
    stratum = stratum.reshape(-1)
    order = rng.permutation(stratum.size)
    order = order[np.argsort(stratum[order], kind="stable")]     # shuffled within strata
    sorted_strata = stratum[order]
    first = np.searchsorted(sorted_strata, sorted_strata, side="left")
    rank = np.arange(order.size) - first                           # position in stratum
    start = rng.integers(num_parts, size=int(stratum.max()) + 1)
    parts = np.empty(order.size, np.int32)
    parts[order] = (rank + start[sorted_strata]) % num_parts
    return parts


def _loads(parts: np.ndarray, weights: np.ndarray, num_parts: int) -> np.ndarray:
    return np.stack([np.bincount(parts, weights=weights[:, c], minlength=num_parts)
                     for c in range(weights.shape[1])], axis=1)


def _neighbour_part_counts(adj, nodes: np.ndarray, parts: np.ndarray, num_parts: int):
    """float64[len(nodes), P]: edge weight from each node into each partition."""
    start, stop = adj.indptr[nodes], adj.indptr[nodes + 1]
    deg = stop - start
    rows = segments.segment_ids(deg)
    pos = segments.segment_positions(deg) + np.repeat(start, deg)
    flat = rows * num_parts + parts[adj.indices[pos]]
    return np.bincount(flat, weights=adj.data[pos], minlength=nodes.size * num_parts
                       ).reshape(nodes.size, num_parts)


def refine(adj: scipy.sparse.csr_matrix, parts: np.ndarray, constraints: Constraints,
           num_parts: int, tolerance: float, max_rounds: int = 1000
           ) -> tuple[np.ndarray, RefineStats]:
    """Move nodes between partitions until no constraint exceeds its limit: the excess
    search (`jgraph.partition.excess.relieve`) over every node. Returns the new parts
    (int32[N]) and what the search did."""
    parts = parts.copy()
    w = constraints.weights
    limits = np.maximum(constraints.limits(num_parts, tolerance), 1e-12)
    loads = _loads(parts, w, num_parts)
    stats = relieve(parts, w, loads, limits,
                    lambda nodes: _neighbour_part_counts(adj, nodes, parts, num_parts),
                    max_rounds)
    return parts, stats
