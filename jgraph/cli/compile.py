"""`jgraph compile CONFIG --target h100|h200|cpu --devices N [--program P]`: build one of
a run's programs (its training step by default) for hardware this machine may not
have, and report what it needs."""
from __future__ import annotations

import json
import os

TARGETS = ["h100", "h200", "cpu"]   # jgraph.target.Target's values (no JAX import here)
# jgraph.jobs.programs.Program's values
PROGRAMS = ["train", "eval", "full_graph", "correct_and_smooth"]


def add_commands(sub) -> None:
    c = sub.add_parser(
        "compile", help="build a run's training step (or another of its programs) for a "
                        "target (e.g. 8 H100s) without it",
        description="Build the training step of CONFIG (or the --program asked for) as "
                    "`jgraph train` would, compile it "
                    "for N devices of TARGET (an H100 or H200 mesh is described, not needed: "
                    "XLA compiles the GPU program on this machine), and print whether it "
                    "compiles, the seconds it took, the bytes each device holds (arguments, "
                    "outputs, temporaries), the Pallas kernels and the collectives in it.")
    c.add_argument("config", help="experiment YAML, e.g. experiments/sage_cora.yaml")
    c.add_argument("--target", choices=TARGETS, default="h100",
                   help="the hardware to compile for (default: h100)")
    c.add_argument("--devices", required=True,
                   help="devices (= partitions), or several counts, e.g. 8,16,32,64: one "
                        "report (one JSON line) each")
    c.add_argument("--set", dest="assignments", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE", help="override config fields (as jgraph train)")
    c.add_argument("--program", choices=PROGRAMS, default="train",
                   help="which program of the run (of the config's task: node "
                        "classification or link prediction): train, one training step "
                        "(default); eval, one batch of sampled evaluation "
                        "(train.eval_batch_size seeds, train.eval_fanouts; link prediction: "
                        "a batch of node embeddings); full_graph, layer-wise full-graph "
                        "inference over every node; correct_and_smooth, Correct & Smooth "
                        "of node classification's class probabilities (the smooth "
                        "section's steps), one grid point")
    c.add_argument("--abstract", action="store_true",
                   help="build shapes from the graph's counts instead of partitioning it "
                        "(data.path must be synthetic:nodes=...,edges=...; nothing is "
                        "generated), e.g. to plan a papers100M-sized job")
    c.add_argument("--json", action="store_true", help="print one JSON line")
    c.set_defaults(run=run_compile)


def device_counts(text: str) -> list[int]:
    """--devices: one count or a comma-separated list of them."""
    from jgraph.cli.devices import UsageError
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--devices: give a device count or counts separated by commas "
                         f"(8,16,32), got {text!r}") from None
    if min(counts) < 1:
        raise UsageError(f"--devices must be >= 1, got {text!r}")
    return counts


def run_compile(args) -> int:
    from jgraph.cli.devices import UsageError, use_devices
    counts = device_counts(args.devices)
    gpu = args.target != "cpu"
    if gpu:
        # XLA describes GPU targets from the CPU platform; JAX must not start CUDA.
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if platforms and platforms != "cpu":
            raise UsageError(f"jgraph compile --target {args.target} runs JAX on the CPU; "
                             f"unset JAX_PLATFORMS (it is {platforms!r}) or set it to cpu")
        os.environ["JAX_PLATFORMS"] = "cpu"
    # The graph's arrays live on CPU devices while the step is built, one per partition
    # (in abstract mode there are none, but a CPU target's mesh is made of them).
    use_devices(1 if args.abstract and gpu else max(counts))

    from jgraph.config import load
    from jgraph.jobs.experiment import Experiment
    from jgraph.jobs.programs import Program
    from jgraph.progress import Progress
    from jgraph.target import Target
    config = load(Experiment, args.config, args.assignments)
    progress = Progress(enabled=not args.json)
    target = Target(args.target)
    if args.abstract:
        from jgraph.planner.compile import compile_abstract as compile_one
    else:
        from jgraph.planner.compile import compile_config as compile_one
    ok = True
    for devices in counts:
        report = compile_one(config, target, devices, progress, Program(args.program))
        ok = ok and report["ok"]
        if args.json:
            print(json.dumps(report), flush=True)
        else:
            for key, value in report.items():
                print(f"{key}: {value}")
            print(flush=True)
    return 0 if ok else 1
