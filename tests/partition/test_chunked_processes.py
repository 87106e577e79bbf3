"""The bounded-memory route as several processes (`python -m jgraph.launch
--num-processes N -- jgraph partition CHUNKED_DIR ...`): the partition directory they
write passes `info --check` and holds the graph (equal, array by array, to
`partition_graph`'s for the same assignment: every edge, feature row, label and split
entry once, by original ids), keeps every balance constraint, and is the same graph one
process writes, with a cut near one process's; a process that fails stops the job,
named, with nothing left at the output path (`test_multilevel_processes.py` compares
the steps across processes with one process's on a graph in memory).

Every launch has a timeout: a job that hangs fails the test instead."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jgraph.data import load_dataset, save_chunked, symmetrize
from jgraph.partition import chunked as chunked_route
from jgraph.partition import open_partitions, partition_graph
from jgraph.partition.assignment import constraints_for
from jgraph.partition.chunked import ChunkedOptions, partition_chunked

from .test_chunked_partition import (
    SMALL,
    assert_same_partitions,
    assert_the_plan_bounds_the_disk,
    assignment_of,
    hetero_graph,
)

ROOT = Path(__file__).resolve().parents[2]


MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")      # this machine's


def launch(processes: int, *args, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jgraph.launch", "--num-processes", str(processes), "--",
         sys.executable, "-m", "jgraph.cli.main", "partition", *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def small_flags(num_parts: int) -> list[str]:
    return ["--num-parts", str(num_parts), "--range-entries", str(SMALL["range_entries"]),
            "--coarse-entries", str(SMALL["coarse_entries"])]


@pytest.mark.parametrize("source,processes", [("hetero", 3), ("facebook", 2)])
@pytest.mark.slow        # launches of several processes: 30 s
def test_processes_write_the_graph_as_partition_graph_does(tmp_path, shared_data, source,
                                                           processes):
    graph = (hetero_graph() if source == "hetero"
             else symmetrize(load_dataset(shared_data("facebook_musae.npz"))))
    save_chunked(graph, tmp_path / "in", edges_per_chunk=1500, rows_per_chunk=700)
    proc = launch(processes, tmp_path / "in", *small_flags(4), "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    pg = open_partitions(tmp_path / "out")
    pg.check()                                          # what `jgraph info --check` runs
    meta = pg.meta
    assert meta.build["processes"] == processes
    per_process = [p["peak_rss_bytes_per_process"] for p in meta.build["phases"].values()]
    # Each process's peak, sampled through each phase: at least the 64 MiB a process
    # that imported jgraph holds (measured: 281-335 MiB), at most the machine's memory.
    # A peak in KiB or in pages falls outside.
    assert all(len(peaks) == processes and min(peaks) >= 2**26 and max(peaks) <= MEMORY
               for peaks in per_process), per_process
    # What each process held as each phase began: what it had imported, at most its
    # peak in the phase.
    starts = [p["start_rss_bytes_per_process"] for p in meta.build["phases"].values()]
    assert all(len(held) == processes and min(held) >= 2**26 for held in starts), starts
    assert all(a <= b for held, peaks in zip(starts, per_process)
               for a, b in zip(held, peaks, strict=True)), (starts, per_process)
    parts = assignment_of(str(tmp_path / "out"))
    reference = partition_graph(graph, 4, "given", tmp_path / "ref", rebalance=False,
                                assignment=parts)
    assert_same_partitions(str(tmp_path / "out"), str(tmp_path / "ref"))
    assert meta.edge_cut_fraction == pytest.approx(reference.edge_cut_fraction)
    if source == "facebook":            # the counts every process writes in the scan too
        assert_the_plan_bounds_the_disk(meta, tmp_path / "in", ChunkedOptions(4, **SMALL),
                                        processes)
    # Every balance constraint within its limit, as one process keeps them.
    constraints = constraints_for(graph)
    loads = np.stack([np.bincount(parts, weights=constraints.weights[:, c], minlength=4)
                      for c in range(constraints.weights.shape[1])], axis=1)
    mean = constraints.weights.sum(axis=0) / 4
    limit = np.maximum(1.05 * mean, np.ceil(mean - 1e-9))
    assert (loads <= limit + 1e-9).all(), (loads / mean).max(axis=0)
    # The same graph as one process writes (its own assignment, the same arrays given it).
    one = partition_chunked(tmp_path / "in", tmp_path / "one", ChunkedOptions(4, **SMALL))
    assert one.num_edges == meta.num_edges and one.num_nodes == meta.num_nodes
    assert meta.edge_cut_fraction < 1.5 * one.edge_cut_fraction + 0.01
    assert not os.path.exists(str(tmp_path / "out") + chunked_route.WORK)


@pytest.mark.slow        # a launch of several processes: 10 s
def test_a_process_that_fails_stops_the_job_named_and_leaves_nothing(tmp_path):
    graph = hetero_graph()
    save_chunked(graph, tmp_path / "in", edges_per_chunk=1000, rows_per_chunk=700)
    # The second edge block is read by the second process only: an id out of range there.
    path = tmp_path / "in" / "edges" / "src-00001.npy"
    src = np.load(path)
    src[5] = graph.total_nodes + 7
    np.save(path, src)
    proc = launch(2, tmp_path / "in", *small_flags(4), "--out", tmp_path / "out", timeout=60)
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr and "src-00001.npy" in proc.stderr, proc.stderr[-3000:]
    assert "out of range" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_other_inputs_are_refused_under_several_processes(tmp_path, shared_data):
    proc = launch(2, shared_data("cora.npz"), "--num-parts", "2", "--out", tmp_path / "out",
                  timeout=60)
    assert proc.returncode != 0
    assert "several processes partition a chunked graph directory" in proc.stderr


def test_the_plan_divides_memory_among_processes():
    from jgraph.partition.chunked import MIN_COARSE_ENTRIES, coarse_limit
    from jgraph.partition.plan import BASELINE_BYTES, GraphSizes, plan
    papers = GraphSizes(111_000_000, 3_200_000_000, 111_000_000 * 520)
    one, eight, many = (plan(papers, ChunkedOptions(16), q) for q in (1, 8, 32))
    peak = lambda rows: max(r.memory for r in rows)
    assert peak(eight) < peak(one) / 1.5 and peak(many) <= peak(eight)
    # No phase grows; what every process holds whole (the scan's counts of every node,
    # one int32 of every node while partitioning) is the floor.
    for a, b, c in zip(one, eight, many):
        assert c.memory <= b.memory <= a.memory, a.phase
        assert c.disk <= b.disk <= a.disk, a.phase      # one shared work directory
    assert peak(many) <= 24 * papers.num_nodes + BASELINE_BYTES
    assert coarse_limit(1) > coarse_limit(4) >= MIN_COARSE_ENTRIES == coarse_limit(10**6)


def test_blocks_divide_among_processes_down_to_a_floor():
    from jgraph.partition import chunked
    one, four, many = (chunked.block_sizes(q) for q in (1, 4, 10**6))
    assert one == (chunked.EDGES_PER_BLOCK, chunked.ROWS_PER_BLOCK)
    assert four == (chunked.EDGES_PER_BLOCK // 8, chunked.ROWS_PER_BLOCK // 8)
    assert many == (chunked.MIN_EDGES_PER_BLOCK, chunked.MIN_ROWS_PER_BLOCK)
