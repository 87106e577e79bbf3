"""Benchmarks behind `jgraph bench`: each returns JSON-ready rows of figures."""
