"""The excess search: moves and swaps that bring every partition within its balance
limits, whatever made the assignment (METIS, random, a given one, the bounded-memory
partitioner's label propagation).

Used by `jgraph.partition.assignment.refine` over the whole graph in memory, and by
`jgraph.partition.multilevel.refine` over a bounded set of each process's nodes, their
edges read from disk.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

import jgraph.segments as segments


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
    """How far each load is over its limit, relative to the limit (0 when within; a
    load over a limit of 0, a constraint no node carries, cannot be)."""
    over = np.maximum(loads - limits, 0.0)
    return np.divide(over, limits, out=np.zeros_like(over, dtype=np.float64),
                     where=limits > 0)


def relieve(parts: np.ndarray, w: np.ndarray, loads: np.ndarray, limits: np.ndarray,
            counts_of: Callable[[np.ndarray], np.ndarray], max_rounds: int = 1000
            ) -> RefineStats:
    """Move nodes between partitions until no constraint exceeds its limit.

    A local search on the total excess, sum over partitions p and constraints c of
    max(0, load[p, c] - limit[c]) / limit[c]. Each round takes the worst (p, c) and
    moves nodes that carry weight in c out of p, best cut gain first, to the partition
    where the move lowers the total excess most among those with the best gain; when no
    single move helps, it exchanges a batch of alike pairs (`_swap`). The excess
    strictly falls with every move and swap, so the search ends; it stops when nothing
    is over its limit, no move or swap lowers the excess, or after `max_rounds`.

    A move may leave its target over a limit in another constraint, by less than it
    relieves its source: the next round takes that one. Label propagation's balance
    moves, which admit only moves that fit every limit, can stop where this search
    still finds a way (the many small limits of a typed, split graph).

    parts: int32[n] the partitions of the n nodes the search may move (updated in
      place); w: float64[n, C] their weights; loads: float64[P, C] every partition's
      loads, these nodes' and any others' (updated in place); limits: float64[C], each
      above 0; counts_of(idx): float64[len(idx), P], the edge weight from each node
      `idx` (indices into `parts`) into each partition, as `parts` stands.

    Cost: a round is linear in the size of p and its edges; rounds number about the
    (partition, constraint) pairs over their limit, since a round moves or swaps as
    many nodes as p needs (or as helps), not one.
    """
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
        counts = counts_of(candidates)
        gain = counts - counts[:, [p]]            # cut edge weight saved per destination
        order = np.lexsort((w[candidates, c], -np.max(np.delete(gain, p, axis=1), axis=1)))
        candidates, gain = candidates[order], gain[order]
        moved, seen = _move_out(parts, loads, w, limits, candidates, gain, p, c)
        moves, scored = moves + moved, scored + seen
        if moved == 0:
            if profiles is None:
                profiles = _profiles(w)
            swapped = _swap(counts_of, parts, loads, w, limits, profiles, candidates, gain,
                            p, c)
            swaps += swapped
            if not swapped:
                stuck.add((int(p), int(c)))
    return RefineStats(rounds, moves, swaps, scored, within(loads, limits))


def within(loads: np.ndarray, limits: np.ndarray) -> bool:
    """Whether every load [P, C] is within its constraint's limit [C]."""
    return bool(_excess(loads, limits).max() <= _EPS)


def over_limits(names, loads: np.ndarray, limits: np.ndarray, most: int = 4) -> str:
    """The loads over their limits, worst first, as a user reads them: "constraint
    'test': partition 2 holds 16, its limit 15.75; ..." (at most `most` of them)."""
    excess = _excess(loads, limits)
    worst = np.argsort(-excess, axis=None, kind="stable")
    said = []
    for p, c in zip(*np.unravel_index(worst[:most], excess.shape)):
        if excess[p, c] <= _EPS:
            break
        said.append(f"constraint {names[c]!r}: partition {p} holds {loads[p, c]:,.6g}, "
                    f"its limit {limits[c]:,.6g}")
    more = int((excess > _EPS).sum()) - len(said)
    return "; ".join(said) + (f"; and {more} more" if more > 0 else "")


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


def _swap(counts_of, parts, loads, w, limits, profiles, candidates, gain, p, c,
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
    mine = table[segments.distinct(profile_of[candidates[top]])]              # [A, C]
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
    in_counts = counts_of(ins)
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
