"""The all_gather transport: every device sees every request; owners answer theirs and
a reduce-scatter brings each device the answers to its own."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import psum_scatter_any, select, take
from jgraph.exchange.segments import owner_of
from jgraph.exchange.transport import Delivery, Transfer, put_back


class AllGather(Transfer):
    """Each device contributes its first `cap` remote ids (all owners together) to one
    all_gather; its need is its whole remote count."""

    def __init__(self, plan: Plan, axis: str, offsets):
        super().__init__(plan, axis)
        self.offsets = offsets
        self.need, self.top = jnp.sum(plan.counts), self.n

    @classmethod
    def transfers(cls, plan, axis, offsets, schedule) -> list[Transfer]:
        return [cls(plan, axis, offsets)]

    def _slots(self, cap, offset):
        idx = jnp.arange(cap, dtype=jnp.int32) + offset
        return idx, idx < self.need

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        idx, ok = self._slots(cap, offset)
        ids = jnp.where(ok, self.plan.compact[jnp.minimum(idx, self.n - 1)], -1)
        if received is None:
            received = lax.all_gather(ids, self.axis, tiled=True)              # [P * cap]
        mine = (received >= 0) & (owner_of(self.offsets, received)
                                  == lax.axis_index(self.axis))
        rows = None if payload is None else jax.tree.map(
            lambda x: lax.all_gather(x, self.axis, tiled=True), take(payload, idx, ok))
        return Delivery(cap, received, mine, rows, jnp.maximum(self.need - offset - cap, 0))

    def back(self, sent, answers, into=None, offset=0):
        # Rows this device does not own are zeroed, so the sum over devices is the owner's.
        answers = jax.tree.map(lambda x: psum_scatter_any(
            select(sent.mask, x, jnp.zeros_like(x)), self.axis), answers)
        idx, ok = self._slots(sent.cap, offset)
        return put_back(self.n, answers, idx, ok, into)

    def wire(self, cap, fwd_bytes, ans_bytes):
        return jnp.float32((self.num_parts - 1) * cap * (fwd_bytes + ans_bytes))

    def received_length(self, cap):
        return self.num_parts * cap

    def estimate(self, remote):
        return remote

    def limit(self):
        # Every device receives every device's contribution: P x cap ids and answers.
        # A round of n / P each keeps that at the request's length n, whatever P; more
        # remote ids take more rounds (all_gather's work grows with P by its nature).
        share = -(-self.n // self.num_parts)
        return max(-(-share // 8) * 8, 8)
