"""Compiled label-propagation kernels for the bounded-memory partitioner (optional).

`jgraph.partition.multilevel` computes each piece's proposals (the cluster each node
would join, the partition each would move to) with numpy and scipy: some 10M
adjacency entries a second a thread, most of it building a sparse matrix of votes.
With numba installed (`pip install "jgraph[fast]"`) the same proposals come from the
loops below, one pass over each row's entries with a small hash table, several times
faster; the numpy code stays the reference, and `tests/partition/test_compiled.py`
checks that both give the same proposals, bit for bit (same votes, same scores, ties
to the same candidate).

`JGRAPH_PARTITION_KERNELS=numpy` in the environment turns them off.
"""
from __future__ import annotations

import os

import numpy as np

try:                                        # an optional extra: jgraph[fast]
    import numba
except ImportError:                         # pragma: no cover - depends on the install
    numba = None


def enabled() -> bool:
    """Whether the compiled kernels run (numba installed and not turned off)."""
    return numba is not None and os.environ.get("JGRAPH_PARTITION_KERNELS", "") != "numpy"


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)

    @_jit
    def _mix(a, b, salt):
        """`multilevel._noise` of one (id, other) pair: float64 in [0, 1)."""
        h = (np.uint64(a) * np.uint64(0x9E3779B97F4A7C15)) ^ \
            ((np.uint64(b) + np.uint64(salt & 0xFFFFFFFF)) * np.uint64(0xC2B2AE3D27D4EB4F))
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
        return np.float64(h >> np.uint64(11)) / 9007199254740992.0

    @_jit
    def _cluster_rows(start, indptr, indices, weights, label, salt, parts, use_parts,
                      visit):
        """For the rows `visit` (local to the piece from `start`): (target cluster or
        -1, its score) per row, as `multilevel._cluster_proposal` chooses them (`label`,
        `parts`: every node's).

        Edge weights are integers and the bonus and noise add less than 1, so the best
        cluster is among those with the largest sum: only those are scored. Each row
        first gathers its neighbours' clusters (independent loads the processor
        overlaps), then sums them in a hash table sized to the row."""
        m = visit.size
        target = np.full(m, -1, np.int64)
        best_score = np.full(m, -np.inf, np.float64)
        longest = 0
        for r in range(m):
            i = visit[r]
            longest = max(longest, indptr[i + 1] - indptr[i])
        cap = 1
        while cap < 2 * longest + 2:
            cap *= 2
        keys = np.full(cap, -1, np.int64)
        sums = np.zeros(cap, np.float64)
        used = np.empty(max(longest, 1), np.int64)
        found = np.empty(max(longest, 1), np.int64)
        weighted = weights.size > 0
        for r in range(m):
            i = visit[r]
            v = start + i
            a, b = indptr[i], indptr[i + 1]
            n_found = 0
            for e in range(a, b):
                found[n_found] = label[indices[e]]
                used[n_found] = e
                n_found += 1
            row_cap = 1
            while row_cap < 2 * n_found + 2:
                row_cap *= 2
            k = 0
            for j in range(n_found):
                c = found[j]
                slot = (c * 0x9E3779B1) & (row_cap - 1)
                while keys[slot] != -1 and keys[slot] != c:
                    slot = (slot + 1) & (row_cap - 1)
                w = np.float64(weights[used[j]]) if weighted else 1.0
                if keys[slot] == -1:
                    keys[slot] = c
                    sums[slot] = w
                    used[k] = slot          # entries j >= k are read no more
                    k += 1
                else:
                    sums[slot] += w
            own = np.int64(label[v])
            top = -np.inf
            for j in range(k):
                slot = used[j]
                if (not use_parts or parts[keys[slot]] == parts[v]) and sums[slot] > top:
                    top = sums[slot]
            best, choice = -np.inf, np.int64(-1)
            for j in range(k):
                slot = used[j]
                c = keys[slot]
                if sums[slot] == top and (not use_parts or parts[c] == parts[v]):
                    score = sums[slot] + (0.5 if c == own else 0.0) + 0.49 * _mix(v, c, salt)
                    # numpy's order: the first candidate of the row (smallest id) among ties
                    if score > best or (score == best and c < choice):
                        best, choice = score, c
                keys[slot] = -1
            if k and choice != own and best > -np.inf:
                target[r] = choice
                best_score[r] = best
        return target, best_score

    @_jit
    def _move_rows(start, indptr, indices, weights, parts, visit, w, loads, limits,
                   num_parts, salt, balance):
        """For the rows `visit` (local to the piece from `start`): (target partition or
        -1, its score, whether any partition has more of the row's weight than its own)
        per row, as `multilevel._move_proposal` chooses them (w: those rows' weights
        [k, C]), and their weight to other partitions than their own.

        Outside balance moves only partitions with more of a row's weight than its
        own can be chosen (a positive gain): the others are never scored."""
        k_rows = visit.size
        c_count = loads.shape[1]
        target = np.full(k_rows, -1, np.int64)
        best_score = np.full(k_rows, -np.inf, np.float64)
        keen = np.zeros(k_rows, np.bool_)
        votes = np.zeros(num_parts, np.float64)
        external = 0.0
        over = np.zeros((num_parts, c_count), np.bool_)
        for p in range(num_parts):
            for c in range(c_count):
                over[p, c] = loads[p, c] > limits[p, c] + 1e-9 if balance else False
        longest = 1
        for k in range(k_rows):
            i = visit[k]
            longest = max(longest, indptr[i + 1] - indptr[i])
        found = np.empty(longest, parts.dtype)
        weighted = weights.size > 0
        for k in range(k_rows):
            i = visit[k]
            v = start + i
            a, b = indptr[i], indptr[i + 1]
            for e in range(a, b):                      # gathered first: loads overlap
                found[e - a] = parts[indices[e]]
            total = 0.0
            for e in range(a, b):
                x = np.float64(weights[e]) if weighted else 1.0
                votes[found[e - a]] += x
                total += x
            own = np.int64(parts[v])
            external += total - votes[own]
            helps = False
            if balance:
                for c in range(c_count):
                    if w[k, c] > 0 and over[own, c]:
                        helps = True
            best, choice = -np.inf, np.int64(-1)
            if helps or (not balance and total > votes[own]):
                for p in range(num_parts):
                    gain = votes[p] - votes[own]
                    if p == own:
                        continue
                    if gain > 0:
                        keen[k] = True
                    elif not balance:
                        continue
                    fits = True
                    for c in range(c_count):
                        if not w[k, c] <= (limits[p, c] - loads[p, c]) + 1e-9:
                            fits = False
                            break
                    if not fits:
                        continue
                    score = gain + 0.49 * _mix(v, p, salt)
                    if score > best:
                        best, choice = score, np.int64(p)
            for e in range(a, b):
                votes[found[e - a]] = 0.0
            if best > -np.inf:
                target[k] = choice
                best_score[k] = best
        return target, best_score, keen, external

    @_jit
    def _wake(start, indptr, indices, rows, lo, hi, woke):
        """woke[x - lo] = True for the node of each of `rows` (local to the piece from
        `start`) and each of its neighbours x in [lo, hi)."""
        for r in rows:
            woke[start + r - lo] = True
            for e in range(indptr[r], indptr[r + 1]):
                x = np.int64(indices[e])
                if lo <= x < hi:
                    woke[x - lo] = True


