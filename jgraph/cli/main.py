"""Entry point: parse the subcommand and turn jgraph's input errors into clear messages."""
from __future__ import annotations

import argparse
import os
import sys

from jgraph.cli import bench as bench_cmd
from jgraph.cli import compile as compile_cmd
from jgraph.cli import convert as convert_cmd
from jgraph.cli import embed as embed_cmd
from jgraph.cli import partition as partition_cmd
from jgraph.cli import train as train_cmd
from jgraph.cli.devices import UsageError
from jgraph.config import ConfigError
from jgraph.data import DatasetError, GraphError
from jgraph.partition import IdRangeError, PartitionError, PartitionFormatError
from jgraph.progress import level_of
from jgraph.progress import setup as setup_logging

# Set to see the Python traceback of an operating-system error (reported in one line).
TRACEBACK_ENV = "JGRAPH_TRACEBACK"

# Errors caused by what the user asked for: reported in one line, exit status 2.
USER_ERRORS = (DatasetError, GraphError, PartitionError, PartitionFormatError, IdRangeError,
               UsageError, ConfigError)


def user_errors() -> tuple[type[Exception], ...]:
    """USER_ERRORS plus those of modules that import JAX, if the command loaded them."""
    dist = sys.modules.get("jgraph.sharded")
    checkpoint = sys.modules.get("jgraph.train.checkpoint")
    target = sys.modules.get("jgraph.target")
    loop = sys.modules.get("jgraph.train.loop")
    workdir = sys.modules.get("jgraph.train.workdir")
    return (USER_ERRORS + ((dist.MeshError, dist.ExchangeOverflowError) if dist else ())
            + ((checkpoint.CheckpointError,) if checkpoint else ())
            + ((target.TargetError,) if target else ())
            + ((loop.TrainingDiverged,) if loop else ())
            + ((workdir.WorkdirError,) if workdir else ()))


def _version() -> str:
    """jgraph's version and the JAX it runs on, without importing JAX."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return (f"jgraph {installed('jgraph')} (jax {installed('jax')}, "
            f"Python {sys.version.split()[0]})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jgraph",
        description="Partition graphs and train graph neural networks on many devices with JAX.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    partition_cmd.add_commands(sub)
    convert_cmd.add_commands(sub)
    train_cmd.add_commands(sub)
    embed_cmd.add_commands(sub)
    bench_cmd.add_commands(sub)
    compile_cmd.add_commands(sub)
    for command in _leaves(parser):
        said = command.add_mutually_exclusive_group()
        said.add_argument("-q", "--quiet", action="store_true",
                          help="say nothing along the way but warnings and errors")
        said.add_argument("-v", "--verbose", action="store_true",
                          help="say more along the way (debug messages)")
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of the commands that run (`jgraph bench train`, not `jgraph bench`)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found.extend(_leaves(child))
    return found or [parser]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(level_of(args.quiet, args.verbose), command=True)
    try:
        return args.run(args) or 0
    except OSError as e:
        # The machine refused (a full disk, a read-only or missing path, no permission):
        # one line naming the path, as for any other input.
        if os.environ.get(TRACEBACK_ENV):
            raise
        path = f": {e.filename}" if e.filename else ""
        print(f"jgraph {args.command}: error: {e.strerror or e}{path} (set {TRACEBACK_ENV}=1 "
              f"for the traceback)", file=sys.stderr)
        return 1
    except Exception as e:
        if not isinstance(e, user_errors()):
            raise
        print(f"jgraph {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jgraph {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
