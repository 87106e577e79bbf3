"""`jgraph bench ...`: benchmarks that print one JSON line per measurement.

Each bench's settings are a dataclass of `jgraph.bench.config` (the experiment's
sections); a flag sets one of its keys (shown in the help, with its default) and
`--set section.key=value` any other. Building the parser imports no JAX: defaults and
choices are looked up when the help is printed.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import sys

from jgraph.cli.devices import quiet_cuda_plugin, use_devices

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def counts(text: str) -> tuple[int, ...]:
    """'1M,10M' -> (1000000, 10000000)."""
    out = []
    for item in filter(str.strip, text.split(",")):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", item)
        if not m:
            raise argparse.ArgumentTypeError(f"{item!r} is not a count like 1M or 500k")
        out.append(int(float(m[1]) * _SUFFIX[m[2].lower()]))
    return tuple(out)


def _plain(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in value.items()) + "}"
    return str(value)


def emitter(as_json: bool):
    def emit(row):
        if as_json:
            print(json.dumps(row), flush=True)
        else:
            print(", ".join(f"{k}={_plain(v)}" for k, v in row.items()), flush=True)
    return emit


# -- flags as config keys ----------------------------------------------------------------


def _settings_class(settings: str) -> type:
    """The dataclass of `jgraph.bench.config` named `settings`; importing it imports JAX,
    whose CUDA plugin's start-up noise is kept off the terminal."""
    with quiet_cuda_plugin(skip="jax" in sys.modules):
        from jgraph.bench import config
    return getattr(config, settings)


def _setting(settings: str, key: str):
    """(default, enum choices or None) of `key` in the bench dataclass `settings`."""
    import enum
    import typing

    cls = _settings_class(settings)
    value = cls()
    for part in key.split("."):
        kind = typing.get_type_hints(cls)[part]
        value, cls = getattr(value, part), kind
    members = [a for a in typing.get_args(cls) if isinstance(a, type)] or [cls]
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    return value, [m.value for m in enums[0]] if enums else None


def _shown(value) -> str:
    import enum
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return ",".join(_shown(v) for v in value) or "none"
    return "none" if value == "" else str(value)


class _Help(argparse.HelpFormatter):
    """Appends a config flag's key, default and choices, looked up only for --help."""

    def _get_help_string(self, action):
        key = getattr(action, "config_key", None)
        if key is None:
            return action.help
        default, choices = _setting(action.config_settings, key)
        shown = f": one of {', '.join(choices)}" if choices else ""
        if not isinstance(default, bool):
            shown += f"; default: {_shown(default)}"
        return f"{action.help} [{key}{shown}]"


def _flag(parser, settings: str, name: str, key: str, help: str, **kwargs) -> None:
    """`name` sets `key` of the bench dataclass `settings`; unset, the default stays."""
    if kwargs.get("action") not in ("store_true", "store_false"):
        kwargs.setdefault("metavar", name.lstrip("-").upper().replace("-", "_"))
    action = parser.add_argument(name, dest=f"config:{key}", default=argparse.SUPPRESS,
                                 help=help, **kwargs)
    action.config_key, action.config_settings = key, settings


def _settings(args, settings: str):
    """The bench dataclass `settings` with the flags given and `--set` applied; a value
    it refuses raises ConfigError naming the key."""
    from jgraph.config import override, with_values
    values = {dest.removeprefix("config:"): value for dest, value in vars(args).items()
              if dest.startswith("config:")}
    if args.graph is not None:
        values["data.path"] = args.graph
    if "train.fanouts" in values and settings == "TrainBench":
        # One GraphSAGE layer per hop, evaluated with the same fanouts.
        fanouts = values["train.fanouts"]
        values.setdefault("model.num_layers", len(fanouts.split(",")))
        values.setdefault("train.eval_fanouts", fanouts)
    return override(with_values(_settings_class(settings)(), values), args.set)


def _common(parser, settings: str, devices_flag: str = "--devices") -> None:
    """The flags every bench has: the graph, the mesh, the workload, the output."""
    parser.add_argument("graph", nargs="?",
                        help="the graph: an .npz, a built-in name (cora) or synthetic:... "
                             "[data.path; default: cora]")
    _flag(parser, settings, devices_flag, "data.num_parts",
          "devices = partitions (simulated on CPU)")
    _flag(parser, settings, "--method", "data.method", "partitioning")
    _flag(parser, settings, "--symmetrize", "data.symmetrize",
          "add every edge's reverse first (for graphs that list each undirected edge "
          "once, like facebook_musae)", action="store_true")
    _flag(parser, settings, "--batch-size", "train.batch_size", "seeds per device per step")
    _flag(parser, settings, "--seed", "train.seed", "partitioning, shuffles and sampling")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="set any other keys of the settings (e.g. exchange.max_rungs=2), "
                             "as jgraph train")
    parser.add_argument("--json", action="store_true", help="print JSON lines only")


def _epoch_flags(parser, settings: str) -> None:
    """The flags of the benches that time whole epochs over a mesh: how long, and how
    ids travel."""
    flag = functools.partial(_flag, parser, settings)
    flag("--epochs", "train.epochs", "measured epochs")
    flag("--strategy", "exchange.strategy", "exchange strategy for remote rows and frontier "
         "nodes (auto: ragged_all_to_all on GPU, all_to_all elsewhere)")
    flag("--growth", "exchange.growth", "ratio between the exchange's capacity rungs (each "
         "rung is a compiled branch: fewer rungs compile faster)")


