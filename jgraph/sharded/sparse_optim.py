"""Sparse optimizers for embedding tables: they update only the rows a step touched.

Each optimizer is a pure per-row rule: `update(rows, state, grads)` takes the touched
rows `[M, d]`, their optimizer state (a dict of `[M, ...]` arrays) and their summed
gradients, and returns the new rows and state. Rows that were not touched, and their
state, are never read or written, so a step costs the same for any table size.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SparseAdagrad:
    """Element-wise Adagrad (as PyTorch's): `acc += g**2; row -= lr * g / (sqrt(acc) + eps)`.

    A row's accumulator grows only when the row is touched, which is exactly what dense
    Adagrad does for rows with zero gradient.
    """

    learning_rate: float = 0.01
    eps: float = 1e-10
    initial_accumulator: float = 0.0

    def slots(self, dim: int) -> dict[str, tuple[tuple[int, ...], object, float]]:
        """{name: (row shape, dtype, initial value)} of the per-row state."""
        return {"acc": ((dim,), jnp.float32, self.initial_accumulator)}

    def update(self, rows, state: Mapping[str, jnp.ndarray], grads):
        acc = state["acc"] + grads * grads
        rows = rows - self.learning_rate * grads / (jnp.sqrt(acc) + self.eps)
        return rows, {"acc": acc}


@dataclasses.dataclass(frozen=True)
class SparseAdam:
    """Lazy Adam with a per-row step count (as DGL's SparseAdam).

    For a touched row, with t its own number of updates so far plus one:
    `m = b1 m + (1-b1) g; v = b2 v + (1-b2) g**2;
     row -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)`.
    Untouched rows keep their moments (dense Adam would decay them).
    """

    learning_rate: float = 0.001
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def slots(self, dim: int) -> dict[str, tuple[tuple[int, ...], object, float]]:
        return {"m": ((dim,), jnp.float32, 0.0), "v": ((dim,), jnp.float32, 0.0),
                "step": ((), jnp.int32, 0)}

    def update(self, rows, state: Mapping[str, jnp.ndarray], grads):
        step = state["step"] + 1
        t = step.astype(jnp.float32)[:, None]
        m = self.b1 * state["m"] + (1 - self.b1) * grads
        v = self.b2 * state["v"] + (1 - self.b2) * grads * grads
        m_hat = m / (1 - self.b1 ** t)
        v_hat = v / (1 - self.b2 ** t)
        rows = rows - self.learning_rate * m_hat / (jnp.sqrt(v_hat) + self.eps)
        return rows, {"m": m, "v": v, "step": step}


SparseOptimizer = SparseAdagrad | SparseAdam
