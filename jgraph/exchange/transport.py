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

Everything a strategy does otherwise than the others is said here, by its `Transfer`
subclass: how it moves (`send`, `back`, `wire`, `estimate`, `rounds`, `limit`), what a
plan's transfers are (`transfers`), and how the exchange drives them (the class
attributes `chunked`, `laddered`, `exact_wire`, `scatters`, `optional`, `weighted`; the
class methods `gathering`, `schedule`, `check`). The exchange (`exchange.py`) asks these
and never which strategy it runs. To add a strategy: a module with a `Transfer`
subclass, one entry in `Strategy`, and one in `jgraph.exchange.exchange.TRANSPORTS`;
the exchange tests run every strategy against the same numpy reference.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import PyTree, put

if TYPE_CHECKING:
    from jgraph.exchange.config import ExchangeConfig


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

    @classmethod
    def transfers(cls, plan: Plan, axis: str, offsets: np.ndarray,
                  schedule: np.ndarray | None) -> list[Transfer]:
        """The plan's transfers (one, unless the transport moves in several: the ring's
        shifts). offsets: the partitions' first ids; schedule: what `schedule` built."""
        return [cls(plan, axis)]

    @classmethod
    def gathering(cls, config: ExchangeConfig, num_parts: int) -> type[Transfer]:
        """The class an exchange of this strategy moves its gathers by: itself, unless
        the strategy gathers another way (all_to_all's relay)."""
        return cls

    @classmethod
    def schedule(cls, num_parts: int, pair_weights: np.ndarray | None) -> np.ndarray | None:
        """What the transport builds once per exchange on the host and every
        `transfers` call takes: none, but the scheduled strategy's rounds of device
        pairs (from `pair_weights`, the ids partition k is expected to ask of j)."""
        return None

    @classmethod
    def check(cls, platform: str | None) -> None:
        """Raise where the transport cannot run on `platform` (None: unknown)."""
        return None

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
        return rounds_for(self.need, cap, self.axis, at_least_one=True)

    laddered = True
    """False: the transfer's first round has one capacity, never a ladder of rungs (it
    follows each batch's load inside its buffers, as the relay's chunks do)."""

    exact_wire = False
    """True: `wire` counts the bytes of every round together (exact sizes), whatever
    `cap`; False: it counts one round's padded buffers."""

    scatters = True
    """False: the transfer moves gathers only (no payload: a scatter's values can
    neither loop through a schedule's chunks nor relay). An exchange whose gathers move
    by it moves its scatters straight: plain all_to_all, their capacities kept under
    `Route.STRAIGHT` (a device pair's load, not a chunk or a hop pair's)."""

    optional = False
    """True: a gather may move straight instead (plain all_to_all, `Route.STRAIGHT`), as
    a gather costly to compile (`once`) always does, and a request length whose
    calibration batches never used the transfer's way (`relayed` zero) does
    (`Capacities.fitted`): the relay."""

    relayed: jnp.ndarray | int = 0
    """int32 rows this device's request sends through a third device
    (`ExchangeStats.relayed`, what calibration reads to choose an `optional` way)."""

    weighted = False
    """True: `schedule` groups device pairs by their expected loads, which the
    exchange's `pair_weights` hold (`DistGraph.exchange` counts them only then)."""

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


def rounds_for(need, cap: int, axis: str, at_least_one: bool = False) -> jnp.ndarray:
    """int32 rounds of `cap` that the devices' largest `need` (int32 >= 0, on each
    device) asks for: the same on every device; zero where no device needs any, unless
    `at_least_one`."""
    need = lax.pmax(need, axis).astype(jnp.int32)
    if at_least_one:
        need = jnp.maximum(need, 1)
    # lax.div truncates: a ceiling for need >= 0, in one op (`//` floors, in three).
    return lax.div(need + (cap - 1), jnp.int32(cap))


def put_back(n: int, answers: PyTree, idx: jnp.ndarray, ok: jnp.ndarray,
             into: tuple[PyTree, jnp.ndarray] | None) -> tuple[PyTree, jnp.ndarray]:
    """`Transfer.back`'s result for answers that belong at compact positions `idx`
    where `ok`."""
    base, filled = into if into is not None else (None, None)
    return put(n, answers, idx, ok, base), put(n, ok, idx, ok, filled)
