"""`jgraph bench ...`: benchmarks that print one JSON line per measurement."""
from __future__ import annotations

import argparse
import json
import re

from jgraph.cli.devices import UsageError, use_devices

# jgraph.sharded.Strategy's values, listed here so that building the parser imports no JAX.
STRATEGIES = ["auto", "all_to_all", "all_gather", "ppermute", "ragged_all_to_all"]
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def counts(text: str) -> tuple[int, ...]:
    """'1M,10M' -> (1000000, 10000000)."""
    out = []
    for item in filter(str.strip, text.split(",")):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", item)
        if not m:
            raise argparse.ArgumentTypeError(f"{item!r} is not a count like 1M or 500k")
        out.append(int(float(m[1]) * _SUFFIX[m[2].lower()]))
        if out[-1] < 1:
            raise argparse.ArgumentTypeError(f"{item!r} is not a count of at least 1")
    return tuple(out)


def fanouts(text: str, allow_all: bool = False) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of ints") from None
    low = -1 if allow_all else 1
    if not values or any(v < low or v == 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"fanouts must be positive{' or -1 (all neighbours)' if allow_all else ''}, "
            f"got {text!r}")
    return values


def sample_fanouts(text: str) -> tuple[int, ...]:
    return fanouts(text, allow_all=True)


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


def add_commands(sub) -> None:
    bench = sub.add_parser("bench", help="measure jgraph's distributed pieces",
                           description="Benchmarks; each prints figures, or JSON lines "
                                       "with --json.")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    ex = kinds.add_parser(
        "exchange", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="wire bytes and speed of each exchange strategy, and sharded embedding steps",
        description="Partition GRAPH, then fetch the features of sampled neighbourhoods with "
                    "every exchange strategy (one line each), and time a sparse-Adam step "
                    "of sharded embedding tables of each --embedding-rows size.")
    ex.add_argument("graph", help="a homogeneous graph with features: an .npz, cora, or "
                                  "synthetic:...")
    ex.add_argument("--num-parts", type=int, default=8,
                    help="partitions = devices (simulated on CPU)")
    ex.add_argument("--method", choices=["metis", "random"], default="metis")
    ex.add_argument("--strategy", action="append", choices=STRATEGIES,
                    help="strategy to measure (repeatable; default: all this backend has)")
    ex.add_argument("--batch-size", type=int, default=1024, help="seeds per device per call")
    ex.add_argument("--fanouts", type=fanouts, default=(15, 10, 5),
                    help="per-hop neighbours sampled around the seeds, seeds outward")
    ex.add_argument("--batches", type=int, default=8, help="calls measured per strategy")
    ex.add_argument("--cache", type=float, default=0.0,
                    help="hot-node cache size as a fraction of the nodes (0 = off)")
    ex.add_argument("--cache-by", choices=["degree", "frequency"], default="degree",
                    help="rank cached nodes by degree or by counted requests")
    ex.add_argument("--growth", type=float, default=1.25,
                    help="ratio between capacity-ladder rungs")
    ex.add_argument("--embedding-rows", type=counts, default=(1_000_000, 10_000_000),
                    help="embedding table sizes to time (comma-separated; empty: none)")
    ex.add_argument("--embedding-dim", type=int, default=32)
    ex.add_argument("--embedding-batch", type=int, default=8192,
                    help="ids looked up per device per embedding step")
    ex.add_argument("--symmetrize", action="store_true",
                    help="add every edge's reverse first (for graphs that list each "
                         "undirected edge once, like facebook_musae)")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--json", action="store_true", help="print JSON lines only")
    ex.set_defaults(run=run_exchange)

    sa = kinds.add_parser(
        "sample", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="seeds and sampled edges per second of the on-device neighbour sampler",
        description="Partition GRAPH into one partition per device, then time whole epochs "
                    "of the node loader and multi-hop neighbour sampler over its training "
                    "nodes (after one warm-up epoch). Prints one line.")
    sa.add_argument("graph", help="a homogeneous graph with a train split: an .npz, cora, "
                                  "or synthetic:...")
    add_epoch_bench_args(sa, fanouts=sample_fanouts,
                         fanouts_help="neighbours per hop, seeds outward (PyG's "
                                      "num_neighbors); -1 = all")
    sa.add_argument("--replace", action="store_true", help="sample with replacement")
    sa.add_argument("--impl", choices=["auto", "xla", "pallas"], default="auto",
                    help="draw kernel: auto = Pallas on GPU, XLA elsewhere")
    sa.add_argument("--relay", action="store_true",
                    help="relay the busiest pairs' excess (less padding, longer compile)")
    sa.set_defaults(run=run_sample)

    tr = kinds.add_parser(
        "train", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="seeds per second and step time of the whole GraphSAGE training step",
        description="Partition GRAPH into one partition per device, then time whole epochs "
                    "of the fused training step (sample, fetch, forward, backward, Adam) of "
                    "a GraphSAGE model over its train_idx, after compiling and one warm-up "
                    "epoch. Prints one line.")
    tr.add_argument("graph", help="a homogeneous graph with feat, label and train_idx: an "
                                  ".npz, cora, or synthetic:...")
    add_epoch_bench_args(tr, fanouts=fanouts,
                         fanouts_help="neighbours per hop, seeds outward; one GraphSAGE "
                                      "layer per hop")
    tr.add_argument("--hidden", type=int, default=256)
    tr.add_argument("--aggregator", choices=["mean", "gcn", "pool"], default="mean")
    tr.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="what the layers compute in (bf16: float32 parameters, "
                         "optimizer and loss)")
    tr.add_argument("--worst-case-capacities", action="store_true",
                    help="size the sampled blocks for the worst case instead of "
                         "frontiers measured on the graph")
    tr.add_argument("--cache", type=float, default=0.0,
                    help="hot-node feature cache, as a fraction of the nodes (0 = off)")
    tr.add_argument("--cache-by", choices=["degree", "frequency"], default="degree",
                    help="rank cached nodes by out-degree or by requests counted on "
                         "training batches")
    tr.add_argument("--breakdown", action="store_true",
                    help="also time each phase of the step (sample, exchange, gather, "
                         "forward, backward, optimizer, host): phase_seconds")
    tr.add_argument("--profile", metavar="DIR",
                    help="write a JAX profiler trace of a few steps to DIR (open it in "
                         "Perfetto or TensorBoard); implies --breakdown")
    tr.set_defaults(run=run_train)


