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

How ids travel is a `Strategy`. Every transfer has a static capacity (shapes are fixed
at trace time) taken from a short ladder of rungs; all devices agree on the rung with
`pmax`, and `lax.switch` runs the branch compiled for it, so small requests move small
buffers. By default the top rung is the batch size, which no request can exceed; a
smaller `max_capacity` bounds memory and turns would-be overflows into a counted, never
silent, `ExchangeStats.overflow` (host-side callers raise `ExchangeOverflowError`).
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.mesh import AXIS

PyTree = Any
OwnerFn = Callable[[jnp.ndarray, jnp.ndarray], PyTree]
"""`owner_fn(ids, mask)`: answers for global ids this device owns, one row per id.

`ids: int32[m]`, `mask: bool[m]` (rows where mask is False may hold anything; they are
discarded). Returns a pytree of arrays with leading dimension m.
"""

_EMPTY = jnp.iinfo(jnp.int32).max   # sorts after every real id
_ragged_all_to_all = lax.ragged_all_to_all   # module-level so tests can emulate it on CPU


class ExchangeOverflowError(RuntimeError):
    """A transfer needed more capacity than the top rung of the ladder allows."""


class Strategy(str, enum.Enum):
    """How ids and answers travel between devices; all give identical results."""

    ALL_TO_ALL = "all_to_all"   # one all_to_all each way, per-peer capacity from the ladder
    ALL_GATHER = "all_gather"   # all_gather the requests, answer, reduce-scatter the answers
    RING = "ppermute"           # P-1 ppermute rounds; each shift picks its own rung
    RAGGED = "ragged_all_to_all"  # exact sizes; GPU only (XLA:CPU does not implement it)
    AUTO = "auto"               # ragged_all_to_all on GPU, all_to_all elsewhere

    def on(self, platform: str | None) -> Strategy:
        """The strategy used on devices of `platform` ("gpu", "cpu", ...; None: unknown):
        AUTO picks what the platform has, the others are themselves."""
        if self is not Strategy.AUTO:
            return self
        return Strategy.RAGGED if platform in ("gpu", "cuda", "rocm") else Strategy.ALL_TO_ALL


@dataclasses.dataclass(frozen=True)
class ExchangeConfig:
    """Fields:
      strategy: how data travels; AUTO (default) is ragged_all_to_all on GPUs (exact
        sizes on the wire) and all_to_all elsewhere.
      growth: ratio between neighbouring rungs of the capacity ladder; closer to 1
        wastes less wire on rounding up, at the cost of more compiled branches.
      min_capacity: the smallest rung.
      max_rungs: the most rungs a ladder has, counted down from the top. Each is a
        compiled branch holding the transfer (on XLA:CPU an all_to_all compiles into a
        kernel per peer): the default 4 rungs of growth 2 move at most twice what the
        busiest pair needs, or the request size when it needs less than an eighth; they
        compiled cora's 8-device training step in about half the time of the 13 rungs
        of growth 1.25 (measured on XLA:CPU).
      max_capacity: the largest rung, to bound buffer memory; None means the batch size,
        with which nothing can overflow.
      relay: all_to_all gathers only. When a few device pairs need far more than the
        rest (METIS partitions talk mostly to their neighbours), a uniform per-peer
        capacity pads every pair to the busiest one. With relay, the pairs' ids above a
        capacity chosen to minimise traffic are dealt round-robin to intermediate
        devices, which fetch them from the owners and pass the answers back: two more
        all_to_alls, each balanced.
      cache: the hot-node cache of training and evaluation: the feature rows of this
        fraction of each node type's nodes (0 = none), replicated on every device and
        answered without communication (`jgraph.sharded.cache`).
      cache_by: which nodes are hot: "degree" (out-degree: the number of
        neighbourhoods a node is in) or "frequency" (requests counted on sampled
        training batches).
    """

    strategy: Strategy = Strategy.AUTO
    growth: float = 2.0
    min_capacity: int = 16
    max_capacity: int | None = None
    max_rungs: int = 4
    relay: bool = False
    cache: float = 0.0
    cache_by: str = "degree"

    def __post_init__(self):
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        if self.growth <= 1.0:
            raise ValueError(f"exchange growth must be > 1, got {self.growth}")
        if self.max_rungs < 1:
            raise ValueError(f"exchange max_rungs must be >= 1, got {self.max_rungs}")
        if self.min_capacity < 1:
            raise ValueError(f"exchange min_capacity must be >= 1, got {self.min_capacity}")
        if self.max_capacity is not None and self.max_capacity < 1:
            raise ValueError(f"exchange max_capacity must be >= 1, got {self.max_capacity}")
        if not 0.0 <= self.cache <= 1.0:
            raise ValueError(f"exchange cache is a fraction of the nodes in [0, 1], got "
                             f"{self.cache}")
        if self.cache_by not in ("degree", "frequency"):
            raise ValueError(f"exchange cache_by must be 'degree' or 'frequency', got "
                             f"{self.cache_by!r}")

    def ladder(self, natural_top: int, bounded: bool = True) -> tuple[int, ...]:
        """Capacities for a transfer that can never need more than `natural_top`:
        at most `max_rungs` of them, spaced by `growth` down from the top, multiples of
        8 below it, none under `min_capacity`."""
        top = max(natural_top, 1)
        if bounded and self.max_capacity is not None:
            top = min(top, self.max_capacity)
        rungs, c = [top], top
        while len(rungs) < self.max_rungs:
            c = int(c / self.growth) // 8 * 8
            if c < min(self.min_capacity, top) or c >= rungs[-1]:
                break
            rungs.append(c)
        return tuple(reversed(rungs))


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


