"""The partition book: which partition owns a node, in one `searchsorted`.

After relabelling, partition p owns the global ids `[offsets[p], offsets[p+1])`, and
inside that range the node types follow one another in type order: type t of
partition p is `[ntype_offsets[p, t], ntype_offsets[p, t+1])`. A node's *type-local*
id numbers the nodes of its type across all partitions, partition by partition, so
each type's rows (features, embeddings) also form one contiguous, owner-sorted table.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import jgraph.segments as segments


class IdRangeError(IndexError):
    """A node id outside the graph; the message names the id and the valid range."""


@dataclasses.dataclass(frozen=True, eq=False)
class PartitionBook:
    """Range partition book.

    Fields:
      offsets: int64[P+1] — partition p owns global ids [offsets[p], offsets[p+1]).
      ntype_offsets: int64[P, T+1] — type t of partition p owns
        [ntype_offsets[p, t], ntype_offsets[p, t+1]); row p starts at offsets[p] and
        ends at offsets[p+1].
      node_types: tuple[str, ...] — the T node type names, in type-id order.
    """

    offsets: np.ndarray
    ntype_offsets: np.ndarray
    node_types: tuple[str, ...]

    def __post_init__(self):
        offsets = np.asarray(self.offsets, np.int64)
        ntype_offsets = np.asarray(self.ntype_offsets, np.int64)
        if offsets.ndim != 1 or offsets.size < 2 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must start at 0 and not decrease, got {offsets.tolist()}")
        p, t = offsets.size - 1, len(self.node_types)
        if ntype_offsets.shape != (p, t + 1):
            raise ValueError(f"ntype_offsets must have shape [{p}, {t + 1}], "
                             f"got {list(ntype_offsets.shape)}")
        if (np.any(ntype_offsets[:, 0] != offsets[:-1])
                or np.any(ntype_offsets[:, -1] != offsets[1:])
                or np.any(np.diff(ntype_offsets, axis=1) < 0)):
            raise ValueError("ntype_offsets rows must run from offsets[p] to offsets[p+1]")
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "ntype_offsets", ntype_offsets)
        object.__setattr__(self, "node_types", tuple(self.node_types))

    @property
    def num_parts(self) -> int:
        return self.offsets.size - 1

    @property
    def num_nodes(self) -> int:
        return int(self.offsets[-1])

    def part_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def type_counts(self) -> np.ndarray:
        """int64[P, T]: nodes of each type in each partition."""
        return np.diff(self.ntype_offsets, axis=1)

    def part_range(self, part: int) -> tuple[int, int]:
        if not 0 <= part < self.num_parts:
            raise IdRangeError(f"partition {part} does not exist; there are {self.num_parts}")
        return int(self.offsets[part]), int(self.offsets[part + 1])

    def _check(self, ids) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            bad = ids[(ids < 0) | (ids >= self.num_nodes)].reshape(-1)[0]
            raise IdRangeError(f"node id {int(bad)} is out of range [0, {self.num_nodes})")
        return ids

    def owner(self, ids) -> np.ndarray:
        """int32[...]: the partition that owns each global id."""
        ids = self._check(ids)
        return segments.segment_of(self.offsets, ids).astype(np.int32)

    def ntype(self, ids) -> np.ndarray:
        """int32[...]: the node type id of each global id."""
        ids = self._check(ids)
        owner = segments.segment_of(self.offsets, ids)
        rows = self.ntype_offsets[owner]                        # [..., T+1]
        return (np.sum(rows[..., 1:] <= ids[..., None], axis=-1)).astype(np.int32)

    def to_type_local(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(type id, type-local id) of each global id."""
        ids = self._check(ids)
        owner = segments.segment_of(self.offsets, ids)
        t = self.ntype(ids)
        before = self._type_starts()[owner, t]                  # same type, earlier parts
        return t, before + (ids - self.ntype_offsets[owner, t])

    def to_global(self, ntype: int | str, local) -> np.ndarray:
        """Global ids of type-local ids of one node type."""
        t = self.node_types.index(ntype) if isinstance(ntype, str) else int(ntype)
        local = np.asarray(local, np.int64)
        starts = self._type_starts()[:, t]                     # [P] first local id per part
        total = int(self.type_counts()[:, t].sum())
        if local.size and (local.min() < 0 or local.max() >= total):
            raise IdRangeError(f"type-local id out of range [0, {total}) for node type "
                               f"{self.node_types[t]!r}")
        part = segments.segment_of(starts, local)    # a part without this type holds none
        return self.ntype_offsets[part, t] + (local - starts[part])

    def _type_starts(self) -> np.ndarray:
        """int64[P, T]: type-local id of the first node of type t in partition p."""
        return segments.exclusive_sum(self.type_counts(), axis=0)
