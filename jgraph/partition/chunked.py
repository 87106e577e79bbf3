"""Partition a chunked graph directory in memory bounded by its nodes, not its edges.

`partition_chunked` reads a graph in the chunked format (`jgraph.data.chunked`) in
passes and writes the same partition directory as `partition_graph`, holding at most
per-node arrays (degrees, the assignment, the new ids) and one chunk or one range at a
time. Phases, each recorded in the work directory `<out>.work` when it finishes, so a
killed job run again with the same command resumes after its last finished phase:

1. scan: every edge chunk once, ids checked; in-degrees and adjacency degrees.
2. adjacency: the symmetric adjacency (self-loops dropped) to temporary files, one
   CSR per node range (`jgraph.partition.adjacency`).
3. assignment: multilevel label propagation with METIS on the coarse graph, refined
   under the balance constraints (`jgraph.partition.multilevel`); the adjacency is
   deleted afterwards.
4. relabel: node_map and node_map_inv, as `jgraph.partition.relabel` numbers them.
5. bucketing: every edge, in new ids, to a temporary file of its destination's
   partition and id range (each range a bounded number of in-edges).
6. partitions: each partition's CSC built one range at a time, in (destination,
   relation, source) order, with its halo and splits.
7. node data: every node array copied by row chunks into the partitions' files.

The partition directory is assembled inside the work directory and renamed to `out`
at the end; the work directory is then deleted, so nothing half-written is ever at
`out`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import shutil
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from jgraph.atomic import publish, writer, writer_alive
from jgraph.data.chunked import ChunkedGraph, is_chunked_dir, open_chunked
from jgraph.partition.adjacency import (
    DiskAdjacency,
    bucket_of,
    build_disk_adjacency,
    range_bounds,
)
from jgraph.partition.assignment import BALANCED_SPLITS, PartitionError, fill_empty
from jgraph.partition.multilevel import SAMPLE_MARGIN, NodeWeights, partition
from jgraph.partition.store import (
    FORMAT_VERSION,
    ArraySpec,
    PartInfo,
    PartitionMeta,
    part_dir,
    write_meta,
)
from jgraph.progress import Progress

WORK = ".work"
METHOD = "multilevel"
PHASES = ("scan", "adjacency", "assignment", "relabel", "bucketing", "partitions",
          "node data")
# Node data rows copied, and edges read, at a time (a chunk of any size is read a block
# at a time, so a phase's memory does not follow how the input was chunked).
ROWS_PER_BLOCK, EDGES_PER_BLOCK = 1 << 20, 1 << 22
# Temporary folders of the work directory that no phase after the named one reads.
LEFTOVERS = {"assignment": ("adjacency", "coarse"), "partitions": ("buckets",)}


@dataclasses.dataclass(frozen=True)
class ChunkedOptions:
    """How `partition_chunked` works; part of a job's identity (a resumed job must
    have the same).

    Fields:
      num_parts, seed, tolerance: as for `partition_graph`.
      range_entries: adjacency entries (and in-edges) per node range on disk: the
        largest block a phase holds.
      coarse_entries: the largest coarse graph METIS partitions (adjacency entries).
    """

    num_parts: int
    seed: int = 0
    tolerance: float = 0.05
    range_entries: int = 1 << 25
    coarse_entries: int = 1 << 25

    def __post_init__(self):
        for name, least in (("num_parts", 1), ("range_entries", 1 << 10),
                            ("coarse_entries", 1 << 10)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < least:
                raise PartitionError(f"{name} (--{name.replace('_', '-')}) must be an "
                                     f"integer >= {least}, got {value!r}")


def bounded_route(path, method) -> bool:
    """Whether a dataset goes through `partition_chunked`: a chunked graph directory,
    with the multilevel method or none named (`Method` or its value)."""
    method = getattr(method, "value", method)
    return is_chunked_dir(path) and method in (None, METHOD)


def train_nodes(graph: ChunkedGraph) -> int:
    """The largest train split of any node type, from the metadata alone."""
    return max((named["train"].num_rows for named in graph.splits.values()
                if "train" in named), default=0)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class PhasePeak:
    """A phase's peak RSS, sampled every `interval` seconds by a thread (Linux
    /proc/self/statm; elsewhere the process's peak so far). Sampling leaves the kernel's
    own peak alone, so `/usr/bin/time -v` still reports the whole job's."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak = interval, _rss_now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_now())

    def __enter__(self) -> PhasePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_now())


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


