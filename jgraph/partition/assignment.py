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
import math

import numpy as np
import scipy.sparse

from jgraph.data.graph import Graph
from jgraph.partition.metis import Backend, part_kway

BALANCED_SPLITS = ("train", "val", "test")


class Method(enum.Enum):
    METIS = "metis"
    RANDOM = "random"


class PartitionError(ValueError):
    """Partitioning cannot proceed; the message names the value at fault."""


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
        """float64[C]: the most any partition may hold of each constraint.

        (1 + tolerance) x the mean, but never below the smallest achievable maximum of
        unit weights, ceil(mean): 60 nodes of a type cannot split 8 ways better than 8.
        """
        mean = self.weights.sum(axis=0) / num_parts
        return np.maximum((1.0 + tolerance) * mean, np.ceil(mean - 1e-9))


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
           backend: Backend | None = None) -> np.ndarray:
    """int32[N]: the partition of each node (homogeneous ids).

    `constraints` and `adjacency` default to `constraints_for(graph)` and
    `undirected_adjacency(graph)`; pass them when they are already built.
    `backend` picks the METIS binding (default: the best available).
    """
    method = parse_method(method)
    check_request(graph, num_parts, tolerance)
    n = graph.total_nodes
    constraints = constraints or constraints_for(graph)
    if num_parts == 1:
        return np.zeros(n, np.int32)
    if adjacency is None and (method is Method.METIS or rebalance):
        adjacency = undirected_adjacency(graph)
    if method is Method.METIS:
        parts = _fill_empty(part_kway(adjacency, constraints.weights, num_parts, seed=seed,
                                      imbalance=tolerance, backend=backend), num_parts)
    else:
        parts = _stratified_random(constraints, num_parts, seed)
    if rebalance:
        parts = refine(adjacency, parts, constraints, num_parts, tolerance)
    return parts


def check_request(graph: Graph, num_parts, tolerance: float) -> None:
    """Raise a PartitionError unless `num_parts` and `tolerance` make sense for `graph`."""
    if (isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer))
            or num_parts < 1):
        raise PartitionError(f"num_parts must be a positive integer, got {_shown(num_parts)}")
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


def _fill_empty(parts: np.ndarray, num_parts: int) -> np.ndarray:
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
    rows = np.repeat(np.arange(nodes.size), deg)
    pos = np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg) + np.repeat(start, deg)
    flat = rows * num_parts + parts[adj.indices[pos]]
    return np.bincount(flat, weights=adj.data[pos], minlength=nodes.size * num_parts
                       ).reshape(nodes.size, num_parts)


def refine(adj: scipy.sparse.csr_matrix, parts: np.ndarray, constraints: Constraints,
           num_parts: int, tolerance: float, max_rounds: int = 1000) -> np.ndarray:
    """Move nodes between partitions until no constraint exceeds its limit.

    A local search on the total excess, sum over partitions p and constraints c of
    max(0, load[p, c] - limit[c]) / limit[c]. Each round takes the worst (p, c) and
    moves nodes that carry weight in c out of p, best cut gain first, to the partition
    where the move lowers the total excess most among those with the best gain. The
    excess strictly falls with every move, so the search ends; it stops when nothing is
    over its limit or no move lowers the excess.
    """
    parts = parts.copy()
    w = constraints.weights
    limits = np.maximum(constraints.limits(num_parts, tolerance), 1e-12)
    loads = _loads(parts, w, num_parts)
    stuck: set[tuple[int, int]] = set()

    def excess(x):
        return np.maximum(x - limits, 0.0) / limits

    for _ in range(max_rounds):
        over = excess(loads)
        for p, c in stuck:
            over[p, c] = 0.0
        p, c = np.unravel_index(np.argmax(over), over.shape)
        if over[p, c] <= 1e-12:
            break
        candidates = np.flatnonzero((parts == p) & (w[:, c] > 0))
        counts = _neighbour_part_counts(adj, candidates, parts, num_parts)
        gain = counts - counts[:, [p]]            # cut edge weight saved per destination
        order = np.lexsort((w[candidates, c], -np.max(np.delete(gain, p, axis=1), axis=1)))
        moved = 0
        for i in order:
            v = candidates[i]
            # Change in total excess for each destination q (row p: leaving p).
            leave = (excess(loads[p] - w[v]) - excess(loads[p])).sum()
            enter = (excess(loads + w[v]) - excess(loads)).sum(axis=1)
            delta = leave + enter
            delta[p] = np.inf
            ok = delta < -1e-12
            if not ok.any():
                continue
            score = np.where(ok, gain[i], -np.inf)
            best = np.flatnonzero(score == score.max())
            q = int(best[np.argmin(delta[best])])
            parts[v] = q
            loads[p] -= w[v]
            loads[q] += w[v]
            moved += 1
            if loads[p, c] <= limits[c] + 1e-9:
                break
        if moved == 0 and not _swap(parts, loads, w, candidates, gain, p, c, excess):
            stuck.add((int(p), int(c)))
    return parts


def _swap(parts, loads, w, candidates, gain, p, c, excess, tries: int = 64) -> bool:
    """When no single move helps: exchange a node v of p (carrying weight in c) with a
    node u of another partition q, the pair that lowers the total excess most.

    Needed when every partition with room in c is full in another constraint (say node
    count): v alone would overfill q, but v for a node u that is lighter in c does not.
    Updates parts and loads in place; returns whether a swap was made.
    """
    order = np.argsort(-np.max(np.delete(gain, p, axis=1), axis=1), kind="stable")[:tries]
    before = excess(loads).sum()
    best = (-1e-12, None)
    for i in order:
        v = candidates[i]
        for q in np.flatnonzero(loads[:, c] + w[v, c] < loads[p, c]):
            members = np.flatnonzero((parts == q) & (w[:, c] < w[v, c]))
            if members.size == 0:
                continue
            diff = w[members] - w[v]                     # load change of p; q gets -diff
            new_p = excess(loads[p] + diff).sum(axis=1)
            new_q = excess(loads[q] - diff).sum(axis=1)
            rest = before - excess(loads[p]).sum() - excess(loads[q]).sum()
            delta = rest + new_p + new_q - before
            j = int(np.argmin(delta))
            if delta[j] < best[0]:
                best = (delta[j], (v, int(q), members[j]))
    if best[1] is None:
        return False
    v, q, u = best[1]
    parts[v], parts[u] = q, p
    loads[p] += w[u] - w[v]
    loads[q] += w[v] - w[u]
    return True
