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
from jgraph.partition.adjacency import CSRAdjacency
from jgraph.partition.metis import Backend, part_kway
from jgraph.partition.multilevel import NodeWeights, balance_limits
from jgraph.partition.multilevel import partition as multilevel

BALANCED_SPLITS = ("train", "val", "test")


class Method(enum.Enum):
    METIS = "metis"
    # Label-propagation coarsening, METIS on the coarse graph, label-propagation
    # refinement (`jgraph.partition.multilevel`): the chunked route's partitioner, in
    # memory bounded by the nodes; in memory here.
    MULTILEVEL = "multilevel"
    RANDOM = "random"
    GIVEN = "given"     # an assignment made elsewhere (ParMETIS, a file): `assign(given=)`


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
        parts, _ = refine(adjacency, parts, constraints, num_parts, tolerance)
    return parts


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
    rows = np.repeat(np.arange(nodes.size), deg)
    pos = np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg) + np.repeat(start, deg)
    flat = rows * num_parts + parts[adj.indices[pos]]
    return np.bincount(flat, weights=adj.data[pos], minlength=nodes.size * num_parts
                       ).reshape(nodes.size, num_parts)


@dataclasses.dataclass(frozen=True)
class RefineStats:
    """What one `refine` call did, to keep its cost in view.

    Fields:
      rounds: int — rounds run, each on one (partition, constraint) over its limit.
      moves: int — nodes moved on their own.
      swaps: int — pairs of nodes exchanged between two partitions.
      scored: int — candidate nodes whose change in excess was computed (in batches or
        singly); bounded by about twice the candidates seen per round.
      converged: bool — whether every constraint ended within its limit; when False,
        `balance` of the result says how close it came.
    """

    rounds: int
    moves: int
    swaps: int
    scored: int
    converged: bool


_EPS = 1e-12        # an excess change smaller than this is not an improvement
_BATCH = 256        # candidates scored at once against the current loads