class NpyAppender:
    """A .npy file of known shape written front to back, a block at a time, through a
    file rather than a memory map (a map's written pages count in the process's RSS
    until it is closed). `append` takes the next rows; `close` checks they filled it."""

    def __init__(self, path: str, dtype, shape: tuple[int, ...]):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), tuple(shape)
        self.rows = 0
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        np.lib.format.write_array_header_2_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                        "fortran_order": False, "shape": self.shape})

    def append(self, values: np.ndarray, at: int | None = None) -> None:
        """The next rows; `at` (optional): the row they must start at."""
        if at is not None and at != self.rows:
            raise RuntimeError(f"{self.path}: rows from {at} written after {self.rows}")
        values = np.ascontiguousarray(values, self.dtype)
        self.file.write(values.tobytes())
        self.rows += values.shape[0] if values.ndim else 1

    def close(self) -> None:
        self.file.close()
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.path}: {self.rows} rows written of {self.shape[0]}")


class _Work:
    """The work directory: which phases finished (with their seconds and peak RSS)."""

    def __init__(self, root: str, identity: dict, progress: Progress):
        self.root = root
        self.record = os.path.join(root, "job.json")
        state = None
        owner = _read(os.path.join(root, "writer"))
        if owner and owner != writer() and writer_alive(owner):
            raise PartitionError(f"{root}: another job ({owner}) is writing this partition "
                                 f"directory; wait for it, or give another --out")
        if os.path.isdir(root):
            try:
                with open(self.record) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                state = None
            staged = os.path.isfile(os.path.join(root, "out", "node_map.npy"))
            relabelled = state is not None and "relabel" in state.get("phases", {})
            if (state is None or state.get("identity") != identity
                    or state.get("publishing") or (relabelled and not staged)):
                progress.note(f"{root}: left by a different, finished or unreadable job; "
                              f"starting over")
                shutil.rmtree(root)
                state = None
            elif state["phases"]:
                progress.note(f"resuming after phase {list(state['phases'])[-1]!r} "
                              f"({root})")
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "writer"), "w") as f:
            f.write(writer())
        self.state = state or {"identity": identity, "phases": {}}
        self._save()

    def _save(self) -> None:
        with open(self.record + ".tmp", "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(self.record + ".tmp", self.record)

    def publishing(self) -> None:
        self.state["publishing"] = True
        self._save()

    def done(self, phase: str) -> bool:
        return phase in self.state["phases"]

    def finish(self, phase: str, seconds: float, peak: int, **facts) -> None:
        self.state["phases"][phase] = {"seconds": seconds, "peak_rss_bytes": peak, **facts}
        self._save()

    def path(self, *names: str) -> str:
        return os.path.join(self.root, *names)


def partition_chunked(input_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      options: ChunkedOptions, *, overwrite: bool = False,
                      progress: Progress | None = None,
                      check_out: Callable[[str, bool], None] | None = None) -> PartitionMeta:
    """Partition the chunked graph at `input_dir` into `options.num_parts` and write the
    partition directory `out_dir` (see the module docstring). `check_out(out,
    overwrite)` raises unless `out` may receive a partition (checked before and at the
    end). Returns the metadata written to meta.json, whose `build` field holds each
    phase's seconds and peak RSS."""
    start = time.perf_counter()
    progress = progress or Progress(enabled=False)
    graph = open_chunked(input_dir)
    _check_request(graph, options)
    out = os.path.realpath(os.fspath(out_dir))
    if check_out is not None:
        check_out(out, overwrite)
    identity = {"input": os.path.realpath(graph.root), "files": _stamp(graph),
                "options": dataclasses.asdict(options), "version": 2}
    work = _Work(out + WORK, identity, progress)
    try:
        check_disk(graph, options, os.path.dirname(out), already=_bytes_under(work.root))
        _open_files_for(graph, options)
    except PartitionError:
        if not work.state["phases"]:
            shutil.rmtree(work.root, ignore_errors=True)     # nothing begun: nothing left
        raise
    staging = work.path("out")
    os.makedirs(staging, exist_ok=True)
    job = _Job(graph, options, work, staging, progress)
    for name, run in zip(PHASES, (job.scan, job.adjacency, job.assignment, job.relabel,
                                  job.bucketing, job.partitions, job.node_data)):
        if not work.done(name):
            with progress.phase(name), PhasePeak() as peak:
                began = time.perf_counter()
                facts = run() or {}
            work.finish(name, time.perf_counter() - began, peak.peak, **facts)
        # What a finished phase leaves behind for no later one goes only once it is
        # recorded (again on a resume: a job killed while deleting it resumes).
        for leftover in LEFTOVERS.get(name, ()):
            shutil.rmtree(work.path(leftover), ignore_errors=True)
    meta = job.meta(time.perf_counter() - start)
    write_meta(staging, meta)
    if check_out is not None:
        check_out(out, overwrite)
    work.publishing()           # a job found in this state later starts over
    publish(staging, out)
    shutil.rmtree(work.root, ignore_errors=True)
    return meta


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _stamp(graph: ChunkedGraph) -> list:
    """The input's identity: metadata.json's and every chunk file's size and time (a
    stat a file), so a job does not resume over an input changed since it began."""
    paths = [os.path.join(graph.root, "metadata.json")] + [
        graph.path(f) for c in graph.all_chunks() for f in (*c.files, *c.value_files)]
    total, latest = 0, 0
    for path in paths:
        st = os.stat(path)
        total, latest = total + st.st_size, max(latest, st.st_mtime_ns)
    return [len(paths), total, latest]


def _bytes_under(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root)
               for f in files)


