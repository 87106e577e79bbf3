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
capacity (shapes are fixed at trace time), kept and sized in `sizing.py` (measured per
request on the first batches, else estimated). The first round's capacity comes from a
short ladder of rungs below it (all devices agree on the rung with `pmax`; `lax.switch`
runs the branch compiled for it, so small requests move small buffers); a gather that
needs more than the capacity moves the rest in further rounds of the same buffers, so
nothing is ever dropped and nothing recompiles. `scatter_add` moves one round: what does
not fit is counted in `ExchangeStats.overflow`, never silently (host-side callers raise
`ExchangeOverflowError`; the training step is refused and run again after the capacity
grows). `scatter_rows` moves every value, in rounds.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange import ragged
from jgraph.exchange.all_gather import AllGather
from jgraph.exchange.all_to_all import AllToAll
from jgraph.exchange.config import ExchangeConfig, Strategy
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
from jgraph.exchange.sizing import Capacities, Key, Route
from jgraph.exchange.stats import ExchangeStats
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


class Tally:
    """What an operation's transfers used, for its `ExchangeStats`: each one's capacity,
    need and rounds, and the bytes this device sent over all of them."""

    def __init__(self):
        self.caps, self.needs, self.rounds, self.wire = [], [], [], jnp.float32(0)

    def add(self, transfer: Transfer, cap, rounds, wire) -> None:
        self.caps.append(cap)
        self.needs.append(transfer.need)
        self.rounds.append(rounds)
        self.wire = self.wire + wire


