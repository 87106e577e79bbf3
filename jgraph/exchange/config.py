"""How an exchange moves ids: the `Strategy` and the `ExchangeConfig` with its capacity
ladder. Plain host-side values: nothing here traces or imports a transport."""
from __future__ import annotations

import dataclasses
import enum

from jgraph.config import ConfigError


class Strategy(str, enum.Enum):
    """How ids and answers travel between devices; all give identical results."""

    ALL_TO_ALL = "all_to_all"   # one all_to_all each way, per-peer capacity from the ladder
    ALL_GATHER = "all_gather"   # all_gather the requests, answer, reduce-scatter the answers
    RING = "ppermute"           # P-1 ppermute rounds; each shift picks its own rung
    RAGGED = "ragged_all_to_all"  # exact sizes; GPU only (XLA:CPU does not implement it)
    SCHEDULED = "scheduled"     # ppermute rounds of a static pair schedule, in chunks
    AUTO = "auto"               # ragged_all_to_all on GPU, all_to_all elsewhere

    def on(self, platform: str | None) -> Strategy:
        """The strategy used on devices of `platform` ("gpu", "cpu", ...; None: unknown):
        AUTO picks what the platform has, the others are themselves."""
        if self is not Strategy.AUTO:
            return self
        return Strategy.RAGGED if platform in ("gpu", "cuda", "rocm") else Strategy.ALL_TO_ALL


class CacheBy(str, enum.Enum):
    """Which nodes the hot-node cache holds: those of the highest out-degree (the number
    of neighbourhoods a node is in), or those requested most often on sampled training
    batches."""

    DEGREE = "degree"
    FREQUENCY = "frequency"


class Sizing(str, enum.Enum):
    """How large a transfer's buffers are (its capacity per round)."""

    CALIBRATED = "calibrated"   # what arrives: measured on the first batches, with headroom
    BOUND = "bound"             # what could arrive at worst: never a second round, never
                                # regrown, but P x the request for all_to_all and ragged


