"""Symmetric adjacency read in node ranges: in memory, or on disk in files per range.

The bounded-memory partitioner (`jgraph.partition.multilevel`) visits a graph's
adjacency one node range at a time and keeps only per-node arrays between ranges, so
the same code partitions a graph held in memory (`CSRAdjacency`, tests and small
coarse graphs) and one whose adjacency is larger than memory (`DiskAdjacency`: one CSR
per node range, built from a stream of edges through temporary bucket files, each
range sized to a bounded number of entries).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
import scipy.sparse

import jgraph.segments as segments


class Rows(NamedTuple):
    """The adjacency of nodes [start, start + m): CSR over those rows.

    indptr: int64[m + 1] offsets into indices; indices: int[e] neighbour ids (global);
    weights: integer[e] (uint8, int32 or int64: `narrowest`; where a finest range
    stores repeated entries once, possibly one value broadcast) or None (every entry
    weight 1; repeated entries count again).
    """

    start: int
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None

    @property
    def num_rows(self) -> int:
        return self.indptr.size - 1

    def local_rows(self) -> np.ndarray:
        """int32[e]: each entry's row, 0-based within the range."""
        return segments.segment_ids(np.diff(self.indptr), np.int32)

    def node_rows(self) -> np.ndarray:
        """int64[e]: each entry's row as a node id (`start` + its local row)."""
        return self.start + self.local_rows().astype(np.int64)

    def entries_of(self, rows: np.ndarray) -> np.ndarray:
        """int64: where in `indices` the entries of `rows` (local) are, row after row."""
        counts = np.diff(self.indptr)[rows]
        return np.repeat(self.indptr[rows], counts) + segments.segment_positions(counts)

    def entry_weights(self) -> np.ndarray:
        """int64[e]: each entry's weight."""
        return (np.ones(self.indices.size, np.int64) if self.weights is None
                else self.weights.astype(np.int64, copy=False))

    def split(self, max_entries: int, max_rows: int | None = None) -> Iterator[Rows]:
        """The same rows in consecutive pieces of at most about `max_entries` entries
        (a row with more stays whole) and at most `max_rows` rows."""
        m = self.num_rows
        a = 0
        while a < m:
            b = int(segments.segment_of(self.indptr, self.indptr[a] + max_entries))
            b = min(max(b, a + 1), m, a + (max_rows or m))
            lo, hi = int(self.indptr[a]), int(self.indptr[b])
            yield Rows(self.start + a, self.indptr[a:b + 1] - lo, self.indices[lo:hi],
                       None if self.weights is None else self.weights[lo:hi])
            a = b


class CSRAdjacency:
    """An adjacency held in memory as one scipy CSR, visited in ranges of rows."""

    def __init__(self, csr: scipy.sparse.csr_matrix, entries_per_range: int = 1 << 24):
        self.csr = csr
        self.num_nodes = csr.shape[0]
        self.entries_per_range = entries_per_range
        self.weighted = not (csr.data.size == 0 or (csr.data == 1).all())

    @property
    def num_entries(self) -> int:
        return int(self.csr.nnz)

    @property
    def start(self) -> int:
        return 0

    @property
    def stop(self) -> int:
        return self.num_nodes

    def ranges(self) -> Iterator[Rows]:
        whole = Rows(0, self.csr.indptr.astype(np.int64), self.csr.indices,
                     self.csr.data.astype(np.int64) if self.weighted else None)
        yield from whole.split(self.entries_per_range)

    def to_csr(self) -> scipy.sparse.csr_matrix:
        return self.csr


