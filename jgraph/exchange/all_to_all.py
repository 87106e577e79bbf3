"""The all_to_all transport: one all_to_all each way, `cap` id slots per device pair."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.relay import ROUTE_MAX, Relay
from jgraph.exchange.rows import take
from jgraph.exchange.transport import Delivery, Transfer, put_back


class AllToAll(Transfer):
    """Every device sends each owner its first `cap` ids for that owner (a [P, cap]
    buffer) and gets the answers back the same way. Its need is the busiest pair's."""

    def __init__(self, plan: Plan, axis: str):
        super().__init__(plan, axis)
        self.need, self.top = jnp.max(plan.counts), self.n

    @classmethod
    def gathering(cls, config, num_parts):
        # Relayed (`ExchangeConfig.relay`) over 3 to ROUTE_MAX devices: with two, there
        # is no third to route through; beyond, the routing every device holds grows as P^3.
        return Relay if config.relay and 2 < num_parts <= ROUTE_MAX else cls

    def _all_to_all(self, x: jnp.ndarray) -> jnp.ndarray:
        """[P, cap, ...] rows for each device -> [P * cap, ...] rows from each device."""
        out = lax.all_to_all(x, self.axis, 0, 0, tiled=True)
        return out.reshape((-1,) + x.shape[2:])

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        ids, idx, ok = self.plan.group_ids(None, cap, offset)
        if received is None:
            received = self._all_to_all(ids)                            # [P * cap]
        rows = None if payload is None else jax.tree.map(self._all_to_all,
                                                         take(payload, idx, ok))
        overflow = jnp.sum(jnp.maximum(self.plan.counts - offset - cap, 0))
        return Delivery(cap, received, received >= 0, rows, overflow)

    def back(self, sent, answers, into=None, offset=0):
        cap, P = sent.cap, self.num_parts
        answers = jax.tree.map(
            lambda x: self._all_to_all(x.reshape((P, cap) + x.shape[1:])), answers)
        idx, ok = self.plan.group(None, cap, offset)
        return put_back(self.n, answers, idx.reshape(-1), ok.reshape(-1), into)

    def wire(self, cap, fwd_bytes, ans_bytes):
        return jnp.float32((self.num_parts - 1) * cap * (fwd_bytes + ans_bytes))

    def received_length(self, cap):
        return self.num_parts * cap

    def estimate(self, remote):
        return remote / max(self.num_parts - 1, 1)
