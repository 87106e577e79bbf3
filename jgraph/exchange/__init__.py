"""The owner-routed exchange: the one communication primitive of jgraph (see
`jgraph.exchange.exchange`). Called inside `shard_map`; it knows partitions only by
their id offsets, nothing of how node data is stored.

Modules: `config` (Strategy, ExchangeConfig and its capacity ladder), `plan` (a
device's deduplicated request grouped by owner), `transport` (the interface of a
transport) with one module per transport (`all_to_all`, `all_gather`, `ring`,
`ragged`, `scheduled`), `relay` (all_to_all's gathers in two routed hops), `rows`
(row helpers: answers packed, owned rows read, rows routed to their owners and written
there), `segments` (segment arithmetic: running sums, which segment holds a position),
`sizing` (capacities by route and request
length, their calibration and ladder), `stats` (what an exchange reports), `exchange`
(gather, scatter_add and scatter_rows over them)."""
from jgraph.exchange.config import CacheBy, ExchangeConfig, Sizing, Strategy
from jgraph.exchange.exchange import Exchange
from jgraph.exchange.rows import (
    OwnerFn,
    Routed,
    answer_filled,
    owned_index,
    owned_rows,
    route_rows,
    row_bytes,
    store_rows,
)
from jgraph.exchange.segments import exclusive_sum, running_count, segment_of
from jgraph.exchange.stats import ExchangeOverflowError, ExchangeStats

__all__ = [
    "CacheBy",
    "Exchange",
    "ExchangeConfig",
    "ExchangeOverflowError",
    "ExchangeStats",
    "OwnerFn",
    "Routed",
    "Sizing",
    "Strategy",
    "answer_filled",
    "exclusive_sum",
    "owned_index",
    "owned_rows",
    "route_rows",
    "row_bytes",
    "running_count",
    "segment_of",
    "store_rows",
]