@dataclasses.dataclass(frozen=True)
class DiskAdjacency:
    """The rows [bounds[0], bounds[-1]) of an adjacency of `num_nodes` nodes, stored as
    one CSR per node range in `root`: `range-K.indptr.npy` int64[m_K + 1],
    `range-K.indices.npy` int32 (int64 past 2^31 nodes) and, for a weighted range,
    `range-K.weights.npy` (in the narrowest of uint8, int32 and int64 that holds them,
    `narrowest`; or, where a finest range stores a pair that comes more than once
    once, its counts, or one count for every entry, 0-d);
    `weighted`: whether any range is. `bounds` int64[R + 1]: its K-th range holds rows
    [bounds[K], bounds[K + 1]), in the files numbered `first` + K (several processes
    each write the ranges of their own rows into one folder). `adjacency-<first>.json`
    records all of it, so a finished build is found again (a resumed job skips it)."""

    root: str
    num_nodes: int
    bounds: tuple[int, ...]
    num_entries: int
    weighted: bool
    first: int = 0

    @classmethod
    def open(cls, root: str, first: int = 0) -> DiskAdjacency | None:
        """The adjacency a finished `build_disk_adjacency` left in `root`, or None."""
        try:
            with open(_record(root, first)) as f:
                raw = json.load(f)
            return cls(root, raw["num_nodes"], tuple(raw["bounds"]), raw["num_entries"],
                       raw["weighted"], first)
        except (OSError, ValueError, KeyError):
            return None

    @property
    def start(self) -> int:
        return self.bounds[0]

    @property
    def stop(self) -> int:
        return self.bounds[-1]

    def _file(self, k: int, name: str) -> str:
        return os.path.join(self.root, f"range-{self.first + k:05d}.{name}.npy")

    def ranges(self) -> Iterator[Rows]:
        for k in range(len(self.bounds) - 1):
            load = lambda name, k=k: np.asarray(np.load(self._file(k, name), mmap_mode="r"))
            indices = load("indices")
            weights = None
            if self.weighted and os.path.exists(self._file(k, "weights")):
                weights = load("weights")
                if weights.ndim == 0:                   # one count for every entry
                    weights = np.broadcast_to(weights, indices.shape)
            yield Rows(self.bounds[k], load("indptr"), indices, weights)

    def to_csr(self) -> scipy.sparse.csr_matrix:
        """Its rows in memory, [stop - start, num_nodes] (for a coarse graph small
        enough for METIS)."""
        pieces = list(self.ranges())
        indptr = np.concatenate([[0]] + [p.indptr[1:] + off for p, off in zip(
            pieces, segments.exclusive_sum([p.indices.size for p in pieces]))])
        data = (np.concatenate([p.entry_weights() for p in pieces])
                if self.weighted else np.ones(self.num_entries, np.int64))
        return scipy.sparse.csr_matrix(
            (data, np.concatenate([p.indices for p in pieces]), indptr),
            shape=(self.stop - self.start, self.num_nodes))

    def remove(self) -> None:
        for k in range(len(self.bounds) - 1):
            for name in ("indptr", "indices", "weights"):
                if os.path.exists(self._file(k, name)):
                    os.remove(self._file(k, name))
        if os.path.exists(_record(self.root, self.first)):
            os.remove(_record(self.root, self.first))


class Chained:
    """Consecutive row blocks (each process's `DiskAdjacency`) read as one adjacency:
    the whole graph, for METIS on one process."""

    def __init__(self, parts: list):
        self.parts = parts
        self.num_nodes = parts[0].num_nodes
        self.num_entries = sum(p.num_entries for p in parts)
        self.weighted = any(p.weighted for p in parts)
        self.start, self.stop = parts[0].start, parts[-1].stop

    def ranges(self) -> Iterator[Rows]:
        for part in self.parts:
            for rows in part.ranges():
                yield rows if rows.weights is not None or not self.weighted else \
                    rows._replace(weights=rows.entry_weights())

    def to_csr(self) -> scipy.sparse.csr_matrix:
        csr = scipy.sparse.vstack([p.to_csr() for p in self.parts], format="csr")
        csr.data = csr.data.astype(np.int64)
        return csr


def _record(root: str, first: int) -> str:
    return os.path.join(root, f"adjacency-{first:05d}.json")


# Entries of a block `bucket_of` takes at a time.
_SLICE = 1 << 20


