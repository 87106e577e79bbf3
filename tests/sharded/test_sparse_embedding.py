"""DistEmbedding with SparseAdagrad / SparseAdam on 8 devices against a dense numpy
reference: per step, gradients summed per row (`np.add.at`) and the documented update
applied to the touched rows only; every other row and its optimizer state untouched,
bit for bit. The step is jitted with the state donated."""
import functools

import jax
import numpy as np
import pytest

from jgraph.sharded import (
    REPLICATED,
    ROWS,
    DistEmbedding,
    Exchange,
    ExchangeConfig,
    RowLayout,
    SparseAdagrad,
    SparseAdam,
)

P, n, DIM, STEPS = 8, 24, 4, 4

OPTIMIZERS = {"adagrad": SparseAdagrad(learning_rate=0.1),
              "adam": SparseAdam(learning_rate=0.05)}
COMBOS = [("adagrad", "all_to_all"), ("adam", "all_to_all"),
          pytest.param("adam", "ppermute", marks=pytest.mark.slow)]   # ring: full tier


@functools.cache
def step_fn(emb, exchange, mesh):
    def body(state, ids, valid, grads):
        rows, _ = emb.lookup(exchange, state, ids, valid)
        state, stats = emb.apply_gradients(exchange, state, ids, valid, grads)
        return state, rows, stats
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(emb.specs(), ROWS, ROWS, ROWS),
                                 out_specs=(emb.specs(), ROWS, REPLICATED)), donate_argnums=0)


def reference_update(optimizer, table, slots, touched, g):
    """The docstring formulas, in float64, on rows `touched` with summed gradients g."""
    row = table[touched].astype(np.float64)
    if isinstance(optimizer, SparseAdagrad):
        acc = slots["acc"][touched] + g * g
        row = row - optimizer.learning_rate * g / (np.sqrt(acc) + optimizer.eps)
        return row, {"acc": acc}
    o = optimizer
    step = slots["step"][touched] + 1
    t = step[:, None].astype(np.float64)
    m = o.b1 * slots["m"][touched] + (1 - o.b1) * g
    v = o.b2 * slots["v"][touched] + (1 - o.b2) * g * g
    m_hat, v_hat = m / (1 - o.b1 ** t), v / (1 - o.b2 ** t)
    row = row - o.learning_rate * m_hat / (np.sqrt(v_hat) + o.eps)
    return row, {"m": m, "v": v, "step": step}


def host(state):
    return to_numpy(state.table), {k: to_numpy(v) for k, v in state.slots.items()}


def to_numpy(x: jax.Array) -> np.ndarray:
    """A host copy of x that leaves x donatable. Under JAX >= 0.11 on CPU,
    `np.asarray(x)` keeps zero-copy views of x's buffers inside x, and XLA then never
    donates them: the step's donation check below would fail because of the test's own
    reads."""
    out = np.empty(x.shape, x.dtype)
    for shard in x.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
    return out


@pytest.mark.parametrize("opt,strategy", COMBOS)
def test_sparse_optimizer_steps_equal_dense_numpy_reference(mesh, unequal_book, opt, strategy):
    optimizer = OPTIMIZERS[opt]
    layout = RowLayout.of(unequal_book)
    emb = DistEmbedding(layout, DIM, optimizer, name="emb")
    exchange = Exchange(layout.offsets, ExchangeConfig(strategy=strategy))
    state = emb.init(mesh, jax.random.key(0))
    table0, slots0 = host(state)
    r = layout.rows_per_part
    real = np.zeros(P * r, bool)
    real[layout.padded_of_rows(np.arange(layout.num_rows))] = True
    assert np.all(table0[~real] == 0) and np.all(np.any(table0[real] != 0, axis=1))
    for name, (_, _, init) in optimizer.slots(DIM).items():
        assert np.all(slots0[name] == init)

    rng = np.random.default_rng(1)
    ever = np.zeros(P * r, bool)
    pool = rng.choice(layout.num_rows, 30, replace=False)
    for _ in range(STEPS):
        ids = rng.choice(pool, (P, n))                     # repeats within and across devices
        valid = rng.random((P, n)) < 0.85
        ids[~valid] = rng.integers(-50, 500, (~valid).sum())   # padding: any id at all
        grads = rng.normal(size=(P, n, DIM)).astype(np.float32)
        table, slots = host(state)

        old = state
        state, rows, stats = step_fn(emb, exchange, mesh)(
            state, ids.reshape(-1).astype(np.int32), valid.reshape(-1), grads.reshape(-1, DIM))
        assert old.table.is_deleted()                      # donated: updated in place
        assert int(stats.overflow) == 0

        # lookup: the rows before the update, zeros for padding.
        pos = layout.padded_of_global(ids[valid])
        rows = np.asarray(rows).reshape(P, n, DIM)
        np.testing.assert_array_equal(rows[valid], table[pos])
        assert not np.any(rows[~valid])

        summed = np.zeros((P * r, DIM), np.float64)
        np.add.at(summed, pos, grads[valid])
        touched = np.unique(pos)
        ever[touched] = True
        new_table, new_slots = host(state)
        want_rows, want_slots = reference_update(optimizer, table, slots, touched, summed[touched])
        np.testing.assert_allclose(new_table[touched], want_rows, rtol=1e-5, atol=1e-6)
        for name, want in want_slots.items():
            np.testing.assert_allclose(new_slots[name][touched], want, rtol=1e-5, atol=1e-6)
        rest = np.ones(P * r, bool)
        rest[touched] = False
        np.testing.assert_array_equal(new_table[rest], table[rest])
        for name in slots:
            np.testing.assert_array_equal(new_slots[name][rest], slots[name][rest])

    # Rows never touched (and the padding) still hold their initial values, bit for bit.
    final_table, final_slots = host(state)
    assert 0 < ever.sum() < real.sum()
    np.testing.assert_array_equal(final_table[~ever], table0[~ever])
    for name in slots0:
        np.testing.assert_array_equal(final_slots[name][~ever], slots0[name][~ever])
    np.testing.assert_array_equal(emb.rows(state, np.arange(layout.num_rows)), final_table[real])


def test_init_rejects_a_layout_with_a_different_number_of_partitions(mesh):
    from jgraph.partition import PartitionBook
    book = PartitionBook(np.array([0, 3, 5]), np.array([[0, 3], [3, 5]]), ("_N",))
    with pytest.raises(ValueError, match="2 partitions"):
        DistEmbedding(RowLayout.of(book), 4).init(mesh, jax.random.key(0))
