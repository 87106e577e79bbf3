"""The one interface every exchange transport implements.

A transport turns a `Plan` into one or more `Transfer`s. A transfer moves each device's
remote ids, at most `cap` per destination slot, to their owners (`send`), and the
owners' answers back into the plan's compact order (`back`). The exchange picks `cap`
from its ladder (the same on every device) and compiles one branch per rung, so a
transfer's buffers have static shapes. To add a strategy: a module with a `Transfer`
subclass and its `transfers(plan, axis, offsets)`, one entry in `Strategy`, and one in
`jgraph.exchange.exchange.TRANSPORTS`; the exchange tests run every strategy against
the same numpy reference.
"""
from __future__ import annotations

import abc
from typing import NamedTuple

import jax.numpy as jnp

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import PyTree, put


class Delivery(NamedTuple):
    """What one transfer at capacity `cap` delivered to this device as an owner.

    ids: int32[m] the ids asked of this device, -1 where empty; mask: bool[m] the rows
    to answer; payload: pytree of [m, ...] sent with the ids (None for a gather);
    overflow: int32 this device's ids that did not fit `cap` (their answers stay zero).
    """

    cap: int
    ids: jnp.ndarray
    mask: jnp.ndarray
    payload: PyTree
    overflow: jnp.ndarray


class Transfer(abc.ABC):
    """One movement of ids to owners and answers back, at a capacity picked per call.

    need: int32 this device's load in capacity units (the exchange takes the devices'
    largest and climbs the ladder to it); top: the capacity no request can exceed;
    bounded: whether `ExchangeConfig.max_capacity` may lower `top`.
    """

    need: jnp.ndarray
    top: int
    bounded: bool = True

    def __init__(self, plan: Plan, axis: str):
        self.plan, self.axis = plan, axis
        self.n, self.num_parts = plan.size, plan.num_parts

    @abc.abstractmethod
    def send(self, cap: int, payload: PyTree = None,
             received: jnp.ndarray | None = None) -> Delivery:
        """Route the ids (and `payload`, rows in compact order) to their owners. With
        `received` (the ids an earlier `send` at this `cap` delivered) the ids are not
        sent again: the delivery holds them, ready for `back`."""

    @abc.abstractmethod
    def back(self, sent: Delivery, answers: PyTree,
             into: tuple[PyTree, jnp.ndarray] | None = None) -> tuple[PyTree, jnp.ndarray]:
        """Return `answers` (rows for `sent.ids`) to the requesters: (answers in compact
        order [n], filled bool[n]), written into `into = (answers, filled)` when given,
        so that a gather's transfers fill one buffer in turn."""

    @abc.abstractmethod
    def wire(self, cap: int, fwd_bytes: int, ans_bytes: int) -> jnp.ndarray:
        """float32 bytes this device sends at `cap`: `fwd_bytes` per id slot out,
        `ans_bytes` per answer slot back."""

    def received_length(self, cap: int) -> int:
        """Length of `Delivery.ids` at `cap`."""
        return cap


def put_back(n: int, answers: PyTree, idx: jnp.ndarray, ok: jnp.ndarray,
             into: tuple[PyTree, jnp.ndarray] | None) -> tuple[PyTree, jnp.ndarray]:
    """`Transfer.back`'s result for answers that belong at compact positions `idx`
    where `ok`."""
    base, filled = into if into is not None else (None, None)
    return put(n, answers, idx, ok, base), put(n, ok, idx, ok, filled)
