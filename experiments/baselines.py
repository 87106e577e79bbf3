"""Each GNN beside the simple baselines: the majority class, label propagation, and the
GNN's own predictions corrected and smoothed (Correct & Smooth).

    python experiments/baselines.py CONFIG [CONFIG ...] [--seeds 0 1 2] [--devices 2]
                                    [--workdir runs/baselines] [--lp-steps 50]
                                    [--lp-alpha 0.9] [--set KEY=VALUE ...] [--json FILE]

For each node classification config and seed (train.seed), on `--devices` simulated
devices (data.num_parts set to match), two runs of `jgraph.train` in this process:

  gnn  the config as it is, with smooth.after_training=true: the model's test accuracy,
       and Correct & Smooth's, whose alphas the validation split chooses from the
       config's smooth grid (it holds the base predictions, both alphas 0, so C&S may
       keep them)
  lp   model.kind=label_propagation: the training labels propagated --lp-steps steps
       with --lp-alpha, fixed for every graph, not tuned (it learns nothing and draws
       nothing, so its seeds agree: it runs once, with the first seed)

A graph without a validation split (AIFB) has nothing to choose C&S's alphas with: its
GNN runs without C&S, and the C&S column says so.

The majority baseline (the training split's most frequent class) is the GNN run's.
Prints one JSON line per config and seed, then a table of mean ± standard deviation
over the seeds; --json FILE writes both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import jgraph

# column -> (run, key of its result.json)
COLUMNS = {
    "majority": ("gnn", "majority_test_acc"),
    "label propagation": ("lp", "test_acc"),
    "GNN": ("gnn", "test_acc"),
    "GNN + C&S": ("gnn", "smoothed_test_acc"),
}


def run(config: str, kind: str, seed: int, args: argparse.Namespace,
        smooth: bool = True) -> dict:
    """Train `kind` ("gnn" or "lp") of `config` with `seed` (the GNN followed by C&S
    where `smooth`); its result.json."""
    overrides = [f"data.num_parts={args.devices}", f"train.seed={seed}", *args.set]
    if kind == "gnn":
        overrides += ["smooth.after_training=true"] if smooth else []
    else:
        # It trains nothing: any config's train.mode and train.sampler are moot to it.
        overrides += ["model.kind=label_propagation", f"model.num_layers={args.lp_steps}",
                      f"model.alpha={args.lp_alpha}"]
    name = os.path.splitext(os.path.basename(config))[0]
    workdir = os.path.join(args.workdir, f"{name}-{kind}-seed{seed}")
    jgraph.train(config, workdir, overrides=overrides, resume="fresh", progress=False)
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    if kind == "gnn" and smooth:    # which alphas validation chose: (0, 0) kept the base
        with open(os.path.join(workdir, "correct_and_smooth.json")) as f:
            chosen = json.load(f)
        result["cs_alphas"] = [chosen["correct_alpha"], chosen["smooth_alpha"]]
    return result


def summary(values: list) -> str:
    if None in values:
        return "no validation split"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="node classification experiment YAMLs")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--workdir", default="runs/baselines")
    parser.add_argument("--lp-steps", type=int, default=50)
    parser.add_argument("--lp-alpha", type=float, default=0.9)
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides for every run, e.g. train.epochs=5")
    parser.add_argument("--json", help="write the runs and the table here")
    args = parser.parse_args()
    jgraph.use_devices(args.devices)          # first: simulate devices before JAX starts

    runs, table = [], []
    for config in args.configs:
        mine = []
        lp = run(config, "lp", args.seeds[0], args)
        smooth = lp.get("val_acc") is not None
        for seed in args.seeds:
            got = {"gnn": run(config, "gnn", seed, args, smooth), "lp": lp}
            row = {"config": config, "graph": got["gnn"]["graph"], "seed": seed,
                   "cs_alphas": got["gnn"].get("cs_alphas"),
                   **{column: got[kind].get(key) for column, (kind, key) in COLUMNS.items()}}
            print(json.dumps(row), flush=True)
            mine.append(row)
        table.append({"config": os.path.basename(config), "graph": mine[0]["graph"],
                      **{column: summary([r[column] for r in mine]) for column in COLUMNS},
                      "C&S alphas (correct, smooth) per seed":
                          " ".join(f"({a:g}, {b:g})" for a, b in
                                   (r["cs_alphas"] or (None, None) for r in mine)
                                   if a is not None) or "-"})
        runs += mine

    header = list(table[0])
    print(f"\ntest accuracy, mean ± std over seeds {args.seeds}, {args.devices} devices; "
          f"label propagation {args.lp_steps} steps, alpha {args.lp_alpha}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in table:
        print("| " + " | ".join(str(row[k]) for k in header) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"devices": args.devices, "seeds": args.seeds, "lp_steps": args.lp_steps,
                       "lp_alpha": args.lp_alpha, "runs": runs, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
