"""Read an OGB node-property-prediction dataset directory as it unpacks.

Homogeneous datasets (ogbn-arxiv, -products, -proteins, -papers100M):

    raw/edge.csv.gz            E lines "src,dst"   (papers100M: raw/data.npz instead)
    raw/num-node-list.csv.gz   one line: N
    raw/node-feat.csv.gz       N lines of floats          (optional)
    raw/node-label.csv.gz      N lines                    (papers100M: raw/node-label.npz)
    raw/edge-feat.csv.gz, raw/node_year.csv.gz, ...       (optional extras)
    split/<name>/{train,valid,test}.csv.gz

Heterogeneous datasets (ogbn-mag):

    raw/num-node-dict.csv.gz   header of node types, one line of counts
    raw/triplet-type-list.csv.gz   lines "src_type,rel,dst_type"
    raw/relations/<src>___<rel>___<dst>/edge.csv.gz (+ edge_reltype.csv.gz, ...)
    raw/node-feat/<type>/node-feat.csv.gz (+ node_year.csv.gz)
    raw/node-label/<type>/node-label.csv.gz
    split/<name>/<type>/{train,valid,test}.csv.gz

OGB's `valid` split is called `val` in jgraph. Labels that OGB leaves as NaN
(papers100M) become -1. Edges are read as stored (OGB adds inverse edges for some
datasets when it loads them; use `symmetrize` for that).
"""
from __future__ import annotations

import csv
import gzip
import os
import warnings

import numpy as np

from jgraph.data.graph import Graph, GraphError, Relation
from jgraph.data.npz import DatasetError

_SPLITS = {"train": "train", "valid": "val", "test": "test"}


def is_ogb_dir(path: str | os.PathLike) -> bool:
    raw = os.path.join(path, "raw")
    return os.path.isdir(raw) and any(
        os.path.exists(os.path.join(raw, f))
        for f in ("edge.csv.gz", "data.npz", "num-node-dict.csv.gz"))


