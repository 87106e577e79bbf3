"""What a trained model gives back, on disk: every node's embedding, logits,
probabilities or predicted class, in original node ids (`jgraph embed`).

Layout (format version 1), row chunks as the chunked graph format's node data
(`jgraph.data.chunked`), each beside the original ids of its rows:

    DIR/index.json                     see below; written last
    DIR/<type>/ids-00003.npy           int64[r] original (type-local) node ids, or the
                                       user's own ids where the graph has them
                                       (`Graph.ids`: int64, or S<k> UTF-8 strings)
    DIR/<type>/values-00003.npy        [r, width] float32 rows, or int32[r] classes

One chunk per partition and node type (the number is the partition's), written by the
process whose device computed it, so no process holds more than its own partitions'
rows. The rows of a chunk are in the partition's order, not sorted by id. `index.json`:

    {"format": "jgraph-outputs", "version": 1, "what": "embeddings", "layer": 2,
     "width": 256, "dtype": "float32", "source": "runs/sage_cora",
     "node_types": {"_N": {"rows": 2708, "chunks": [{"ids": "_N/ids-00000.npy",
                                                     "values": "_N/values-00000.npy",
                                                     "rows": 677}, ...]}}}

`read_embeddings` reads it back, memory-mapped where a type has one chunk.
"""
from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from jgraph.data.ids import decoded

FORMAT, VERSION, INDEX = "jgraph-outputs", 1, "index.json"


class OutputsError(ValueError):
    """A directory that is not a complete, consistent set of outputs."""


class What(str, enum.Enum):
    """What `jgraph embed` writes for each node: a layer's rows (embeddings), the
    last layer's (logits), their softmax (probabilities), or its argmax
    (predictions: int32 classes)."""

    EMBEDDINGS = "embeddings"
    LOGITS = "logits"
    PROBABILITIES = "probabilities"
    PREDICTIONS = "predictions"


def chunk_names(ntype: str, part: int) -> tuple[str, str]:
    """(ids file, values file) of partition `part`'s rows of `ntype`, relative to DIR."""
    return (os.path.join(ntype, f"ids-{part:05d}.npy"),
            os.path.join(ntype, f"values-{part:05d}.npy"))


def write_chunk(root: str, ntype: str, part: int, ids: np.ndarray, values: np.ndarray
                ) -> None:
    """Write one chunk's original ids and rows under `root`."""
    if len(ids) != len(values):
        raise ValueError(f"{len(ids)} ids for {len(values)} rows")
    os.makedirs(os.path.join(root, ntype), exist_ok=True)
    ids = ids if ids.dtype.kind == "S" else ids.astype(np.int64)
    for name, array in zip(chunk_names(ntype, part), (ids, values)):
        np.save(os.path.join(root, name), np.ascontiguousarray(array))


def write_index(root: str, what: What, layer: int, width: int, dtype, source: str,
                rows: Mapping[str, Mapping[int, int]]) -> dict:
    """Write DIR/index.json for the chunks `rows` ({type: {partition: rows}}) that
    `write_chunk` wrote; returns it."""
    index = {"format": FORMAT, "version": VERSION, "what": What(what).value,
             "layer": int(layer), "width": int(width), "dtype": np.dtype(dtype).name,
             "source": source, "node_types": {}}
    for ntype, by_part in rows.items():
        chunks = [{"ids": chunk_names(ntype, p)[0], "values": chunk_names(ntype, p)[1],
                   "rows": int(r)} for p, r in sorted(by_part.items())]
        index["node_types"][ntype] = {"rows": sum(c["rows"] for c in chunks),
                                      "chunks": chunks}
    tmp = os.path.join(root, INDEX + ".tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, os.path.join(root, INDEX))
    return index


def is_outputs_dir(path: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(path, INDEX))


def read_index(root: str | os.PathLike) -> dict:
    """DIR/index.json, checked: format, version and the fields readers use."""
    path = os.path.join(root, INDEX)
    if not os.path.isfile(path):
        raise OutputsError(f"{root}: not a jgraph outputs directory (no {INDEX}; "
                           f"`jgraph embed` writes one)")
    try:
        with open(path) as f:
            index = json.load(f)
    except ValueError as e:
        raise OutputsError(f"{path}: unreadable ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise OutputsError(f"{path}: not a {FORMAT} index")
    if index.get("version") != VERSION:
        raise OutputsError(f"{path}: version {index.get('version')!r}; this jgraph reads "
                           f"version {VERSION}")
    types = index.get("node_types")
    if not isinstance(types, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("chunks"), list) for t in types.values()):
        raise OutputsError(f"{path}: node_types must map each type to its chunks")
    return index


class Outputs(NamedTuple):
    """One node type's outputs: ids [N] the nodes' ids (the user's own where the graph
    has them: int64, or str; else original int64 ids), values [N, width] (or int32[N]
    predicted classes), row i of values being node ids[i]'s."""

    ids: np.ndarray
    values: np.ndarray


def read_embeddings(root: str | os.PathLike, node_type: str | None = None) -> Outputs:
    """(original ids, values) of `node_type` (default: the only type written) from a
    directory `jgraph embed` wrote; every chunk's rows are checked against the index.
    A type of one chunk is memory-mapped; several are read into one array each."""
    index = read_index(root)
    types = index["node_types"]
    if node_type is None:
        if len(types) != 1:
            raise OutputsError(f"{root} holds the node types {sorted(types)}: name one")
        node_type = next(iter(types))
    if node_type not in types:
        raise OutputsError(f"{root} holds no node type {node_type!r}; it holds "
                           f"{sorted(types)}")
    ids, values = [], []
    for chunk in types[node_type]["chunks"]:
        got = []
        for key in ("ids", "values"):
            path = os.path.join(root, chunk[key])
            try:
                array = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise OutputsError(f"{path}: unreadable ({e})") from None
            if len(array) != chunk["rows"]:
                raise OutputsError(f"{path}: {len(array)} rows, the index says "
                                   f"{chunk['rows']}")
            got.append(array)
        ids.append(got[0])
        values.append(got[1])
    if len(ids) == 1:
        return Outputs(decoded(ids[0]), values[0])
    if not ids:
        shape = (0,) if index.get("what") == What.PREDICTIONS.value else (0, index["width"])
        return Outputs(np.zeros(0, np.int64), np.zeros(shape, index["dtype"]))
    # Strings of several widths widen to the longest.
    return Outputs(decoded(np.concatenate(ids)), np.concatenate(values))
