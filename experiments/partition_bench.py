"""Partitioning benchmark: edge cut of METIS vs random, balance, time and peak memory.

    python experiments/partition_bench.py [--data ../shared/data] [--num-parts 8] [--quick]

Each case runs `jgraph partition ... --json` in its own process (so peak memory is the
case's own) and prints that JSON line with a `case` field, then a summary table.
Cases: facebook_musae (symmetrised) by METIS and by random; kgbench_am_wip (with reverse
relations, as R-GCN uses it) by METIS; a 10M-edge synthetic power-law graph by METIS.
`--quick` runs only the facebook cases.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cases(data: str, quick: bool):
    fb = os.path.join(data, "facebook_musae.npz")
    yield "facebook_musae metis", [fb, "--symmetrize", "--method", "metis"]
    yield "facebook_musae random", [fb, "--symmetrize", "--method", "random"]
    yield "facebook_musae metis, no rebalance", [fb, "--symmetrize", "--method", "metis",
                                                 "--no-rebalance"]
    if quick:
        return
    yield "kgbench_am_wip metis", [os.path.join(data, "kgbench_am_wip.npz"), "--add-reverse",
                                   "--method", "metis"]
    yield "kgbench_am_wip random", [os.path.join(data, "kgbench_am_wip.npz"), "--add-reverse",
                                    "--method", "random"]
    yield "synthetic 1M nodes / 10M edges metis", ["synthetic:nodes=1M,edges=10M",
                                                   "--method", "metis"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data"))
    parser.add_argument("--num-parts", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, argv) in enumerate(cases(args.data, args.quick)):
            cmd = [sys.executable, "-m", "jgraph.cli.main", "partition", *argv,
                   "--num-parts", str(args.num_parts), "--out", os.path.join(tmp, str(i)),
                   "--json"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            row = {"case": name, **json.loads(proc.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\n{'case':<40} {'cut':>7} {'worst balance':>22} {'seconds':>8} {'peak GiB':>9}")
    for r in rows:
        worst = max(r["balance"], key=r["balance"].get)
        print(f"{r['case']:<40} {r['edge_cut_fraction']:>7.4f} "
              f"{worst + ' ' + format(r['balance'][worst], '.3f'):>22} {r['seconds']:>8.1f} "
              f"{r['peak_rss_bytes'] / 2**30:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
