"""What an exchange reports: `ExchangeStats`, its counters summed over devices, and the
error raised on the host when they say something was lost."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class ExchangeOverflowError(RuntimeError):
    """A transfer needed more capacity than the top rung of the ladder allows."""


class ExchangeStats(NamedTuple):
    """Counters of one exchange, summed over devices (the same on every device).

    requested: distinct valid ids asked for; non_local: those owned by another device;
    cached: non-local ids answered by the hot-node cache; capacity: the largest transfer
    capacity used; wire_bytes: bytes sent between devices; overflow: ids a
    `scatter_add` could not move in its one round (their values are not summed);
    out_of_range: valid ids the caller's `contains` rejected (treated as padding);
    length, route: the key its capacity is calibrated under (`jgraph.exchange.sizing.Key`:
    the request's length, static, and `Route.code` of the way it moved); needed: the
    devices' largest need, in the units of the capacity (what calibration measures);
    rounds: the most rounds a transfer took (1 when everything fitted its capacity);
    relayed: the rows a relayed gather's routing sends through a third device (whatever
    its capacity; 0 for every other exchange), which calibration reads to choose where
    gathers relay (`Capacities.fitted`).
    """

    requested: jnp.ndarray
    non_local: jnp.ndarray
    cached: jnp.ndarray
    capacity: jnp.ndarray
    wire_bytes: jnp.ndarray
    overflow: jnp.ndarray
    out_of_range: jnp.ndarray
    length: jnp.ndarray
    route: jnp.ndarray
    needed: jnp.ndarray
    rounds: jnp.ndarray
    relayed: jnp.ndarray

    def check(self, what: str = "exchange") -> ExchangeStats:
        """Host side: raise if anything was lost; returns self."""
        overflow, bad = int(self.overflow), int(self.out_of_range)
        if overflow:
            raise ExchangeOverflowError(
                f"{what}: {overflow} id(s) did not fit the capacity {int(self.capacity)} "
                f"(a request of {int(self.length)} ids needed {int(self.needed)}); grow "
                f"it (`Exchange.grown`) or size the exchange with sizing=bound")
        if bad:
            raise IndexError(f"{what}: {bad} id(s) are not rows of the array they index")
        return self


def exchange_stats(tree) -> list[ExchangeStats]:
    """The `ExchangeStats` in a pytree (a step's metrics), in order."""
    return [leaf for leaf in jax.tree.leaves(
        tree, is_leaf=lambda x: isinstance(x, ExchangeStats)) if isinstance(leaf, ExchangeStats)]
