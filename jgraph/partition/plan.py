"""What a bounded-memory partitioning job will need, before it runs: each phase's
memory, temporary disk and reads, from the graph's sizes alone (`jgraph partition
--plan`).

The figures follow the arrays each phase of `jgraph.partition.chunked` holds (named
beside each term below) and are upper estimates: numpy's temporaries are counted at
their largest. `meta.json`'s `build` records what a run measured, phase by phase, to
set beside them.
"""
from __future__ import annotations

import dataclasses

from jgraph.partition import compiled
from jgraph.partition.chunked import (
    JOB,
    SPLIT_BLOCK,
    ChunkedOptions,
    block_sizes,
    count_split_ids,
    data_bytes,
    edge_split_bytes,
    estimate_disk,
)
from jgraph.partition.multilevel import PIECE_ENTRIES

# Memory per adjacency entry of the coarse graph METIS partitions: its CSR in the
# 32-bit arrays METIS takes (12 bytes), and METIS with the finer levels of its own
# coarsening on disk (`jgraph.partition.metis`): the 1B-edge R-MAT's assignment held
# 0.9 GB more while METIS ran on a 33.5M-entry coarse graph. The coarsest graph has at
# most half as many nodes as entries (`multilevel.coarse_node_limit`), so what is held
# of each coarsest node (its weights, partition and CSR row: some 80 bytes) fits too.
METIS_ENTRY_BYTES = 40
# Under several processes METIS runs in a child process of its own (`jgraph.partition.
# metis`: libc's `rand()` is shared with `jax.distributed`'s threads): the child's
# interpreter with numpy (45 MB) and the 32-bit arrays written for it, which the parent
# holds too while it waits (some 16 bytes an entry more: a 2^20-node R-MAT's 6.6M-entry
# coarse graph at 4 processes, assignment 730 MB measured against 587 planned without).
METIS_CHILD_BYTES, METIS_CHILD_ENTRY_BYTES = 45 << 20, 16
# What every process holds before a phase holds anything: the interpreter with numpy,
# scipy, the compiled kernels and JAX (which the command line imports), some 0.25 GB.
BASELINE_BYTES = 300 << 20
# From the assignment phase on, label propagation's compiled kernels (numba's LLVM)
# and what the allocator keeps of that phase: the phases after it began at 0.30-0.34
# GiB on the 100M- and 1B-edge R-MATs at 1, 4 and 8 processes (meta.json's
# `start_rss_bytes`); BASELINE_BYTES with this is 0.34 GiB (with numba; without it,
# not measured, and not counted).
KERNEL_BYTES = 65 << 20
# The assignment's steps, each what it holds of a process's own nodes and of a range,
# fitted to `jgraph partition -v`'s log (each step's most) on the R-MATs of 2^23 nodes
# and 100M edges and of 2^26 nodes and 1B edges at one process, and of 2^26 nodes and
# 250M edges at four (a60fdfd): clustering a level some 30 bytes an own node beside a
# piece (33-35 measured), and 24 more for the requests to join other processes'
# clusters and those admitted (some 30 measured at four processes); refining the
# finest level 46 (50-54 measured with a piece on the 1B-edge graph; its moves are
# the most there); while a level is contracted or METIS runs, 15 held (the levels'
# clusters and the coarse nodes' weights: 15-19 measured), and a contraction holds
# the finest range read and its entries between clusters (some 23 bytes an entry of a
# range) and the clusters' entry counts summed at their owners (22 bytes an own node):
# 2.1 GiB more at the 1B-edge graph's first level; a coarse level's weighted ranges,
# sized at half a range before their repeats merge, some 48 bytes an entry of a
# range (1.3-1.4 GiB more at 2^25 entries on the 100M-edge graph).
CLUSTER_NODE_BYTES, REQUEST_NODE_BYTES, REFINE_NODE_BYTES = 30, 24, 46
LEVELS_NODE_BYTES = 15
CONTRACT_ENTRY_BYTES, CONTRACT_NODE_BYTES, COARSE_CONTRACT_ENTRY_BYTES = 23, 22, 48


@dataclasses.dataclass(frozen=True)
class GraphSizes:
    """The sizes a plan needs. node_data_bytes: all node arrays together;
    edge_data_bytes: per edge; edges_per_chunk: the largest edge chunk; types,
    splits: node types and balanced splits (train, val, test) present;
    edge_split_bytes: link prediction's held-out edges in the partitions; split_ids:
    the node ids of every split together (None: at most one a node)."""

    num_nodes: int
    num_edges: int
    node_data_bytes: int = 0
    edge_data_bytes: int = 0
    edges_per_chunk: int = 1 << 24
    types: int = 1
    splits: int = 3
    edge_split_bytes: int = 0
    split_ids: int | None = None


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    """One phase: memory per process (bytes), the most disk its work directory holds
    (bytes: every file then on disk, the partition directory as written so far
    included; `meta.json`'s `build` records the measured `disk_bytes`), what it reads."""

    phase: str
    memory: int
    disk: int
    reads: str


