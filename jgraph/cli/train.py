"""`jgraph train CONFIG`, `jgraph eval WORKDIR` and `jgraph smooth WORKDIR`."""
from __future__ import annotations

import os

from jgraph.progress import get as get_logger


def add_commands(sub) -> None:
    train = sub.add_parser(
        "train", help="train a GNN from an experiment config",
        description="Partition the config's graph onto the devices (or open its partition "
                    "directory) and train; writes WORKDIR/metrics.jsonl (one line per epoch), "
                    "WORKDIR/result.json, WORKDIR/curves.png and the trained model.")
    train.add_argument("config", help="experiment YAML, e.g. experiments/sage_cora.yaml")
    train.add_argument("--set", dest="assignments", action="extend", nargs="+", default=[],
                       metavar="KEY=VALUE",
                       help="override config fields, e.g. --set model.hidden=128 "
                            "train.epochs=5 (repeatable)")
    train.add_argument("--workdir", help="where the run writes (default runs/<the config file's "
                       "name>, e.g. runs/sage_cora)")
    train.add_argument("--devices", type=int,
                       help="simulate this many devices on CPU (on accelerators the mesh "
                            "uses the devices there); per process in a multi-process job")
    start = train.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in WORKDIR, and fail if "
                            "there is none (without this flag a run resumes when WORKDIR "
                            "has a checkpoint, and starts afresh when it has none)")
    start.add_argument("--fresh", action="store_true",
                       help="delete WORKDIR's checkpoints and start over")
    train.set_defaults(run=run_train)

    ev = sub.add_parser("eval", help="evaluate a trained run",
                        description="Evaluate the model that `jgraph train` saved in WORKDIR.")
    ev.add_argument("workdir")
    ev.add_argument("--split", action="append", dest="splits",
                    help="split to score (repeatable; default val and test)")
    ev.add_argument("--inference", choices=["sampled", "full"],
                    help="sampled with the config's eval_fanouts, or layer-wise full-graph "
                         "(default: the config's train.inference)")
    ev.add_argument("--devices", type=int, help="simulate this many devices on CPU "
                    "(default: as many as the run trained on)")
    ev.set_defaults(run=run_eval)

    sm = sub.add_parser(
        "smooth", help="Correct & Smooth a trained node classification run",
        description="Correct the saved model's class probabilities with the training "
                    "labels' errors and smooth them over the graph (Correct & Smooth, "
                    "Huang et al. 2021), on the run's devices; the alphas are chosen on "
                    "the validation split from a grid holding the base predictions "
                    "(both 0). Writes WORKDIR/correct_and_smooth.json and prints its "
                    "scores.")
    sm.add_argument("workdir")
    sm.add_argument("--correct-steps", type=int,
                    help="steps of the error propagation (default: the run's "
                         "smooth.correct_steps, 50 unless set)")
    sm.add_argument("--smooth-steps", type=int,
                    help="steps of the smoothing propagation (default: the run's "
                         "smooth.smooth_steps, 50 unless set)")
    sm.add_argument("--correct-alphas", type=_alphas,
                    help="comma-separated alphas to try for the correction (default: "
                         "the run's smooth.correct_alphas, 0,0.5,0.8,1 unless set)")
    sm.add_argument("--smooth-alphas", type=_alphas,
                    help="comma-separated alphas to try for the smoothing (default: the "
                         "run's smooth.smooth_alphas, 0,0.5,0.8,1 unless set)")
    sm.add_argument("--scale", type=float,
                    help="scale every row's correction by this instead of autoscaling it "
                         "to the training rows' mean error (default: the run's "
                         "smooth.autoscale and smooth.scale)")
    sm.add_argument("--devices", type=int, help="simulate this many devices on CPU "
                    "(default: as many as the run trained on)")
    sm.set_defaults(run=run_smooth)


