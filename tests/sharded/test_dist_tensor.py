"""DistTensor behaves like a numpy array of rows on the host, and its in-step scatter
writes like numpy (`np.add.at` / assignment), on a book with unequal partitions."""
import functools

import jax
import numpy as np
import pytest

from jgraph.partition import IdRangeError
from jgraph.sharded import REPLICATED, ROWS, DistTensor, Exchange, RowLayout

P = 8


@pytest.fixture(scope="module")
def values(unequal_book):
    rng = np.random.default_rng(0)
    return rng.normal(size=(unequal_book.num_nodes, 2)).astype(np.float32)


@pytest.fixture(scope="module")
def layout(unequal_book):
    return RowLayout.of(unequal_book)


@pytest.fixture
def x(mesh, layout, values):
    return DistTensor.from_numpy(mesh, layout, values, name="x")


# -- host side -------------------------------------------------------------------------------

KEYS = {
    "int": 5, "negative": -1, "most_negative": -122, "numpy_int": np.int64(121),
    "list_with_repeats": [3, 3, 0, -2], "2d_array": np.array([[1, 2], [121, 0]]),
    "slice": slice(3, 40), "step": slice(None, None, 3), "reverse_step": slice(100, None, -7),
    "empty_slice": slice(50, 50),
}


@pytest.mark.parametrize("key", sorted(KEYS))
def test_getitem_equals_numpy_indexing(x, values, key):
    got = x[KEYS[key]]
    want = values[KEYS[key]]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_boolean_mask_selects_like_numpy(x, values):
    mask = np.random.default_rng(1).random(len(values)) < 0.3
    np.testing.assert_array_equal(x[mask], values[mask])
    with pytest.raises(IndexError):
        x[mask[:-1]]


def test_setitem_equals_numpy_assignment_last_write_wins(x, values):
    ref = values.copy()
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    for key, new in [([5, 9, 5, 121], rows),          # 5 twice: the last write wins
                     (-1, np.array([7, 8])), (slice(None, None, 10), 3.5),
                     (np.arange(len(values)) % 7 == 0, -1.0)]:
        x[key] = new
        ref[key] = new
        np.testing.assert_array_equal(x.to_numpy(), ref)
    assert ref[5, 0] == 4 and ref[5, 1] == 5


def test_numpy_round_trip(x, values, mesh, unequal_book):
    assert x.shape == values.shape and len(x) == len(values) and x.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(x), values)
    np.testing.assert_array_equal(np.asarray(x, dtype=np.float64), values.astype(np.float64))
    ints = np.arange(len(values), dtype=np.int32)
    y = DistTensor.from_numpy(mesh, RowLayout.of(unequal_book), ints)
    np.testing.assert_array_equal(y.to_numpy(), ints)
    assert y[np.int32(17)] == 17


@pytest.mark.parametrize("bad", [122, 10**6, [0, 500]])
def test_row_id_out_of_range_raises_id_range_error_naming_it(x, bad):
    name = str(bad if np.isscalar(bad) else bad[-1])
    with pytest.raises(IdRangeError, match=rf"\b{name}\b"):
        x[bad]
    with pytest.raises(IdRangeError, match=rf"\b{name}\b"):
        x[bad] = 0.0


def test_negative_row_id_out_of_range_error_names_the_id_given(x):
    # numpy: "index -123 is out of bounds"; the id the caller wrote is -123, not -1.
    with pytest.raises(IdRangeError, match=r"-123\b"):
        x[-123]


def test_typed_tensor_addresses_rows_by_type_local_id(hetero_parts8, mesh):
    graph, pg = hetero_parts8
    book = pg.book
    layout = RowLayout.of(book, "user")
    values = np.random.default_rng(2).normal(size=(graph.num_nodes["user"], 3)).astype(np.float32)
    t = DistTensor.from_numpy(mesh, layout, values, name="user_x")
    rows = np.array([0, 29, 7, 7, -1])
    np.testing.assert_array_equal(t[rows], values[rows])
    np.testing.assert_array_equal(t.to_numpy(), values)
    users = book.to_global("user", np.arange(30))
    np.testing.assert_array_equal(layout.padded_of_global(users),
                                  layout.padded_of_rows(np.arange(30)))
    an_item = int(book.to_global("item", [0])[0])
    with pytest.raises(IdRangeError, match=rf"{an_item}\b.*not a node of type 'user'"):
        layout.padded_of_global([int(users[0]), an_item])
    with pytest.raises(IdRangeError, match=r"\b30\b"):
        t[30]


