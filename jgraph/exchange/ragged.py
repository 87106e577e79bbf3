"""The ragged_all_to_all transport: exact sizes on the wire, no padding per pair.

GPU only: XLA:CPU does not implement ragged_all_to_all (the tests emulate it on CPU by
replacing `_ragged_all_to_all`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.plan import Plan
from jgraph.exchange.segments import exclusive_sum, segment_of
from jgraph.exchange.transport import Delivery, Transfer

_ragged_all_to_all = lax.ragged_all_to_all   # module-level so tests can emulate it on CPU


def _at(offsets: jnp.ndarray, sizes: jnp.ndarray) -> jnp.ndarray:
    """Offsets of slices, 0 for the empty ones (whose offsets may lie past the buffer,
    outside a round's window)."""
    return jnp.where(sizes > 0, offsets, 0).astype(jnp.int32)


class Ragged(Transfer):
    """Each device's groups land back to back in the owners' receive buffers; `cap` is
    the receive buffer's length, so the need is what this device receives and the top
    is what P - 1 full requests could send it.

    Rounds: an owner's receive order (sender by sender, each sender's group in compact
    order) is cut into windows of `cap`; round r moves window r, every sender the part
    of its group that falls in it."""

    exact_wire = True

    def __init__(self, plan: Plan, axis: str):
        super().__init__(plan, axis)
        # Each device learns what concerns it alone, [P] integers each (never the
        # [sender, owner] matrix of every device's counts, which grows as P^2):
        swap = lambda x: lax.all_to_all(x, axis, 0, 0, tiled=True)   # x[j] to device j
        self.recv_sizes = swap(plan.counts)                          # from each sender
        self.sender_starts = swap(plan.start)                        # my group, per sender
        self.recv_offsets = exclusive_sum(self.recv_sizes, self.num_parts * self.n)
        # Where my group for owner p lands in p's receive order (after lower senders'):
        # p's offset for me.
        self.out_offsets = swap(self.recv_offsets)
        self.need, self.top = jnp.sum(self.recv_sizes), (self.num_parts - 1) * self.n

    @classmethod
    def check(cls, platform):
        if platform == "cpu" and _ragged_all_to_all is lax.ragged_all_to_all:
            raise NotImplementedError(
                "exchange strategy ragged_all_to_all needs a backend that implements "
                "it (GPU); XLA:CPU does not. Use all_to_all, all_gather or ppermute")

    @staticmethod
    def _window(begin, size, offset, cap):
        """(first, count) of the part of [begin, begin + size) inside the window
        [offset, offset + cap), relative to begin."""
        lo = jnp.clip(offset - begin, 0, size)
        hi = jnp.clip(offset + cap - begin, 0, size)
        return lo.astype(jnp.int32), (hi - lo).astype(jnp.int32)

    def _sending(self, cap, offset):
        """(first, count) of my group for each owner that moves in this round."""
        return self._window(self.out_offsets, self.plan.counts, offset, cap)

    def _receiving(self, cap, offset):
        """(first, count) of each sender's group for me that moves in this round."""
        return self._window(self.recv_offsets, self.recv_sizes, offset, cap)

    def _forward(self, x: jnp.ndarray, cap: int, fill, offset) -> jnp.ndarray:
        first, count = self._sending(cap, offset)
        _, got = self._receiving(cap, offset)
        out = jnp.full((cap,) + x.shape[1:], fill, x.dtype)
        return _ragged_all_to_all(x, out, _at(self.plan.start + first, count), count,
                                  _at(self.out_offsets + first - offset, count), got,
                                  axis_name=self.axis)

    def send(self, cap, payload=None, received=None, offset=0) -> Delivery:
        if received is None:
            received = self._forward(self.plan.compact, cap, -1, offset)
        rows = None if payload is None else jax.tree.map(
            lambda x: self._forward(x, cap, 0, offset), payload)
        # Mine that no round up to this one moves (what a single round leaves behind).
        moved = self._window(self.out_offsets, self.plan.counts, 0, offset + cap)[1]
        overflow = jnp.sum(self.plan.counts) - jnp.sum(moved)
        return Delivery(cap, received, received >= 0, rows, overflow)

    def back(self, sent, answers, into=None, offset=0):
        n, plan, cap = self.n, self.plan, sent.cap
        base, filled = into if into is not None else (None, None)
        if base is None:
            base = jax.tree.map(lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype), answers)
        first, count = self._receiving(cap, offset)
        mine, back = self._sending(cap, offset)
        answers = jax.tree.map(
            lambda x, out: _ragged_all_to_all(
                x, out, _at(self.recv_offsets + first - offset, count), count,
                _at(self.sender_starts + first, count), back, axis_name=self.axis),
            answers, base)
        # My compact entries answered this round: each owner's group from `mine` on.
        pos = jnp.arange(n, dtype=jnp.int32)
        owner = segment_of(plan.start, pos)
        rank = pos - plan.start[owner]
        now = (pos < jnp.sum(plan.counts)) & (rank >= mine[owner]) & (
            rank < mine[owner] + back[owner])
        return answers, now if filled is None else now | filled

    def wire(self, cap, fwd_bytes, ans_bytes):
        sent = jnp.sum(self.plan.counts)
        return (sent * fwd_bytes + self.need * ans_bytes).astype(jnp.float32)

    def estimate(self, remote):
        return remote
