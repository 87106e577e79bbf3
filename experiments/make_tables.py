"""A large graph as Parquet tables with string ids, and its schema: the case that
`jgraph convert SCHEMA OUT` (`jgraph.ingest.tables`) is measured on.

    python experiments/make_tables.py --nodes 10M --edges 100M --out big
    /usr/bin/time -v jgraph convert big/schema.yaml big-chunked --json
    python experiments/make_tables.py --nodes 10M --edges 10M --out big10
    python experiments/make_tables.py --nodes 100k --edges 1M --out small --kind uniform

One node type, `user`: OUT/nodes.parquet holds a row a node, its id "user-<16 hex
digits>" (a bijective hash of the node's index, so the ids are unique and in no
order), `feat` (16 float32, one fixed-size list column) and `label` (0..9); the split
is drawn by fractions 0.8 / 0.1 / 0.1. OUT/edges.parquet holds `--edges` edges
(`src`, `dst`: the ends' ids as strings): R-MAT-like ends (a, b, c, d = 0.57, 0.19,
0.19, 0.05 over the next power of two, scaled down to the node count; self-loops and
repeats kept) or, with `--kind uniform`, uniform ones. OUT/schema.yaml describes both.
Written a row group (2^20 rows) at a time, so memory stays small whatever the sizes;
10M nodes and 100M edges take about 5 GB of disk.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jgraph.data.links import mix64

ROWS = 1 << 20                  # rows of a row group, and of a batch drawn at a time
PREFIX = b"user-"
HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
RMAT = (0.57, 0.19, 0.19)       # a, b, c (d the rest), as Graph500's generator
FEAT, CLASSES = 16, 10

SCHEMA = """\
name: {name}
nodes:
  - type: user
    files: nodes.parquet
    id: id
    id_type: string
    features: feat
    label: label
    split: {{fractions: [0.8, 0.1, 0.1], seed: 0}}
edges:
  - relation: [user, follows, user]
    files: edges.parquet
    source: src
    destination: dst
"""


def count(text: str) -> int:
    """'10M', '100k', '1B' or a plain integer."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def user_ids(index: np.ndarray, seed: int) -> pa.Array:
    """The string ids of nodes `index`: "user-" and 16 hex digits of a bijective hash
    of the index, built as one byte matrix (no Python string per value)."""
    key = mix64(seed, index)
    width = len(PREFIX) + 16
    raw = np.empty((index.size, width), np.uint8)
    raw[:, :len(PREFIX)] = np.frombuffer(PREFIX, np.uint8)
    for j in range(16):
        raw[:, len(PREFIX) + j] = HEX[(key >> np.uint64(60 - 4 * j)) & np.uint64(15)]
    offsets = np.arange(index.size + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.string(), index.size,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(raw)])


def ends(rng: np.random.Generator, k: int, nodes: int, kind: str) -> tuple[np.ndarray, ...]:
    """(src, dst) node indices of `k` edges."""
    if kind == "uniform":
        return rng.integers(0, nodes, k), rng.integers(0, nodes, k)
    scale = max(int(np.ceil(np.log2(nodes))), 1)
    src, dst = np.zeros(k, np.uint64), np.zeros(k, np.uint64)
    a, b, c = RMAT
    for _ in range(scale):
        u = rng.random(k)
        src = (src << np.uint64(1)) | (u >= a + b)
        dst = (dst << np.uint64(1)) | ((u >= a) & (u < a + b) | (u >= a + b + c))
    # 2^scale >= nodes: scaled down, so that the skew stays on the low indices.
    return ((src * np.uint64(nodes)) >> np.uint64(scale)).astype(np.int64), \
        ((dst * np.uint64(nodes)) >> np.uint64(scale)).astype(np.int64)


def write_nodes(path: str, nodes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    schema = pa.schema([("id", pa.string()), ("feat", pa.list_(pa.float32(), FEAT)),
                        ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, use_dictionary=["label"]) as out:
        for start in range(0, nodes, ROWS):
            index = np.arange(start, min(start + ROWS, nodes), dtype=np.int64)
            feat = rng.standard_normal((index.size, FEAT), np.float32).reshape(-1)
            out.write_table(pa.table({
                "id": user_ids(index, seed),
                "feat": pa.FixedSizeListArray.from_arrays(pa.array(feat), FEAT),
                "label": pa.array(rng.integers(0, CLASSES, index.size))}, schema=schema))


def write_edges(path: str, nodes: int, edges: int, kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    schema = pa.schema([("src", pa.string()), ("dst", pa.string())])
    # Hashed ids barely repeat within a row group: a dictionary would only be dropped.
    with pq.ParquetWriter(path, schema, use_dictionary=False) as out:
        for start in range(0, edges, ROWS):
            src, dst = ends(rng, min(ROWS, edges - start), nodes, kind)
            out.write_table(pa.table({"src": user_ids(src, seed), "dst": user_ids(dst, seed)},
                                     schema=schema))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10M", help="nodes (default 10M)")
    parser.add_argument("--edges", default="100M", help="edges (default 100M)")
    parser.add_argument("--out", required=True, help="the directory to write")
    parser.add_argument("--kind", choices=("rmat", "uniform"), default="rmat",
                        help="how the edges' ends are drawn")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    nodes, edges = count(args.nodes), count(args.edges)
    if nodes < 1 or edges < 0:
        parser.error("--nodes must be at least 1, --edges at least 0")
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    write_nodes(os.path.join(args.out, "nodes.parquet"), nodes, args.seed)
    write_edges(os.path.join(args.out, "edges.parquet"), nodes, edges, args.kind, args.seed)
    with open(os.path.join(args.out, "schema.yaml"), "w", encoding="utf-8") as f:
        f.write(SCHEMA.format(name=os.path.basename(os.path.abspath(args.out))))
    print(f"{args.out}: {nodes:,} nodes, {edges:,} edges ({args.kind}) in "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