def plan_sizes(graph) -> GraphSizes:
    """The sizes of an opened chunked graph (`jgraph.data.ChunkedGraph`)."""
    node, edge = data_bytes(graph)
    return GraphSizes(graph.total_nodes, graph.num_edges, node, edge,
                      max(graph.edges["src"].rows, default=0), len(graph.node_types),
                      sum(any(s in named for named in graph.splits.values())
                          for s in ("train", "val", "test")), edge_split_bytes(graph),
                      count_split_ids(graph))


class _Planner:
    """Each phase's (memory per process, what it reads), a method named as the phase's
    `_Job` method (`chunked.JOB`), on a graph of `sizes` run by `processes` processes."""

    def __init__(self, sizes: GraphSizes, options: ChunkedOptions, processes: int):
        n, e = sizes.num_nodes, sizes.num_edges
        self.sizes, self.n, self.e = sizes, n, e
        self.q = q = max(processes, 1)
        self.options = options = options.resolved(q)
        edges_block, self.rows_block = block_sizes(q)
        # read a block at a time
        self.chunk = min(sizes.edges_per_chunk, e, edges_block)
        self.ids = 4 if n < 2**31 else 8
        self.r, self.p = min(options.range_entries, 2 * e), options.num_parts
        self.own = -(-n // q)                                     # a process's nodes
        self.base = BASELINE_BYTES
        # after the assignment
        self.later = self.base + (KERNEL_BYTES if compiled.enabled() else 0)
        gib = lambda b: f"{b / 2**30:.1f} GiB"
        share = "" if q == 1 else f", 1/{q} of them per process"
        self.edges_read = f"the edge chunks once ({gib(2 * e * self.ids)}{share})"
        self.adjacency_read = (f"the adjacency up to {4 + 1 + 6 + 1} times per level "
                               f"({gib(2 * e * self.ids)} each at the finest{share})")
        self.node_data_read = f"the node data once ({gib(sizes.node_data_bytes)}{share})"

    def scan(self) -> tuple[int, str]:
        # a split's chunk checked (int64 ids, sorted and in range: a whole split at most);
        # then the in-degree and degree counts of one process's nodes at a time (every
        # node's with one process; int32 below 2^31 edges a process, without numba one
        # bincount's int64 of them), a block as int64 ids, etype and the loop test, and
        # the pages of its files as they are read (28 bytes an edge: 26-27 measured on
        # R-MAT graphs of 2^21 and 2^23 nodes).
        own, sizes = self.own, self.sizes
        split = 8 * min(self.n if sizes.split_ids is None else sizes.split_ids, self.n)
        counts = ((8 if self.e // self.q < 2**30 else 16) * own
                  + (0 if compiled.enabled() else 8 * own))
        reads = self.edges_read if self.q == 1 else (
            f"the edge chunks {self.q} times, each process its 1/{self.q} "
            f"({2 * self.e * self.ids / 2**30:.1f} GiB each time)")
        return self.base + max(split, counts + 28 * self.chunk), reads

    def adjacency(self) -> tuple[int, str]:
        # degrees (a process's own) and their running sum, every node's id in the
        # adjacency (`_Job._write_renumbering`); blocks: the one read ahead (int64
        # ends), two made in threads (both directions in new ids, their ranges, order
        # and bucket records) and the records being written, some 190 bytes an edge
        # of a block in all (180 measured on a 2^20-node R-MAT of 20M edges); then
        # two ranges sorted at once, each its records and keys.
        return (self.base + max(16 * self.own + self.ids * self.n + 190 * self.chunk,
                                2 * 28 * self.r),
                self.edges_read)

    def assignment(self) -> tuple[int, str]:
        # the balance weights' compact columns of a process's own nodes, and under
        # several processes what every process holds whole: one int32 of every node
        # (the level's cluster while clustering and contracting, the partition while
        # refining), the cluster sizes' sums and the labels' exchange around it, and
        # the numbering of every node's cluster (a bool, a bit and a running count);
        # then the largest step (the constants' comment: clustering, refining,
        # contracting, METIS on the coarse graph or a sample of it, in a child process
        # under several).
        own, q, r, sizes = self.own, self.q, self.r, self.sizes
        weights = (sizes.types + sizes.splits) * own
        shared = 8 * self.n if q > 1 else 0
        piece = PIECE_ENTRIES * 64                                # one piece's arrays
        coarse = min(self.options.coarse_entries, 2 * self.e)
        cluster = (CLUSTER_NODE_BYTES + (REQUEST_NODE_BYTES if q > 1 else 0)) * own + piece
        refine = REFINE_NODE_BYTES * own + piece
        contract = max(CONTRACT_ENTRY_BYTES * r + CONTRACT_NODE_BYTES * own,
                       COARSE_CONTRACT_ENTRY_BYTES * r)
        metis = (METIS_ENTRY_BYTES * coarse
                 + (METIS_CHILD_BYTES + METIS_CHILD_ENTRY_BYTES * coarse if q > 1 else 0))
        return (self.base + shared + weights
                + max(cluster, refine, LEVELS_NODE_BYTES * own + max(contract, metis)),
                self.adjacency_read)

    def relabel(self) -> tuple[int, str]:
        # a process's own nodes' partitions, their order, new ids and type ids, not
        # all at once: some 28 bytes a node (25 measured on the 1B-edge R-MAT, 30 on
        # the 100M-edge one).
        return self.later + 28 * self.own, "nothing but the assignment"

    def bucketing(self) -> tuple[int, str]:
        # a process's own nodes' new ids (every node's with one process); a block (int64
        # ids, its files' pages), its ends (in the ids' width) and their new ids, asked
        # of their owners with several processes (with their owners and order, and
        # those other processes ask of this one), its destinations' buckets and order,
        # its bucket records (20 bytes) and the temporaries that fill them; and the
        # block grouped in a thread while the last one's records are written: some 110
        # bytes an edge of a block (100 measured on the 100M-edge R-MAT at one process,
        # 95 at four).
        return self.later + self.ids * self.own + 110 * self.chunk, self.edges_read

    def partitions(self) -> tuple[int, str]:
        # the halo marks, one partition's degrees (read a block at a time) and CSC
        # offsets, the pages of a process's share of the node map (memory-mapped); one
        # range of edge records (at most a partition's in-edges, 1.05 of the mean) read
        # into one array, its sort keys, order and sorted copy, and the columns as
        # written: some 60 bytes an edge (53-57 measured on the 100M-edge R-MAT at 1
        # and 2 processes). The next range is sorted in a thread while this one is
        # written, its columns gathered one at a time, not as records: the phase's
        # peak fell, 0.66 to 0.62 GiB on a 2^22-node R-MAT. Then the splits, a block
        # of a process's nodes at a time: their ids, new ids, partitions and order
        # (int64 each) and each partition's piece.
        n, p = self.n, self.p
        return (self.later + n + 16 * n // p + 8 * self.own
                + max(60 * min(self.r, -(-self.e * 21 // (20 * p))),
                      40 * min(SPLIT_BLOCK, self.own)),
                "the edge buckets once")

    def node_data(self) -> tuple[int, str]:
        # a block of rows read, its new ids (read a block at a time), owners and order
        # (int64 each), and its rows of one partition at a time (half a block at most
        # counted: 1.1-1.4 blocks in all measured on the R-MAT graphs of 2^23 and 2^26
        # nodes, where three were planned).
        n, rows = self.n, min(self.rows_block, self.n)
        return (self.later + 32 * rows
                + 3 * max(self.sizes.node_data_bytes * rows // max(n, 1), 1) // 2,
                self.node_data_read)


def plan(sizes: GraphSizes, options: ChunkedOptions, processes: int = 1) -> list[PhasePlan]:
    """The phases of `partition_chunked` (`chunked.JOB`, in order) on a graph of `sizes`
    run by `processes` processes: each one's memory (every process runs METIS on its
    share of the samples of the coarsest graph), and the disk of the whole job (every
    process's files in one shared work directory)."""
    planner = _Planner(sizes, options, processes)
    options = planner.options
    disk = estimate_disk(sizes.num_nodes, sizes.num_edges, sizes.node_data_bytes,
                         sizes.edge_data_bytes, options.num_parts, options.coarse_entries,
                         sizes.edge_split_bytes, sizes.split_ids,
                         given=options.assignment is not None)
    rows = []
    for phase, on_disk in zip(JOB, disk["phases"], strict=True):
        memory, reads = getattr(planner, phase.run)()
        rows.append(PhasePlan(phase.name, memory, on_disk, reads))
    return rows


def render(sizes: GraphSizes, options: ChunkedOptions, processes: int = 1) -> str:
    """The plan as a table, with the peak over the phases."""
    rows = plan(sizes, options, processes)
    gib = lambda b: f"{b / 2**30:.1f} GiB"
    lines = [f"plan: {sizes.num_nodes:,} nodes, {sizes.num_edges:,} edges, node data "
             f"{gib(sizes.node_data_bytes)}, {options.num_parts} parts, "
             f"{processes} process{'es' if processes > 1 else ''}",
             f"{'phase':<12} {'memory/process':>15} {'disk in use':>12}  reads"]
    for row in rows:
        lines.append(f"{row.phase:<12} {gib(row.memory):>15} {gib(row.disk):>12}  {row.reads}")
    lines.append(f"{'peak':<12} {gib(max(r.memory for r in rows)):>15} "
                 f"{gib(max(r.disk for r in rows)):>12}")
    return "\n".join(lines)
