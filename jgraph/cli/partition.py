"""`jgraph partition` and `jgraph info`."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback

import numpy as np

from jgraph.cli import preparation
from jgraph.cli.devices import distributed_env, start_distributed
from jgraph.data import GraphError, is_chunked_dir, load_dataset, open_chunked
from jgraph.data.prepare import prepare, recorded_preparation
from jgraph.data.prepare_chunked import prepared
from jgraph.memory import limit_arenas, peak_rss_bytes
from jgraph.partition import Method, PartitionError, PartitionMeta, open_partitions, partition_graph
from jgraph.partition.assignment import check_given, read_assignment
from jgraph.partition.build import OutputExistsError, check_out_dir
from jgraph.partition.chunked import ChunkedOptions, partition_chunked
from jgraph.partition.group import Group
from jgraph.partition.plan import GraphSizes, plan, plan_sizes, render
from jgraph.progress import LOGGER, Progress


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it has one (not on required options)."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def add_commands(sub) -> None:
    p = sub.add_parser(
        "partition", help="split a graph into partitions on disk",
        description="Partition a graph into N parts, one per device, and write a partition "
                    "directory (DIR/meta.json + DIR/part-K/*.npy) that each process can load "
                    "its own parts from.",
        formatter_class=DefaultsShown)
    p.add_argument("dataset", nargs="?",
                   help="a built-in name (cora), an .npz file, a chunked graph directory "
                        "(jgraph convert), an OGB dataset directory, or "
                        "synthetic:nodes=N,edges=E,... (with --plan, optional: give the "
                        "sizes instead)")
    p.add_argument("--num-parts", type=int, required=True, help="number of partitions")
    p.add_argument("--plan", action="store_true",
                   help="print what partitioning in bounded memory needs, phase by phase "
                        "(memory, temporary disk, reads), and stop; for a chunked graph "
                        "directory, or for --nodes/--edges/--feat")
    p.add_argument("--nodes", help="with --plan and no dataset: node count (111M, 2.5e9)")
    p.add_argument("--edges", help="with --plan and no dataset: directed edges as stored")
    p.add_argument("--feat", type=int, default=0,
                   help="with --plan and no dataset: float32 features per node")
    p.add_argument("--processes", type=int, default=1,
                   help="with --plan: the processes (hosts) the job will run as, under "
                        "python -m jgraph.launch, srun or mpirun")
    p.add_argument("--method", choices=[m.value for m in Method],
                   help="node assignment method (default: multilevel for a chunked graph "
                        "directory, read in passes in memory bounded by its nodes; metis "
                        "otherwise, which holds the whole graph; given with --assignment)")
    p.add_argument("--range-entries", type=int,
                   help="chunked graphs: adjacency entries (and in-edges) per node range "
                        "on disk, the largest block a phase holds in memory (default: 2^25 "
                        "for one process, 1/(2N) of it for each of N processes, at least "
                        "2^22)")
    p.add_argument("--coarse-entries", type=int,
                   help="chunked graphs: coarsening stops at this many adjacency entries, "
                        "the largest coarse graph METIS partitions whole (on the first "
                        "process); a coarsest graph still larger is partitioned as samples "
                        "of this size, each process running METIS on its share of them "
                        "(default: 2^25 for one process, 1/(2N) of it for each of N "
                        "processes, at least 2^22)")
    p.add_argument("--assignment", metavar="FILE",
                   help="each node's partition, made elsewhere (e.g. by ParMETIS across "
                        "hosts for a graph too large to partition on one machine, or the "
                        "assignment.npy of another partition directory): an integer .npy "
                        "array, or text with one integer per line, over the graph's nodes "
                        "(homogeneous ids); used as given, on either route (its balance "
                        "is reported); implies --method given")
    p.add_argument("--out", help="output partition directory (required unless --plan)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--balance-tolerance", type=float, default=0.05,
                   help="allowed max/mean - 1 of every balance constraint")
    p.add_argument("--no-rebalance", action="store_true",
                   help="keep METIS's or random's raw assignment (balance is still "
                        "reported; in memory only)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing partition directory at --out")
    preparation.add_flags(p, link=True)
    p.add_argument("--json", action="store_true",
                   help="print one JSON line of results instead of the summary")
    p.set_defaults(run=run_partition)

    i = sub.add_parser("info", help="print a partition directory's statistics",
                       description="Print the statistics of a partition directory.")
    i.add_argument("dir", help="partition directory")
    i.add_argument("--json", action="store_true", help="print meta.json as one JSON line")
    i.add_argument("--check", action="store_true",
                   help="also read every file and check what training relies on: id "
                        "ranges, CSC offsets, label ranges, node_map a permutation, "
                        "meta.json agreeing with the files")
    i.set_defaults(run=run_info)


def out_of_core(args) -> bool:
    """Whether the request goes to the chunked route (`partition_chunked`): a chunked
    graph directory and the multilevel method, without what needs the graph in memory
    (a given assignment, --no-rebalance; refused where asked for by name). The
    preparation, held-out link edges included, is streamed on that route
    (`jgraph.data.prepare_chunked`)."""
    if not is_chunked_dir(args.dataset) or args.method not in (
            None, Method.MULTILEVEL.value, Method.GIVEN.value):
        return False
    if (args.method == Method.GIVEN.value) != (args.assignment is not None) \
            and args.method is not None:
        raise PartitionError("--method given and --assignment FILE go together")
    if args.no_rebalance and args.assignment is None:
        raise PartitionError("--no-rebalance: not available when partitioning a chunked "
                             "graph directory in bounded memory (its multilevel assignment "
                             "is always balanced); give --method metis to load it whole")
    return True


def run_plan(args) -> int:
    """`jgraph partition --plan`: the bounded-memory job's needs, before it runs."""
    options = ChunkedOptions(args.num_parts, range_entries=args.range_entries,
                             coarse_entries=args.coarse_entries)
    if args.dataset is not None:
        if not is_chunked_dir(args.dataset):
            raise PartitionError(f"--plan {args.dataset}: not a chunked graph directory; plan "
                                 f"the bounded-memory route for one (jgraph convert writes "
                                 f"it), or give --nodes and --edges")
        sizes = plan_sizes(open_chunked(args.dataset))
    else:
        if args.nodes is None or args.edges is None:
            raise PartitionError("--plan needs a chunked graph directory, or --nodes and "
                                 "--edges (and --feat)")
        nodes, edges = (_count(flag, text) for flag, text in (("--nodes", args.nodes),
                                                              ("--edges", args.edges)))
        sizes = GraphSizes(nodes, edges, node_data_bytes=nodes * (4 * args.feat + 8))
    if args.processes < 1:
        raise PartitionError(f"--processes must be >= 1, got {args.processes}")
    if args.json:
        print(json.dumps({"sizes": dataclasses.asdict(sizes), "processes": args.processes,
                          "phases": [dataclasses.asdict(row)
                                     for row in plan(sizes, options, args.processes)]}))
    else:
        print(render(sizes, options, args.processes))
    return 0