# -- in the step: scatter ---------------------------------------------------------------------

n = 16      # ids per device


@functools.cache
def scatter_fn(layout, mesh, add):
    t = DistTensor(None, layout, "x", mesh)
    exchange = Exchange(layout.offsets)

    def body(shard, ids, valid, rows):
        return t.scatter(exchange, shard, ids, valid, rows, add=add)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(ROWS,) * 4,
                                 out_specs=(ROWS, REPLICATED)))


def scatter(x, ids, valid, rows, add):
    fn = scatter_fn(x.layout, x.mesh, add)
    new, stats = fn(x.array, ids.reshape(-1).astype(np.int32), valid.reshape(-1),
                    rows.reshape(P * n, 2).astype(np.float32))
    return DistTensor(new, x.layout, x.name, x.mesh).to_numpy(), stats


def test_scatter_add_equals_numpy_add_at(x, values):
    rng = np.random.default_rng(3)
    pool = rng.choice(len(values), 30, replace=False)
    ids = rng.choice(pool, (P, n))                    # repeats on a device and across devices
    valid = rng.random((P, n)) < 0.8
    rows = rng.integers(-5, 6, (P, n, 2)).astype(np.float32)      # exact sums
    got, stats = scatter(x, ids, valid, rows, add=True)
    want = values.astype(np.float64)
    np.add.at(want, ids[valid], rows[valid])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert int(stats.overflow) == 0


def test_scatter_set_writes_each_id_once_like_assignment(x, values):
    rng = np.random.default_rng(4)
    ids = rng.permutation(len(values))[:P * n - 10]
    ids = np.concatenate([ids, np.zeros(10, np.int64)]).reshape(P, n)
    valid = np.ones((P, n), bool)
    valid.reshape(-1)[-10:] = False                   # padding, pointing at row 0
    rows = rng.normal(size=(P, n, 2)).astype(np.float32)
    got, _ = scatter(x, ids, valid, rows, add=False)
    want = values.copy()
    want[ids[valid]] = rows[valid]
    np.testing.assert_array_equal(got, want)


def test_scatter_set_of_an_id_written_twice_with_one_value_is_that_value(x, values):
    rng = np.random.default_rng(5)
    ids, valid = np.zeros((P, n), np.int64), np.ones((P, n), bool)
    rows = rng.normal(size=(P, n, 2)).astype(np.float32)
    # Row 40 twice on device 0, row 41 on devices 2 and 6, with the same value each time.
    ids[0, :2] = 40
    ids[2, 0] = ids[6, 0] = 41
    rows[0, 1], rows[6, 0] = rows[0, 0], rows[2, 0]
    valid[7, -4:] = False                                  # padding, pointing at row 0
    free = np.ones((P, n), bool)
    free[0, :2] = free[2, 0] = free[6, 0] = False
    free &= valid
    ids[free] = rng.permutation(np.setdiff1d(np.arange(len(values)), [40, 41]))[:free.sum()]
    got, _ = scatter(x, ids, valid, rows, add=False)
    want = values.copy()
    want[ids[valid]] = rows[valid]
    assert np.array_equal(want[40], rows[0, 0]) and np.array_equal(want[41], rows[2, 0])
    np.testing.assert_array_equal(got, want)


def test_scatter_set_of_an_id_written_with_different_values_is_their_mean(x, values):
    ids = np.tile(np.arange(n), (P, 1))                      # every device writes rows 0..n-1
    rows = np.broadcast_to(np.arange(P, dtype=np.float32)[:, None, None], (P, n, 2)).copy()
    got, _ = scatter(x, ids, np.ones((P, n), bool), rows, add=False)
    want = values.copy()
    want[:n] = np.mean(np.arange(P))                         # 3.5, exact
    np.testing.assert_array_equal(got, want)


def test_scatter_to_an_id_outside_the_tensor_is_counted_not_silently_dropped(x, values):
    ids = np.tile(np.arange(n), (P, 1))
    ids[3, 5] = len(values) + 4                            # not a row of x
    ids[5, 0] = -3
    got, stats = scatter(x, ids, np.ones((P, n), bool), np.ones((P, n, 2), np.float32), add=True)
    want = values.astype(np.float64)
    np.add.at(want, ids[(ids >= 0) & (ids < len(values))], 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert int(stats.out_of_range) == 2
    with pytest.raises(IndexError):
        stats.check("scatter")
