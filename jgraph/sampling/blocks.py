"""Blocks: the fixed-shape bipartite graphs one sampling hop produces.

A Block is what DGL calls a message-flow-graph block: the `dst` nodes of a layer, the
`src` nodes they read from (the dst nodes first, so a layer finds each dst node's own
previous representation at the same index), and, for every dst node, a fixed number
of neighbour slots indexing into `src`. Shapes are static (padding + masks), so a
compiled step never sees a new shape.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jgraph.exchange import running_count

# Deduplicating with dense [num_nodes] tables is linear time; above this many nodes the
# tables would cost more memory than a sort (per device, int32).
DENSE_DEDUP_MAX_NODES = 1 << 26


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Block:
    """One hop of a sample. n_dst, n_src: static capacities; W: neighbour slots per node.

      dst: int32[n_dst] — global ids of the nodes this hop computes, real ones first,
        then -1 padding.
      src: int32[n_src] — global ids of the nodes it reads: the real dst nodes first
        (`src[i] == dst[i]` wherever `dst[i] >= 0`), then every other sampled
        neighbour once (deduplicated), then -1 padding. Since padding is at the tail,
        n_src needs no room for dst padding: it is capped by the node count.
      nbr: int32[n_dst, W] — index into `src` of each sampled in-neighbour; -1 where
        `mask` is False.
      mask: bool[n_dst, W] — True for a real sampled edge.
      etype: int32[n_dst, W] or None — relation index of each sampled edge (-1 where
        masked); None for a graph with one relation.

    With a fixed W, aggregation is a gather and a masked mean: `h_src[nbr]` weighted by
    `mask`, no scatter needed.
    """

    dst: jax.Array
    src: jax.Array
    nbr: jax.Array
    mask: jax.Array
    etype: jax.Array | None = None

    @property
    def num_dst(self) -> int:
        return self.dst.shape[0]

    @property
    def num_src(self) -> int:
        return self.src.shape[0]

    @property
    def dst_mask(self) -> jax.Array:
        return self.dst >= 0

    @property
    def src_mask(self) -> jax.Array:
        return self.src >= 0


def first_occurrence(ids: jnp.ndarray) -> jnp.ndarray:
    """int32[c]: for each valid entry (ids >= 0) the position of the first entry with
    the same id (by a stable sort); padding entries get their own position."""
    c = ids.shape[0]
    pos = jnp.arange(c, dtype=jnp.int32)
    valid = ids >= 0
    big = jnp.iinfo(jnp.int32).max
    order = jnp.argsort(jnp.where(valid, ids, big), stable=True).astype(jnp.int32)
    keys = jnp.where(valid, ids, big)[order]
    starts = jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
    head = jax.lax.cummax(jnp.where(starts, pos, 0))
    first = jnp.zeros(c, jnp.int32).at[order].set(order[head])
    return jnp.where(valid, first, pos)


def use_dense_table(num_nodes: int, entries: int) -> bool:
    """Deduplicate with [num_nodes] tables (linear time) unless the graph is so large
    next to the batch that clearing the tables would cost more than sorting."""
    return num_nodes <= min(DENSE_DEDUP_MAX_NODES, max(16 * entries, 1 << 22))


def src_capacity(n_dst: int, width: int, num_nodes: int) -> int:
    """Static size of a hop's `src`: every dst and neighbour slot distinct, but never
    more than the graph's nodes (and at least n_dst, so `src[:n_dst]` holds dst)."""
    return max(n_dst, min(n_dst * (1 + width), num_nodes))


def compact_front(ids: jnp.ndarray) -> jnp.ndarray:
    """The valid ids (>= 0) first, in their order, then -1: the layout `dst` needs."""
    valid = ids >= 0
    slot = jnp.where(valid, running_count(valid) - 1, ids.shape[0])
    return jnp.full_like(ids, -1).at[slot].set(ids, mode="drop")


def build_block(dst: jnp.ndarray, nbr_ids: jnp.ndarray, etype: jnp.ndarray | None,
                num_src: int, num_nodes: int) -> Block:
    """Deduplicate sampled neighbours into `src` (dst first) and index them.

    dst: int32[n_dst] distinct ids, real ones first then -1; nbr_ids: int32[n_dst, W]
    sampled neighbour ids, -1 where none; num_src: the static size of `src`, at least
    n_dst and the most distinct ids the hop can produce (`src_capacity`).
    """
    return build_block_counted(dst, nbr_ids, etype, num_src, num_nodes)[0]


def build_block_counted(dst: jnp.ndarray, nbr_ids: jnp.ndarray, etype: jnp.ndarray | None,
                        num_src: int, num_nodes: int) -> tuple[Block, jnp.ndarray]:
    """`build_block`, and the int32 number of src rows the hop needs (real dst and
    distinct new neighbours). With a `num_src` below `src_capacity`, more than
    `num_src` is an overflow: the ids past it are left out of `src` and their slots
    masked, so the block is incomplete and its step must be run again with more room
    (see `NeighborSampler.capacities`)."""
    n_dst, width = nbr_ids.shape
    real = jnp.sum(dst >= 0, dtype=jnp.int32)          # the new nodes start here
    flat = nbr_ids.reshape(-1)
    src = jnp.concatenate([dst, jnp.full(num_src - n_dst, -1, jnp.int32)])
    if use_dense_table(num_nodes, flat.shape[0]):
        # Mark every sampled id in a node table; the new ones (not dst) get src slots
        # in id order, by a running count over the table.
        where_dst = jnp.full(num_nodes, -1, jnp.int32).at[
            jnp.where(dst >= 0, dst, num_nodes)].set(jnp.arange(n_dst, dtype=jnp.int32),
                                                     mode="drop")
        seen = jnp.zeros(num_nodes, bool).at[jnp.where(flat >= 0, flat, num_nodes)].set(
            True, mode="drop")
        new = seen & (where_dst < 0)
        rank = running_count(new) - 1
        extra = jnp.sum(new, dtype=jnp.int32)
        safe = jnp.maximum(flat, 0)
        index = jnp.where(where_dst[safe] >= 0, where_dst[safe], real + rank[safe])
        src = src.at[jnp.where(new, real + rank, num_src)].set(
            jnp.arange(num_nodes, dtype=jnp.int32), mode="drop")
    else:
        # Sort dst and samples together; an id's first occurrence names its src slot.
        cand = jnp.concatenate([dst, flat])
        pos = jnp.arange(cand.shape[0], dtype=jnp.int32)
        first = first_occurrence(cand)
        is_new = (cand >= 0) & (first == pos) & (pos >= n_dst)
        rank = running_count(is_new) - 1
        extra = jnp.sum(is_new, dtype=jnp.int32)
        index = jnp.where(first < n_dst, first, real + rank[first])[n_dst:]
        src = src.at[jnp.where(is_new, real + rank, num_src)].set(cand, mode="drop")
    fits = (flat >= 0) & (index < num_src)
    nbr = jnp.where(fits, index, -1).reshape(n_dst, width)
    # Materialise the block here: left to itself XLA:CPU fuses these gathers into every
    # consumer (a reduction over the mask ran 10x slower, measured).
    src, nbr = jax.lax.optimization_barrier((src, nbr))
    mask = fits.reshape(n_dst, width)
    if etype is not None:
        etype = jnp.where(mask, etype, -1)
    return Block(dst=dst, src=src, nbr=nbr, mask=mask, etype=etype), real + extra
