"""An R-MAT graph as an .npz file or a chunked directory: the partitioning benchmark's large case.

    python experiments/make_rmat.py rmat.npz        # 2^23 nodes, 100M edges, 32 features
    python experiments/make_rmat.py rmat_small.npz --scale 20 --edges 10M
    /usr/bin/time -v jgraph partition rmat.npz --num-parts 8 --method metis --out parts --json
    python experiments/make_rmat.py rmat1b --scale 26 --edges 1B --feat 16 --chunked

R-MAT (Chakrabarti et al., 2004) with (a, b, c, d) = (0.57, 0.19, 0.19, 0.05), as the
Graph500 generator: a simple directed graph (no self-loops, no duplicates) with exactly
`--edges` edges over 2^scale nodes, ids shuffled, 10 label classes with a homophily
signal and `--feat` float32 features (`jgraph.data.synthetic`, kind rmat). The .npz is
built in memory and written uncompressed, so that `jgraph partition` reads it as fast as
the disk allows.

With `--chunked` the graph is written straight into a chunked directory
(`jgraph.data.chunked`) by `generate_chunked`, in memory bounded by the node count: the
same kind of graph, not the same draws. 2^26 nodes and 1B edges took 14 minutes and
1.4 GB at most on two cores shared with other jobs, with 9.6 GB of temporary files
beside the output (or in `--tmp-dir`), and wrote 13 GB.
"""
from __future__ import annotations

import argparse
import time

from jgraph.data import save_npz
from jgraph.data.synthetic import generate, generate_chunked
from jgraph.progress import Progress


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .npz file to write (a directory with --chunked)")
    parser.add_argument("--scale", type=int, default=23, help="2^scale nodes (default 23)")
    parser.add_argument("--edges", default="100M", help="directed edges (default 100M)")
    parser.add_argument("--feat", type=int, default=32, help="feature width (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunked", action="store_true",
                        help="write a chunked graph directory, in bounded memory")
    parser.add_argument("--tmp-dir", help="--chunked: where the temporary files go "
                                          "(default: beside OUT)")
    parser.add_argument("--overwrite", action="store_true",
                        help="--chunked: replace a chunked graph at OUT")
    args = parser.parse_args()
    start = time.perf_counter()
    spec = (f"synthetic:nodes={2 ** args.scale},edges={args.edges},kind=rmat,"
            f"feat={args.feat},seed={args.seed}")
    if args.chunked:
        graph = generate_chunked(spec, args.out, tmp_dir=args.tmp_dir,
                                 overwrite=args.overwrite, progress=Progress())
    else:
        graph = generate(spec)
        save_npz(graph, args.out)
    print(f"{args.out}: {graph.total_nodes:,} nodes, {graph.num_edges:,} edges "
          f"({spec}) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
