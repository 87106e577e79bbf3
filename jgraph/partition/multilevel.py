"""Multilevel partitioning in bounded memory: ParHIP's scheme over an adjacency read in
node ranges.

METIS holds the whole graph and every level of its coarsening (some 25-60 bytes an
adjacency entry); this partitioner holds per-node arrays only and reads the adjacency
(`jgraph.partition.adjacency`: in memory, or one file per node range on disk) once per
pass, as ParHIP (Meyerhenke, Sanders, Schulz 2017) does across machines:

1. **Coarsen** by size-constrained label propagation: every node starts in a cluster
   of its own and, pass after pass, joins the cluster most of its edge weight goes to,
   if that cluster stays below a size limit (a fraction of a partition, in nodes and in
   in-edges). Clusters are contracted into a weighted coarse graph, written to disk
   range by range; coarsening repeats until the coarse graph fits `coarse_entries`,
   or until label propagation joins (almost) no node and a level would only pair them.
2. **Initial partition**: METIS (multi-constraint) on the coarse graph, whose node
   weights are the clusters' sums of every balance constraint. If coarsening stops
   with more entries, METIS sees samples of the coarse graph's edges that fit and keep
   every cut's expected weight.
3. **Refine** on the original graph by label propagation under the balance
   constraints: a node moves to the partition most of its neighbours are in when that
   cuts fewer edges and the partition has room in every constraint; then moves out of
   any partition still over a limit, cheapest cut first.

Memory: a few int32/int64 arrays over the nodes (the cluster and partition of each
node, cluster sizes, the balance weights in compact dtypes) plus one range of the
adjacency. Label propagation moves the nodes of a piece of a range at once, against
the partitions and loads as the pieces two batches before left them (`_pipelined`).

Several processes (`jgraph.partition.group.Group`) each hold the rows of their own
node range (the adjacency's `start`..`stop`) and the per-node arrays of those rows;
what every process holds whole is one int32 per node: the level's cluster of each
node while coarsening, the partition of each node while refining. As in ParHIP,
clusters and moves cross the processes' ranges:

- a node may join any cluster. A cluster is owned by the process of the node it
  started from, which holds its size and decides the joins other processes' nodes ask
  for (every process's requests together, best first, while it has room); clusters
  are shared after each pass, and a pass asks only one way along the processes
  (alternating), so no two nodes swap clusters pass after pass. Each process writes
  the coarse graph's entries of its rows into bucket files by the owners' ranges, and
  each owner sorts its clusters' rows (the coarse graph's rows stay with their owner);
- refinement runs in passes: each process moves its own nodes against the other
  processes' partitions as they stood at the pass's start, into whatever room its
  view of the loads leaves (as one process does), then the moves and loads are
  exchanged. Together the processes may put a partition over a limit; balance moves
  after the last pass take it back out, cheapest cut first, and passes that cannot
  overfill (each process within an even share of the room) follow. Shares of the room
  in every pass starve the moves: a partition at its limit takes a node only where
  another leaves, and a process sees only its own nodes leave (a 2^20-node R-MAT at
  4 processes, the budgets in the 100M-edge one's proportion, 3 seeds: 1.01-1.15x
  the cut of one process; filling freely, 0.95-1.05x).

METIS runs on every process's coarsest rows (`_initial`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import scipy.sparse

import jgraph.segments as segments
from jgraph.memory import release_memory
from jgraph.partition import compiled
from jgraph.partition.adjacency import (
    Chained,
    CSRAdjacency,
    DiskAdjacency,
    Rows,
    bucket_of,
    sort_ranges,
    write_buckets,
)
from jgraph.partition.errors import PartitionError
from jgraph.partition.excess import relieve, within
from jgraph.partition.group import Group
from jgraph.partition.metis import part_kway

# Label propagation moves the rows of one piece at once: at most this many adjacency
# entries and rows (a piece's [rows, parts, constraints] feasibility test is the
# largest array).
PIECE_ENTRIES, PIECE_ROWS = 1 << 22, 1 << 17
# Per-node work outside label propagation's passes goes this many nodes at a time (a
# few temporaries of 8 bytes a node each, not of every node).
NODE_BLOCK = 1 << 22
# A process admits the requests to join its clusters this many at a time (some 180
# bytes each while admitted: 4M of them took a process of the 2^26-node R-MAT at 4
# processes from 1.45 to 2.19 GiB).
ADMIT_RUN = 1 << 20
# Label propagation's passes at most, in one process, for a level's clusters; under
# several processes this many times as many: a pass asks only one way along the
# processes and sees their clusters as the pass before left them, so it settles
# slower (facebook at 4 processes: 705 moves in pass 8 where one process made 689 in
# pass 4); each process reads only its share of the adjacency a pass. (Three times
# as many, measured on heco_acm at 4 processes, cut no less.)
CLUSTER_PASSES, PROCESS_PASSES = 4, 2
# Under several processes refinement runs up to PROCESS_REFINE_PASSES times one
# process's passes: a pass sees the other processes' moves only when it ends (each
# reads its share of the adjacency). They stop when a pass moves fewer than
# MOVED_AT_LEAST of the nodes, or the pass before lowered the cut by less than
# SAVED_AT_LEAST of it: the cut each move saves is reckoned on a stale view of the
# other processes' nodes, and neighbours of two processes that swap partitions pass
# after pass each reckon a saving while the cut stays.
PROCESS_REFINE_PASSES, MOVED_AT_LEAST, SAVED_AT_LEAST = 2, 1 / 4000, 1 / 2000
# One process's label propagation (coarsening's and refinement's) skips, after its
# first pass, the nodes that would stay where they are and whose neighbours have not
# moved since they were last visited (`cluster`, `refine`): the same moves, a fraction
# of the rows read. False visits every node every pass (a test's reference).
SKIP_SETTLED = True
# Once a pass has moved more than this fraction of the nodes, the next visits every node
# rather than marking each mover's neighbours (coarsening's first pass moves most).
MARKED_MOVES_AT_MOST = 1 / 8
# A coarse graph is written whole while it has at most this many times the entries
# METIS takes (`coarse_entries`); beyond, a sample of that size.
SAMPLE_MARGIN = 4
# A coarse graph's size is estimated on about this many of the finer graph's entries.
BETWEEN_SAMPLE_ENTRIES = 1 << 26
# How many samples of a coarsest graph too large for METIS it partitions (the best cut
# of the whole graph is kept): on the 2^23-node R-MAT's 8 parts, one sample's cuts
# ranged 0.40-0.49 of the edges over seeds and batchings.
METIS_TRIALS = 3
# Where label propagation leaves a partition over a limit, the excess search holds at
# most this many of a process's nodes (their weights: 8 bytes a node and constraint),
# for at most this many rounds of turns.
RELIEVE_NODES, RELIEVE_ROUNDS = 1 << 21, 4
# Each round of the search on disk reads a process's edges once or twice: at most this
# many rounds a turn (each moves or swaps as many nodes as a partition needs).
RELIEVE_ROUNDS_PER_TURN = 64

# A level whose clusters are pairs alone (label propagation joined fewer than this
# fraction of its nodes: their best clusters are full) halves the nodes but removes few
# entries, two pairs sharing few edges: on the 100M-edge R-MAT, levels 3 to 6 took the
# entries from 57M to 32M (6-14% a level) in 67 of the first cycle's 172 seconds of
# coarsening. So coarsening stops before such a level once the nodes are within
# `coarse_node_limit`, and METIS partitions the level above (samples of it, where it
# has more entries than METIS takes); above the limit pairs go on (a graph of many
# isolated nodes). The cut moves either way with the draw: METIS on samples of the
# 241k-node level took make_rmat.py's graph from 0.424 to 0.395 in the end, and the
# Graph500 draw of `experiments/partition_quality.py` from 0.391 to 0.403, the
# assignment 23% and 38% faster (docs/benchmarks.md).
PAIRS_ONLY = 0.01
# Coarsening that stalls above `coarse_node_limit` is an error only beyond this many
# coarsest nodes (some 80 MB in every process); below, the graph goes to METIS as it is.
STALLED_NODES_ALLOWED = 1 << 20
# The most METIS's edge weights may add up to (it sums them in 32-bit integers).
METIS_WEIGHT_TOTAL = 1 << 30


def balance_limits(totals: np.ndarray, num_parts: int, tolerance: float) -> np.ndarray:
    """float64[C]: the most any partition may hold of each constraint of `totals`.

    (1 + tolerance) x the mean, but never below the smallest achievable maximum of
    unit weights, ceil(mean): 60 nodes of a type cannot split 8 ways better than 8.
    """
    mean = np.asarray(totals, np.float64) / num_parts
    return np.maximum((1.0 + tolerance) * mean, np.ceil(mean - 1e-9))


class Clusters(NamedTuple):
    """A level's clusters (`cluster`'s): label: every node's cluster, 0..k-1; k;
    owners int64[N + 1]: process r owns the clusters [owners[r], owners[r + 1])."""

    label: np.ndarray
    k: int
    owners: np.ndarray


@dataclasses.dataclass(frozen=True)
class NodeWeights:
    """The balance constraints' per-node weights, one compact column each.

    names: C constraint names (`nodes` or `nodes:<type>`, `train`, `val`, `test`,
    `edges`); columns: C arrays [n] (uint8 for membership, int32/int64 for counts).
    At 5 constraints that is about 8 bytes a node, where a float64 [n, C] would be 40.
    """

    names: tuple[str, ...]
    columns: tuple[np.ndarray, ...]

    @property
    def num_nodes(self) -> int:
        return self.columns[0].size

    def take(self, ids: np.ndarray) -> np.ndarray:
        """float64[len(ids), C]."""
        return np.stack([c[ids] for c in self.columns], axis=1).astype(np.float64)

    def loads(self, parts: np.ndarray, num_parts: int) -> np.ndarray:
        """float64[P, C]: each partition's total of each constraint."""
        return np.stack([np.bincount(parts, weights=c, minlength=num_parts)
                         for c in self.columns], axis=1)

    def totals(self) -> np.ndarray:
        return np.array([c.sum(dtype=np.float64) for c in self.columns])

    def limits(self, num_parts: int, tolerance: float) -> np.ndarray:
        """float64[C]: the most a partition may hold of each (`balance_limits`)."""
        return balance_limits(self.totals(), num_parts, tolerance)

    def coarsen(self, cluster: np.ndarray, num_clusters: int) -> NodeWeights:
        """The clusters' weights: sums over their members."""
        return NodeWeights(self.names, tuple(
            np.bincount(cluster, weights=c, minlength=num_clusters).astype(np.int64)
            for c in self.columns))

    def size_columns(self) -> list[int]:
        """The columns a cluster's size is measured in: node counts and edges."""
        return [i for i, name in enumerate(self.names)
                if name == "edges" or name == "nodes" or name.startswith("nodes:")]


