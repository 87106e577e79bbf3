"""Control variates against plain sampling: accuracy, and epochs to reach exact training.

    python experiments/cv_accuracy.py [--datasets cora facebook] [--seeds 0 1 2]
                                      [--devices 4] [--workdir DIR]

For each dataset (experiments/cv_sage_cora.yaml, cv_sage_facebook.yaml) and seed, four
runs of the same model (no dropout: control variates refuse it, so none of the four
uses it) on `--devices` simulated devices, each `jgraph train` in its own process:

  exact      every in-neighbour at every layer (fanouts -1): exact training
  cv2        control variates, two sampled neighbours per node
  plain2     plain neighbour sampling, two per node
  shipped    plain neighbour sampling with experiments/sage_*.yaml's fanouts (10, 10)

Per run: test accuracy (of the best validation epoch, as `jgraph train` reports it)
and the first epoch whose validation accuracy reaches 99% of the best validation
accuracy exact training reached with that seed (None: never). Prints one JSON line per
run, then a table of means and standard deviations over the seeds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {"cora": "cv_sage_cora.yaml", "facebook": "cv_sage_facebook.yaml"}
EPOCHS = {"cora": 50, "facebook": 20}
METHODS = {
    "exact": ["train.sampler=neighbor", "train.fanouts=[-1,-1]"],
    "cv2": ["train.sampler=control_variate", "train.fanouts=[2,2]"],
    "plain2": ["train.sampler=neighbor", "train.fanouts=[2,2]"],
    "shipped": ["train.sampler=neighbor", "train.fanouts=[10,10]"],
}


def train(dataset: str, method: str, seed: int, devices: int, workdir: str) -> dict:
    """Run one case; returns its result.json and its per-epoch validation accuracies."""
    settings = [f"data.num_parts={devices}", f"train.seed={seed}",
                f"train.epochs={EPOCHS[dataset]}", *METHODS[method]]
    command = ["jgraph", "train", os.path.join(HERE, CONFIGS[dataset]), "--devices",
               str(devices), "--workdir", workdir, "--fresh"]
    for s in settings:
        command += ["--set", s]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        val = [json.loads(line)["val_acc"] for line in f]
    return {"test_acc": result["test_acc"], "val_acc": val, "seconds": result["seconds"]}


def first_epoch(values, target):
    """The first epoch (counted from 1) whose value reaches `target`, or None."""
    return next((e + 1 for e, v in enumerate(values) if v >= target), None)


def summary(values):
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    spread = statistics.stdev(got) if len(got) > 1 else 0.0
    missed = len(values) - len(got)
    return f"{statistics.mean(got):.3f} ± {spread:.3f}" + (f" ({missed} never)" if missed
                                                          else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="cv-accuracy-")
    rows = []
    for dataset in args.datasets:
        for seed in args.seeds:
            runs = {m: train(dataset, m, seed, args.devices,
                             os.path.join(root, f"{dataset}-{m}-{seed}")) for m in METHODS}
            target = 0.99 * max(runs["exact"]["val_acc"])
            for method, run in runs.items():
                row = {"dataset": dataset, "method": method, "seed": seed,
                       "test_acc": run["test_acc"],
                       "epochs_to_99pct_exact_val": first_epoch(run["val_acc"], target),
                       "best_val_acc": max(run["val_acc"]), "seconds": run["seconds"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| dataset | method | test acc | epochs to 99% of exact's best val |")
    print("|---|---|---|---|")
    for dataset in args.datasets:
        for method in METHODS:
            mine = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            print(f"| {dataset} | {method} | {summary([r['test_acc'] for r in mine])} | "
                  f"{summary([r['epochs_to_99pct_exact_val'] for r in mine])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