def add_commands(sub) -> None:
    bench = sub.add_parser("bench", help="measure jgraph's distributed pieces",
                           description="Benchmarks; each prints figures, or JSON lines "
                                       "with --json.")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)

    ex = kinds.add_parser(
        "exchange", formatter_class=_Help,
        help="wire bytes and speed of each exchange strategy, and sharded embedding steps",
        description="Partition GRAPH, then fetch the features of sampled neighbourhoods with "
                    "every exchange strategy (one line each), and time a sparse-Adam step "
                    "of sharded embedding tables of each --embedding-rows size.")
    _common(ex, "ExchangeBench", devices_flag="--num-parts")
    flag = functools.partial(_flag, ex, "ExchangeBench")
    flag("--strategy", "strategies", "strategy to measure (repeatable; none: every one "
         "this backend has)", action="append")
    flag("--fanouts", "train.fanouts", "per-hop neighbours sampled around the seeds, "
         "seeds outward")
    flag("--batches", "batches", "calls measured per strategy")
    flag("--cache", "exchange.cache", "hot-node cache size as a fraction of the nodes "
         "(0 = off)")
    flag("--cache-by", "exchange.cache_by", "rank cached nodes by degree or by counted "
         "requests")
    flag("--growth", "exchange.growth", "ratio between capacity-ladder rungs")
    flag("--embedding-rows", "embedding_rows", "embedding table sizes to time "
         "(comma-separated, like 1M,10M; empty: none)", type=counts)
    flag("--embedding-dim", "embedding_dim", "embedding width")
    flag("--embedding-batch", "embedding_batch", "ids looked up per device per embedding "
         "step")
    ex.set_defaults(run=run_exchange)

    sa = kinds.add_parser(
        "sample", formatter_class=_Help,
        help="seeds and sampled edges per second of the on-device neighbour sampler",
        description="Partition GRAPH into one partition per device, then time whole epochs "
                    "of the node loader and multi-hop neighbour sampler over its training "
                    "nodes (after one warm-up epoch). Prints one line.")
    _common(sa, "SampleBench")
    flag = functools.partial(_flag, sa, "SampleBench")
    flag("--fanouts", "train.fanouts", "neighbours per hop, seeds outward (PyG's "
         "num_neighbors); -1 = all")
    _epoch_flags(sa, "SampleBench")
    flag("--replace", "replace", "sample with replacement", action="store_true")
    flag("--impl", "impl", "draw kernel: auto = Pallas on GPU, XLA elsewhere")
    sa.set_defaults(run=run_sample)

    tr = kinds.add_parser(
        "train", formatter_class=_Help,
        help="seeds per second and step time of the whole GraphSAGE training step",
        description="Partition GRAPH into one partition per device, then time whole epochs "
                    "of the fused training step (sample, fetch, forward, backward, Adam) of "
                    "a GraphSAGE model over its train_idx, after compiling and one warm-up "
                    "epoch. Prints one line.")
    _common(tr, "TrainBench")
    flag = functools.partial(_flag, tr, "TrainBench")
    flag("--fanouts", "train.fanouts", "neighbours per hop, seeds outward; one GraphSAGE "
         "layer per hop")
    _epoch_flags(tr, "TrainBench")
    flag("--steps", "steps", "time this many steps (after one warm-up step) instead of "
         "whole epochs (0): for a graph whose epoch is long")
    flag("--hidden", "model.hidden", "hidden width")
    flag("--aggregator", "model.aggregator", "GraphSAGE aggregator")
    flag("--precision", "train.precision", "what the layers compute in (bf16: float32 "
         "parameters, optimizer and loss)")
    flag("--mode", "train.mode", "sampled minibatches, or full-batch training (one step "
         "an epoch over every training node; --fanouts then only sets the layer count)")
    flag("--worst-case-capacities", "train.calibrate_capacities", "size the sampled blocks "
         "for the worst case instead of frontiers measured on the graph",
         action="store_false")
    flag("--cache", "exchange.cache", "hot-node feature cache, as a fraction of the nodes "
         "(0 = off)")
    flag("--cache-by", "exchange.cache_by", "rank cached nodes by out-degree or by "
         "requests counted on training batches")
    flag("--task", "task", "node classification over train_idx, or link prediction over "
         "the graph's edges (link.* settings; prints edges_per_s)")
    flag("--breakdown", "breakdown", "also time each phase of the step (sample, exchange, "
         "gather, forward, backward, optimizer, host): phase_seconds", action="store_true")
    flag("--profile", "train.profile", "write a JAX profiler trace of a few steps to this "
         "directory (open it in Perfetto or TensorBoard); implies --breakdown",
         metavar="DIR")
    tr.set_defaults(run=run_train)


def _start(args, settings: str):
    """The settings, then the devices they ask for (before JAX starts its backends)."""
    cfg = _settings(args, settings)
    use_devices(cfg.data.num_parts)
    from jgraph.progress import Progress
    return cfg, Progress(enabled=True), emitter(args.json)


def run_exchange(args) -> int:
    cfg, progress, emit = _start(args, "ExchangeBench")
    from jgraph.bench.exchange import bench_embedding, bench_exchange
    for row in bench_exchange(cfg, progress):
        emit(row)
    for rows in cfg.embedding_rows:
        emit(bench_embedding(cfg, rows, progress))
    return 0


def run_sample(args) -> int:
    cfg, progress, emit = _start(args, "SampleBench")
    from jgraph.bench.sample import bench_sample
    emit(bench_sample(cfg, progress))
    return 0


def run_train(args) -> int:
    cfg, progress, emit = _start(args, "TrainBench")
    from jgraph.bench.train import bench_train
    emit(bench_train(cfg, progress))
    return 0
