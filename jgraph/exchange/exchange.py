"""Owner-routed exchange: the one communication primitive of jgraph.

Called inside `shard_map`, on every device at once. Each device holds a batch of global
node ids; the exchange

  1. deduplicates them (`jnp.unique`, so each distinct id travels once),
  2. answers the ids it owns itself, and the ids in the replicated hot-node cache,
     without communication,
  3. routes every other id to its owner (ids sorted by value are grouped by owner,
     because partitions own contiguous ranges),
  4. applies `owner_fn` there (gather feature rows, embedding rows, sample neighbours),
  5. routes the answers back and returns them in the order asked.

`scatter_add` is its transpose: values (row gradients) travel to the owners of their ids
and are summed per id there.

How ids travel is a `Strategy`, carried out by a transport module (`transport.py` names
the interface; `all_to_all.py`, `all_gather.py`, `ring.py`, `ragged.py`, `scheduled.py`;
`relay.py`, all_to_all's gathers in two routed hops). Every transfer has a static
capacity (shapes are fixed at trace time), sized by what arrives
(`ExchangeConfig.sizing`): measured per request length on the first batches
(`calibrated`), so that a device's buffers follow its batch and not the number of
devices. The first round's capacity comes from a short ladder of
rungs below it (all devices agree on the rung with `pmax`; `lax.switch` runs the branch
compiled for it, so small requests move small buffers); a gather that needs more than
the capacity moves the rest in further rounds of the same buffers, so nothing is ever
dropped and nothing recompiles. `scatter_add` moves one round: what does not fit is
counted in `ExchangeStats.overflow`, never silently (host-side callers raise
`ExchangeOverflowError`; the training step is refused and run again after the capacity
grows).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange import ragged
from jgraph.exchange.all_gather import AllGather
from jgraph.exchange.all_to_all import AllToAll
from jgraph.exchange.config import ExchangeConfig, Sizing, Strategy
from jgraph.exchange.plan import EMPTY, Plan, make_plan, owner_of
from jgraph.exchange.ragged import Ragged
from jgraph.exchange.relay import ROUTE_MAX, Relay
from jgraph.exchange.ring import RingShift
from jgraph.exchange.rows import (
    OwnerFn,
    PyTree,
    answer_filled,
    answer_shapes,
    put,
    row_bytes,
    select,
    take,
)
from jgraph.exchange.scheduled import Scheduled, build_schedule
from jgraph.exchange.transport import Transfer
from jgraph.mesh import AXIS

TRANSPORTS: dict[Strategy, Callable[[Plan, str, np.ndarray], list[Transfer]]] = {
    Strategy.ALL_TO_ALL: AllToAll.transfers,
    Strategy.ALL_GATHER: AllGather.transfers,
    Strategy.RING: RingShift.transfers,
    Strategy.RAGGED: Ragged.transfers,
    Strategy.SCHEDULED: Scheduled.transfers,
}
"""Each concrete strategy's transfers of a plan: `(plan, axis, offsets) -> [Transfer]`
(scheduled's also takes the exchange's `schedule=`)."""


class ExchangeOverflowError(RuntimeError):
    """A transfer needed more capacity than the top rung of the ladder allows."""


class ExchangeStats(NamedTuple):
    """Counters of one exchange, summed over devices (the same on every device).

    requested: distinct valid ids asked for; non_local: those owned by another device;
    cached: non-local ids answered by the hot-node cache; capacity: the largest transfer
    capacity used; wire_bytes: bytes sent between devices; overflow: ids a
    `scatter_add` could not move in its one round (their values are not summed);
    out_of_range: valid ids the caller's `contains` rejected (treated as padding);
    length: the key its capacity is calibrated under: the request's length (static),
    negated for a scatter under the scheduled strategy (`Exchange.scatter_key`);
    needed: the devices' largest need, in the units of the capacity (what calibration
    measures); rounds: the most rounds a transfer took (1 when everything fitted its
    capacity); relayed: the rows a relayed gather's routing sends through a third device
    (whatever its capacity; 0 for every other exchange), which calibration reads to
    choose where gathers relay (`Exchange.fitted`).
    """

    requested: jnp.ndarray
    non_local: jnp.ndarray
    cached: jnp.ndarray
    capacity: jnp.ndarray
    wire_bytes: jnp.ndarray
    overflow: jnp.ndarray
    out_of_range: jnp.ndarray
    length: jnp.ndarray
    needed: jnp.ndarray
    rounds: jnp.ndarray
    relayed: jnp.ndarray

    def check(self, what: str = "exchange") -> ExchangeStats:
        """Host side: raise if anything was lost; returns self."""
        overflow, bad = int(self.overflow), int(self.out_of_range)
        if overflow:
            raise ExchangeOverflowError(
                f"{what}: {overflow} id(s) did not fit the capacity {int(self.capacity)} "
                f"(a request of {abs(int(self.length))} ids needed {int(self.needed)}); grow "
                f"it (`Exchange.grown`) or size the exchange with sizing=bound")
        if bad:
            raise IndexError(f"{what}: {bad} id(s) are not rows of the array they index")
        return self


class Exchange:
    """Owner-routed exchange over the partitions of a `PartitionBook`.

    Static (not a pytree): build it on the host and close over it in the step.
    """

    def __init__(self, offsets, config: ExchangeConfig = ExchangeConfig(), axis: str = AXIS,
                 platform: str | None = None, capacities=None, pair_weights=None,
                 planned: bool = False):
        """platform: of the devices it runs on (a mesh's `devices.flat[0].platform`, or
        the platform a program is built for); it resolves `Strategy.AUTO` and refuses
        ragged_all_to_all on "cpu". None: unknown (AUTO is then all_to_all).
        capacities: {request length: capacity} measured for calibrated sizing (see
        `calibrated`); lengths not in it are estimated. pair_weights: float[P, P], the
        ids partition k is expected to ask of partition j (`DistGraph.exchange` counts
        its halos); the scheduled strategy groups its device pairs by them (without:
        the P - 1 shifts). planned: every request length is taken as measured at its
        estimate (one capacity, no ladder; a scatter_add at its estimate, not its
        bound), so that a program built from counts (`jgraph compile --abstract`) is
        the one a calibrated run compiles, not the one of its measuring batches."""
        self.platform = platform
        self.offsets = np.asarray(offsets, np.int64)
        if self.offsets[-1] >= np.iinfo(np.int32).max:
            raise ValueError(f"{int(self.offsets[-1])} nodes do not fit int32 node ids")
        self.num_parts = self.offsets.size - 1
        strategy = config.strategy.on(platform)
        if (strategy is Strategy.RAGGED and platform == "cpu"
                and ragged._ragged_all_to_all is lax.ragged_all_to_all):
            raise NotImplementedError(
                "exchange strategy ragged_all_to_all needs a backend that implements "
                "it (GPU); XLA:CPU does not. Use all_to_all, all_gather or ppermute")
        self.config = dataclasses.replace(config, strategy=strategy)
        self.axis = axis
        self.capacities = {int(k): int(v) for k, v in dict(capacities or {}).items()}
        self.pair_weights = None if pair_weights is None else np.asarray(pair_weights)
        self.planned = planned
        self._schedule = None

    @property
    def schedule(self) -> np.ndarray:
        """int32[R, P] the scheduled strategy's rounds of device pairs
        (`jgraph.exchange.scheduled.build_schedule`), built once and shared by copies."""
        if self._schedule is None:
            self._schedule = build_schedule(self.num_parts, self.pair_weights)
        return self._schedule

    def _with(self, config: ExchangeConfig | None = None, capacities=None) -> Exchange:
        """A copy with another config or capacities (pair weights and schedule kept)."""
        copy = Exchange(self.offsets, config or self.config, self.axis, self.platform,
                        self.capacities if capacities is None else capacities,
                        self.pair_weights, self.planned)
        copy._schedule = self._schedule
        return copy

    def owner(self, ids: jnp.ndarray) -> jnp.ndarray:
        """int32 partition (device) owning each id."""
        return owner_of(self.offsets, ids)

    @property
    def relays(self) -> bool:
        """Whether gathers relay (`ExchangeConfig.relay`: all_to_all, over 3 to
        `ROUTE_MAX` devices)."""
        return (self.config.strategy is Strategy.ALL_TO_ALL and self.config.relay
                and 2 < self.num_parts <= ROUTE_MAX)

    def scatter_key(self, length: int) -> int:
        """The key in `capacities` of a scatter (`scatter_add`, `scatter_rows`) of
        `length` ids: the length, as a gather's, except where gathers move otherwise
        than scatters: under the scheduled strategy (a scatter's values cannot loop into
        a buffer of static shape in chunks: it moves as all_to_all does, whose capacity
        is a device pair's load, while a gather's of the same length is a chunk) and
        where gathers relay (a scatter goes straight: its capacity is the busiest
        pair's, a relayed gather's the busiest hop pair's). There its key is minus the
        length, and so is a gather's that goes straight where gathers relay (`once`, or
        calibrated straight: `fitted`)."""
        apart = self.config.strategy is Strategy.SCHEDULED or self.relays
        return -length if apart else length

    def _straight(self, length: int) -> bool:
        """Where gathers relay: whether a gather of `length` ids moves straight instead,
        as calibration chose (`fitted`: only minus its length is measured)."""
        return -length in self.capacities and length not in self.capacities

    def _scatters(self) -> Exchange:
        """The plain all_to_all exchange that scatters (and, where gathers relay, the
        gathers that go straight) move through where their key is apart
        (`scatter_key`), with their own capacities under their lengths."""
        return self._with(dataclasses.replace(self.config, strategy=Strategy.ALL_TO_ALL,
                                              relay=False),
                          capacities={-k: v for k, v in self.capacities.items() if k < 0})

    # -- capacities ---------------------------------------------------------------------

    def calibrated(self, capacities) -> Exchange:
        """This exchange with `capacities` ({request length: capacity}) added to its own."""
        return self._with(capacities={**self.capacities, **{
            int(k): int(v) for k, v in dict(capacities).items()}})

    def fitted(self, stats) -> Exchange:
        """This exchange with the capacity of every request length in `stats`
        (`ExchangeStats` leaves, on the host, e.g. of a training step's first batches)
        set to the largest need measured there plus headroom: calibrated sizing's
        capacities, higher or lower than before. Itself on one device (nothing moves).

        Where gathers relay, a gather length whose batches' routings sent no row
        through a third device (traffic even enough that relaying would move nothing
        less) is recorded under minus its length instead: such gathers then move
        straight, with the scatters (`scatter_key`), and the relay is not compiled
        for them."""
        if self.num_parts == 1:
            return self
        fresh, straight = {}, set()
        for length, (needed, _, relayed) in self._needs(stats).items():
            key = length
            if self.relays and length > 0 and not relayed:
                key = -length             # shared with a scatter of that length, if any
                straight.add(length)
            fresh[key] = max(fresh.get(key, 0), with_headroom(needed, self.config.headroom))
        capacities = {k: v for k, v in self.capacities.items() if k not in straight}
        capacities.update(fresh)
        return self._with(capacities=capacities)

    def grown(self, stats) -> Exchange:
        """This exchange with the capacity of every request length that needed more
        (`ExchangeStats` leaves of `stats`, on the host, with `needed` > `capacity`)
        set to that need plus headroom; itself if none did. Under the scheduled
        strategy only its scatters' capacities grow: its gathers' chunks loop as often
        as a request needs (that is its schedule, not an overflow)."""
        scheduled = self.config.strategy is Strategy.SCHEDULED
        want = {length: with_headroom(needed, self.config.headroom)
                for length, (needed, over, _) in self._needs(stats).items()
                if over and (length < 0 or not scheduled)}
        want = {k: v for k, v in want.items() if v > self.capacities.get(k, 0)}
        return self.calibrated(want) if want else self

    @staticmethod
    def _needs(stats) -> dict[int, tuple[int, bool, int]]:
        """{request length: (the largest need, whether any exchange of that length
        needed more than its capacity, the rows they relayed)} over the
        `ExchangeStats` leaves of `stats`."""
        out = {}
        for st in exchange_stats(stats):
            length, needed = int(st.length), int(st.needed)
            if length != 0:
                most, over, relayed = out.get(length, (0, False, 0))
                out[length] = (max(most, needed), over or needed > int(st.capacity),
                               relayed + int(st.relayed))
        return out

    def capacity(self, transfer: Transfer, one_round: bool = False) -> int:
        """The static capacity of `transfer`'s rounds: its need as measured (calibrated
        sizing, never above `transfer.limit()`) or estimated from `ExchangeConfig.cut`,
        or its top (bound sizing); never above what one round can need (`top`) nor
        `ExchangeConfig.max_capacity`.

        one_round: the transfer has no later rounds (a scatter_add's): its measured
        need (planned: its estimate), not limited, or else its top, since an estimate
        that falls short would lose values (a training run measures every length its
        step sends)."""
        config, top = self.config, transfer.top
        if config.sizing is Sizing.BOUND or (one_round and not self._measured(transfer)):
            cap = top
        else:
            if transfer.n in self.capacities:
                cap = self.capacities[transfer.n]
            else:
                cut = (config.cut if config.cut is not None
                       else (self.num_parts - 1) / self.num_parts)
                cap = with_headroom(transfer.estimate(cut * transfer.n), config.headroom)
            if not one_round:
                cap = min(cap, transfer.limit())
        if config.max_capacity is not None:
            cap = min(cap, config.max_capacity)
        return max(min(cap, top), 1)

    def _measured(self, transfer: Transfer) -> bool:
        """Whether `transfer`'s request length is sized as measured: a capacity was
        measured for it, or the exchange is planned (its estimate taken as measured)."""
        return transfer.n in self.capacities or self.planned

    def _transfers(self, plan: Plan, gather: bool = False) -> list[Transfer]:
        """The plan's transfers, none on a one-device mesh (where every id is local);
        a gather's relayed where the exchange `relays`."""
        if self.num_parts == 1:
            return []
        strategy = self.config.strategy
        if gather and self.relays:
            return Relay.transfers(plan, self.axis, self.offsets)
        if strategy is Strategy.SCHEDULED:       # its rounds of device pairs
            return TRANSPORTS[strategy](plan, self.axis, self.offsets, schedule=self.schedule)
        return TRANSPORTS[strategy](plan, self.axis, self.offsets)

    def ladder(self, transfer: Transfer, top: int) -> tuple[int, ...]:
        """The capacities `transfer`'s first round picks from, the largest `top`: a
        measured capacity alone (it is the need plus headroom: rungs below it would
        save little wire and cost a compiled branch each; measured on the 200k-node
        graph's 8-device step, one rung compiled in 7.1 s where four took 9.4 s), else
        the ladder below an estimated or bound top. A chunked or unladdered transfer's
        one capacity alone."""
        if transfer.chunked or not transfer.laddered or (
                self._measured(transfer) and self.config.sizing is Sizing.CALIBRATED):
            return (top,)
        return self.config.ladder(top)

    def rung(self, need, ladder: tuple[int, ...]) -> jnp.ndarray:
        """Index of the smallest rung of `ladder` >= the devices' largest need (the top
        one if none is): the same on every device."""
        return jnp.minimum(jnp.searchsorted(jnp.asarray(ladder), lax.pmax(need, self.axis)),
                           len(ladder) - 1)

    def switch(self, need, ladder: tuple[int, ...], branch: Callable[[int], PyTree],
               rung=None) -> tuple[PyTree, jnp.ndarray]:
        """(`branch(cap)`, cap) for the smallest rung of `ladder` >= the devices' largest
        need, or for the given rung index, which every device must agree on. Each rung
        is a compiled branch; `lax.switch` runs the one picked."""
        if len(ladder) == 1:
            return branch(ladder[0]), jnp.int32(ladder[0])
        if rung is None:
            rung = self.rung(need, ladder)
        cap = jnp.asarray(ladder, jnp.int32)[rung]
        return lax.switch(rung, [lambda c=c: branch(c) for c in ladder]), cap

    def _later_rounds(self, transfer: Transfer, cap: int, one_round, carry):
        """(carry, rounds): `one_round(offset, carry) -> carry` run for every round after
        the first that the devices' largest need asks for at `cap` (none where `cap`
        holds every request: then `rounds` is 1 without looking). A chunked transfer
        always loops, and counts as one round."""
        if cap >= transfer.top and not transfer.chunked:
            return carry, jnp.int32(1)
        rounds = transfer.rounds(cap)
        carry = lax.fori_loop(1, rounds, lambda r, c: one_round(r * cap, c), carry)
        return carry, jnp.int32(1) if transfer.chunked else rounds

    def _round_wire(self, transfer: Transfer, first, cap: int, rounds, fwd: int, ans: int):
        """Bytes this device sends over all rounds: the first at its rung, the rest at
        `cap` (exact-size transports count every round in one figure)."""
        if transfer.exact_wire:
            return transfer.wire(cap, fwd, ans)
        return first + transfer.wire(cap, fwd, ans) * (rounds - 1).astype(jnp.float32)

    def _stats(self, plan, caps, wire, overflow, needs=(), rounds=(), relayed=()
               ) -> ExchangeStats:
        """Sum this device's counters over devices: the plan's tally, the overflow and
        the relayed rows in one all-reduce, the wire bytes in another, the maxima in a
        third (every stack and slice around them is a kernel to compile)."""
        axis = self.axis
        requested, non_local, cached, out_of_range, overflow, relayed = lax.psum(
            jnp.concatenate([plan.tally, jnp.stack([jnp.asarray(overflow, jnp.int32),
                                                    sum(relayed, jnp.int32(0))])]), axis)
        wire = lax.psum(wire, axis)
        largest = lambda xs: jnp.max(jnp.stack([jnp.asarray(x, jnp.int32) for x in xs])
                                     ) if xs else jnp.int32(0)
        capacity, needed, rounds = lax.pmax(
            jnp.stack([largest(list(caps)), largest(list(needs)), largest(list(rounds))]),
            axis)
        return ExchangeStats(
            requested=requested, non_local=non_local, cached=cached, capacity=capacity,
            wire_bytes=wire, overflow=overflow, out_of_range=out_of_range,
            length=jnp.zeros_like(requested) + plan.size, needed=needed, rounds=rounds,
            relayed=relayed)

    # -- the remote answers of a gather ----------------------------------------------------

    def _answer_per_rung(self, plan: Plan, transfers: list[Transfer], owner_fn: OwnerFn,
                         like: PyTree):
        """(remote answers in compact order [n], caps, wire bytes, needs, rounds), with
        `owner_fn` traced inside every rung's branch of every transfer and in its later
        rounds. Each transfer writes into the one buffer, so memory does not grow with
        the number of transfers (the ring has P - 1)."""
        remote = jax.tree.map(jnp.zeros_like, like)
        filled = jnp.zeros_like(plan.valid)     # typed as varying, as a loop carry must be
        ans_bytes = row_bytes(like)
        caps, wire, needs, rounds = [], jnp.float32(0), [], []
        for transfer in transfers:
            top = self.capacity(transfer)
            ladder = self.ladder(transfer, top)

            def one_round(cap, offset, into, transfer=transfer):
                sent = transfer.send(cap, offset=offset)
                return transfer.back(sent, owner_fn(jnp.maximum(sent.ids, 0), sent.mask),
                                     into, offset)
            def branch(cap, transfer=transfer, into=(remote, filled), one_round=one_round):
                return one_round(cap, 0, into), transfer.wire(cap, 4, ans_bytes)
            if len(ladder) == 1 and (top < transfer.top or transfer.chunked):
                # One capacity that may take rounds: every round, the first included, in
                # one loop (one traced copy of the transfer and `owner_fn`, not two).
                n_rounds = transfer.rounds(top)
                remote, filled = lax.fori_loop(
                    0, n_rounds, lambda r, into, f=one_round, c=top: f(c, r * c, into),
                    (remote, filled))
                first, cap = transfer.wire(top, 4, ans_bytes), jnp.int32(top)
                if transfer.chunked:
                    n_rounds = jnp.int32(1)
            else:
                ((remote, filled), first), cap = self.switch(transfer.need, ladder, branch)
                (remote, filled), n_rounds = self._later_rounds(
                    transfer, top, lambda offset, into, f=one_round, c=top: f(c, offset, into),
                    (remote, filled))
            caps.append(cap)
            needs.append(transfer.need)
            rounds.append(n_rounds)
            wire = wire + self._round_wire(transfer, first, top, n_rounds, 4, ans_bytes)
        return remote, caps, wire, needs, rounds

    def _answer_once(self, plan: Plan, transfers: list[Transfer], owner_fn: OwnerFn):
        """`gather`'s answers with `owner_fn` compiled once per transfer's first round:
        (answers to this device's own ids [n] (zero where not local), remote answers in
        compact order [n], caps, wire bytes, needs, rounds).

        Each transfer's first round goes through the ladder twice: its ids to the owners
        (the branch returns them padded to the capacity's length), then the answers
        back (the branch takes its rung's part of them). Between the two, outside every
        branch, each device answers its own ids and all those it received in one
        `answer_filled`: a loop over only the chunks that hold ids, so the work follows
        what arrived, not the capacity. Later rounds, if any, answer in a loop."""
        n = plan.size
        legs = []
        for transfer in transfers:
            top = self.capacity(transfer)
            ladder = self.ladder(transfer, top)
            rung = self.rung(transfer.need, ladder) if len(ladder) > 1 else None
            length = transfer.received_length(top)

            def forward(cap, transfer=transfer, length=length):
                sent = transfer.send(cap)
                ids = jnp.where(sent.mask, sent.ids, -1)
                return jnp.pad(ids, (0, length - ids.shape[0]), constant_values=-1)
            received, cap = self.switch(transfer.need, ladder, forward, rung=rung)
            legs.append((transfer, top, ladder, rung, received, cap))
        own = jnp.where(plan.local, plan.uniq, -1)
        answers = answer_filled(owner_fn, jnp.concatenate([own] + [leg[4] for leg in legs]))
        local = jax.tree.map(lambda a: a[:n], answers)
        remote = jax.tree.map(jnp.zeros_like, local)
        filled = jnp.zeros(n, bool)
        ans_bytes = row_bytes(local)
        caps, wire, needs, rounds, start = [], jnp.float32(0), [], [], n
        for transfer, top, ladder, rung, received, cap in legs:
            mine = jax.tree.map(lambda a, s=start, k=received.shape[0]: a[s:s + k], answers)
            start += received.shape[0]

            def back(cap, transfer=transfer, received=received, mine=mine,
                     into=(remote, filled)):
                k = transfer.received_length(cap)
                sent = transfer.send(cap, received=received[:k])
                got = transfer.back(sent, jax.tree.map(lambda a: a[:k], mine), into)
                return got, transfer.wire(cap, 4, ans_bytes)
            ((remote, filled), first), _ = self.switch(transfer.need, ladder, back, rung=rung)

            def one_round(offset, into, transfer=transfer, top=top):
                sent = transfer.send(top, offset=offset)
                got = owner_fn(jnp.maximum(sent.ids, 0), sent.mask)
                return transfer.back(sent, got, into, offset)
            (remote, filled), n_rounds = self._later_rounds(transfer, top, one_round,
                                                            (remote, filled))
            caps.append(cap)
            needs.append(transfer.need)
            rounds.append(n_rounds)
            wire = wire + self._round_wire(transfer, first, top, n_rounds, 4, ans_bytes)
        return local, remote, caps, wire, needs, rounds

    def _answer_looped(self, plan: Plan, transfers: list[Transfer], owner_fn: OwnerFn):
        """`_answer_once`'s results where every transfer has one measured capacity:
        every round of every transfer, the first included, in one loop whose round r
        moves each transfer's ids from r x its capacity on, and whose first round also
        answers this device's own ids. `owner_fn` is traced once (in `answer_filled`),
        where the ladder's paths trace it once for the first round and again for the
        later ones; a round after a transfer's last sends nothing."""
        n = plan.size
        caps = [self.capacity(t) for t in transfers]
        own = jnp.where(plan.local, plan.uniq, -1)
        rounds = jnp.max(jnp.stack([t.rounds(c) for t, c in zip(transfers, caps)]))
        length = n + sum(t.received_length(c) for t, c in zip(transfers, caps))
        shapes = answer_shapes(owner_fn, length, own)    # the trace answer_filled reuses
        zero = own[0] * 0        # typed like the ids (mesh-varying), as a loop carry must be
        local = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype)
                             + zero.astype(x.dtype), shapes)
        remote, filled = jax.tree.map(jnp.zeros_like, local), jnp.zeros(n, bool) | (zero > 0)

        def one_round(r, carry):
            local, remote, filled = carry
            sent = [t.send(c, offset=r * c) for t, c in zip(transfers, caps)]
            asked = [jnp.where(r == 0, own, -1)] + [jnp.where(d.mask, d.ids, -1) for d in sent]
            got = answer_filled(owner_fn, jnp.concatenate(asked))
            local = select(jnp.broadcast_to(r == 0, (n,)),
                           jax.tree.map(lambda a: a[:n], got), local)
            start = n
            for t, d in zip(transfers, sent):
                k = d.ids.shape[0]
                mine = jax.tree.map(lambda a, s=start, k=k: a[s:s + k], got)
                remote, filled = t.back(d, mine, (remote, filled), r * d.cap)
                start += k
            return local, remote, filled
        local, remote, filled = lax.fori_loop(0, rounds, one_round, (local, remote, filled))
        ans_bytes = row_bytes(local)
        wire = sum((t.wire(c, 4, ans_bytes) if t.exact_wire else
                    t.wire(c, 4, ans_bytes) * rounds.astype(jnp.float32))
                   for t, c in zip(transfers, caps))
        # A chunked transfer's loop is its schedule: one round as far as growing goes.
        reported = jnp.int32(1) if all(t.chunked for t in transfers) else rounds
        return (local, remote, [jnp.int32(c) for c in caps], wire,
                [t.need for t in transfers], [reported])

    # -- the two operations ----------------------------------------------------------

    def gather(self, ids, valid, owner_fn: OwnerFn, *, cache=None, contains=None,
               distinct: bool = False, once: bool = False) -> tuple[PyTree, ExchangeStats]:
        """Answers of `owner_fn` for each id, in request order; zero where not valid.

        ids: int[n] global node ids; valid: bool[n]. cache: optional `(cache_ids
        int32[C] sorted, values)` with `values` shaped like `owner_fn`'s answers for
        those ids, replicated on every device. contains: optional `ids -> bool[n]`; ids
        it rejects are counted in `out_of_range` and answered with zeros. distinct: the
        valid ids are known to be distinct (a sampler's frontier), so the deduplicating
        sort is skipped; repeated ids would then be routed, and answered, more than once.
        once: run `owner_fn` once, outside the capacity ladder, instead of once per rung
        inside it (see `_answer_once`): for owner functions that are costly to compile
        and answer narrow rows, as the sampler's draws. Such a gather never relays.

        Every answer arrives whatever the capacities: a transfer that needs more than
        its capacity moves in rounds (`ExchangeStats.rounds`).
        """
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        if cache is not None and cache[0].shape[0] == 0:
            cache = None            # an empty cache answers nothing
        cache_ids, cache_values = cache if cache is not None else (None, None)
        if self.num_parts == 1 and distinct:
            return self._only_device(ids, valid, owner_fn, out_of_range)
        if self.relays and (once or self._straight(ids.shape[0])):
            # straight, sized as the scatters are (scatter_key)
            answers, stats = self._scatters().gather(ids, valid, owner_fn, cache=cache,
                                                     contains=contains, distinct=distinct,
                                                     once=once)
            return answers, stats._replace(length=self.scatter_key(stats.length))
        plan = make_plan(ids, valid, self.offsets, self.axis, cache_ids, distinct,
                         out_of_range)
        transfers = self._transfers(plan, gather=True)
        measured = all(len(self.ladder(t, self.capacity(t))) == 1 for t in transfers)
        if once and transfers:
            answer = self._answer_looped if measured else self._answer_once
            answers, remote_answers, caps, wire, needs, rounds = answer(plan, transfers,
                                                                        owner_fn)
        else:
            answers = owner_fn(plan.uniq, plan.local)
            remote_answers, caps, wire, needs, rounds = self._answer_per_rung(
                plan, transfers, owner_fn, answers)
        if cache_values is not None:
            answers = select(plan.cached, take(cache_values, plan.cache_pos, plan.cached),
                             answers)
        answers = select(plan.remote, take(remote_answers, plan.slot, plan.remote), answers)
        if distinct:                # uniq is the request itself (inverse: the identity)
            answers = select(plan.valid, answers, jax.tree.map(jnp.zeros_like, answers))
        else:
            answers = take(answers, plan.inverse, plan.valid[plan.inverse] & valid)
        relayed = [t.relayed for t in transfers if isinstance(t, Relay)]
        return answers, self._stats(plan, caps, wire, jnp.int32(0), needs, rounds, relayed)

    def scatter_add(self, ids, valid, values, *, contains=None
                    ) -> tuple[tuple[jnp.ndarray, PyTree, jnp.ndarray], ExchangeStats]:
        """Transpose of `gather`: send each value to its id's owner and sum per id there.

        ids: int[n]; valid: bool[n]; values: pytree of [n, ...]. Returns, on each owner,
        `(owned_ids int32[M], sums [M, ...], mask bool[M])`: the distinct ids it owns that
        any device sent (sorted, padding where mask is False) with the sum of their
        values. M is static: n plus what the transfers deliver at their capacities.
        One round only: ids past a capacity are counted in `overflow`, not summed.
        Under the scheduled strategy, and where gathers relay, it moves as the plain
        all_to_all does, sized as its own (`scatter_key`).
        """
        if self.scatter_key(1) != 1:
            out, stats = self._scatters().scatter_add(ids, valid, values, contains=contains)
            return out, stats._replace(length=self.scatter_key(stats.length))
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        plan = make_plan(ids, valid, self.offsets, self.axis, out_of_range=out_of_range)
        n = ids.shape[0]
        values = jax.tree.map(lambda x: jnp.where(
            valid.reshape((n,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype)), values)
        summed = jax.tree.map(lambda x: jax.ops.segment_sum(x, plan.inverse, num_segments=n),
                              values)
        payload = put(n, summed, plan.slot, plan.remote)            # compact order
        pay_bytes = row_bytes(summed)
        parts_ids, parts_vals = [jnp.where(plan.local, plan.uniq, -1)], [summed]
        caps, wire, overflow, needs = [], jnp.float32(0), jnp.int32(0), []
        for transfer in self._transfers(plan):
            top = self.capacity(transfer, one_round=True)
            length = transfer.received_length(top)   # every branch's, as lax.switch needs

            def branch(cap, transfer=transfer, length=length):
                sent = transfer.send(cap, payload)
                pad = length - sent.ids.shape[0]
                got_ids = jnp.pad(jnp.where(sent.mask, sent.ids, -1), (0, pad),
                                  constant_values=-1)
                got = jax.tree.map(lambda x: jnp.pad(
                    x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), sent.payload)
                return got_ids, got, sent.overflow, transfer.wire(cap, 4 + pay_bytes, 0)
            (got_ids, got, lost, w), cap = self.switch(transfer.need,
                                                       self.ladder(transfer, top), branch)
            parts_ids.append(got_ids)
            parts_vals.append(got)
            caps.append(cap)
            needs.append(transfer.need)
            wire, overflow = wire + w, overflow + lost
        all_ids = jnp.concatenate(parts_ids)
        all_vals = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts_vals)
        m = all_ids.shape[0]
        owned, inverse = jnp.unique(jnp.where(all_ids >= 0, all_ids, EMPTY), size=m,
                                    fill_value=EMPTY, return_inverse=True)
        sums = jax.tree.map(lambda x: jax.ops.segment_sum(x, inverse.reshape(-1), num_segments=m),
                            all_vals)
        mask = owned != EMPTY
        one = [jnp.int32(1)] if caps else []
        return (jnp.where(mask, owned, -1), sums, mask), self._stats(
            plan, caps, wire, overflow, needs=needs, rounds=one)

    def scatter_rows(self, ids, valid, values, rows: int, *, contains=None
                     ) -> tuple[PyTree, ExchangeStats]:
        """`gather`'s transpose into dense tables: every value (pytree of [n, ...]) is
        added to its id's row of the owner's table of `rows` rows (local row = id - the
        owner's first id), summed over every device that sent one. Returns (tables, stats): tables a
        pytree of [rows, ...] on each owner. Every id moves: a transfer whose
        need exceeds its capacity moves in as many rounds as it needs, never
        recompiled, never dropped (what full-batch training's backward pass sends back
        to the owners of the rows a window fetched). The scheduled strategy, and
        all_to_all where gathers relay, move them as the plain all_to_all does, sized as
        their own (`scatter_key`)."""
        if self.scatter_key(1) != 1:
            tables, stats = self._scatters().scatter_rows(ids, valid, values, rows,
                                                          contains=contains)
            return tables, stats._replace(length=self.scatter_key(stats.length))
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        plan = make_plan(ids, valid, self.offsets, self.axis, out_of_range=out_of_range)
        n = ids.shape[0]
        base = jnp.asarray(self.offsets, jnp.int32)[lax.axis_index(self.axis)]
        values = jax.tree.map(lambda x: jnp.where(
            valid.reshape((n,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype)), values)
        summed = jax.tree.map(lambda x: jax.ops.segment_sum(x, plan.inverse, num_segments=n),
                              values)

        def add(tables, owned, ok, sums):
            at = jnp.where(ok, owned - base, rows)                  # rows: dropped
            return jax.tree.map(lambda t, x: t.at[at].add(x, mode="drop"), tables, sums)

        tables = jax.tree.map(lambda x: jnp.zeros((rows,) + x.shape[1:], x.dtype), summed)
        tables = add(tables, plan.uniq, plan.local, summed)
        payload = put(n, summed, plan.slot, plan.remote)            # compact order
        pay_bytes = row_bytes(summed)
        caps, wire, needs, rounds = [], jnp.float32(0), [], []
        for transfer in self._transfers(plan):
            cap = self.capacity(transfer)

            def one_round(r, tables, transfer=transfer, cap=cap):
                sent = transfer.send(cap, payload, offset=r * cap)
                return add(tables, sent.ids, sent.mask, sent.payload)
            n_rounds = transfer.rounds(cap)
            tables = lax.fori_loop(0, n_rounds, one_round, tables)
            caps.append(jnp.int32(cap))
            needs.append(transfer.need)
            rounds.append(n_rounds)
            wire = wire + self._round_wire(transfer, transfer.wire(cap, 4 + pay_bytes, 0),
                                           cap, n_rounds, 4 + pay_bytes, 0)
        return tables, self._stats(plan, caps, wire, jnp.int32(0), needs=needs,
                                   rounds=rounds)

    def gather_local(self, ids, valid, owner_fn: OwnerFn, *, contains=None
                     ) -> tuple[PyTree, ExchangeStats]:
        """`gather` for ids this device owns (a loader's seeds, which live with their
        partition): answered here, with no communication and nothing to compile per
        rung. Valid ids owned elsewhere are not answered: they are counted in
        `out_of_range` (so `ExchangeStats.check` raises), never dropped silently."""
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        mine = self.owner(ids) == lax.axis_index(self.axis)
        return self._only_device(ids, valid & mine, owner_fn, out_of_range | (valid & ~mine))

    def _only_device(self, ids, valid, owner_fn, out_of_range):
        """Every valid id is local: nothing to plan or route."""
        answers = owner_fn(ids, valid)
        answers = select(valid, answers, jax.tree.map(jnp.zeros_like, answers))
        # Counts are psum-ed so they are typed as replicated, like gather's.
        count = lambda m: lax.psum(jnp.sum(m, dtype=jnp.int32), self.axis)
        zero = count(jnp.zeros((), bool))
        return answers, ExchangeStats(
            requested=count(valid), non_local=zero, cached=zero, capacity=zero,
            wire_bytes=zero.astype(jnp.float32), overflow=zero, out_of_range=count(out_of_range),
            length=zero + ids.shape[0], needed=zero, rounds=zero, relayed=zero)

    def _screen(self, ids, valid, contains):
        """Drop ids outside the graph (or outside `contains`), counting them."""
        valid = valid.astype(bool)
        ok = (ids >= 0) & (ids < int(self.offsets[-1]))
        if contains is not None:
            ok = ok & contains(ids)
        return valid & ok, valid & ~ok


def with_headroom(need: float, headroom: float) -> int:
    """A capacity for `need`: times 1 + headroom, rounded up to a multiple of 8."""
    return max(-(-math.ceil(need * (1 + headroom)) // 8) * 8, 8)


def exchange_stats(tree) -> list[ExchangeStats]:
    """The `ExchangeStats` in a pytree (a step's metrics), in order."""
    return [leaf for leaf in jax.tree.leaves(
        tree, is_leaf=lambda x: isinstance(x, ExchangeStats)) if isinstance(leaf, ExchangeStats)]
