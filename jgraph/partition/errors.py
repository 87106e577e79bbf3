"""The error partitioning raises where it cannot proceed, below every module that
raises it."""
from __future__ import annotations


class PartitionError(ValueError):
    """Partitioning cannot proceed; the message names the value at fault."""
