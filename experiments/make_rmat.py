"""An R-MAT graph as an .npz file: the partitioning benchmark's large case.

    python experiments/make_rmat.py rmat.npz        # 2^23 nodes, 100M edges, 32 features
    python experiments/make_rmat.py rmat_small.npz --scale 20 --edges 10M
    /usr/bin/time -v jgraph partition rmat.npz --num-parts 8 --method metis --out parts --json

R-MAT (Chakrabarti et al., 2004) with (a, b, c, d) = (0.57, 0.19, 0.19, 0.05), as the
Graph500 generator: a simple directed graph (no self-loops, no duplicates) with exactly
`--edges` edges over 2^scale nodes, ids shuffled, 10 label classes with a homophily
signal and `--feat` float32 features (`jgraph.data.synthetic`, kind rmat). It is
written uncompressed, so that `jgraph partition` reads it as fast as the disk allows.
"""
from __future__ import annotations

import argparse
import time

from jgraph.data import save_npz
from jgraph.data.synthetic import generate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .npz file to write")
    parser.add_argument("--scale", type=int, default=23, help="2^scale nodes (default 23)")
    parser.add_argument("--edges", default="100M", help="directed edges (default 100M)")
    parser.add_argument("--feat", type=int, default=32, help="feature width (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    spec = (f"synthetic:nodes={2 ** args.scale},edges={args.edges},kind=rmat,"
            f"feat={args.feat},seed={args.seed}")
    graph = generate(spec)
    save_npz(graph, args.out)
    print(f"{args.out}: {graph.total_nodes:,} nodes, {graph.num_edges:,} edges "
          f"({spec}) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
