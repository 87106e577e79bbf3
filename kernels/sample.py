"""Per-node neighbour draws: which in-edges of each node a sampler keeps.

`draw_positions(lo, deg, key, fanout, replace, impl)` returns, for every node i, up to
`fanout` edge positions in `[lo[i], lo[i] + deg[i])`:

  - without replacement (default): a uniformly random `fanout`-subset of the node's
    edges (Robert Floyd's algorithm, `fanout` steps, vectorised over nodes); a node
    with `deg <= fanout` keeps all of its edges, in order;
  - with replacement: `fanout` independent uniform draws (none when `deg == 0`).

The randomness is counter-based: draw j of node i is `hash32(key[i], j)`, so a node's
draws depend only on its key (the sampler derives it from seed, step, hop and global
node id), never on where in the batch, or on which device, the node is drawn.

Two implementations with one signature: `draw_positions_reference` (plain jnp, what
XLA runs on CPU) and `draw_positions_pallas` (a Pallas kernel over tiles of nodes; on
CPU it runs with `interpret=True`). `impl="auto"` picks Pallas on GPU, XLA elsewhere.
Both call `_draw_tile`, so they agree bit for bit; the kernel adds the tiling.
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

Impl = Literal["auto", "xla", "pallas"]

_GOLDEN = 0x9E3779B9


def fmix32(h: jnp.ndarray) -> jnp.ndarray:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hash32(key: jnp.ndarray, counter) -> jnp.ndarray:
    """uint32 hash of (key, counter): the counter-based random stream of one key."""
    return fmix32(key + jnp.uint32(_GOLDEN) * (jnp.asarray(counter, jnp.uint32) + 1))


def mulhi32(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """High 32 bits of the 64-bit product of uint32 a and b, in 32-bit arithmetic.

    `mulhi32(u, m)` maps a uniform uint32 u to a uniform integer in [0, m) (Lemire's
    multiply-shift; the bias is at most m / 2**32).
    """
    mask = jnp.uint32(0xFFFF)
    a_lo, a_hi, b_lo, b_hi = a & mask, a >> 16, b & mask, b >> 16
    t = a_hi * b_lo + ((a_lo * b_lo) >> 16)
    w = (t & mask) + a_lo * b_hi
    return a_hi * b_hi + (t >> 16) + (w >> 16)


def uniform_below(u: jnp.ndarray, m: jnp.ndarray) -> jnp.ndarray:
    """int32 in [0, m) from uint32 bits u (m >= 1)."""
    return mulhi32(u, jnp.maximum(m, 1).astype(jnp.uint32)).astype(jnp.int32)


def _draw_tile(lo, deg, key, fanout: int, width: int, replace: bool):
    """Positions int32[m, width] (columns >= fanout and unused draws are -1).

    Columns are kept as separate [m] vectors and compared elementwise (no reductions,
    no odd-sized slices), which XLA and GPU Pallas both handle well.
    """
    columns = []
    many = deg > fanout
    for i in range(fanout):
        u = hash32(key, i)
        if replace:
            pick = uniform_below(u, deg)
            ok = deg > 0
        else:
            # Floyd: at step i pick t uniform in [0, j], j = deg - fanout + i; if t was
            # already chosen take j itself. Each fanout-subset is equally likely.
            j = deg - fanout + i
            t = uniform_below(u, j + 1)
            seen = jnp.zeros(t.shape, bool)
            for earlier in columns:
                seen = seen | (earlier == t)
            pick = jnp.where(many, jnp.where(seen, j, t), i)
            ok = many | (i < deg)
        columns.append(jnp.where(ok, pick, -1))
    cols = jax.lax.broadcasted_iota(jnp.int32, (lo.shape[0], width), 1)
    chosen = jnp.full((lo.shape[0], width), -1, jnp.int32)
    for i, column in enumerate(columns):
        chosen = jnp.where(cols == i, column[:, None], chosen)
    return jnp.where(chosen >= 0, lo[:, None] + chosen, -1)


def draw_positions_reference(lo, deg, key, fanout: int, replace: bool = False):
    """int32[m, fanout] edge positions of each node's draw; -1 where there is none.

    lo: int32[m] first in-edge of each node; deg: int32[m] its in-degree (0 for padding);
    key: uint32[m] each node's random key.
    """
    return _draw_tile(lo.astype(jnp.int32), deg.astype(jnp.int32), key.astype(jnp.uint32),
                      fanout, fanout, replace)


def _kernel(lo_ref, deg_ref, key_ref, out_ref, *, fanout: int, replace: bool):
    out_ref[...] = _draw_tile(lo_ref[...], deg_ref[...], key_ref[...], fanout,
                              out_ref.shape[1], replace)


def _out_struct(like, shape, dtype) -> jax.ShapeDtypeStruct:
    """An output shape that varies over the same mesh axes as `like`, which Pallas needs
    inside `shard_map` (the field is `manual_axis_type` on JAX 0.10, `vma` later)."""
    aval = jax.typeof(like)
    for attr, keyword in (("mat", "manual_axis_type"), ("vma", "vma")):
        if hasattr(aval, attr):
            try:
                return jax.ShapeDtypeStruct(shape, dtype, **{keyword: getattr(aval, attr)})
            except TypeError:
                continue
    return jax.ShapeDtypeStruct(shape, dtype)


def _varying(x) -> bool:
    """Does x vary over manual mesh axes (are we inside shard_map)?"""
    aval = jax.typeof(x)
    for attr in ("mat", "vma"):
        value = getattr(aval, attr, None)
        if value is not None:
            return bool(getattr(value, "varying", value))
    return False


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


@functools.partial(jax.jit, static_argnames=("fanout", "replace", "tile", "interpret"))
def draw_positions_pallas(lo, deg, key, fanout: int, replace: bool = False, *,
                          tile: int = 256, interpret: bool | None = None):
    """Pallas version of `draw_positions_reference`: a grid over tiles of `tile` nodes.

    Tile shapes are powers of two (as GPU Pallas requires): nodes are padded up to a
    multiple of `tile` (with degree 0) and the output's width up to a power of two,
    then both are cut back. `interpret` defaults to True off GPU.
    """
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    m = lo.shape[0]
    padded = max(-(-m // tile), 1) * tile
    width = _next_pow2(max(fanout, 1))
    pad = lambda x, dtype: jnp.pad(x.astype(dtype), (0, padded - m))   # noqa: E731
    spec = pl.BlockSpec((tile,), lambda i: (i,))
    lo, deg, key = pad(lo, jnp.int32), pad(deg, jnp.int32), pad(key, jnp.uint32)
    call = pl.pallas_call(
        functools.partial(_kernel, fanout=fanout, replace=replace),
        out_shape=_out_struct(lo, (padded, width), jnp.int32),
        grid=(padded // tile,),
        in_specs=[spec, spec, spec],
        out_specs=pl.BlockSpec((tile, width), lambda i: (i, 0)),
        interpret=interpret,
    )
    try:
        out = call(lo, deg, key)
    except ValueError as err:
        if not (interpret and _varying(lo)):
            raise
        # JAX's Pallas interpreter mixes axis-varying refs with plain constants, which
        # shard_map's type check rejects. The compiled GPU kernel is not affected.
        raise ValueError(
            "the Pallas draw kernel in interpret mode cannot run inside jax.shard_map "
            "with check_vma=True (a JAX limitation): pass check_vma=False to shard_map, "
            "or use impl='xla' on CPU") from err
    return out[:m, :fanout]


def resolve_impl(impl: Impl) -> Literal["xla", "pallas"]:
    if impl == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    if impl not in ("xla", "pallas"):
        raise ValueError(f"impl must be 'auto', 'xla' or 'pallas', got {impl!r}")
    return impl


def draw_positions(lo, deg, key, fanout: int, replace: bool = False, impl: Impl = "auto"):
    """`draw_positions_reference` or `draw_positions_pallas`, by `impl`."""
    if resolve_impl(impl) == "pallas":
        return draw_positions_pallas(lo, deg, key, fanout, replace)
    return draw_positions_reference(lo, deg, key, fanout, replace)