if numba is not None:
    @_jit
    def _count_into(counts, ids, lo):
        hi = lo + counts.size
        for i in ids:
            if lo <= i < hi:
                counts[i - lo] += 1


if numba is not None:
    @_jit
    def _between_rows(start, indptr, indices, weights, label, keep, seed):
        """`multilevel.contract`'s entries of one piece: (row's cluster, column's
        cluster, weight) of the entries between two clusters (`label`: every node's),
        each kept with probability `keep` (by a hash of its ends) and then weighing
        w / keep; copies that hold only those entries, not the piece's."""
        m = indptr.size - 1
        e = indptr[m] - indptr[0]
        a_out = np.empty(e, label.dtype)
        b_out = np.empty(e, label.dtype)
        w_out = np.empty(e, np.int64)
        weighted = weights.size > 0
        k = 0
        for i in range(m):
            u = start + i
            a = label[u]
            for j in range(indptr[i], indptr[i + 1]):
                col = np.int64(indices[j])
                b = label[col]
                if a == b:
                    continue
                w = np.float64(weights[j]) if weighted else 1.0
                if keep < 1.0:
                    if not _mix(min(u, col), max(u, col), seed) < keep:
                        continue
                    w = max(np.rint(w / keep), 1.0)
                a_out[k] = a
                b_out[k] = b
                w_out[k] = np.int64(w)
                k += 1
        return a_out[:k].copy(), b_out[:k].copy(), w_out[:k].copy()


