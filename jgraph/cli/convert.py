"""`jgraph convert`: write a graph as a chunked graph directory (`jgraph.data.chunked`)."""
from __future__ import annotations

import argparse
import json
import time

import jgraph.progress as logs
from jgraph.cli.partition import DefaultsShown, peak_rss_bytes
from jgraph.data import open_chunked
from jgraph.data.convert import EDGES_PER_CHUNK, ROWS_PER_CHUNK, convert, is_streamed
from jgraph.progress import Progress


def add_commands(sub) -> None:
    p = sub.add_parser(
        "convert", help="write a graph in the chunked format (for graphs larger than memory)",
        description="Write a graph as a chunked graph directory (OUT_DIR/metadata.json + "
                    ".npy chunks), which `jgraph partition` reads a chunk at a time. A "
                    "homogeneous OGB directory (ogbn-papers100M's raw/data.npz included) is "
                    "streamed, never read whole; any other input is loaded, then written.",
        formatter_class=DefaultsShown)
    p.add_argument("input", help="a built-in name (cora), an .npz file, an OGB dataset "
                                 "directory, or synthetic:nodes=N,edges=E,...")
    p.add_argument("out", metavar="OUT_DIR", help="the chunked graph directory to write")
    p.add_argument("--edges-per-chunk", type=_positive, default=EDGES_PER_CHUNK,
                   help="edges per edge chunk")
    p.add_argument("--rows-per-chunk", type=_positive, default=ROWS_PER_CHUNK,
                   help="rows per chunk of node data and splits")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a chunked graph directory at OUT_DIR")
    p.add_argument("--json", action="store_true",
                   help="print one JSON line of results instead of the summary")
    p.set_defaults(run=run_convert)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def run_convert(args) -> int:
    start = time.perf_counter()
    how = "streamed" if is_streamed(args.input) else "read whole"
    logs.LOGGER.info("jgraph convert %s -> %s (%s)", args.input, args.out, how)
    convert(args.input, args.out, edges_per_chunk=args.edges_per_chunk,
            rows_per_chunk=args.rows_per_chunk, overwrite=args.overwrite,
            progress=Progress(enabled=True))
    graph = open_chunked(args.out)      # the headers of what was written, checked
    seconds = time.perf_counter() - start
    row = {"input": args.input, "out": args.out, "num_nodes": graph.total_nodes,
           "num_edges": graph.num_edges, "edge_chunks": graph.num_edge_chunks,
           "seconds": seconds, "peak_rss_bytes": peak_rss_bytes()}
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{graph.name}: {graph.total_nodes:,} nodes, {graph.num_edges:,} edges in "
              f"{graph.num_edge_chunks:,} edge chunks -> {args.out} ({seconds:.1f}s, peak "
              f"memory {row['peak_rss_bytes'] / 2**30:.2f} GiB)")
    return 0
