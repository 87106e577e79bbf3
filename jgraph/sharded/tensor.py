"""Distributed node data (DistDGL's DistTensor): a row-sharded array of node rows.

On the host it behaves like an array indexed by row id (`x[ids]`, `x[a:b]`,
`x[ids] = rows`; see `RowLayout` for row ids). Inside the step, `lookup` reads rows by
global node id through the exchange and `scatter` writes them.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jgraph.data.sparse import SparseRows, register_pytree
from jgraph.exchange import Exchange, ExchangeStats, OwnerFn, owned_rows, route_rows, store_rows
from jgraph.mesh import AXIS, replicated, shard_rows
from jgraph.partition.book import IdRangeError
from jgraph.sharded.layout import RowLayout

register_pytree()      # sparse rows cross jit and shard_map here


@functools.partial(jax.jit, static_argnames=("out",))
def _take_rows(array, pos, out):
    return jax.lax.with_sharding_constraint(array[pos], out)


@functools.partial(jax.jit, donate_argnums=0)
def _set_rows(array, pos, rows):
    return array.at[pos].set(rows)


@dataclasses.dataclass(eq=False)
class DistTensor:
    """Fields:
      array: jax.Array [P * rows_per_part, *row_shape], row-sharded over the mesh;
        partition k's rows are block k, padding after them.
      layout: which node rows it holds and where (`RowLayout`).
      name: for messages.
      mesh: the mesh it lives on.
    """

    array: jax.Array
    layout: RowLayout
    name: str
    mesh: Mesh

    # -- construction ------------------------------------------------------------------

    @classmethod
    def load(cls, mesh: Mesh, layout: RowLayout, name: str, load: Callable[[int], np.ndarray],
             row_shape: tuple[int, ...], dtype) -> DistTensor:
        """From per-partition row blocks; `load(k)` runs only for this process's partitions."""
        def block(k):
            rows = np.asarray(load(k))
            if rows.shape != (int(layout.counts[k]), *row_shape):
                raise ValueError(f"{name}: partition {k} has rows of shape {list(rows.shape)}, "
                                 f"expected {[int(layout.counts[k]), *row_shape]}")
            return rows
        return cls(shard_rows(mesh, layout.rows_per_part, tuple(row_shape), dtype, block),
                   layout, name, mesh)

    @classmethod
    def load_sparse(cls, mesh: Mesh, layout: RowLayout, name: str,
                    load: Callable[[int], SparseRows], width: int, nnz_per_row: int,
                    dtype) -> DistTensor:
        """Sparse rows [width] from per-partition `SparseRows` blocks of `nnz_per_row`
        entries per row; `array` is then a `SparseRows` of two row-sharded arrays."""
        def block(k, leaf):
            rows = load(k)
            if (not isinstance(rows, SparseRows) or rows.width != width
                    or rows.indices.shape != (int(layout.counts[k]), nnz_per_row)):
                raise ValueError(f"{name}: partition {k} has rows {rows!r}, expected "
                                 f"{int(layout.counts[k])} sparse rows of width {width} "
                                 f"with {nnz_per_row} entries each")
            return getattr(rows, leaf)
        shard = functools.partial(shard_rows, mesh, layout.rows_per_part, (nnz_per_row,))
        array = SparseRows(shard(np.int32, lambda k: block(k, "indices")),
                           shard(dtype, lambda k: block(k, "values")), width)
        return cls(array, layout, name, mesh)

    @classmethod
    def from_numpy(cls, mesh: Mesh, layout: RowLayout, values, name: str = "tensor"
                   ) -> DistTensor:
        """From an array in row order (`values[r]` is row r)."""
        values = np.asarray(values)
        if values.shape[0] != layout.num_rows:
            raise ValueError(f"{name}: {values.shape[0]} rows given, the layout has "
                             f"{layout.num_rows}")
        starts = layout.row_starts
        return cls.load(mesh, layout, name,
                        lambda k: values[starts[k]:starts[k] + layout.counts[k]],
                        values.shape[1:], values.dtype)

    @classmethod
    def zeros(cls, mesh: Mesh, layout: RowLayout, row_shape=(), dtype=np.float32,
              name: str = "tensor") -> DistTensor:
        return cls.load(mesh, layout, name, lambda k: np.zeros((layout.counts[k], *row_shape),
                                                               dtype), tuple(row_shape), dtype)

    # -- the host-side array API -------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """(rows, *row shape); for sparse rows, their dense shape."""
        return (self.layout.num_rows, *self.array.shape[1:])

    @property
    def dtype(self):
        return self.array.dtype

    def __len__(self) -> int:
        return self.layout.num_rows

    def __repr__(self) -> str:
        return f"DistTensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"

    def _rows(self, key) -> np.ndarray:
        if isinstance(key, slice):
            return np.arange(*key.indices(len(self)))
        rows = np.asarray(key)
        if rows.dtype == bool:
            if rows.shape != (len(self),):
                raise IndexError(f"{self.name}: boolean index of shape {list(rows.shape)}, "
                                 f"expected [{len(self)}]")
            return np.flatnonzero(rows)
        if not np.issubdtype(rows.dtype, np.integer):
            raise IndexError(f"{self.name}: index must be integers, a slice or a boolean "
                             f"mask, got {rows.dtype}")
        if rows.size and rows.min() < -len(self):
            raise IdRangeError(f"{self.name}: row id {int(rows.min())} is out of range "
                               f"[{-len(self)}, {len(self)})")
        return np.where(rows < 0, rows + len(self), rows)

    @property
    def sparse(self) -> bool:
        """Whether the rows are `SparseRows` (indexing then returns them dense)."""
        return isinstance(self.array, SparseRows)

    def __getitem__(self, key) -> np.ndarray:
        rows = self._rows(key)
        pos = self.layout.padded_of_rows(rows.reshape(-1))
        out = _take_rows(self.array, jnp.asarray(pos, jnp.int32), replicated(self.mesh))
        out = out.toarray() if self.sparse else np.asarray(out)
        return out.reshape(rows.shape + self.shape[1:])

    def __setitem__(self, key, values) -> None:
        if self.sparse:
            raise TypeError(f"{self.name}: sparse rows are read-only")
        rows = self._rows(key).reshape(-1)
        values = np.broadcast_to(np.asarray(values, self.dtype),
                                 (rows.size, *self.array.shape[1:]))
        pos = self.layout.padded_of_rows(rows)
        # As in numpy, the last write to a repeated row wins.
        last = pos.size - 1 - np.unique(pos[::-1], return_index=True)[1]
        self.array = _set_rows(self.array, jnp.asarray(pos[last], jnp.int32),
                               jnp.asarray(values[last]))

    def __array__(self, dtype=None, copy=None):
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def to_numpy(self) -> np.ndarray:
        """Every row, in row order."""
        return self[:]

    # -- inside the step (per device, under shard_map) --------------------------------

    def owner_fn(self, shard: jnp.ndarray) -> OwnerFn:
        return owned_rows(shard, self.layout.starts, AXIS)

    def lookup(self, exchange: Exchange, shard, ids, valid, cache=None, distinct=False,
               local=False) -> tuple[jnp.ndarray, ExchangeStats]:
        """Rows of global ids `ids` (zeros where not `valid`); `shard` is this device's
        block of `array`; cache: `HotCache.device_args(self)` or None; distinct: the
        valid ids do not repeat (a Block's src), see `Exchange.gather`; local: the ids
        are this device's own (a loader's seeds), read without the exchange (see
        `Exchange.gather_local`)."""
        if local:
            return exchange.gather_local(ids, valid, self.owner_fn(shard),
                                  contains=self.layout.contains)
        return exchange.gather(ids, valid, self.owner_fn(shard), cache=cache,
                               contains=self.layout.contains, distinct=distinct)

    def scatter(self, exchange: Exchange, shard, ids, valid, rows, add: bool = False
                ) -> tuple[jnp.ndarray, ExchangeStats]:
        """Write rows by global id; returns the new shard.

        add=False sets rows. An id written several times in one call (on one device or
        many) gets the mean of its values: deterministic; where they agree, that value
        up to rounding (XLA multiplies the sum by the count's reciprocal: seven equal
        float32 values may come back an ulp off). add=True adds every value
        (`route_rows`, then `store_rows`).
        """
        routed, stats = route_rows(exchange, ids, valid, rows, mean=not add,
                                   contains=self.layout.contains)
        return store_rows(shard, routed, self.layout.starts, exchange.axis, add=add), stats
