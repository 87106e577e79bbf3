"""Hot-node cache: rows of frequently needed nodes, replicated on every device.

The exchange answers cached ids locally, before any communication, so the rows most
often requested from other devices never cross the wire. Which nodes are hot is decided
by a score: how often a node appears as an in-neighbour (its out-degree, the number of
in-neighbourhoods it belongs to; GraphLearn-for-PyTorch calls this the in-degree of its
out-edge CSR), or request counts gathered from real batches (as GLT's frequency
partitioner does). Results are identical with and without the cache; only traffic and
memory change.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

import jgraph.segments as segments
from jgraph.exchange import row_bytes
from jgraph.mesh import replicate, replicated
from jgraph.sharded.tensor import DistTensor


def cache_size(size: int | float, num_nodes: int) -> int:
    """A count from a count (int) or a fraction of the nodes (float in [0, 1])."""
    if isinstance(size, float):
        if not 0.0 <= size <= 1.0:
            raise ValueError(f"cache fraction must be in [0, 1], got {size}")
        return int(round(size * num_nodes))
    if size < 0:
        raise ValueError(f"cache size must be >= 0, got {size}")
    return min(int(size), num_nodes)


def request_counts(batches: Iterable[np.ndarray], num_nodes: int) -> np.ndarray:
    """int64[N]: how many times each node was requested over `batches` of global ids
    (each batch counted once per distinct id, as the exchange deduplicates)."""
    counts = np.zeros(num_nodes, np.int64)
    for ids in batches:
        ids = segments.distinct(np.asarray(ids, np.int64).reshape(-1))
        ids = ids[(ids >= 0) & (ids < num_nodes)]
        counts[ids] += 1
    return counts


@dataclasses.dataclass(frozen=True, eq=False)
class HotCache:
    """Fields:
      ids: int64[C] — sorted global ids of the cached nodes.
    """

    ids: np.ndarray

    @classmethod
    def top(cls, scores: np.ndarray, size: int | float) -> HotCache:
        """The `size` nodes with the highest scores (ties: lower id first)."""
        scores = np.asarray(scores)
        c = cache_size(size, scores.size)
        order = np.lexsort((np.arange(scores.size), -scores))[:c]
        return cls(np.sort(order).astype(np.int64))

    @classmethod
    def empty(cls) -> HotCache:
        return cls(np.zeros(0, np.int64))

    def __len__(self) -> int:
        return self.ids.size

    def device_args(self, tensor: DistTensor) -> tuple[jax.Array, jax.Array]:
        """`(ids int32[C], rows [C, ...])` replicated on every device, for `Exchange.gather`
        (pass them into the step with a replicated spec)."""
        keep = tensor.layout.contains(jnp.asarray(self.ids, jnp.int32))
        if not bool(jnp.all(keep)):
            raise ValueError(f"{tensor.name}: the cache holds nodes the tensor has no rows for")
        pos = tensor.layout.padded_of_global(self.ids)
        rows = jax.jit(lambda a, p: a[p], out_shardings=replicated(tensor.mesh))(
            tensor.array, jnp.asarray(pos, jnp.int32))
        return replicate(tensor.mesh, self.ids.astype(np.int32)), rows

    def nbytes(self, tensor: DistTensor) -> int:
        """Memory the cached rows of `tensor` take on each device."""
        return len(self) * row_bytes(tensor.array)
