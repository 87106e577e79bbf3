"""Link prediction's held-out positives of a chunked graph (`ChunkedGraph.edge_splits`,
drawn by `jgraph.data.held_out`) written into the partitions: each positive goes to the
partition that owns its destination, in new ids, with its place in its set as `eid`, in
the order of the set. Two passes over each set's chunks: one counts each partition's
positives, one writes them."""
from __future__ import annotations

import os

import numpy as np

import jgraph.segments as segments
from jgraph.data.chunked import ChunkedGraph
from jgraph.data.npz import DatasetError
from jgraph.npy import NpyAppender
from jgraph.partition.numbering import owner_of
from jgraph.partition.store import EDGE_ARRAYS, part_dir


def write_edge_splits(graph: ChunkedGraph, inverse: np.ndarray, offsets: np.ndarray,
                      out: str) -> list[dict[str, int]]:
    """Write the edge splits of `graph` into the partition folders under `out`;
    inverse: every node's new id; offsets: int64[P + 1], partition k owns new ids
    [offsets[k], offsets[k + 1]). Returns each partition's {split: positives}."""
    p = offsets.size - 1
    sizes: list[dict[str, int]] = [{} for _ in range(p)]
    for name, arrays in graph.edge_splits.items():
        chunks = range(len(arrays["src"].files))
        counts = np.zeros(p, np.int64)
        for i in chunks:
            owner = owner_of(offsets, inverse[_read(graph, arrays, "dst", i)])
            counts += np.bincount(owner, minlength=p)
        specs = {**EDGE_ARRAYS}
        shapes = dict.fromkeys(EDGE_ARRAYS, ())
        if "negatives" in arrays:
            specs["negatives"], shapes["negatives"] = np.int64, tuple(arrays["negatives"].shape)
        outs = []
        for k in range(p):
            folder = os.path.join(part_dir(out, k), "edges", name)
            os.makedirs(folder, exist_ok=True)
            outs.append({key: NpyAppender(os.path.join(folder, f"{key}.npy"), dtype,
                                          (int(counts[k]), *shapes[key]))
                         for key, dtype in specs.items()})
        start = 0
        for i in chunks:
            new = {key: inverse[_read(graph, arrays, key, i)]
                   for key in ("src", "dst", "negatives") if key in arrays}
            etype = _read(graph, arrays, "etype", i)
            if etype.size and (etype.min() < 0 or etype.max() >= len(graph.relations)):
                raise DatasetError(f"{graph.path(arrays['etype'].files[i])}: a relation index "
                                   f"outside [0, {len(graph.relations)})")
            owner = owner_of(offsets, new["dst"])
            order, cuts = segments.group_by(owner, p)
            for k in np.flatnonzero(np.diff(cuts)):
                sel = order[cuts[k]:cuts[k + 1]]
                outs[k]["eid"].append(start + sel)
                outs[k]["etype"].append(etype[sel])
                for key, values in new.items():
                    outs[k][key].append(values[sel])
            start += etype.size
        for k, files in enumerate(outs):
            for appender in files.values():
                appender.close()
            sizes[k][name] = int(counts[k])
    return sizes


def _read(graph: ChunkedGraph, arrays: dict, key: str, i: int) -> np.ndarray:
    """Chunk i of one array of an edge split; node ids checked against the graph's."""
    values = np.asarray(graph.load(arrays[key].files[i]))
    if key != "etype" and values.size and (values.min() < 0
                                           or values.max() >= graph.total_nodes):
        raise DatasetError(f"{graph.path(arrays[key].files[i])}: a node id outside "
                           f"[0, {graph.total_nodes})")
    return values
