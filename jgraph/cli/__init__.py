"""The `jgraph` command line: `jgraph partition | info | convert | train | eval | bench |
compile` (`jgraph COMMAND --help` for each)."""
from jgraph.cli.main import main

__all__ = ["main"]