def _count(flag: str, text: str) -> int:
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
    try:
        if text[-1:].lower() in scale:
            value = int(float(text[:-1]) * scale[text[-1].lower()])
        else:
            value = int(float(text))
    except ValueError:
        value = 0
    if value < 1:
        raise PartitionError(f"{flag} {text!r}: give a positive count such as 111M, 3.2B "
                             f"or 1e9")
    return value


def run_partition(args) -> int:
    start = time.perf_counter()
    progress = Progress(enabled=True)
    if args.plan:
        return run_plan(args)
    if args.dataset is None or args.out is None:
        raise PartitionError("give the DATASET to partition and --out DIR (or --plan)")
    if out_of_core(args):
        return run_chunked(args, start, progress)
    if distributed_env() is not None:
        raise PartitionError(f"{args.dataset}: several processes partition a chunked graph "
                             f"directory (jgraph convert writes one) with the bounded-memory "
                             f"method; run other inputs as one process")
    args.method = args.method or ("given" if args.assignment else "metis")
    LOGGER.info("jgraph partition %s -> %s (%d parts, %s)", args.dataset, args.out,
                     args.num_parts, args.method)
    try:
        asked = preparation.from_args(args)
        # The flags add to what the input has done to it already (a chunked directory
        # records it); the partition records both.
        done = recorded_preparation(args.dataset)
        recorded = done.then(asked)
        if (args.method == Method.GIVEN.value) != (args.assignment is not None):
            raise PartitionError("--method given and --assignment FILE go together")
        assignment = None if args.assignment is None else read_assignment(args.assignment)
        check_out_dir(args.out, args.overwrite)       # before loading a large graph
        with progress.phase("loading dataset"):
            graph, edge_splits = prepare(load_dataset(args.dataset), asked.without(done))
        if assignment is not None:
            assignment = check_given(Method.GIVEN, assignment, graph.total_nodes,
                                     args.num_parts, what=f"--assignment {args.assignment}")
        meta = partition_graph(graph, args.num_parts, args.method, args.out, seed=args.seed,
                               tolerance=args.balance_tolerance,
                               rebalance=not args.no_rebalance and assignment is None,
                               overwrite=args.overwrite,
                               progress=progress, edge_splits=edge_splits,
                               assignment=assignment, preparation=recorded)
    except OutputExistsError as e:
        hint = "; pass --overwrite to replace it" if e.replaceable else ""
        raise PartitionError(f"--out {e.path}: {e.reason}{hint}") from None
    seconds = time.perf_counter() - start      # loading, transforms, partitioning, writing
    if args.json:
        print(json.dumps(result_row(meta, args.out, seconds)))
    else:
        print(summary(meta, args.out))
        print(f"total {seconds:.1f}s, peak memory {peak_rss_bytes() / 2**30:.2f} GiB")
    return 0