def _noise(ids: np.ndarray, other: np.ndarray, salt: int) -> np.ndarray:
    """float64 in [0, 1): a hash of (id, other, salt), to break ties without bias."""
    h = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
         ^ (other.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFF)) * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _pieces(adjacency, cells_per_row: int = 1) -> Iterator[Rows]:
    """The adjacency in pieces; `cells_per_row`: the width of the widest per-row array a
    piece builds (refinement's [rows, parts, constraints] test), which bounds its rows
    so that array stays within PIECE_ENTRIES cells whatever the part count."""
    max_rows = max(1, min(PIECE_ROWS, PIECE_ENTRIES // max(cells_per_row, 1)))
    for rows in adjacency.ranges():
        yield from rows.split(PIECE_ENTRIES, max_rows)


def _admit(target: np.ndarray, key: np.ndarray, amounts: np.ndarray,
           room: np.ndarray) -> np.ndarray:
    """bool[m]: which of m requests to admit, best `key` first within each target, while
    the running sum of `amounts` [m, C] for that target stays within `room` [m, C] (each
    request's target's room; requests to one target carry the same)."""
    if not target.size:
        return np.zeros(0, bool)
    order = np.lexsort((-key, target))
    t, a = target[order], amounts[order]
    cum = np.cumsum(a, axis=0)
    first = np.searchsorted(t, t, side="left")
    before = np.where(first[:, None] > 0, cum[np.maximum(first - 1, 0)], 0.0)
    within = ((cum - before) <= room[order] + 1e-9).all(axis=1)
    out = np.zeros(target.size, bool)
    out[order] = within
    return out


class _Visits:
    """Which of the nodes [lo, hi) one process's label-propagation pass visits (`now`:
    bool over them, or None for every one) and which the next pass will: the nodes
    that would move (found no room, or lost to a better request) and the movers and
    their neighbours, marked for the pieces after them as well, which would see the
    move. A node neither marks would stay where it is, as when last visited: skipping
    it changes no move. Once a pass has moved more than MARKED_MOVES_AT_MOST of the
    nodes, the next visits every one instead."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.now: np.ndarray | None = None                  # the first pass: every node
        self.next: np.ndarray | None = np.zeros(hi - lo, bool)
        self.spare: np.ndarray | None = None
        self.moved = 0

    def of(self, piece: Rows) -> np.ndarray | None:
        """The piece's rows this pass visits (bool), or None for every one."""
        if self.now is None:
            return None
        a = piece.start - self.lo
        return self.now[a:a + piece.num_rows]

    def keen(self, nodes: np.ndarray) -> None:
        """`nodes` (ids) would move: the next pass visits them."""
        if self.next is not None:
            self.next[nodes - self.lo] = True

    def moved_rows(self, piece: Rows, rows: np.ndarray) -> None:
        """The nodes of `rows` (local to the piece) moved: they and their neighbours
        are visited by the pieces after this one and by the next pass."""
        self.moved += rows.size
        if self.next is not None and self.moved > MARKED_MOVES_AT_MOST * (self.hi - self.lo):
            self.spare, self.next = self.next, None          # the next pass: every node
        for marks in (self.now, self.next):
            if marks is not None:
                compiled.wake(piece, rows, self.lo, self.hi, marks)

    def turn(self) -> None:
        """The next pass begins."""
        spare = self.now if self.now is not None else self.spare
        self.now, self.spare, self.moved = self.next, None, 0
        self.next = spare if spare is not None else np.zeros(self.hi - self.lo, bool)
        self.next[:] = False


# -- coarsening ---------------------------------------------------------------------------


def cluster(adjacency, weights: NodeWeights, limit: np.ndarray, *, passes: int | None = None,
            seed: int = 0, parts: np.ndarray | None = None,
            on_pass: Callable[[int, int], None] | None = None,
            group: Group | None = None) -> Clusters:
    """Size-constrained label propagation, each process over its rows [start, stop) of
    `adjacency` (`weights` are theirs): the `Clusters`. Clusters are numbered 0..k-1
    in the order of the node ids they started from, so each process owns those that
    started from its nodes (the coarse graph's rows it writes). `limit`
    [len(size_columns)]: the most a cluster may hold; with `parts` (every node's), a
    node joins only clusters of its own partition.

    A node may join any cluster, its own process's or another's (ParHIP's rule).
    Every process holds every node's cluster as it stood when the pass began (shared
    after each pass) and the sizes of the clusters it owns. Joins of its own clusters
    are decided as the pass goes; a node whose best cluster another process owns asks
    that owner, which admits the requests of every process together, best first,
    while the cluster stays within `limit`, and learns of its members that left for
    another cluster with the next requests (sizes it holds are never below the true
    ones, so no cluster passes the limit). `passes`: at most CLUSTER_PASSES for one
    process, PROCESS_PASSES times that for several."""
    group = group or Group.single()
    passes = passes or CLUSTER_PASSES * (1 if group.size == 1 else PROCESS_PASSES)
    lo, hi, n = adjacency.start, adjacency.stop, adjacency.num_nodes
    bounds = _node_bounds(adjacency, group)
    columns = [weights.columns[c] for c in weights.size_columns()]
    size_of = lambda v: np.stack([c[v] for c in columns], axis=1).astype(np.int64)
    # Cluster sizes never pass the limit by more than one node's weight: int32 where
    # that fits (4 bytes a node and size column instead of 8).
    most = max(int(c.max()) if c.size else 0 for c in columns) + float(np.max(limit))
    most = group.gather(most, "largest size")
    size = np.stack(columns, axis=1).astype(np.int32 if max(most) < 2**31 - 1 else np.int64)
    label = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)   # cluster = a node id
    left = _Departures()
    # Each node's best cluster when it last asked for one (-1: never), full or not.
    favourite = np.full(hi - lo, -1, label.dtype)

    def askable(p: int):
        """Which other processes' clusters this process's nodes may ask to join in pass
        p: those of later processes in even passes, of earlier ones in odd passes. Two
        nodes of two processes, each the other's best, would otherwise swap clusters
        pass after pass (synchronous label propagation's oscillation); so no cycle of
        joins across processes forms within a pass."""
        return lambda t: (bucket_of(bounds, t) > group.rank) == (p % 2 == 0)
    # One process visits, after the first pass, only the nodes whose best cluster may
    # be another now: those whose best was another (full, or joined) and the joiners'
    # neighbours (as `refine` does; the same joins).
    visits = _Visits(lo, hi) if SKIP_SETTLED and group.size == 1 else None
    for p in range(passes):
        if p and group.size > 1:
            group.share(label, bounds, "labels")        # as the pass before left them
        if p and visits is not None:
            visits.turn()
        salt = seed * 1009 + p
        requests: list = []
        moved = _pipelined(
            _pieces(adjacency),
            lambda piece, _, salt=salt: (piece, _cluster_proposal(
                piece, label, salt, parts, None if visits is None else visits.of(piece))),
            lambda proposed, requests=requests, ask=askable(p): _join_clusters(
                proposed[1], label, lo, hi, size, size_of, limit, requests, left, ask,
                favourite, proposed[0], visits))
        if group.size > 1:
            moved += _join_remote(requests, left, label, lo, hi, size, limit, bounds, group)
        moved = int(group.sum(moved, "cluster moves"))
        if on_pass is not None:
            on_pass(p, moved)
        if moved < max(1, n // 200):
            break
    visits = None
    if group.size > 1:                       # the sizes told every departure first
        _join_remote([], left, label, lo, hi, size, limit, bounds, group)
    merged = _gather_singletons(adjacency, label, size, size_of, favourite, parts, bounds,
                                group)
    merged = int(group.sum(merged, "nodes alone gathered"))     # every process calls it
    if on_pass is not None:
        on_pass(-1, merged)
    if group.size > 1:
        group.share(label, bounds, "labels")
    size = left = favourite = None                       # freed before numbering
    k, owners = _number_clusters(label, bounds)
    return Clusters(label, k, owners.astype(np.int64))


class _Departures:
    """The weights that this process's nodes took out of clusters other processes own,
    not yet told to them: (cluster ids, amounts [m, S]) in blocks."""

    def __init__(self):
        self.blocks: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, clusters: np.ndarray, amounts: np.ndarray) -> None:
        if clusters.size:
            self.blocks.append((clusters, amounts))

    def take(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        blocks, self.blocks = self.blocks, []
        if not blocks:
            return np.zeros(0, np.int64), np.zeros((0, width), np.int64)
        return (np.concatenate([b[0] for b in blocks]).astype(np.int64),
                np.concatenate([b[1] for b in blocks]).astype(np.int64))


def _cluster_proposal(piece: Rows, label, salt: int, parts=None, visit=None):
    """Each node's best cluster by edge weight (its own wins ties; other ties fall by
    hash; with `parts`, among the clusters of its partition), for the nodes whose best
    is another (among those `visit`, bool over the piece's rows, marks; every one
    without it): (nodes, clusters, weights) or None. `label`, `parts`: every node's. A
    cluster's id is one of its nodes', so its partition is that node's."""
    rows = np.arange(piece.num_rows) if visit is None else np.flatnonzero(visit)
    m = rows.size
    if not m:
        return None
    nodes = piece.start + rows
    if compiled.enabled():
        target, best = compiled.cluster_rows(piece, label, salt, parts, rows)
        movers = np.flatnonzero(target >= 0)
        return (nodes[movers], target[movers], best[movers]) if movers.size else None
    at = slice(None) if visit is None else piece.entries_of(rows)
    counts = scipy.sparse.csr_matrix(
        (piece.entry_weights()[at].astype(np.float64),
         (segments.segment_ids(np.diff(piece.indptr)[rows]), label[piece.indices[at]])),
        shape=(m, label.size))
    counts.sum_duplicates()
    if not counts.nnz:
        return None
    rows_len = np.diff(counts.indptr)
    row = segments.segment_ids(rows_len)
    cand = counts.indices.astype(np.int64)
    own = label[nodes]
    score = (counts.data + 0.5 * (cand == own[row])
             + 0.49 * _noise(nodes[row], cand, salt))
    if parts is not None:
        score = np.where(parts[cand] == parts[nodes[row]], score, -np.inf)
    full = np.flatnonzero(rows_len)
    starts = counts.indptr[full]
    best = np.maximum.reduceat(score, starts)
    pos = np.minimum.reduceat(np.where(score == np.repeat(best, rows_len[full]),
                                       np.arange(score.size), score.size), starts)
    target = cand[np.minimum(pos, cand.size - 1)]
    movers = np.flatnonzero((target != own[full]) & np.isfinite(best))
    return nodes[full[movers]], target[movers], best[movers]


def _join_clusters(proposal, label, lo: int, hi: int, size, size_of, limit, requests: list,
                   left: _Departures, askable, favourite, piece: Rows | None = None,
                   visits: _Visits | None = None):
    """Move the proposed nodes whose best cluster, one this process owns ([lo, hi)),
    has room (ParHIP's rule: only the best is tried; a node whose best cluster is full
    stays this pass); the proposals for other processes' clusters go to `requests`
    where `askable(clusters)` allows (the others stay this pass).
    `size` [hi - lo, S]: the sizes of this process's clusters (updated at once);
    `size_of(v)` int64[len(v), S]: its nodes' own (local indices); `left`: what the
    movers take out of other processes' clusters; `favourite`: each node's best cluster
    as proposed (kept for `_gather_singletons`); `visits`: told of the nodes that
    asked and, with the commit, of those that moved (`piece`: the rows proposed
    from). Returns (the moves, the commit that writes their labels: `_pipelined`)."""
    if proposal is None or not proposal[0].size:
        return 0, None
    v, t, key = proposal
    favourite[v - lo] = t
    if visits is not None:
        visits.keen(v)
    keep = label[v] != t                     # a node another piece moved meanwhile
    v, t, key = v[keep], t[keep], key[keep]
    amounts = size_of(v - lo)
    mine = (t >= lo) & (t < hi)
    if not mine.all():
        ask = ~mine & askable(t)
        # in the labels' and sizes' dtypes: a pass may ask for most of a process's nodes
        requests.append((v[ask].astype(label.dtype), t[ask].astype(label.dtype), key[ask],
                         amounts[ask].astype(size.dtype)))
        v, t, key, amounts = v[mine], t[mine], key[mine], amounts[mine]
    keep = ((size[t - lo] + amounts) <= limit).all(axis=1)
    v, t, key, amounts = v[keep], t[keep], key[keep], amounts[keep]
    # Room of each request's cluster only: never a whole [clusters] array per piece.
    admit = _admit(t, key, amounts.astype(np.float64),
                   (limit - size[t - lo]).astype(np.float64))
    v, t, amounts = v[admit], t[admit], amounts[admit]
    _leave(label[v], amounts, lo, hi, size, left)
    np.add.at(size, t - lo, amounts.astype(size.dtype))

    def commit():
        label[v] = t
        if visits is not None:
            visits.moved_rows(piece, v - piece.start)
    return int(v.size), commit


def _gather_singletons(adjacency, label, size, size_of, favourite, parts,
                       bounds: np.ndarray, group: Group) -> int:
    """KaMinPar's two-hop clustering: the nodes label propagation left alone in a
    cluster of their own (their best cluster was full, or they have no neighbours) are
    paired, in id order, with the others alone that share their best cluster (or, for
    nodes without neighbours, with each other; with `parts`, within a partition). The
    leaves of a hub whose cluster is full, and a power-law graph's isolated nodes,
    would otherwise stay singletons level after level and coarsening would stall (a
    Graph500 R-MAT's 38% of isolated nodes); pairs halve them at each level and keep
    coarse nodes fine enough to balance (runs up to the size limit cut a
    heterogeneous graph's partitions worse). A pair may pass `limit` by one node's
    size, as a cluster may. Under several processes the owner of the
    best cluster gathers every process's nodes that share it (nodes without neighbours
    stay with their process). Returns the nodes that joined another's cluster."""
    lo, hi = adjacency.start, adjacency.stop
    isolated = np.concatenate([np.diff(rows.indptr) == 0 for rows in adjacency.ranges()]
                              or [np.zeros(0, bool)])
    # A block of nodes at a time: the comparisons hold a few int64 a node and size column
    # (on 2^26 nodes, whole, they were the assignment's peak: 4.69 GiB against 2.2).
    found = []
    for i in range(0, hi - lo, NODE_BLOCK):
        local = np.arange(i, min(i + NODE_BLOCK, hi - lo))
        alone = (label[lo + local] == lo + local) & (size[local] == size_of(local)).all(axis=1)
        key = np.where(isolated[local], -2, favourite[local]).astype(np.int64)
        pick = alone & (key != -1)
        found.append((local[pick], key[pick]))
    del isolated
    chosen = np.concatenate([c for c, _ in found] or [np.zeros(0, np.int64)])
    key = np.concatenate([k for _, k in found] or [np.zeros(0, np.int64)])
    del found
    part = np.zeros(chosen.size, np.int64) if parts is None else parts[lo + chosen]
    owner = np.where(key >= 0, bucket_of(bounds, key), group.rank)
    incoming = group.exchange(
        [{"node": lo + chosen[owner == r], "key": key[owner == r], "part": part[owner == r]}
         for r in range(group.size)],
        "nodes alone")
    cat = lambda name: np.concatenate([got[name] for got in incoming])
    nodes, keys, parts_in = cat("node"), cat("key"), cat("part")
    first = nodes.copy()
    if nodes.size > 1:
        order = np.lexsort((nodes, parts_in, keys))          # by group, then id
        members, keys, parts_in = nodes[order], keys[order], parts_in[order]
        new_group = np.ones(members.size, bool)
        new_group[1:] = (keys[1:] != keys[:-1]) | (parts_in[1:] != parts_in[:-1])
        starts = np.flatnonzero(new_group)
        # Pairs in each group, in id order: the second of a pair joins the first.
        index = segments.segment_positions(np.diff(np.append(starts, members.size)))
        second = np.flatnonzero(index % 2 == 1)
        paired = members.copy()
        paired[second] = members[second - 1]
        first[order] = paired
    sent = np.cumsum([got["node"].size for got in incoming])[:-1]
    answers = group.exchange([{"first": f} for f in np.split(first, sent)], "nodes gathered")
    merged = 0
    for r, got in enumerate(answers):
        mine = chosen[owner == r]
        label[lo + mine] = got["first"]
        merged += int((got["first"] != lo + mine).sum())
    return merged


def _row_entries(adjacency) -> np.ndarray:
    """int64[stop - start]: the entries of each of the adjacency's rows."""
    return np.concatenate([np.diff(rows.indptr) for rows in adjacency.ranges()]
                          or [np.zeros(0, np.int64)])


def _leave(clusters: np.ndarray, amounts: np.ndarray, lo: int, hi: int, size,
           left: _Departures) -> None:
    """Take `amounts` out of `clusters`: at once for this process's own ([lo, hi)), in
    `left` for the others'."""
    mine = (clusters >= lo) & (clusters < hi)
    np.subtract.at(size, clusters[mine] - lo, amounts[mine].astype(size.dtype))
    left.add(clusters[~mine], amounts[~mine])


def _join_remote(requests: list, left: _Departures, label, lo: int, hi: int, size, limit,
                 bounds: np.ndarray, group: Group) -> int:
    """The pass's requests to join other processes' clusters, decided by their owners
    (every process's requests for a cluster together, best first, while it has room,
    after the departures each process tells of), and their labels written (in this
    process's rows of `label`; `Group.share` tells the others). Returns the requests
    admitted to this process's nodes."""
    width = size.shape[1]
    if requests:
        v, t, key, amounts = (np.concatenate([r[i] for r in requests]) for i in range(4))
        requests.clear()                        # the pass's blocks: held once, here
    else:
        v, t = np.zeros(0, label.dtype), np.zeros(0, label.dtype)
        key, amounts = np.zeros(0), np.zeros((0, width), size.dtype)
    gone, gone_amounts = left.take(width)
    order, cuts = segments.group_by(bucket_of(bounds, t), group.size)
    gone_order, gone_cuts = segments.group_by(bucket_of(bounds, gone), group.size)

    def asking(r: int) -> dict[str, np.ndarray]:      # made for one owner at a time
        mine, left_r = order[cuts[r]:cuts[r + 1]], gone_order[gone_cuts[r]:gone_cuts[r + 1]]
        return {"t": t[mine], "key": key[mine], "amounts": amounts[mine],
                "gone": gone[left_r], "gone_amounts": gone_amounts[left_r]}
    incoming = group.exchange(asking, "join requests")
    key = gone = gone_amounts = gone_order = None        # sent
    for got in incoming:
        np.subtract.at(size, got["gone"] - lo, got["gone_amounts"].astype(size.dtype))
    asked = [got["t"].size for got in incoming]
    cat = lambda name: np.concatenate([got.pop(name) for got in incoming])
    t_in, key_in, amounts_in = cat("t"), cat("key"), cat("amounts")
    incoming = None
    admit = _admit_requests(t_in, key_in, amounts_in, lo, size, limit)
    del t_in, key_in, amounts_in
    answers = np.split(admit, np.cumsum(asked)[:-1])
    replies = group.exchange([{"admitted": a} for a in answers], "join answers")
    admitted = np.zeros(t.size, bool)
    for r, got in enumerate(replies):
        admitted[order[cuts[r]:cuts[r + 1]]] = got["admitted"]
    v, t, amounts = v[admitted], t[admitted], amounts[admitted]
    _leave(label[v], amounts, lo, hi, size, left)
    label[v] = t
    return int(v.size)


def _admit_requests(target: np.ndarray, key: np.ndarray, amounts: np.ndarray, lo: int,
                    size: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """bool[m]: which requests to join this process's clusters (`target`, from `lo`;
    `size` their sizes, updated for those admitted) to admit: best `key` first within
    each cluster, while it stays within `limit`. The requests are taken in runs of
    whole clusters of some ADMIT_RUN requests, so what the admission holds beyond
    them is a run's."""
    admit = np.zeros(target.size, bool)
    order = np.argsort(target, kind="stable")
    ordered = target[order]
    start = 0
    while start < order.size:
        # up to the end of the cluster at NODE_BLOCK requests on
        stop = int(np.searchsorted(ordered, ordered[min(start + ADMIT_RUN, order.size) - 1],
                                   side="right"))
        run = order[start:stop]
        t, a = target[run].astype(np.int64) - lo, amounts[run].astype(np.int64)
        fits = ((size[t] + a) <= limit).all(axis=1)
        chosen = np.flatnonzero(fits)
        fits[chosen] = _admit(t[chosen], key[run[chosen]], a[chosen].astype(np.float64),
                              (limit - size[t[chosen]]).astype(np.float64))
        np.add.at(size, t[fits], a[fits].astype(size.dtype))
        admit[run] = fits
        start = stop
    return admit


# Bits set in each byte value: how many clusters a byte of the presence bitmap holds.
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def _number_clusters(label: np.ndarray, at) -> tuple[int, np.ndarray]:
    """Renumber `label` (cluster ids that are node ids) in place to 0..k-1 in the order
    of the ids: (k, the new number of the first cluster at or after each id of `at`).
    A bitmap of the ids present and a running count per byte of it (n / 8 + n / 2
    bytes, where a lookup table of every id would take 4n)."""
    present = np.zeros(label.size, bool)
    present[label] = True
    bits = np.append(np.packbits(present, bitorder="little"), np.uint8(0))
    del present
    before = segments.offsets(_POPCOUNT[bits],
                              dtype=np.int32 if label.size < 2**31 else np.int64)

    def number(ids):
        byte = ids >> 3
        return before[byte] + _POPCOUNT[bits[byte] & ((1 << (ids & 7)) - 1).astype(np.uint8)]
    ranks = number(np.asarray(at, np.int64))
    step = NODE_BLOCK
    for i in range(0, label.size, step):
        label[i:i + step] = number(label[i:i + step])
    return int(before[-1]), ranks


def _pipelined(pieces, propose, decide, total=0, snapshot=lambda: None,
               workers: int = 2):
    """sum(decide(propose(piece))) over the pieces in order, `workers` pieces at a
    time, the proposals computed in threads (the kernels and numpy's large operations
    release the GIL).

    A batch's proposals are computed while the batch before is decided in this thread:
    `decide(proposal)` returns (its result, a commit: the writes the proposals read, or
    None), and the commits are made once the next batch's proposals are done. So every
    batch's proposals see exactly the state the batches two before it left (and
    `propose(piece, snapshot())`, a copy taken as the batch starts, of what `decide`
    updates at once), whatever the timing: the result is deterministic. Each decision
    is checked again against the state as it stands. `total`: the sum's start (a
    number, or an array when `decide` returns arrays)."""
    def settle(total, proposals):
        """(total plus the proposals' results, in order; their commits)."""
        commits = []
        for proposal in proposals:
            result, commit = decide(proposal)
            total = total + result
            commits.append(commit)
        return total, commits

    def apply(commits):
        for commit in commits:
            if commit is not None:
                commit()

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        waiting = []                         # the batch proposed, not yet decided
        pieces = iter(pieces)
        while batch := list(itertools.islice(pieces, workers)):
            state = snapshot()
            futures = [pool.submit(propose, piece, state) for piece in batch]
            total, commits = settle(total, waiting)        # meanwhile
            waiting = [future.result() for future in futures]
            apply(commits)
        total, commits = settle(total, waiting)
        apply(commits)
    return total


def contract(adjacency, label: np.ndarray, num_clusters: int, root: str | None,
             entries_per_range: int = 1 << 25, keep: float = 1.0, seed: int = 0,
             owners: np.ndarray | None = None, group: Group | None = None,
             on_written: Callable[[], None] | None = None):
    """The coarse graph of the clusters: an edge between two clusters weighs the sum of
    the edges between their members; none inside a cluster. On disk in `root` (one
    CSR per range of clusters), or in memory without `root`. keep < 1: each edge
    between clusters is kept with that probability and weighs w / keep (decided by a
    hash of its ends, the same both ways), so the coarse graph's cut weights are
    unbiased and its size about `keep` times the full one's.

    `label`: every node's cluster; `owners` int64[N + 1]: the clusters each process owns
    (`cluster`'s), whose coarse rows it writes (`group`: every process writes the
    entries of its rows of `adjacency` into bucket files by the owners' ranges, then
    each sorts its own; `root` is one folder every process sees). `on_written()` is
    called once every bucket file is written, before any is sorted: when the level
    holds the most disk."""
    group = group or Group.single()
    lo, hi = adjacency.start, adjacency.stop
    owners = np.array([0, num_clusters], np.int64) if owners is None else owners
    c_lo = int(owners[group.rank])

    def between(rows: Rows):
        """A piece's entries between clusters, as (rows, cols, weights) of clusters."""
        if compiled.enabled():               # the kernel releases the GIL
            return compiled.between_rows(rows, label, keep, seed)
        u = rows.node_rows()
        a, b = label[u], label[rows.indices]
        across = np.flatnonzero(a != b)
        w = rows.entry_weights()[across]
        if keep < 1:
            x, y = u[across], rows.indices[across].astype(np.int64)
            sampled = _noise(np.minimum(x, y), np.maximum(x, y), seed) < keep
            across, w = across[sampled], np.maximum(np.rint(w[sampled] / keep), 1)
        return a[across], b[across], w.astype(np.int64)
    if root is None:
        blocks = [between(rows) for rows in _pieces(adjacency)]
        cat = lambda i: np.concatenate([blk[i] for blk in blocks])
        csr = scipy.sparse.csr_matrix((cat(2), (cat(0), cat(1))),
                                      shape=(num_clusters, num_clusters))
        csr.sum_duplicates()
        return CSRAdjacency(csr, entries_per_range)
    # Each cluster's entries (at most: before repeats merge), summed at its owner.
    degree = group.add_at_owners(label[lo:hi], _row_entries(adjacency), owners,
                                 "coarse degrees")[:, 0].astype(np.int64)
    own_bounds = c_lo + segments.range_bounds(degree, entries_per_range)
    if own_bounds.size == 1:
        # No clusters here (every node joined other processes'): one empty range, so
        # that each process's rows have a file number of their own.
        own_bounds = np.array([c_lo, c_lo], np.int64)
    del degree
    every = group.gather(own_bounds, "coarse ranges")
    firsts = segments.offsets([b.size - 1 for b in every])
    bounds = np.concatenate([every[0]] + [b[1:] for b in every[1:]])
    # A piece at a time, contracted in the threads that group it (bounded temporaries).
    write_buckets(root, num_clusters, bounds, _pieces(adjacency), merge=True,
                  writer=group.rank, entries=between)
    group.barrier("coarse buckets written")
    if on_written is not None:                  # while no process removes a bucket
        on_written()
        group.barrier("coarse buckets measured")
    return sort_ranges(root, num_clusters, own_bounds, merge=True, writers=group.size,
                       first=int(firsts[group.rank]))


def _entries_between(adjacency, label: np.ndarray, group: Group) -> int:
    """About how many adjacency entries (of every process's rows) have their ends in
    different clusters (`label`: every node's): a coarse graph's size before repeated
    pairs merge, to choose how much of it to keep. Counted on an evenly spread sample
    of the pieces (some 2^26 entries in all; every piece of a graph smaller than
    that), so it costs a small part of a pass over the adjacency."""
    total = int(group.sum(adjacency.num_entries, "entries"))
    stride = max(1, total // BETWEEN_SAMPLE_ENTRIES)
    counted = np.zeros(2, np.int64)                       # (between, visited)
    for i, rows in enumerate(_pieces(adjacency)):
        if i % stride == 0:
            counted += (int((label[rows.node_rows()] != label[rows.indices]).sum()),
                        rows.indices.size)
    between, visited = group.sum(counted, "between")
    return int(round(between / max(visited, 1) * total))      # exact when every piece is


def _sampled(adjacency, max_entries: int, seed: int) -> scipy.sparse.csr_matrix:
    """The adjacency in memory; when it has more than `max_entries` entries, a sample of
    about that many that keeps every cut's expected weight: entry (u, v) of weight w is
    kept with probability p = min(1, w * s) and then weighs w / p (importance sampling,
    as in spectral sparsifiers), decided by a hash of the unordered pair so the sample
    stays symmetric; s is set so that the expected entries kept are `max_entries`."""
    if adjacency.num_entries <= max_entries:
        csr = adjacency.to_csr()
        if isinstance(adjacency, CSRAdjacency):
            csr = csr.copy()                          # never the caller's matrix
    else:
        top = 1 << 16
        hist = np.zeros(top, np.int64)
        for rows in _pieces(adjacency):
            hist += np.bincount(np.minimum(rows.entry_weights(), top - 1), minlength=top)
        weight = np.arange(top, dtype=np.float64)
        lo, hi = 0.0, 1.0
        for _ in range(60):                  # expected kept entries rise with s
            s = (lo + hi) / 2
            if (hist * np.minimum(1.0, weight * s)).sum() > max_entries:
                hi = s
            else:
                lo = s
        # Each range's kept rows as a CSR of its own (compact ids and weights), then
        # stacked: no whole-graph coordinate lists.
        pieces = []
        n = adjacency.num_nodes
        for rows in _pieces(adjacency):
            u = rows.node_rows()
            v = rows.indices.astype(np.int64)
            w = rows.entry_weights().astype(np.float64)
            p = np.minimum(1.0, w * lo)
            keep = np.flatnonzero(_noise(np.minimum(u, v), np.maximum(u, v), seed) < p)
            del u
            weights = np.maximum(np.rint(w[keep] / p[keep]), 1).astype(np.float32)
            local = rows.local_rows()[keep]
            pieces.append(scipy.sparse.csr_matrix(
                (weights, (local, v[keep].astype(np.int32 if n < 2**31 else np.int64))),
                shape=(rows.num_rows, n)))
            del v, w, p, keep, weights, local
        csr = scipy.sparse.vstack(pieces, format="csr") if pieces else \
            scipy.sparse.csr_matrix((n, n))
        del pieces
    csr.sum_duplicates()                 # METIS takes a simple graph: repeats add up
    # METIS sums edge weights in 32-bit integers (cuts, degrees): scale them so that
    # their total stays below 2^30, keeping every edge at least 1.
    total = float(csr.data.sum()) if csr.nnz else 0.0
    if total > METIS_WEIGHT_TOTAL:
        csr.data = np.maximum(np.rint(csr.data * (METIS_WEIGHT_TOTAL / total)), 1)
    # In the 32-bit arrays METIS takes (the total is below 2^30, ids below 2^31 and the
    # entries within METIS's limit), so that it is handed these arrays without copies.
    csr = csr.tocsr()
    if csr.shape[0] < 2**31 and csr.nnz < 2**31:
        return scipy.sparse.csr_matrix(
            (csr.data.astype(np.int32), csr.indices.astype(np.int32, copy=False),
             csr.indptr.astype(np.int32, copy=False)), shape=csr.shape, copy=False)
    csr.data = csr.data.astype(np.int64)
    return csr


# -- refinement ---------------------------------------------------------------------------


def refine(adjacency, parts: np.ndarray, weights: NodeWeights, num_parts: int,
           tolerance: float, *, passes: int = 6, seed: int = 0,
           on_pass: Callable[..., None] | None = None,
           group: Group | None = None) -> np.ndarray:
    """Label propagation under the balance constraints, then moves out of partitions
    over a limit. `parts` (int32, every node's) is updated for the rows [start, stop)
    of `adjacency` (`weights` are theirs) and, with several processes, exchanged after
    every pass so each holds every node's again. Refinement stops after `passes`, or
    sooner when a pass moves fewer than one node in 1,000 (several processes: up to
    PROCESS_REFINE_PASSES times as many, see there). Balance moves follow while a
    partition is over a limit; where they stop over one (each admits only a move that
    fits every limit), the excess search takes over (`_relieve`). Under several
    processes, where either ran (the passes overfilled a partition, or it started
    over), up to `passes` more follow that cannot overfill ("polish": each process
    within an even share of every partition's room). `on_pass(kind, pass, moves,
    saved, cut, visited)` hears of each pass (the cut weight it started from and
    saved, None for the excess search's; the cut also None where the pass skipped
    nodes, and `visited` how many it did not skip, else None). Returns `parts`."""
    group = group or Group.single()
    lo, hi = adjacency.start, adjacency.stop
    limits = balance_limits(group.sum(weights.totals(), "totals"), num_parts, tolerance)
    loads = group.sum(weights.loads(parts[lo:hi], num_parts), "loads")
    bounds = _node_bounds(adjacency, group)

    # One process visits, after a pass, only the nodes it may move now: those that
    # would gain by a move (but found no room, or did not move) and the neighbours of
    # the nodes that moved. Any other node gains by no move, as when last visited (no
    # neighbour has moved since): skipping it changes no move, only the cut the pass
    # counts, which misses the skipped rows' share. Several processes see each other's
    # moves only in the shared partitions, so they visit every node every pass.
    skipping = SKIP_SETTLED and group.size == 1
    visits: _Visits | None = None

    def run(salt: int, balance: bool, turn: int | None = None, share_room: bool = False
            ) -> tuple[int, float, float | None, int]:
        """One pass: (moves, cut weight saved, cut weight before it (None where only
        one process's nodes moved, or where some were not visited), the nodes visited
        where some were not, else None). Updates `loads` in place."""
        own_limits = limits
        if group.size == 1:
            own_loads = loads                               # moved in place
        else:
            # Each process fills whatever room it sees: the processes together may put
            # a partition over a limit, which the balance moves after the last pass
            # repair (a balance turn: one process, with all the excess); or, sharing
            # the room, each within an even share of it.
            own_loads = loads.copy()
            if share_room:
                own_limits = loads + np.maximum(limits - loads, 0.0) / group.size
        pieces = _pieces(adjacency, num_parts * len(weights.columns)) \
            if turn in (None, group.rank) else iter(())
        told = None if balance else visits
        done = _pipelined(
            pieces,
            lambda piece, loads_then: _move_proposal(
                piece, parts, lo, weights, loads_then, limits, num_parts, salt, balance,
                None if told is None else told.of(piece)),
            lambda proposal: _move(proposal, parts, own_loads, own_limits, balance, told),
            np.zeros(4), snapshot=own_loads.copy)
        visited = int(done[3])
        if group.size > 1:
            loads[:] += group.sum(own_loads - loads, "load changes")
            group.share(parts, bounds, "parts")
            done = group.sum(done, "moves")
        every = visited == hi - lo
        # Every cut edge is seen from both ends.
        cut = float(done[2]) / 2 if (turn is None or group.size == 1) and every else None
        return int(done[0]), float(done[1]), cut, None if every else visited

    def label_passes(kind: str, count: int, salt: int, share_room: bool = False) -> None:
        """Refinement passes until they settle: under several processes, until one
        moves fewer than MOVED_AT_LEAST of the nodes or the pass before lowered the cut
        by less than SAVED_AT_LEAST of it."""
        nonlocal visits
        visits = _Visits(lo, hi) if skipping else None
        before = None                            # the cut the pass before started from
        for p in range(count):
            if p and visits is not None:
                visits.turn()
            moved, saved, cut, visited = run(salt + p, balance=False, share_room=share_room)
            if on_pass is not None:
                on_pass(kind, p, moved, saved, cut, visited)
            if group.size == 1:
                if moved < max(1, parts.size // 1000):
                    break
            elif moved < max(1, parts.size * MOVED_AT_LEAST) or (
                    before is not None and before - cut < cut * SAVED_AT_LEAST):
                break
            before = cut
        visits = None

    label_passes("refine", passes * (PROCESS_REFINE_PASSES if group.size > 1 else 1),
                 seed * 7919)
    repaired = not (loads <= limits + 1e-9).all()
    idle = 0                     # passes in a row that moved nothing
    for p in range(4 * passes * group.size):
        if (loads <= limits + 1e-9).all():
            break
        moved, saved, cut, visited = run(seed * 7919 + 100 + p, balance=True,
                                         turn=None if group.size == 1 else p % group.size)
        if on_pass is not None:
            on_pass("balance", p, moved, saved, cut, visited)
        idle = 0 if moved else idle + 1
        if idle >= group.size:
            break
    if not within(loads, limits):
        loads = _relieve(adjacency, parts, weights, loads, limits, num_parts, group, bounds,
                         on_pass)
    if group.size > 1 and repaired:
        # The balance moves cost cut: passes that cannot overfill win some of it back.
        label_passes("polish", passes, seed * 7919 + 100 + 4 * passes * group.size,
                     share_room=True)
    return parts


def _relieve(adjacency, parts: np.ndarray, weights: NodeWeights, loads: np.ndarray,
             limits: np.ndarray, num_parts: int, group: Group, bounds: np.ndarray,
             on_pass: Callable[..., None] | None) -> np.ndarray:
    """The excess search (`jgraph.partition.excess.relieve`) where label propagation's
    balance moves stopped over a limit: each process in turn over its own nodes (at
    most RELIEVE_NODES of them, spread evenly), their edges read from `adjacency`, with
    every partition's loads. `parts` (every node's) is updated and shared after every
    turn; ends when every load is within its limit, or a round of turns moves nothing.
    Returns the loads."""
    lo, hi = adjacency.start, adjacency.stop
    count = min(hi - lo, RELIEVE_NODES)
    nodes = lo + np.arange(count, dtype=np.int64) * (hi - lo) // max(count, 1)
    idle = 0
    for turn in range(RELIEVE_ROUNDS * group.size):
        if within(loads, limits):
            break
        after, moved = loads.copy(), 0
        if turn % group.size == group.rank and count:
            mine = parts[nodes]

            def counts_of(idx, mine=mine):
                parts[nodes] = mine
                return _part_counts(adjacency, nodes[idx], parts, num_parts)
            stats = relieve(mine, weights.take(nodes - lo), after, limits, counts_of,
                            max_rounds=RELIEVE_ROUNDS_PER_TURN)
            parts[nodes] = mine
            moved = stats.moves + 2 * stats.swaps
        if group.size > 1:
            after = loads + group.sum(after - loads, "load changes")
            group.share(parts, bounds, "parts")
            moved = int(group.sum(moved, "moves"))
        loads = after
        if on_pass is not None:
            on_pass("relieve", turn, moved, None, None, None)
        idle = 0 if moved else idle + 1
        if idle >= group.size:
            break
    return loads


def _part_counts(adjacency, nodes: np.ndarray, parts: np.ndarray, num_parts: int
                 ) -> np.ndarray:
    """float64[len(nodes), P]: the edge weight from each of `nodes` (sorted global ids
    among the adjacency's rows) into each partition, a piece at a time."""
    counts = np.zeros(nodes.size * num_parts)
    for rows in _pieces(adjacency):
        first, last = np.searchsorted(nodes, [rows.start, rows.start + rows.num_rows])
        if first == last:
            continue
        where = np.full(rows.num_rows, -1, np.int64)
        where[nodes[first:last] - rows.start] = np.arange(last - first)
        at = where[rows.local_rows()]
        keep = at >= 0
        counts[first * num_parts:last * num_parts] += np.bincount(
            at[keep] * num_parts + parts[rows.indices[keep]],
            weights=rows.entry_weights()[keep], minlength=(last - first) * num_parts)
    return counts.reshape(nodes.size, num_parts)


def _move_proposal(piece: Rows, parts, lo: int, weights: NodeWeights, loads, limits,
                   num_parts: int, salt: int, balance: bool, visit=None):
    """For the nodes of one piece (those `visit`, bool over its rows, marks; every one
    without it), the partition each would best move to (most cut edges saved, room in
    every constraint; with `balance`, out of a partition over a limit, least cut
    added): ((nodes, their partitions, targets, scores, weights [., C]) or None, the
    nodes' edge weight to other partitions than their own, the rows (int64, local) of
    those nodes a partition holds more of whose weight than their own (room or not),
    the piece, how many nodes it visited). `weights` are those of the nodes from `lo`
    on. A score is the cut weight the move saves plus a tie-breaking noise below 0.49."""
    rows = np.arange(piece.num_rows) if visit is None else np.flatnonzero(visit)
    m = rows.size
    if not m:
        return None, 0.0, rows, piece, 0
    nodes = piece.start + rows
    own = parts[nodes].astype(np.int64)
    w = weights.take(nodes - lo)                                 # [m, C]
    if compiled.enabled():
        target, best, keen, external = compiled.move_rows(piece, parts, rows, w, loads,
                                                          limits, num_parts, salt, balance)
        movers = np.flatnonzero(target >= 0)
        proposal = (nodes[movers], own[movers], target[movers], best[movers], w[movers]) \
            if movers.size else None
        return proposal, external, rows[keen], piece, m
    at = slice(None) if visit is None else piece.entries_of(rows)
    row = segments.segment_ids(np.diff(piece.indptr)[rows])
    votes = np.bincount(row * num_parts + parts[piece.indices[at]],
                        weights=piece.entry_weights()[at], minlength=m * num_parts
                        ).reshape(m, num_parts)
    mine = votes[np.arange(m), own]
    external = float((votes.sum(axis=1) - mine).sum())
    gain = votes - mine[:, None]                                 # cut weight saved
    room = limits - loads                                        # [P, C]
    fits = (w[:, None, :] <= room[None] + 1e-9).all(axis=2)      # [m, P]
    fits[np.arange(m), own] = False
    keen = rows[(gain > 0).any(axis=1)]
    if balance:
        over = loads > limits + 1e-9                             # [P, C]
        # A node may leave an overloaded partition if it carries what is over there.
        helps = ((w > 0) & over[own]).any(axis=1)
        score = np.where(fits & helps[:, None], gain, -np.inf)
    else:
        score = np.where(fits & (gain > 0), gain, -np.inf)
    score = score + 0.49 * _noise(nodes[:, None], np.arange(num_parts)[None], salt)
    target = np.argmax(score, axis=1)
    best = score[np.arange(m), target]
    movers = np.flatnonzero(np.isfinite(best))
    proposal = (nodes[movers], own[movers], target[movers], best[movers], w[movers]) \
        if movers.size else None
    return proposal, external, keen, piece, m


def _move(proposed, parts, loads, limits, balance: bool, visits: _Visits | None = None
          ) -> np.ndarray:
    """Apply a `_move_proposal` against the loads as they stand: best first, as many as
    each target has room for (and with `balance`, no more than each source partition
    needs to get within its limits). Updates loads at once; returns (float64[4]: the
    moves, the cut weight they save (each against the partitions as the proposal saw
    them), the nodes' weight to other partitions before, the nodes visited; the commit
    that writes the moved nodes' partitions: `_pipelined`). `visits`: told of the
    nodes that would gain by a move and, with the commit, of those that moved."""
    proposal, external, keen, piece, visited = proposed
    if visits is not None:
        visits.keen(piece.start + keen)
    if proposal is None:
        return np.array([0.0, 0.0, external, visited]), None
    nodes, own, target, best, w = proposal
    keep = parts[nodes] == own               # a node another piece moved meanwhile
    nodes, own, target, best, w = (a[keep] for a in (nodes, own, target, best, w))
    admit = _admit(target, best, w, (limits - loads)[target])
    nodes, own, target, best, w = (a[admit] for a in (nodes, own, target, best, w))
    if balance and nodes.size:
        excess = np.maximum(loads - limits, 0.0)                 # [P, C]
        order = np.lexsort((-best, own))
        nodes, own, target, best, w = (nodes[order], own[order], target[order],
                                       best[order], w[order])
        cum = np.cumsum(w, axis=0)
        first = np.searchsorted(own, own, side="left")
        # What the movers before this one, from the same source, take away.
        before = cum - w - np.where(first[:, None] > 0, cum[np.maximum(first - 1, 0)], 0.0)
        still = ((excess[own] - before > 1e-9) & (w > 0)).any(axis=1)
        nodes, own, target, best, w = (nodes[still], own[still], target[still],
                                       best[still], w[still])
    if not nodes.size:
        return np.array([0.0, 0.0, external, visited]), None
    np.subtract.at(loads, own, w)
    np.add.at(loads, target, w)

    def commit():
        parts[nodes] = target
        if visits is not None:
            visits.moved_rows(piece, nodes - piece.start)
    # Weights are integers and the noise below 0.49 (added after the gain, which is
    # rounded back): the floor of a score is its gain.
    return np.array([float(nodes.size), float(np.floor(best).sum()), external, visited]), \
        commit


# -- the whole scheme -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultilevelStats:
    """What `partition` did: the node count of each level (finest first), the coarse
    graph's entries METIS saw (a sample of it where it had to be), and moves."""

    level_nodes: tuple[int, ...]
    coarse_entries: int
    sparsified: bool


def partition(adjacency, weights: NodeWeights, num_parts: int, *, tolerance: float = 0.05,
              seed: int = 0, coarse_entries: int = 1 << 26, workdir: str | None = None,
              cluster_fraction: float = 1 / 4, max_levels: int = 8, v_cycles: int = 1,
              range_entries: int = 1 << 25, log: Callable[[str], None] | None = None,
              group: Group | None = None, on_written: Callable[[], None] | None = None
              ) -> tuple[np.ndarray, MultilevelStats]:
    """int32[n]: the partition of each node of `adjacency` (symmetric, no self-loops).

    coarse_entries: the largest coarse graph (adjacency entries) METIS partitions;
    coarsening stops there, with at most half as many nodes (`coarse_node_limit`).
    workdir: where coarse graphs go on disk (None: in memory).
    cluster_fraction: a cluster holds at most this fraction of a partition's nodes
    and in-edges. v_cycles: further rounds (ParHIP's V-cycles) that coarsen again
    with clusters inside the partitions found, so that refining a coarse level moves
    whole clusters between partitions, then refine back down. range_entries: a coarse
    graph is written in ranges of half that many entries (two are sorted at once).
    group: the processes
    (each with its own rows of `adjacency` and their `weights`; see the module
    docstring); every one returns every node's partition. on_written(): called when a
    coarse level's bucket files are written (`contract`), the moments `workdir` holds
    the most.
    """
    group = group or Group.single()
    log = log or (lambda message: None)
    n = adjacency.num_nodes
    if group.size > 1 and workdir is None:
        raise ValueError("several processes partition through files: give a workdir")
    if num_parts == 1:
        return np.zeros(n, np.int32), MultilevelStats((n,), 0, False)
    totals = group.sum(weights.totals(), "totals")
    limit = np.maximum(totals[weights.size_columns()] / num_parts * cluster_fraction, 1.0)
    coarsen = lambda parts, cycle, split: _coarsen(
        adjacency, weights, num_parts, limit, coarse_entries, max_levels, seed + 101 * cycle,
        workdir, log, parts, group, range_entries // 2, split, on_written)
    levels, current, current_weights, _, finest = coarsen(None, 0, None)
    parts, coarse_seen, sparsified = _initial(current, current_weights, num_parts,
                                              coarse_entries, tolerance, seed, workdir, log,
                                              group)
    level_nodes = tuple(lvl[1].num_nodes for lvl in levels) + (current.num_nodes,)
    parts = _uncoarsen(levels, current, current_weights, parts, num_parts, tolerance, seed,
                       log, group)
    levels = current = current_weights = None       # not held while coarsening again
    lo, hi = adjacency.start, adjacency.stop
    for cycle in range(1, v_cycles + 1):
        split = None
        if finest is not None:
            # The cycle before's finest clusters split by partition, from each
            # process's own nodes: every node's partition is let go (the pieces'
            # partitions carry it) and the split is handed over (`_coarsen` empties
            # the list), so the pieces are the one array of every node held while
            # the level is contracted.
            label, mine, owners = finest.label, _own(parts, lo, hi), finest.owners
            finest = parts = None
            split = list(_split_by_parts(label, mine, _node_bounds(adjacency, group),
                                         owners, num_parts, group))
            log(f"  level 1: the cycle before's {int(owners[-1]):,} clusters split by "
                f"partition into {split[0].k:,}")
            del label, mine
        levels, current, current_weights, coarse_parts, finest = coarsen(parts, cycle, split)
        if not levels:
            parts = coarse_parts                    # the finest graph's, as they were
            break
        coarse_parts = refine(current, coarse_parts, current_weights, num_parts, tolerance,
                              seed=seed + 101 * cycle, group=group)
        parts = _uncoarsen(levels, current, current_weights, coarse_parts, num_parts,
                           tolerance, seed + 101 * cycle, log, group)
        levels = current = current_weights = coarse_parts = None
        log(f"  V-cycle {cycle} done")
    return parts, MultilevelStats(level_nodes, coarse_seen, sparsified)


def metis_trials(processes: int) -> int:
    """How many samples of a coarsest graph too large for METIS are partitioned: at
    least METIS_TRIALS, and one per process where there are more (the processes
    partition their shares of the samples side by side, so more cost no time)."""
    return -(-METIS_TRIALS // processes) * processes


def _initial(current, current_weights: NodeWeights, num_parts: int, coarse_entries: int,
             tolerance: float, seed: int, workdir, log, group: Group
             ) -> tuple[np.ndarray, int, bool]:
    """METIS on the coarsest graph: (every coarse node's partition, the entries METIS
    saw, whether they were a sample). Every process reads the whole coarsest graph
    (each process's rows of it, from the work directory). A graph of at most
    `coarse_entries` entries is partitioned once, by the first process; a larger one is
    sampled `metis_trials` times, each process partitioning its share of the samples,
    and the partition whose cut of the whole coarsest graph is least is kept (the
    first sample's on a tie), so no process holds more than one sample's METIS."""
    whole, columns = current, current_weights.columns
    if group.size > 1:
        np.save(os.path.join(workdir, f"weights.{group.rank}.npy"),
                np.stack(columns, axis=1).astype(np.int64))
        roots = group.gather(np.array(current.root), "coarsest roots")
        firsts = group.gather(current.first, "coarsest firsts")
        whole = Chained([DiskAdjacency.open(str(root), int(first))
                         for root, first in zip(roots, firsts)])
        stacked = np.concatenate([np.load(os.path.join(workdir, f"weights.{r}.npy"))
                                  for r in range(group.size)])
        columns = tuple(stacked.T)
    sampled = whole.num_entries > coarse_entries
    trials = metis_trials(group.size) if sampled else 1
    dense = np.stack(columns, axis=1).astype(np.float64)
    # (cut, trial, entries METIS saw, partition) of the best sample this process made.
    best = (np.inf, trials, 0, None)
    for trial in range(trials):
        if not (group.mine(trial) if sampled else group.leader):
            continue
        csr = _sampled(whole, coarse_entries, seed + trial)
        log(f"  METIS on {csr.shape[0]:,} nodes, {csr.nnz:,} entries"
            + (f" (sample {trial + 1} of {trials}, keeping every cut's expected weight)"
               if sampled else ""))
        parts = part_kway(csr, dense, num_parts, seed=seed + trial, imbalance=tolerance,
                          spill_dir=workdir).astype(np.int32)
        entries = csr.nnz
        del csr
        cut = cut_weight(whole, parts) if sampled else 0.0
        if sampled:
            log(f"  METIS sample {trial + 1}: cut {cut:,.0f} of the coarsest graph")
        if (cut, trial) < best[:2]:
            best = (cut, trial, entries, parts)
        parts = None
    del dense
    release_memory()                     # what METIS and the samples held
    # Each process's best (cut, trial, entries); the least cut, then the first trial.
    found = [tuple(f) for f in group.gather(np.array(best[:3], np.float64), "METIS cuts")]
    cut, trial, entries = min(found)
    winner = found.index((cut, trial, entries))
    parts = best[3]
    if group.size > 1:
        path = os.path.join(workdir, "coarsest-parts.npy")
        if group.rank == winner:
            np.save(path, parts)
        group.barrier("initial partition written")
        if group.rank != winner:
            parts = np.load(path)
        os.remove(os.path.join(workdir, f"weights.{group.rank}.npy"))
        group.barrier("initial partition read")
    if sampled:
        others = "" if group.size == 1 else "; each process's best: " + ", ".join(
            f"{c:,.0f}" for c, _, _ in found)
        log(f"  kept sample {int(trial) + 1} of {trials} (cut {cut:,.0f}{others})")
    return parts, int(entries), sampled


def cut_weight(adjacency, parts: np.ndarray) -> float:
    """The weight of the entries of `adjacency` whose ends `parts` puts apart (each cut
    edge of a symmetric adjacency counted from both ends), a piece at a time."""
    lo, total = adjacency.start, 0.0
    for rows in _pieces(adjacency):
        apart = parts[rows.node_rows() - lo] != parts[rows.indices]
        total += float(rows.entry_weights()[apart].sum())
    return total


def _node_bounds(adjacency, group: Group) -> np.ndarray:
    """int64[N + 1]: the rows [bounds[r], bounds[r + 1]) each process holds."""
    ranges = group.gather([adjacency.start, adjacency.stop], "rows")
    return np.array([int(r[0]) for r in ranges] + [int(ranges[-1][1])], np.int64)


def _coarsen(adjacency, weights: NodeWeights, num_parts: int, limit, coarse_entries: int,
             max_levels: int, seed: int, workdir, log, parts=None, group: Group | None = None,
             entries_per_range: int = 1 << 24, split=None,
             on_written: Callable[[], None] | None = None):
    """Contract clusters level by level until the graph has at most `coarse_entries`
    entries (or `max_levels` were taken, or a level's clusters would be pairs alone:
    `PAIRS_ONLY`) and `coarse_node_limit` nodes (or the clusters stop shrinking: an
    error where more than STALLED_NODES_ALLOWED nodes are left): ([(the cluster of
    each of this process's nodes, finer adjacency, its weights)] per level, the
    coarsest adjacency, its weights, `parts` (every node's) carried to it, and the
    finest level's `Clusters`, their label this process's nodes' (None without
    levels)). With `parts`, clusters stay inside them, so each coarse
    node has one partition. `split` (a V-cycle's, in place of `parts`: a list of
    `_split_by_parts`'s clusters and their partitions, which `_coarsen` empties so
    that the caller holds neither) is the finest level's clusters, instead of
    clusters found again by passes over the largest graph; the partitions are carried
    from it."""
    group = group or Group.single()
    levels = []
    current, current_weights = adjacency, weights
    kept = None
    # METIS partitions the first cycle's coarsest graph (a V-cycle's is refined).
    most_nodes = (coarse_node_limit(coarse_entries, num_parts)
                  if parts is None and not split else np.inf)
    first, carried = split or (None, None)                  # handed over
    if split:
        split.clear()
    # `max_levels` bounds the levels taken for the entries, not for the nodes: a graph
    # of many isolated nodes halves them a level.
    while ((group.sum(current.num_entries, "entries") > coarse_entries
            and len(levels) < max_levels) or current.num_nodes > most_nodes):
        lo, hi = current.start, current.stop
        if first is not None:
            clusters, first, joined = first, None, None
        else:
            joined = 0

            def on_pass(p: int, moved: int) -> None:
                nonlocal joined
                joined += moved if p >= 0 else 0
                log(f"  coarsening level {len(levels) + 1} pass {p + 1}: {moved:,} nodes "
                    f"joined a cluster" if p >= 0 else f"  coarsening level "
                    f"{len(levels) + 1}: {moved:,} nodes alone gathered by their best "
                    f"cluster")
            clusters = cluster(current, current_weights, limit, seed=seed + len(levels),
                               parts=parts, group=group, on_pass=on_pass)
        label, k, owners = clusters
        if not levels:
            kept = Clusters(_own(label, lo, hi), k, owners)
        shrink = k / current.num_nodes
        log(f"  level {len(levels) + 1}: {current.num_nodes:,} -> {k:,} nodes")
        if k < num_parts * 4 or shrink > 0.9:
            break
        if (levels and joined is not None and joined < PAIRS_ONLY * current.num_nodes
                and current.num_nodes <= most_nodes):
            log(f"  level {len(levels) + 1}: label propagation joined {joined:,} nodes, "
                f"pairs the rest: coarsening stops at level {len(levels)}")
            break
        root = None if workdir is None else os.path.join(workdir, f"level-{len(levels) + 1}")
        # A coarse graph far larger than METIS takes is sampled as it is written (its
        # size on disk bounded), keeping every cut's expected weight.
        between = _entries_between(current, label, group)
        keep = min(1.0, SAMPLE_MARGIN * coarse_entries / max(between, 1))
        if keep < 1:
            log(f"  level {len(levels) + 1}: keeping {keep:.1%} of about {between:,} entries "
                f"between clusters")
        if root is not None and group.leader:
            os.makedirs(root, exist_ok=True)
        group.barrier("level folder")
        coarse = contract(current, label, k, root, entries_per_range, keep=keep,
                          seed=seed + len(levels), owners=owners, group=group,
                          on_written=on_written)
        if carried is not None:
            parts, carried = carried, None
        elif parts is not None:
            coarse_parts = np.empty(k, np.int32)
            coarse_parts[label] = parts
            parts = coarse_parts
        # Only this process's nodes' clusters wait for the way back (`_uncoarsen`).
        levels.append((_own(label, lo, hi), current, current_weights))
        current, current_weights = coarse, _coarse_weights(current_weights, label[lo:hi],
                                                           owners, k, group)
        clusters = label = None                 # every node's: not held at the next level
        log(f"  level {len(levels)}: coarse graph "
            f"{int(group.sum(coarse.num_entries, 'entries')):,} entries")
    if carried is not None:         # the split level not taken: every node's partition
        parts = carried[(clusters if first is None else first).label]
    if current.num_nodes > max(most_nodes, STALLED_NODES_ALLOWED):
        raise PartitionError(
            f"coarsening stopped at {current.num_nodes:,} nodes after {len(levels)} "
            f"levels, more than the {most_nodes:,} the coarsest graph may have "
            f"(coarse_node_limit of {coarse_entries:,} entries: every process holds "
            f"each coarsest node's weights and partition); give --coarse-entries "
            f"(coarse_entries in Python) of at least {2 * current.num_nodes:,}")
    return levels, current, current_weights, parts, (kept if levels else None)


def _own(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The rows [lo, hi) of a per-node array, a copy of its own (the whole array where
    they are all of it)."""
    return values if (lo, hi) == (0, values.size) else values[lo:hi].copy()


def _every(own: np.ndarray, adjacency, group: Group, name: str) -> np.ndarray:
    """Every node's values of a per-node array of which this process has `own`, those
    of its rows of `adjacency`: the processes' rows shared (`Group.share`)."""
    if group.size == 1:
        return own
    out = np.empty(adjacency.num_nodes, own.dtype)
    out[adjacency.start:adjacency.stop] = own
    return group.share(out, _node_bounds(adjacency, group), name)


def coarse_node_limit(coarse_entries: int, num_parts: int) -> int:
    """The most nodes a coarsest graph may have: half the entries METIS takes, so that
    what `_initial` and METIS hold of each coarsest node in every process (its weights,
    partition and CSR row, some 80 bytes) stays within what they hold of the entries
    (`jgraph.partition.plan`). Coarsening goes on while the graph has more, as when
    its entries are too many: a graph of many nodes and few edges (isolated nodes are
    paired level by level, `_gather_singletons`) is not handed to METIS whole. Never
    below 4 nodes a partition, where coarsening stops anyway."""
    return max(coarse_entries // 2, 4 * num_parts)


def _split_by_parts(label: np.ndarray, parts: np.ndarray, bounds: np.ndarray,
                    owners: np.ndarray, num_parts: int, group: Group
                    ) -> tuple[Clusters, np.ndarray]:
    """A level's clusters split by partition: the nodes of a cluster in each partition
    form a cluster of their own (a piece), numbered in cluster order, a cluster's piece
    in its first node's partition (its main piece) first, its other pieces after it in
    partition order, so a process owns the pieces of the clusters it owned. `label`,
    `parts`: the cluster and partition of this process's nodes [bounds[rank],
    bounds[rank + 1]); `owners`: the clusters each process owns. Returns (the pieces,
    every node's: shared; int32[k]: every piece's partition).

    A cluster's nodes share a partition but for those refinement moved alone (the
    strays). Each owner learns its clusters' main partitions (from the processes of
    their first nodes), then the stray pieces other processes' nodes are in, and
    numbers them: what travels is a few values a cluster or stray piece, and what a
    process holds is its own nodes' arrays and a few over the clusters."""
    k, rank, step = int(owners[-1]), group.rank, NODE_BLOCK
    lo, n = int(bounds[rank]), int(bounds[-1])
    o_lo, o_hi = int(owners[rank]), int(owners[rank + 1])
    to_owners = lambda clusters: np.searchsorted(clusters, owners[1:-1], side="left")
    # Each cluster's first node here; its owner keeps the first of them all, whose
    # partition is the cluster's main one.
    none = np.iinfo(np.int64).max
    first = np.full(k, none, np.int64)
    for i in range(0, label.size, step):
        block = label[i:i + step]
        np.minimum.at(first, block, np.arange(lo + i, lo + i + block.size))
    seen = np.flatnonzero(first != none)                    # sorted clusters
    first = first[seen]
    cuts = np.concatenate([[0], to_owners(seen), [seen.size]])
    told = group.exchange([{"cluster": seen[a:b], "first": first[a:b],
                            "part": parts[first[a:b] - lo]}
                           for a, b in itertools.pairwise(cuts)], "first nodes")
    del first, seen
    earliest = np.full(o_hi - o_lo, none, np.int64)
    for got in told:
        np.minimum.at(earliest, got["cluster"] - o_lo, got["first"])
    main = np.empty(k, np.int32)                             # each cluster's partition
    for got in told:
        is_first = got["first"] == earliest[got["cluster"] - o_lo]
        main[got["cluster"][is_first]] = got["part"][is_first]
    del told, earliest
    group.share(main, owners, "main partitions")
    # The stray pieces this process's nodes are in, asked of their clusters' owners.
    strays = np.concatenate([np.zeros(0, np.int64)] + [
        i + np.flatnonzero(parts[i:i + step] != main[label[i:i + step]])
        for i in range(0, label.size, step)])
    keys = label[strays].astype(np.int64) * num_parts + parts[strays]
    asked = segments.distinct(keys)
    cuts = np.concatenate([[0], to_owners(asked // num_parts), [asked.size]])
    wanted = group.exchange([{"keys": asked[a:b]} for a, b in itertools.pairwise(cuts)],
                            "stray pieces")
    # This owner's stray pieces; before[c]: those of its clusters before c. Cluster
    # c's main piece is numbered c + the stray pieces of every cluster before c; its
    # stray pieces follow it.
    pieces = segments.distinct(np.concatenate([w["keys"] for w in wanted]))
    before = segments.offsets(np.bincount(pieces // num_parts - o_lo,
                                          minlength=o_hi - o_lo))
    new_owners = segments.offsets(group.gather(o_hi - o_lo + pieces.size, "pieces"))
    shift = int(new_owners[rank]) - o_lo                 # earlier owners' stray pieces
    numbers = np.arange(pieces.size) + pieces // num_parts + 1 + shift
    answers = group.exchange([{"ids": numbers[np.searchsorted(pieces, w["keys"])]}
                              for w in wanted], "stray piece ids")
    dtype = np.int32 if new_owners[-1] < 2**31 else np.int64
    numbered = np.zeros(k, dtype)                         # each cluster's main piece
    numbered[o_lo:o_hi] = np.arange(o_lo, o_hi) + shift + before[:-1]
    group.share(numbered, owners, "main pieces")
    piece_parts = np.empty(int(new_owners[-1]), np.int32)
    piece_parts[numbered[o_lo:o_hi]] = main[o_lo:o_hi]
    piece_parts[numbers] = pieces % num_parts
    del main, pieces, numbers
    out = np.empty(n, dtype)
    for i in range(0, label.size, step):
        block = label[i:i + step]
        out[lo + i:lo + i + block.size] = numbered[block]
    del numbered
    # Each stray: the number of its piece, as its owner answered.
    got = np.concatenate([a["ids"] for a in answers]).astype(dtype)
    for i in range(0, strays.size, step):
        out[lo + strays[i:i + step]] = got[np.searchsorted(asked, keys[i:i + step])]
    group.share(out, bounds, "pieces of the nodes")
    group.share(piece_parts, new_owners, "piece partitions")
    return Clusters(out, int(new_owners[-1]), new_owners), piece_parts


def _coarse_weights(weights: NodeWeights, clusters: np.ndarray, owners: np.ndarray,
                    num_clusters: int, group: Group) -> NodeWeights:
    """The weights of the clusters this process owns (`owners`: `cluster`'s): the sums
    over their members, wherever those are (`clusters`: the cluster of each of this
    process's nodes, which `weights` are of)."""
    if group.size == 1:
        return weights.coarsen(clusters, num_clusters)
    sums = group.add_at_owners(clusters, weights.columns, owners,
                               "cluster weights")
    return NodeWeights(weights.names, tuple(sums[:, c].astype(np.int64)
                                            for c in range(sums.shape[1])))


def _log_pass(log, level: int, num_nodes: int, kind: str, p: int, moved: int,
              saved: float | None, cut: float | None, visited: int | None) -> None:
    """Log one refinement pass (`refine`'s `on_pass`) of a level of `num_nodes` nodes."""
    line = f"  {kind} level {level} pass {p + 1}: {moved:,} nodes moved"
    if cut is not None:
        line += f", cut {cut:,.0f} - {saved:,.0f}"
    elif saved is not None:
        line += f", cut - {saved:,.0f}"
    if visited is not None:
        line += f" ({visited:,} of {num_nodes:,} nodes visited)"
    log(line)


def _uncoarsen(levels, current, current_weights: NodeWeights, parts, num_parts: int,
               tolerance: float, seed: int, log, group: Group | None = None) -> np.ndarray:
    """Project `parts` (of the coarsest graph `current`) down the levels (`_coarsen`'s),
    refining at each (coarse levels are cheap and move whole clusters; with no levels,
    `current` itself); deletes the coarse graphs on disk as it leaves them."""
    if not levels:
        return refine(current, parts, current_weights, num_parts, tolerance, seed=seed,
                      group=group)
    for i in range(len(levels) - 1, -1, -1):
        label, finer, finer_weights = levels[i]
        parts = _every(parts[label], finer, group, "projected partitions")
        if isinstance(current, DiskAdjacency):
            current.remove()
        current = finer
        parts = refine(current, parts, finer_weights, num_parts, tolerance, seed=seed + i,
                       group=group, on_pass=functools.partial(_log_pass, log, i,
                                                              finer.num_nodes))
    return parts
