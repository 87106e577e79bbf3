"""Sparse feature rows (`SparseRows`): built from CSR like scipy's matrix, multiplied by
a kernel as the dense product (values and gradients), kept sparse by the npz layouts,
normalised like dense rows, and refused with the field named when inconsistent; under
shard_map a replicated kernel's gradient is summed once."""
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jgraph.data import Graph, GraphError, SparseRows, load_npz, normalize_features, save_npz


@pytest.fixture(scope="module")
def mesh8():
    return Mesh(np.array(jax.devices()[:8]), ("parts",))


def random_csr(n=40, width=30, density=0.1, seed=0):
    m = scipy.sparse.random(n, width, density=density, format="csr", dtype=np.float32,
                            random_state=seed)
    m.data = np.round(m.data * 8) / 8 + 0.125           # no stored zeros
    return m


def test_from_csr_equals_scipys_dense_matrix_and_pads_to_the_fullest_row():
    m = random_csr()
    rows = SparseRows.from_csr(m.indptr, m.indices, m.data, m.shape)
    assert rows.shape == m.shape and rows.dtype == np.float32
    assert rows.nnz_per_row == int(np.diff(m.indptr).max())
    np.testing.assert_array_equal(rows.toarray(), m.toarray())
    np.testing.assert_array_equal(np.asarray(jax.jit(SparseRows.todense)(rows)), m.toarray())
    np.testing.assert_array_equal(rows[5:9].toarray(), m.toarray()[5:9])
    np.testing.assert_array_equal(rows[np.array([3, 0, 3])].toarray(), m.toarray()[[3, 0, 3]])
    indptr, indices, data = rows.to_csr()
    again = scipy.sparse.csr_matrix((data, indices, indptr), shape=m.shape)
    np.testing.assert_array_equal(again.toarray(), m.toarray())


def test_duplicate_entries_of_a_row_add_up_as_in_scipy():
    indptr, indices, data = [0, 3, 3], [1, 1, 2], np.array([1.0, 2.0, 4.0], np.float32)
    rows = SparseRows.from_csr(indptr, indices, data, (2, 4))
    want = scipy.sparse.csr_matrix((data, indices, indptr), shape=(2, 4)).toarray()
    np.testing.assert_array_equal(rows.toarray(), want)
    assert rows.toarray()[1].sum() == 0


def test_rows_times_a_kernel_equal_the_dense_product_in_value_and_gradient():
    m = random_csr(n=64, width=50, density=0.2, seed=1)
    rows = SparseRows.from_csr(m.indptr, m.indices, m.data, m.shape)
    kernel = jnp.asarray(np.random.default_rng(2).standard_normal((50, 8)), jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda r, k: r @ k)(rows, kernel)),
                               m.toarray() @ np.asarray(kernel), rtol=1e-5, atol=1e-5)
    weights = jnp.asarray(np.random.default_rng(3).standard_normal((64, 8)), jnp.float32)
    sparse_grad = jax.grad(lambda k: jnp.sum((rows @ k) * weights))(kernel)
    dense_grad = jax.grad(lambda k: jnp.sum((jnp.asarray(m.toarray()) @ k) * weights))(kernel)
    np.testing.assert_allclose(np.asarray(sparse_grad), np.asarray(dense_grad),
                               rtol=1e-5, atol=1e-5)


def test_bfloat16_values_multiply_in_bfloat16():
    m = random_csr(seed=4)
    rows = SparseRows.from_csr(m.indptr, m.indices, m.data, m.shape).astype(jnp.bfloat16)
    out = rows @ jnp.ones((30, 4), jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), m.toarray() @ np.ones((30, 4)),
                               rtol=1e-2)


def test_inconsistent_csr_arrays_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"feat: column 9 at position 1 is out of range \[0, 5\)"):
        SparseRows.from_csr([0, 2], [1, 9], [1.0, 1.0], (1, 5), what="feat")
    with pytest.raises(ValueError, match=r"indptr has shape \[2\], expected \[3\]"):
        SparseRows.from_csr([0, 1], [0], [1.0], (2, 5))
    with pytest.raises(ValueError, match=r"indptr must rise from 0 to len\(indices\)=2"):
        SparseRows.from_csr([0, 1], [0, 1], [1.0, 1.0], (1, 5))


def test_graph_refuses_sparse_rows_with_a_column_outside_the_width_or_nan():
    bad = SparseRows(np.array([[0, 7], [1, 0]], np.int32), np.ones((2, 2), np.float32), 5)
    with pytest.raises(GraphError, match=r"'feat'.*column 7 of node 0 is out of range \[0, 5\)"):
        Graph.homogeneous([0], [1], 2, node_data={"feat": bad})
    nan = SparseRows(np.zeros((2, 1), np.int32), np.array([[1.0], [np.nan]], np.float32), 5)
    with pytest.raises(GraphError, match=r"'feat'.*holds nan at node 1"):
        Graph.homogeneous([0], [1], 2, node_data={"feat": nan})
    short = SparseRows(np.zeros((3, 1), np.int32), np.ones((3, 1), np.float32), 5)
    with pytest.raises(GraphError, match=r"must both be \[2, K\]"):
        Graph.homogeneous([0], [1], 2, node_data={"feat": short})


