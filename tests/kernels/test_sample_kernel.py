"""The neighbour-draw kernel: the Pallas kernel (interpret mode on CPU) equals the jnp
reference bit for bit; the reference's draws are in range, distinct without
replacement, all edges in order when deg <= fanout, and uniform by chi-square (every
fanout-subset equally likely; with replacement, independent uniform draws); the hash
and the multiply-shift against 64-bit numpy.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
from jgraph.kernels.sample import (
    check_impl,
    draw_positions,
    draw_positions_pallas,
    draw_positions_reference,
    mulhi32,
    uniform_below,
)

from jgraph.hashing import fmix32, hash32
from jgraph.sharded import ROWS, make_mesh

ALPHA = 1e-3


@functools.cache
def reference(fanout, replace):
    return jax.jit(functools.partial(draw_positions_reference, fanout=fanout, replace=replace))


def random_keys(rng, m) -> np.ndarray:
    return rng.integers(0, 2**32, m, dtype=np.uint64).astype(np.uint32)


def nodes(rng, m, fanout):
    """(lo, deg, key) for m nodes: degrees 0, below, at and just above the fanout, up to
    3 * fanout + 5, and a few huge ones; arbitrary edge offsets."""
    deg = rng.integers(0, 3 * fanout + 6, m)
    deg[:4] = [0, max(fanout - 1, 0), fanout, fanout + 1]
    deg[4:8] = [0, 1, 10**6, 2**31 - 2]
    lo = rng.integers(0, 10**6, m)
    lo[6:8] = 0                                     # keep lo + deg inside int32
    return lo.astype(np.int32), deg.astype(np.int32), random_keys(rng, m)


# -- Pallas equals the reference -----------------------------------------------------------------


@pytest.mark.parametrize("fanout,m,tile", [(1, 300, 128), (3, 300, 128), (6, 300, 128),
                                           (8, 37, 256)])
@pytest.mark.parametrize("replace", [False, True], ids=["without", "with"])
def test_pallas_kernel_in_interpret_mode_equals_the_reference_exactly(fanout, m, tile, replace):
    """Including node counts that are not a multiple of the tile (or below it), fanouts
    that are not powers of two, and degree-0 nodes."""
    lo, deg, key = nodes(np.random.default_rng(fanout), m, fanout)
    expected = np.asarray(reference(fanout, replace)(lo, deg, key))
    got = np.asarray(draw_positions_pallas(lo, deg, key, fanout, replace, tile=tile,
                                           interpret=True))
    assert got.shape == expected.shape == (m, fanout) and got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)
    assert np.all(expected[deg == 0] == -1)
    assert (expected >= 0).any()


def test_pallas_kernel_runs_inside_shard_map_and_equals_the_reference_on_each_device():
    """The sampler calls the kernel inside `shard_map`, one block of nodes per device,
    with the vma check on (the training step needs it) or off. With it on, JAX's own
    Pallas interpreter cannot run, so interpret mode runs the kernel over its grid with
    lax.map: both equal the reference."""
    lo, deg, key = nodes(np.random.default_rng(11), 8 * 40, 3)
    expected = np.asarray(reference(3, False)(lo, deg, key))

    def per_device(check_vma):
        return jax.jit(jax.shard_map(
            lambda a, b, c: draw_positions_pallas(a, b, c, 3, tile=16, interpret=True),
            mesh=make_mesh(8), in_specs=ROWS, out_specs=ROWS, check_vma=check_vma))
    np.testing.assert_array_equal(per_device(False)(lo, deg, key), expected)
    np.testing.assert_array_equal(per_device(True)(lo, deg, key), expected)


def test_draw_positions_dispatches_to_the_named_implementation():
    lo, deg, key = nodes(np.random.default_rng(9), 64, 3)
    expected = np.asarray(reference(3, False)(lo, deg, key))
    for impl in ("xla", "pallas", "auto"):
        got = jax.jit(functools.partial(draw_positions, fanout=3, impl=impl))(lo, deg, key)
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="impl must be"):
        check_impl("triton")


@pytest.mark.parametrize("impl,kernel_on_gpu", [("auto", True), ("pallas", True),
                                                ("xla", False)])
def test_the_platform_a_program_is_lowered_for_chooses_the_kernel(impl, kernel_on_gpu):
    """Not the host's backend: lowering for CUDA on this CPU host gives the GPU program
    (the Triton kernel call), lowering for CPU never holds a kernel call."""
    lo, deg, key = nodes(np.random.default_rng(9), 64, 3)
    # Lowering the Triton kernel asks which GPU it is for: from a CPU host (no GPU to
    # ask) JAX >= 0.11 needs one named, as `jgraph compile`'s target meshes do.
    h100 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
        device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="cuda"))
    with use_abstract_mesh(h100):
        traced = jax.jit(functools.partial(draw_positions, fanout=3, impl=impl)).trace(
            lo, deg, key)
        cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert ("__gpu$xla.gpu.triton" in cuda) == kernel_on_gpu
    assert "__gpu$xla.gpu.triton" not in cpu
    assert "mosaic_gpu" not in cuda        # Triton, never JAX 0.10's Mosaic GPU default


# -- the reference's draws against numpy -------------------------------------------------------


@pytest.mark.parametrize("fanout", [1, 4, 7])
@pytest.mark.parametrize("replace", [False, True], ids=["without", "with"])
def test_reference_draws_lie_in_each_nodes_range_and_follow_the_fanout_rules(fanout, replace):
    lo, deg, key = nodes(np.random.default_rng(fanout + 50), 400, fanout)
    pos = np.asarray(reference(fanout, replace)(lo, deg, key)).astype(np.int64)
    for i in range(lo.size):
        row, d = pos[i], int(deg[i])
        got = row[row >= 0]
        assert np.all(row[:got.size] >= 0), "draws are not packed at the front"
        assert np.all((got >= lo[i]) & (got < lo[i] + d))
        if replace:
            assert got.size == (fanout if d else 0)
        elif d <= fanout:                   # all of them, in order
            np.testing.assert_array_equal(got, lo[i] + np.arange(d))
        else:
            assert got.size == fanout and np.unique(got).size == fanout


def floyd_counts(fanout, deg, replace, num_keys):
    """Counts of each draw (sorted subset, or ordered tuple with replacement) of one node
    of degree `deg` over `num_keys` independent keys."""
    key = random_keys(np.random.default_rng(deg * 100 + fanout + replace), num_keys)
    pos = np.asarray(reference(fanout, replace)(np.zeros(num_keys, np.int32),
                                                np.full(num_keys, deg, np.int32), key))
    assert pos.min() >= 0 and pos.max() < deg
    if replace:
        cells = list(itertools.product(range(deg), repeat=fanout))
        flat = np.ravel_multi_index(tuple(pos.T), (deg,) * fanout)
    else:
        cells = list(itertools.combinations(range(deg), fanout))
        flat = np.array([cells.index(tuple(r)) for r in np.sort(pos, axis=1)])
    return np.bincount(flat, minlength=len(cells)), pos


@pytest.mark.parametrize("fanout,deg", [(2, 5), (3, 7), (1, 9)])
def test_reference_without_replacement_every_subset_is_equally_likely_chi_square(fanout, deg):
    """(Only the subset is uniform: Floyd's column i is drawn from the first
    deg - fanout + i positions, so the order within a draw is not.)"""
    counts, pos = floyd_counts(fanout, deg, False, 12000)
    assert scipy.stats.chisquare(counts).pvalue > ALPHA
    assert scipy.stats.chisquare(np.bincount(pos.reshape(-1), minlength=deg)).pvalue > ALPHA


@pytest.mark.parametrize("fanout,deg", [(2, 4), (3, 3)])
def test_reference_with_replacement_draws_are_independent_uniform_chi_square(fanout, deg):
    counts, _ = floyd_counts(fanout, deg, True, 12000)
    assert scipy.stats.chisquare(counts).pvalue > ALPHA


def test_reference_is_uniform_over_a_large_degree_chi_square():
    """Degree 10^6, fanout 3: positions fall evenly in 20 bins of the range."""
    m, deg = 8000, 10**6
    key = random_keys(np.random.default_rng(77), m)
    pos = np.asarray(reference(3, False)(np.zeros(m, np.int32), np.full(m, deg, np.int32), key))
    assert np.all(pos >= 0) and np.all(pos < deg)
    assert np.all((pos[:, 0] != pos[:, 1]) & (pos[:, 1] != pos[:, 2]) & (pos[:, 0] != pos[:, 2]))
    counts = np.bincount(pos.reshape(-1) * 20 // deg, minlength=20)
    assert scipy.stats.chisquare(counts).pvalue > ALPHA


# -- the arithmetic ------------------------------------------------------------------------------


def numpy_fmix32(h):
    h = np.asarray(h, np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & mask
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & mask
    h ^= h >> np.uint64(16)
    return h


def test_hash_is_murmur3s_finaliser_over_key_plus_golden_times_counter():
    rng = np.random.default_rng(4)
    key = random_keys(rng, 1000)
    counter = rng.integers(0, 2**32 - 1, 1000, dtype=np.uint64)
    np.testing.assert_array_equal(fmix32(jnp.asarray(key)), numpy_fmix32(key))
    mixed = (key.astype(np.uint64) + np.uint64(0x9E3779B9) * (counter + np.uint64(1))) \
        & np.uint64(0xFFFFFFFF)
    np.testing.assert_array_equal(hash32(jnp.asarray(key), jnp.asarray(counter, jnp.uint32)),
                                  numpy_fmix32(mixed))


def test_mulhi32_is_the_high_word_of_the_64_bit_product_and_uniform_below_is_in_range():
    rng = np.random.default_rng(5)
    a, b = random_keys(rng, 5000), random_keys(rng, 5000)
    a[:4], b[:4] = [0, 2**32 - 1, 2**32 - 1, 1], [7, 2**32 - 1, 1, 2**32 - 1]
    expected = (a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)
    np.testing.assert_array_equal(jax.jit(mulhi32)(a, b), expected)
    m = rng.integers(1, 2**31 - 1, 5000).astype(np.int32)
    got = np.asarray(jax.jit(uniform_below)(a, m))
    assert np.all((got >= 0) & (got < m))
    np.testing.assert_array_equal(got, expected_below(a, m))


def expected_below(u, m):
    return ((u.astype(np.uint64) * m.astype(np.uint64)) >> np.uint64(32)).astype(np.int64)