def run_chunked(args, start: float, progress: Progress) -> int:
    """`jgraph partition CHUNKED_DIR`: the bounded-memory route."""
    args.method = (Method.GIVEN if args.assignment else Method.MULTILEVEL).value
    LOGGER.info("jgraph partition %s -> %s (%d parts, %s, in bounded memory)",
                     args.dataset, args.out, args.num_parts, args.method)
    options = ChunkedOptions(args.num_parts, seed=args.seed, tolerance=args.balance_tolerance,
                             range_entries=args.range_entries,
                             coarse_entries=args.coarse_entries, assignment=args.assignment)
    asked = preparation.from_args(args)
    limit_arenas()                      # before any thread of the job starts
    start_distributed()                 # one of several processes: join them
    group = Group.from_jax()
    # The preparation (what the input does not have yet), streamed by the first process
    # into a scratch chunked graph beside --out, removed at the end; the job partitions it.
    todo = asked.without(recorded_preparation(args.dataset))
    try:
        try:
            if args.assignment is not None:         # before a long preparation
                check_given(Method.GIVEN, read_assignment(args.assignment),
                            open_chunked(args.dataset).total_nodes, args.num_parts,
                            what=f"--assignment {args.assignment}")
            with contextlib.ExitStack() as scratch:
                source = args.dataset
                if todo.steps:
                    if group.leader:
                        check_out_dir(args.out, args.overwrite)
                        source = scratch.enter_context(prepared(args.dataset, todo, args.out,
                                                                progress=progress))
                    # Every process partitions the graph the first one prepared.
                    source = str(group.gather(np.array(source), "prepared graph")[0])
                meta = partition_chunked(source, args.out, options, overwrite=args.overwrite,
                                         progress=progress, check_out=check_out_dir,
                                         group=group)
        except OutputExistsError as e:
            hint = "; pass --overwrite to replace it" if e.replaceable else ""
            raise PartitionError(f"--out {e.path}: {e.reason}{hint}") from None
    except BaseException as e:
        if group.size > 1:
            exit_alone(e)
        raise
    seconds = time.perf_counter() - start
    if not group.leader:                # the first process reports for the job
        return 0
    if args.json:
        print(json.dumps(result_row(meta, args.out, seconds)))
    else:
        print(summary(meta, args.out))
        print("phases: " + ", ".join(
            f"{name} {facts['seconds']:.1f}s ({facts['peak_rss_bytes'] / 2**30:.2f} GiB)"
            for name, facts in meta.build["phases"].items()))
        print(f"total {seconds:.1f}s, peak memory {meta.build['peak_rss_bytes'] / 2**30:.2f} GiB")
    return 0