def test_npz_keeps_csr_features_sparse_unless_padding_costs_more_than_dense(tmp_path):
    m = random_csr(n=40, width=200, density=0.05, seed=5)
    g = Graph.homogeneous([0, 1], [1, 2], 40, name="sp",
                          node_data={"feat": SparseRows.from_csr(m.indptr, m.indices, m.data,
                                                                 m.shape)})
    save_npz(g, tmp_path / "sp.npz")
    with np.load(tmp_path / "sp.npz") as z:
        assert "feat" not in z.files and "feat_indptr" in z.files
    back = load_npz(tmp_path / "sp.npz").node_data["_N"]["feat"]
    assert isinstance(back, SparseRows)
    np.testing.assert_array_equal(back.toarray(), m.toarray())
    # One full row: padding all 40 rows to 200 entries is larger than the dense matrix.
    full = m.toarray()
    full[3] = 1.0
    g = g.replace(node_data={"_N": {"feat": SparseRows.from_dense(full)}})
    save_npz(g, tmp_path / "full.npz")
    back = load_npz(tmp_path / "full.npz").node_data["_N"]["feat"]
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, full)


def test_normalize_features_scales_sparse_rows_like_dense_ones():
    d = random_csr(seed=6).toarray()
    d[7] = 0                                              # an empty row stays zero
    m = scipy.sparse.csr_matrix(d)
    dense = Graph.homogeneous([0], [1], 40, node_data={"feat": m.toarray()})
    sparse = Graph.homogeneous([0], [1], 40, node_data={
        "feat": SparseRows.from_csr(m.indptr, m.indices, m.data, m.shape)})
    want = normalize_features(dense).node_data["_N"]["feat"]
    got = normalize_features(sparse).node_data["_N"]["feat"]
    assert isinstance(got, SparseRows)
    np.testing.assert_allclose(got.toarray(), want, rtol=1e-6)
    assert not got.toarray()[7].any()


def _while_bodies(hlo: str) -> dict[str, str]:
    """{name: text} of the computations compiled HLO runs as while-loop bodies."""
    names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    blocks = re.split(r"\n(?=\S)", hlo)
    return {name: block for block in blocks for name in names
            if re.match(rf"%?{re.escape(name)}\b", block)}


def test_under_shard_map_a_replicated_kernels_gradient_is_summed_once_not_per_column(mesh8):
    """The kernel is replicated and the rows differ per device, so the kernel's
    gradient is summed over devices: once, after the loop over slot columns, never by
    an all-reduce inside the loop."""
    m = random_csr(n=8 * 16, width=50, density=0.2, seed=7)
    rows = SparseRows.from_csr(m.indptr, m.indices, m.data, m.shape)
    kernel = jnp.asarray(np.random.default_rng(8).standard_normal((50, 4)), jnp.float32)

    def per_device(kernel, rows):
        return jax.grad(lambda k: jnp.sum((rows @ k) ** 2))(kernel)

    fn = jax.jit(jax.shard_map(per_device, mesh=mesh8, in_specs=(P(), P("parts")),
                               out_specs=P()))
    hlo = fn.lower(kernel, rows).compile().as_text()
    bodies = _while_bodies(hlo)
    assert bodies and not any("all-reduce" in text for text in bodies.values())
    assert "all-reduce" in hlo
    dense = jnp.asarray(m.toarray())
    want = jax.grad(lambda k: jnp.sum((dense @ k) ** 2))(kernel)
    np.testing.assert_allclose(np.asarray(fn(kernel, rows)), np.asarray(want), rtol=1e-4)


def test_sparse_rows_are_a_pytree_when_jax_comes_after_them_even_if_looked_up_first():
    """In a fresh process: jgraph's data imported first, JAX's spec looked up (as tools
    do) before `import jax`; jit still sees the rows as a pytree of two leaves."""
    import subprocess
    import sys
    code = ("import importlib.util, numpy as np\n"
            "from jgraph.data import SparseRows\n"
            "assert importlib.util.find_spec('jax') is not None\n"
            "import jax\n"
            "r = SparseRows(np.zeros((3, 2), np.int32), np.ones((3, 2), np.float32), 5)\n"
            "print(len(jax.tree_util.tree_leaves(r)), jax.jit(SparseRows.todense)(r).shape)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "2 (3, 5)"