@dataclasses.dataclass(frozen=True)
class ExchangeConfig:
    """Fields:
      strategy: how data travels; AUTO (default) is ragged_all_to_all on GPUs (exact
        sizes on the wire) and all_to_all elsewhere. SCHEDULED (no ragged collective
        needed): the device pairs meet in ppermute rounds of a static schedule grouping
        pairs of similar expected load, in chunks of ids, so a pair is padded by less
        than a chunk per round instead of to the busiest pair; its capacity is the chunk
        (calibrated as the others), and its scatters move as all_to_all's, with
        capacities calibrated apart from the chunks (`Exchange.scatters_straight`).
      sizing: what a transfer's capacity (ids per device pair for all_to_all and
        ppermute, per device for all_gather, received per device for ragged_all_to_all)
        is sized for. CALIBRATED (default): what arrives, per request length, measured
        on the first batches (`Exchange.calibrated`) plus `headroom`; before that, or for
        a length not measured, estimated from `cut`. Per-device memory then follows
        the per-device batch, not the device count. A request that needs more moves in
        further rounds of the same buffers (nothing is dropped, nothing recompiles; the
        training loop grows the capacity when it sees one). BOUND: the worst case (the
        whole request from every peer): one round always, but buffers of P x the request
        for all_to_all and ragged_all_to_all.
      headroom: calibrated capacities are the largest need measured times 1 + headroom.
      cut: the fraction of a request's ids owned by other devices, assumed by the
        estimate of a request length not yet measured (and by `jgraph compile
        --abstract`); None: (P - 1) / P, as for a random partition.
      growth: ratio between neighbouring rungs of the capacity ladder; closer to 1
        wastes less wire on rounding up, at the cost of more compiled branches.
      min_capacity: the smallest rung.
      max_rungs: the most rungs a ladder has, counted down from the top. Each is a
        compiled branch holding the transfer (on XLA:CPU an all_to_all compiles into a
        kernel per peer): the default 4 rungs of growth 2 move at most twice what the
        busiest pair needs, or the request size when it needs less than an eighth; they
        compiled cora's 8-device training step in about half the time of the 13 rungs
        of growth 1.25 (measured on XLA:CPU).
      max_capacity: the most a transfer's buffers hold per round, whatever the sizing
        says (a request that needs more takes more rounds); None: no such limit.
      relay: all_to_all gathers of rows (not the sampler's draws, whose rows are
        narrow and whose programs are costly to compile), over 3 to 16 devices. METIS
        partitions talk mostly to their neighbours, so one all_to_all pads every device
        pair to the busiest (2.8-3x the rows that must move on facebook_musae in 8
        parts). With relay (the default) the gather moves in two all_to_all hops, each
        device pair's rows straight to the owner in either hop or through an
        intermediate device, routed on every device from the all-gathered pair counts
        so that the busiest pair of each hop is near the lower bound (3-6% above it
        there); each hop moves in chunks, as many as the batch fills (1.48x the rows
        with the chunks' rounding). Its capacity is the busiest hop pair's rows. A
        batch whose routing would save under a quarter goes straight, and a gather
        whose calibration batches relayed nothing is compiled straight. False: one
        all_to_all each way.
      cache: the hot-node cache of training and evaluation: the feature rows of this
        fraction of each node type's nodes (0 = none), replicated on every device and
        answered without communication (`jgraph.sharded.cache`).
      cache_by: which nodes are hot: "degree" (out-degree: the number of
        neighbourhoods a node is in) or "frequency" (requests counted on sampled
        training batches).
    """

    strategy: Strategy = Strategy.AUTO
    sizing: Sizing = Sizing.CALIBRATED
    headroom: float = 0.25
    cut: float | None = None
    growth: float = 2.0
    min_capacity: int = 16
    max_capacity: int | None = None
    max_rungs: int = 4
    relay: bool = True
    cache: float = 0.0
    cache_by: CacheBy = CacheBy.DEGREE

    def __post_init__(self):
        for name, kind in (("strategy", Strategy), ("sizing", Sizing), ("cache_by", CacheBy)):
            object.__setattr__(self, name, _member(kind, getattr(self, name), name))
        if self.headroom < 0:
            raise ConfigError(f"exchange.headroom must be >= 0, got {self.headroom}")
        if self.cut is not None and not 0.0 <= self.cut <= 1.0:
            raise ConfigError(f"exchange.cut is a fraction in [0, 1], got {self.cut}")
        if self.growth <= 1.0:
            raise ConfigError(f"exchange.growth must be > 1, got {self.growth}")
        if self.max_rungs < 1:
            raise ConfigError(f"exchange.max_rungs must be >= 1, got {self.max_rungs}")
        if self.min_capacity < 1:
            raise ConfigError(f"exchange.min_capacity must be >= 1, got {self.min_capacity}")
        if self.max_capacity is not None and self.max_capacity < 1:
            raise ConfigError(f"exchange.max_capacity must be >= 1, got {self.max_capacity}")
        if not 0.0 <= self.cache <= 1.0:
            raise ConfigError(f"exchange.cache is a fraction of the nodes in [0, 1], got "
                             f"{self.cache}")

    def ladder(self, top: int) -> tuple[int, ...]:
        """Capacities of a transfer's first round whose largest is `top`: at most
        `max_rungs` of them, spaced by `growth` down from the top, multiples of 8 below
        it, none under `min_capacity`."""
        top = max(top, 1)
        rungs, c = [top], top
        while len(rungs) < self.max_rungs:
            c = int(c / self.growth) // 8 * 8
            if c < min(self.min_capacity, top) or c >= rungs[-1]:
                break
            rungs.append(c)
        return tuple(reversed(rungs))


def _member(kind: type[enum.Enum], value, name: str):
    """`value` as a member of `kind`; ConfigError naming exchange.`name` otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"exchange.{name} must be one of {[m.value for m in kind]}, got "
                          f"{value!r}") from None
