"""Row helpers of the exchange: pytrees of arrays whose leading axis is rows (ids), the
owner's answers to ids packed by their running count, an owned id's row in this
device's block (`owned_index`, `owned_rows`), and rows sent to their ids' owners, then
written there (`route_rows`, `store_rows`). Traced inside `shard_map`."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange.segments import running_count

if TYPE_CHECKING:
    from jgraph.exchange.exchange import Exchange, ExchangeStats

PyTree = Any
OwnerFn = Callable[[jnp.ndarray, jnp.ndarray], PyTree]
"""`owner_fn(ids, mask)`: answers for global ids this device owns, one row per id.

`ids: int32[m]`, `mask: bool[m]` (rows where mask is False may hold anything; they are
discarded). Returns a pytree of arrays with leading dimension m. Hashable, as Python
functions are: `answer_filled` traces it through `jax.jit`, once for its shapes and its
loop together.
"""


def row_bytes(tree: PyTree) -> int:
    """Bytes of one row of every leaf together (leading axis: rows)."""
    return sum(int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def take(tree: PyTree, idx: jnp.ndarray, ok: jnp.ndarray) -> PyTree:
    """Rows `idx` of every leaf, zero where not `ok`."""
    def one(x):
        rows = jnp.take(x, jnp.where(ok, idx, 0), axis=0)
        return jnp.where(ok.reshape(ok.shape + (1,) * (x.ndim - 1)), rows, jnp.zeros((), x.dtype))
    return jax.tree.map(one, tree)


def put(n: int, tree: PyTree, idx: jnp.ndarray, ok: jnp.ndarray, into: PyTree = None) -> PyTree:
    """Scatter rows into leaves of n rows (zeros, or `into`) at `idx` where `ok`."""
    idx = jnp.where(ok, idx, n)
    if into is None:
        into = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype), tree)
    return jax.tree.map(lambda base, x: base.at[idx].set(x, mode="drop"), into, tree)


def select(mask: jnp.ndarray, a: PyTree, b: PyTree) -> PyTree:
    return jax.tree.map(
        lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)


def psum_scatter_any(x: jnp.ndarray, axis: str) -> jnp.ndarray:
    if x.dtype == jnp.bool_:
        return lax.psum_scatter(x.astype(jnp.int32), axis, scatter_dimension=0, tiled=True) > 0
    return lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)


def _chunk(length: int, chunks: int) -> int:
    """Rows per chunk of `answer_filled` over `length` ids."""
    return max(-(-length // chunks) // 8 * 8 + 8, 8)


def answer_shapes(owner_fn: OwnerFn, length: int, like: jnp.ndarray,
                  chunks: int = 8) -> PyTree:
    """Shapes of `owner_fn`'s answers to one chunk of `answer_filled(owner_fn, ids,
    chunks)` for ids of `length` (the chunk typed like `like`: mesh-varying inside
    shard_map), from the trace the loop reuses: `owner_fn` traced once for both."""
    ids = jnp.zeros(_chunk(length, chunks), jnp.int32) + like.reshape(-1)[0] * 0
    return jax.jit(owner_fn).eval_shape(jnp.maximum(ids, 0), ids >= 0)


def answer_filled(owner_fn: OwnerFn, ids: jnp.ndarray, chunks: int = 8) -> PyTree:
    """`owner_fn` of every id >= 0 of `ids` (int32[L], -1 elsewhere), zero answers at
    the -1 slots, in work that follows the ids present rather than L.

    The ids are packed to the front and answered `ceil(L / chunks)` at a time in a loop
    that runs only over the chunks holding any (a trip count computed in the step):
    `owner_fn` is traced once (as a jitted function, whose trace `answer_shapes` and
    the loop share), and a buffer whose tail is empty costs nothing to answer.
    """
    length = ids.shape[0]
    present = ids >= 0
    slot = running_count(present) - 1
    size = _chunk(length, chunks)
    total = -(-length // size) * size
    packed = jnp.full(total, -1, jnp.int32).at[jnp.where(present, slot, total)].set(
        ids, mode="drop")
    shapes = answer_shapes(owner_fn, length, packed, chunks)
    # Zeros typed like the ids (mesh-varying inside shard_map), as the loop carry must be.
    zero = packed[0] * 0
    buffers = jax.tree.map(lambda s: jnp.zeros((total,) + s.shape[1:], s.dtype)
                           + zero.astype(s.dtype), shapes)

    def answer(i, buffers):
        chunk = lax.dynamic_slice_in_dim(packed, i * size, size)
        got = jax.jit(owner_fn)(jnp.maximum(chunk, 0), chunk >= 0)
        return jax.tree.map(lambda b, x: lax.dynamic_update_slice_in_dim(b, x, i * size, 0),
                            buffers, got)
    # Chunks holding ids: from the running count's last entry (no separate sum to
    # compile); lax.div truncates, as a ceiling division of counts >= 0 needs.
    filled = lax.div(slot[-1] + size, jnp.int32(size))
    buffers = lax.fori_loop(0, filled, answer, buffers)
    return take(buffers, slot, present)


# -- this device's rows ------------------------------------------------------------------


def owned_index(ids: jnp.ndarray, mask: jnp.ndarray, starts, axis: str,
                fill=0) -> jnp.ndarray:
    """int32: the row of each id in this device's block where `mask` (ids it owns; the
    block of partition p starts at global id `starts[p]`), `fill` elsewhere: 0 to read
    (a row that exists; its value is discarded), the block's length to write with
    `mode="drop"`."""
    first = jnp.asarray(starts, jnp.int32)[lax.axis_index(axis)]
    return jnp.where(mask, ids - first, fill)


def owned_rows(block, starts, axis: str) -> OwnerFn:
    """owner_fn reading this device's `block` (a pytree of [n, ...] rows, partition p's
    from global id `starts[p]` on) by owned global id."""
    def fn(ids, mask):
        at = owned_index(ids, mask, starts, axis)
        return jax.tree.map(lambda x: x[at], block)
    return fn


class Routed(NamedTuple):
    """Rows `route_rows` brought to their owner. M: the exchange's scatter length.

    ids: int32[M] the distinct owned ids any device sent, -1 where not mask;
    rows: [M, ...] each id's rows combined (their mean or sum); mask: bool[M].
    """

    ids: jnp.ndarray
    rows: jnp.ndarray
    mask: jnp.ndarray


def route_rows(exchange: Exchange, ids, valid, rows, mean: bool = True, contains=None
               ) -> tuple[Routed, ExchangeStats]:
    """`rows` ([n, ...]; bool rows as int32) sent to the owners of `ids` where `valid`,
    in one `scatter_add` round (what does not fit is counted in `overflow`, not sent).
    An id sent several times, by one device or many, gets the mean of its rows (mean:
    a count travels beside them) or their sum. contains: as `Exchange.gather`'s."""
    if rows.dtype == jnp.bool_:
        rows = rows.astype(jnp.int32)
    if not mean:
        (owned, sums, mask), stats = exchange.scatter_add(ids, valid, rows, contains=contains)
        return Routed(owned, sums, mask), stats
    payload = (rows, jnp.ones((ids.shape[0],), jnp.float32))
    (owned, (sums, count), mask), stats = exchange.scatter_add(ids, valid, payload,
                                                               contains=contains)
    count = count.reshape(count.shape + (1,) * (sums.ndim - 1))
    return Routed(owned, sums / jnp.maximum(count, 1).astype(sums.dtype), mask), stats


def store_rows(block: jnp.ndarray, routed: Routed, starts, axis: str, add: bool = False,
               where=True) -> jnp.ndarray:
    """This device's `block` of rows (partition p's from global id `starts[p]` on) with
    the rows `route_rows` brought set (or added) at their ids, if `where` (a bool
    scalar; else as it was). Written in place: a copy of the block would cost its size."""
    at = owned_index(routed.ids, routed.mask & where, starts, axis, fill=block.shape[0])
    rows = routed.rows.astype(block.dtype)
    if add:
        return block.at[at].add(rows, mode="drop")
    return block.at[at].set(rows, mode="drop")
