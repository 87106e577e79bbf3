"""The owner-routed exchange: the one communication primitive of jgraph (see
`jgraph.exchange.exchange`). Called inside `shard_map`; it knows partitions only by
their id offsets, nothing of how node data is stored."""
from jgraph.exchange.exchange import (
    Exchange,
    ExchangeConfig,
    ExchangeOverflowError,
    ExchangeStats,
    OwnerFn,
    Strategy,
    row_bytes,
    running_count,
)

__all__ = ["Exchange", "ExchangeConfig", "ExchangeOverflowError", "ExchangeStats", "OwnerFn",
           "Strategy", "row_bytes", "running_count"]
