"""Sharded learnable embeddings (DistDGL's DistEmbedding) with sparse updates.

The table is row-sharded like node data: each device owns the rows of its own nodes.
A step looks up the rows its batch needs through the exchange, and afterwards routes
the gradients of those rows back to their owners (`Exchange.scatter_add`, which sums
duplicates), where a sparse optimizer updates only the touched rows and their state.
Nothing in a step is proportional to the table's size, provided the jitted step
donates the state (`donate_argnums`) so the table is updated in place.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from jgraph.exchange import Exchange, ExchangeStats, owned_index, owned_rows, route_rows
from jgraph.mesh import AXIS, ROWS, rows_sharding
from jgraph.sharded.layout import RowLayout
from jgraph.sharded.sparse_optim import SparseAdam, SparseOptimizer


class EmbeddingState(NamedTuple):
    """table: float32[P * rows_per_part, dim]; slots: {name: [P * rows_per_part, ...]}
    optimizer state; both row-sharded (per device: its block)."""

    table: jax.Array
    slots: dict


@dataclasses.dataclass(frozen=True, eq=False)
class DistEmbedding:
    """Fields:
      layout: the rows (one per node of a node type, or of every node).
      dim: embedding width.
      optimizer: `SparseAdagrad` or `SparseAdam`.
      init_scale: rows start as normal(0, init_scale**2) draws.
      name: for messages.
    """

    layout: RowLayout
    dim: int
    optimizer: SparseOptimizer = SparseAdam()
    init_scale: float = 0.1
    name: str = "embedding"

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    def specs(self) -> EmbeddingState:
        """`PartitionSpec`s of the state, for shard_map and jit."""
        return EmbeddingState(ROWS, dict.fromkeys(self.optimizer.slots(self.dim), ROWS))

    def init(self, mesh: Mesh, key: jax.Array) -> EmbeddingState:
        """A fresh table, created on the devices (partition k draws from fold_in(key, k))."""
        if mesh.size != self.layout.num_parts:
            raise ValueError(f"{self.name}: the layout has {self.layout.num_parts} partitions, "
                             f"the mesh {mesh.size} devices")
        r = self.layout.rows_per_part
        counts = np.asarray(self.layout.counts, np.int32)
        slots = self.optimizer.slots(self.dim)

        def make(key):
            me = lax.axis_index(AXIS)
            real = (jnp.arange(r) < jnp.asarray(counts)[me])[:, None]
            table = jax.random.normal(jax.random.fold_in(key, me), (r, self.dim), jnp.float32)
            table = jnp.where(real, table * self.init_scale, 0.0)
            return EmbeddingState(table, {k: jnp.full((r, *shape), value, dtype)
                                          for k, (shape, dtype, value) in slots.items()})

        sharded = jax.shard_map(make, mesh=mesh, in_specs=jax.sharding.PartitionSpec(),
                                out_specs=self.specs())
        shardings = jax.tree.map(lambda _: rows_sharding(mesh), self.specs())
        return jax.jit(sharded, out_shardings=shardings)(key)

    # -- inside the step (per device, under shard_map) --------------------------------

    def lookup(self, exchange: Exchange, state: EmbeddingState, ids, valid,
               distinct: bool = False) -> tuple[jnp.ndarray, ExchangeStats]:
        """float32[n, dim]: rows of global ids `ids`; zeros where not `valid`.
        distinct: the valid ids do not repeat (see `Exchange.gather`)."""
        return exchange.gather(ids, valid, owned_rows(state.table, self.layout.starts,
                                                      exchange.axis),
                               contains=self.layout.contains, distinct=distinct)

    def apply_gradients(self, exchange: Exchange, state: EmbeddingState, ids, valid, grads
                        ) -> tuple[EmbeddingState, ExchangeStats]:
        """Route `grads` (float32[n, dim], the gradient of each looked-up row) to the
        owners, sum them per row, and apply the sparse optimizer to those rows only.

        When some gradients did not fit the exchange's capacity (`stats.overflow`,
        the same on every device), no row is updated, so no gradient is ever half
        applied: the caller runs the step again with a larger capacity."""
        routed, stats = self.route_gradients(exchange, ids, valid, grads)
        return self.update_rows(exchange, state, routed, stats.overflow == 0), stats

    def route_gradients(self, exchange: Exchange, ids, valid, grads):
        """(`Routed` owned ids, summed gradients and mask, stats): `grads` sent to the
        owners of `ids` and summed per row there (`route_rows`)."""
        return route_rows(exchange, ids, valid, grads, mean=False, contains=self.layout.contains)

    def update_rows(self, exchange: Exchange, state: EmbeddingState, routed, when
                    ) -> EmbeddingState:
        """`state` with the sparse optimizer applied to the rows of `routed` (from
        `route_gradients`) where `when` (a bool scalar) holds; only those rows move."""
        owned, sums, mask = routed
        r = state.table.shape[0]
        local = owned_index(owned, mask & when, self.layout.starts, exchange.axis, fill=r)
        get = lambda a: a.at[local].get(mode="fill", fill_value=0)
        rows, slots = self.optimizer.update(get(state.table),
                                            {k: get(v) for k, v in state.slots.items()}, sums)
        put = lambda a, new: a.at[local].set(new, mode="drop")
        return EmbeddingState(put(state.table, rows),
                              {k: put(state.slots[k], slots[k]) for k in state.slots})

    # -- host side ---------------------------------------------------------------------

    def rows(self, state: EmbeddingState, rows) -> np.ndarray:
        """float32[k, dim]: table rows by row id (host, for inspection and export)."""
        pos = self.layout.padded_of_rows(np.asarray(rows).reshape(-1))
        return np.asarray(state.table[jnp.asarray(pos, jnp.int32)])