def exit_alone(error: BaseException) -> None:
    """End this process of a multi-process job now, after its one-line error (or
    traceback): returning would wait at jax.distributed's shutdown barrier for peers
    that wait for it at theirs, and `jgraph.launch` (or the heartbeat) stops them once
    it has gone."""
    from jgraph.cli.main import user_errors
    if isinstance(error, (PartitionError, GraphError, OSError, *user_errors())):
        detail = f"{error.strerror}: {error.filename}" if isinstance(error, OSError) \
            and error.filename else str(error)
        print(f"jgraph partition: error: {detail}", file=sys.stderr)
        code = 1 if isinstance(error, OSError) else 2
    else:
        traceback.print_exception(error)
        code = 130 if isinstance(error, KeyboardInterrupt) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def result_row(meta: PartitionMeta, out: str, seconds: float) -> dict:
    """The `--json` line: a contract read by other tools (fields may be added, not removed)."""
    return {
        "graph": meta.graph_name,
        "out": out,
        "num_parts": meta.num_parts,
        "method": meta.method,
        "num_nodes": meta.num_nodes,
        "num_edges": meta.num_edges,
        "edge_cut_fraction": meta.edge_cut_fraction,
        "balance": meta.balance,
        "balance_tolerance": meta.balance_tolerance,
        "seconds": seconds,
        "partition_seconds": meta.seconds,
        # A resumed job's earlier phases ran in other processes: their peaks count too.
        "peak_rss_bytes": max(peak_rss_bytes(), meta.build.get("peak_rss_bytes", 0)),
        "part_nodes": [p.num_nodes for p in meta.parts],
        "part_edges": [p.num_edges for p in meta.parts],
        "part_halo": [p.num_halo for p in meta.parts],
        "edge_splits": {name: sum(p.edge_splits[name] for p in meta.parts)
                        for name in meta.edge_splits},
        # The chunked route's phases: {name: {seconds, peak_rss_bytes, ...}}.
        "phases": meta.build.get("phases", {}),
    }


def summary(meta: PartitionMeta, where: str) -> str:
    """A readable account of a partitioning: sizes per part, cut and balance."""
    types = meta.node_types
    lines = [f"{meta.graph_name}: {meta.num_nodes:,} nodes, {meta.num_edges:,} edges, "
             f"{len(meta.relations)} relation(s), {len(types)} node type(s)",
             f"{meta.num_parts} partitions by {meta.method} in {where}"]
    split_names = sorted({n for p in meta.parts for named in p.splits.values() for n in named
                          if n in ("train", "val", "test")}, key=("train", "val", "test").index)
    header = f"{'part':>5} {'nodes':>11} {'in-edges':>12} {'halo':>10}" + "".join(
        f" {s:>9}" for s in split_names)
    lines.append(header)
    for k, p in enumerate(meta.parts):
        counts = [sum(named.get(s, 0) for named in p.splits.values()) for s in split_names]
        lines.append(f"{k:>5} {p.num_nodes:>11,} {p.num_edges:>12,} {p.num_halo:>10,}"
                     + "".join(f" {c:>9,}" for c in counts))
    lines.append(f"edge cut: {meta.edge_cut_fraction:.2%} of edges join different partitions")
    if meta.edge_splits:
        lines.append("link prediction positives: " + ", ".join(
            f"{name} {sum(p.edge_splits[name] for p in meta.parts):,}"
            + (f" ({entry['negatives']:,} fixed negatives each)" if entry["negatives"] else "")
            for name, entry in meta.edge_splits.items()))
    within = all(v <= 1 + meta.balance_tolerance + 1e-9 for v in meta.balance.values())
    lines.append("balance (max/mean per constraint): " + ", ".join(
        f"{k} {v:.3f}" for k, v in meta.balance.items())
        + ("" if within else f"  [some above 1+{meta.balance_tolerance:g}: "
                             f"the smallest count constraints cannot split evenly]"))
    return "\n".join(lines)


def run_info(args) -> int:
    graph = open_partitions(args.dir)         # meta.json, checked to agree with itself
    graph.check_files()                       # every file the format names exists
    if args.check:
        start = time.perf_counter()
        graph.check()
        seconds = time.perf_counter() - start
    meta = graph.meta
    if args.json:
        print(json.dumps(meta.to_json()))
        return 0
    print(summary(meta, os.path.abspath(args.dir)))
    data = ", ".join(f"{t}.{name} {spec.dtype}{list(spec.shape)}"
                     + (f" sparse ({spec.sparse} per row)" if spec.sparse else "")
                     for t, named in meta.node_data.items() for name, spec in named.items())
    if data:
        print(f"node data: {data}")
    if meta.edge_data:
        print("edge data: " + ", ".join(f"{n} {s.dtype}{list(s.shape)}"
                                        for n, s in meta.edge_data.items()))
    print(f"partitioned in {meta.seconds:.1f}s (seed {meta.seed})"
          + (f"; all partition files checked in {seconds:.2f}s" if args.check else ""))
    return 0
