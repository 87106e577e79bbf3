"""What an exchange reports: `ExchangeStats`, its counters summed over devices (from a
device's `Tally` of its transfers and its plan's counts), and the error raised on the
host when they say something was lost."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class ExchangeOverflowError(RuntimeError):
    """A transfer needed more capacity than the top rung of the ladder allows."""


class ExchangeStats(NamedTuple):
    """Counters of one exchange, summed over devices (the same on every device).

    requested: distinct valid ids asked for; non_local: those owned by another device;
    cached: non-local ids answered by the hot-node cache; capacity: the largest transfer
    capacity used; wire_bytes: bytes sent between devices; overflow: ids a
    `scatter_add` could not move in its one round (their values are not summed);
    out_of_range: valid ids the caller's `contains` rejected (treated as padding);
    length, route: the key its capacity is calibrated under (`jgraph.exchange.sizing.Key`:
    the request's length, static, and `Route.code` of the way it moved); needed: the
    devices' largest need, in the units of the capacity (what calibration measures);
    rounds: the most rounds a transfer took (1 when everything fitted its capacity);
    relayed: the rows a relayed gather's routing sends through a third device (whatever
    its capacity; 0 for every other exchange), which calibration reads to choose where
    gathers relay (`Capacities.fitted`).
    """

    requested: jnp.ndarray
    non_local: jnp.ndarray
    cached: jnp.ndarray
    capacity: jnp.ndarray
    wire_bytes: jnp.ndarray
    overflow: jnp.ndarray
    out_of_range: jnp.ndarray
    length: jnp.ndarray
    route: jnp.ndarray
    needed: jnp.ndarray
    rounds: jnp.ndarray
    relayed: jnp.ndarray

    def check(self, what: str = "exchange") -> ExchangeStats:
        """Host side: raise if anything was lost; returns self."""
        overflow, bad = int(self.overflow), int(self.out_of_range)
        if overflow:
            raise ExchangeOverflowError(
                f"{what}: {overflow} id(s) did not fit the capacity {int(self.capacity)} "
                f"(a request of {int(self.length)} ids needed {int(self.needed)}); grow "
                f"it (`Exchange.grown`) or size the exchange with sizing=bound")
        if bad:
            raise IndexError(f"{what}: {bad} id(s) are not rows of the array they index")
        return self

    @classmethod
    def none(cls) -> ExchangeStats:
        """The counters of no exchange (what `combined` starts from)."""
        return cls(*(jnp.zeros((), jnp.float32 if name == "wire_bytes" else jnp.int32)
                     for name in cls._fields))

    def combined(self, other: ExchangeStats) -> ExchangeStats:
        """Two exchanges' counters as one (a loop of exchanges of one key): amounts
        added, sizes the larger."""
        most = ("capacity", "length", "route", "needed", "rounds")
        return ExchangeStats(*(jnp.maximum(x, y) if name in most else x + y
                               for name, x, y in zip(self._fields, self, other)))

    @classmethod
    def local(cls, valid, out_of_range, length: int, route: int, axis: str
              ) -> ExchangeStats:
        """The counters of a request answered on its own device (nothing moves): its
        `valid` ids and those `out_of_range` (bool[length]), counted over devices so that
        they are typed as replicated, as every exchange's are."""
        count = lambda m: lax.psum(jnp.sum(m, dtype=jnp.int32), axis)
        zero = count(jnp.zeros((), bool))
        return cls(requested=count(valid), non_local=zero, cached=zero, capacity=zero,
                   wire_bytes=zero.astype(jnp.float32), overflow=zero,
                   out_of_range=count(out_of_range), length=zero + length,
                   route=zero + route, needed=zero, rounds=zero, relayed=zero)


class Tally:
    """What an operation's transfers used, on this device: each one's capacity, need
    and rounds, and the bytes it sent over all of them; `stats` sums them over devices."""

    def __init__(self):
        self.caps, self.needs, self.rounds, self.wire = [], [], [], jnp.float32(0)

    def add(self, cap, need, rounds, wire) -> None:
        """One transfer's capacity, need and rounds (int32) and its bytes sent."""
        self.caps.append(cap)
        self.needs.append(need)
        self.rounds.append(rounds)
        self.wire = self.wire + wire

    def stats(self, counts: jnp.ndarray, length: int, route: int, axis: str, overflow=0,
              relayed=0) -> ExchangeStats:
        """The operation's `ExchangeStats`: this device's counters summed over devices.
        counts: int32[4] the request's (requested, non_local, cached, out_of_range)
        (`Plan.tally`); length, route: its `Key`'s (`Route.code`); overflow: the ids
        that did not fit; relayed: rows routed through a third device. The counts, the
        overflow and the relayed rows go in one all-reduce, the wire bytes in another,
        the maxima in a third (every stack and slice around them is a kernel to
        compile)."""
        requested, non_local, cached, out_of_range, overflow, relayed = lax.psum(
            jnp.concatenate([counts, jnp.stack([jnp.asarray(overflow, jnp.int32),
                                                jnp.asarray(relayed, jnp.int32)])]), axis)
        wire = lax.psum(self.wire, axis)
        largest = lambda xs: jnp.max(jnp.stack([jnp.asarray(x, jnp.int32) for x in xs])
                                     ) if xs else jnp.int32(0)
        capacity, needed, rounds = lax.pmax(
            jnp.stack([largest(self.caps), largest(self.needs), largest(self.rounds)]),
            axis)
        return ExchangeStats(
            requested=requested, non_local=non_local, cached=cached, capacity=capacity,
            wire_bytes=wire, overflow=overflow, out_of_range=out_of_range,
            length=jnp.zeros_like(requested) + length,
            route=jnp.zeros_like(requested) + route, needed=needed, rounds=rounds,
            relayed=relayed)


def exchange_stats(tree) -> list[ExchangeStats]:
    """The `ExchangeStats` in a pytree (a step's metrics), in order."""
    return [leaf for leaf in jax.tree.leaves(
        tree, is_leaf=lambda x: isinstance(x, ExchangeStats)) if isinstance(leaf, ExchangeStats)]