def between_rows(piece, label, keep: float, seed: int):
    """`_between_rows` for a `Rows` piece."""
    weights = piece.weights if piece.weights is not None else np.zeros(0, np.int64)
    return _between_rows(np.int64(piece.start), piece.indptr, piece.indices, weights, label,
                         np.float64(keep), np.int64(seed))


def count_into(counts: np.ndarray, ids: np.ndarray, lo: int = 0) -> None:
    """counts[i - lo] += the occurrences of i in `ids`, in place, for the ids in [lo,
    lo + len(counts)) (the others are not counted): O(len(ids)) where np.bincount over
    every node costs O(len(counts)) a call (the scan's per-node degrees, a block of edges
    at a time)."""
    if enabled():
        _count_into(counts, ids, np.int64(lo))
    else:
        inside = ids[(ids >= lo) & (ids < lo + counts.size)] - lo
        counts += np.bincount(inside, minlength=counts.size).astype(counts.dtype, copy=False)


def cluster_rows(piece, label, salt: int, parts, visit: np.ndarray):
    """`_cluster_rows` for the rows `visit` (int64, local) of a `Rows` piece: (target or
    -1, score) per row."""
    weights = piece.weights if piece.weights is not None else np.zeros(0, np.int64)
    use_parts = parts is not None
    return _cluster_rows(np.int64(piece.start), piece.indptr, piece.indices, weights, label,
                         np.int64(salt),
                         parts if use_parts else np.zeros(1, np.int32), use_parts,
                         np.asarray(visit, np.int64))


def move_rows(piece, parts, visit, w, loads, limits, num_parts: int, salt: int,
              balance: bool):
    """`_move_rows` for the rows `visit` (int64, local) of a `Rows` piece: (target or -1,
    score, keen) per row, and the rows' weight to other partitions."""
    weights = piece.weights if piece.weights is not None else np.zeros(0, np.int64)
    limits = np.broadcast_to(np.asarray(limits, np.float64), loads.shape)
    return _move_rows(np.int64(piece.start), piece.indptr, piece.indices, weights, parts,
                      np.asarray(visit, np.int64), np.ascontiguousarray(w, np.float64),
                      np.asarray(loads, np.float64), np.ascontiguousarray(limits),
                      np.int64(num_parts), np.int64(salt), bool(balance))


def wake(piece, rows: np.ndarray, lo: int, hi: int, woke: np.ndarray) -> None:
    """Mark in `woke` (bool over the nodes [lo, hi)) the nodes of `rows` (local to the
    `Rows` piece) and their neighbours among [lo, hi), in place."""
    rows = np.asarray(rows, np.int64)
    if enabled():
        _wake(np.int64(piece.start), piece.indptr, piece.indices, rows, np.int64(lo),
              np.int64(hi), woke)
        return
    woke[piece.start + rows - lo] = True
    x = piece.indices[piece.entries_of(rows)].astype(np.int64)
    woke[x[(x >= lo) & (x < hi)] - lo] = True
