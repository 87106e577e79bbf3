"""How large an exchange's buffers are: capacities by (route, request length),
measured or estimated, and the ladder of rungs a transfer's first round picks from.

Every transfer has a static capacity (shapes are fixed at trace time), sized by what
arrives (`ExchangeConfig.sizing`): measured per request length on the first batches
(`Capacities.fitted`), so that a device's buffers follow its batch and not the number
of devices, else estimated from `ExchangeConfig.cut`. A capacity is kept under a `Key`:
the request's length and the `Route` its ids travel, since one length may move two ways
(a relayed gather's capacity is its busiest hop pair's rows, a scatter of the same
length goes straight and needs its busiest pair's).
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import NamedTuple

from jgraph.exchange.config import ExchangeConfig, Sizing
from jgraph.exchange.stats import exchange_stats
from jgraph.exchange.transport import Transfer


class Route(str, enum.Enum):
    """The way a request's ids travel, which its capacity measures.

    OWN: the exchange's strategy (the scheduled strategy's chunks, a relayed gather's
    hop pairs, or simply the strategy's one transfer). STRAIGHT: plain all_to_all, one
    buffer per device pair: where the strategy moves gathers another way, the route of
    its scatters (values cannot loop through a schedule's chunks nor relay) and of the
    gathers calibrated to go straight (`Capacities.fitted`)."""

    OWN = "own"
    STRAIGHT = "straight"

    @property
    def code(self) -> int:
        """The route as `ExchangeStats.route` carries it (an int32 on the devices)."""
        return list(Route).index(self)


class Key(NamedTuple):
    """What a capacity is kept under: the request's route and length."""

    route: Route
    length: int

    def __str__(self) -> str:
        return f"{self.route.value}:{self.length}"

    @classmethod
    def parse(cls, key) -> Key:
        """A key from itself or its text (`str(key)`, what a checkpoint's JSON keeps).
        Checkpoints written before routes were named keep a length, negative for the
        straight route: read as such."""
        if isinstance(key, Key):
            return key
        text = str(key)
        if ":" in text:
            route, length = text.split(":", 1)
            try:
                return cls(Route(route), int(length))
            except ValueError:
                raise ValueError(f"exchange capacity key {text!r}: expected "
                                 f"'<{'|'.join(r.value for r in Route)}>:<length>'") from None
        length = int(text)
        return cls(Route.STRAIGHT if length < 0 else Route.OWN, abs(length))

    @classmethod
    def of(cls, stats) -> Key:
        """The key of an exchange's `ExchangeStats` (on the host)."""
        return cls(list(Route)[int(stats.route)], int(stats.length))


def with_headroom(need: float, headroom: float) -> int:
    """A capacity for `need`: times 1 + headroom, rounded up to a multiple of 8."""
    return max(-(-math.ceil(need * (1 + headroom)) // 8) * 8, 8)


class Need(NamedTuple):
    """What the exchanges of one key needed over some batches: the largest need,
    whether any needed more than its capacity, the rows they relayed."""

    needed: int
    over: bool
    relayed: int


def needs(stats) -> dict[Key, Need]:
    """{key: its `Need`} over the `ExchangeStats` leaves of `stats` (on the host);
    exchanges of no length (one device's) are left out."""
    out: dict[Key, Need] = {}
    for st in exchange_stats(stats):
        key, needed = Key.of(st), int(st.needed)
        if key.length != 0:
            most, over, relayed = out.get(key, Need(0, False, 0))
            out[key] = Need(max(most, needed), over or needed > int(st.capacity),
                            relayed + int(st.relayed))
    return out


def dump(capacities: Mapping[Key, int]) -> dict[str, int]:
    """Capacities as JSON keeps them ({"route:length": capacity})."""
    return {str(k): int(v) for k, v in capacities.items()}


@dataclasses.dataclass(frozen=True)
class Capacities:
    """An exchange's capacities: those measured ({Key: capacity}), and how every other
    one is sized (`config`: sizing, headroom, cut, ladder, max_capacity).

    planned: every request length is taken as measured at its estimate (one capacity,
    no ladder; a one-round transfer at its estimate, not its top), so that a program
    built from counts (`jgraph compile --abstract`) is the one a calibrated run
    compiles, not the one of its measuring batches."""

    config: ExchangeConfig
    num_parts: int
    measured: Mapping[Key, int] = dataclasses.field(default_factory=dict)
    planned: bool = False

    def __post_init__(self):
        object.__setattr__(self, "measured", {Key.parse(k): int(v)
                                              for k, v in dict(self.measured).items()})

    def is_measured(self, key: Key) -> bool:
        """Whether `key`'s capacity is sized as measured: a capacity was measured for
        it, or the exchange is planned (its estimate taken as measured)."""
        return key in self.measured or self.planned

    def capacity(self, transfer: Transfer, key: Key, one_round: bool = False) -> int:
        """The static capacity of `transfer`'s rounds (its request's `key`): its need
        as measured (calibrated sizing, never above `transfer.limit()`) or estimated
        from `ExchangeConfig.cut`, or its top (bound sizing); never above what one round
        can need (`top`) nor `ExchangeConfig.max_capacity`.

        one_round: the transfer has no later rounds (a scatter_add's): its measured
        need (planned: its estimate), not limited, or else its top, since an estimate
        that falls short would lose values (a training run measures every length its
        step sends)."""
        config, top = self.config, transfer.top
        if config.sizing is Sizing.BOUND or (one_round and not self.is_measured(key)):
            cap = top
        else:
            if key in self.measured:
                cap = self.measured[key]
            else:
                cut = (config.cut if config.cut is not None
                       else (self.num_parts - 1) / self.num_parts)
                cap = with_headroom(transfer.estimate(cut * transfer.n), config.headroom)
            if not one_round:
                cap = min(cap, transfer.limit())
        if config.max_capacity is not None:
            cap = min(cap, config.max_capacity)
        return max(min(cap, top), 1)

    def ladder(self, transfer: Transfer, key: Key, top: int) -> tuple[int, ...]:
        """The capacities `transfer`'s first round picks from, the largest `top`: a
        measured capacity alone (it is the need plus headroom: rungs below it would
        save little wire and cost a compiled branch each; measured on the 200k-node
        graph's 8-device step, one rung compiled in 7.1 s where four took 9.4 s), else
        the ladder below an estimated or bound top. A chunked or unladdered transfer's
        one capacity alone."""
        if transfer.chunked or not transfer.laddered or (
                self.is_measured(key) and self.config.sizing is Sizing.CALIBRATED):
            return (top,)
        return self.config.ladder(top)

    def calibrated(self, more) -> Capacities:
        """These capacities with `more` ({key or its text: capacity}) added."""
        return dataclasses.replace(self, measured={
            **self.measured, **{Key.parse(k): int(v) for k, v in dict(more).items()}})

    def fitted(self, stats, relays: bool) -> Capacities:
        """These capacities with every key's in `stats` (`ExchangeStats` leaves, on the
        host) set to the largest need measured there plus headroom.

        relays: gathers relay (`Exchange.relays`). Then a gather length whose batches'
        routings sent no row through a third device (traffic even enough that relaying
        would move nothing less) is recorded under the straight route instead: such
        gathers then move straight, with the scatters, and the relay is not compiled
        for them."""
        fresh, straight = {}, set()
        for key, need in needs(stats).items():
            if relays and key.route is Route.OWN and not need.relayed:
                key = Key(Route.STRAIGHT, key.length)     # a scatter's of that length too
                straight.add(key.length)
            fresh[key] = max(fresh.get(key, 0), with_headroom(need.needed,
                                                              self.config.headroom))
        kept = {k: v for k, v in self.measured.items()
                if not (k.route is Route.OWN and k.length in straight)}
        return dataclasses.replace(self, measured={**kept, **fresh})

    def grown(self, stats, chunked_gathers: bool) -> Capacities:
        """These capacities with every key's that needed more (`ExchangeStats` leaves
        of `stats`, on the host, with `needed` > `capacity`) set to that need plus
        headroom; themselves if none did. chunked_gathers: the strategy's own route
        loops its chunks as often as a request needs (the scheduled strategy: that is
        its schedule, not an overflow), so only the straight route's grow."""
        want = {key: with_headroom(need.needed, self.config.headroom)
                for key, need in needs(stats).items()
                if need.over and (key.route is Route.STRAIGHT or not chunked_gathers)}
        want = {k: v for k, v in want.items() if v > self.measured.get(k, 0)}
        return self.calibrated(want) if want else self

    def straight(self, length: int) -> bool:
        """Where gathers relay: whether a gather of `length` ids moves straight instead,
        as calibration chose (`fitted`: only its straight route is measured)."""
        return (Key(Route.STRAIGHT, length) in self.measured
                and Key(Route.OWN, length) not in self.measured)
