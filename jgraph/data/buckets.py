"""Edges on their way through a streamed preparation (`jgraph.data.prepare_chunked`):
blocks of edges in memory, and bucket files on disk that gather the edges of one key
range from every block so that a bucket can be sorted on its own."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

import jgraph.segments as segments


@dataclasses.dataclass
class EdgeBlock:
    """Edges on their way out: homogeneous src, dst (int64), etype (int32), pos (int64:
    the edge's place in the in-memory edge order of its relation, for keeping the first
    of duplicates) and {name: edge data rows}."""

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    pos: np.ndarray
    data: dict

    def take(self, keep: np.ndarray) -> EdgeBlock:
        return EdgeBlock(self.src[keep], self.dst[keep], self.etype[keep], self.pos[keep],
                         {k: v[keep] for k, v in self.data.items()})

    @staticmethod
    def cat(blocks: list[EdgeBlock]) -> EdgeBlock:
        return EdgeBlock(*(np.concatenate([getattr(b, f) for b in blocks])
                           for f in ("src", "dst", "etype", "pos")),
                         {k: np.concatenate([b.data[k] for b in blocks])
                          for k in blocks[0].data})


class BucketFiles:
    """Append-only raw files of each bucket's edges: src, dst, etype, pos and every edge
    data array (`data_specs`: {name: (dtype, row shape)}), read back whole one bucket at
    a time."""

    FIELDS = (("src", np.int64), ("dst", np.int64), ("etype", np.int32), ("pos", np.int64))

    def __init__(self, root: str, data_specs: dict | None = None):
        self.root, self.data_specs = root, dict(data_specs or {})

    def _path(self, k: int, field: str) -> str:
        return os.path.join(self.root, f"{k:06d}.{field}")

    def append(self, k: int, b: EdgeBlock) -> None:
        if not b.src.size:
            return
        arrays = {f: getattr(b, f) for f, _ in self.FIELDS}
        for name, values in b.data.items():
            arrays["data." + name] = values
        for field, values in arrays.items():
            with open(self._path(k, field), "ab") as f:
                np.ascontiguousarray(values).tofile(f)

    def scatter(self, which: np.ndarray, count: int, b: EdgeBlock) -> None:
        """Each edge of `b` appended to its bucket `which` (int[e] in [0, count))."""
        order, cuts = segments.group_by(which, count)
        for k in np.flatnonzero(np.diff(cuts)):
            self.append(int(k), b.take(order[cuts[k]:cuts[k + 1]]))

    def read(self, k: int) -> EdgeBlock:
        def load(field: str, dtype, shape=()) -> np.ndarray:
            path = self._path(k, field)
            if not os.path.exists(path):
                return np.zeros((0, *shape), dtype)
            return np.fromfile(path, dtype).reshape(-1, *shape)
        out = [load(f, dt) for f, dt in self.FIELDS]
        data = {name: load("data." + name, np.dtype(dtype), tuple(shape))
                for name, (dtype, shape) in self.data_specs.items()}
        return EdgeBlock(*out, data)
