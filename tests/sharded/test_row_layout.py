"""RowLayout on a hand-made two-type book with empty partitions (for one type, for the
other, for both) and a type with no nodes at all: row ids, global ids and padded
positions all agree with a brute-force numpy enumeration."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jgraph.exchange import owned_index
from jgraph.exchange.segments import owner_of
from jgraph.partition import IdRangeError, PartitionBook
from jgraph.sharded import AXIS, ROWS, DistTensor, RowLayout, make_mesh

COUNTS = np.array([   # nodes of types a, b, c in each of the 8 partitions
    [0, 3, 0],        # no a (the first partition)
    [2, 0, 0],        # no b
    [0, 0, 0],        # empty
    [4, 1, 0],
    [1, 0, 0],
    [0, 2, 0],
    [3, 3, 0],
    [1, 0, 0],        # no b (the last partition)
])
TYPES = ("a", "b", "c")                 # c has no nodes anywhere


def make_book():
    offsets = np.concatenate([[0], np.cumsum(COUNTS.sum(axis=1))])
    ntype_offsets = offsets[:-1, None] + np.concatenate(
        [np.zeros((8, 1), np.int64), np.cumsum(COUNTS, axis=1)], axis=1)
    return PartitionBook(offsets, ntype_offsets, TYPES)


BOOK = make_book()
N = BOOK.num_nodes


def brute_force(ntype):
    """(global id of each row in row order, padded position of each row, rows_per_part),
    by walking the partitions."""
    t = None if ntype is None else TYPES.index(ntype)
    per_part = []
    for p in range(8):
        lo, hi = ((BOOK.offsets[p], BOOK.offsets[p + 1]) if t is None
                  else (BOOK.ntype_offsets[p, t], BOOK.ntype_offsets[p, t + 1]))
        per_part.append(np.arange(lo, hi))
    rpp = max(max(len(g) for g in per_part), 1)
    globals_ = np.concatenate(per_part).astype(np.int64)
    padded = np.concatenate([p * rpp + np.arange(len(g)) for p, g in enumerate(per_part)])
    return globals_, padded.astype(np.int64), rpp


@pytest.mark.parametrize("ntype", [None, "a", "b", "c"])
def test_row_ids_global_ids_and_padded_positions_round_trip(ntype):
    layout = RowLayout.of(BOOK, ntype)
    globals_, padded, rpp = brute_force(ntype)
    rows = np.arange(globals_.size)
    assert layout.num_rows == globals_.size and layout.rows_per_part == rpp
    np.testing.assert_array_equal(layout.global_ids(), globals_)
    np.testing.assert_array_equal(layout.padded_of_rows(rows), padded)
    np.testing.assert_array_equal(layout.padded_of_global(globals_), padded)
    # Shuffled and repeated ids map element-wise.
    order = np.random.default_rng(0).integers(0, max(rows.size, 1), 20) if rows.size else rows
    np.testing.assert_array_equal(layout.padded_of_rows(order), padded[order])
    np.testing.assert_array_equal(layout.padded_of_global(globals_[order]), padded[order])
    if ntype is not None:           # row ids are the book's type-local ids
        np.testing.assert_array_equal(BOOK.to_global(ntype, rows), globals_)
        if rows.size:
            t, local = BOOK.to_type_local(globals_)
            assert np.all(t == TYPES.index(ntype))
            np.testing.assert_array_equal(local, rows)


@pytest.mark.parametrize("ntype", [None, "a", "b"])
def test_ids_outside_the_layout_raise_id_range_error_naming_them(ntype):
    layout = RowLayout.of(BOOK, ntype)
    with pytest.raises(IdRangeError, match=rf"\b{layout.num_rows}\b"):
        layout.padded_of_rows([0, layout.num_rows])
    with pytest.raises(IdRangeError, match="-1"):
        layout.padded_of_rows([-1])
    with pytest.raises(IdRangeError, match=rf"\b{N}\b"):
        layout.padded_of_global([N])
    if ntype is not None:
        other = np.setdiff1d(np.arange(N), brute_force(ntype)[0])
        for g in other:
            with pytest.raises(IdRangeError, match=rf"\b{g}\b.*not a node of type '{ntype}'"):
                layout.padded_of_global([g])


@pytest.mark.parametrize("ntype", [None, "a", "b", "c"])
def test_device_contains_and_owned_rows_agree_with_the_host(ntype):
    """`contains` on the device, and each device's row of its own ids (`owned_index`
    from the layout's starts, on 8 devices), as the host's padded positions."""
    layout = RowLayout.of(BOOK, ntype)
    globals_, padded, rpp = brute_force(ntype)
    ids = np.arange(-3, N + 3)
    np.testing.assert_array_equal(np.asarray(layout.contains(jnp.asarray(ids, jnp.int32))),
                                  np.isin(ids, globals_))
    owner = padded // rpp
    # Every device is asked every row's id; it answers those it owns.
    asked = np.tile(globals_.astype(np.int32), 8)
    rows = jax.jit(jax.shard_map(
        lambda q: owned_index(q, owner_of(layout.offsets, q) == lax.axis_index(AXIS),
                              layout.starts, AXIS, fill=-1),
        mesh=make_mesh(8), in_specs=ROWS, out_specs=ROWS))(asked)
    want = np.where(owner[None, :] == np.arange(8)[:, None], padded % rpp, -1)
    np.testing.assert_array_equal(np.asarray(rows).reshape(8, -1), want)


def test_unknown_node_type_is_a_key_error_naming_the_types():
    with pytest.raises(KeyError, match="'a', 'b', 'c'"):
        RowLayout.of(BOOK, "d")


@pytest.mark.parametrize("ntype", ["a", "b"])
def test_typed_tensor_with_empty_partitions_round_trips(mesh, ntype):
    layout = RowLayout.of(BOOK, ntype)
    values = np.arange(layout.num_rows * 2, dtype=np.float32).reshape(-1, 2) + 1
    x = DistTensor.from_numpy(mesh, layout, values)
    np.testing.assert_array_equal(x.to_numpy(), values)
    _, padded, _ = brute_force(ntype)
    whole = np.asarray(x.array)
    np.testing.assert_array_equal(whole[padded], values)
    rest = np.ones(whole.shape[0], bool)
    rest[padded] = False
    assert not np.any(whole[rest])                    # padding, including empty partitions
    x[[0, layout.num_rows - 1]] = [[-1, -2], [-3, -4]]
    values[[0, -1]] = [[-1, -2], [-3, -4]]
    np.testing.assert_array_equal(x.to_numpy(), values)