def add_epoch_bench_args(parser, *, fanouts, fanouts_help: str) -> None:
    """The options `bench sample` and `bench train` share: the mesh, the sampling, the
    exchange and the output."""
    parser.add_argument("--devices", type=int, default=1,
                        help="devices = partitions (simulated on CPU)")
    parser.add_argument("--method", choices=["metis", "random"], default="metis")
    parser.add_argument("--fanouts", type=fanouts, default=(15, 10, 5), help=fanouts_help)
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="seeds per device per step")
    parser.add_argument("--epochs", type=int, default=1, help="measured epochs")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto",
                        help="exchange strategy for remote rows and frontier nodes (auto: "
                             "ragged_all_to_all on GPU, all_to_all elsewhere)")
    parser.add_argument("--growth", type=float, default=2.0,
                        help="ratio between the exchange's capacity rungs (each rung is a "
                             "compiled branch: fewer rungs compile faster)")
    parser.add_argument("--symmetrize", action="store_true",
                        help="add every edge's reverse first (e.g. for facebook_musae)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON lines only")


def run_exchange(args) -> int:
    if args.num_parts < 1:
        raise UsageError(f"--num-parts must be >= 1, got {args.num_parts}")
    use_devices(args.num_parts)
    from jgraph.bench.exchange import ExchangeBench, bench_embedding, bench_exchange
    from jgraph.exchange import Strategy
    from jgraph.progress import Progress
    if min(args.num_parts, args.batch_size, args.batches, args.embedding_dim,
           args.embedding_batch) < 1:
        raise UsageError("--num-parts, --batch-size, --batches, --embedding-dim and "
                         "--embedding-batch must be >= 1")
    if not 0.0 <= args.cache <= 1.0:
        raise UsageError(f"--cache is a fraction of the nodes in [0, 1], got {args.cache}")
    cfg = ExchangeBench(
        graph=args.graph, num_parts=args.num_parts, method=args.method,
        strategies=tuple(Strategy(s) for s in args.strategy or ()),
        batch_size=args.batch_size, fanouts=args.fanouts, batches=args.batches,
        cache=args.cache, cache_by=args.cache_by, growth=args.growth, seed=args.seed,
        symmetrize=args.symmetrize,
        embedding_rows=args.embedding_rows, embedding_dim=args.embedding_dim,
        embedding_batch=args.embedding_batch)
    progress = Progress(enabled=True)
    emit = emitter(args.json)
    for row in bench_exchange(cfg, progress):
        emit(row)
    for rows in cfg.embedding_rows:
        emit(bench_embedding(cfg, rows, progress))
    return 0


def run_sample(args) -> int:
    if min(args.devices, args.batch_size, args.epochs) < 1:
        raise UsageError("--devices, --batch-size and --epochs must be >= 1")
    if args.growth <= 1:
        raise UsageError(f"--growth must be > 1, got {args.growth}")
    use_devices(args.devices)
    from jgraph.bench.sample import SampleBench, bench_sample
    from jgraph.exchange import Strategy
    from jgraph.progress import Progress
    cfg = SampleBench(graph=args.graph, devices=args.devices, method=args.method,
                      fanouts=args.fanouts, batch_size=args.batch_size, epochs=args.epochs,
                      replace=args.replace, impl=args.impl, strategy=Strategy(args.strategy),
                      growth=args.growth, relay=args.relay,
                      symmetrize=args.symmetrize, seed=args.seed)
    emitter(args.json)(bench_sample(cfg, Progress(enabled=True)))
    return 0


def run_train(args) -> int:
    if min(args.devices, args.batch_size, args.epochs, args.hidden) < 1:
        raise UsageError("--devices, --batch-size, --epochs and --hidden must be >= 1")
    if args.growth <= 1:
        raise UsageError(f"--growth must be > 1, got {args.growth}")
    if not 0.0 <= args.cache <= 1.0:
        raise UsageError(f"--cache is a fraction of the nodes in [0, 1], got {args.cache}")
    use_devices(args.devices)
    from jgraph.bench.train import TrainBench, bench_train
    from jgraph.exchange import Strategy
    from jgraph.models import Aggregator
    from jgraph.progress import Progress
    from jgraph.train.experiment import Precision
    cfg = TrainBench(graph=args.graph, devices=args.devices, method=args.method,
                     fanouts=args.fanouts, batch_size=args.batch_size, hidden=args.hidden,
                     aggregator=Aggregator(args.aggregator), epochs=args.epochs,
                     strategy=Strategy(args.strategy), growth=args.growth,
                     symmetrize=args.symmetrize, seed=args.seed, profile=args.profile,
                     breakdown=args.breakdown, precision=Precision(args.precision),
                     calibrate=not args.worst_case_capacities, cache=args.cache,
                     cache_by=args.cache_by)
    emitter(args.json)(bench_train(cfg, Progress(enabled=True)))
    return 0