class _Plan(NamedTuple):
    """One device's deduplicated request. n = request size; P = partitions.

    uniq: int32[n] distinct ids, sorted unless declared distinct, _EMPTY-padded;
    inverse: int32[n] request -> uniq;
    valid, local, cached, remote: bool[n] over uniq; cache_pos: int32[n];
    compact: int32[n] the remote ids, grouped by owner, -1-padded; slot: int32[n] each
    remote uniq entry's place in compact; start, counts: int32[P] owner groups of compact.
    """

    uniq: jnp.ndarray
    inverse: jnp.ndarray
    valid: jnp.ndarray
    local: jnp.ndarray
    cached: jnp.ndarray
    cache_pos: jnp.ndarray
    remote: jnp.ndarray
    compact: jnp.ndarray
    slot: jnp.ndarray
    start: jnp.ndarray
    counts: jnp.ndarray


class _Sent(NamedTuple):
    """What one transfer delivered to this device as an owner."""

    ids: jnp.ndarray                 # int32[m], -1 where empty
    mask: jnp.ndarray                # bool[m]
    payload: PyTree                  # [m, ...] or None
    # (answers, into=None) -> (compact [n], filled bool[n]): answers put in compact order,
    # into `into = (compact, filled)` when given (so transfers fill one buffer in turn)
    back: Callable[..., tuple[PyTree, jnp.ndarray]]
    overflow: jnp.ndarray
    wire: Callable[[int, int], jnp.ndarray]  # (forward bytes/id, answer bytes/id) -> bytes


def row_bytes(tree: PyTree) -> int:
    """Bytes of one row of every leaf together (leading axis: rows)."""
    return sum(int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def _take(tree: PyTree, idx: jnp.ndarray, ok: jnp.ndarray) -> PyTree:
    """Rows `idx` of every leaf, zero where not `ok`."""
    def one(x):
        rows = jnp.take(x, jnp.where(ok, idx, 0), axis=0)
        return jnp.where(ok.reshape(ok.shape + (1,) * (x.ndim - 1)), rows, jnp.zeros((), x.dtype))
    return jax.tree.map(one, tree)


def _put(n: int, tree: PyTree, idx: jnp.ndarray, ok: jnp.ndarray, into: PyTree = None) -> PyTree:
    """Scatter rows into leaves of n rows (zeros, or `into`) at `idx` where `ok`."""
    idx = jnp.where(ok, idx, n)
    if into is None:
        into = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype), tree)
    return jax.tree.map(lambda base, x: base.at[idx].set(x, mode="drop"), into, tree)


def _select(mask: jnp.ndarray, a: PyTree, b: PyTree) -> PyTree:
    return jax.tree.map(
        lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)


def _psum_scatter_any(x: jnp.ndarray, axis: str) -> jnp.ndarray:
    if x.dtype == jnp.bool_:
        return lax.psum_scatter(x.astype(jnp.int32), axis, scatter_dimension=0, tiled=True) > 0
    return lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)


