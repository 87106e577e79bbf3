"""`jgraph convert`: write a graph as a chunked graph directory (`jgraph.data.chunked`):
a dataset jgraph reads, or the user's own CSV / Parquet tables that a schema file
describes (`jgraph.ingest`)."""
from __future__ import annotations

import argparse
import json
import os
import time

from jgraph.atomic import scratch_beside
from jgraph.cli import preparation
from jgraph.cli.partition import DefaultsShown
from jgraph.data import is_chunked_dir, open_chunked
from jgraph.data.chunked import check_chunked_out, is_dgl_chunked_dir
from jgraph.data.prepare_chunked import prepare_chunked
from jgraph.ingest import convert_tables, is_schema_file
from jgraph.ingest.convert import EDGES_PER_CHUNK, ROWS_PER_CHUNK, convert, is_streamed
from jgraph.memory import peak_rss_bytes
from jgraph.progress import LOGGER, Progress


def add_commands(sub) -> None:
    p = sub.add_parser(
        "convert", help="write a graph in the chunked format (for graphs larger than memory)",
        description="Write a graph as a chunked graph directory (OUT_DIR/metadata.json + "
                    ".npy chunks), which `jgraph partition` reads a chunk at a time. A "
                    "schema file (.yaml, .yml or .json) describes the user's own tables "
                    "(CSV or Parquet: node ids, features, labels, splits; edges), read in "
                    "batches and numbered 0..n-1 per node type, the user's ids kept "
                    "(needs pyarrow: pip install \"jgraph[tables]\"). A homogeneous OGB "
                    "directory (ogbn-papers100M's raw/data.npz included) is streamed, never "
                    "read whole; any other input is loaded, then written.",
        formatter_class=DefaultsShown)
    p.add_argument("input", help="a schema file of the user's tables (SCHEMA.yaml or "
                                 "SCHEMA.json), a built-in name (cora), an .npz file, an OGB "
                                 "dataset directory, or synthetic:nodes=N,edges=E,...")
    p.add_argument("out", metavar="OUT_DIR", help="the chunked graph directory to write")
    p.add_argument("--edges-per-chunk", type=_positive, default=EDGES_PER_CHUNK,
                   help="edges per edge chunk (from tables: of one relation, its last "
                        "chunk the rest)")
    p.add_argument("--rows-per-chunk", type=_positive, default=ROWS_PER_CHUNK,
                   help="rows per chunk of node data and splits")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a chunked graph directory at OUT_DIR")
    preparation.add_flags(p, link=False, note=", streamed (jgraph.data.prepare_chunked)")
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
    tables = is_schema_file(args.input)
    asked = preparation.from_args(args)
    streamed = (is_streamed(args.input) or is_dgl_chunked_dir(args.input)
                or is_chunked_dir(args.input))
    how = "from tables" if tables else "streamed" if streamed else "read whole"
    LOGGER.info("jgraph convert %s -> %s (%s)", args.input, args.out, how)
    write = convert_tables if tables else convert
    progress = Progress(enabled=True)
    if not asked.steps:
        write(args.input, args.out, edges_per_chunk=args.edges_per_chunk,
              rows_per_chunk=args.rows_per_chunk, overwrite=args.overwrite, progress=progress)
    elif is_chunked_dir(args.input):
        # A chunked graph (papers100M's, converted once) is prepared from where it is.
        with progress.phase(f"preparing ({', '.join(asked.steps)})"):
            prepare_chunked(args.input, args.out, asked, overwrite=args.overwrite,
                            progress=progress, rows_per_chunk=args.rows_per_chunk)
    else:
        # Converted as it is into a scratch folder beside OUT, then prepared from it,
        # streamed, into OUT.
        check_chunked_out(args.out, args.overwrite)
        with scratch_beside(args.out, "raw") as scratch:
            raw = os.path.join(scratch, "graph")
            write(args.input, raw, edges_per_chunk=args.edges_per_chunk,
                  rows_per_chunk=args.rows_per_chunk, progress=progress)
            with progress.phase(f"preparing ({', '.join(asked.steps)})"):
                prepare_chunked(raw, args.out, asked, overwrite=args.overwrite,
                                progress=progress, rows_per_chunk=args.rows_per_chunk)
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
