"""The relay: an all_to_all gather whose busiest device pairs pass their excess through
intermediate devices.

METIS partitions talk mostly to their neighbours, so a few device pairs need far more
capacity than the rest, and a uniform per-pair capacity pads every pair to the busiest.
The relay cuts each pair's ids at a direct capacity. The first `direct_cap` ids of every
pair go straight to their owner (one all_to_all); the rest, the excess, are dealt
round-robin over all devices (the intermediates), which fetch them from the owners with
an ordinary exchange and pass the answers back. Three legs more, each balanced. The
direct capacity is the rung that minimises the id slots of all legs together, computed
from the [sender, owner] count matrix that one all_gather gives every device.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange.all_to_all import AllToAll
from jgraph.exchange.plan import Plan, owner_of
from jgraph.exchange.rows import OwnerFn, PyTree, running_count, select, take

if TYPE_CHECKING:
    from jgraph.exchange.exchange import Exchange, ExchangeStats


class Relayed(NamedTuple):
    """A relayed gather's remote answers and counters.

    answers: pytree of [n, ...] in the plan's compact order; filled: bool[n] the compact
    entries answered; capacities: [direct_cap, relay_cap] (int32 scalars); wire:
    float32 bytes this device sent on the direct and relay legs; overflow: int32 excess
    ids that did not fit the relay's top rung; needs: [the busiest pair's count]
    (what the direct leg's capacity is calibrated from); inner: the intermediates'
    exchange stats.
    """

    answers: PyTree
    filled: jnp.ndarray
    capacities: list
    wire: jnp.ndarray
    overflow: jnp.ndarray
    needs: list
    inner: ExchangeStats


def _rung_at_least(rungs: jnp.ndarray, need: jnp.ndarray) -> jnp.ndarray:
    """The smallest rung >= need (the top one if none is), elementwise."""
    return rungs[jnp.minimum(jnp.searchsorted(rungs, need), rungs.shape[0] - 1)]


def cheapest_direct_rung(pair_counts: jnp.ndarray, direct: jnp.ndarray,
                         relay: jnp.ndarray) -> jnp.ndarray:
    """Index of the direct rung with the fewest id slots per device pair over the legs.

    pair_counts: int32[P, P] ids each sender asks of each owner; direct, relay: the two
    ladders' rungs. For each direct rung: the rung itself, plus (when any pair exceeds
    it) the relay rung that deals the busiest sender's excess over P intermediates and
    the direct rung of an intermediate's requests to its busiest owner.
    """
    P = pair_counts.shape[0]
    excess = jnp.maximum(pair_counts[None] - direct[:, None, None], 0)   # [R, sender, owner]
    dealt = -(-jnp.max(jnp.sum(excess, axis=2), axis=1) // P)            # [R]
    fetched = jnp.max(jnp.sum(-(-excess // P), axis=1), axis=1)          # [R]
    cost = direct + jnp.where(dealt > 0, _rung_at_least(relay, dealt)
                              + _rung_at_least(direct, fetched), 0)
    return jnp.argmin(cost)


def relayed_gather(exchange: Exchange, plan: Plan, owner_fn: OwnerFn,
                   ans_bytes: int) -> Relayed:
    """The remote part of `exchange.gather` for `plan`, with the busiest pairs relayed."""
    n, P, axis = plan.size, plan.num_parts, exchange.axis
    me = lax.axis_index(axis)
    direct = AllToAll(plan, axis)
    direct_top = exchange.capacity(direct)    # the busiest pair's need, as sized
    direct_ladder = exchange.config.ladder(direct_top)
    relay_top = -(-n // P)                    # an intermediate's share of n ids
    relay_ladder = exchange.config.ladder(relay_top)
    direct_rungs = jnp.asarray(direct_ladder, jnp.int32)
    relay_rungs = jnp.asarray(relay_ladder, jnp.int32)
    best = cheapest_direct_rung(lax.all_gather(plan.counts, axis), direct_rungs, relay_rungs)
    direct_cap = direct_rungs[best]

    # Direct leg: each pair's first direct_cap ids, straight to the owner.
    def direct_leg(cap):
        sent = direct.send(cap)
        got, filled = direct.back(sent, owner_fn(jnp.maximum(sent.ids, 0), sent.mask))
        return got, filled, direct.wire(cap, 4, ans_bytes)
    (answers, filled, wire), _ = exchange.switch(None, direct_ladder, direct_leg, rung=best)

    # The excess: each pair's ids past direct_cap, dealt round-robin over the devices.
    owner = owner_of(exchange.offsets, plan.compact)
    rank_in_pair = jnp.arange(n, dtype=jnp.int32) - plan.start[owner]
    excess = (plan.compact >= 0) & (rank_in_pair >= direct_cap)
    k = running_count(excess) - 1
    via, slot = (k + me) % P, k // P          # the intermediate, and the place in its row
    per_intermediate = -(-jnp.sum(excess, dtype=jnp.int32) // P)
    rung = exchange.rung(per_intermediate, relay_ladder)
    top = relay_ladder[-1]

    # Out leg: the excess ids to the intermediates, padded to the top rung's length so
    # the intermediates' exchange has one shape whatever the rung.
    def out_leg(cap):
        fits = excess & (slot < cap)
        send = jnp.full((P, cap), -1, jnp.int32).at[
            jnp.where(fits, via, P), slot].set(plan.compact, mode="drop")
        held = lax.all_to_all(send, axis, 0, 0, tiled=True)
        held = jnp.pad(held, ((0, 0), (0, top - cap)), constant_values=-1).reshape(-1)
        return (held, jnp.sum(excess & ~fits, dtype=jnp.int32),
                jnp.float32((P - 1) * cap * 4))
    (held, lost, out_wire), relay_cap = exchange.switch(None, relay_ladder, out_leg, rung=rung)

    # The intermediates fetch what they hold from the owners: an exchange without relay.
    fetched, inner = exchange.without_relay().gather(held, held >= 0, owner_fn)

    # Back leg: the answers to the requesters, from the same rows they were dealt to.
    def back_leg(cap):
        fits = excess & (slot < cap)
        rows = jax.tree.map(lambda a: lax.all_to_all(
            a.reshape((P, top) + a.shape[1:])[:, :cap], axis, 0, 0, tiled=True
        ).reshape((P * cap,) + a.shape[1:]), fetched)
        return take(rows, via * cap + slot, fits), jnp.float32((P - 1) * cap * ans_bytes)
    (relayed, back_wire), _ = exchange.switch(None, relay_ladder, back_leg, rung=rung)

    answers = select(excess, relayed, answers)
    filled = filled | (excess & (slot < relay_cap))
    return Relayed(answers, filled, [direct_cap, relay_cap], wire + out_wire + back_wire,
                   lost, [direct.need], inner)
