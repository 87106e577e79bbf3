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
CPU it runs with `interpret=True`). `impl="auto"` picks Pallas in a program lowered
for a GPU and XLA in one lowered for anything else (by `lax.platform_dependent`, not by
the host's backend, so a CPU host builds exactly the GPU program).
Both draw each column with `_draw_column` (the kernel unrolled, the reference as a loop),
so they agree bit for bit; the kernel adds the tiling.
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from jgraph.hashing import hash32
from jgraph.mesh import varying_axes

Impl = Literal["auto", "xla", "pallas"]

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


def _draw_column(i, deg, key, fanout: int, replace: bool, seen_before):
    """int32[m]: draw i (a Python int or traced) of every node, as a position relative
    to the node's first in-edge, -1 for none. deg: int32[m]; key: uint32[m];
    seen_before(t): bool[m], whether t was already drawn (by draws 0 .. i-1)."""
    u = hash32(key, i)
    if replace:
        return jnp.where(deg > 0, uniform_below(u, deg), -1)
    # Floyd: at step i pick t uniform in [0, j], j = deg - fanout + i; if t was already
    # chosen take j itself. Each fanout-subset is equally likely. A node with
    # deg <= fanout takes its edges in order.
    many = deg > fanout
    j = deg - fanout + i
    t = uniform_below(u, j + 1)
    pick = jnp.where(many, jnp.where(seen_before(t), j, t), i)
    return jnp.where(many | (i < deg), pick, -1)


def _draw_tile(lo, deg, key, fanout: int, width: int, replace: bool):
    """Positions int32[m, width] (columns >= fanout and unused draws are -1), unrolled:
    the Pallas kernel's form.

    Columns are kept as separate [m] vectors and compared elementwise (no reductions,
    no odd-sized slices), which GPU Pallas handles well.
    """
    columns = []
    for i in range(fanout):
        def seen_before(t, earlier=tuple(columns)):
            seen = jnp.zeros(t.shape, bool)
            for column in earlier:
                seen = seen | (column == t)
            return seen
        columns.append(_draw_column(i, deg, key, fanout, replace, seen_before))
    cols = jax.lax.broadcasted_iota(jnp.int32, (lo.shape[0], width), 1)
    chosen = jnp.full((lo.shape[0], width), -1, jnp.int32)
    for i, column in enumerate(columns):
        chosen = jnp.where(cols == i, column[:, None], chosen)
    return jnp.where(chosen >= 0, lo[:, None] + chosen, -1)


def _draw_looped(lo, deg, key, fanout: int, replace: bool):
    """int32[m, fanout] edge positions (-1 where none): the draws of `_draw_tile`, as a
    loop over the draws (lo, deg: int32[m], key: uint32[m]). XLA compiles one step
    instead of `fanout` unrolled ones whose Floyd checks grow with the draw index
    (unrolled, XLA:CPU duplicated every earlier draw into each later column's fusion:
    a fanout-10 hop was about 10 fusions of 600 instructions, measured)."""
    m = lo.shape[0]
    rows = jnp.arange(fanout, dtype=jnp.int32)[:, None]

    def step(i, drawn):                        # drawn: int32[fanout, m], -1 = not yet
        def seen_before(t):
            return jnp.any((drawn == t[None, :]) & (rows < i), axis=0)
        column = _draw_column(i, deg, key, fanout, replace, seen_before)
        return jax.lax.dynamic_update_slice_in_dim(drawn, column[None, :], i, axis=0)
    # The carry is built from lo so that inside shard_map it varies over the mesh as lo.
    none = jnp.full((fanout, m), -1, jnp.int32) + jnp.zeros_like(lo)[None, :]
    drawn = jax.lax.fori_loop(0, fanout, step, none)
    return jnp.where(drawn >= 0, lo[None, :] + drawn, -1).T


def draw_positions_reference(lo, deg, key, fanout: int, replace: bool = False):
    """int32[m, fanout] edge positions of each node's draw; -1 where there is none.

    lo: int32[m] first in-edge of each node; deg: int32[m] its in-degree (0 for padding);
    key: uint32[m] each node's random key.
    """
    return _draw_looped(lo.astype(jnp.int32), deg.astype(jnp.int32), key.astype(jnp.uint32),
                        fanout, replace)


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


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _on_grid(inputs, fanout: int, width: int, replace: bool, tile: int):
    """The kernel's grid as XLA code: `_draw_tile` on tile i of every input gives tile i
    of the output, the tiles in sequence (`lax.map`), as Pallas's interpreter runs them.

    Used in interpret mode inside a vma-checked `shard_map`, where JAX's own Pallas
    interpreter fails (it re-evaluates the kernel with mesh-varying refs next to
    unvarying constants: "Primitive gt requires varying manual axes to match").
    """
    tiles = [x.reshape(-1, tile) for x in inputs]
    out = jax.lax.map(lambda t: _draw_tile(*t, fanout, width, replace), tiles)
    return out.reshape(-1, width)


@functools.partial(jax.jit, static_argnames=("fanout", "replace", "tile", "interpret"))
def _draw_kernel(lo, deg, key, fanout: int, replace: bool, tile: int, interpret: bool):
    """int32[m, fanout]: the Pallas kernel over tiles of `tile` nodes (see
    `draw_positions_pallas`), compiled (interpret False) or interpreted."""
    m = lo.shape[0]
    padded = max(-(-m // tile), 1) * tile
    width = _next_pow2(max(fanout, 1))
    pad = lambda x, dtype: jnp.pad(x.astype(dtype), (0, padded - m))
    lo, deg, key = pad(lo, jnp.int32), pad(deg, jnp.int32), pad(key, jnp.uint32)
    # Inside a vma-checked shard_map?
    if interpret and varying_axes(lo):
        out = _on_grid((lo, deg, key), fanout, width, replace, tile)
    else:
        spec = pl.BlockSpec((tile,), lambda i: (i,))
        out = pl.pallas_call(
            functools.partial(_kernel, fanout=fanout, replace=replace),
            out_shape=_out_struct(lo, (padded, width), jnp.int32),
            grid=(padded // tile,),
            in_specs=[spec, spec, spec],
            out_specs=pl.BlockSpec((tile, width), lambda i: (i, 0)),
            interpret=interpret,
            # Triton, chosen explicitly: JAX 0.10's default Pallas GPU backend (Mosaic
            # GPU) cannot lay out the kernel's iota, and Triton also serves ROCm.
            compiler_params=None if interpret else plt.CompilerParams(num_warps=4,
                                                                      num_stages=1),
        )(lo, deg, key)
    return out[:m, :fanout]


def draw_positions_pallas(lo, deg, key, fanout: int, replace: bool = False, *,
                          tile: int = 256, interpret: bool | None = None):
    """Pallas version of `draw_positions_reference`: a grid over tiles of `tile` nodes.

    Tile shapes are powers of two (as GPU Pallas requires): nodes are padded up to a
    multiple of `tile` (with degree 0) and the output's width up to a power of two,
    then both are cut back. interpret: True runs the kernel as XLA code (any platform),
    False compiles it (GPU); None chooses by the platform the program is lowered for
    (compiled on CUDA and ROCm, interpreted elsewhere), so a CPU host builds the GPU
    program exactly when it lowers for a GPU.
    """
    run = functools.partial(_draw_kernel, fanout=fanout, replace=replace, tile=tile)
    if interpret is not None:
        return run(lo, deg, key, interpret=interpret)
    compiled = functools.partial(run, interpret=False)
    return jax.lax.platform_dependent(lo, deg, key, cuda=compiled, rocm=compiled,
                                      default=functools.partial(run, interpret=True))


IMPLS = ("auto", "xla", "pallas")


def check_impl(impl: Impl) -> Impl:
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'auto', 'xla' or 'pallas', got {impl!r}")
    return impl


def draw_positions(lo, deg, key, fanout: int, replace: bool = False, impl: Impl = "auto"):
    """`draw_positions_reference` or `draw_positions_pallas`, by `impl`: "xla" the
    reference, "pallas" the kernel (interpreted off GPU), "auto" the kernel in a program
    lowered for a GPU and the reference in one lowered for anything else."""
    check_impl(impl)
    if impl == "xla":
        return draw_positions_reference(lo, deg, key, fanout, replace)
    if impl == "pallas":
        return draw_positions_pallas(lo, deg, key, fanout, replace)
    kernel = functools.partial(draw_positions_pallas, fanout=fanout, replace=replace,
                               interpret=False)
    return jax.lax.platform_dependent(
        lo, deg, key, cuda=kernel, rocm=kernel,
        default=functools.partial(draw_positions_reference, fanout=fanout, replace=replace))
