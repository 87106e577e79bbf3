"""Partition a chunked graph directory in memory bounded by its nodes, not its edges.

`partition_chunked` reads a graph in the chunked format (`jgraph.data.chunked`) in
passes and writes a partition directory (`partition_graph` writes by it too: its
assignment made in memory, its graph saved chunked), holding at most
per-node arrays (degrees, the assignment, the new ids) and one chunk or one range at a
time. Phases, each recorded in the work directory `<out>.work` when it finishes, so a
killed job run again with the same command resumes after its last finished phase:

1. scan: every edge chunk once, ids checked; in-degrees and adjacency degrees.
2. adjacency: the symmetric adjacency (self-loops dropped) to temporary files, one
   CSR per node range (`jgraph.partition.adjacency`).
3. assignment: multilevel label propagation with METIS on the coarse graph, refined
   under the balance constraints (`jgraph.partition.multilevel`); the adjacency is
   deleted afterwards.
4. relabel: node_map and node_map_inv: nodes by (partition, original id).
5. bucketing: every edge, in new ids, to a temporary file of its destination's
   partition and id range (each range a bounded number of in-edges).
6. partitions: each partition's CSC built one range at a time, in (destination,
   relation, source) order, with its halo, splits and link prediction's held-out
   positives (`jgraph.partition.edge_splits`).
7. node data: every node array copied by row chunks into the partitions' files.

The partition directory is assembled inside the work directory and renamed to `out`
at the end; the work directory is then deleted, so nothing half-written is ever at
`out`.

Several processes (`jgraph.partition.group.Group`: the command under
`python -m jgraph.launch --num-processes N`, `srun` or `mpirun`) divide every phase:
process r reads every N-th edge block from the r-th, owns the r-th of N contiguous node
ranges (its degrees, adjacency rows, weights and clusters; `jgraph.partition.multilevel`
says what is exchanged), numbers its own nodes, writes the edge buckets of its blocks,
builds every N-th partition and copies every N-th block of node rows into place. They
share the work directory (one folder every process sees) and meet at the end of each
phase; the first process keeps the job's record and publishes the result.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import resource
import shutil
import time
from collections.abc import Callable

import numpy as np

import jgraph.segments as segments
from jgraph.atomic import clear_leftovers, publish
from jgraph.data.chunked import ChunkedGraph, is_chunked_dir, open_chunked
from jgraph.data.prepare import recorded_preparation
from jgraph.memory import PhasePeak, peak_rss_bytes, release_memory, rss_bytes
from jgraph.npy import NpyAppender, NpyRows, gather, preallocate, read_blocks, read_rows
from jgraph.partition import compiled
from jgraph.partition.adjacency import (
    DiskAdjacency,
    ahead,
    by_range,
    set_local,
    sort_ranges,
    write_buckets,
)
from jgraph.partition.assignment import (
    BALANCED_SPLITS,
    Method,
    assignment_dtype,
    check_given,
    check_request,
    fill_empty,
    read_assignment,
    warn_over_limits,
)
from jgraph.partition.edge_splits import write_edge_splits
from jgraph.partition.errors import PartitionError
from jgraph.partition.excess import within
from jgraph.partition.group import Group
from jgraph.partition.multilevel import (
    NODE_BLOCK,
    SAMPLE_MARGIN,
    NodeWeights,
    balance_limits,
    coarse_node_limit,
    partition,
)
from jgraph.partition.numbering import (
    owner_of,
    part_info,
    partition_meta,
    ranges_of,
)
from jgraph.partition.store import (
    ASSIGNMENT,
    ArraySpec,
    PartInfo,
    PartitionMeta,
    part_dir,
    read_meta,
    write_meta,
)
from jgraph.partition.work import Work
from jgraph.progress import Progress

WORK = ".work"


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of the job: its name (in meta.json, the work record and the plan), the
    `_Job` method that runs it, and the work directory's folders that no later phase
    reads, removed once it is recorded."""

    name: str
    run: str
    leftovers: tuple[str, ...] = ()


JOB = (Phase("scan", "scan"), Phase("adjacency", "adjacency"),
       Phase("assignment", "assignment", leftovers=("adjacency", "coarse")),
       Phase("relabel", "relabel"), Phase("bucketing", "bucketing"),
       Phase("partitions", "partitions", leftovers=("buckets",)),
       Phase("node data", "node_data"))
PHASES = tuple(phase.name for phase in JOB)
# Node data rows copied, and edges read, at a time by one process (a chunk of any size
# is read a block at a time, so a phase's memory does not follow how the input was
# chunked); `block_sizes` divides them among processes, down to the second pair.
ROWS_PER_BLOCK, EDGES_PER_BLOCK = 1 << 20, 1 << 22
MIN_ROWS_PER_BLOCK, MIN_EDGES_PER_BLOCK = 1 << 16, 1 << 18
# A split's node ids mapped to new ids and written this many nodes' worth at a time.
SPLIT_BLOCK = 1 << 22
IDENTITY_VERSION = 4
# The largest coarse graph METIS partitions by default (adjacency entries), for one
# process; `coarse_limit` divides it among processes, down to the second.
COARSE_ENTRIES, MIN_COARSE_ENTRIES = 1 << 25, 1 << 22
# The same for the node ranges (`range_limit`): the adjacency and in-edges per range.
RANGE_ENTRIES, MIN_RANGE_ENTRIES = 1 << 25, 1 << 22


@dataclasses.dataclass(frozen=True)
class ChunkedOptions:
    """How `partition_chunked` works; part of a job's identity (a resumed job must
    have the same).

    Fields:
      num_parts, seed, tolerance: as for `partition_graph`.
      range_entries: adjacency entries (and in-edges) per node range on disk: the
        largest block a phase holds; None: `range_limit(processes)`.
      coarse_entries: the largest coarse graph METIS partitions (adjacency entries);
        None: `coarse_limit(processes)`, which falls as processes are added.
      assignment: a file of each node's partition, made elsewhere
        (`jgraph.partition.assignment.read_assignment`), used as given: the adjacency
        phase is skipped and the assignment phase reads it.
    """

    num_parts: int
    seed: int = 0
    tolerance: float = 0.05
    range_entries: int | None = None
    coarse_entries: int | None = None
    assignment: str | None = None

    def resolved(self, processes: int) -> ChunkedOptions:
        """These options with the defaults for `processes` processes filled in."""
        return dataclasses.replace(
            self, range_entries=self.range_entries or range_limit(processes),
            coarse_entries=self.coarse_entries or coarse_limit(processes))

    def __post_init__(self):
        if self.assignment is not None:
            object.__setattr__(self, "assignment", os.path.realpath(self.assignment))
        for name, least in (("num_parts", 1), ("range_entries", 1 << 10),
                            ("coarse_entries", 1 << 10)):
            value = getattr(self, name)
            if value is None and name != "num_parts":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < least:
                raise PartitionError(f"{name} (--{name.replace('_', '-')}) must be an "
                                     f"integer >= {least}, got {value!r}")


