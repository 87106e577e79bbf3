"""Row helpers of the exchange: pytrees of arrays whose leading axis is rows (ids), and
the running count that places ids in packed buffers. Traced inside `shard_map`."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

PyTree = Any
OwnerFn = Callable[[jnp.ndarray, jnp.ndarray], PyTree]
"""`owner_fn(ids, mask)`: answers for global ids this device owns, one row per id.

`ids: int32[m]`, `mask: bool[m]` (rows where mask is False may hold anything; they are
discarded). Returns a pytree of arrays with leading dimension m.
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


_COUNT_BLOCK = 64


def running_count(flags: jnp.ndarray) -> jnp.ndarray:
    """int32 inclusive running count of the True entries of bool `flags` along axis 0.

    Programs lowered for CPU count in blocks of 64 (one small matmul with a triangle of
    ones, exact: a block holds at most 64) and carry the blocks' totals with cumsum:
    XLA:CPU lowers a whole cumsum to a slow reduce-window, and a parallel-prefix scan
    compiles into about 2 log2(n) kernels (about 1 s of compile each, measured; this
    takes 0.2 s and runs within 2x of the scan). Other platforms keep cumsum. Chosen by
    the lowering platform, not the host's backend.
    """
    if flags.dtype != jnp.bool_:
        raise TypeError(f"running_count counts bool flags, got {flags.dtype}")
    return lax.platform_dependent(flags, cpu=_blocked_count,
                                  default=lambda x: jnp.cumsum(x, axis=0, dtype=jnp.int32))


def _blocked_count(flags: jnp.ndarray) -> jnp.ndarray:
    """int32[n, ...]: `running_count` of bool[n, ...] in blocks of `_COUNT_BLOCK` rows."""
    n, rest, b = flags.shape[0], flags.shape[1:], _COUNT_BLOCK
    blocks = -(-n // b)
    x = jnp.pad(flags.astype(jnp.float32), [(0, blocks * b - n)] + [(0, 0)] * len(rest))
    x = x.reshape((blocks, b) + rest)
    upper = (jnp.arange(b)[:, None] <= jnp.arange(b)[None, :]).astype(jnp.float32)
    within = jnp.einsum("bi...,ij->bj...", x, upper).astype(jnp.int32)
    totals = within[:, -1]
    before = jnp.cumsum(totals, axis=0, dtype=jnp.int32) - totals
    return (within + before[:, None]).reshape((blocks * b,) + rest)[:n]


def answer_filled(owner_fn: OwnerFn, ids: jnp.ndarray, chunks: int = 8) -> PyTree:
    """`owner_fn` of every id >= 0 of `ids` (int32[L], -1 elsewhere), zero answers at
    the -1 slots, in work that follows the ids present rather than L.

    The ids are packed to the front and answered `ceil(L / chunks)` at a time in a loop
    that runs only over the chunks holding any (a trip count computed in the step):
    `owner_fn` is traced once, and a buffer whose tail is empty costs nothing to answer.
    """
    length = ids.shape[0]
    present = ids >= 0
    slot = running_count(present) - 1
    size = max(-(-length // chunks) // 8 * 8 + 8, 8)
    total = -(-length // size) * size
    packed = jnp.full(total, -1, jnp.int32).at[jnp.where(present, slot, total)].set(
        ids, mode="drop")
    shapes = jax.eval_shape(owner_fn, packed[:size], packed[:size] >= 0)
    # Zeros typed like the ids (mesh-varying inside shard_map), as the loop carry must be.
    zero = packed[0] * 0
    buffers = jax.tree.map(lambda s: jnp.zeros((total,) + s.shape[1:], s.dtype)
                           + zero.astype(s.dtype), shapes)

    def answer(i, buffers):
        chunk = lax.dynamic_slice_in_dim(packed, i * size, size)
        got = owner_fn(jnp.maximum(chunk, 0), chunk >= 0)
        return jax.tree.map(lambda b, x: lax.dynamic_update_slice_in_dim(b, x, i * size, 0),
                            buffers, got)
    filled = -(-jnp.sum(present, dtype=jnp.int32) // size)
    buffers = lax.fori_loop(0, filled, answer, buffers)
    return take(buffers, slot, present)
