"""Control variates against plain sampling: accuracy, and the time to reach exact
training's accuracy.

    python experiments/cv_accuracy.py [--datasets cora facebook bench200k]
                                      [--methods exact cvd2 ...] [--seeds 0 1 2]
                                      [--devices 4] [--workdir DIR]

For each dataset and seed, runs of the same GraphSAGE model on `--devices` simulated
devices, each `jgraph train` in its own process, with the dataset's dropout wherever
the method allows it:

  exact      every in-neighbour at every layer (fanouts -1), with dropout
  cvd2       control variates at two sampled neighbours, with dropout (VR-GCN's CVD)
  cv2        control variates at two, without dropout (what they trained before CVD)
  plain2     plain neighbour sampling, two per node, with dropout
  shipped    plain neighbour sampling with experiments/sage_*.yaml's fanouts, dropout

Datasets: cora and facebook (experiments/cv_sage_cora.yaml, cv_sage_facebook.yaml with
sage_*.yaml's dropout), and bench200k, the 200k-node, 4M-edge graph of
../shared/peers/make_bench_graph.py (written on first use; its labels are uniformly
random, so its accuracies are chance, its times to exact's accuracy noise, and its
seconds an epoch the point).

Per run: test accuracy (of the best validation epoch, as `jgraph train` reports it),
the first epoch whose validation accuracy reaches 99% of the best validation accuracy
exact training reached with that seed (None: never), and the wall seconds to the end
of that epoch: the run's `setup_seconds` (loading, building, histories, compiling)
plus its epochs' own seconds (the steps, and history refreshes; not the per-epoch
validation, which measures and does not train). Prints one JSON line per run, then a
table of means and standard deviations over the seeds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "shared")
BENCH = os.path.join(tempfile.gettempdir(), "jgraph-bench200k.npz")


class Dataset(NamedTuple):
    config: str             # the control-variate config it starts from
    epochs: int
    dropout: list[str]      # sage_*.yaml's dropout, for the methods that drop
    shipped: str            # the plain fanouts sage_*.yaml ships
    more: list[str]         # further settings


DATASETS = {
    "cora": Dataset("cv_sage_cora.yaml", 50, ["model.dropout=0.5", "model.input_dropout=0.5"],
                    "[10,10]", []),
    "facebook": Dataset("cv_sage_facebook.yaml", 20,
                        ["model.dropout=0.5", "model.input_dropout=0.2"], "[10,10]", []),
    "bench200k": Dataset("cv_sage_facebook.yaml", 5, ["model.dropout=0.5"], "[15,10]",
                         [f"data.path={BENCH}", "data.symmetrize=false",
                          "data.normalize_features=false", "train.inference=sampled",
                          "train.eval_fanouts=[10,10]"]),
}
METHODS = {
    "exact": (["train.sampler=neighbor", "train.fanouts=[-1,-1]"], True),
    "cvd2": (["train.sampler=control_variate", "train.fanouts=[2,2]"], True),
    "cv2": (["train.sampler=control_variate", "train.fanouts=[2,2]", "model.dropout=0",
             "model.input_dropout=0"], False),
    "plain2": (["train.sampler=neighbor", "train.fanouts=[2,2]"], True),
    "shipped": (["train.sampler=neighbor"], True),
}


def settings(dataset: str, method: str, seed: int, devices: int) -> list[str]:
    d = DATASETS[dataset]
    given, drops = METHODS[method]
    out = [f"data.num_parts={devices}", f"train.seed={seed}", f"train.epochs={d.epochs}",
           *d.more, *(d.dropout if drops else []), *given]
    if method == "shipped":
        out.append(f"train.fanouts={d.shipped}")
    return out


def train(dataset: str, method: str, seed: int, devices: int, workdir: str) -> dict:
    """Run one case; returns its result.json and its metrics.jsonl rows."""
    command = ["jgraph", "train", os.path.join(HERE, DATASETS[dataset].config), "--devices",
               str(devices), "--workdir", workdir, "--fresh", "--quiet"]
    for s in settings(dataset, method, seed, devices):
        command += ["--set", s]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {"result": result, "rows": rows}


def to_target(run: dict, target: float) -> tuple[int | None, float | None]:
    """(the first epoch, counted from 1, whose validation accuracy reaches `target`, the
    wall seconds to its end), or (None, None)."""
    seconds = run["result"]["setup_seconds"]
    for e, row in enumerate(run["rows"]):
        seconds += row["epoch_seconds"] + (row.get("history_refresh_seconds") or 0.0)
        if row["val_acc"] >= target:
            return e + 1, seconds
    return None, None


def summary(values, digits: int = 3) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    spread = statistics.stdev(got) if len(got) > 1 else 0.0
    missed = len(values) - len(got)
    return (f"{statistics.mean(got):.{digits}f} ± {spread:.{digits}f}"
            + (f" ({missed} never)" if missed else ""))


def bench_graph() -> None:
    """The 200k-node graph, written once (whole or not at all)."""
    if os.path.exists(BENCH):
        return
    maker = os.path.join(SHARED, "peers", "make_bench_graph.py")
    if not os.path.exists(maker):
        raise SystemExit(f"bench200k: {maker} not found (../shared beside the checkout)")
    partial = BENCH + ".partial.npz"
    subprocess.run([sys.executable, maker, partial], check=True)
    os.replace(partial, BENCH)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS),
                        choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if "exact" not in args.methods:
        parser.error("--methods: exact is the reference the others are timed against")
    root = args.workdir or tempfile.mkdtemp(prefix="cv-accuracy-")
    rows = []
    for dataset in args.datasets:
        if dataset == "bench200k":
            bench_graph()
        for seed in args.seeds:
            runs = {m: train(dataset, m, seed, args.devices,
                             os.path.join(root, f"{dataset}-{m}-{seed}"))
                    for m in args.methods}
            target = 0.99 * max(r["val_acc"] for r in runs["exact"]["rows"])
            for method, run in runs.items():
                epochs, seconds = to_target(run, target)
                row = {"dataset": dataset, "method": method, "seed": seed,
                       "test_acc": run["result"]["test_acc"],
                       "epochs_to_99pct_exact_val": epochs,
                       "seconds_to_99pct_exact_val": seconds,
                       "best_val_acc": max(r["val_acc"] for r in run["rows"]),
                       "seconds_per_epoch": statistics.median(
                           r["epoch_seconds"] for r in run["rows"]),
                       "setup_seconds": run["result"]["setup_seconds"],
                       "seconds": run["result"]["seconds"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| dataset | method | test acc | epochs to 99% of exact's best val | "
          "seconds to it | seconds an epoch |")
    print("|---|---|---|---|---|---|")
    for dataset in args.datasets:
        for method in args.methods:
            mine = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            print(f"| {dataset} | {method} | {summary([r['test_acc'] for r in mine])} | "
                  f"{summary([r['epochs_to_99pct_exact_val'] for r in mine], 1)} | "
                  f"{summary([r['seconds_to_99pct_exact_val'] for r in mine], 1)} | "
                  f"{summary([r['seconds_per_epoch'] for r in mine], 2)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
