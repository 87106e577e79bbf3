"""The relay: the all_to_all gather in two hops, its busiest pairs routed through
intermediate devices.

METIS partitions talk mostly to their neighbours, so a few device pairs need far more
than the rest, and one all_to_all pads every pair to the busiest (on facebook_musae in 8
parts, 2.8-3x the rows that must move). No schedule of uniform all_to_alls can move less
than the busiest owner's rows or the busiest requester's (1.30-1.39x there), and two of
them, each row going straight to its owner in either hop or through one intermediate,
come within a few percent of that (a linear program over every route: 1.38-1.44x).

So a relayed gather moves in two hops, A (requester -> intermediate) and B (intermediate
-> owner), the answers coming back the same way. A row goes straight to its owner in
hop B (its requester is its own intermediate: "direct"), or in hop A (its owner is its
intermediate: "held"), or through a third device. Every device all_gathers the
[requester, owner] counts and computes the same routing (`routing`): how many of each
pair's rows go through each intermediate, balancing the busiest pair of each hop.

Each hop's buffers hold `cap` rows per device pair, rounded up to whole chunks
(calibrated like any capacity: the busiest hop's load on the first batches, plus
headroom), but they move in chunks, as many as this batch's busiest pair of the hop
fills (answers in chunks of about `cap / CHUNKS` rows, ids in coarser ones), so the
bytes on the wire follow each batch's load, not the capacity. A batch whose
routing needs more than `cap` moves straight to the owners instead, in rounds of `cap`
(nothing is dropped; training grows the capacity when it sees one).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import PyTree, select
from jgraph.exchange.transport import Delivery, Transfer

ROUTE_MAX = 16
"""The most devices a gather relays over: every device holds the routing, [P, P, P]
integers (beyond, all_to_all gathers go straight to their owners)."""

ROUTE_ITERATIONS = 80
"""Balancing iterations of `routing`. On the 8 batches of facebook_musae in 8 parts
that `jgraph bench exchange` draws, 80 reach 1.40-1.46x the rows that must move (3-6%
above the lower bound of 1.33-1.40x; the optimum of two hops, a linear program, is
1.38-1.44x); 30 reach 1.42-1.48x."""

DIRECT_WEIGHT = 16.0
"""How much more of a pair's rows `routing` starts on each direct route than on each
relayed one: balancing then relays only what the busiest pairs cannot move directly."""

CHUNKS = 32
"""A hop pads each pair's answers by less than 1 / CHUNKS of the capacity: they move in
coarse chunks of STRIDE fine ones while a whole one is needed, then in fine ones. Ids
(4 bytes a row) move in coarse chunks only, padded by less than STRIDE / CHUNKS."""

STRIDE = 8
"""Fine chunks per coarse chunk: a hop takes at most CHUNKS / STRIDE coarse collectives
and STRIDE - 1 fine ones."""


def routing(pairs: jnp.ndarray, iterations: int = ROUTE_ITERATIONS) -> jnp.ndarray:
    """int32[j, i, k]: of the rows owner j answers requester i (`pairs[j, i]`, int32[P,
    P] with a zero diagonal), how many pass through device k. k == i: straight to the
    owner in hop B; k == j: straight to the owner in hop A; else both hops. Every
    pair's rows are routed exactly (the sum over k is `pairs`).

    Iterative proportional fitting toward the lower bound: every hop's pair holding at
    most half the busiest device's rows over the P - 1 others. Each iteration scales down
    the routes through overloaded pairs of hop B (owner j, intermediate k), then of hop
    A (intermediate k, requester i), then rescales each pair's routes to its rows."""
    P = pairs.shape[0]
    eye = jnp.eye(P, dtype=bool)
    rows = pairs.astype(jnp.float32)
    busiest = jnp.maximum(jnp.max(jnp.sum(rows, 0)), jnp.max(jnp.sum(rows, 1)))
    target = jnp.maximum(busiest / (2 * max(P - 1, 1)), 1.0)
    direct = eye[None, :, :] | eye[:, None, :]                   # [j, i, k]: k == i or k == j
    start = 1.0 + DIRECT_WEIGHT * direct
    x = rows[..., None] * start / jnp.sum(start, 2, keepdims=True)

    def fit(load, free):
        """Factor of each hop pair's routes: (target / load)^2 where overloaded."""
        return jnp.where(free, 1.0, jnp.minimum(1.0, target / jnp.maximum(load, 1e-6)) ** 2)

    def balance(_, x):
        x = x * fit(jnp.sum(x, 1), eye)[:, None, :]             # hop B: [j, k]
        x = x * fit(jnp.sum(x, 0), eye)[None, :, :]             # hop A: [i, k]
        return x * (rows / jnp.maximum(jnp.sum(x, 2), 1e-6))[..., None]
    x = lax.fori_loop(0, iterations, balance, x)
    # Integers: each pair's cumulative routes rounded, the last one its exact rows
    # (every route moves by less than a row; none is negative, whatever the magnitude).
    ends = jnp.minimum(jnp.round(jnp.cumsum(x, 2)).astype(jnp.int32), pairs[..., None])
    ends = ends.at[..., -1].set(pairs)
    return jnp.diff(ends, axis=2, prepend=jnp.zeros_like(ends[..., :1]))


