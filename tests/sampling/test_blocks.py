"""build_block against a numpy reference: src is the real dst nodes, then every other
sampled neighbour once, then -1; nbr indexes src, so that src[nbr] are the sampled ids;
mask == (nbr >= 0); etype masked to -1. The order of the new src entries is not part
of the contract, so blocks are compared as equivalent: the same dst, the same src set
with the same dst prefix, and the same ids behind every neighbour slot. The sort-based
deduplication (forced by DENSE_DEDUP_MAX_NODES = 0) gives a block equivalent to the
dense table's.

The invariants of the blocks the sampler itself builds are checked in test_sampler.py
(`check_sample` in conftest.py).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jgraph.sampling.blocks as blocks_module
from jgraph.sampling import Block, build_block
from jgraph.sampling.blocks import compact_front, first_occurrence, src_capacity

NUM_NODES = 50
N_DST, WIDTH = 16, 5


def reference_block(dst, nbr_ids, etype, num_src):
    """The documented layout, built entry by entry."""
    real = dst[dst >= 0]
    src = list(real)
    where = {v: i for i, v in enumerate(real)}
    nbr = np.full(nbr_ids.shape, -1, np.int64)
    for i, j in np.ndindex(*nbr_ids.shape):
        v = nbr_ids[i, j]
        if v < 0:
            continue
        if v not in where:
            where[v] = len(src)
            src.append(v)
        nbr[i, j] = where[v]
    assert len(src) <= num_src
    src = np.array(src + [-1] * (num_src - len(src)), np.int64)
    mask = nbr >= 0
    return src, nbr, mask, None if etype is None else np.where(mask, etype, -1)


def make_case(rng, real_dst, p_none=0.3, pool=40):
    """dst: `real_dst` distinct ids then -1; nbr_ids from a pool that overlaps dst,
    with repeats, -1 with probability p_none, and -1 on every padding row."""
    dst = np.full(N_DST, -1, np.int64)
    dst[:real_dst] = rng.choice(NUM_NODES, real_dst, replace=False)
    ids = rng.choice(NUM_NODES, pool, replace=False)
    nbr_ids = rng.choice(ids, (N_DST, WIDTH))
    nbr_ids[rng.random((N_DST, WIDTH)) < p_none] = -1
    nbr_ids[real_dst:] = -1
    etype = rng.integers(0, 4, (N_DST, WIDTH))
    return dst, nbr_ids, etype


CASES = {
    "mixed": lambda rng: make_case(rng, 11),
    "all_real": lambda rng: make_case(rng, N_DST),
    "no_neighbours": lambda rng: make_case(rng, 9, p_none=1.0),
    "only_dst_as_neighbours": lambda rng: only_dst_as_neighbours(rng),
    "all_padding": lambda rng: make_case(rng, 0),
    "every_slot_new": lambda rng: make_case(rng, 3, p_none=0.0, pool=NUM_NODES),
    "fills_src": lambda rng: fills_src(rng),
}


def only_dst_as_neighbours(rng):
    """Every sampled neighbour is one of the 7 real dst nodes: src gains nothing."""
    dst, nbr_ids, etype = make_case(rng, 7)
    return dst, np.where(nbr_ids >= 0, dst[rng.integers(0, 7, nbr_ids.shape)], -1), etype


def fills_src(rng):
    """Every node of the graph is a dst or a neighbour: src has no room to spare."""
    dst = rng.choice(NUM_NODES, N_DST, replace=False)
    nbr_ids = np.concatenate([rng.permutation(NUM_NODES),
                              rng.choice(NUM_NODES, N_DST * WIDTH - NUM_NODES)])
    return dst, nbr_ids.reshape(N_DST, WIDTH), rng.integers(0, 4, (N_DST, WIDTH))
NUM_SRC = src_capacity(N_DST, WIDTH, NUM_NODES)


def jitted_build_block():
    """A fresh jit (so a monkeypatched DENSE_DEDUP_MAX_NODES is traced anew)."""
    return jax.jit(lambda d, n, e: build_block(d, n, e, NUM_SRC, NUM_NODES))


@pytest.fixture(scope="module")
def dense_build():
    return jitted_build_block()


@pytest.fixture(scope="module")
def sort_build():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks_module, "DENSE_DEDUP_MAX_NODES", 0)
        fn = jitted_build_block()
        # Trace now, under the patch; later calls reuse this trace.
        fn(*(jnp.asarray(x, jnp.int32) for x in make_case(np.random.default_rng(0), 4)))
    return fn


def run(build, case):
    dst, nbr_ids, etype = case
    return build(jnp.asarray(dst, jnp.int32), jnp.asarray(nbr_ids, jnp.int32),
                 jnp.asarray(etype, jnp.int32))


def assert_equivalent(block, dst, nbr_ids, src, etype):
    """`block` holds dst, the ids `nbr_ids` behind its slots, and the ids of `src` in
    the documented layout (the new entries in any order)."""
    got_src, nbr, mask = np.asarray(block.src), np.asarray(block.nbr), np.asarray(block.mask)
    np.testing.assert_array_equal(block.dst, dst)
    real_dst = int(np.sum(dst >= 0))
    np.testing.assert_array_equal(got_src[:real_dst], dst[:real_dst])
    real = int(np.sum(src >= 0))
    assert np.all(got_src[:real] >= 0) and np.all(got_src[real:] == -1)
    np.testing.assert_array_equal(np.sort(got_src[:real]), np.sort(src[:real]))
    np.testing.assert_array_equal(mask, nbr_ids >= 0)
    np.testing.assert_array_equal(mask, nbr >= 0)
    np.testing.assert_array_equal(got_src[nbr[mask]], nbr_ids[mask])
    if etype is None:
        assert block.etype is None
    else:
        np.testing.assert_array_equal(block.etype, etype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_build_block_matches_the_numpy_reference_layout(dense_build, name):
    case = CASES[name](np.random.default_rng(sorted(CASES).index(name)))
    block = run(dense_build, case)
    src, _, _, etype = reference_block(*case, NUM_SRC)
    assert_equivalent(block, case[0], case[1], src, etype)
    if name == "fills_src":
        assert np.all(np.asarray(block.src) >= 0)
    assert block.src.shape == (NUM_SRC,) and block.nbr.shape == (N_DST, WIDTH)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sort_deduplication_gives_a_block_equivalent_to_the_dense_tables(
        dense_build, sort_build, name):
    case = CASES[name](np.random.default_rng(100 + sorted(CASES).index(name)))
    dense, by_sort = run(dense_build, case), run(sort_build, case)
    src, _, _, etype = reference_block(*case, NUM_SRC)
    assert_equivalent(by_sort, case[0], case[1], src, etype)
    assert_equivalent(dense, case[0], case[1], np.asarray(by_sort.src), etype)


def test_build_block_without_relations_has_no_etype():
    dst, nbr_ids, _ = make_case(np.random.default_rng(7), 10)
    block = jax.jit(lambda d, n: build_block(d, n, None, NUM_SRC, NUM_NODES))(
        jnp.asarray(dst, jnp.int32), jnp.asarray(nbr_ids, jnp.int32))
    assert isinstance(block, Block) and block.etype is None
    assert (block.num_dst, block.num_src) == (N_DST, NUM_SRC)
    src = reference_block(dst, nbr_ids, None, NUM_SRC)[0]
    assert_equivalent(block, dst, nbr_ids, src, None)
    np.testing.assert_array_equal(block.dst_mask, dst >= 0)
    np.testing.assert_array_equal(block.src_mask, src >= 0)


def test_first_occurrence_is_the_position_of_each_ids_first_entry():
    ids = np.random.default_rng(3).integers(-3, 12, 60)     # repeats, and -ve padding
    got = np.asarray(jax.jit(first_occurrence)(jnp.asarray(ids, jnp.int32)))
    expected = [i if v < 0 else int(np.flatnonzero(ids == v)[0]) for i, v in enumerate(ids)]
    np.testing.assert_array_equal(got, expected)


def test_compact_front_moves_valid_ids_first_in_order():
    ids = np.array([-1, 4, -1, -1, 9, 2, -1, 7], np.int32)
    np.testing.assert_array_equal(jax.jit(compact_front)(jnp.asarray(ids)),
                                  [4, 9, 2, 7, -1, -1, -1, -1])


def test_src_capacity_holds_every_distinct_id_but_no_more_than_the_graph():
    assert src_capacity(16, 5, 1000) == 16 * 6
    assert src_capacity(16, 5, 50) == 50
    assert src_capacity(16, 5, 10) == 16          # never less than dst
