"""Partition quality across processes: the bounded-memory route's edge cut against
in-memory METIS, at 1, 2, 4 (and 8) processes, on graphs with communities, at budgets
that put a small graph in the regime of a large one.

    python experiments/partition_quality.py [--data ../shared/data] [--processes 1,2,4]
    python experiments/partition_quality.py --cases planted --planted-edges 50M
    python experiments/partition_quality.py --cases rmat --processes 1,2,4,8

Each graph is written once as a chunked directory, prepared as its case says
(`jgraph convert`). METIS partitions it whole (`--method metis`); the bounded route
partitions it under `python -m jgraph.launch --num-processes N` with `--coarse-entries`
= adjacency entries / 50 and `--range-entries` = entries / 64 (a large graph's shape:
several coarsening levels, many ranges, many pieces per pass). Cases: facebook_musae
(symmetrised), heco_acm (with inverse relations: a heterogeneous citation graph), and
`planted`: a degree-corrected block model (`synthetic:kind=powerlaw`) with many small
planted communities (classes) and power-law degrees; `rmat`: the Graph500 R-MAT of
`experiments/make_rmat.py` (2^23 nodes, 100M directed edges, ids shuffled, no
features), large enough to be in that regime at the default budgets, which it runs
at. Prints one JSON line a run, then
the table: cut, cut over METIS's, the worst balance, seconds, the largest process's
peak memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cases(data: str, planted_edges: str, rmat_edges: str):
    """(name, source, how it is prepared, whether the budgets are scaled to it)."""
    yield "facebook_musae", os.path.join(data, "facebook_musae.npz"), ["--symmetrize"], True
    yield "heco_acm", os.path.join(data, "heco_acm.npz"), ["--add-reverse"], True
    nodes = max(1000, int(_count(planted_edges) // 16))
    planted = (f"synthetic:kind=powerlaw,nodes={nodes},edges={planted_edges},"
               f"classes={max(8, nodes // 500)},homophily=0.9,feat=0")
    yield "planted", planted, ["--symmetrize"], True
    yield "rmat", f"synthetic:kind=rmat,nodes={2 ** 23},edges={rmat_edges},feat=0", [], False


def _count(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "B": 1e9}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def jgraph(*argv: str, processes: int = 1) -> dict:
    """Run a jgraph command (under the launcher for several processes); its JSON line."""
    cmd = [sys.executable, "-m", "jgraph.cli.main", *argv]
    if processes > 1:
        cmd = [sys.executable, "-m", "jgraph.launch", "--num-processes", str(processes),
               "--", "jgraph", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(argv[:2])}: failed\n{proc.stderr[-3000:]}")
    line = [x for x in proc.stdout.splitlines() if "{" in x][-1]
    return json.loads(line[line.index("{"):])       # the launcher prefixes "[rank 0] "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data"))
    parser.add_argument("--num-parts", type=int, default=8)
    parser.add_argument("--processes", default="1,2,4",
                        help="process counts, comma-separated (default 1,2,4)")
    parser.add_argument("--cases", default="facebook_musae,heco_acm,planted",
                        help="comma-separated; also: rmat")
    parser.add_argument("--planted-edges", default="2M",
                        help="directed edges of the planted graph before it is "
                             "symmetrised (default 2M)")
    parser.add_argument("--rmat-edges", default="100M",
                        help="directed edges of the R-MAT graph (default 100M)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp-dir", help="where the graphs and partitions go")
    args = parser.parse_args()
    wanted = args.cases.split(",")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        for name, source, prepare, scaled in cases(args.data, args.planted_edges,
                                                   args.rmat_edges):
            if name not in wanted:
                continue
            graph = os.path.join(tmp, name)
            jgraph("convert", source, graph, *prepare, "--json")
            metis = jgraph("partition", graph, "--method", "metis", "--num-parts",
                           str(args.num_parts), "--seed", str(args.seed), "--out",
                           os.path.join(tmp, f"{name}.metis"), "--json")
            entries = 2 * metis["num_edges"]
            budgets = ["--coarse-entries", str(max(1024, entries // 50)),
                       "--range-entries", str(max(1024, entries // 64))] if scaled else []
            row = {"case": name, "processes": 0, **metis}
            print(json.dumps(row), flush=True)
            rows.append(row)
            for n in (int(x) for x in args.processes.split(",")):
                out = os.path.join(tmp, f"{name}.{n}")
                row = {"case": name, "processes": n,
                       **jgraph("partition", graph, "--num-parts", str(args.num_parts),
                                "--seed", str(args.seed), "--out", out, "--json", *budgets,
                                processes=n)}
                row["cut_over_metis"] = row["edge_cut_fraction"] / metis["edge_cut_fraction"]
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n{'case':<16} {'route':<14} {'cut':>7} {'/METIS':>7} {'worst balance':>22} "
          f"{'seconds':>8} {'peak GiB':>9}")
    for r in rows:
        worst = max(r["balance"], key=r["balance"].get)
        route = "METIS" if not r["processes"] else f"{r['processes']} process" + (
            "es" if r["processes"] > 1 else "")
        print(f"{r['case']:<16} {route:<14} {r['edge_cut_fraction']:>7.4f} "
              f"{r.get('cut_over_metis', 1.0):>7.3f} "
              f"{worst + ' ' + format(r['balance'][worst], '.3f'):>22} {r['seconds']:>8.1f} "
              f"{r['peak_rss_bytes'] / 2**30:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
