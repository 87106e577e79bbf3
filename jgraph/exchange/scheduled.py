"""The scheduled transport: ppermute rounds of a static pair schedule, in chunks.

Where XLA has no ragged_all_to_all (CPU), all_to_all pads every (sender, owner) pair to
the busiest pair's capacity; METIS partitions load a few pairs far more than the rest,
so most of that wire is padding. Here the device pairs meet in rounds of a static
schedule, each round a partial permutation (every device sends to at most one owner and
is asked by at most one sender), built on the host so that pairs of similar expected
load share a round. The transfer's capacity is a *chunk* of ids, about an eighth of
the mean pair load: round r takes as many chunk iterations as its busiest pair needs
(the same on every device, from one `pmax`), so a pair's padding is less than a chunk
per round, not the gap to the busiest pair. The exchange runs every iteration of every
round in one loop (`Transfer.rounds`); iteration t finds its round and chunk from the
cumulative iteration counts and moves the chunk with that round's ppermute, picked by
`lax.switch` (a branch per round, each a single ppermute).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.segments import exclusive_sum, segment_of
from jgraph.exchange.transport import Delivery, Transfer, put_back

CHUNKS_PER_PAIR = 8
"""The chunk is about the mean pair load over this: finer chunks pad less and loop more."""

JOIN_RATIO = 0.5
"""A pair joins a round only if its weight is at least this times the round's first
(heaviest) pair's: a round's iterations are set by its heaviest pair, so lighter pairs
would be padded up to it."""


def build_schedule(num_parts: int, pair_weights=None) -> np.ndarray:
    """int32[R, P] `dest[r, i]`: the owner device i sends its ids to in round r, -1 for
    none. Every ordered pair i != j appears exactly once; in each round no owner
    appears twice (a partial permutation).

    pair_weights: float[P, P], `pair_weights[i, j]` the ids device i is expected to ask
    of device j (e.g. partition i's halo owned by j). Greedy: pairs by descending
    weight, each joining the first round where sender and owner are both free and its
    weight is at least `JOIN_RATIO` x the round's first pair's, else opening a round.
    None: the P - 1 shifts, `dest[s - 1, i] = (i + s) % P`.
    """
    P = num_parts
    if pair_weights is None:
        return np.array([[(i + s) % P for i in range(P)] for s in range(1, P)],
                        np.int32).reshape(-1, P)
    weights = np.asarray(pair_weights, np.float64)
    if weights.shape != (P, P):
        raise ValueError(f"pair_weights must be [{P}, {P}], got {weights.shape}")
    senders, owners = np.nonzero(~np.eye(P, dtype=bool))
    order = np.argsort(-weights[senders, owners], kind="stable")
    dest = np.full((0, P), -1, np.int32)
    asked = np.zeros((0, P), bool)             # [round, owner]: already asked this round
    first = np.zeros(0)                        # each round's heaviest weight
    for i, j in zip(senders[order], owners[order]):
        w = weights[i, j]
        fits = (dest[:, i] < 0) & ~asked[:, j] & (w >= JOIN_RATIO * first)
        if fits.any():
            r = int(np.argmax(fits))
        else:
            r = dest.shape[0]
            dest = np.vstack([dest, np.full((1, P), -1, np.int32)])
            asked = np.vstack([asked, np.zeros((1, P), bool)])
            first = np.append(first, w)
        dest[r, i], asked[r, j] = j, True
    return dest


def sources(dest: np.ndarray) -> np.ndarray:
    """int32[R, P] `src[r, j]`: the device that sends to j in round r, -1 for none."""
    src = np.full(dest.shape, -1, np.int32)
    for r, i in zip(*np.nonzero(dest >= 0)):
        src[r, dest[r, i]] = i
    return src


class Scheduled(Transfer):
    """All rounds of a schedule `dest` (`build_schedule`) as one looped transfer.

    Its capacity is the chunk; `rounds(cap)` is the total iterations of every round
    (round r: its busiest pair's ids over `cap`, rounded up), and `send`'s `offset` /
    `cap` is the iteration. Its need is this device's remote ids over (P - 1) x
    `CHUNKS_PER_PAIR` (a chunk for the mean pair), what calibration measures."""

    chunked = True
    exact_wire = True
    scatters = False
    weighted = True

    def __init__(self, plan: Plan, axis: str, dest: np.ndarray):
        super().__init__(plan, axis)
        P = self.num_parts
        self.dest = dest
        self.me = lax.axis_index(axis)
        mine = jnp.asarray(dest)[:, self.me]                       # [R] my owner per round
        self.peer = jnp.maximum(mine, 0)
        self.sends = mine >= 0
        self.receives = jnp.asarray(sources(dest))[:, self.me] >= 0
        load = jnp.where(self.sends, plan.counts[self.peer], 0)
        self.busiest = lax.pmax(load, axis)                        # [R] per round
        self.forward = [[(i, int(j)) for i, j in enumerate(row) if j >= 0] for row in dest]
        self.backward = [[(j, i) for i, j in pairs] for pairs in self.forward]
        share = (P - 1) * CHUNKS_PER_PAIR
        self.need = (jnp.sum(plan.counts) + share - 1) // share
        self.top = self.n

    @classmethod
    def transfers(cls, plan, axis, offsets, schedule) -> list[Transfer]:
        return [cls(plan, axis, schedule)]

    @classmethod
    def schedule(cls, num_parts, pair_weights):
        return build_schedule(num_parts, pair_weights)

    def _iterations(self, cap: int) -> jnp.ndarray:
        """int32[R] chunk iterations of each round at `cap` (lax.div truncates, as a
        ceiling division of counts >= 0 needs: a floor division's correction is two more
        kernels on XLA:CPU wherever its result has several readers)."""
        return lax.div(self.busiest + cap - 1, jnp.int32(cap)).astype(jnp.int32)

    def rounds(self, cap):
        return jnp.maximum(jnp.sum(self._iterations(cap)), 1)

    def _at(self, cap: int, offset):
        """(round, the chunk's first id in the pair's group, whether this device sends
        in it) of iteration offset // cap; past the last iteration, round 0, no send."""
        k = self._iterations(cap)
        rounds = k.shape[0]
        # Where each round's iterations start, and where the last ends (a pair's group is
        # at most the request's n ids: ceil(n / cap) iterations a round).
        starts = exclusive_sum(jnp.append(k, 0), rounds * -(-self.n // cap))
        t = offset // cap
        r = segment_of(starts, t)           # `rounds` past the last iteration
        live = r < rounds
        r = jnp.minimum(r, rounds - 1)
        return r, (t - starts[r]) * cap, live & self.sends[r]

    def _permute(self, x: jnp.ndarray, r, perms) -> jnp.ndarray:
        """x moved by round r's permutation of `perms`: one branch per round."""
        return lax.switch(r, [lambda y, p=p: lax.ppermute(y, self.axis, p) for p in perms],
                          x)

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        if payload is not None:
            raise NotImplementedError("the scheduled transport moves gathers only; "
                                      "scatter_add moves through all_to_all")
        r, first, live = self._at(cap, offset)
        ids, _, ok = self.plan.group_ids(self.peer[r], cap, first)
        if received is None:
            received = self._permute(jnp.where(ok & live, ids, -1), r, self.forward)
            # A device no one sends to in round r receives ppermute's zeros.
            received = jnp.where(self.receives[r], received, -1)
        return Delivery(cap, received, received >= 0, None, jnp.int32(0))

    def back(self, sent, answers, into=None, offset=0):
        r, first, live = self._at(sent.cap, offset)
        answers = jax.tree.map(lambda x: self._permute(x, r, self.backward), answers)
        idx, ok = self.plan.group(self.peer[r], sent.cap, first)
        return put_back(self.n, answers, idx, ok & live, into)

    def wire(self, cap, fwd_bytes, ans_bytes):
        # Every round this device sends in, all of its iterations: ids out, answers back.
        slots = jnp.sum(jnp.where(self.sends, self._iterations(cap), 0)) * cap
        return (slots * (fwd_bytes + ans_bytes)).astype(jnp.float32)

    def estimate(self, remote):
        return remote / (max(self.num_parts - 1, 1) * CHUNKS_PER_PAIR)