def bucket_of(bounds: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each id's range of `bounds` (ranges [bounds[k], bounds[k + 1])), as uint16 where
    there are few enough ranges: numpy sorts 16-bit keys by radix, some 15x faster than
    int64 keys, and every bucketing pass sorts its block by range."""
    if bounds.size > 1 << 16:
        return segments.segment_of(bounds, ids)
    ids = np.asarray(ids)
    flat = ids.reshape(-1)
    which = np.empty(flat.size, np.uint16)
    for a in range(0, flat.size, _SLICE):    # searchsorted's int64 a slice at a time
        which[a:a + _SLICE] = segments.segment_of(bounds, flat[a:a + _SLICE])
    return which.reshape(ids.shape)


def by_range(bounds: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, cuts): the stable order that groups `ids` by their range of `bounds`, and
    where each range's lie in it (`segments.group_by`)."""
    return segments.group_by(bucket_of(bounds, ids), bounds.size - 1)


def set_local(field: np.ndarray, ids: np.ndarray, bounds: np.ndarray,
              cuts: np.ndarray) -> None:
    """field[i] = ids[i] less the start of its range, for `ids` grouped by range of
    `bounds` (`cuts`, `by_range`'s): in place, a range at a time, without an int64
    copy of every entry's start. `field` may be narrower than `ids` (int32 for a
    range's ids): the difference is made in the wider type and fits."""
    for k in np.flatnonzero(np.diff(cuts)):
        a, b = cuts[k], cuts[k + 1]
        np.subtract(ids[a:b], bounds[k], out=field[a:b], casting="unsafe")


def build_disk_adjacency(root: str, num_nodes: int, bounds: np.ndarray,
                         pairs: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
                         *, merge: bool, progress=None) -> DiskAdjacency:
    """Write the adjacency whose entries `pairs` yields, as (rows, cols, weights or None)
    blocks in any order, into `root`, one CSR per range of `bounds`.

    The blocks go to temporary bucket files by row range (each entry's row stored 0-based
    within its range), then each bucket is sorted by row, in turn: memory is one block
    plus one range. `merge` sums repeated (row, col) entries into one weighted entry
    (coarse graphs); without it the entries come unweighted, and a range where many
    come twice (a symmetric graph's pairs, whose edges are stored both ways) stores
    each once with its count (`_counted`; below 2^31 nodes).
    """
    write_buckets(root, num_nodes, bounds, pairs, merge=merge)
    return sort_ranges(root, num_nodes, bounds, merge=merge, progress=progress)


def _bucket_record(num_nodes: int, merge: bool) -> np.dtype:
    ids = np.int32 if num_nodes < 2**31 else np.int64
    return np.dtype([("row", np.int32), ("col", ids), ("w", np.int64)] if merge
                    else [("row", np.int32), ("col", ids)])


def _bucket_file(root: str, k: int, writer: int) -> str:
    return os.path.join(root, f"bucket-{k:05d}.{writer}.bin")


def ahead(fn, items, workers: int = 2):
    """fn(item) for each of `items`, in order, computed in `workers` threads at most
    that many items ahead of the one taken (so at most workers + 1 results are held)."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        waiting: collections.deque = collections.deque()
        for item in items:
            waiting.append(pool.submit(fn, item))
            if len(waiting) > workers:
                yield waiting.popleft().result()
        while waiting:
            yield waiting.popleft().result()


def write_buckets(root: str, num_nodes: int, bounds: np.ndarray, blocks: Iterable,
                  *, merge: bool, writer: int = 0, workers: int = 2,
                  entries: Callable | None = None) -> None:
    """`build_disk_adjacency`'s first half: the entries of `blocks` into one bucket file
    per range of `bounds`, this `writer`'s own (several processes write theirs side by
    side; `sort_ranges` reads them all). Each block is (rows, cols, weights or None), or
    made so by `entries(block)`. `workers` threads make and group blocks by range
    (numpy's sorts and gathers release the GIL) while this one takes the next block and
    writes the last one's: one pipeline, so the blocks held are the one written, one
    read ahead and `workers` being made."""
    os.makedirs(root, exist_ok=True)
    bounds = np.asarray(bounds, np.int64)
    num_ranges = bounds.size - 1
    record = _bucket_record(num_nodes, merge)

    def grouped(block):
        rows, cols, weights = block if entries is None else entries(block)
        order, cuts = by_range(bounds, rows)
        out = np.empty(rows.size, record)
        set_local(out["row"], rows[order], bounds, cuts)
        out["col"] = cols[order]
        if merge:
            out["w"] = 1 if weights is None else weights[order]
        return out, cuts
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(_bucket_file(root, k, writer), "wb"))
                 for k in range(num_ranges)]
        for out, cuts in ahead(grouped, blocks, workers):
            for k in np.flatnonzero(np.diff(cuts)):
                out[cuts[k]:cuts[k + 1]].tofile(files[k])


def sort_ranges(root: str, num_nodes: int, bounds: np.ndarray, *, merge: bool,
                writers: int = 1, first: int = 0, progress=None,
                workers: int = 2) -> DiskAdjacency:
    """`build_disk_adjacency`'s second half: the ranges of `bounds`, numbered from
    `first` among the bucket files (which every one of `writers` wrote), each sorted
    into its CSR, `workers` ranges at a time in threads (numpy's and scipy's sorts
    release the GIL; memory is that many ranges)."""
    bounds = np.asarray(bounds, np.int64)

    def one(k: int) -> tuple[int, bool]:
        done = _sort_range(root, num_nodes, bounds, k, first, writers, merge)
        if progress is not None:
            progress.update(1)
        return done
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        sorted_ranges = list(pool.map(one, range(bounds.size - 1)))
    total = sum(entries for entries, _ in sorted_ranges)
    weighted = merge or any(counted for _, counted in sorted_ranges)
    adjacency = DiskAdjacency(root, int(num_nodes), tuple(int(b) for b in bounds), total,
                              weighted, first)
    record_path = _record(root, first)
    with open(record_path + ".tmp", "w") as f:
        json.dump({"num_nodes": adjacency.num_nodes, "bounds": list(adjacency.bounds),
                   "num_entries": total, "weighted": weighted}, f)
    os.replace(record_path + ".tmp", record_path)
    return adjacency


# A finest range stores its repeated entries once, with their counts, where at least
# this fraction of its entries repeat one before (a count costs a byte an entry, or
# nothing where every pair comes the same number of times; an entry four).
COUNTED_REPEATS = 0.2


def _counted(key: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Sorted (row << 32 | col) keys with each repeated key once, and each one's
    count (uint8, int32 past 255; one value, 0-d, where all are equal), where
    COUNTED_REPEATS of them repeat; else the keys as they are and None."""
    first = np.empty(key.size, bool)
    first[:1] = True
    np.not_equal(key[1:], key[:-1], out=first[1:])
    distinct = int(np.count_nonzero(first))
    if not key.size or key.size - distinct < COUNTED_REPEATS * key.size:
        return key, None
    starts = np.flatnonzero(first)
    del first
    counts = np.diff(starts, append=key.size)
    key = key[starts]
    del starts
    if counts.min() == counts.max():
        return key, narrowest(counts[:1]).reshape(())
    return key, narrowest(counts)


def narrowest(weights: np.ndarray) -> np.ndarray:
    """Positive integer weights in the narrowest of uint8, int32 and int64 that holds
    them: the widths every reader of a range's weights takes (`Rows.entry_weights`
    widens them; the compiled kernels read each as a float64)."""
    top = int(weights.max(initial=0))
    return weights.astype(np.uint8 if top < 256 else np.int32 if top < 2**31 else np.int64,
                          copy=False)


def _sort_range(root: str, num_nodes: int, bounds: np.ndarray, k: int, first: int,
                writers: int, merge: bool) -> tuple[int, bool]:
    """Range k of `bounds`: its bucket files sorted into `range-<first + k>.*.npy`, the
    buckets removed. Returns its entries and whether it is weighted."""
    ids = np.int32 if num_nodes < 2**31 else np.int64
    record = _bucket_record(num_nodes, merge)
    paths = [_bucket_file(root, first + k, w) for w in range(writers)]
    block = np.concatenate([np.fromfile(path, record) for path in paths])
    m = int(bounds[k + 1] - bounds[k])
    if merge:
        csr = scipy.sparse.csr_matrix((block["w"], (block["row"], block["col"])),
                                      shape=(m, num_nodes))
        csr.sum_duplicates()
        indptr, indices, weights = csr.indptr.astype(np.int64), csr.indices, csr.data
    elif ids is np.int32:
        # One sort of (row, col) keys: no argsort's gather, and columns in order.
        key = np.sort(block["row"].astype(np.int64) << 32 | block["col"].astype(np.int64))
        del block
        key, weights = _counted(key)
        indices = (key & 0xFFFFFFFF).astype(np.int32)
        indptr = segments.offsets(np.bincount(key >> 32, minlength=m))
        del key
    else:
        order = np.lexsort((block["col"], block["row"]))
        indices = block["col"][order]
        indptr = segments.offsets(np.bincount(block["row"], minlength=m))
        weights = None
    block = None
    stem = os.path.join(root, f"range-{first + k:05d}")
    np.save(f"{stem}.indptr.npy", indptr)
    np.save(f"{stem}.indices.npy", np.asarray(indices, ids))
    if weights is not None:
        # A coarse level's summed weights too in their narrowest width: 8 bytes an
        # entry of int64 were two thirds of its CSR.
        np.save(f"{stem}.weights.npy", narrowest(weights) if merge else weights)
    for path in paths:
        os.remove(path)
    return int(indptr[-1]), weights is not None
