"""The `jgraph` command line: `jgraph partition | info` (and later train, eval, bench)."""
from jgraph.cli.main import main

__all__ = ["main"]
