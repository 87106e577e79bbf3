"""Where the rows of a node array live on the mesh.

A node array (features, labels, an embedding table) has one row per node of one node
type, or of every node for a homogeneous graph. Its rows are owned like the nodes:
partition p holds the rows of its own nodes, `counts[p]` of them, starting at global id
`starts[p]`. On the mesh the array is stored row-sharded with each partition's block
padded to `rows_per_part` rows, so row r of partition p sits at padded position
`p * rows_per_part + r`.

Two numberings address rows:
  * global node ids, used inside the step (what samplers and the exchange carry);
  * row ids, `0 .. num_rows-1`, partition by partition, used by the host-side API.
    For a homogeneous graph a row id *is* the global id; for a node type it is the
    type-local id of `PartitionBook.to_type_local`.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

import jgraph.segments as segments
from jgraph.exchange.segments import owner_of
from jgraph.partition.book import IdRangeError, PartitionBook


@dataclasses.dataclass(frozen=True, eq=False)
class RowLayout:
    """Fields:
      offsets: int64[P+1] — the partition book's global id ranges.
      starts: int64[P] — global id of partition p's first row.
      counts: int64[P] — rows held by partition p.
      ntype: str | None — the node type the rows belong to (None: every node).
      rows_per_part: int — padded block size, max(counts) (at least 1).
    """

    offsets: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    ntype: str | None = None

    @classmethod
    def of(cls, book: PartitionBook, ntype: str | None = None) -> RowLayout:
        """Rows of every node (`ntype=None`) or of one node type."""
        if ntype is None:
            return cls(book.offsets, book.offsets[:-1], book.part_sizes(), None)
        if ntype not in book.node_types:
            raise KeyError(f"node type {ntype!r} is not in the graph; its node types are "
                           f"{list(book.node_types)}")
        t = book.node_types.index(ntype)
        if len(book.node_types) == 1:
            return cls(book.offsets, book.offsets[:-1], book.part_sizes(), ntype)
        return cls(book.offsets, book.ntype_offsets[:, t], book.type_counts()[:, t], ntype)

    @property
    def num_parts(self) -> int:
        return self.counts.size

    @property
    def num_rows(self) -> int:
        return int(self.counts.sum())

    @property
    def rows_per_part(self) -> int:
        return max(int(self.counts.max()), 1)

    @property
    def row_starts(self) -> np.ndarray:
        """int64[P]: row id of partition p's first row."""
        return segments.exclusive_sum(self.counts)

    def _what(self) -> str:
        return "node" if self.ntype is None else f"node of type {self.ntype!r}"

    # -- host side ---------------------------------------------------------------------

    def padded_of_rows(self, rows) -> np.ndarray:
        """Padded positions of row ids; a clear error for any id out of range."""
        rows = np.asarray(rows, np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            bad = rows[(rows < 0) | (rows >= self.num_rows)].reshape(-1)[0]
            raise IdRangeError(f"row id {int(bad)} is out of range [0, {self.num_rows}) "
                               f"({self.num_rows} rows, one per {self._what()})")
        part = segments.segment_of(self.row_starts, rows)  # a partition without rows holds none
        return part * self.rows_per_part + (rows - self.row_starts[part])

    def padded_of_global(self, ids) -> np.ndarray:
        """Padded positions of global node ids; they must be nodes this layout holds."""
        ids = np.asarray(ids, np.int64)
        n = int(self.offsets[-1])
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = ids[(ids < 0) | (ids >= n)].reshape(-1)[0]
            raise IdRangeError(f"node id {int(bad)} is out of range [0, {n})")
        owner = segments.segment_of(self.offsets, ids)
        local = ids - self.starts[owner]
        wrong = (local < 0) | (local >= self.counts[owner])
        if np.any(wrong):
            raise IdRangeError(f"node id {int(ids[wrong].reshape(-1)[0])} is not a "
                               f"{self._what()}")
        return owner * self.rows_per_part + local

    def global_ids(self) -> np.ndarray:
        """int64[num_rows]: the global id of every row, in row order."""
        return np.concatenate([np.arange(s, s + c) for s, c in zip(self.starts, self.counts)])

    # -- device side (inside the step; `owned_index` finds an owned id's row) ---------

    def contains(self, ids: jnp.ndarray) -> jnp.ndarray:
        """bool[...]: which global ids are nodes this layout has a row for."""
        owner = owner_of(self.offsets, ids)
        local = ids - jnp.asarray(self.starts, jnp.int32)[owner]
        return (ids >= 0) & (ids < int(self.offsets[-1])) & (local >= 0) & (
            local < jnp.asarray(self.counts, jnp.int32)[owner])
