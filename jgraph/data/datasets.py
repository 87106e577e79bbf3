"""One entry point for every way of naming a dataset."""
from __future__ import annotations

import importlib.resources
import os

from jgraph.data.chunked import is_chunked_dir, is_dgl_chunked_dir, load_chunked
from jgraph.data.graph import Graph
from jgraph.data.npz import DatasetError, load_npz
from jgraph.data.ogb import is_ogb_dir, load_ogb
from jgraph.data.synthetic import generate

BUILTIN = ("cora",)
"""Datasets shipped inside the package (see jgraph/data/builtin/README.md)."""


def builtin_path(name: str) -> str:
    return str(importlib.resources.files("jgraph.data") / "builtin" / f"{name}.npz")


def load_dataset(spec: str | os.PathLike) -> Graph:
    """Load a graph named by `spec`.

    `spec` is one of: a built-in name (`cora`); a `.npz` file in one of jgraph's
    layouts; a chunked graph directory (`jgraph.data.chunked`, read whole); an OGB
    node-property dataset directory; or a synthetic spec
    (`synthetic:nodes=...,edges=...`, see `jgraph.data.synthetic`). A DGL chunked
    graph directory is refused with the `jgraph convert` command that reads it.
    """
    spec = os.fspath(spec)
    if spec in BUILTIN:
        return load_npz(builtin_path(spec), name=spec)
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return generate(spec)
    if os.path.isdir(spec):
        if is_chunked_dir(spec):
            return load_chunked(spec)
        if is_dgl_chunked_dir(spec):
            # DGL's format is for graphs larger than memory: converted once, a block at a
            # time, then read as jgraph's chunked format by everything that reads graphs.
            raise DatasetError(f"{spec}: a DGL chunked graph directory (DGL's metadata.json); "
                               f"convert it first: jgraph convert {spec} OUT_DIR, then "
                               f"use OUT_DIR")
        if os.path.exists(os.path.join(spec, "part-0")) or os.path.exists(
                os.path.join(spec, "node_map.npy")):
            raise DatasetError(f"{spec}: a jgraph partition directory without meta.json "
                               f"(incomplete or damaged); partition the graph again")
        if not is_ogb_dir(spec):
            raise DatasetError(f"{spec}: a directory, but not an OGB dataset directory (no "
                               f"raw/edge.csv.gz, raw/data.npz or raw/num-node-dict.csv.gz) "
                               f"nor a chunked graph directory (no metadata.json)")
        return load_ogb(spec)
    if spec.endswith(".npz") or os.path.exists(spec):
        return load_npz(spec)
    raise DatasetError(f"dataset {spec!r} not found: give a built-in name ({', '.join(BUILTIN)}), "
                       f"an .npz file, an OGB dataset directory, or synthetic:key=value,...")