def _share(processes: int) -> int:
    """What a budget of one process is divided by for each of `processes` processes:
    1 for one, 2N for N. Each of N processes also holds arrays of every node that do
    not divide (a level's cluster of every node, every node's partition, the inverse
    map's pages), so 1/N of the budgets would leave it above half of one process's
    peak; 1/(2N) brings it under (docs/benchmarks.md: 0.45 of one process at 4)."""
    return 1 if processes <= 1 else 2 * processes


def range_limit(processes: int = 1) -> int:
    """The default `range_entries`: RANGE_ENTRIES for one process, 1/(2N) of it for N
    (`_share`; at least MIN_RANGE_ENTRIES): the ranges and blocks a phase holds."""
    return max(RANGE_ENTRIES // _share(processes), MIN_RANGE_ENTRIES)


def coarse_limit(processes: int = 1) -> int:
    """The default `coarse_entries`: COARSE_ENTRIES for one process, 1/(2N) of it for
    N (`_share`; at least MIN_COARSE_ENTRIES). Every process runs METIS on its share of
    the samples of the coarsest graph (`multilevel.metis_trials`: at least three, one
    per process), at about 40 bytes an entry (`jgraph.partition.plan`); with more
    processes each sample is smaller and there are more of them."""
    return max(COARSE_ENTRIES // _share(processes), MIN_COARSE_ENTRIES)


def block_sizes(processes: int = 1) -> tuple[int, int]:
    """(edges, node data rows) a process reads at a time: EDGES_PER_BLOCK and
    ROWS_PER_BLOCK for one process, 1/(2N) of them for each of N (`_share`; at least
    MIN_EDGES_PER_BLOCK and MIN_ROWS_PER_BLOCK), as the budgets are: a block and what
    a phase makes of it (some 80 bytes an edge when bucketing) were 0.3 GiB of each of 4
    processes' 0.7 on the 100M-edge R-MAT. More blocks cost nothing but their count:
    every process still reads its share of the edges once a pass."""
    share = _share(processes)
    return (max(EDGES_PER_BLOCK // share, min(EDGES_PER_BLOCK, MIN_EDGES_PER_BLOCK)),
            max(ROWS_PER_BLOCK // share, min(ROWS_PER_BLOCK, MIN_ROWS_PER_BLOCK)))


def bounded_route(path, method) -> bool:
    """Whether a dataset goes through `partition_chunked`: a chunked graph directory,
    with the multilevel method or none named (`Method` or its value)."""
    method = getattr(method, "value", method)
    return is_chunked_dir(path) and method in (None, Method.MULTILEVEL.value)


def train_nodes(graph: ChunkedGraph) -> int:
    """The largest train split of any node type, from the metadata alone."""
    return max((named["train"].num_rows for named in graph.splits.values()
                if "train" in named), default=0)


def partition_chunked(input_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      options: ChunkedOptions, *, overwrite: bool = False,
                      progress: Progress | None = None,
                      check_out: Callable[[str, bool], None] | None = None,
                      group: Group | None = None, method: Method | None = None,
                      started: float | None = None) -> PartitionMeta:
    """Partition the chunked graph at `input_dir` into `options.num_parts` and write the
    partition directory `out_dir` (see the module docstring). `check_out(out,
    overwrite)` raises unless `out` may receive a partition (checked before and at the
    end). `group`: the processes of the job (every one calls this with the same
    arguments). method: what made `options.assignment` where the caller made it
    (`partition_graph`: METIS in memory), meta.json's method; None: "given". started:
    `time.perf_counter()` when the caller's work began (meta.json's seconds). Returns
    the metadata written to meta.json, whose `build` field holds each phase's seconds
    and peak RSS."""
    start = time.perf_counter() if started is None else started
    group = group or Group.single()
    options = options.resolved(group.size)
    progress = progress if progress is not None and group.leader else Progress(enabled=False)
    graph = open_chunked(input_dir)
    _check_request(graph, options, group)
    out = os.path.realpath(os.fspath(out_dir))
    if group.leader:
        clear_leftovers(out)            # what killed writes of `out` left beside it
        if check_out is not None:
            check_out(out, overwrite)
    identity = {"input": os.path.realpath(graph.root),
                "files": _stamp(graph) + _file_stamps([options.assignment]
                                                      if options.assignment else []),
                "options": dataclasses.asdict(options), "processes": group.size,
                "version": IDENTITY_VERSION}
    work = Work(out + WORK, identity, progress, group)
    _open_files_for(graph, options)
    if group.leader:
        try:
            check_disk(graph, options, os.path.dirname(out),
                       already=_bytes_under(work.root))
        except PartitionError:
            if not work.state["phases"]:
                shutil.rmtree(work.root, ignore_errors=True)  # nothing begun: nothing left
            raise
    group.use_scratch(work.path("sync"))
    staging = work.path("out")
    if group.leader:
        os.makedirs(staging, exist_ok=True)
        os.makedirs(work.path("sync"), exist_ok=True)
    group.barrier("checked")
    job = _Job(graph, options, work, staging, progress, group, method)
    for name, run, leftovers in ((p.name, getattr(job, p.run), p.leftovers) for p in JOB):
        if not work.done(name):
            with progress.phase(name), PhasePeak() as peak:
                began = time.perf_counter()
                facts = run() or {}
            release_memory()
            peaks = [int(p) for p in group.gather(peak.peak, f"{name} peak")]
            starts = [int(p) for p in group.gather(peak.start, f"{name} start")]
            # The work directory's bytes at the phase's end, or where the phase held more
            # before removing files of its own (`disk_peak_bytes`): what `plan` estimates.
            # Measured by the first process while the others wait (none removes a file).
            facts["disk_bytes"] = max(_bytes_under(work.root) if group.leader else 0,
                                      facts.pop("disk_peak_bytes", 0))
            group.barrier(f"{name} disk measured")
            work.finish(name, time.perf_counter() - began, peaks, starts, **facts)
        # What a finished phase leaves behind for no later one goes only once it is
        # recorded (again on a resume: a job killed while deleting it resumes).
        if group.leader:
            for leftover in leftovers:
                shutil.rmtree(work.path(leftover), ignore_errors=True)
    if not group.leader:
        group.barrier("published")
        return read_meta(out)
    meta = job.meta(time.perf_counter() - start)
    shutil.copyfile(work.path("parts.npy"), os.path.join(staging, ASSIGNMENT))
    for t, (file, _) in graph.ids.items():      # the user's ids, as they are
        os.makedirs(os.path.join(staging, "ids"), exist_ok=True)
        shutil.copyfile(graph.path(file), os.path.join(staging, "ids", f"{t}.npy"))
    write_meta(staging, meta)
    if check_out is not None:
        check_out(out, overwrite)
    work.publishing()           # a job found in this state later starts over
    publish(staging, out)
    shutil.rmtree(work.root, ignore_errors=True)
    group.barrier("published")
    return meta


def _memory_since_last() -> str:
    """The memory held now and at most since the last log line, for a log line."""
    now = rss_bytes() / 2**30
    if PhasePeak.current is None:
        return f"{now:.2f} GiB"
    return f"{now:.2f} GiB, at most {PhasePeak.current.since_last() / 2**30:.2f}"


def _edge_order(block: np.ndarray) -> np.ndarray:
    """The order of a bucket's edge records (`_record`) by (destination, relation,
    source), equal ones in edge-id order however the processes' blocks interleaved.
    One sort of 64-bit keys where the three fit in one, several times faster than
    sorting by four keys, which remains for the rest; the records of repeated edges (a
    multigraph's) are then put in edge-id order among themselves."""
    if not block.size:
        return np.zeros(0, np.int64)
    bits = [int(block[name].max()).bit_length() for name in ("dst", "etype", "src")]
    if sum(bits) > 63:
        return np.lexsort((block["eid"], block["src"], block["etype"], block["dst"]))
    key = ((block["dst"].astype(np.int64) << (bits[1] + bits[2]))
           | (block["etype"].astype(np.int64) << bits[2]) | block["src"].astype(np.int64))
    order = np.argsort(key)
    key = key[order]
    repeat = np.zeros(key.size, bool)                   # in a run of equal keys
    same = key[1:] == key[:-1]
    repeat[1:] |= same
    repeat[:-1] |= same
    if repeat.any():
        # The runs are whole and in key order: their records sorted by (key, edge id)
        # take the same places.
        runs = order[repeat]
        order[repeat] = runs[np.lexsort((block["eid"][runs], key[repeat]))]
    return order


def _stamp(graph: ChunkedGraph) -> list:
    """The input's identity: metadata.json's and every chunk file's size and time (a
    stat a file), so a job does not resume over an input changed since it began."""
    return _file_stamps([os.path.join(graph.root, "metadata.json")] + [
        graph.path(f) for c in graph.all_chunks() for f in (*c.files, *c.value_files)])


def _file_stamps(paths: list[str]) -> list:
    """[count, total size, latest modification] of the files `paths`."""
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
    # (The held-out edges are written with their five arrays of every partition open.)
    need = max(ranges * (1 + len(graph.edge_data)),
               5 * options.num_parts if graph.edge_splits else 0) + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise PartitionError(f"partitioning {graph.root} keeps about {need} files open "
                                 f"and the open-file limit is {hard}: raise it (ulimit -n), "
                                 f"or give a larger --range-entries")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _check_request(graph: ChunkedGraph, options: ChunkedOptions, group: Group) -> None:
    p = options.num_parts
    if group.size > graph.total_nodes:
        raise PartitionError(f"{group.size} processes for a graph of {graph.total_nodes} "
                             f"nodes: each process must own at least one node")
    check_request(graph, p, options.tolerance)
    if options.assignment is not None:      # refused before any phase, naming the file
        check_given(Method.GIVEN, read_assignment(options.assignment), graph.total_nodes, p,
                    what=f"--assignment {options.assignment}")


def estimate_disk(num_nodes: int, num_edges: int, node_data_bytes: int,
                  edge_data_bytes: int, num_parts: int,
                  coarse_entries: int = COARSE_ENTRIES, edge_split_bytes: int = 0,
                  split_ids: int | None = None, given: bool = False) -> dict[str, int]:
    """Bytes of disk a job needs: the parts (the temporary adjacency: its bucket
    records, then one CSR per range; the coarse graphs; the edge buckets; the partition
    directory itself: CSC, edge ids, edge data, node data, node maps), each phase's
    peak in the work directory (`phases`: a list in `PHASES` order, every file then on
    disk counted) and the job's `peak`. split_ids: the node ids of every split together
    (None: at most one a node); given: the assignment is given (no adjacency, no coarse
    graphs)."""
    n, e = num_nodes, num_edges
    ids = 4 if n < 2**31 else 8
    # The adjacency's bucket records while they are written; then its CSR, an index an
    # entry (fewer where repeated pairs are stored once) and an offset a node; and
    # beside both, every node's id in it.
    adjacency = 0 if given else 2 * e * (4 + ids) + ids * n
    sorted_adjacency = 0 if given else 2 * e * ids + 8 * n + ids * n
    # At most SAMPLE_MARGIN x coarse_entries entries a coarse level (sampled beyond),
    # and a cycle's levels kept until it ends, each a CSR of an int32 index and a
    # weight in the narrowest width that holds it (5-8 bytes an entry): the assignment
    # is fullest when the last level's bucket records (16 bytes an entry) are written
    # beside the levels before, some 28 bytes an entry of the largest level in all (the
    # 1B-edge R-MAT at one process: 141M, 124M, 61M and 55M entries, 12.6 GiB
    # measured, 12.8 planned; 14.0 measured with int64 weights. The 100M-edge one:
    # 4.01 GiB measured, 4.44 planned).
    coarse = 0 if given else (16 + 12) * min(2 * e, SAMPLE_MARGIN * coarse_entries)
    buckets = e * (ids + 4 + 4 + 8 + edge_data_bytes)
    # The CSC (indices, etype, edge ids, edge data; indptr), the node maps, the splits,
    # the halos (a node at most once a part, an in-edge at most once), node data, link
    # prediction's held-out edges (`edge_split_bytes`), and a page of small files a
    # partition.
    output = (e * (8 + 4 + 8 + edge_data_bytes) + 8 * (n + num_parts) + n * 16
              + 8 * (n if split_ids is None else split_ids)
              + 8 * min(num_parts * n, e) + node_data_bytes + edge_split_bytes
              + num_parts * 4096)
    # Kept from the scan on: in-degrees and degrees (int64); from the assignment on,
    # each node's partition (int16); from the relabelling on, the node maps (in `output`).
    # (Several processes add their counts into the same two files: `_Job.scan`.)
    degrees, parts, maps = 16 * n, 2 * n, 16 * n
    # And some 16 KiB of .npy headers and the job's record, whatever the graph.
    phases = [(16 << 10) + held for held in (
        degrees, degrees + adjacency, degrees + sorted_adjacency + coarse + parts,
        degrees + parts + maps, degrees + parts + maps + buckets,
        degrees + parts + buckets + output - node_data_bytes, degrees + parts + output)]
    return {"adjacency": adjacency, "coarse": coarse, "buckets": buckets, "output": output,
            "phases": phases, "peak": max(phases)}


def edge_split_bytes(graph: ChunkedGraph) -> int:
    """The bytes link prediction's held-out edges take in the partitions: eid, src, dst
    (int64), etype (int32) and K negatives (int64) a positive."""
    return sum(arrays["src"].num_rows * (28 + 8 * (arrays["negatives"].shape[0]
                                                  if "negatives" in arrays else 0))
               for arrays in graph.edge_splits.values())


def count_split_ids(graph: ChunkedGraph) -> int:
    """The node ids of every split of every node type together."""
    return sum(c.num_rows for named in graph.splits.values() for c in named.values())


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
                         options.coarse_entries, edge_split_bytes(graph),
                         count_split_ids(graph), given=options.assignment is not None)
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
    """The phases of one `partition_chunked` call, run by every process of `group`;
    each reads what earlier phases left in the work directory, so any of them can be
    the first of a resumed job."""

    def __init__(self, graph: ChunkedGraph, options: ChunkedOptions, work: Work,
                 staging: str, progress: Progress, group: Group,
                 method: Method | None = None):
        self.graph, self.options, self.work, self.staging = graph, options, work, staging
        self.progress, self.group = progress, group
        if method is not None and not options.assignment:
            raise ValueError(f"method {method.value!r} names who made an assignment; "
                             f"give the assignment (options.assignment)")
        self.method = (method or (Method.GIVEN if options.assignment
                                  else Method.MULTILEVEL)).value
        self.n = graph.total_nodes
        self.num_types = len(graph.node_types)
        self.ids = np.int32 if self.n < 2**31 else np.int64
        self.lo, self.hi = group.nodes(self.n)        # this process's nodes

    # -- phase 1 ------------------------------------------------------------------------

    def _edge_blocks(self) -> list[tuple[int, slice]]:
        """(chunk, rows) of every edge block, in order: this process takes every N-th."""
        g, size = self.graph, block_sizes(self.group.size)[0]
        return [(i, slice(a, min(a + size, rows)))
                for i, rows in enumerate(g.edges["src"].rows) for a in range(0, rows, size)]

    def _edge_pass(self, desc: str, rounds: bool = False):
        """(chunk, rows, edges) of this process's edge blocks: every N-th, from its rank.
        rounds: then None until every process has had as many items (the most blocks
        any process has), for a pass whose every block meets the other processes'."""
        blocks = self._edge_blocks()
        mine = [block for b, block in enumerate(blocks) if self.group.mine(b)]
        meter = self.progress.meter(desc, sum(r.stop - r.start for _, r in mine), "edges")
        for i, rows in mine:
            chunk = self.graph.edge_chunk(i, True, rows)
            yield i, rows, chunk
            meter.update(chunk.src.size)
        if rounds:
            for _ in range(-(-len(blocks) // self.group.size) - len(mine)):
                yield None

    def _node_array(self, name: str, dtype, shape=()) -> str:
        """A work file over every node, preallocated by the first process."""
        path = self.work.path(f"{name}.npy")
        if self.group.leader:
            preallocate(path, dtype, (self.n, *shape))
        return path

    def scan(self) -> dict:
        n, group = self.n, self.group
        for t, named in self.graph.splits.items():   # sorted, unique, in range
            for name, chunks in named.items():      # each process a share of the chunks
                self.graph.check_split(t, name, [i for i in range(len(chunks.files))
                                                 if group.mine(i)])
        if group.size == 1:
            counts, loops = self._degrees(0, n, "scan (pass 1 of 3 over the edges)")
            for row, name in enumerate(("in_degree", "degree")):    # int64, a block at a time
                out = NpyAppender(self.work.path(f"{name}.npy"), np.int64, (n,))
                for a in range(0, n, SPLIT_BLOCK):
                    out.append(counts[row, a:a + SPLIT_BLOCK])
                out.close()
            return {"self_loops": loops}
        # In turn j, process r counts its blocks' edges at the nodes of process
        # (r + j) mod N and adds them into the sums: the N processes write N disjoint
        # ranges at once, and each holds the counts of one process's nodes, not of every
        # node (N passes over its blocks, each 1/N of the edges).
        paths = [self._node_array(name, np.int64) for name in ("in_degree", "degree")]
        group.barrier("scan sums allocated")
        loops = 0
        for turn in range(group.size):
            lo, hi = group.nodes(n, (group.rank + turn) % group.size)
            counts, loops_here = self._degrees(
                lo, hi, f"scan (pass 1 of 3 over the edges, turn {turn + 1} of {group.size})")
            loops += loops_here
            for row, path in enumerate(paths):
                out = NpyRows(path)
                for a, before in read_blocks(path, lo, hi, SPLIT_BLOCK):
                    out.write(a, before + counts[row, a - lo:a - lo + before.size])
                out.close()
            del counts
            group.barrier(f"scan sums, turn {turn}")
        return {"self_loops": int(group.sum(loops, "self-loops"))}

    def _degrees(self, lo: int, hi: int, desc: str) -> tuple[np.ndarray, int]:
        """(int32 or int64 [2, hi - lo]: the in-degree and the adjacency degree of nodes
        [lo, hi) over this process's edge blocks, the self-loops among them)."""
        # A count below 2^31 when this process's blocks hold fewer edges than that.
        mine = -(-self.graph.num_edges // self.group.size) + block_sizes(self.group.size)[0]
        counts = np.zeros((2, hi - lo), np.int32 if 2 * mine < 2**31 else np.int64)
        loops = 0
        # Degree = in-degree + out-degree - 2 per self-loop: two counting passes over a
        # block, not three (each is a random access per edge into [n]).
        for _, _, chunk in self._edge_pass(desc):
            compiled.count_into(counts[0], chunk.dst, lo)
            compiled.count_into(counts[1], chunk.src, lo)
            loop = (chunk.src == chunk.dst) & (chunk.src >= lo) & (chunk.src < hi)
            if loop.any():
                np.subtract.at(counts[1], chunk.src[loop] - lo, 2)
                loops += int(loop.sum())
        counts[1] += counts[0]
        return counts, loops

    # -- phase 2 ------------------------------------------------------------------------

    # Where label propagation runs, the adjacency numbers each process's nodes by rising
    # degree (ties in the input's order). Label propagation and contraction gather, for
    # every entry, the partition or cluster of its neighbour from an array over every
    # node, and most entries point at the few well-connected nodes: numbered last, they
    # share a few cache lines instead of lying all over the array. On a 2^24-node R-MAT
    # with shuffled ids a refinement pass's kernel took 13.2 ns an entry against 21.6,
    # clustering's 16.3 against 28.0. Label propagation then visits the least connected
    # nodes first, as KaMinPar's clustering does (falling degree cut 1.12x METIS on the
    # quality gate's one-type graph, rising 0.99x). The assignment is mapped back to the
    # input's ids as it is written.

    @functools.cached_property
    def _by_degree(self) -> bool:
        """Whether the adjacency numbers nodes by degree: not where METIS partitions the
        whole of it (no label propagation), which then cuts as `--method metis` does.
        Known once the scan has written the degrees."""
        options = self.options
        entries = sum(int(block.sum()) for _, block in
                      read_blocks(self.work.path("degree.npy"), 0, self.n, SPLIT_BLOCK))
        return (entries > options.coarse_entries
                or self.n > coarse_node_limit(options.coarse_entries, options.num_parts))

    def _renumbering(self) -> str:
        return os.path.join(self.work.path("adjacency"), "renumber.npy")

    def _adjacency_bounds(self) -> tuple[np.ndarray, list[int]]:
        """(int64[R + 1] node ranges of the adjacency, in its numbering, none across two
        processes' nodes; the index of each process's first range, and R). Each process
        cuts its own nodes into ranges; every process calls it."""
        ordered = read_rows(self.work.path("degree.npy"), self.lo, self.hi)
        if self._by_degree:
            ordered.sort()
        mine = self.lo + segments.range_bounds(ordered, self.options.range_entries)[1:]
        del ordered
        every = self.group.gather(mine, "adjacency ranges")
        bounds = np.concatenate([np.zeros(1, np.int64), *every])
        firsts = np.concatenate([[0], np.cumsum([b.size for b in every])])
        return bounds, [int(f) for f in firsts]

    def _write_renumbering(self) -> np.ndarray:
        """Every node's id in the adjacency (`ids`[n], from its input id), each process
        writing its own nodes' into the adjacency's folder."""
        lo, hi, group = self.lo, self.hi, self.group
        mine = np.arange(lo, hi, dtype=self.ids)
        if self._by_degree:
            degree = read_rows(self.work.path("degree.npy"), lo, hi)
            mine[np.argsort(degree, kind="stable")] = mine.copy()
        path = self._renumbering()
        if group.size == 1:
            np.save(path, mine)
            return mine
        if group.leader:
            preallocate(path, self.ids, (self.n,))
        group.barrier("renumbering allocated")
        out = NpyRows(path)
        out.write(lo, mine)
        out.close()
        del mine
        group.barrier("renumbering written")
        return np.load(path)

    def adjacency(self) -> dict:
        if self.options.assignment:
            return {"skipped": "the assignment is given"}
        bounds, firsts = self._adjacency_bounds()
        root = self.work.path("adjacency")
        if self.group.leader:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
        self.group.barrier("adjacency folder")

        # Each block's entries in the adjacency's ids, made in the threads that group
        # them (`write_buckets`).
        chunks = (chunk for _, _, chunk in self._edge_pass(
            "adjacency (pass 2 of 3 over the edges)"))
        write_buckets(root, self.n, bounds, chunks, merge=False, writer=self.group.rank,
                      entries=functools.partial(_both_ways, self._write_renumbering()))
        self.group.barrier("adjacency buckets written")
        # Every entry's record, before the sort: the first process measures.
        held = _bytes_under(self.work.root) if self.group.leader else 0
        self.group.barrier("adjacency disk measured")
        a, b = firsts[self.group.rank], firsts[self.group.rank + 1]
        adjacency = sort_ranges(root, self.n, bounds[a:b + 1], merge=False,
                                writers=self.group.size, first=a)
        return {"ranges": int(bounds.size - 1),
                "entries": int(self.group.sum(adjacency.num_entries, "entries")),
                "disk_peak_bytes": held}

    # -- phase 3 ------------------------------------------------------------------------

    def weights(self, lo: int = 0, hi: int | None = None) -> NodeWeights:
        """The balance constraints of `jgraph.partition.assignment.constraints_for`, in
        compact columns, of the nodes [lo, hi) (all by default)."""
        g, offsets = self.graph, self.graph.type_offsets()
        hi = self.n if hi is None else hi
        names, columns = [], []
        for t, ntype in enumerate(g.node_types):
            names.append("nodes" if self.num_types == 1 else f"nodes:{ntype}")
            column = np.zeros(hi - lo, np.uint8)
            column[max(offsets[t] - lo, 0):max(offsets[t + 1] - lo, 0)] = 1
            columns.append(column)
        for split in BALANCED_SPLITS:
            member = np.zeros(hi - lo, np.uint8)
            for t, ntype in enumerate(g.node_types):
                if split in g.splits.get(ntype, {}):         # those of [lo, hi) alone
                    ids = offsets[t] + g.split(ntype, split, max(lo - offsets[t], 0),
                                               max(hi - offsets[t], 0))
                    member[ids - lo] = 1
            if any(split in named and named[split].num_rows
                   for named in g.splits.values()):
                names.append(split)
                columns.append(member)
        names.append("edges")
        columns.append(read_rows(self.work.path("in_degree.npy"), lo, hi))
        return NodeWeights(tuple(names), tuple(columns))

    def assignment(self) -> dict:
        if self.options.assignment:
            if self.group.leader:
                np.save(self.work.path("parts.npy"),
                        self.given().astype(assignment_dtype(self.options.num_parts)))
            # A caller's own (`partition_graph`) is in a scratch folder that goes.
            return ({"given": self.options.assignment} if self.method == Method.GIVEN.value
                    else {"made": self.method})
        _, firsts = self._adjacency_bounds()
        adjacency = DiskAdjacency.open(self.work.path("adjacency"), firsts[self.group.rank])
        if adjacency is None:
            raise PartitionError(f"{self.work.path('adjacency')}: the adjacency phase's "
                                 f"files are missing; delete {self.work.root} to start over")
        coarse = self.work.path("coarse")
        if self.group.leader:
            shutil.rmtree(coarse, ignore_errors=True)
            os.makedirs(coarse)
        self.group.barrier("coarse folder")
        began = time.perf_counter()
        held = 0                # the work directory at its largest: a level's buckets written

        def measure() -> None:
            nonlocal held
            if self.group.leader:
                held = max(held, _bytes_under(self.work.root))
        weights = self.weights(self.lo, self.hi)
        mine = np.load(self._renumbering(), mmap_mode="r")[self.lo:self.hi] - self.lo
        weights = NodeWeights(weights.names, tuple(_scattered(column, mine)
                                                   for column in weights.columns))
        del mine
        parts, stats = partition(adjacency, weights,
                                 self.options.num_parts, tolerance=self.options.tolerance,
                                 seed=self.options.seed,
                                 coarse_entries=self.options.coarse_entries, workdir=coarse,
                                 range_entries=self.options.range_entries,
                                 group=self.group, on_written=measure,
                                 log=lambda message: self.progress.note(
                                     f"{message} [{time.perf_counter() - began:.0f}s, "
                                     f"{_memory_since_last()}]"))
        if self.group.leader:
            parts = parts.astype(assignment_dtype(self.options.num_parts))[
                np.load(self._renumbering())]                   # in the input's ids
            np.save(self.work.path("parts.npy"), fill_empty(parts, self.options.num_parts))
        return {"levels": list(stats.level_nodes), "coarse_entries": stats.coarse_entries,
                "coarse_sparsified": stats.sparsified, "disk_peak_bytes": held}

    def given(self) -> np.ndarray:
        """The assignment of `options.assignment`, checked against the graph."""
        return check_given(Method.GIVEN, read_assignment(self.options.assignment), self.n,
                           self.options.num_parts, what=f"--assignment "
                                                        f"{self.options.assignment}")

    # -- phase 4 ------------------------------------------------------------------------

    def parts(self, mmap: bool = False) -> np.ndarray:
        """Every node's partition (int16 where the part count allows)."""
        return np.load(self.work.path("parts.npy"), mmap_mode="r" if mmap else None)

    def relabel(self) -> dict:
        """New ids: partition by partition, each partition's nodes in original order
        (`jgraph.partition.numbering`). Each process numbers its own nodes,
        which come after the earlier processes' in every partition."""
        group, p, t = self.group, self.options.num_parts, self.num_types
        lo, hi = self.lo, self.hi
        parts = np.asarray(self.parts(mmap=True)[lo:hi]).astype(np.int64)
        type_ids = (segments.segment_of(self.graph.type_offsets(), np.arange(lo, hi))
                    if t > 1 else 0)
        counts = np.bincount(parts * t + type_ids, minlength=p * t).reshape(p, t)
        every = np.stack(group.gather(counts, "relabel counts"))          # [N, P, T]
        total = every.sum(axis=0)
        offsets, _ = ranges_of(total)
        base = offsets[:-1] + every[:group.rank].sum(axis=(0, 2))        # [P]
        order, firsts = segments.group_by(parts, p)
        paths = [os.path.join(self.staging, f"{name}.npy") for name in ("node_map",
                                                                        "node_map_inv")]
        if group.leader:
            for path in paths:
                preallocate(path, np.int64, (self.n,))
            np.save(self.work.path("counts.npy"), total)
        group.barrier("node maps allocated")
        node_map, inverse = (NpyRows(path) for path in paths)
        new = np.empty(hi - lo, np.int64)
        for k in range(p):
            run = order[firsts[k]:firsts[k + 1]]
            new[run] = base[k] + np.arange(run.size)
            node_map.write(int(base[k]), lo + run)
        inverse.write(lo, new)
        node_map.close()
        inverse.close()
        return {}

    def numbering(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(counts int64[P, T], offsets int64[P + 1], ntype_offsets int64[P, T + 1])."""
        counts = np.load(self.work.path("counts.npy"))
        return (counts, *ranges_of(counts))

    def inverse(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The new ids of nodes [lo, hi) (every node's by default), in the smallest
        integer type that holds them."""
        hi = self.n if hi is None else hi
        out = np.empty(hi - lo, self.ids)
        for a, block in read_blocks(os.path.join(self.staging, "node_map_inv.npy"), lo, hi,
                                    SPLIT_BLOCK):
            out[a - lo:a - lo + block.size] = block
        return out

    # -- phase 5 ------------------------------------------------------------------------

    def _record(self) -> np.dtype:
        return np.dtype([("src", self.ids), ("dst", np.int32), ("etype", np.int32),
                         ("eid", np.int64)])

    def _in_degrees(self, nodes) -> np.ndarray:
        """int64: the in-degrees of `nodes` (original ids, ascending: a partition's, in
        new-id order), read block by block (`gather`), not mapped whole."""
        return gather(self.work.path("in_degree.npy"), np.asarray(nodes)).astype(np.int64)

    def bucket_bounds(self) -> np.ndarray:
        """int64[B + 1]: ranges of new ids, none across a partition boundary, each with
        at most about `range_entries` in-edges."""
        _, offsets, _ = self.numbering()
        node_map = os.path.join(self.staging, "node_map.npy")
        bounds = [np.zeros(1, np.int64)]
        for k in range(self.options.num_parts):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            degree = self._in_degrees(read_rows(node_map, lo, hi))
            bounds.append(lo + segments.range_bounds(degree, self.options.range_entries)[1:])
        return np.concatenate(bounds)

    def bucketing(self) -> dict:
        group = self.group
        root = self.work.path("buckets")
        if group.leader:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            np.save(self.work.path("buckets.npy"), self.bucket_bounds())
        group.barrier("bucket bounds")
        bounds = np.load(self.work.path("buckets.npy"))
        _, offsets, _ = self.numbering()
        # Each process holds its own nodes' new ids and asks the others' of their owners,
        # a block's ends at a time (every process meets the others once a block).
        own = self.inverse(self.lo, self.hi)
        owners = [group.nodes(self.n, r)[0] for r in range(group.size)] + [self.n]
        record = self._record()
        names = list(self.graph.edge_data)
        cut = 0
        ranges = dict.fromkeys(names)

        def grouped(item):              # in a thread, while the last block is written
            if item is None:            # this process has no block left: it answers
                group.look_up(np.zeros(0, self.ids), own, owners, "bucketing ids")
                return None
            i, rows, chunk = item
            new = group.look_up(np.concatenate([chunk.src, chunk.dst]).astype(self.ids),
                                own, owners, "bucketing ids")
            new_src, new_dst = new[:chunk.src.size], new[chunk.src.size:]
            del new
            cut_here = int((segments.segment_of(offsets, new_src)
                            != segments.segment_of(offsets, new_dst)).sum())
            order, cuts = by_range(bounds, new_dst)
            block = np.empty(order.size, record)
            block["src"] = new_src[order]
            del new_src
            set_local(block["dst"], new_dst[order], bounds, cuts)
            del new_dst
            block["etype"] = chunk.etype[order]
            block["eid"] = chunk.start + order
            data = {name: np.asarray(self.graph.load(self.graph.edge_data[name].files[i])
                                     [rows])[order] for name in names}
            return cut_here, block, cuts, data
        with contextlib.ExitStack() as stack:
            files = {(b, key): stack.enter_context(
                         open(os.path.join(root, _bucket_file(b, key, group.rank)), "wb"))
                     for b in range(bounds.size - 1) for key in [None, *names]}
            # One thread: a second made the phase a tenth faster for a block's memory.
            for done in ahead(grouped, self._edge_pass("bucketing (pass 3 of 3 over the "
                                                       "edges)", rounds=True), workers=1):
                if done is None:
                    continue
                cut_here, block, cuts, data = done
                cut += cut_here
                for name, values in data.items():
                    ranges[name] = _widen(ranges[name], values)
                for b in np.flatnonzero(np.diff(cuts)):
                    block[cuts[b]:cuts[b + 1]].tofile(files[b, None])
                    for name, values in data.items():
                        np.ascontiguousarray(values[cuts[b]:cuts[b + 1]]).tofile(files[b, name])
        every = group.gather(np.array(json.dumps(ranges)), "edge data ranges")
        for other in every:
            for name, bound in json.loads(str(other)).items():
                ranges[name] = _widen(ranges[name], np.asarray(bound or [], np.int64))
        return {"cut_edges": int(group.sum(cut, "cut")),
                "edge_data_ranges": {k: v for k, v in ranges.items() if v is not None}}

    # -- phase 6 ------------------------------------------------------------------------

    def _bucket(self, b: int, data: str | None, dtype, shape=()) -> np.ndarray:
        """Bucket b's records (data None) or edge data, every process's file in turn."""
        root = self.work.path("buckets")
        return np.concatenate([np.fromfile(os.path.join(root, _bucket_file(b, data, r)),
                                           dtype).reshape(-1, *shape)
                               for r in range(self.group.size)])

    def partitions(self) -> dict:
        g, p, group = self.graph, self.options.num_parts, self.group
        counts, offsets, _ = self.numbering()
        bounds = np.load(self.work.path("buckets.npy"))
        node_map = os.path.join(self.staging, "node_map.npy")
        record = self._record()
        halo_mark = np.zeros(self.n, bool)
        infos = {}
        mine = [k for k in range(p) if group.mine(k)]
        meter = self.progress.meter("writing partitions", len(mine), "partitions")
        spans = {k: range(*np.searchsorted(bounds, offsets[k:k + 2])) for k in mine}

        def sorted_bucket(b):           # in a thread, while the bucket before is written
            block = self._bucket(b, None, record)
            order = _edge_order(block)
            # field by field: numpy gathers records of a structured dtype a copy a record
            return ({field: block[field][order] for field in ("src", "etype", "eid")},
                    {name: self._bucket(b, name, c.dtype, c.shape)[order]
                     for name, c in g.edge_data.items()})
        buckets = ahead(sorted_bucket, (b for k in mine for b in spans[k]), workers=1)
        for k in mine:
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            d = part_dir(self.staging, k)
            os.makedirs(d, exist_ok=True)
            degree = self._in_degrees(read_rows(node_map, lo, hi))
            indptr = segments.offsets(degree)
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
            for b in spans[k]:
                block, data = next(buckets)
                at = int(indptr[bounds[b] - lo])       # buckets in order: appended
                out["indices"].append(block["src"], at)
                out["etype"].append(block["etype"], at)
                out["edge_ids"].append(block["eid"], at)
                for name, values in data.items():
                    data_out[name].append(values, at)
                halo_mark[block["src"]] = True
                del block, data
            for appender in (*out.values(), *data_out.values()):
                appender.close()
            del out, data_out
            halo_mark[lo:hi] = False
            halo = np.flatnonzero(halo_mark).astype(np.int64)
            halo_mark[halo] = False
            np.save(os.path.join(d, "halo.npy"), halo)
            meter.update(1)
            # The splits' sizes come once every partition is written (below).
            infos[k] = dataclasses.asdict(part_info(g.node_types, counts, offsets, k,
                                                    num_edges=e, halo=halo))
        for other in group.gather(np.array(json.dumps(infos)), "partition facts"):
            infos.update({int(k): v for k, v in json.loads(str(other)).items()})
        sizes = {"splits": self._write_splits(offsets), "edge_splits": None}
        if group.leader:
            inverse = np.load(os.path.join(self.staging, "node_map_inv.npy"), mmap_mode="r")
            sizes["edge_splits"] = write_edge_splits(g, inverse, offsets, self.staging)
        every = [json.loads(str(s)) for s in group.gather(np.array(json.dumps(sizes)),
                                                          "split sizes")]
        return {"parts": [{**infos[k], "splits": every[k % group.size]["splits"][k],
                           "edge_splits": every[0]["edge_splits"][k]} for k in range(p)]}

    def _write_splits(self, offsets) -> list[dict]:
        """Each partition's split files: sorted new ids. Each process maps the split ids
        of its own nodes a block at a time (their range of each split,
        `ChunkedGraph.split`) and appends each partition's to its piece: a partition's
        new ids rise with the node ids within a process, and every process's nodes
        follow the earlier processes' in each partition, so the pieces joined in rank
        order (by each partition's process, `Group.mine`) are sorted. Returns {type:
        {split: count}} for each partition (filled for this process's)."""
        g, p, group = self.graph, self.options.num_parts, self.group
        inverse = os.path.join(self.staging, "node_map_inv.npy")
        starts = g.type_offsets()
        named = [(t, ntype, name) for t, ntype in enumerate(g.node_types)
                 for name in g.splits.get(ntype, {})]
        path = lambda k, ntype, name: os.path.join(part_dir(self.staging, k), "split", ntype,
                                                   name + ".npy")
        piece = lambda k, ntype, name, r: path(k, ntype, name) + f".{r}.npy"

        def blocks(t: int, ntype: str, name: str):
            """(new ids, their partitions) of this process's nodes in the split."""
            a, b = max(self.lo - starts[t], 0), max(self.hi - starts[t], 0)
            for c in range(a, b, SPLIT_BLOCK):
                d = min(c + SPLIT_BLOCK, b)
                ids = g.split(ntype, name, c, d)
                new = read_rows(inverse, starts[t] + c, starts[t] + d)[ids - c].astype(np.int64)
                yield new, np.searchsorted(offsets, new, side="right") - 1
        sizes = [{} for _ in range(p)]
        for t, ntype, name in named:
            counts = sum((np.bincount(part, minlength=p) for _, part in blocks(t, ntype, name)),
                         np.zeros(p, np.int64))
            for k in range(p):
                os.makedirs(os.path.dirname(path(k, ntype, name)), exist_ok=True)
                sizes[k].setdefault(ntype, {})[name] = int(counts[k])
            files = [NpyAppender(path(k, ntype, name) if group.size == 1
                                 else piece(k, ntype, name, group.rank), np.int64,
                                 (int(counts[k]),)) for k in range(p)]
            for new, part in blocks(t, ntype, name):
                order, cuts = segments.group_by(part, p)
                for k in range(p):
                    files[k].append(new[order[cuts[k]:cuts[k + 1]]])
            for f in files:
                f.close()
        if group.size == 1:
            return sizes
        group.barrier("split pieces written")
        for k in filter(group.mine, range(p)):
            for _, ntype, name in named:
                rows = [np.load(piece(k, ntype, name, r), mmap_mode="r").shape[0]
                        for r in range(group.size)]
                total = sum(rows)
                joined = NpyAppender(path(k, ntype, name), np.int64, (total,))
                for r, m in enumerate(rows):
                    for _, block in read_blocks(piece(k, ntype, name, r), 0, m, SPLIT_BLOCK):
                        joined.append(block)
                joined.close()
                for r in range(group.size):
                    os.remove(piece(k, ntype, name, r))
                sizes[k][ntype][name] = total
        return sizes

    # -- phase 7 ------------------------------------------------------------------------

    def _node_leaves(self):
        """(type index, type, name, leaf, files, dtype, row shape, chunk) of every node
        array: a dense one is one leaf, a sparse one two (indices, values)."""
        g = self.graph
        for t, ntype in enumerate(g.node_types):
            for name, c in g.node_data.get(ntype, {}).items():
                leaves = [("", c.files, c.dtype, c.shape)] if c.sparse is None else [
                    ("indices", c.files, "int32", (c.sparse,)),
                    ("values", c.value_files, c.dtype, (c.sparse,))]
                for leaf, files, dtype, shape in leaves:
                    yield t, ntype, name, leaf, files, dtype, shape, c

    def node_data(self) -> dict:
        """Every node array copied into the partitions' files by blocks of rows: a
        block's rows of one partition are consecutive rows of its file (a partition's
        nodes of a type are in original order), written in place, so every process
        copies its own share of the blocks."""
        g, p, group = self.graph, self.options.num_parts, self.group
        counts, offsets, ntype_offsets = self.numbering()
        inverse = os.path.join(self.staging, "node_map_inv.npy")
        path = lambda k, ntype, name, leaf: os.path.join(
            part_dir(self.staging, k), "node", ntype, *([name, leaf] if leaf else [name])
        ) + ".npy"
        if group.leader:
            for t, ntype, name, leaf, _, dtype, shape, _ in self._node_leaves():
                for k in range(p):
                    os.makedirs(os.path.dirname(path(k, ntype, name, leaf)), exist_ok=True)
                    preallocate(path(k, ntype, name, leaf), dtype, (int(counts[k, t]), *shape))
        group.barrier("node data allocated")
        block = block_sizes(group.size)[1]
        blocks = [(leaf_index, i, a)
                  for leaf_index, (_, _, _, _, files, _, _, c) in enumerate(self._node_leaves())
                  for i in range(len(files)) for a in range(0, c.rows[i], block)]
        blocks = [block for b, block in enumerate(blocks) if group.mine(b)]
        leaves = list(self._node_leaves())
        meter = self.progress.meter("copying node data", len(blocks), "blocks")
        ranges = {}
        opened = None, []
        try:
            for leaf_index, i, a in blocks:
                t, ntype, name, leaf, files, _, _, c = leaves[leaf_index]
                if opened[0] != leaf_index:
                    for out in opened[1]:
                        out.close()
                    opened = leaf_index, [NpyRows(path(k, ntype, name, leaf))
                                          for k in range(p)]
                chunk = g.load(files[i])                   # memory-mapped
                rows = np.asarray(chunk[a:a + block])
                if leaf != "indices":       # refused as a Graph refuses it
                    g.check_rows(files[i], ntype, name, rows,
                                 c.starts[i] + a + np.arange(rows.shape[0]))
                first = g.type_offsets()[t] + c.starts[i] + a
                new = read_rows(inverse, first, first + rows.shape[0])
                owner = owner_of(offsets, new)
                order, cuts = segments.group_by(owner, p)
                for k in np.flatnonzero(np.diff(cuts)):
                    sel = order[cuts[k]:cuts[k + 1]]
                    opened[1][k].write(int(new[sel[0]] - ntype_offsets[k, t]), rows[sel])
                if leaf != "indices" and np.dtype(c.dtype).kind in "iu":
                    ranges[f"{ntype}/{name}"] = _widen(ranges.get(f"{ntype}/{name}"), rows)
                meter.update(1)
        finally:
            for out in opened[1]:
                out.close()
        for other in group.gather(np.array(json.dumps(ranges)), "node data ranges"):
            for key, bound in json.loads(str(other)).items():
                ranges[key] = _widen(ranges.get(key), np.asarray(bound, np.int64))
        return {"node_data_ranges": ranges}

    # -- meta.json ----------------------------------------------------------------------

    def meta(self, seconds: float) -> PartitionMeta:
        g, p = self.graph, self.options.num_parts
        phases = self.work.state["phases"]
        counts = self.numbering()[0]
        # Each partition's loads, a block of nodes at a time (the first process alone
        # writes the metadata: every node's weights at once held more than any phase
        # of 4 processes on the 2^26-node R-MAT, 2.4 GiB against 1.9).
        parts, loads, totals = self.parts(mmap=True), 0.0, 0.0
        for lo in range(0, self.n, NODE_BLOCK) or [0]:
            hi = min(lo + NODE_BLOCK, self.n)
            weights = self.weights(lo, hi)
            loads = loads + weights.loads(np.asarray(parts[lo:hi]), p)
            totals = totals + weights.totals()
        mean = totals / p
        balance = {name: float(loads[:, c].max() / mean[c]) if mean[c] > 0 else 1.0
                   for c, name in enumerate(weights.names)}
        limits = balance_limits(totals, p, self.options.tolerance)
        # A caller's own assignment (`partition_graph`) was judged where it was made.
        if self.method in (Method.GIVEN.value, Method.MULTILEVEL.value) and not within(
                loads, limits):
            warn_over_limits(self.graph.name, weights.names, loads, limits,
                             self.options.tolerance)
        node_ranges = phases["node data"]["node_data_ranges"]
        edge_ranges = phases["bucketing"]["edge_data_ranges"]

        def spec(c, bounds) -> ArraySpec:
            if c.sparse is not None:
                return ArraySpec(c.dtype, c.shape, sparse=c.sparse)
            lo, hi = bounds if bounds else (None, None)
            return ArraySpec(c.dtype, c.shape, lo, hi)
        return partition_meta(
            g, counts, [PartInfo(**info) for info in phases["partitions"]["parts"]],
            method=self.method,
            num_edges_per_relation=self._edges_per_relation(),
            node_data={t: {name: spec(c, node_ranges.get(f"{t}/{name}"))
                           for name, c in named.items()}
                       for t, named in g.node_data.items() if named},
            edge_data={name: spec(c, edge_ranges.get(name)) for name, c in g.edge_data.items()},
            edge_cut_fraction=(phases["bucketing"]["cut_edges"] / g.num_edges
                               if g.num_edges else 0.0),
            balance=balance, balance_tolerance=self.options.tolerance,
            seed=self.options.seed, seconds=seconds,
            preparation=recorded_preparation(g.root).to_json(),
            edge_splits={name: {"negatives": arrays["negatives"].shape[0]
                                if "negatives" in arrays else 0}
                         for name, arrays in g.edge_splits.items()},
            ids={t: np.dtype(dtype).str for t, (_, dtype) in g.ids.items()},
            build={"phases": {name: {k: v for k, v in facts.items()
                                     if k not in ("parts", "node_data_ranges",
                                                  "edge_data_ranges")}
                              for name, facts in phases.items()},
                   "processes": self.group.size,
                   "peak_rss_bytes": max([peak_rss_bytes()] + [facts["peak_rss_bytes"]
                                                               for facts in phases.values()]),
                   "options": {**dataclasses.asdict(self.options),
                               **({"assignment": None}
                                  if self.method != Method.GIVEN.value else {})}})

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


def _both_ways(renumber: np.ndarray, chunk) -> tuple[np.ndarray, np.ndarray, None]:
    """A block's edges, self-loops left out, both ways (rows, columns) in the
    adjacency's ids."""
    keep = chunk.src != chunk.dst
    src, dst = renumber[chunk.src[keep]], renumber[chunk.dst[keep]]
    return np.concatenate([src, dst]), np.concatenate([dst, src]), None


def _scattered(values: np.ndarray, to: np.ndarray) -> np.ndarray:
    """out[to[i]] = values[i]."""
    out = np.empty_like(values)
    out[to] = values
    return out


def _bucket_file(bucket: int, data: str | None, writer: int) -> str:
    """The temporary file of one bucket's edge records (data None) or edge data array,
    as one process (`writer`) wrote it."""
    return (f"{bucket:05d}.{writer}.records.bin" if data is None
            else f"{bucket:05d}.{writer}.data.{data}.bin")


def _widen(bounds, values: np.ndarray):
    """[min, max] of integer `values` together with `bounds` (None for floats)."""
    if values.dtype.kind not in "iu" or not values.size:
        return bounds
    lo, hi = int(values.min()), int(values.max())
    return [lo, hi] if bounds is None else [min(bounds[0], lo), max(bounds[1], hi)]