def _excess(loads: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """How far each load is over its limit, relative to the limit (0 when within)."""
    return np.maximum(loads - limits, 0.0) / limits


def refine(adj: scipy.sparse.csr_matrix, parts: np.ndarray, constraints: Constraints,
           num_parts: int, tolerance: float, max_rounds: int = 1000
           ) -> tuple[np.ndarray, RefineStats]:
    """Move nodes between partitions until no constraint exceeds its limit.

    A local search on the total excess, sum over partitions p and constraints c of
    max(0, load[p, c] - limit[c]) / limit[c]. Each round takes the worst (p, c) and
    moves nodes that carry weight in c out of p, best cut gain first, to the partition
    where the move lowers the total excess most among those with the best gain; when no
    single move helps, it exchanges a batch of alike pairs (`_swap`). The excess
    strictly falls with every move and swap, so the search ends; it stops when nothing
    is over its limit, no move or swap lowers the excess, or after `max_rounds`.

    Cost: a round is linear in the size of p and its edges; rounds number about the
    (partition, constraint) pairs over their limit, since a round moves or swaps as
    many nodes as p needs (or as helps), not one.
    Returns the new parts (int32[N]) and what the search did.
    """
    parts = parts.copy()
    w = constraints.weights
    limits = np.maximum(constraints.limits(num_parts, tolerance), 1e-12)
    loads = _loads(parts, w, num_parts)
    stuck: set[tuple[int, int]] = set()
    profiles = None                              # built on the first swap
    rounds = moves = swaps = scored = 0
    while rounds < max_rounds:
        over = _excess(loads, limits)
        for p, c in stuck:
            over[p, c] = 0.0
        p, c = np.unravel_index(np.argmax(over), over.shape)
        if over[p, c] <= _EPS:
            break
        rounds += 1
        candidates = np.flatnonzero((parts == p) & (w[:, c] > 0))
        counts = _neighbour_part_counts(adj, candidates, parts, num_parts)
        gain = counts - counts[:, [p]]            # cut edge weight saved per destination
        order = np.lexsort((w[candidates, c], -np.max(np.delete(gain, p, axis=1), axis=1)))
        candidates, gain = candidates[order], gain[order]
        moved, seen = _move_out(parts, loads, w, limits, candidates, gain, p, c)
        moves, scored = moves + moved, scored + seen
        if moved == 0:
            if profiles is None:
                profiles = _profiles(w)
            swapped = _swap(adj, parts, loads, w, limits, profiles, candidates, gain, p, c)
            swaps += swapped
            if not swapped:
                stuck.add((int(p), int(c)))
    converged = bool(_excess(loads, limits).max() <= _EPS)
    return parts, RefineStats(rounds, moves, swaps, scored, converged)


def _move_deltas(loads: np.ndarray, limits: np.ndarray, wv: np.ndarray, p: int) -> np.ndarray:
    """float64[B, P]: change in total excess if node b (weights wv[b]) left p for q.

    Column p is inf. Excess is convex in the loads and weights are non-negative, so as
    nodes leave p (p's loads fall, the others' rise) every entry can only grow: a node
    that cannot lower the excess now cannot later in the same round.
    """
    leave = (_excess(loads[p] - wv, limits) - _excess(loads[p], limits)).sum(axis=1)
    enter = (_excess(loads + wv[:, None], limits) - _excess(loads, limits)).sum(axis=2)
    delta = leave[:, None] + enter
    delta[:, p] = np.inf
    return delta


def _move_out(parts, loads, w, limits, candidates, gain, p, c) -> tuple[int, int]:
    """Move candidates (in order) out of p while that lowers the excess, until p is
    within its limit in c. Updates parts and loads in place; returns (moved, scored).

    Candidates are scored a batch at a time against the current loads and only those
    that lower the excess now are re-scored one by one (loads change with each move);
    by `_move_deltas`' monotonicity the others are skipped for good, so the result is
    that of scoring every candidate singly, at a cost linear in the candidates reached.
    """
    moved = scored = 0
    for start in range(0, candidates.size, _BATCH):
        batch = _move_deltas(loads, limits, w[candidates[start:start + _BATCH]], p)
        scored += batch.shape[0]
        for i in start + np.flatnonzero((batch < -_EPS).any(axis=1)):
            v = candidates[i]
            delta = _move_deltas(loads, limits, w[v][None], p)[0]
            scored += 1
            ok = delta < -_EPS
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
                return moved, scored
    return moved, scored


def _profiles(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64[K, C] the distinct rows of w, int64[N] each node's row in it).

    Nodes with the same weights change the excess alike, so swaps are searched over
    these K profiles (a few hundred on a million-node graph) instead of over nodes.
    Same result as np.unique(w, axis=0), which is ten times slower.
    """
    key, size = np.zeros(w.shape[0], np.int64), 1
    for column in w.T:
        values, code = np.unique(column, return_inverse=True)
        if size * values.size >= 2**62:
            _, key = np.unique(key, return_inverse=True)
            size = int(key.max()) + 1
        key, size = key * values.size + code.reshape(-1), size * values.size
    _, ids = np.unique(key, return_inverse=True)
    ids = ids.reshape(-1)
    first = np.empty(int(ids.max()) + 1, np.int64)
    first[ids[::-1]] = np.arange(ids.size)[::-1]
    return w[first], ids


def _swap(adj, parts, loads, w, limits, profiles, candidates, gain, p, c,
          tries: int = 64) -> int:
    """When no single move helps: exchange nodes v of p (carrying weight in c) with
    nodes u of another partition q that are lighter in c. Returns the pairs swapped.

    Needed when every partition with room in c is full in another constraint (say node
    count): v alone would overfill q, but v for a node u that is lighter in c does not.
    The pair of weight profiles (one among the `tries` best-gain candidates, one present
    in q) and q that lower the total excess most are chosen, then as many such pairs are
    swapped as each still lowers it and p still needs (candidates of that profile by
    their cut gain into q, partners by theirs into p). Updates parts and loads in place.
    """
    table, profile_of = profiles
    num_parts, k = loads.shape[0], table.shape[0]
    top = np.argsort(-np.max(np.delete(gain, p, axis=1), axis=1), kind="stable")[:tries]
    mine = table[np.unique(profile_of[candidates[top]])]                      # [A, C]
    present = np.bincount(parts.astype(np.int64) * k + profile_of,
                          minlength=num_parts * k).reshape(num_parts, k) > 0
    base = _excess(loads, limits).sum(axis=1)
    best = (-_EPS, None)
    for q in range(num_parts):
        if q == p:
            continue
        theirs = table[present[q]]                                             # [B, C]
        allowed = ((theirs[None, :, c] < mine[:, None, c])
                   & (loads[q, c] + mine[:, None, c] < loads[p, c]))
        if not allowed.any():
            continue
        diff = theirs[None] - mine[:, None]            # load change of p; q gets -diff
        delta = (_excess(loads[p] + diff, limits).sum(axis=2) - base[p]
                 + _excess(loads[q] - diff, limits).sum(axis=2) - base[q])
        delta = np.where(allowed, delta, np.inf)
        a, b = np.unravel_index(np.argmin(delta), delta.shape)
        if delta[a, b] < best[0]:
            best = (delta[a, b], (q, mine[a], theirs[b]))
    if best[1] is None:
        return 0
    q, out_w, in_w = best[1]
    outs = np.flatnonzero((w[candidates] == out_w).all(axis=1))
    outs = candidates[outs[np.argsort(-gain[outs, q], kind="stable")]]
    ins = np.flatnonzero((parts == q) & (w == in_w).all(axis=1))
    in_counts = _neighbour_part_counts(adj, ins, parts, num_parts)
    ins = ins[np.argsort(in_counts[:, q] - in_counts[:, p], kind="stable")]
    # Pairs p needs to get within its limit in c, then how many of those still help:
    # the excess is convex in the number of pairs, so those that help come first.
    diff = in_w - out_w
    needed = math.ceil(max(loads[p, c] - limits[c], 0.0) / -diff[c] - 1e-9)
    pairs = np.arange(min(outs.size, ins.size, max(needed, 1)) + 1)[:, None]
    total = (_excess(loads[p] + pairs * diff, limits).sum(axis=1)
             + _excess(loads[q] - pairs * diff, limits).sum(axis=1))
    m = int(np.cumprod(np.diff(total) < -_EPS).sum())
    parts[outs[:m]], parts[ins[:m]] = q, p
    loads[p] += m * diff
    loads[q] -= m * diff
    return m