def load_ogb(path: str | os.PathLike, split: str | None = None, name: str | None = None) -> Graph:
    """Load an OGB node-property dataset directory; `split` picks one of `split/*`."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DatasetError(f"{path}: no such directory")
    if not is_ogb_dir(path):
        raise DatasetError(f"{path}: not an OGB dataset directory (expected raw/edge.csv.gz, "
                           f"raw/data.npz or raw/num-node-dict.csv.gz)")
    name = name or os.path.basename(os.path.normpath(path))
    split_dir = ogb_split_dir(path, split)
    try:
        if os.path.exists(os.path.join(path, "raw", "num-node-dict.csv.gz")):
            return _heterogeneous(path, split_dir, name)
        return _homogeneous(path, split_dir, name)
    except GraphError as e:
        raise DatasetError(f"{path}: {e}") from e


def ogb_split_dir(path: str, split: str | None) -> str | None:
    root = os.path.join(path, "split")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if split is None:
        return os.path.join(root, names[0]) if names else None
    if split not in names:
        raise DatasetError(f"{root}: no split named {split!r}; found {names}")
    return os.path.join(root, split)


def read_ogb_csv(file: str, dtype=None) -> np.ndarray:
    """A 2-D array from a headerless, comma-separated .csv.gz file."""
    blocks = list(csv_blocks(file, dtype if dtype is not None else np.float64))
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def csv_blocks(file: str, dtype=np.float64, rows: int | None = None):
    """A headerless, comma-separated `.csv.gz` as [k, columns] arrays of `dtype`, at
    most `rows` lines each (None: one block). Parsed by pandas where it is installed
    (the `ogb` extra; OGB reads its files with it), 2x numpy's loadtxt on edge lists
    and 5x on float features; by numpy.loadtxt otherwise. The two read OGB's files
    alike; pandas also reads an empty field of a float column as NaN, where loadtxt
    refuses it. A DatasetError names the file (and, read in blocks, the line after
    which it could not be read)."""
    if not os.path.exists(file):
        raise DatasetError(f"{file}: no such file")
    try:
        import pandas
    except ImportError:
        pandas = None
    line = 0
    try:
        if pandas is not None:
            try:
                frames = pandas.read_csv(file, header=None, dtype=dtype, chunksize=rows,
                                         compression="gzip", na_filter=dtype != np.int64)
            except pandas.errors.EmptyDataError:
                yield np.zeros((0, 1), dtype)
                return
            for frame in [frames] if rows is None else frames:
                block = frame.to_numpy(dtype)
                line += len(block)
                yield block
            return
        with gzip.open(file, "rt") as f:
            while True:
                with warnings.catch_warnings():     # "input contained no data", at the end
                    warnings.simplefilter("ignore", UserWarning)
                    block = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2, max_rows=rows)
                if not len(block):
                    if not line:
                        yield block                 # an empty file: one empty block
                    return
                line += len(block)
                yield block
                if rows is None:
                    return
    except (OSError, ValueError, EOFError, TypeError) as e:
        where = f" after line {line}" if line else ""
        raise DatasetError(f"{file}: cannot be read as numbers{where} "
                           f"({type(e).__name__}: {e})") from None


def read_ogb_values(file: str) -> np.ndarray:
    """Node or edge values: int64 if every entry is integral, float32 otherwise."""
    a = read_ogb_csv(file)
    if a.size and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        a = a.astype(np.int64)
    else:
        a = a.astype(np.float32)
    return a[:, 0] if a.shape[1] == 1 else a


def read_ogb_labels(file: str) -> np.ndarray:
    a = read_ogb_csv(file)
    a = np.where(np.isnan(a), -1, a).astype(np.int64)
    return a[:, 0] if a.shape[1] == 1 else a


def _optional(file: str):
    return read_ogb_values(file) if os.path.exists(file) else None


def _read_split(directory: str) -> dict[str, np.ndarray]:
    out = {}
    for ogb_name, name in _SPLITS.items():
        file = os.path.join(directory, f"{ogb_name}.csv.gz")
        if os.path.exists(file):
            out[name] = read_ogb_csv(file, np.int64)[:, 0]
    return out


def _homogeneous(path: str, split_dir: str | None, name: str) -> Graph:
    raw = os.path.join(path, "raw")
    node_data, edge_data = {}, {}
    if os.path.exists(os.path.join(raw, "data.npz")):  # papers100M's binary layout
        with np.load(os.path.join(raw, "data.npz")) as z:
            src, dst = z["edge_index"]
            num_nodes = int(z["num_nodes_list"][0]) if "num_nodes_list" in z else None
            if "node_feat" in z and z["node_feat"].size:
                node_data["feat"] = z["node_feat"]
            if "node_year" in z:
                node_data["year"] = z["node_year"].reshape(-1)
        label_file = os.path.join(raw, "node-label.npz")
        if os.path.exists(label_file):
            with np.load(label_file) as z:
                label = z["node_label"]
            node_data["label"] = np.where(np.isnan(label), -1, label).astype(np.int64).reshape(-1)
    else:
        src, dst = read_ogb_csv(os.path.join(raw, "edge.csv.gz"), np.int64).T
        num_nodes = int(read_ogb_csv(os.path.join(raw, "num-node-list.csv.gz"), np.int64)[0, 0])
        for file, key in (("node-feat.csv.gz", "feat"), ("node_year.csv.gz", "year")):
            value = _optional(os.path.join(raw, file))
            if value is not None:
                node_data[key] = value.astype(np.float32) if key == "feat" else value
        if os.path.exists(os.path.join(raw, "node-label.csv.gz")):
            node_data["label"] = read_ogb_labels(os.path.join(raw, "node-label.csv.gz"))
        value = _optional(os.path.join(raw, "edge-feat.csv.gz"))
        if value is not None:
            edge_data["feat"] = value.astype(np.float32)
    splits = _read_split(split_dir) if split_dir else {}
    return Graph.homogeneous(src, dst, num_nodes, name=name, node_data=node_data,
                             edge_data=edge_data, splits=splits)


def _heterogeneous(path: str, split_dir: str | None, name: str) -> Graph:
    raw = os.path.join(path, "raw")
    with gzip.open(os.path.join(raw, "num-node-dict.csv.gz"), "rt") as f:
        header, counts = list(csv.reader(f))[:2]
    num_nodes = {t: int(c) for t, c in zip(header, counts)}
    with gzip.open(os.path.join(raw, "triplet-type-list.csv.gz"), "rt") as f:
        triplets = [Relation(*row) for row in csv.reader(f) if row]
    edges, edge_data = {}, {}
    for rel in triplets:
        rel_dir = os.path.join(raw, "relations", "___".join(rel))
        edges[rel] = read_ogb_csv(os.path.join(rel_dir, "edge.csv.gz"), np.int64).T
        data = {}
        for file in sorted(os.listdir(rel_dir)):
            if file.endswith(".csv.gz") and file not in ("edge.csv.gz", "num-edge-list.csv.gz"):
                data[file[:-len(".csv.gz")].replace("-", "_")] = read_ogb_values(
                    os.path.join(rel_dir, file))
        if data:
            edge_data[rel] = data
    node_data = {t: {} for t in num_nodes}
    for t in num_nodes:
        feat_dir = os.path.join(raw, "node-feat", t)
        if os.path.isdir(feat_dir):
            for file in sorted(os.listdir(feat_dir)):
                if file.endswith(".csv.gz"):
                    key = {"node-feat": "feat", "node_year": "year"}.get(
                        file[:-len(".csv.gz")], file[:-len(".csv.gz")].replace("-", "_"))
                    value = read_ogb_values(os.path.join(feat_dir, file))
                    node_data[t][key] = value.astype(np.float32) if key == "feat" else value
        label_file = os.path.join(raw, "node-label", t, "node-label.csv.gz")
        if os.path.exists(label_file):
            node_data[t]["label"] = read_ogb_labels(label_file)
    splits = {}
    if split_dir:
        for t in num_nodes:
            if os.path.isdir(os.path.join(split_dir, t)):
                splits[t] = _read_split(os.path.join(split_dir, t))
    return Graph(name=name, num_nodes=num_nodes, edges=edges, node_data=node_data,
                 edge_data=edge_data, splits=splits)

