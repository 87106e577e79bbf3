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
headroom), but they move in chunks of about `cap / CHUNKS` rows, ids and answers
alike, as many as this batch's busiest pair of the hop fills, so the bytes on the wire
follow each batch's load, not the capacity. Both hops of the ids move in one loop of
chunks, and both hops of the answers in another (`_hops`): one all_to_all each to
compile, as a straight gather has. A batch whose routing needs more than `cap` moves
straight to the owners instead, in rounds of `cap` (nothing is dropped; training grows
the capacity when it sees one).

Where relaying would save little (RELAY_GAIN) a batch's routing sends every row
straight; where a gather's calibration batches relayed nothing, training records it as
straight and the relay is not compiled for it (`Exchange.fitted`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.rows import PyTree
from jgraph.exchange.segments import exclusive_sum, segment_of
from jgraph.exchange.transport import Delivery, Transfer, put_back

ROUTE_MAX = 16
"""The most devices a gather relays over: every device holds the routing, [P, P, P]
integers (beyond, all_to_all gathers go straight to their owners)."""

ROUTE_ITERATIONS = 80
"""Balancing iterations of `routing`. On the 8 batches of facebook_musae in 8 parts
that `jgraph bench exchange` draws, 80 reach 1.40-1.46x the rows that must move (3-6%
above the lower bound of 1.33-1.40x; the optimum of two hops, a linear program, is
1.38-1.44x); 30 reach 1.42-1.48x."""

RELAY_GAIN = 0.75
"""A batch relays only where its two hops' busiest pairs move at most this fraction of
one straight hop's busiest pair: a second hop costs a second collective and the
routing's work, not worth a few percent. facebook_musae's METIS batches relay at
about 0.5; the 200k-node bench graph's frontiers (nearly every node, from every
device) would at 0.95 and above, and go straight."""

DIRECT_WEIGHT = 16.0
"""How much more of a pair's rows `routing` starts on each direct route than on each
relayed one: balancing then relays only what the busiest pairs cannot move directly."""

CHUNKS = 32
"""A hop pads each pair's rows by less than 1 / CHUNKS of the capacity (a chunk), at the
price of up to CHUNKS collectives a hop."""

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


def hop_loads(route: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(hop A's [k, i] rows intermediate k holds for requester i, hop B's [j, k] rows
    owner j answers intermediate k), zero where a device would send to itself."""
    eye = jnp.eye(route.shape[0], dtype=bool)
    return (jnp.where(eye, 0, jnp.sum(route, 0).T), jnp.where(eye, 0, jnp.sum(route, 1)))


class Relay(Transfer):
    """A gather's remote ids in the two routed hops of the module docstring. Its need
    is the busiest hop pair's load in the routing (the busiest pair's, straight to the
    owners, where the devices' routings would disagree); `cap` rows per pair per hop."""

    laddered = False
    exact_wire = True
    scatters = False
    optional = True

    def __init__(self, plan: Plan, axis: str):
        super().__init__(plan, axis)
        P = self.num_parts
        self.me = lax.axis_index(axis)
        asked = lax.all_gather(plan.counts, axis)                  # [requester, owner]
        self.pairs = jnp.where(jnp.eye(P, dtype=bool), 0, asked.T)  # [owner, requester]
        # Relayed where its two hops move clearly less than one straight hop
        # (RELAY_GAIN; else the routing that sends every row straight to its owner in
        # hop B).
        relayed, straight = routing(self.pairs), self.pairs[..., None] * jnp.eye(
            P, dtype=jnp.int32)[None]
        self.route = jnp.where(sum(jnp.max(load) for load in hop_loads(relayed))
                               <= RELAY_GAIN * jnp.max(self.pairs), relayed, straight)
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
        # This device's rows that its routing sends through a third device.
        j, k = jnp.arange(P)[:, None], jnp.arange(P)[None, :]
        third = (k != self.me) & (k != j)
        self.relayed = jnp.where(self.routable, jnp.sum(
            jnp.where(third, self.route[:, self.me, :], 0)), 0)
        self.top = self.n

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
        """Chunks of `chunk(cap)` rows that hops A and B move in the round from
        `offset` (the same on every device): their busiest pair's rows, rounded up."""
        q, relayed = self.chunk(cap), self._relayed(cap)
        straight = jnp.clip(self.busiest - offset, 0, cap)
        return (jnp.where(relayed, -(-self.loads[0] // q), 0),
                jnp.where(relayed, -(-self.loads[1] // q), -(-straight // q)))

    def wire(self, cap, fwd_bytes, ans_bytes):
        q, P = self.chunk(cap), self.num_parts
        trips_a, trips_b = self._trips(cap, 0)
        # Relayed: each hop's busiest pair, in chunks; straight: a whole capacity every
        # round but the last. Ids and answers move in the same chunks.
        whole, rest = self.busiest // cap, -(-(self.busiest % cap) // q)
        trips = jnp.where(self._relayed(cap), trips_a + trips_b, whole * -(-cap // q) + rest)
        return float((P - 1) * q * (fwd_bytes + ans_bytes)) * trips.astype(jnp.float32)

    def received_length(self, cap):
        return 2 * self.num_parts * self.chunk(cap) * CHUNKS

    def estimate(self, remote):
        # Balanced traffic splits each pair's rows over the two hops; skew (METIS) needs
        # more: the bound above is 1.3-1.4x the mean pair's half on facebook_musae.
        return 0.75 * remote / max(self.num_parts - 1, 1)

    # -- moving ----------------------------------------------------------------------------

    def _slots(self, cap: int, offset) -> dict[str, jnp.ndarray]:
        """Where every slot of the round's [P, length] buffers comes from and goes to,
        on this device ("entry": a place in the plan's compact order, n: none; "source":
        a row of the flattened [2P, length] buffer of the hops, or entry e as
        2P * length + e; -1: an empty slot):

        to_a: [k, p] the source this device sends intermediate k in hop A (an entry);
        to_b: [j, p] the source it sends owner j in hop B: a slot [i, p'] of the hop A
            buffer it received (i * length + p'), or one of its own entries (direct);
        answer: [i, p] for the hop A slot received from requester i, the answer to send
            back: a slot of hop B's answers, j * length + p', or of the answers to the
            rows this device owns itself, (P + i) * length + p;
        held: [i, p] whether that hop A slot is owned here (answered without hop B);
        back: [2P * length] the entry of each answer that comes back, hop B's then hop
            A's (n where none)."""
        plan, P, me, n = self.plan, self.num_parts, self.me, self.n
        length = self.chunk(cap) * CHUNKS
        size = 2 * P * length
        route, base = self._layout(cap, offset)
        # A pair's rows are at most a request's n; the rows through this device for one
        # owner, at most P requests' (the bound each running sum below is exact under).
        most = P * n
        mine = route[:, me, :]                                        # [j, k]
        first = plan.start[:, None] + base + exclusive_sum(mine, most, 1)  # [j, k]: entry
        through = route[:, :, me]                                     # [j, i]
        cols = jnp.arange(P, dtype=jnp.int32)
        # Three buffers, each of whose rows r holds counts[r, g] rows of each group g in
        # turn, the t-th of them from source starts[r, g] + t: this device's hop A
        # buffer (row k: its rows through k, owner by owner), its hop B buffer (row j:
        # the rows through it for owner j, requester by requester, its own among them)
        # and the hop A buffer it receives (row i: requester i's, owner by owner).
        counts = jnp.stack([mine.T, through, through.T])
        starts = jnp.stack([
            size + first.T,
            jnp.where(cols == me, size + first[:, me][:, None],
                      cols * length + exclusive_sum(through, most, 0)),
            cols * length + exclusive_sum(through, most, 1).T])   # held: below
        begin = exclusive_sum(counts, most, 2)                        # [3, r, g]
        p = jnp.arange(length, dtype=jnp.int32)
        group = segment_of(begin, jnp.broadcast_to(p, (3, P, length)))   # [3, r, p]
        b, r = jnp.arange(3)[:, None, None], cols[None, :, None]
        source = starts[b, r, group] + p - begin[b, r, group]
        ok = (p < begin[:, :, -1:] + counts[:, :, -1:]) & (r != me)
        source = jnp.where(ok, source, -1)
        to_a, to_b, answer = source
        own, held = ok[1] & (group[1] == me), ok[2] & (group[2] == me)
        # A held row's answer is the owner's own, in the slot's place of the second half.
        slot = jnp.arange(P * length, dtype=jnp.int32).reshape(P, length)
        answer = jnp.where(held, P * length + slot, answer)
        back = jnp.concatenate([jnp.where(own, to_b - size, n).reshape(-1),
                                jnp.where(ok[0], to_a - size, n).reshape(-1)])
        return dict(to_a=to_a, to_b=to_b, held=held,
                    answer=jnp.clip(answer, 0, size - 1), back=back)

    def _hops(self, buf: PyTree, q: int, legs, extra=None, fill=None) -> PyTree:
        """Two hops in one loop of chunks: `buf` ([2P, L, ...] rows) after each leg
        `(trips, source [P, L], row)` in turn moved its first `trips` chunks of `q` slots
        of every pair, one all_to_all each: slot [d, p] sent to device d is row
        `source[d, p]` of the flattened `buf` (or of `extra` from 2P * L on; `fill`
        where negative), and what device d sends this one lands in `buf[row + d, p]`.
        The rest of `buf` keeps what it held."""
        (trips_1, source_1, row_1), (trips_2, source_2, row_2) = legs

        def chunk(c, buf):
            second = c >= trips_1
            col = jnp.where(second, c - trips_1, c) * q
            at = jnp.where(second, lax.dynamic_slice_in_dim(source_2, col, q, axis=1),
                           lax.dynamic_slice_in_dim(source_1, col, q, axis=1))     # [P, q]

            def one(b):
                flat = b.reshape((-1,) + b.shape[2:])
                size = flat.shape[0]
                got = flat[jnp.clip(at, 0, size - 1)]
                if extra is not None:
                    got = jnp.where(at >= size, extra[jnp.clip(at - size, 0, extra.shape[0] - 1)],
                                    got)
                if fill is not None:
                    got = jnp.where(at < 0, fill, got)
                got = lax.all_to_all(got, self.axis, 0, 0, tiled=True)
                return lax.dynamic_update_slice(
                    b, got, (jnp.where(second, row_2, row_1), col) + (0,) * (b.ndim - 2))
            return jax.tree.map(one, buf)
        return lax.fori_loop(0, trips_1 + trips_2, chunk, buf)

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        if payload is not None:
            raise NotImplementedError("the relay moves gathers only; scatters go "
                                      "straight (all_to_all)")
        plan, P, q = self.plan, self.num_parts, self.chunk(cap)
        overflow = jnp.where(self._relayed(cap), 0, jnp.sum(
            jnp.maximum(plan.counts - offset - cap, 0)))
        if received is None:
            s, (trips_a, trips_b) = self._slots(cap, offset), self._trips(cap, offset)
            ids = jnp.concatenate([jnp.full_like(s["to_b"], -1)] * 2)
            # Hop A into rows [0, P) (from each requester), hop B into [P, 2P) (from
            # each intermediate).
            ids = self._hops(ids, q, ((trips_a, s["to_a"], 0), (trips_b, s["to_b"], P)),
                             extra=plan.compact, fill=-1)
            received = jnp.concatenate([ids[P:].reshape(-1),
                                        jnp.where(s["held"], ids[:P], -1).reshape(-1)])
        return Delivery(cap, received, received >= 0, None, overflow)

    def back(self, sent, answers, into=None, offset=0):
        cap, P, n = sent.cap, self.num_parts, self.n
        q = self.chunk(cap)
        length = q * CHUNKS
        s, (trips_a, trips_b) = self._slots(cap, offset), self._trips(cap, offset)
        # One buffer of answers: to hop B's ids, then to the rows owned here. Hop B's
        # come back into the first half (in place), then hop A's into the second.
        buf = jax.tree.map(lambda a: a.reshape((2 * P, length) + a.shape[1:]), answers)
        own = jnp.arange(P * length, dtype=jnp.int32).reshape(P, length)
        buf = self._hops(buf, q, ((trips_b, own, 0), (trips_a, s["answer"], P)))
        flat = jax.tree.map(lambda a: a.reshape((2 * P * length,) + a.shape[2:]), buf)
        return put_back(n, flat, s["back"], s["back"] < n, into)