def _coarse(trips):
    """Fine chunks rounded up to whole coarse ones."""
    return -(-trips // STRIDE) * STRIDE


def hop_loads(route: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(hop A's [k, i] rows intermediate k holds for requester i, hop B's [j, k] rows
    owner j answers intermediate k), zero where a device would send to itself."""
    eye = jnp.eye(route.shape[0], dtype=bool)
    return (jnp.where(eye, 0, jnp.sum(route, 0).T), jnp.where(eye, 0, jnp.sum(route, 1)))


def _count_below(cum: jnp.ndarray, at: jnp.ndarray) -> jnp.ndarray:
    """For inclusive cumulative counts `cum` [..., P] and positions `at` [...]: the
    group each position falls in (the number of cumulative counts <= it)."""
    return jnp.sum(cum <= at[..., None], axis=-1).astype(jnp.int32)


class Relay(Transfer):
    """A gather's remote ids in the two routed hops of the module docstring. Its need
    is the busiest hop pair's load in the routing (the busiest pair's, straight to the
    owners, where the devices' routings would disagree); `cap` rows per pair per hop."""

    laddered = False
    exact_wire = True

    def __init__(self, plan: Plan, axis: str):
        super().__init__(plan, axis)
        P = self.num_parts
        self.me = lax.axis_index(axis)
        asked = lax.all_gather(plan.counts, axis)                  # [requester, owner]
        self.pairs = jnp.where(jnp.eye(P, dtype=bool), 0, asked.T)  # [owner, requester]
        # Relayed where its two hops move less than one straight hop (else the routing
        # that sends every row straight to its owner in hop B).
        relayed, straight = routing(self.pairs), self.pairs[..., None] * jnp.eye(
            P, dtype=jnp.int32)[None]
        self.route = jnp.where(sum(jnp.max(load) for load in hop_loads(relayed))
                               < jnp.max(self.pairs), relayed, straight)
        # Every device must route alike: a checksum agrees (its largest and smallest
        # over the devices, in one all-reduce), and every row is routed.
        check = jnp.sum(self.route * jnp.arange(1, P ** 3 + 1, dtype=jnp.int32
                                                ).reshape(P, P, P))
        most = lax.pmax(jnp.stack([check, -check]), axis)
        self.routable = ((most[0] == -most[1]) & jnp.all(jnp.sum(self.route, 2) == self.pairs)
                         & jnp.all(self.route >= 0))
        self.busiest = jnp.max(self.pairs)
        self.loads = tuple(jnp.max(load) for load in hop_loads(self.route))   # hops A, B
        self.relayed_need = jnp.maximum(*self.loads)
        self.need = jnp.where(self.routable, self.relayed_need, self.busiest)
        self.top = self.n

    @classmethod
    def transfers(cls, plan: Plan, axis: str, offsets) -> list[Transfer]:
        return [cls(plan, axis)]

    # -- sizes ---------------------------------------------------------------------------

    @staticmethod
    def chunk(cap: int) -> int:
        """Rows of a pair that move together: the capacity is CHUNKS of them (rounded up)."""
        return -(-cap // CHUNKS)

    def _relayed(self, cap: int) -> jnp.ndarray:
        """bool: this batch moves relayed at `cap` (else straight, in rounds)."""
        return self.routable & (self.relayed_need <= cap)

    def rounds(self, cap: int) -> jnp.ndarray:
        straight = jnp.maximum(-(-self.busiest // cap), 1)
        return jnp.where(self._relayed(cap), 1, straight).astype(jnp.int32)

    def _layout(self, cap: int, offset) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(route [j, i, k] of the round from `offset`, its first row's rank in every
        pair): relayed in one round, or each pair's `cap` rows from `offset` on straight
        to the owner."""
        relayed = self._relayed(cap)
        straight = jnp.clip(self.pairs - offset, 0, cap)[..., None] * jnp.eye(
            self.num_parts, dtype=jnp.int32)[None]
        return jnp.where(relayed, self.route, straight), jnp.where(relayed, 0, offset)

    def _trips(self, cap: int, offset) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Fine chunks of `chunk(cap)` rows that hops A and B move in the round from
        `offset` (the same on every device): their busiest pair's rows, rounded up."""
        q, relayed = self.chunk(cap), self._relayed(cap)
        straight = jnp.clip(self.busiest - offset, 0, cap)
        return (jnp.where(relayed, -(-self.loads[0] // q), 0),
                jnp.where(relayed, -(-self.loads[1] // q), -(-straight // q)))

    def wire(self, cap, fwd_bytes, ans_bytes):
        q, P = self.chunk(cap), self.num_parts
        trips_a, trips_b = self._trips(cap, 0)
        # Straight rounds: every round but the last moves a whole capacity.
        whole, rest = self.busiest // cap, -(-(self.busiest % cap) // q)
        full = -(-cap // q)
        ids = jnp.where(self._relayed(cap), _coarse(trips_a) + _coarse(trips_b),
                        whole * _coarse(full) + _coarse(rest))
        rows = jnp.where(self._relayed(cap), trips_a + trips_b, whole * full + rest)
        slots = lambda trips: float((P - 1) * q) * trips.astype(jnp.float32)
        return fwd_bytes * slots(ids) + ans_bytes * slots(rows)

    def received_length(self, cap):
        return 2 * self.num_parts * self.chunk(cap) * CHUNKS

    def estimate(self, remote):
        # Balanced traffic splits each pair's rows over the two hops; skew (METIS) needs
        # more: the bound above is 1.3-1.4x the mean pair's half on facebook_musae.
        return 0.75 * remote / max(self.num_parts - 1, 1)

    # -- moving ----------------------------------------------------------------------------

    def _hop(self, x: PyTree, trips, q: int, fill=0, fine: bool = True) -> PyTree:
        """Rows [P, L, ...] for each device -> rows [P, L, ...] from each device: the
        first `trips` fine chunks of `q` rows of every pair, one all_to_all per chunk,
        STRIDE fine chunks at a time while that many remain. fine=False: in coarse
        chunks only (ids, whose padding costs little: one collective fewer to compile)."""
        def mover(size, first):
            def chunk(t, out):
                def one(a, o):
                    part = lax.dynamic_slice_in_dim(a, first + t * size, size, axis=1)
                    got = lax.all_to_all(part, self.axis, 0, 0, tiled=True)
                    return lax.dynamic_update_slice_in_dim(o, got, first + t * size, axis=1)
                return jax.tree.map(one, x, out)
            return chunk
        coarse = trips // STRIDE
        out = jax.tree.map(lambda a: jnp.full_like(a, fill), x)
        if not fine:
            return lax.fori_loop(0, -(-trips // STRIDE), mover(q * STRIDE, 0), out)
        out = lax.fori_loop(0, coarse, mover(q * STRIDE, 0), out)
        return lax.fori_loop(0, trips - coarse * STRIDE, mover(q, coarse * STRIDE * q), out)

    def _requests(self, route, base):
        """Where each of this device's compact entries goes in the round: (in the round,
        its intermediate k, its place in the hop A buffer for k, its place in the hop B
        buffer for its owner j, j)."""
        plan, me = self.plan, self.me
        e = jnp.arange(self.n, dtype=jnp.int32)
        j = jnp.minimum(_count_below(jnp.cumsum(plan.counts), e), self.num_parts - 1)
        mine = route[:, me, :]                                        # [j, k]
        rank = e - plan.start[j] - base
        ok = (plan.compact >= 0) & (rank >= 0) & (rank < jnp.sum(mine, 1)[j])
        cum = jnp.cumsum(mine, 1)                                     # [j, k]
        k = jnp.minimum(_count_below(cum[j], rank), self.num_parts - 1)
        t = rank - (cum[j, k] - mine[j, k])
        before_a = (jnp.cumsum(route, 0) - route)[j, me, k]          # earlier owners' rows
        before_b = (jnp.cumsum(route, 1) - route)[j, me, k]          # earlier requesters'
        return ok, k, before_a + t, before_b + t, j

    def _groups(self, counts, length):
        """For a [P, length] buffer whose row r holds `counts[r, g]` rows of each group
        g in turn: each slot's (group, rank in its group, whether it holds a row); this
        device's own row holds none."""
        P = self.num_parts
        cum = jnp.cumsum(counts, 1)
        p = jnp.arange(length, dtype=jnp.int32)
        g = jnp.minimum(_count_below(cum[:, None, :], jnp.broadcast_to(p, (P, length))),
                        P - 1)
        r = jnp.arange(P, dtype=jnp.int32)[:, None]
        return g, p - (cum[r, g] - counts[r, g]), (p < cum[:, -1:]) & (r != self.me)

    def _held(self, route, length):
        """For the hop A buffer this device receives, slot [i, p]: (the owner j of the
        row, its place in the hop B buffer for j, whether it holds a row)."""
        through = route[:, :, self.me]                                # [j, i]
        j, t, ok = self._groups(through.T, length)
        i = jnp.arange(self.num_parts, dtype=jnp.int32)[:, None]
        return j, (jnp.cumsum(through, 1) - through)[j, i] + t, ok

    def _forwarded(self, route, length):
        """For the hop B buffer this device sends, slot [j, p]: (the requester i of the
        row, its place in the hop A buffer received from i, whether it holds a row)."""
        through = route[:, :, self.me]                                # [j, i]
        i, t, ok = self._groups(through, length)
        j = jnp.arange(self.num_parts, dtype=jnp.int32)[:, None]
        return i, (jnp.cumsum(through, 0) - through)[j, i] + t, ok

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        if payload is not None:
            raise NotImplementedError("the relay moves gathers only; scatters go "
                                      "straight (all_to_all)")
        plan, P, q = self.plan, self.num_parts, self.chunk(cap)
        length = q * CHUNKS
        route, base = self._layout(cap, offset)
        overflow = jnp.where(self._relayed(cap), 0, jnp.sum(
            jnp.maximum(plan.counts - offset - cap, 0)))
        if received is None:
            trips_a, trips_b = self._trips(cap, offset)
            ok, k, at_a, at_b, j = self._requests(route, base)
            hop_a = (ok & (k != self.me))
            ids_a = jnp.full((P, length), -1, jnp.int32).at[
                jnp.where(hop_a, k, P), at_a].set(plan.compact, mode="drop")
            got_a = self._hop(ids_a, trips_a, q, fill=-1, fine=False)             # [i, p] from i
            i, place, fwd = self._forwarded(route, length)
            own = jnp.full((P, length), -1, jnp.int32).at[
                jnp.where(ok & (k == self.me), j, P), at_b].set(plan.compact, mode="drop")
            ids_b = jnp.where(fwd, jnp.where(i == self.me, own, got_a[i, place]), -1)
            got_b = self._hop(ids_b, trips_b, q, fill=-1, fine=False)              # [k, p] from k
            owner, _, held = self._held(route, length)
            held_ids = jnp.where(held & (owner == self.me), got_a, -1)
            received = jnp.concatenate([got_b.reshape(-1), held_ids.reshape(-1)])
        return Delivery(cap, received, received >= 0, None, overflow)

    def back(self, sent, answers, into=None, offset=0):
        cap, P = sent.cap, self.num_parts
        q = self.chunk(cap)
        length = q * CHUNKS
        route, base = self._layout(cap, offset)
        trips_a, trips_b = self._trips(cap, offset)
        split = lambda a, s: a[s * P * length:(s + 1) * P * length].reshape(
            (P, length) + a.shape[1:])
        got_b = self._hop(jax.tree.map(lambda a: split(a, 0), answers), trips_b, q)
        owner, place, held = self._held(route, length)
        mine = held & (owner == self.me)
        flat = lambda a: a.reshape((P * length,) + a.shape[2:])
        ans_a = jax.tree.map(
            lambda b, h: jnp.where(
                mine.reshape(mine.shape + (1,) * (h.ndim - 2)), h,
                flat(b)[jnp.clip(owner * length + place, 0, P * length - 1)]),
            got_b, jax.tree.map(lambda a: split(a, 1), answers))
        got_a = self._hop(ans_a, trips_a, q)                          # [k, p] from k
        ok, k, at_a, at_b, j = self._requests(route, base)
        direct = k == self.me
        at = jnp.where(direct, j * length + at_b, k * length + at_a)
        rows = jax.tree.map(
            lambda a, b: jnp.where(direct.reshape((-1,) + (1,) * (a.ndim - 2)),
                                   flat(b)[jnp.clip(at, 0, P * length - 1)],
                                   flat(a)[jnp.clip(at, 0, P * length - 1)]),
            got_a, got_b)
        # Rows are already in compact order: a select, not a scatter.
        base, filled = into if into is not None else (
            jax.tree.map(jnp.zeros_like, rows), jnp.zeros_like(ok))
        return select(ok, rows, base), filled | ok
