"""Sparse feature rows: a matrix [n, width] with few non-zeros per row, stored as padded
index/value rows (the ELL layout), so that rows can be gathered, sharded and sent by id
like any dense row.

Bag-of-words features are the common case: facebook_musae has 4,714 columns and at
most 31 non-zeros per node, so a row is 31 indices and 31 values (248 bytes) instead of
4,714 floats (18,856 bytes). A `SparseRows` is a JAX pytree: the same object holds
numpy arrays on the host (a `Graph`'s node data, a partition's memory-mapped files)
and jax arrays inside the step, where the exchange moves its two leaves row by row and
the first layer multiplies it by a kernel without densifying (`rows @ kernel`, an
embedding bag: each row's sum of `value * kernel[index]`).

Importing this module does not import JAX (the command line starts without it): the
pytree registration happens on import if JAX is loaded already, else as soon as JAX is
imported (`_AfterJaxImport`), so `jax.jit` always sees a `SparseRows` as a pytree.
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.util
import sys
from typing import Any

import numpy as np

import jgraph.segments as segments


@dataclasses.dataclass(frozen=True)
class SparseRows:
    """Fields:
      indices: int32[n, K] — the column of each stored entry; 0 in padding slots.
      values: [n, K] — the entry's value; 0 in padding slots, so padding adds nothing.
      width: int — the dense row width (static under jit).

    K is the most non-zeros of any row. Array-like where it matters: `shape` is the
    dense shape `(n, width)`, `dtype` the values' dtype, `rows[key]` selects rows
    (numpy or jax indexing, along the first axis), `astype` casts the values.
    """

    indices: Any
    values: Any
    width: int

    # -- construction (host) -----------------------------------------------------------

    @classmethod
    def from_csr(cls, indptr, indices, data, shape, what: str = "sparse rows"
                 ) -> SparseRows:
        """From CSR arrays (as scipy's `csr_matrix((data, indices, indptr), shape)`);
        duplicate entries of a row add up, as scipy's `toarray` does. Raises ValueError
        naming `what` and the field for inconsistent arrays."""
        indptr, indices, data = (np.asarray(a) for a in (indptr, indices, data))
        n, width = (int(s) for s in shape)
        if indptr.shape != (n + 1,):
            raise ValueError(f"{what}: indptr has shape {list(indptr.shape)}, expected "
                             f"[{n + 1}] for {n} rows")
        counts = np.diff(indptr)
        if indptr[0] != 0 or (counts < 0).any() or indptr[-1] != indices.size:
            raise ValueError(f"{what}: indptr must rise from 0 to len(indices)="
                             f"{indices.size}, runs from {indptr[0]} to {indptr[-1]}"
                             + (" and falls" if (counts < 0).any() else ""))
        if data.shape != indices.shape or indices.ndim != 1:
            raise ValueError(f"{what}: indices and data must be 1-D of one length, got "
                             f"{list(indices.shape)} and {list(data.shape)}")
        if indices.size and (indices.min() < 0 or indices.max() >= width):
            bad = int(np.flatnonzero((indices < 0) | (indices >= width))[0])
            raise ValueError(f"{what}: column {int(indices[bad])} at position {bad} is out "
                             f"of range [0, {width})")
        k = max(int(counts.max(initial=0)), 1)
        row = segments.segment_ids(counts)
        slot = segments.segment_positions(counts)
        out_idx = np.zeros((n, k), np.int32)
        out_val = np.zeros((n, k), data.dtype)
        out_idx[row, slot] = indices
        out_val[row, slot] = data
        return cls(out_idx, out_val, width)

    @classmethod
    def from_dense(cls, x) -> SparseRows:
        """The non-zeros of a dense matrix [n, width]."""
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"sparse rows come from a matrix, got shape {list(x.shape)}")
        row, col = np.nonzero(x)
        indptr = segments.offsets(np.bincount(row, minlength=x.shape[0]))
        return cls.from_csr(indptr, col, x[row, col], x.shape)

    def pays(self) -> bool:
        """Whether the padded rows are smaller than dense ones (False when one row has
        so many non-zeros that padding every row to it costs more than the zeros)."""
        item = np.dtype(self.dtype).itemsize
        return self.nnz_per_row * (4 + item) < self.width * item

    # -- array-like --------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        return (self.indices.shape[0], self.width)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nnz_per_row(self) -> int:
        """K: the stored entries per row, padding included."""
        return int(self.indices.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.indices.nbytes) + int(self.values.nbytes)

    def __len__(self) -> int:
        return self.indices.shape[0]

    def __getitem__(self, key) -> SparseRows:
        if isinstance(key, tuple):
            raise IndexError("sparse rows are indexed by row only")
        return SparseRows(self.indices[key], self.values[key], self.width)

    def astype(self, dtype) -> SparseRows:
        return SparseRows(self.indices, self.values.astype(dtype), self.width)

    def with_values(self, values) -> SparseRows:
        return SparseRows(self.indices, values, self.width)

    def __repr__(self) -> str:
        return (f"SparseRows(shape={self.shape}, dtype={self.dtype}, "
                f"nnz_per_row={self.nnz_per_row})")

    # -- dense views -------------------------------------------------------------------

    def toarray(self) -> np.ndarray:
        """The dense numpy matrix [n, width]."""
        idx, val = np.asarray(self.indices), np.asarray(self.values)
        out = np.zeros((idx.shape[0], self.width), val.dtype)
        rows = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)
        np.add.at(out, (rows, idx), val)
        return out

    def to_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices, data) of the stored non-zeros, row by row."""
        idx, val = np.asarray(self.indices), np.asarray(self.values)
        keep = val != 0
        indptr = segments.offsets(keep.sum(1))
        return indptr, idx[keep].astype(np.int64), val[keep]

    def todense(self):
        """The dense jax matrix [n, width] (inside a jitted function)."""
        import jax.numpy as jnp

        n = self.indices.shape[0]
        rows = jnp.broadcast_to(jnp.arange(n)[:, None], self.indices.shape)
        out = jnp.zeros((n, self.width), self.values.dtype)
        return out.at[rows, self.indices].add(self.values)

    # -- the embedding bag -------------------------------------------------------------

    def __matmul__(self, kernel):
        """rows @ kernel [width, out] -> [n, out], as the dense product: each row's sum
        of value * kernel[index], one slot column at a time (a [n, out] gather per
        column, never the [n, K, out] one)."""
        if kernel.shape[0] != self.width:
            raise ValueError(f"sparse rows of width {self.width} @ kernel of shape "
                             f"{list(kernel.shape)}")
        import jax.numpy as jnp
        from jax import lax

        from jgraph.mesh import vary_like

        dtype = jnp.result_type(self.values.dtype, kernel.dtype)
        values = self.values.astype(dtype)
        # A replicated kernel gathered by per-device indices is made varying once,
        # before the loop over slot columns: its gradient is then summed over devices
        # once, after the loop, instead of by one all-reduce per column inside it (which
        # also trips XLA:CPU's collectives when devices run loop iterations apart).
        kernel = vary_like(kernel, values)

        def column(k):
            idx = lax.dynamic_index_in_dim(self.indices, k, axis=1, keepdims=False)
            val = lax.dynamic_index_in_dim(values, k, axis=1, keepdims=True)
            return val * jnp.take(kernel, idx, axis=0).astype(dtype)

        # Started from column 0, so that the loop carry has the inputs' type (under
        # shard_map, their varying axes).
        return lax.fori_loop(1, self.nnz_per_row, lambda k, acc: acc + column(k), column(0))


_registered = False


def register_pytree() -> None:
    """Make `SparseRows` a JAX pytree (its arrays the leaves, `width` static); once."""
    global _registered
    if not _registered:
        import jax

        jax.tree_util.register_dataclass(SparseRows, data_fields=["indices", "values"],
                                         meta_fields=["width"])
        _registered = True


class _AfterJaxImport(importlib.abc.MetaPathFinder):
    """Registers the pytree right after `import jax` finishes, for a program that
    imports jgraph's data before JAX."""

    finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "jax" or self.finding:
            return None
        self.finding = True                 # the find below asks the other finders
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register_pytree()
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec.loader.exec_module = exec_module
        return spec


if "jax" in sys.modules:
    register_pytree()
else:
    sys.meta_path.insert(0, _AfterJaxImport())


def dense(x):
    """x itself, or the dense matrix of sparse rows (inside a jitted function)."""
    return x.todense() if isinstance(x, SparseRows) else x