def _open_files_for(graph: ChunkedGraph, options: ChunkedOptions) -> None:
    """Raise the open-file limit to what the phases keep open at once (a bucket file
    a node range, a file a partition), or refuse before any phase if it cannot be."""
    ranges = 2 * graph.num_edges // options.range_entries + options.num_parts + 2
    need = ranges * (1 + len(graph.edge_data)) + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise PartitionError(f"partitioning {graph.root} keeps about {need} files open "
                                 f"and the open-file limit is {hard}: raise it (ulimit -n), "
                                 f"or give a larger --range-entries")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _check_request(graph: ChunkedGraph, options: ChunkedOptions) -> None:
    p = options.num_parts
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise PartitionError(f"num_parts must be a positive integer, got {p!r}")
    if p > graph.total_nodes:
        raise PartitionError(f"num_parts={p} is more than the graph's {graph.total_nodes} nodes")
    if not (np.isfinite(options.tolerance) and options.tolerance >= 0):
        raise PartitionError(f"balance tolerance must be a finite number >= 0, got "
                             f"{options.tolerance!r}")
    if p > 2**15:
        raise PartitionError(f"num_parts={p}: the chunked route takes at most 32768 parts")


def estimate_disk(num_nodes: int, num_edges: int, node_data_bytes: int,
                  edge_data_bytes: int, num_parts: int,
                  coarse_entries: int = ChunkedOptions.coarse_entries) -> dict[str, int]:
    """Bytes of disk each part of a job needs: the temporary adjacency (its bucket
    records, then one CSR per range), the coarse graphs, the edge buckets, and the
    partition directory itself (CSC, edge ids, edge data, node data, node maps)."""
    ids = 4 if num_nodes < 2**31 else 8
    adjacency = 2 * num_edges * (4 + ids)
    # Two coarse levels at once, each at most SAMPLE_MARGIN x coarse_entries entries
    # (sampled beyond), as bucket records (16 bytes) while a level is written.
    coarse = 2 * 16 * min(2 * num_edges, SAMPLE_MARGIN * coarse_entries)
    buckets = num_edges * (ids + 4 + 4 + 8 + edge_data_bytes)
    output = (num_edges * (8 + 4 + 8 + edge_data_bytes) + num_nodes * 16 + node_data_bytes
              + num_parts * 4096)
    return {"adjacency": adjacency, "coarse": coarse, "buckets": buckets, "output": output,
            "peak": max(adjacency + coarse, buckets + output)}


