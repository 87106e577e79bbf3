"""The one interface every exchange transport implements.

A transport turns a `Plan` into one or more `Transfer`s. A transfer moves each device's
remote ids, at most `cap` per destination slot, to their owners (`send`), and the
owners' answers back into the plan's compact order (`back`). A transfer whose need
exceeds `cap` moves in rounds: round r sends the ids `offset = r * cap` onwards. The
exchange picks `cap` (the same on every device) and each round's buffers have that
static shape, so memory follows the capacity, never the request's worst case.

A transfer may instead always move in a loop of one capacity (`chunked`: the scheduled
transport's rounds of device pairs, in chunks): `rounds(cap)` says how many iterations,
and round r's `offset` is still `r * cap`.

To add a strategy: a module with a `Transfer` subclass and its `transfers(plan, axis,
offsets)`, one entry in `Strategy`, and one in `jgraph.exchange.exchange.TRANSPORTS`;
the exchange tests run every strategy against the same numpy reference.
"""
from __future__ import annotations

import abc
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

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
    largest, and moves the transfer in as many rounds of its capacity as that needs);
    top: the capacity no request can exceed (one round always suffices there).
    """

    need: jnp.ndarray
    top: int

    def __init__(self, plan: Plan, axis: str):
        self.plan, self.axis = plan, axis
        self.n, self.num_parts = plan.size, plan.num_parts

    @abc.abstractmethod
    def send(self, cap: int, payload: PyTree = None,
             received: jnp.ndarray | None = None, offset=0) -> Delivery:
        """Route the ids from `offset` on (int32, a multiple of `cap`: the round's first),
        and `payload` (rows in compact order), to their owners, at most `cap` per slot.
        With `received` (the ids an earlier `send` of this round delivered) the ids are
        not sent again: the delivery holds them, ready for `back`."""

    @abc.abstractmethod
    def back(self, sent: Delivery, answers: PyTree,
             into: tuple[PyTree, jnp.ndarray] | None = None,
             offset=0) -> tuple[PyTree, jnp.ndarray]:
        """Return `answers` (rows for `sent.ids`, sent from `offset`) to the requesters:
        (answers in compact order [n], filled bool[n]), written into `into = (answers,
        filled)` when given, so that a gather's transfers and rounds fill one buffer."""

    @abc.abstractmethod
    def wire(self, cap: int, fwd_bytes: int, ans_bytes: int) -> jnp.ndarray:
        """float32 bytes this device sends in one round at `cap`: `fwd_bytes` per id
        slot out, `ans_bytes` per answer slot back."""

    chunked = False
    """True: the transfer always moves in `rounds(cap)` rounds of one capacity (its
    schedule, not an overflow): no capacity holds it in one round, its capacity has no
    ladder, it is reported as one round and never grown for its rounds."""

    def rounds(self, cap: int) -> jnp.ndarray:
        """int32 rounds of `cap` that the devices' largest need asks for (at least 1)."""
        need = jnp.maximum(lax.pmax(self.need, self.axis).astype(jnp.int32), 1)
        # lax.div truncates: a ceiling for need >= 1, in one op (`//` floors, in three).
        return lax.div(need + (cap - 1), jnp.int32(cap))

    laddered = True
    """False: the transfer's first round has one capacity, never a ladder of rungs (it
    follows each batch's load inside its buffers, as the relay's chunks do)."""

    exact_wire = False
    """True: `wire` counts the bytes of every round together (exact sizes), whatever
    `cap`; False: it counts one round's padded buffers."""

    def received_length(self, cap: int) -> int:
        """Length of `Delivery.ids` at `cap`."""
        return cap

    @abc.abstractmethod
    def estimate(self, remote: float) -> float:
        """The need expected when `remote` of this device's ids are owned elsewhere,
        spread evenly over the other devices (and this device is asked as much)."""

    def limit(self) -> int:
        """The largest capacity worth a round: `top` (one round holds everything), less
        for a transport whose buffers would otherwise grow with the device count."""
        return self.top


def put_back(n: int, answers: PyTree, idx: jnp.ndarray, ok: jnp.ndarray,
             into: tuple[PyTree, jnp.ndarray] | None) -> tuple[PyTree, jnp.ndarray]:
    """`Transfer.back`'s result for answers that belong at compact positions `idx`
    where `ok`."""
    base, filled = into if into is not None else (None, None)
    return put(n, answers, idx, ok, base), put(n, ok, idx, ok, filled)