_COUNT_BLOCK = 64


def running_count(flags: jnp.ndarray) -> jnp.ndarray:
    """int32 inclusive running count of the True entries of bool `flags` along axis 0.

    Programs lowered for CPU count in blocks of 64 (one small matmul with a triangle of
    ones, exact: a block holds at most 64) and carry the blocks' totals with cumsum:
    XLA:CPU lowers a whole cumsum to a slow reduce-window, and a parallel-prefix scan
    compiles into about 2 log2(n) kernels (about 1 s of compile each, measured; this
    takes 0.2 s and runs within 2x of the scan). Other platforms keep cumsum. Chosen by
    the lowering platform, not the host's backend.
    """
    if flags.dtype != jnp.bool_:
        raise TypeError(f"running_count counts bool flags, got {flags.dtype}")
    return lax.platform_dependent(flags, cpu=_blocked_count,
                                  default=lambda x: jnp.cumsum(x, axis=0, dtype=jnp.int32))


def _blocked_count(flags: jnp.ndarray) -> jnp.ndarray:
    """int32[n, ...]: `running_count` of bool[n, ...] in blocks of `_COUNT_BLOCK` rows."""
    n, rest, b = flags.shape[0], flags.shape[1:], _COUNT_BLOCK
    blocks = -(-n // b)
    x = jnp.pad(flags.astype(jnp.float32), [(0, blocks * b - n)] + [(0, 0)] * len(rest))
    x = x.reshape((blocks, b) + rest)
    upper = (jnp.arange(b)[:, None] <= jnp.arange(b)[None, :]).astype(jnp.float32)
    within = jnp.einsum("bi...,ij->bj...", x, upper).astype(jnp.int32)
    totals = within[:, -1]
    before = jnp.cumsum(totals, axis=0, dtype=jnp.int32) - totals
    return (within + before[:, None]).reshape((blocks * b,) + rest)[:n]


def answer_filled(owner_fn: OwnerFn, ids: jnp.ndarray, chunks: int = 8) -> PyTree:
    """`owner_fn` of every id >= 0 of `ids` (int32[L], -1 elsewhere), zero answers at
    the -1 slots, in work that follows the ids present rather than L.

    The ids are packed to the front and answered `ceil(L / chunks)` at a time in a loop
    that runs only over the chunks holding any (a trip count computed in the step):
    `owner_fn` is traced once, and a buffer whose tail is empty costs nothing to answer.
    """
    length = ids.shape[0]
    present = ids >= 0
    slot = running_count(present) - 1
    size = max(-(-length // chunks) // 8 * 8 + 8, 8)
    total = -(-length // size) * size
    packed = jnp.full(total, -1, jnp.int32).at[jnp.where(present, slot, total)].set(
        ids, mode="drop")
    shapes = jax.eval_shape(owner_fn, packed[:size], packed[:size] >= 0)
    # Zeros typed like the ids (mesh-varying inside shard_map), as the loop carry must be.
    zero = packed[0] * 0
    buffers = jax.tree.map(lambda s: jnp.zeros((total,) + s.shape[1:], s.dtype)
                           + zero.astype(s.dtype), shapes)

    def answer(i, buffers):
        chunk = lax.dynamic_slice_in_dim(packed, i * size, size)
        got = owner_fn(jnp.maximum(chunk, 0), chunk >= 0)
        return jax.tree.map(lambda b, x: lax.dynamic_update_slice_in_dim(b, x, i * size, 0),
                            buffers, got)
    filled = -(-jnp.sum(present, dtype=jnp.int32) // size)
    buffers = lax.fori_loop(0, filled, answer, buffers)
    return _take(buffers, slot, present)


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
                and _ragged_all_to_all is lax.ragged_all_to_all):
            raise NotImplementedError(
                "exchange strategy ragged_all_to_all needs a backend that implements "
                "it (GPU); XLA:CPU does not. Use all_to_all, all_gather or ppermute")
        self.config = dataclasses.replace(config, strategy=strategy)
        self.axis = axis

    # -- planning ----------------------------------------------------------------------

    def owner(self, ids: jnp.ndarray) -> jnp.ndarray:
        offsets = jnp.asarray(self.offsets, jnp.int32)
        return jnp.clip(jnp.searchsorted(offsets, ids, side="right") - 1, 0, self.num_parts - 1)

    def _plan(self, ids, valid, cache_ids=None, distinct=False) -> _Plan:
        n, P = ids.shape[0], self.num_parts
        me = lax.axis_index(self.axis)
        if distinct:        # the caller promises no valid id repeats: skip the sort
            uniq, inverse = jnp.where(valid, ids, _EMPTY), jnp.arange(n, dtype=jnp.int32)
        else:
            uniq, inverse = jnp.unique(jnp.where(valid, ids, _EMPTY), size=n,
                                       fill_value=_EMPTY, return_inverse=True)
            inverse = inverse.reshape(-1).astype(jnp.int32)
        uvalid = uniq != _EMPTY
        owner = self.owner(uniq)
        local = uvalid & (owner == me)
        if cache_ids is not None and cache_ids.shape[0]:
            pos = jnp.clip(jnp.searchsorted(cache_ids, uniq), 0, cache_ids.shape[0] - 1)
            cached = uvalid & ~local & (cache_ids[pos] == uniq)
        else:
            pos, cached = jnp.zeros(n, jnp.int32), jnp.zeros(n, bool)
        remote = uvalid & ~local & ~cached
        counts = jax.ops.segment_sum(remote.astype(jnp.int32), owner, num_segments=P)
        start = jnp.cumsum(counts) - counts
        if distinct:        # unsorted: place each id after the earlier ones of its owner
            mine = (owner[:, None] == jnp.arange(P)) & remote[:, None]           # [n, P]
            rank = jnp.take_along_axis(running_count(mine),
                                       owner[:, None], axis=1)[:, 0] - 1
            slot = jnp.where(remote, start[owner] + rank, -1)
        else:               # sorted ids are already grouped by owner
            slot = running_count(remote) - 1
        compact = jnp.full(n, -1, jnp.int32).at[jnp.where(remote, slot, n)].set(uniq, mode="drop")
        return _Plan(uniq, inverse, uvalid, local, cached, pos.astype(jnp.int32), remote,
                     compact, slot, start.astype(jnp.int32), counts)

    # -- transfers ---------------------------------------------------------------------

    def _transfers(self, plan: _Plan) -> list[tuple[jnp.ndarray, int, bool, Callable]]:
        """(need, natural top capacity, bounded, route(cap, payload, received=None) ->
        _Sent) per transfer. With `received` (the ids this device got at capacity cap,
        from an earlier call) route skips the forward collective: its `back` then
        returns answers for those ids."""
        n, P, axis = plan.uniq.shape[0], self.num_parts, self.axis
        me = lax.axis_index(axis)
        strategy = self.config.strategy

        def group(p, cap):
            """Positions in compact of the first `cap` ids owned by p (and which exist)."""
            j = jnp.arange(cap, dtype=jnp.int32)
            return plan.start[p][..., None] + j, j < plan.counts[p][..., None]

        if strategy is Strategy.ALL_TO_ALL:
            def route(cap, payload, received=None):
                idx, ok = group(jnp.arange(P), cap)                       # [P, cap]
                send = jnp.where(ok, jnp.take(plan.compact, jnp.where(ok, idx, 0)), -1)
                recv = (lax.all_to_all(send, axis, 0, 0, tiled=True).reshape(-1)
                        if received is None else received)
                pay = None if payload is None else jax.tree.map(
                    lambda x: lax.all_to_all(x, axis, 0, 0, tiled=True).reshape(
                        (-1,) + x.shape[2:]),
                    _take(payload, idx, ok))

                def back(ans, into=(None, None)):
                    ans = jax.tree.map(lambda x: lax.all_to_all(
                        x.reshape((P, cap) + x.shape[1:]), axis, 0, 0, tiled=True
                    ).reshape((P * cap,) + x.shape[1:]), ans)
                    flat_idx, flat_ok = idx.reshape(-1), ok.reshape(-1)
                    return (_put(n, ans, flat_idx, flat_ok, into[0]),
                            _put(n, flat_ok, flat_idx, flat_ok, into[1]))

                def wire(fwd, ans):
                    return jnp.float32((P - 1) * cap * (fwd + ans))
                return _Sent(recv, recv >= 0, pay, back,
                             jnp.sum(jnp.maximum(plan.counts - cap, 0)), wire)
            return [(jnp.max(plan.counts), n, True, route)]

        if strategy is Strategy.RING:
            transfers = []
            for s in range(1, P):
                p = (me + s) % P

                def route(cap, payload, received=None, s=s, p=p):
                    idx, ok = group(p, cap)                                 # [cap]
                    send = jnp.where(ok, jnp.take(plan.compact, jnp.where(ok, idx, 0)), -1)
                    fwd_perm = [(i, (i + s) % P) for i in range(P)]
                    back_perm = [(i, (i - s) % P) for i in range(P)]
                    recv = lax.ppermute(send, axis, fwd_perm) if received is None else received
                    pay = None if payload is None else jax.tree.map(
                        lambda x: lax.ppermute(x, axis, fwd_perm), _take(payload, idx, ok))

                    def back(ans, into=(None, None)):
                        ans = jax.tree.map(lambda x: lax.ppermute(x, axis, back_perm), ans)
                        return _put(n, ans, idx, ok, into[0]), _put(
                        n, ok, idx, ok, into[1])

                    def wire(fwd, ans):
                        return jnp.float32(cap * (fwd + ans))
                    return _Sent(recv, recv >= 0, pay, back,
                                 jnp.maximum(plan.counts[p] - cap, 0), wire)
                transfers.append((plan.counts[p], n, True, route))
            return transfers

        if strategy is Strategy.ALL_GATHER:
            total = jnp.sum(plan.counts)

            def route(cap, payload, received=None):
                idx = jnp.arange(cap, dtype=jnp.int32)
                ok = idx < total
                send = jnp.where(ok, plan.compact[jnp.minimum(idx, n - 1)], -1)
                recv = (lax.all_gather(send, axis, tiled=True)                 # [P * cap]
                        if received is None else received)
                mask = (recv >= 0) & (self.owner(recv) == me)
                pay = None if payload is None else jax.tree.map(
                    lambda x: lax.all_gather(x, axis, tiled=True), _take(payload, idx, ok))

                def back(ans, into=(None, None)):
                    ans = jax.tree.map(lambda x: _psum_scatter_any(
                        _select(mask, x, jax.tree.map(jnp.zeros_like, x)), axis), ans)
                    return _put(n, ans, idx, ok, into[0]), _put(
                        n, ok, idx, ok, into[1])

                def wire(fwd, ans):
                    return jnp.float32((P - 1) * cap * (fwd + ans))
                return _Sent(recv, mask, pay, back, jnp.maximum(total - cap, 0), wire)
            return [(total, n, True, route)]

        if strategy is Strategy.RAGGED:
            matrix = lax.all_gather(plan.counts, axis)                          # [sender, owner]
            starts = lax.all_gather(plan.start, axis)
            recv_sizes = matrix[:, me]                                          # from each sender
            recv_offsets = (jnp.cumsum(recv_sizes) - recv_sizes).astype(jnp.int32)
            # Where my group for owner p lands in p's receive buffer: after lower senders'.
            out_offsets = (jnp.cumsum(matrix, axis=0) - matrix)[me].astype(jnp.int32)
            need = jnp.sum(recv_sizes)

            def route(cap, payload, received=None):
                def go(x, fill):
                    out = jnp.full((cap,) + x.shape[1:], fill, x.dtype)
                    return _ragged_all_to_all(x, out, plan.start, plan.counts, out_offsets,
                                              recv_sizes, axis_name=axis)
                recv = go(plan.compact, -1) if received is None else received
                pay = None if payload is None else jax.tree.map(lambda x: go(x, 0), payload)

                def back(ans, into=(None, None)):
                    def one(x, out):
                        return _ragged_all_to_all(x, out, recv_offsets, recv_sizes,
                                                  starts[:, me], plan.counts, axis_name=axis)
                    base = into[0] if into[0] is not None else jax.tree.map(
                        lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype), ans)
                    filled = jnp.arange(n) < jnp.sum(plan.counts)
                    if into[1] is not None:
                        filled = filled | into[1]
                    return jax.tree.map(one, ans, base), filled

                def wire(fwd, ans):
                    return (jnp.sum(plan.counts) * fwd + need * ans).astype(jnp.float32)
                return _Sent(recv, recv >= 0, pay, back, jnp.int32(0), wire)
            return [(need, (P - 1) * n, False, route)]

        raise ValueError(f"unknown exchange strategy {strategy!r}")

    def _received_length(self, cap: int) -> int:
        """Ids one transfer delivers to an owner at capacity cap (all peers' slots)."""
        spread = self.config.strategy in (Strategy.ALL_TO_ALL, Strategy.ALL_GATHER)
        return self.num_parts * cap if spread else cap

    def _answer_once(self, plan: _Plan, owner_fn: OwnerFn):
        """`gather`'s answers with `owner_fn` compiled once: (answers to this device's own
        ids [n] (zero where not local), remote answers in compact order [n], caps, wire
        bytes, overflow).

        Each transfer goes through the ladder twice: its ids to the owners (the branch
        returns them padded to the top rung's length), then the answers back (the branch
        takes its rung's part of them). Between the two, outside every branch, each
        device answers its own ids and all those it received in one `answer_filled`:
        a loop over only the chunks that hold ids, so the work follows what arrived,
        not the top rung."""
        n = plan.uniq.shape[0]
        legs = []
        for need, top, bounded, route in self._remote_transfers(plan):
            rung = self._rung(need, top, bounded)
            length = self._received_length(self.config.ladder(top, bounded)[-1])

            def forward(cap, route=route, length=length):
                sent = route(cap, None)
                ids = jnp.where(sent.mask, sent.ids, -1)
                return jnp.pad(ids, (0, length - ids.shape[0]), constant_values=-1)
            received, cap = self._switch(None, top, bounded, forward, rung=rung)
            legs.append((route, top, bounded, rung, received, cap))
        own = jnp.where(plan.local, plan.uniq, -1)
        answers = answer_filled(owner_fn, jnp.concatenate([own] + [leg[4] for leg in legs]))
        local = jax.tree.map(lambda a: a[:n], answers)
        got = jax.tree.map(jnp.zeros_like, local)
        filled = jnp.zeros(n, bool)
        ans_bytes = row_bytes(local)
        caps, wire, overflow, start = [], jnp.float32(0), jnp.int32(0), n
        for route, top, bounded, rung, received, cap in legs:
            mine = jax.tree.map(lambda a, s=start, k=received.shape[0]: a[s:s + k], answers)
            start += received.shape[0]

            def back(cap, route=route, received=received, mine=mine, into=(got, filled)):
                k = self._received_length(cap)
                sent = route(cap, None, received=received[:k])
                got, now = sent.back(jax.tree.map(lambda a: a[:k], mine), into)
                return got, now, sent.overflow, sent.wire(4, ans_bytes)
            (got, filled, lost, w), _ = self._switch(None, top, bounded, back, rung=rung)
            caps.append(cap)
            wire, overflow = wire + w, overflow + lost
        return local, got, caps, wire, overflow

    def _remote_transfers(self, plan: _Plan):
        """The transfers, none on a one-device mesh (where every id is local)."""
        return self._transfers(plan) if self.num_parts > 1 else []

    def _rung(self, need, top, bounded):
        """Index of the smallest rung >= the devices' largest need (the top one if none
        is): the same on every device."""
        ladder = self.config.ladder(top, bounded)
        return jnp.minimum(jnp.searchsorted(jnp.asarray(ladder), lax.pmax(need, self.axis)),
                           len(ladder) - 1)

    def _switch(self, need, top, bounded, branch, rung=None):
        """Run `branch(cap)` for the smallest rung >= the devices' largest need (or for
        the given rung index, which every device must agree on)."""
        ladder = self.config.ladder(top, bounded)
        if rung is None:
            rung = self._rung(need, top, bounded)
        cap = jnp.asarray(ladder, jnp.int32)[rung]
        if len(ladder) == 1:
            return branch(ladder[0]), cap
        return lax.switch(rung, [lambda c=c: branch(c) for c in ladder]), cap

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

    def _relayed(self, plan: _Plan, owner_fn: OwnerFn, ans_bytes: int):
        """all_to_all gather with the busiest pairs' excess relayed (see `relay`).

        Returns (compact answers [n], filled bool[n], caps, wire, overflow, inner stats).
        """
        n, P, axis = plan.uniq.shape[0], self.num_parts, self.axis
        me = lax.axis_index(axis)
        matrix = lax.all_gather(plan.counts, axis)                   # [sender, owner]
        direct = jnp.asarray(self.config.ladder(n), jnp.int32)       # [R]
        relay_ladder = self.config.ladder(-(-n // P))
        relay = jnp.asarray(relay_ladder, jnp.int32)

        def rung_of(ladder, need):
            return ladder[jnp.minimum(jnp.searchsorted(ladder, need), ladder.shape[0] - 1)]

        # Traffic per pair slot for each direct rung: the rung, plus the two relay legs.
        excess = jnp.maximum(matrix[None] - direct[:, None, None], 0)          # [R, P, P]
        leg1 = -(-jnp.max(jnp.sum(excess, axis=2), axis=1) // P)               # [R]
        leg2 = jnp.max(jnp.sum(-(-excess // P), axis=1), axis=1)               # [R]
        cost = direct + jnp.where(leg1 > 0, rung_of(relay, leg1) + rung_of(direct, leg2), 0)
        best = jnp.argmin(cost)
        c1 = direct[best]

        # Direct leg: each pair's first c1 ids.
        (_, _, _, route), = self._transfers(plan)

        def direct_branch(cap):
            sent = route(cap, None)
            got, filled = sent.back(owner_fn(jnp.maximum(sent.ids, 0), sent.mask))
            return got, filled, sent.wire(4, ans_bytes)
        (got, filled, wire), _ = self._switch(None, n, True, direct_branch, rung=best)

        # Relay legs: the rest, dealt round-robin over intermediate devices.
        owner = self.owner(plan.compact)
        rank = jnp.arange(n, dtype=jnp.int32) - plan.start[owner]
        extra = (plan.compact >= 0) & (rank >= c1)
        x = running_count(extra) - 1
        via, slot = (x + me) % P, x // P
        need = -(-jnp.sum(extra, dtype=jnp.int32) // P)
        rung = jnp.minimum(jnp.searchsorted(relay, lax.pmax(need, axis)), relay.shape[0] - 1)
        top = relay_ladder[-1]

        def out_leg(cap):
            ok = extra & (slot < cap)
            send = jnp.full((P, cap), -1, jnp.int32).at[
                jnp.where(ok, via, P), slot].set(plan.compact, mode="drop")
            recv = lax.all_to_all(send, axis, 0, 0, tiled=True)
            return (jnp.pad(recv, ((0, 0), (0, top - cap)), constant_values=-1).reshape(-1),
                    jnp.sum(extra & ~ok, dtype=jnp.int32),
                    jnp.float32((P - 1) * cap * 4))
        (held, lost, w1), cap1 = self._switch(None, top, True, out_leg, rung=rung)
        inner = Exchange(self.offsets, dataclasses.replace(self.config, relay=False), axis)
        fetched, inner_stats = inner.gather(held, held >= 0, owner_fn)

        def back_leg(cap):
            ok = extra & (slot < cap)
            ans = jax.tree.map(lambda a: lax.all_to_all(
                a.reshape((P, top) + a.shape[1:])[:, :cap], axis, 0, 0, tiled=True
            ).reshape((P * cap,) + a.shape[1:]), fetched)
            return _take(ans, via * cap + slot, ok), jnp.float32((P - 1) * cap * ans_bytes)
        (relayed, w3), _ = self._switch(None, top, True, back_leg, rung=rung)
        got = _select(extra, relayed, got)
        filled = filled | (extra & (slot < cap1))
        return got, filled, [c1, cap1], wire + w1 + w3, lost, inner_stats

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
        plan = self._plan(ids, valid, cache_ids, distinct)
        n = ids.shape[0]
        # Relay only when nothing can overflow: an intermediate deduplicates, so it could
        # not count a lost id once per requester.
        relayed = (self.config.strategy is Strategy.ALL_TO_ALL and self.config.relay
                   and self.config.max_capacity is None and self.num_parts > 2)
        once = once and not relayed and self.num_parts > 1
        if once:
            answers, remote_answers, caps, wire, overflow = self._answer_once(plan, owner_fn)
        else:
            answers = owner_fn(plan.uniq, plan.local)
        ans_bytes = row_bytes(answers)
        if cache_values is not None:
            answers = _select(plan.cached, _take(cache_values, plan.cache_pos, plan.cached),
                              answers)
        inner = None
        if not once:
            remote_answers = jax.tree.map(jnp.zeros_like, answers)
            filled = jnp.zeros(n, bool)
            caps, wire, overflow = [], jnp.float32(0), jnp.int32(0)
        if relayed:
            remote_answers, _, caps, wire, overflow, inner = self._relayed(
                plan, owner_fn, ans_bytes)
        elif not once:
            for need, top, bounded, route in self._remote_transfers(plan):
                # Each transfer writes its answers into the one buffer, so memory does
                # not grow with the number of transfers (the ring has P - 1).
                def branch(cap, route=route, into=(remote_answers, filled)):
                    sent = route(cap, None)
                    got, now = sent.back(owner_fn(jnp.maximum(sent.ids, 0), sent.mask), into)
                    return got, now, sent.overflow, sent.wire(4, ans_bytes)
                (remote_answers, filled, lost, w), cap = self._switch(need, top, bounded, branch)
                caps.append(cap)
                wire, overflow = wire + w, overflow + lost
        answers = _select(plan.remote, _take(remote_answers, plan.slot, plan.remote), answers)
        answers = _take(answers, plan.inverse, plan.valid[plan.inverse] & valid)
        return answers, self._stats(plan, caps, wire, overflow, out_of_range, inner)

    def scatter_add(self, ids, valid, values, *, contains=None
                    ) -> tuple[tuple[jnp.ndarray, PyTree, jnp.ndarray],
                                                       ExchangeStats]:
        """Transpose of `gather`: send each value to its id's owner and sum per id there.

        ids: int[n]; valid: bool[n]; values: pytree of [n, ...]. Returns, on each owner,
        `(owned_ids int32[M], sums [M, ...], mask bool[M])`: the distinct ids it owns that
        any device sent (sorted, padding where mask is False) with the sum of their
        values. M is static: n plus the largest total any transfer can deliver.
        """
        ids = ids.astype(jnp.int32)
        valid, out_of_range = self._screen(ids, valid, contains)
        plan = self._plan(ids, valid)
        n = ids.shape[0]
        values = jax.tree.map(lambda x: jnp.where(
            valid.reshape((n,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype)), values)
        summed = jax.tree.map(lambda x: jax.ops.segment_sum(x, plan.inverse, num_segments=n),
                              values)
        payload = _put(n, summed, plan.slot, plan.remote)            # compact order
        pay_bytes = row_bytes(summed)
        parts_ids, parts_vals = [jnp.where(plan.local, plan.uniq, -1)], [summed]
        caps, wire, overflow = [], jnp.float32(0), jnp.int32(0)
        for need, top, bounded, route in self._remote_transfers(plan):
            ladder = self.config.ladder(top, bounded)

            def branch(cap, route=route, top_rung=ladder[-1]):
                sent = route(cap, payload)
                size = sent.ids.shape[0] * top_rung // cap       # the top rung's size
                pad = size - sent.ids.shape[0]
                got_ids = jnp.pad(jnp.where(sent.mask, sent.ids, -1), (0, pad), constant_values=-1)
                got = jax.tree.map(lambda x: jnp.pad(
                    x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), sent.payload)
                return got_ids, got, sent.overflow, sent.wire(4 + pay_bytes, 0)
            (got_ids, got, lost, w), cap = self._switch(need, top, bounded, branch)
            parts_ids.append(got_ids)
            parts_vals.append(got)
            caps.append(cap)
            wire, overflow = wire + w, overflow + lost
        all_ids = jnp.concatenate(parts_ids)
        all_vals = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts_vals)
        m = all_ids.shape[0]
        owned, inverse = jnp.unique(jnp.where(all_ids >= 0, all_ids, _EMPTY), size=m,
                                    fill_value=_EMPTY, return_inverse=True)
        sums = jax.tree.map(lambda x: jax.ops.segment_sum(x, inverse.reshape(-1), num_segments=m),
                            all_vals)
        mask = owned != _EMPTY
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
        answers = _select(valid, answers, jax.tree.map(jnp.zeros_like, answers))
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
