"""The ragged_all_to_all transport: exact sizes on the wire, no padding per pair.

GPU only: XLA:CPU does not implement ragged_all_to_all (the tests emulate it on CPU by
replacing `_ragged_all_to_all`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.transport import Delivery, Transfer

_ragged_all_to_all = lax.ragged_all_to_all   # module-level so tests can emulate it on CPU


class Ragged(Transfer):
    """Each device's groups land back to back in the owners' receive buffers; `cap` is
    the receive buffer's length, so the need is what this device receives and the top
    is what P - 1 full requests could send it (no `max_capacity` applies)."""

    bounded = False

    def __init__(self, plan: Plan, axis: str):
        super().__init__(plan, axis)
        me = lax.axis_index(axis)
        matrix = lax.all_gather(plan.counts, axis)                   # [sender, owner]
        self.sender_starts = lax.all_gather(plan.start, axis)[:, me]  # my group, per sender
        self.recv_sizes = matrix[:, me]                              # from each sender
        self.recv_offsets = (jnp.cumsum(self.recv_sizes) - self.recv_sizes).astype(jnp.int32)
        # Where my group for owner p lands in p's receive buffer: after lower senders'.
        self.out_offsets = (jnp.cumsum(matrix, axis=0) - matrix)[me].astype(jnp.int32)
        self.need, self.top = jnp.sum(self.recv_sizes), (self.num_parts - 1) * self.n

    @classmethod
    def transfers(cls, plan: Plan, axis: str, offsets) -> list[Transfer]:
        return [cls(plan, axis)]

    def _forward(self, x: jnp.ndarray, cap: int, fill) -> jnp.ndarray:
        out = jnp.full((cap,) + x.shape[1:], fill, x.dtype)
        return _ragged_all_to_all(x, out, self.plan.start, self.plan.counts, self.out_offsets,
                                  self.recv_sizes, axis_name=self.axis)

    def send(self, cap, payload=None, received=None) -> Delivery:
        if received is None:
            received = self._forward(self.plan.compact, cap, -1)
        rows = None if payload is None else jax.tree.map(
            lambda x: self._forward(x, cap, 0), payload)
        return Delivery(cap, received, received >= 0, rows, jnp.int32(0))

    def back(self, sent, answers, into=None):
        n, plan = self.n, self.plan
        base, filled = into if into is not None else (None, None)
        if base is None:
            base = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype), answers)
        answers = jax.tree.map(
            lambda x, out: _ragged_all_to_all(x, out, self.recv_offsets, self.recv_sizes,
                                              self.sender_starts, plan.counts,
                                              axis_name=self.axis), answers, base)
        now = jnp.arange(n) < jnp.sum(plan.counts)
        return answers, now if filled is None else now | filled

    def wire(self, cap, fwd_bytes, ans_bytes):
        sent = jnp.sum(self.plan.counts)
        return (sent * fwd_bytes + self.need * ans_bytes).astype(jnp.float32)
