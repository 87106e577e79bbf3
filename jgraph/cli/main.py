"""Entry point: parse the subcommand and turn jgraph's input errors into clear messages."""
from __future__ import annotations

import argparse
import sys

from jgraph.cli import partition as partition_cmd
from jgraph.data import DatasetError, GraphError
from jgraph.partition import IdRangeError, PartitionError, PartitionFormatError

# Errors caused by what the user asked for: reported in one line, exit status 2.
USER_ERRORS = (DatasetError, GraphError, PartitionError, PartitionFormatError, IdRangeError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jgraph",
        description="Partition graphs and train graph neural networks on many devices with JAX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    partition_cmd.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except USER_ERRORS as e:
        print(f"jgraph {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jgraph {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
