"""Row helpers of the exchange: pytrees of arrays whose leading axis is rows (ids), and
the running count that places ids in packed buffers. Traced inside `shard_map`."""
from __future__ import annotations

import math
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


_COUNT_BLOCK = 64
_EXACT = 1 << 24    # float32 holds every integer below this exactly


def running_count(flags: jnp.ndarray, axis: int = 0) -> jnp.ndarray:
    """int32 inclusive running count of the True entries of bool `flags` along `axis`.

    Programs lowered for CPU count with float32 matmuls (`_inclusive_last`, exact while
    no count passes 2^24): XLA:CPU lowers a cumsum to a reduce-window that its rewriter
    splits into a tree of kernels (about nine for a request's length, each compiled
    apart), and a parallel-prefix scan compiles into about 2 log2(n) kernels, while a
    float32 matmul is a library call with nothing to compile. Longer arrays carry the
    blocks' totals with an int32 cumsum. Other platforms keep cumsum. Chosen by the
    lowering platform, not the host's backend.
    """
    if flags.dtype != jnp.bool_:
        raise TypeError(f"running_count counts bool flags, got {flags.dtype}")
    return _prefix(flags, axis, flags.shape[axis], inclusive=True)


def exclusive_sum(counts: jnp.ndarray, most: int, axis: int = 0) -> jnp.ndarray:
    """int32 exclusive running sum of int `counts` (>= 0) along `axis`: where each
    group starts when groups of these sizes are laid end to end. most: a static bound
    on their total (a request's length, say); on CPU, with matmuls as `running_count`
    where it is below 2^24."""
    return _prefix(counts.astype(jnp.int32), axis, most, inclusive=False)


def _prefix(x: jnp.ndarray, axis: int, most: int, inclusive: bool) -> jnp.ndarray:
    """int32 running sum of x (>= 0, totals at most `most`) along `axis`, inclusive or
    exclusive: float32 matmuls along the last axis on CPU (exact below 2^24; past it,
    running counts take only their first level from a matmul), cumsum elsewhere."""
    def cumsum(x):
        total = jnp.cumsum(x, axis=axis, dtype=jnp.int32)
        return total if inclusive else total - x

    def last(x):
        x = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
        if most < _EXACT:
            out = (_inclusive_last if inclusive else _exclusive_last)(x).astype(jnp.int32)
        else:
            out = _long_count(x)
        return jnp.moveaxis(out, -1, axis)
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.int32)
    if most >= _EXACT and not inclusive:
        return cumsum(x)
    return lax.platform_dependent(x, cpu=last, default=cumsum)


def _blocks_of(x: jnp.ndarray) -> jnp.ndarray:
    """[..., m] -> [..., ceil(m / b), b] for b = `_COUNT_BLOCK`, zero-padded."""
    m, b = x.shape[-1], _COUNT_BLOCK
    blocks = -(-m // b)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * b - m)])
    return x.reshape(x.shape[:-1] + (blocks, b))


def _unblock(x: jnp.ndarray, m: int) -> jnp.ndarray:
    """Inverse of `_blocks_of`: [..., B, b] -> [..., m]."""
    return x.reshape(x.shape[:-2] + (-1,))[..., :m]


def _running(x: jnp.ndarray, strict: bool = False) -> jnp.ndarray:
    """x @ a [m, m] triangle of ones (row <= column, < if strict) for float32[..., m]:
    x's running sum along its last axis, in a matmul XLA:CPU hands to its library (the
    triangle a numpy constant; a single row gets a zero row: a one-row product would
    be a kernel to compile; HIGHEST precision: the sums stay exact whatever the
    default)."""
    m = x.shape[-1]
    triangle = np.triu(np.ones((m, m), np.float32), 1 if strict else 0)
    if math.prod(x.shape[:-1]) > 1:
        return jnp.matmul(x, triangle, precision=lax.Precision.HIGHEST)
    rows = jnp.stack([x.reshape(m), jnp.zeros(m, x.dtype)])
    return jnp.matmul(rows, triangle, precision=lax.Precision.HIGHEST)[0].reshape(x.shape)


def _inclusive_last(x: jnp.ndarray) -> jnp.ndarray:
    """float32[..., n] inclusive running sum of float32 x (0 or 1) along its last axis:
    a triangle of ones within blocks of `_COUNT_BLOCK`, plus where each block starts
    (`_exclusive_last` of the blocks' totals)."""
    within = _running(_blocks_of(x))
    return _unblock(within + _exclusive_last(within[..., -1])[..., None], x.shape[-1])


def _exclusive_last(x: jnp.ndarray) -> jnp.ndarray:
    """float32[..., m] exclusive running sum along the last axis of float32 x: blocks of
    `_COUNT_BLOCK` as `_inclusive_last`, down to one block, summed with a strict
    triangle (log64(m) levels)."""
    m = x.shape[-1]
    if m <= _COUNT_BLOCK:
        return _running(x, strict=True)
    blocks = _blocks_of(x)
    within = _running(blocks)
    return _unblock(within - blocks + _exclusive_last(within[..., -1])[..., None], m)


def _long_count(x: jnp.ndarray) -> jnp.ndarray:
    """int32[..., n] inclusive running count of float32 x (0 or 1) past 2^24 entries:
    a triangle within blocks (exact: at most 64), the blocks' starts by int32 cumsum."""
    within = _running(_blocks_of(x)).astype(jnp.int32)
    totals = within[..., -1]
    before = jnp.cumsum(totals, axis=-1, dtype=jnp.int32) - totals
    return _unblock(within + before[..., None], x.shape[-1])


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
