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
the interface; `all_to_all.py`, `all_gather.py`, `ring.py`, `ragged.py`; `relay.py`
builds on all_to_all). Every transfer has a static capacity (shapes are fixed
at trace time) taken from a short ladder of rungs; all devices agree on the rung with
`pmax`, and `lax.switch` runs the branch compiled for it, so small requests move small
buffers. By default the top rung is the batch size, which no request can exceed; a
smaller `max_capacity` bounds memory and turns would-be overflows into a counted, never
silent, `ExchangeStats.overflow` (host-side callers raise `ExchangeOverflowError`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

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
from jgraph.exchange.relay import relayed_gather
from jgraph.exchange.ring import RingShift
from jgraph.exchange.rows import OwnerFn, PyTree, answer_filled, put, row_bytes, select, take
from jgraph.exchange.transport import Transfer
from jgraph.mesh import AXIS

TRANSPORTS: dict[Strategy, Callable[[Plan, str, np.ndarray], list[Transfer]]] = {
    Strategy.ALL_TO_ALL: AllToAll.transfers,
    Strategy.ALL_GATHER: AllGather.transfers,
    Strategy.RING: RingShift.transfers,
    Strategy.RAGGED: Ragged.transfers,
}
"""Each concrete strategy's transfers of a plan: `(plan, axis, offsets) -> [Transfer]`."""


class ExchangeOverflowError(RuntimeError):
    """A transfer needed more capacity than the top rung of the ladder allows."""


class ExchangeStats(NamedTuple):
    """Counters of one exchange, summed over devices (the same on every device).

    requested: distinct valid ids asked for; non_local: those owned by another device;
    cached: non-local ids answered by the hot-node cache; capacity: the largest transfer
    capacity used; wire_bytes: bytes sent between devices; overflow: ids that did not
    fit the top rung (their answers are zero); out_of_range: valid ids the caller's
    `contains` rejected (treated as padding).
    """

    requested: jnp.ndarray
    non_local: jnp.ndarray
    cached: jnp.ndarray
    capacity: jnp.ndarray
    wire_bytes: jnp.ndarray
    overflow: jnp.ndarray
    out_of_range: jnp.ndarray

    def check(self, what: str = "exchange") -> ExchangeStats:
        """Host side: raise if anything was lost; returns self."""
        overflow, bad = int(self.overflow), int(self.out_of_range)
        if overflow:
            raise ExchangeOverflowError(
                f"{what}: {overflow} id(s) did not fit the largest capacity "
                f"{int(self.capacity)}; raise ExchangeConfig.max_capacity (or leave it None)")
        if bad:
            raise IndexError(f"{what}: {bad} id(s) are not rows of the array they index")
        return self


class Exchange:
    """Owner-routed exchange over the partitions of a `PartitionBook`.

    Static (not a pytree): build it on the host and close over it in the step.
    """

    def __init__(self, offsets, config: ExchangeConfig = ExchangeConfig(), axis: str = AXIS,
                 platform: str | None = None):
        """platform: of the devices it runs on (a mesh's `devices.flat[0].platform`, or
        the platform a program is built for); it resolves `Strategy.AUTO` and refuses
        ragged_all_to_all on "cpu". None: unknown (AUTO is then all_to_all)."""
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

    def owner(self, ids: jnp.ndarray) -> jnp.ndarray:
        """int32 partition (device) owning each id."""
        return owner_of(self.offsets, ids)

    def without_relay(self) -> Exchange:
        """This exchange with `relay` off (the relay's intermediates fetch through it)."""
        return Exchange(self.offsets, dataclasses.replace(self.config, relay=False),
                        self.axis)

    # -- the capacity ladder ------------------------------------------------------------

    def _transfers(self, plan: Plan) -> list[Transfer]:
        """The plan's transfers, none on a one-device mesh (where every id is local)."""
        if self.num_parts == 1:
            return []
        return TRANSPORTS[self.config.strategy](plan, self.axis, self.offsets)

    def rung(self, need, top: int, bounded: bool) -> jnp.ndarray:
        """Index of the smallest rung >= the devices' largest need (the top one if none
        is): the same on every device."""
        ladder = self.config.ladder(top, bounded)
        return jnp.minimum(jnp.searchsorted(jnp.asarray(ladder), lax.pmax(need, self.axis)),
                           len(ladder) - 1)

    def switch(self, need, top: int, bounded: bool, branch: Callable[[int], PyTree],
               rung=None) -> tuple[PyTree, jnp.ndarray]:
        """(`branch(cap)`, cap) for the smallest rung >= the devices' largest need, or
        for the given rung index, which every device must agree on. Each rung is a
        compiled branch; `lax.switch` runs the one picked."""
        ladder = self.config.ladder(top, bounded)
        if rung is None:
            rung = self.rung(need, top, bounded)
        cap = jnp.asarray(ladder, jnp.int32)[rung]
        if len(ladder) == 1:
            return branch(ladder[0]), cap
        return lax.switch(rung, [lambda c=c: branch(c) for c in ladder]), cap

    def _switch_transfer(self, transfer: Transfer, branch, rung=None):
        return self.switch(transfer.need, transfer.top, transfer.bounded, branch, rung=rung)

    def _top_length(self, transfer: Transfer) -> int:
        """Ids `transfer` delivers at its top rung: the length every rung's branch pads
        its delivery to."""
        return transfer.received_length(self.config.ladder(transfer.top, transfer.bounded)[-1])

    def _stats(self, plan, caps, wire, overflow, out_of_range, inner=None) -> ExchangeStats:
        """Sum this device's counters over devices (and add an inner exchange's totals)."""
        axis = self.axis
        count = lambda m: lax.psum(jnp.sum(m, dtype=jnp.int32), axis)
        wire, overflow = lax.psum(wire, axis), lax.psum(overflow, axis)
        if inner is not None:
            caps = caps + [inner.capacity]
            wire, overflow = wire + inner.wire_bytes, overflow + inner.overflow
        return ExchangeStats(
            requested=count(plan.valid), non_local=count(plan.remote | plan.cached),
            cached=count(plan.cached),
            capacity=lax.pmax(jnp.max(jnp.stack(caps)), axis) if caps else jnp.int32(0),
            wire_bytes=wire, overflow=overflow, out_of_range=count(out_of_range))

    # -- the remote answers of a gather ----------------------------------------------------

    def _answer_per_rung(self, plan: Plan, owner_fn: OwnerFn, like: PyTree):
        """(remote answers in compact order [n], caps, wire bytes, overflow), with
        `owner_fn` traced inside every rung's branch of every transfer. Each transfer
        writes into the one buffer, so memory does not grow with the number of
        transfers (the ring has P - 1)."""
        remote = jax.tree.map(jnp.zeros_like, like)
        filled = jnp.zeros(plan.size, bool)
        ans_bytes = row_bytes(like)
        caps, wire, overflow = [], jnp.float32(0), jnp.int32(0)
        for transfer in self._transfers(plan):
            def branch(cap, transfer=transfer, into=(remote, filled)):
                sent = transfer.send(cap)
                got, now = transfer.back(
                    sent, owner_fn(jnp.maximum(sent.ids, 0), sent.mask), into)
                return got, now, sent.overflow, transfer.wire(cap, 4, ans_bytes)
            (remote, filled, lost, w), cap = self._switch_transfer(transfer, branch)
            caps.append(cap)
            wire, overflow = wire + w, overflow + lost
        return remote, caps, wire, overflow

    def _answer_once(self, plan: Plan, owner_fn: OwnerFn):
        """`gather`'s answers with `owner_fn` compiled once: (answers to this device's own
        ids [n] (zero where not local), remote answers in compact order [n], caps, wire
        bytes, overflow).

        Each transfer goes through the ladder twice: its ids to the owners (the branch
        returns them padded to the top rung's length), then the answers back (the branch
        takes its rung's part of them). Between the two, outside every branch, each
        device answers its own ids and all those it received in one `answer_filled`:
        a loop over only the chunks that hold ids, so the work follows what arrived,
        not the top rung."""
        n = plan.size
        legs = []
        for transfer in self._transfers(plan):
            rung = self.rung(transfer.need, transfer.top, transfer.bounded)
            length = self._top_length(transfer)

            def forward(cap, transfer=transfer, length=length):
                sent = transfer.send(cap)
                ids = jnp.where(sent.mask, sent.ids, -1)
                return jnp.pad(ids, (0, length - ids.shape[0]), constant_values=-1)
            received, cap = self._switch_transfer(transfer, forward, rung=rung)
            legs.append((transfer, rung, received, cap))
        own = jnp.where(plan.local, plan.uniq, -1)
        answers = answer_filled(owner_fn, jnp.concatenate([own] + [leg[2] for leg in legs]))
        local = jax.tree.map(lambda a: a[:n], answers)
        remote = jax.tree.map(jnp.zeros_like, local)
        filled = jnp.zeros(n, bool)
        ans_bytes = row_bytes(local)
        caps, wire, overflow, start = [], jnp.float32(0), jnp.int32(0), n
        for transfer, rung, received, cap in legs:
            mine = jax.tree.map(lambda a, s=start, k=received.shape[0]: a[s:s + k], answers)
            start += received.shape[0]

            def back(cap, transfer=transfer, received=received, mine=mine,
                     into=(remote, filled)):
                k = transfer.received_length(cap)
                sent = transfer.send(cap, received=received[:k])
                got, now = transfer.back(sent, jax.tree.map(lambda a: a[:k], mine), into)
                return got, now, sent.overflow, transfer.wire(cap, 4, ans_bytes)
            (remote, filled, lost, w), _ = self._switch_transfer(transfer, back, rung=rung)
            caps.append(cap)
            wire, overflow = wire + w, overflow + lost
        return local, remote, caps, wire, overflow

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
        and answer narrow rows, as the sampler's draws.
        """
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        if cache is not None and cache[0].shape[0] == 0:
            cache = None            # an empty cache answers nothing
        cache_ids, cache_values = cache if cache is not None else (None, None)
        if self.num_parts == 1 and distinct:
            return self._only_device(ids, valid, owner_fn, out_of_range)
        plan = make_plan(ids, valid, self.offsets, self.axis, cache_ids, distinct)
        # Relay only when nothing can overflow: an intermediate deduplicates, so it could
        # not count a lost id once per requester.
        relayed = (self.config.strategy is Strategy.ALL_TO_ALL and self.config.relay
                   and self.config.max_capacity is None and self.num_parts > 2)
        inner = None
        if once and not relayed and self.num_parts > 1:
            answers, remote_answers, caps, wire, overflow = self._answer_once(plan, owner_fn)
        else:
            answers = owner_fn(plan.uniq, plan.local)
            if relayed:
                relay = relayed_gather(self, plan, owner_fn, row_bytes(answers))
                remote_answers, caps, inner = relay.answers, relay.capacities, relay.inner
                wire, overflow = relay.wire, relay.overflow
            else:
                remote_answers, caps, wire, overflow = self._answer_per_rung(
                    plan, owner_fn, answers)
        if cache_values is not None:
            answers = select(plan.cached, take(cache_values, plan.cache_pos, plan.cached),
                             answers)
        answers = select(plan.remote, take(remote_answers, plan.slot, plan.remote), answers)
        answers = take(answers, plan.inverse, plan.valid[plan.inverse] & valid)
        return answers, self._stats(plan, caps, wire, overflow, out_of_range, inner)

    def scatter_add(self, ids, valid, values, *, contains=None
                    ) -> tuple[tuple[jnp.ndarray, PyTree, jnp.ndarray], ExchangeStats]:
        """Transpose of `gather`: send each value to its id's owner and sum per id there.

        ids: int[n]; valid: bool[n]; values: pytree of [n, ...]. Returns, on each owner,
        `(owned_ids int32[M], sums [M, ...], mask bool[M])`: the distinct ids it owns that
        any device sent (sorted, padding where mask is False) with the sum of their
        values. M is static: n plus the largest total any transfer can deliver.
        """
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        plan = make_plan(ids, valid, self.offsets, self.axis)
        n = ids.shape[0]
        values = jax.tree.map(lambda x: jnp.where(
            valid.reshape((n,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype)), values)
        summed = jax.tree.map(lambda x: jax.ops.segment_sum(x, plan.inverse, num_segments=n),
                              values)
        payload = put(n, summed, plan.slot, plan.remote)            # compact order
        pay_bytes = row_bytes(summed)
        parts_ids, parts_vals = [jnp.where(plan.local, plan.uniq, -1)], [summed]
        caps, wire, overflow = [], jnp.float32(0), jnp.int32(0)
        for transfer in self._transfers(plan):
            length = self._top_length(transfer)   # every branch's, as lax.switch needs

            def branch(cap, transfer=transfer, length=length):
                sent = transfer.send(cap, payload)
                pad = length - sent.ids.shape[0]
                got_ids = jnp.pad(jnp.where(sent.mask, sent.ids, -1), (0, pad),
                                  constant_values=-1)
                got = jax.tree.map(lambda x: jnp.pad(
                    x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), sent.payload)
                return got_ids, got, sent.overflow, transfer.wire(cap, 4 + pay_bytes, 0)
            (got_ids, got, lost, w), cap = self._switch_transfer(transfer, branch)
            parts_ids.append(got_ids)
            parts_vals.append(got)
            caps.append(cap)
            wire, overflow = wire + w, overflow + lost
        all_ids = jnp.concatenate(parts_ids)
        all_vals = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts_vals)
        m = all_ids.shape[0]
        owned, inverse = jnp.unique(jnp.where(all_ids >= 0, all_ids, EMPTY), size=m,
                                    fill_value=EMPTY, return_inverse=True)
        sums = jax.tree.map(lambda x: jax.ops.segment_sum(x, inverse.reshape(-1), num_segments=m),
                            all_vals)
        mask = owned != EMPTY
        return (jnp.where(mask, owned, -1), sums, mask), self._stats(
            plan, caps, wire, overflow, out_of_range)

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
            wire_bytes=zero.astype(jnp.float32), overflow=zero, out_of_range=count(out_of_range))

    def _screen(self, ids, valid, contains):
        """Drop ids outside the graph (or outside `contains`), counting them."""
        valid = valid.astype(bool)
        ok = (ids >= 0) & (ids < int(self.offsets[-1]))
        if contains is not None:
            ok = ok & contains(ids)
        return valid & ok, valid & ~ok
