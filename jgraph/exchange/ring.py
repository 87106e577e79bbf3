"""The ring transport: P - 1 ppermute shifts; each picks its own capacity."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import take
from jgraph.exchange.transport import Delivery, Transfer, put_back


class RingShift(Transfer):
    """Shift s: every device d sends its ids owned by d + s (mod P) there, and gets the
    answers back from it. Its need is that one pair's count."""

    def __init__(self, plan: Plan, axis: str, shift: int):
        super().__init__(plan, axis)
        P = self.num_parts
        self.peer = (lax.axis_index(axis) + shift) % P
        self.forward = [(i, (i + shift) % P) for i in range(P)]
        self.backward = [(i, (i - shift) % P) for i in range(P)]
        self.need, self.top = plan.counts[self.peer], self.n

    @classmethod
    def transfers(cls, plan, axis, offsets, schedule) -> list[Transfer]:
        return [cls(plan, axis, shift) for shift in range(1, plan.num_parts)]

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        ids, idx, ok = self.plan.group_ids(self.peer, cap, offset)             # [cap]
        if received is None:
            received = lax.ppermute(ids, self.axis, self.forward)
        rows = None if payload is None else jax.tree.map(
            lambda x: lax.ppermute(x, self.axis, self.forward), take(payload, idx, ok))
        overflow = jnp.maximum(self.plan.counts[self.peer] - offset - cap, 0)
        return Delivery(cap, received, received >= 0, rows, overflow)

    def back(self, sent, answers, into=None, offset=0):
        answers = jax.tree.map(lambda x: lax.ppermute(x, self.axis, self.backward), answers)
        idx, ok = self.plan.group(self.peer, sent.cap, offset)
        return put_back(self.n, answers, idx, ok, into)

    def wire(self, cap, fwd_bytes, ans_bytes):
        return jnp.float32(cap * (fwd_bytes + ans_bytes))

    def estimate(self, remote):
        return remote / max(self.num_parts - 1, 1)
