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

How ids travel is a `Strategy`, carried out by its transport's `Transfer` class
(`transport.py` names the interface; `all_to_all.py`, `all_gather.py`, `ring.py`,
`ragged.py`, `scheduled.py`; `relay.py`, all_to_all's gathers in two routed hops): the
exchange drives every strategy alike, asking the class what differs (which class its
gathers move by, whether its scatters move straight, whether it loops in chunks or
picks a rung). Every transfer has a static capacity (shapes are fixed at trace time),
kept and sized in `sizing.py` (measured per request on the first batches, else
estimated). The first round's capacity comes from a short ladder of rungs below it (all
devices agree on the rung with `pmax`; `lax.switch` runs the branch compiled for it, so
small requests move small buffers); a gather that needs more than the capacity moves
the rest in further rounds of the same buffers, so nothing is ever dropped and nothing
recompiles. One routine answers a gather whatever its rounds (`_answers`), one driver
moves both scatters (`_scatter`): `scatter_add` moves one round, and what does not fit
is counted in `ExchangeStats.overflow`, never silently (host-side callers raise
`ExchangeOverflowError`; the training step is refused and run again after the capacity
grows); `scatter_rows` moves every value, in rounds. What they report is tallied and
summed over devices in `stats.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange.all_gather import AllGather
from jgraph.exchange.all_to_all import AllToAll
from jgraph.exchange.config import ExchangeConfig, Strategy
from jgraph.exchange.plan import EMPTY, Plan, make_plan, owner_of
from jgraph.exchange.ragged import Ragged
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
from jgraph.exchange.scheduled import Scheduled
from jgraph.exchange.sizing import Capacities, Key, Route
from jgraph.exchange.stats import ExchangeStats, Tally
from jgraph.exchange.transport import Transfer, rounds_for
from jgraph.mesh import AXIS

TRANSPORTS: dict[Strategy, type[Transfer]] = {
    Strategy.ALL_TO_ALL: AllToAll,
    Strategy.ALL_GATHER: AllGather,
    Strategy.RING: RingShift,
    Strategy.RAGGED: Ragged,
    Strategy.SCHEDULED: Scheduled,
}
"""Each concrete strategy's `Transfer` class: its transfers of a plan, how they move,
and all the exchange asks of how to drive them (`jgraph.exchange.transport`)."""


class Exchange:
    """Owner-routed exchange over the partitions of a `PartitionBook`.

    Static (not a pytree): build it on the host and close over it in the step.
    """

    def __init__(self, offsets, config: ExchangeConfig = ExchangeConfig(), axis: str = AXIS,
                 platform: str | None = None, capacities=None, pair_weights=None,
                 planned: bool = False, route: Route = Route.OWN):
        """platform: of the devices it runs on (a mesh's `devices.flat[0].platform`, or
        the platform a program is built for); it resolves `Strategy.AUTO` and refuses a
        transport that cannot run there (ragged_all_to_all on "cpu"). None: unknown
        (AUTO is then all_to_all). capacities: {`Key` or its text: capacity} measured
        for calibrated sizing (see `jgraph.exchange.sizing`); keys not in it are
        estimated. pair_weights: float[P, P], the ids partition k is expected to ask of
        partition j (`DistGraph.exchange` counts its halos where the transport is
        `Transfer.weighted`); the scheduled strategy groups its device pairs by them
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
        TRANSPORTS[strategy].check(platform)
        self.config = dataclasses.replace(config, strategy=strategy)
        # The `Transfer` class its gathers move by (and its scatters, unless
        # `scatters_straight`): what it asks of how to drive them, never the strategy.
        self.transport = TRANSPORTS[strategy].gathering(self.config, self.num_parts)
        self.axis = axis
        self.sizes = Capacities(self.config, self.num_parts, capacities or {}, planned)
        self.pair_weights = None if pair_weights is None else np.asarray(pair_weights)
        self.route = route
        self._schedule = None

    @staticmethod
    def pair_weighted(config: ExchangeConfig, platform: str | None) -> bool:
        """Whether an exchange of `config` on `platform` uses `pair_weights` (its
        strategy's `Transfer.weighted`: the scheduled strategy)."""
        return TRANSPORTS[config.strategy.on(platform)].weighted

    @property
    def capacities(self) -> dict[Key, int]:
        """The capacities measured ({Key: capacity}; `jgraph.exchange.sizing.dump` for
        JSON)."""
        return dict(self.sizes.measured)

    @property
    def planned(self) -> bool:
        return self.sizes.planned

    @property
    def schedule(self) -> np.ndarray | None:
        """What the transport builds once on the host for its transfers
        (`Transfer.schedule`: the scheduled strategy's int32[R, P] rounds of device
        pairs, `jgraph.exchange.scheduled.build_schedule`; None for the others), built
        once and shared by copies."""
        if self._schedule is None:
            self._schedule = self.transport.schedule(self.num_parts, self.pair_weights)
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
        """Whether gathers may move straight instead of their transport's way
        (`Transfer.optional`: all_to_all's relay, `ExchangeConfig.relay`, over 3 to
        `ROUTE_MAX` devices)."""
        return self.transport.optional

    @property
    def scatters_straight(self) -> bool:
        """Whether scatters (`scatter_add`, `scatter_rows`) move otherwise than gathers:
        where the gathers' transport moves gathers only (`Transfer.scatters`: the
        scheduled strategy's chunks, whose capacity is a chunk where a scatter's is a
        device pair's load; the relay's hops, sized by the busiest hop pair where a
        scatter's is the busiest pair's). Their capacities are then kept under
        `Route.STRAIGHT`, and so are those of the gathers that go straight where gathers
        may (`relays`: `once`, or calibrated straight: `Capacities.fitted`)."""
        return not self.transport.scatters

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
        did. Where the gathers' transfers are chunked (the scheduled strategy) only the
        scatters' capacities grow: the chunks loop as often as a request needs
        (`Capacities.grown`)."""
        sizes = self.sizes.grown(stats, self.transport.chunked)
        return self if sizes is self.sizes else self._with(sizes=sizes)

    def capacity(self, transfer: Transfer, one_round: bool = False) -> int:
        """`transfer`'s static capacity (`Capacities.capacity`)."""
        return self.sizes.capacity(transfer, self.key(transfer.n), one_round)

    def ladder(self, transfer: Transfer, top: int) -> tuple[int, ...]:
        """The rungs `transfer`'s first round picks from (`Capacities.ladder`)."""
        return self.sizes.ladder(transfer, self.key(transfer.n), top)

    def _transfers(self, plan: Plan) -> list[Transfer]:
        """The plan's transfers by this exchange's transport, none on a one-device mesh
        (where every id is local)."""
        if self.num_parts == 1:
            return []
        return self.transport.transfers(plan, self.axis, self.offsets, self.schedule)

    # -- rounds --------------------------------------------------------------------------

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

    def _rounds(self, transfers: list[Transfer], caps: list[int], one_round, carry,
                start: int = 0):
        """(carry, rounds): `one_round(r, carry) -> carry` for the rounds from `start` on
        that the devices' largest need asks of `transfers` at `caps` (round r moves each
        from r x its capacity on), in one loop; run once without a loop where every
        capacity holds every request (`rounds` is then 1 without looking). A chunked
        transfer always loops."""
        if all(cap >= t.top and not t.chunked for t, cap in zip(transfers, caps)):
            return (one_round(0, carry) if start == 0 else carry), 1
        rounds = functools.reduce(jnp.maximum, [t.rounds(c) for t, c in zip(transfers, caps)])
        return lax.fori_loop(start, rounds, one_round, carry), rounds

    def in_windows(self, total, window: int, body, carry):
        """`body(k, ok, carry) -> carry` over this device's positions [0, `total`)
        (int32), `window` of them a round (k: int32[window] the round's, ok: bool[window]
        those below `total`), in as many rounds as the devices' largest `total` needs,
        by the rule a transfer's rounds follow (`rounds_for`): every device runs every
        round, so the exchanges `body` makes meet. For requests longer than any static
        buffer, moved `window` ids a round (the control variates' in-edge chunks)."""
        def one_round(r, carry):
            k = r * window + jnp.arange(window, dtype=jnp.int32)
            return body(k, k < total, carry)
        return lax.fori_loop(0, rounds_for(total, window, self.axis), one_round, carry)

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
        remote ones in compact order [n]; the `Tally` of its transfers).

        Every transfer moves at its capacity in as many rounds as the devices' largest
        need asks for, all of them in one loop (`_rounds`) writing one buffer of remote
        answers, so memory does not grow with the number of transfers (the ring has
        P - 1). Two things vary, by what compiles least:
        - where the first round runs: in the loop where every capacity is one (one
          traced copy of the transfers and `owner_fn`, not two); else before it, at the
          rung of each transfer's ladder the devices' largest need picks (`switch`);
        - who answers: `owner_fn` per transfer and round, this device's own ids apart
          (inside each rung's branch for a first round at a rung); or, `once` (owner
          functions costly to compile: the sampler's draws), the first round's ids of
          every transfer and this device's own in one `answer_filled`, `owner_fn`
          traced once, its work following what arrived. In the loop, where every
          round is answered so; or between two passes through the ladder, the ids to
          the owners (each branch returns them padded to the top's length), then the
          answers back (each branch takes its rung's part), the later rounds answered
          per transfer."""
        n, tally = plan.size, Tally()
        tops = [self.capacity(t) for t in transfers]
        ladders = [self.ladder(t, top) for t, top in zip(transfers, tops)]
        laddered = any(len(ladder) > 1 for ladder in ladders)
        own = jnp.where(plan.local, plan.uniq, -1)
        in_loop = once and not laddered          # the loop answers every id, own included

        def together(asked, received):
            """`owner_fn`'s answers to `asked` ([n], this device's own ids or -1) and to
            each transfer's `received` ids (-1: none), in one `answer_filled`."""
            got = answer_filled(owner_fn, jnp.concatenate([asked] + received))
            ends = itertools.accumulate([ids.shape[0] for ids in received], initial=n)
            return (jax.tree.map(lambda a: a[:n], got),
                    [jax.tree.map(lambda a, s=s, e=e: a[s:e], got)
                     for s, e in itertools.pairwise(ends)])

        rungs, received, answers = [None] * len(transfers), [], []
        if in_loop:                    # zeros typed like the ids (mesh-varying), as a
            zero = own[0] * 0          # loop carry must be, shaped as `answer_filled`'s
            shapes = answer_shapes(owner_fn, n + sum(                   # trace, reused
                t.received_length(top) for t, top in zip(transfers, tops)), own)
            local = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype)
                                 + zero.astype(x.dtype), shapes)
            into = (jax.tree.map(jnp.zeros_like, local), jnp.zeros(n, bool) | (zero > 0))
        else:
            if once:                   # the first round's ids forward through the ladder
                for i, (t, top, ladder) in enumerate(zip(transfers, tops, ladders)):
                    rungs[i] = self.rung(t.need, ladder) if len(ladder) > 1 else None

                    def forward(cap, t=t, length=t.received_length(top)):
                        sent = t.send(cap)
                        ids = jnp.where(sent.mask, sent.ids, -1)
                        return jnp.pad(ids, (0, length - ids.shape[0]), constant_values=-1)
                    received.append(self.switch(t.need, ladder, forward, rung=rungs[i])[0])
                local, answers = together(own, received)
            else:
                local = owner_fn(plan.uniq, plan.local)
            # typed as varying, as a loop carry must be
            into = (jax.tree.map(jnp.zeros_like, local), jnp.zeros_like(plan.valid))
        ans_bytes = row_bytes(local)

        firsts = [None] * len(transfers)        # a first round at a rung: (wire, cap)
        for i, (t, ladder) in enumerate(zip(transfers, ladders) if laddered else ()):
            if once:
                def branch(cap, t=t, ids=received[i], mine=answers[i], into=into):
                    k = t.received_length(cap)
                    sent = t.send(cap, received=ids[:k])
                    return (t.back(sent, jax.tree.map(lambda a: a[:k], mine), into),
                            t.wire(cap, 4, ans_bytes))
            else:
                def branch(cap, t=t, into=into):
                    return (self._round(t, cap, owner_fn, 0, into),
                            t.wire(cap, 4, ans_bytes))
            (into, wire), cap = self.switch(t.need, ladder, branch, rung=rungs[i])
            firsts[i] = (wire, cap)

        def one_round(r, carry):
            """Round r of every transfer at its capacity."""
            if not in_loop:            # `owner_fn` per transfer, own ids answered apart
                for t, top in zip(transfers, tops):
                    carry = self._round(t, top, owner_fn, r * top, carry)
                return carry
            local, into = carry
            sent = [t.send(top, offset=r * top) for t, top in zip(transfers, tops)]
            mine, got = together(jnp.where(r == 0, own, -1),
                                 [jnp.where(d.mask, d.ids, -1) for d in sent])
            for t, d, a in zip(transfers, sent, got):
                into = t.back(d, a, into, r * d.cap)
            return jax.tree.map(lambda m, a: jnp.where(r == 0, m, a), mine, local), into
        carry, rounds = self._rounds(transfers, tops, one_round,
                                     (local, into) if in_loop else into,
                                     start=1 if laddered else 0)
        local, into = carry if in_loop else (local, carry)

        for t, top, first in zip(transfers, tops, firsts):
            wire = t.wire(top, 4, ans_bytes)    # one round at the top, or all (exact)
            if first is None:
                cap = jnp.int32(top)
                if not t.exact_wire:
                    wire = wire * rounds
            else:
                cap = first[1]
                if not t.exact_wire:            # the first at its rung, the rest at top
                    wire = first[0] + wire * (rounds - 1)
            # A chunked transfer's loop is its schedule: one round as far as growing goes.
            tally.add(cap, t.need, jnp.int32(1) if t.chunked else rounds, wire)
        return local, into[0], tally

    # -- the operations ------------------------------------------------------------------

    def gather(self, ids, valid, owner_fn: OwnerFn, *, cache=None, contains=None,
               distinct: bool = False, once: bool = False) -> tuple[PyTree, ExchangeStats]:
        """Answers of `owner_fn` for each id, in request order; zero where not valid.

        ids: int[n] global node ids; valid: bool[n]. cache: optional `(cache_ids
        int32[C] sorted, values)` with `values` shaped like `owner_fn`'s answers for
        those ids, replicated on every device. contains: optional `ids -> bool[n]`; ids
        it rejects are counted in `out_of_range` and answered with zeros. distinct: the
        valid ids are known to be distinct (a sampler's frontier), so the deduplicating
        sort is skipped; repeated ids would then be routed, and answered, more than once.
        once: trace `owner_fn` once, outside the capacity ladder, instead of once per
        rung inside it (see `_answers`): for owner functions that are costly to compile
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
        transfers = self._transfers(plan)
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
        return answers, tally.stats(plan.tally, plan.size, self.route.code, self.axis,
                                    relayed=sum(t.relayed for t in transfers))

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
        def add(parts, owned, ok, sums):
            return parts + [(jnp.where(ok, owned, -1), sums)]
        parts, stats = self._scatter(ids, valid, values, contains, lambda summed: [], add,
                                     one_round=True)
        all_ids = jnp.concatenate([part[0] for part in parts])
        all_vals = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[part[1] for part in parts])
        m = all_ids.shape[0]
        owned, inverse = jnp.unique(jnp.where(all_ids >= 0, all_ids, EMPTY), size=m,
                                    fill_value=EMPTY, return_inverse=True)
        sums = jax.tree.map(lambda x: jax.ops.segment_sum(x, inverse.reshape(-1), num_segments=m),
                            all_vals)
        mask = owned != EMPTY
        return (jnp.where(mask, owned, -1), sums, mask), stats

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
        base = jnp.asarray(self.offsets, jnp.int32)[lax.axis_index(self.axis)]

        def add(tables, owned, ok, sums):
            at = jnp.where(ok, owned - base, rows)                  # rows: dropped
            return jax.tree.map(lambda t, x: t.at[at].add(x, mode="drop"), tables, sums)
        return self._scatter(ids, valid, values, contains, lambda summed: jax.tree.map(
            lambda x: jnp.zeros((rows,) + x.shape[1:], x.dtype), summed), add,
            one_round=False)

    def _scatter(self, ids, valid, values, contains, start: Callable[[PyTree], PyTree],
                 add: Callable, one_round: bool):
        """(acc, stats): the one driver of `scatter_add` and `scatter_rows`. The values
        (pytree of [n, ...]) of each distinct valid id are summed on this device, and
        the sums move with their ids to the owners; `add(acc, ids, mask, sums) -> acc`
        takes every part that arrives (this device's own first) into `acc =
        start(sums)`. one_round: each transfer moves once, at the rung of its ladder
        the devices' largest need picks, and what does not fit is counted in `overflow`;
        else in as many rounds of its capacity as it needs. Where the gathers'
        transport moves gathers only, it moves straight (`scatters_straight`)."""
        if self.scatters_straight:
            return self._straight()._scatter(ids, valid, values, contains, start, add,
                                             one_round)
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        plan = make_plan(ids, valid, self.offsets, self.axis, out_of_range=out_of_range)
        n = ids.shape[0]
        values = jax.tree.map(lambda x: jnp.where(
            valid.reshape((n,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype)), values)
        summed = jax.tree.map(lambda x: jax.ops.segment_sum(x, plan.inverse, num_segments=n),
                              values)
        acc = add(start(summed), plan.uniq, plan.local, summed)
        payload = put(n, summed, plan.slot, plan.remote)            # compact order
        fwd = 4 + row_bytes(summed)
        tally, overflow = Tally(), jnp.int32(0)
        for transfer in self._transfers(plan):
            if one_round:
                top = self.capacity(transfer, one_round=True)
                length = transfer.received_length(top)   # every branch's, as lax.switch needs

                def branch(cap, transfer=transfer, length=length):
                    sent = transfer.send(cap, payload)
                    pad = lambda x, fill: jnp.pad(x, [(0, length - x.shape[0])] + [(0, 0)] * (
                        x.ndim - 1), constant_values=fill)
                    return (pad(jnp.where(sent.mask, sent.ids, -1), -1),
                            jax.tree.map(lambda x: pad(x, 0), sent.payload), sent.overflow,
                            transfer.wire(cap, fwd, 0))
                (got_ids, got, lost, wire), cap = self.switch(
                    transfer.need, self.ladder(transfer, top), branch)
                acc = add(acc, got_ids, got_ids >= 0, got)
                tally.add(cap, transfer.need, jnp.int32(1), wire)
                overflow = overflow + lost
            else:
                cap = self.capacity(transfer)

                def one(r, acc, transfer=transfer, cap=cap):
                    sent = transfer.send(cap, payload, offset=r * cap)
                    return add(acc, sent.ids, sent.mask, sent.payload)
                acc, rounds = self._rounds([transfer], [cap], one, acc)
                wire = transfer.wire(cap, fwd, 0)
                tally.add(jnp.int32(cap), transfer.need, rounds,
                          wire if transfer.exact_wire else wire * rounds)
        return acc, tally.stats(plan.tally, n, self.route.code, self.axis, overflow)

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
        return answers, ExchangeStats.local(valid, out_of_range, ids.shape[0],
                                            self.route.code, self.axis)

    def _screen(self, ids, valid, contains):
        """Drop ids outside the graph (or outside `contains`), counting them."""
        valid = valid.astype(bool)
        ok = (ids >= 0) & (ids < int(self.offsets[-1]))
        if contains is not None:
            ok = ok & contains(ids)
        return valid & ok, valid & ~ok