def _alphas(text: str) -> tuple[float, ...]:
    import argparse
    try:
        return tuple(float(a) for a in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated numbers") from None


def run_train(args) -> int:
    from jgraph.cli.devices import use_devices
    use_devices(args.devices)
    import jax

    from jgraph.config import load
    from jgraph.jobs.experiment import Experiment
    from jgraph.progress import Progress
    from jgraph.train.loop import Resume, RunStopped, train_and_evaluate
    from jgraph.train.report import strict_json
    from jgraph.train.workdir import default_workdir

    config = load(Experiment, args.config, args.assignments)
    workdir = args.workdir or default_workdir(args.config, config.name)
    resume = Resume.REQUIRE if args.resume else Resume.FRESH if args.fresh else Resume.AUTO
    first = jax.process_index() == 0          # one process speaks for a multi-process job
    try:
        result = train_and_evaluate(config, workdir,
                                    Progress(enabled=first and not args.quiet), resume)
    except RunStopped as stopped:
        get_logger("train").warning("jgraph train: %s", stopped)
        return 128 + stopped.signum
    # The scores (val_acc ... or val_mrr, test_hits@k ...; smoothed_val_acc ... after
    # Correct & Smooth), then how the run went (a run that learns nothing compiles no
    # step).
    scores = [k for k in result if k.startswith(("val_", "test_", "smoothed_"))]
    summary = {k: result[k] for k in (*scores, "best_epoch", "final_loss", "compiles",
                                      "seconds") if k in result}
    if first:
        print(strict_json({"workdir": workdir, **summary}))
    return 0


def trained_partition(workdir: str) -> str:
    """The partition directory a run in `workdir` trained on: its saved config's
    data.path when that is one (as `jgraph.train.model.open_trained` opens it), else
    WORKDIR/partition. Read without JAX, which must not start before `use_devices`."""
    import yaml
    try:
        with open(os.path.join(workdir, "config.yaml")) as f:
            path = yaml.safe_load(f)["data"]["path"]
        # Relative to the config file, as `jgraph.config.load` reads it.
        path = os.path.join(workdir, path)
        if os.path.exists(os.path.join(path, "meta.json")):
            return path
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        pass
    return os.path.join(workdir, "partition")


def run_devices(workdir: str) -> int | None:
    """The devices a run in `workdir` trained on (per process in a multi-process job,
    as --devices counts them): its partition's, one per partition, whether the run
    partitioned its graph or was given a partition directory; None if there is none to
    read."""
    import json

    from jgraph.cli.devices import NUM_PROCESSES_ENV
    try:
        with open(os.path.join(trained_partition(workdir), "meta.json")) as f:
            parts = int(json.load(f)["num_parts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    env = os.environ
    processes = int(env.get(NUM_PROCESSES_ENV) or env.get("SLURM_NTASKS")
                    or env.get("OMPI_COMM_WORLD_SIZE") or 1)
    return max(parts // processes, 1)


def run_eval(args) -> int:
    from jgraph.cli.devices import use_devices
    # Without --devices, as many as the run trained on: its partitions need them.
    use_devices(args.devices if args.devices is not None else run_devices(args.workdir))
    import jax

    from jgraph.jobs.experiment import Inference
    from jgraph.progress import Progress
    from jgraph.train.model import evaluate_run
    from jgraph.train.report import strict_json

    splits = tuple(args.splits or ("val", "test"))
    inference = Inference(args.inference) if args.inference else None
    first = jax.process_index() == 0          # one process speaks for a multi-process job
    scores = evaluate_run(args.workdir, splits, inference,
                          Progress(enabled=first and not args.quiet))
    if not first:
        return 0
    print(strict_json({"workdir": args.workdir, **{
        f"{split}_{k}": v for split, s in scores.items() for k, v in s.items()}}))
    return 0


def run_smooth(args) -> int:
    from jgraph.cli.devices import use_devices
    use_devices(args.devices if args.devices is not None else run_devices(args.workdir))
    import jax

    from jgraph.train.api import smooth
    from jgraph.train.report import strict_json

    first = jax.process_index() == 0          # one process speaks for a multi-process job
    result = smooth(args.workdir, correct_steps=args.correct_steps,
                    smooth_steps=args.smooth_steps, correct_alphas=args.correct_alphas,
                    smooth_alphas=args.smooth_alphas, scale=args.scale,
                    progress=first and not args.quiet)
    if first:
        print(strict_json({"workdir": args.workdir, **{
            k: result[k] for k in ("base_val_acc", "base_test_acc", "val_acc", "test_acc",
                                   "correct_alpha", "smooth_alpha", "seconds")}}))
    return 0