class Exchange:
    """Owner-routed exchange over the partitions of a `PartitionBook`.

    Static (not a pytree): build it on the host and close over it in the step.
    """

    def __init__(self, offsets, config: ExchangeConfig = ExchangeConfig(), axis: str = AXIS,
                 platform: str | None = None, capacities=None, pair_weights=None,
                 planned: bool = False, route: Route = Route.OWN):
        """platform: of the devices it runs on (a mesh's `devices.flat[0].platform`, or
        the platform a program is built for); it resolves `Strategy.AUTO` and refuses
        ragged_all_to_all on "cpu". None: unknown (AUTO is then all_to_all).
        capacities: {`Key` or its text: capacity} measured for calibrated sizing (see
        `jgraph.exchange.sizing`); keys not in it are estimated. pair_weights: float[P,
        P], the ids partition k is expected to ask of partition j (`DistGraph.exchange`
        counts its halos); the scheduled strategy groups its device pairs by them
        (without: the P - 1 shifts). planned: `Capacities.planned` (a program built from
        counts, `jgraph compile --abstract`). route: the way this exchange's requests
        move, the key its capacities are looked up under (STRAIGHT: the plain
        all_to_all a relaying or scheduled exchange hands its scatters to)."""
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
        self.sizes = Capacities(self.config, self.num_parts, capacities or {}, planned)
        self.pair_weights = None if pair_weights is None else np.asarray(pair_weights)
        self.route = route
        self._schedule = None

    @property
    def capacities(self) -> dict[Key, int]:
        """The capacities measured ({Key: capacity}; `jgraph.exchange.sizing.dump` for
        JSON)."""
        return dict(self.sizes.measured)

    @property
    def planned(self) -> bool:
        return self.sizes.planned

    @property
    def schedule(self) -> np.ndarray:
        """int32[R, P] the scheduled strategy's rounds of device pairs
        (`jgraph.exchange.scheduled.build_schedule`), built once and shared by copies."""
        if self._schedule is None:
            self._schedule = build_schedule(self.num_parts, self.pair_weights)
        return self._schedule

    def _with(self, config: ExchangeConfig | None = None, sizes: Capacities | None = None,
              route: Route | None = None) -> Exchange:
        """A copy with another config, capacities or route (pair weights and schedule
        kept)."""
        sizes = sizes or self.sizes
        copy = Exchange(self.offsets, config or self.config, self.axis, self.platform,
                        sizes.measured, self.pair_weights, sizes.planned,
                        route or self.route)
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

    @property
    def scatters_straight(self) -> bool:
        """Whether scatters (`scatter_add`, `scatter_rows`) move otherwise than gathers:
        under the scheduled strategy (a scatter's values cannot loop into a buffer of
        static shape in chunks: they move as all_to_all's, whose capacity is a device
        pair's load, while a gather's of the same length is a chunk) and where gathers
        relay (a scatter goes straight: its capacity is the busiest pair's, a relayed
        gather's the busiest hop pair's). Their capacities are then kept under
        `Route.STRAIGHT`, and so are those of the gathers that go straight where
        gathers relay (`once`, or calibrated straight: `Capacities.fitted`)."""
        return self.config.strategy is Strategy.SCHEDULED or self.relays

    def key(self, length: int) -> Key:
        """The key of this exchange's requests of `length` ids."""
        return Key(self.route, length)

    def _straight(self) -> Exchange:
        """The plain all_to_all exchange that scatters (and, where gathers relay, the
        gathers that go straight) move through where `scatters_straight`, with the same
        capacities looked up under `Route.STRAIGHT`."""
        return self._with(dataclasses.replace(self.config, strategy=Strategy.ALL_TO_ALL,
                                              relay=False), route=Route.STRAIGHT)

    # -- capacities (`jgraph.exchange.sizing`) ------------------------------------------

    def calibrated(self, capacities) -> Exchange:
        """This exchange with `capacities` ({key or its text: capacity}) added to its own."""
        return self._with(sizes=self.sizes.calibrated(capacities))

    def fitted(self, stats) -> Exchange:
        """This exchange with the capacity of every key in `stats` (`ExchangeStats`
        leaves, on the host, e.g. of a training step's first batches) set to the largest
        need measured there plus headroom (`Capacities.fitted`): calibrated sizing's
        capacities, higher or lower than before. Itself on one device (nothing moves)."""
        if self.num_parts == 1:
            return self
        return self._with(sizes=self.sizes.fitted(stats, self.relays))

    def grown(self, stats) -> Exchange:
        """This exchange with the capacity of every key that needed more (`ExchangeStats`
        leaves of `stats`, on the host) set to that need plus headroom; itself if none
        did. Under the scheduled strategy only its scatters' capacities grow: its
        gathers' chunks loop as often as a request needs (`Capacities.grown`)."""
        sizes = self.sizes.grown(stats, self.config.strategy is Strategy.SCHEDULED)
        return self if sizes is self.sizes else self._with(sizes=sizes)

    def capacity(self, transfer: Transfer, one_round: bool = False) -> int:
        """`transfer`'s static capacity (`Capacities.capacity`)."""
        return self.sizes.capacity(transfer, self.key(transfer.n), one_round)

    def ladder(self, transfer: Transfer, top: int) -> tuple[int, ...]:
        """The rungs `transfer`'s first round picks from (`Capacities.ladder`)."""
        return self.sizes.ladder(transfer, self.key(transfer.n), top)

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

    def _stats(self, plan, tally: Tally, overflow=0, relayed=()) -> ExchangeStats:
        """Sum this device's counters over devices: the plan's tally, the overflow and
        the relayed rows in one all-reduce, the wire bytes in another, the maxima in a
        third (every stack and slice around them is a kernel to compile)."""
        axis = self.axis
        requested, non_local, cached, out_of_range, overflow, relayed = lax.psum(
            jnp.concatenate([plan.tally, jnp.stack([jnp.asarray(overflow, jnp.int32),
                                                    sum(relayed, jnp.int32(0))])]), axis)
        wire = lax.psum(tally.wire, axis)
        largest = lambda xs: jnp.max(jnp.stack([jnp.asarray(x, jnp.int32) for x in xs])
                                     ) if xs else jnp.int32(0)
        capacity, needed, rounds = lax.pmax(
            jnp.stack([largest(tally.caps), largest(tally.needs), largest(tally.rounds)]),
            axis)
        return ExchangeStats(
            requested=requested, non_local=non_local, cached=cached, capacity=capacity,
            wire_bytes=wire, overflow=overflow, out_of_range=out_of_range,
            length=jnp.zeros_like(requested) + plan.size,
            route=jnp.zeros_like(requested) + self.route.code, needed=needed,
            rounds=rounds, relayed=relayed)

    # -- a gather's answers ---------------------------------------------------------------

    def _round(self, transfer: Transfer, cap: int, owner_fn: OwnerFn, offset, into):
        """One round of `transfer` at `cap` from `offset`: its ids to their owners,
        `owner_fn`'s answers there, and back into `into` = (answers, filled)."""
        sent = transfer.send(cap, offset=offset)
        return transfer.back(sent, owner_fn(jnp.maximum(sent.ids, 0), sent.mask), into,
                             offset)

    def _answers(self, plan: Plan, transfers: list[Transfer], owner_fn: OwnerFn,
                 once: bool) -> tuple[PyTree, PyTree, Tally]:
        """A gather's answers: (to this device's own ids [n], zero where not local; the
        remote ones in compact order [n]; the `Tally` of its transfers). Every transfer
        writes into one buffer of remote answers, so memory does not grow with the
        number of transfers (the ring has P - 1).

        Each transfer's first round is one of three, by what compiles least:
        - `owner_fn` inside each rung's branch of the ladder (`once` false); a transfer
          of one capacity that may take rounds runs every round, the first included, in
          one loop (one traced copy of the transfer and `owner_fn`, not two);
        - `once`: through the ladder twice, its ids to the owners (the branch returns
          them padded to the capacity's length), then the answers back (the branch
          takes its rung's part of them); between the two, outside every branch, each
          device answers its own ids and all those it received in one `answer_filled`,
          a loop over only the chunks that hold ids, so the work follows what arrived;
        - `once`, every transfer measured at one capacity: `_answers_looped`.
        Later rounds, if any, run `_round` in a loop."""
        tally = Tally()
        if once and all(len(self.ladder(t, self.capacity(t))) == 1 for t in transfers):
            return self._answers_looped(plan, transfers, owner_fn, tally)
        n = plan.size
        firsts = []                        # per transfer: (top, ladder, rung, received)
        for transfer in transfers:
            top = self.capacity(transfer)
            ladder = self.ladder(transfer, top)
            rung = self.rung(transfer.need, ladder) if once and len(ladder) > 1 else None
            received = None
            if once:
                length = transfer.received_length(top)

                def forward(cap, transfer=transfer, length=length):
                    sent = transfer.send(cap)
                    ids = jnp.where(sent.mask, sent.ids, -1)
                    return jnp.pad(ids, (0, length - ids.shape[0]), constant_values=-1)
                received, _ = self.switch(transfer.need, ladder, forward, rung=rung)
            firsts.append((top, ladder, rung, received))
        if once:
            own = jnp.where(plan.local, plan.uniq, -1)
            everything = answer_filled(owner_fn, jnp.concatenate(
                [own] + [first[3] for first in firsts]))
            local = jax.tree.map(lambda a: a[:n], everything)
        else:
            local = owner_fn(plan.uniq, plan.local)
        # typed as varying, as a loop carry must be
        into = (jax.tree.map(jnp.zeros_like, local), jnp.zeros_like(plan.valid))
        ans_bytes, start = row_bytes(local), n
        for transfer, (top, ladder, rung, received) in zip(transfers, firsts):
            later = lambda offset, into, t=transfer, c=top: self._round(t, c, owner_fn,
                                                                        offset, into)
            if once:
                k_all = received.shape[0]
                mine = jax.tree.map(lambda a, s=start, k=k_all: a[s:s + k], everything)
                start += k_all

                def back(cap, transfer=transfer, received=received, mine=mine, into=into):
                    k = transfer.received_length(cap)
                    sent = transfer.send(cap, received=received[:k])
                    got = transfer.back(sent, jax.tree.map(lambda a: a[:k], mine), into)
                    return got, transfer.wire(cap, 4, ans_bytes)
                (into, first), cap = self.switch(transfer.need, ladder, back, rung=rung)
                into, rounds = self._later_rounds(transfer, top, later, into)
            elif len(ladder) == 1 and (top < transfer.top or transfer.chunked):
                rounds = transfer.rounds(top)
                into = lax.fori_loop(0, rounds, lambda r, into, f=later, c=top: f(r * c, into),
                                     into)
                first, cap = transfer.wire(top, 4, ans_bytes), jnp.int32(top)
                if transfer.chunked:
                    rounds = jnp.int32(1)
            else:
                def branch(cap, transfer=transfer, into=into):
                    return (self._round(transfer, cap, owner_fn, 0, into),
                            transfer.wire(cap, 4, ans_bytes))
                (into, first), cap = self.switch(transfer.need, ladder, branch)
                into, rounds = self._later_rounds(transfer, top, later, into)
            tally.add(transfer, cap, rounds,
                      self._round_wire(transfer, first, top, rounds, 4, ans_bytes))
        return local, into[0], tally

    def _answers_looped(self, plan: Plan, transfers: list[Transfer], owner_fn: OwnerFn,
                        tally: Tally) -> tuple[PyTree, PyTree, Tally]:
        """`_answers` where `once` and every transfer has one measured capacity: every
        round of every transfer, the first included, in one loop whose round r moves
        each transfer's ids from r x its capacity on, and whose first round also
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
        tally.wire = sum((t.wire(c, 4, ans_bytes) if t.exact_wire else
                          t.wire(c, 4, ans_bytes) * rounds.astype(jnp.float32))
                         for t, c in zip(transfers, caps))
        tally.caps += [jnp.int32(c) for c in caps]
        tally.needs += [t.need for t in transfers]
        # A chunked transfer's loop is its schedule: one round as far as growing goes.
        tally.rounds.append(jnp.int32(1) if all(t.chunked for t in transfers) else rounds)
        return local, remote, tally

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
        if self.relays and (once or self.sizes.straight(ids.shape[0])):
            # straight, sized as the scatters are (`scatters_straight`)
            return self._straight().gather(ids, valid, owner_fn, cache=cache,
                                           contains=contains, distinct=distinct, once=once)
        plan = make_plan(ids, valid, self.offsets, self.axis, cache_ids, distinct,
                         out_of_range)
        transfers = self._transfers(plan, gather=True)
        answers, remote_answers, tally = self._answers(plan, transfers, owner_fn,
                                                       once and bool(transfers))
        if cache_values is not None:
            answers = select(plan.cached, take(cache_values, plan.cache_pos, plan.cached),
                             answers)
        answers = select(plan.remote, take(remote_answers, plan.slot, plan.remote), answers)
        if distinct:                # uniq is the request itself (inverse: the identity)
            answers = select(plan.valid, answers, jax.tree.map(jnp.zeros_like, answers))
        else:
            answers = take(answers, plan.inverse, plan.valid[plan.inverse] & valid)
        relayed = [t.relayed for t in transfers if isinstance(t, Relay)]
        return answers, self._stats(plan, tally, relayed=relayed)

    def scatter_add(self, ids, valid, values, *, contains=None
                    ) -> tuple[tuple[jnp.ndarray, PyTree, jnp.ndarray], ExchangeStats]:
        """Transpose of `gather`: send each value to its id's owner and sum per id there.

        ids: int[n]; valid: bool[n]; values: pytree of [n, ...]. Returns, on each owner,
        `(owned_ids int32[M], sums [M, ...], mask bool[M])`: the distinct ids it owns that
        any device sent (sorted, padding where mask is False) with the sum of their
        values. M is static: n plus what the transfers deliver at their capacities.
        One round only: ids past a capacity are counted in `overflow`, not summed.
        Under the scheduled strategy, and where gathers relay, it moves as the plain
        all_to_all does, sized as its own (`scatters_straight`).
        """
        if self.scatters_straight:
            return self._straight().scatter_add(ids, valid, values, contains=contains)
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
        tally, overflow = Tally(), jnp.int32(0)
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
            tally.add(transfer, cap, jnp.int32(1), w)
            overflow = overflow + lost
        all_ids = jnp.concatenate(parts_ids)
        all_vals = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts_vals)
        m = all_ids.shape[0]
        owned, inverse = jnp.unique(jnp.where(all_ids >= 0, all_ids, EMPTY), size=m,
                                    fill_value=EMPTY, return_inverse=True)
        sums = jax.tree.map(lambda x: jax.ops.segment_sum(x, inverse.reshape(-1), num_segments=m),
                            all_vals)
        mask = owned != EMPTY
        return (jnp.where(mask, owned, -1), sums, mask), self._stats(plan, tally, overflow)

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
        their own (`scatters_straight`)."""
        if self.scatters_straight:
            return self._straight().scatter_rows(ids, valid, values, rows, contains=contains)
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
        tally = Tally()
        for transfer in self._transfers(plan):
            cap = self.capacity(transfer)

            def one_round(r, tables, transfer=transfer, cap=cap):
                sent = transfer.send(cap, payload, offset=r * cap)
                return add(tables, sent.ids, sent.mask, sent.payload)
            n_rounds = transfer.rounds(cap)
            tables = lax.fori_loop(0, n_rounds, one_round, tables)
            tally.add(transfer, jnp.int32(cap), n_rounds, self._round_wire(
                transfer, transfer.wire(cap, 4 + pay_bytes, 0), cap, n_rounds,
                4 + pay_bytes, 0))
        return tables, self._stats(plan, tally)

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
            length=zero + ids.shape[0], route=zero + self.route.code, needed=zero,
            rounds=zero, relayed=zero)

    def _screen(self, ids, valid, contains):
        """Drop ids outside the graph (or outside `contains`), counting them."""
        valid = valid.astype(bool)
        ok = (ids >= 0) & (ids < int(self.offsets[-1]))
        if contains is not None:
            ok = ok & contains(ids)
        return valid & ok, valid & ~ok