def data_bytes(graph: ChunkedGraph) -> tuple[int, int]:
    """(bytes of all node data, bytes of edge data per edge)."""
    node = 0
    for named in graph.node_data.values():
        for c in named.values():
            width = c.sparse if c.sparse is not None else int(np.prod(c.shape, dtype=np.int64))
            node += c.num_rows * width * (np.dtype(c.dtype).itemsize + (4 if c.sparse else 0))
    edge = sum(np.dtype(c.dtype).itemsize * int(np.prod(c.shape, dtype=np.int64))
               for c in graph.edge_data.values())
    return int(node), int(edge)


def check_disk(graph: ChunkedGraph, options: ChunkedOptions, where: str,
               already: int = 0) -> None:
    """Refuse to start when the disk at `where` has less room than the job's peak
    (`already`: bytes a resumed job's work directory holds, counted as room)."""
    node, edge = data_bytes(graph)
    need = estimate_disk(graph.total_nodes, graph.num_edges, node, edge, options.num_parts,
                         options.coarse_entries)
    where = where or "."
    while not os.path.isdir(where) and os.path.dirname(where) not in ("", where):
        where = os.path.dirname(where)          # the disk of the nearest folder that exists
    free = shutil.disk_usage(where).free + already
    if free < need["peak"]:
        raise PartitionError(
            f"{where}: {free / 2**30:.1f} GiB free, but partitioning "
            f"{graph.root} needs about {need['peak'] / 2**30:.1f} GiB there (temporary "
            f"adjacency {need['adjacency'] / 2**30:.1f} GiB, edge buckets "
            f"{need['buckets'] / 2**30:.1f} GiB, partitions {need['output'] / 2**30:.1f} GiB)")


