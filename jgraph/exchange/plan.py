"""The request plan: one device's ids deduplicated, split into local, cached and remote,
and the remote ones grouped by owner. Every transport moves a plan's groups."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange.segments import FEW_SEGMENTS, exclusive_sum, owner_of, running_count

EMPTY = jnp.iinfo(jnp.int32).max   # pads the deduplicated ids: sorts after every real id


class Plan(NamedTuple):
    """One device's deduplicated request. n = request size; P = partitions.

    uniq: int32[n] distinct ids, sorted unless declared distinct, EMPTY-padded;
    inverse: int32[n] request -> uniq;
    valid, local, cached, remote: bool[n] over uniq; cache_pos: int32[n] each cached
    entry's row in the cache;
    compact: int32[n] the remote ids, grouped by owner, -1-padded; slot: int32[n] each
    remote uniq entry's place in compact; start, counts: int32[P] owner groups of compact;
    tally: int32[4] this device's (requested, non_local, cached, out_of_range) counts
    (`ExchangeStats`), from the scatter-add that counts the owner groups (the screened
    entries of a deduplicated request, which are not its uniq's, summed apart).
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
    tally: jnp.ndarray

    @property
    def size(self) -> int:
        return self.uniq.shape[0]

    @property
    def num_parts(self) -> int:
        return self.counts.shape[0]

    def group(self, p: jnp.ndarray | None, cap: int, offset=0
              ) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(positions in compact of the `cap` ids owned by p from the `offset`-th on,
        which of them exist): int32/bool[..., cap] for p of any shape; p None: every
        owner in order ([P, cap], without indexing by an arange)."""
        j = jnp.arange(cap, dtype=jnp.int32) + offset
        start, counts = (self.start, self.counts) if p is None else (self.start[p],
                                                                    self.counts[p])
        return start[..., None] + j, j < counts[..., None]

    def group_ids(self, p: jnp.ndarray | None, cap: int, offset=0
                  ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        """(ids, positions, exists) of `group(p, cap, offset)`: ids -1 where they do not."""
        idx, ok = self.group(p, cap, offset)
        return jnp.where(ok, jnp.take(self.compact, jnp.where(ok, idx, 0)), -1), idx, ok


def make_plan(ids: jnp.ndarray, valid: jnp.ndarray, offsets: np.ndarray, axis: str,
              cache_ids: jnp.ndarray | None = None, distinct: bool = False,
              out_of_range: jnp.ndarray | None = None) -> Plan:
    """The plan of this device's request `ids` (int32[n]) where `valid`.

    cache_ids: int32[C] sorted ids answered by the replicated hot-node cache. distinct:
    the caller promises no valid id repeats (a sampler's frontier): the sort is skipped.
    out_of_range: bool[n] the request's entries screened out (counted in the tally).
    """
    n, num_parts = ids.shape[0], offsets.size - 1
    me = lax.axis_index(axis)
    if distinct:
        uniq, inverse = jnp.where(valid, ids, EMPTY), jnp.arange(n, dtype=jnp.int32)
    else:
        uniq, inverse = jnp.unique(jnp.where(valid, ids, EMPTY), size=n,
                                   fill_value=EMPTY, return_inverse=True)
        inverse = inverse.reshape(-1).astype(jnp.int32)
    uvalid = uniq != EMPTY
    owner = owner_of(offsets, uniq)
    local = uvalid & (owner == me)
    if cache_ids is not None and cache_ids.shape[0]:
        pos = jnp.clip(jnp.searchsorted(cache_ids, uniq), 0, cache_ids.shape[0] - 1)
        cached = uvalid & ~local & (cache_ids[pos] == uniq)
    else:
        pos, cached = jnp.zeros(n, jnp.int32), jnp.zeros(n, bool)
    remote = uvalid & ~local & ~cached
    # One scatter-add counts the remote ids by owner (segments 0..P-1) and, past them,
    # the local and cached ones, and the screened-out entries where uniq is the request
    # itself (distinct); the rest go to a segment past the end, which it drops.
    is_local, is_cached, is_screened, dropped = range(num_parts, num_parts + 4)
    kind = jnp.where(remote, owner, jnp.where(local, is_local, jnp.where(
        cached, is_cached, dropped)))
    screened = out_of_range is not None
    if screened and distinct:
        kind = jnp.where(out_of_range, is_screened, kind)
    seg = jax.ops.segment_sum(jnp.ones(n, jnp.int32), kind, num_segments=dropped)
    counts = seg[:num_parts]
    non_local = jnp.sum(counts) + seg[is_cached]
    tally = jnp.stack([non_local + seg[is_local], non_local, seg[is_cached],
                       seg[is_screened] if distinct or not screened
                       else jnp.sum(out_of_range, dtype=jnp.int32)])
    start = exclusive_sum(counts, n)
    # Sorted ids are already grouped by owner.
    slot = _slots_by_owner(owner, remote, start) if distinct else running_count(remote) - 1
    compact = jnp.full(n, -1, jnp.int32).at[jnp.where(remote, slot, n)].set(uniq, mode="drop")
    return Plan(uniq, inverse, uvalid, local, cached, pos.astype(jnp.int32), remote,
                compact, slot, start.astype(jnp.int32), counts, tally)


def _slots_by_owner(owner: jnp.ndarray, remote: jnp.ndarray, start: jnp.ndarray
                    ) -> jnp.ndarray:
    """int32[n]: each remote entry's place in compact, after the earlier ones of its
    owner (request order within an owner), -1 elsewhere; start: int32[P] the owners'
    groups. At most `FEW_SEGMENTS` owners are counted (`_slots_counted`), more sorted
    (`_slots_sorted`), on every platform: XLA fuses the count's [P, n] one-hot, and an
    H100 program's temporaries differ by under 1 KB either way (measured at 2, 8 and 16
    devices on `test_memory_by_devices`'s graph)."""
    if start.shape[0] > FEW_SEGMENTS:
        return _slots_sorted(owner, remote, start)
    return _slots_counted(owner, remote, start)


def _slots_counted(owner: jnp.ndarray, remote: jnp.ndarray, start: jnp.ndarray
                   ) -> jnp.ndarray:
    """`_slots_by_owner` by a one-hot [P, n] that picks each entry's running count and
    start in one sum (cheaper than a sort on XLA:CPU)."""
    mine = (jnp.arange(start.shape[0])[:, None] == owner) & remote             # [P, n]
    place = running_count(mine, axis=1) - 1 + start[:, None]
    return jnp.where(remote, jnp.sum(jnp.where(mine, place, 0), axis=0), -1).astype(jnp.int32)


def _slots_sorted(owner: jnp.ndarray, remote: jnp.ndarray, start: jnp.ndarray
                  ) -> jnp.ndarray:
    """`_slots_by_owner` by a stable sort by owner (remote ids first, by owner, each
    owner's in request order): n entries whatever the device count."""
    n = owner.shape[0]
    order = jnp.argsort(jnp.where(remote, owner, start.shape[0]), stable=True)
    place = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    return jnp.where(remote, place, -1)