class _Job:
    """The phases of one `partition_chunked` call; each reads what earlier phases left
    in the work directory, so any of them can be the first of a resumed job."""

    def __init__(self, graph: ChunkedGraph, options: ChunkedOptions, work: _Work,
                 staging: str, progress: Progress):
        self.graph, self.options, self.work, self.staging = graph, options, work, staging
        self.progress = progress
        self.n = graph.total_nodes
        self.num_types = len(graph.node_types)
        self.ids = np.int32 if self.n < 2**31 else np.int64

    # -- phase 1 ------------------------------------------------------------------------

    def _edge_pass(self, desc: str):
        meter = self.progress.meter(desc, self.graph.num_edges, "edges")
        for i, rows, chunk in self.graph.edge_blocks(EDGES_PER_BLOCK):
            yield i, rows, chunk
            meter.update(chunk.src.size)

    def scan(self) -> dict:
        n = self.n
        in_degree = np.zeros(n, np.int64)
        degree = np.zeros(n, np.int64)
        loops = 0
        for _, _, chunk in self._edge_pass("scan (pass 1 of 3 over the edges)"):
            in_degree += np.bincount(chunk.dst, minlength=n)
            keep = chunk.src != chunk.dst
            loops += int(keep.size - keep.sum())
            degree += np.bincount(chunk.src[keep], minlength=n)
            degree += np.bincount(chunk.dst[keep], minlength=n)
        for t, named in self.graph.splits.items():
            for name in named:
                self.graph.split(t, name)          # checked: sorted, unique, in range
        np.save(self.work.path("in_degree.npy"), in_degree)
        np.save(self.work.path("degree.npy"), degree)
        return {"self_loops": loops}

    # -- phase 2 ------------------------------------------------------------------------

    def adjacency(self) -> dict:
        degree = np.load(self.work.path("degree.npy"))
        bounds = range_bounds(degree, self.options.range_entries)
        del degree

        def pairs():
            for _, _, chunk in self._edge_pass("adjacency (pass 2 of 3 over the edges)"):
                keep = chunk.src != chunk.dst
                src, dst = chunk.src[keep], chunk.dst[keep]
                yield np.concatenate([src, dst]), np.concatenate([dst, src]), None
        root = self.work.path("adjacency")
        shutil.rmtree(root, ignore_errors=True)
        adjacency = build_disk_adjacency(root, self.n, bounds, pairs(), merge=False)
        return {"ranges": len(adjacency.bounds) - 1, "entries": adjacency.num_entries}

    # -- phase 3 ------------------------------------------------------------------------

    def weights(self) -> NodeWeights:
        """The balance constraints of `jgraph.partition.assignment.constraints_for`, in
        compact columns."""
        g, offsets = self.graph, self.graph.type_offsets()
        names, columns = [], []
        for t, ntype in enumerate(g.node_types):
            names.append("nodes" if self.num_types == 1 else f"nodes:{ntype}")
            column = np.zeros(self.n, np.uint8)
            column[offsets[t]:offsets[t + 1]] = 1
            columns.append(column)
        for split in BALANCED_SPLITS:
            member = np.zeros(self.n, np.uint8)
            for t, ntype in enumerate(g.node_types):
                if split in g.splits.get(ntype, {}):
                    member[offsets[t] + g.split(ntype, split)] = 1
            if member.any():
                names.append(split)
                columns.append(member)
        names.append("edges")
        columns.append(np.load(self.work.path("in_degree.npy")))
        return NodeWeights(tuple(names), tuple(columns))

    def assignment(self) -> dict:
        adjacency = DiskAdjacency.open(self.work.path("adjacency"))
        if adjacency is None:
            raise PartitionError(f"{self.work.path('adjacency')}: the adjacency phase's "
                                 f"files are missing; delete {self.work.root} to start over")
        coarse = self.work.path("coarse")
        shutil.rmtree(coarse, ignore_errors=True)
        os.makedirs(coarse)
        began = time.perf_counter()
        parts, stats = partition(adjacency, self.weights(), self.options.num_parts,
                                 tolerance=self.options.tolerance, seed=self.options.seed,
                                 coarse_entries=self.options.coarse_entries, workdir=coarse,
                                 log=lambda message: self.progress.note(
                                     f"{message} [{time.perf_counter() - began:.0f}s]"))
        parts = fill_empty(parts, self.options.num_parts)
        np.save(self.work.path("parts.npy"), parts.astype(np.int16 if self.options.num_parts
                                                          <= 2**15 else np.int32))
        return {"levels": list(stats.level_nodes), "coarse_entries": stats.coarse_entries,
                "coarse_sparsified": stats.sparsified}

    # -- phase 4 ------------------------------------------------------------------------

    def parts(self) -> np.ndarray:
        return np.load(self.work.path("parts.npy")).astype(np.int32)

    def relabel(self) -> dict:
        parts = self.parts()
        p, t = self.options.num_parts, self.num_types
        node_map = np.argsort(parts, kind="stable").astype(np.int64)
        np.save(os.path.join(self.staging, "node_map.npy"), node_map)
        inverse = np.empty_like(node_map)
        inverse[node_map] = np.arange(self.n)
        del node_map
        np.save(os.path.join(self.staging, "node_map_inv.npy"), inverse)
        type_ids = np.searchsorted(self.graph.type_offsets(), np.arange(self.n),
                                   side="right") - 1 if t > 1 else np.zeros(self.n, np.int64)
        counts = np.bincount(parts.astype(np.int64) * t + type_ids,
                             minlength=p * t).reshape(p, t)
        np.save(self.work.path("counts.npy"), counts)
        return {}

    def numbering(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(counts int64[P, T], offsets int64[P + 1], ntype_offsets int64[P, T + 1])."""
        counts = np.load(self.work.path("counts.npy"))
        offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))]).astype(np.int64)
        ntype_offsets = offsets[:-1, None] + np.concatenate(
            [np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, axis=1)], axis=1)
        return counts, offsets, ntype_offsets

    def inverse(self) -> np.ndarray:
        return np.load(os.path.join(self.staging, "node_map_inv.npy"))

    # -- phase 5 ------------------------------------------------------------------------

    def _record(self) -> np.dtype:
        return np.dtype([("src", self.ids), ("dst", np.int32), ("etype", np.int32),
                         ("eid", np.int64)])

    def bucket_bounds(self) -> np.ndarray:
        """int64[B + 1]: ranges of new ids, none across a partition boundary, each with
        at most about `range_entries` in-edges."""
        _, offsets, _ = self.numbering()
        node_map = np.load(os.path.join(self.staging, "node_map.npy"), mmap_mode="r")
        in_degree = np.load(self.work.path("in_degree.npy"), mmap_mode="r")
        bounds = [np.zeros(1, np.int64)]
        for k in range(self.options.num_parts):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            degree = np.asarray(in_degree[np.asarray(node_map[lo:hi])], np.int64)
            bounds.append(lo + range_bounds(degree, self.options.range_entries)[1:])
        return np.concatenate(bounds)

    def bucketing(self) -> dict:
        parts, inverse = self.parts(), self.inverse()
        bounds = self.bucket_bounds()
        np.save(self.work.path("buckets.npy"), bounds)
        record = self._record()
        root = self.work.path("buckets")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        names = list(self.graph.edge_data)
        cut = 0
        ranges = dict.fromkeys(names)
        with contextlib.ExitStack() as stack:
            files = {(b, key): stack.enter_context(
                         open(os.path.join(root, _bucket_file(b, key)), "wb"))
                     for b in range(bounds.size - 1) for key in [None, *names]}
            for i, rows, chunk in self._edge_pass("bucketing (pass 3 of 3 over the edges)"):
                cut += int((parts[chunk.src] != parts[chunk.dst]).sum())
                new_dst = inverse[chunk.dst]
                which = bucket_of(bounds, new_dst)
                order = np.argsort(which, kind="stable")
                which = which[order]
                block = np.empty(order.size, record)
                block["src"] = inverse[chunk.src[order]]
                block["dst"] = new_dst[order] - bounds[which]
                block["etype"] = chunk.etype[order]
                block["eid"] = chunk.start + order
                data = {name: np.asarray(self.graph.load(self.graph.edge_data[name].files[i])
                                         [rows])[order] for name in names}
                for name, values in data.items():
                    ranges[name] = _widen(ranges[name], values)
                cuts = np.searchsorted(which, np.arange(bounds.size))
                for b in np.flatnonzero(np.diff(cuts)):
                    block[cuts[b]:cuts[b + 1]].tofile(files[b, None])
                    for name, values in data.items():
                        np.ascontiguousarray(values[cuts[b]:cuts[b + 1]]).tofile(files[b, name])
        return {"cut_edges": cut, "edge_data_ranges": {k: v for k, v in ranges.items()
                                                       if v is not None}}

    # -- phase 6 ------------------------------------------------------------------------

    def partitions(self) -> dict:
        g, p = self.graph, self.options.num_parts
        counts, offsets, ntype_offsets = self.numbering()
        bounds = np.load(self.work.path("buckets.npy"))
        node_map = np.load(os.path.join(self.staging, "node_map.npy"), mmap_mode="r")
        in_degree = np.load(self.work.path("in_degree.npy"), mmap_mode="r")
        record = self._record()
        root = self.work.path("buckets")
        halo_mark = np.zeros(self.n, bool)
        infos = []
        meter = self.progress.meter("writing partitions", g.num_edges, "edges")
        for k in range(p):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            d = part_dir(self.staging, k)
            os.makedirs(d, exist_ok=True)
            degree = np.asarray(in_degree[np.asarray(node_map[lo:hi])], np.int64)
            indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
            e = int(indptr[-1])
            np.save(os.path.join(d, "indptr.npy"), indptr)
            out = {name: NpyAppender(os.path.join(d, f"{name}.npy"), dtype, (e,))
                   for name, dtype in (("indices", np.int64), ("etype", np.int32),
                                       ("edge_ids", np.int64))}
            data_out = {}
            for name, c in g.edge_data.items():
                os.makedirs(os.path.join(d, "edge"), exist_ok=True)
                data_out[name] = NpyAppender(os.path.join(d, "edge", f"{name}.npy"), c.dtype,
                                             (e, *c.shape))
            first, last = np.searchsorted(bounds, [lo, hi])
            for b in range(first, last):
                block = np.fromfile(os.path.join(root, _bucket_file(b, None)), record)
                # The records came in edge-id order (chunks in order, each sorted by bucket
                # stably), so a stable sort leaves equal edges in edge-id order.
                order = np.lexsort((block["src"], block["etype"], block["dst"]))
                block = block[order]
                at = int(indptr[bounds[b] - lo])       # buckets in order: appended
                out["indices"].append(block["src"], at)
                out["etype"].append(block["etype"], at)
                out["edge_ids"].append(block["eid"], at)
                for name, c in g.edge_data.items():
                    values = np.fromfile(os.path.join(root, _bucket_file(b, name)),
                                         c.dtype).reshape(-1, *c.shape)
                    data_out[name].append(values[order], at)
                halo_mark[block["src"]] = True
                meter.update(block.size)
                del block, order
            for appender in (*out.values(), *data_out.values()):
                appender.close()
            del out, data_out
            halo_mark[lo:hi] = False
            halo = np.flatnonzero(halo_mark).astype(np.int64)
            halo_mark[halo] = False
            np.save(os.path.join(d, "halo.npy"), halo)
            infos.append({
                "num_nodes": hi - lo,
                "num_nodes_per_type": dict(zip(g.node_types, counts[k].tolist())),
                "num_edges": e, "num_halo": int(halo.size),
                "halo_by_owner": np.bincount(np.searchsorted(offsets, halo, side="right") - 1,
                                             minlength=p).tolist()})
        split_sizes = self._write_splits(offsets, ntype_offsets)
        for k, info in enumerate(infos):
            info["splits"] = split_sizes[k]
        return {"parts": infos}

    def _write_splits(self, offsets, ntype_offsets) -> list[dict]:
        """Each partition's split files: sorted new ids. Returns {type: {split: count}}
        per partition."""
        g, p = self.graph, self.options.num_parts
        inverse = np.load(os.path.join(self.staging, "node_map_inv.npy"), mmap_mode="r")
        sizes = [{} for _ in range(p)]
        for t, ntype in enumerate(g.node_types):
            for name in g.splits.get(ntype, {}):
                new = np.sort(np.asarray(inverse[g.type_offsets()[t] + g.split(ntype, name)]))
                cuts = np.searchsorted(new, offsets)
                for k in range(p):
                    ids = new[cuts[k]:cuts[k + 1]]
                    path = os.path.join(part_dir(self.staging, k), "split", ntype,
                                        f"{name}.npy")
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    np.save(path, ids.astype(np.int64))
                    sizes[k].setdefault(ntype, {})[name] = int(ids.size)
        return sizes

    # -- phase 7 ------------------------------------------------------------------------

    def node_data(self) -> dict:
        g, p = self.graph, self.options.num_parts
        counts, offsets, ntype_offsets = self.numbering()
        inverse = np.load(os.path.join(self.staging, "node_map_inv.npy"), mmap_mode="r")
        total = sum(c.num_rows for named in g.node_data.values() for c in named.values())
        meter = self.progress.meter("copying node data", total, "rows")
        ranges = {}
        for t, ntype in enumerate(g.node_types):
            for name, c in g.node_data.get(ntype, {}).items():
                leaves = [("", c.files, c.dtype, c.shape)] if c.sparse is None else [
                    ("indices", c.files, "int32", (c.sparse,)),
                    ("values", c.value_files, c.dtype, (c.sparse,))]
                for leaf, files, dtype, shape in leaves:
                    outs = []
                    for k in range(p):
                        path = os.path.join(part_dir(self.staging, k), "node", ntype,
                                            *([name, leaf] if leaf else [name])) + ".npy"
                        os.makedirs(os.path.dirname(path), exist_ok=True)
                        outs.append(NpyAppender(path, dtype, (int(counts[k, t]), *shape)))
                    try:
                        for i, f in enumerate(files):
                            chunk = g.load(f)               # memory-mapped, read a block at a time
                            for a in range(0, chunk.shape[0], ROWS_PER_BLOCK):
                                rows = np.asarray(chunk[a:a + ROWS_PER_BLOCK])
                                first = g.type_offsets()[t] + c.starts[i] + a
                                new = np.asarray(inverse[first:first + rows.shape[0]])
                                owner = np.searchsorted(offsets, new, side="right") - 1
                                order = np.argsort(owner, kind="stable")
                                cuts = np.searchsorted(owner[order], np.arange(p + 1))
                                for k in np.flatnonzero(np.diff(cuts)):
                                    # A partition's rows of a type are in original order, so
                                    # a block's rows of partition k come next in its file.
                                    sel = order[cuts[k]:cuts[k + 1]]
                                    outs[k].append(rows[sel],
                                                   int(new[sel[0]] - ntype_offsets[k, t]))
                                if leaf != "indices" and np.dtype(c.dtype).kind in "iu":
                                    ranges[f"{ntype}/{name}"] = _widen(
                                        ranges.get(f"{ntype}/{name}"), rows)
                                if leaf != "indices":
                                    meter.update(rows.shape[0])
                    except BaseException:
                        for appender in outs:         # no file left open
                            appender.file.close()
                        raise
                    for appender in outs:
                        appender.close()
                    del outs
        return {"node_data_ranges": ranges}

    # -- meta.json ----------------------------------------------------------------------

    def meta(self, seconds: float) -> PartitionMeta:
        g, p = self.graph, self.options.num_parts
        phases = self.work.state["phases"]
        _, offsets, ntype_offsets = self.numbering()
        weights = self.weights()
        loads = weights.loads(self.parts(), p)
        mean = weights.totals() / p
        balance = {name: float(loads[:, c].max() / mean[c]) if mean[c] > 0 else 1.0
                   for c, name in enumerate(weights.names)}
        node_ranges = phases["node data"]["node_data_ranges"]
        edge_ranges = phases["bucketing"]["edge_data_ranges"]

        def spec(c, bounds) -> ArraySpec:
            if c.sparse is not None:
                return ArraySpec(c.dtype, c.shape, sparse=c.sparse)
            lo, hi = bounds if bounds else (None, None)
            return ArraySpec(c.dtype, c.shape, lo, hi)
        return PartitionMeta(
            format_version=FORMAT_VERSION, graph_name=g.name, num_parts=p, method=METHOD,
            node_types=list(g.node_types), relations=[list(r) for r in g.relations],
            num_nodes=self.n, num_edges=g.num_edges,
            num_nodes_per_type=dict(g.num_nodes),
            num_edges_per_relation=self._edges_per_relation(),
            offsets=offsets.tolist(), ntype_offsets=ntype_offsets.tolist(),
            orig_type_offsets=g.type_offsets().tolist(),
            node_data={t: {name: spec(c, node_ranges.get(f"{t}/{name}"))
                           for name, c in named.items()}
                       for t, named in g.node_data.items() if named},
            edge_data={name: spec(c, edge_ranges.get(name)) for name, c in g.edge_data.items()},
            splits={t: list(named) for t, named in g.splits.items() if named},
            parts=[PartInfo(**info) for info in phases["partitions"]["parts"]],
            edge_cut_fraction=(phases["bucketing"]["cut_edges"] / g.num_edges
                               if g.num_edges else 0.0),
            balance=balance, balance_tolerance=self.options.tolerance,
            seed=self.options.seed, seconds=seconds,
            build={"phases": {name: {k: v for k, v in facts.items()
                                     if k not in ("parts", "node_data_ranges",
                                                  "edge_data_ranges")}
                              for name, facts in phases.items()},
                   "processes": 1,
                   "peak_rss_bytes": max([peak_rss_bytes()] + [facts["peak_rss_bytes"]
                                                               for facts in phases.values()]),
                   "options": dataclasses.asdict(self.options)})

    def _edges_per_relation(self) -> list[int]:
        r = len(self.graph.relations)
        if r == 1:
            return [self.graph.num_edges]
        total = np.zeros(r, np.int64)
        for k in range(self.options.num_parts):
            etype = np.load(os.path.join(part_dir(self.staging, k), "etype.npy"), mmap_mode="r")
            for a in range(0, etype.size, 1 << 24):
                total += np.bincount(etype[a:a + (1 << 24)], minlength=r)
        return total.tolist()


def _bucket_file(bucket: int, data: str | None) -> str:
    """The temporary file of one bucket's edge records (data None) or edge data array."""
    return f"{bucket:05d}.records.bin" if data is None else f"{bucket:05d}.data.{data}.bin"


def _widen(bounds, values: np.ndarray):
    """[min, max] of integer `values` together with `bounds` (None for floats)."""
    if values.dtype.kind not in "iu" or not values.size:
        return bounds
    lo, hi = int(values.min()), int(values.max())
    return [lo, hi] if bounds is None else [min(bounds[0], lo), max(bounds[1], hi)]
