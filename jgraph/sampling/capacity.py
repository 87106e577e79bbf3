"""Static capacities that fit the graph: measured frontier sizes, with headroom.

A sampled hop's `src` holds its dst nodes and their distinct new neighbours. The worst
case, every slot a new node (`src_capacity`), is what no batch can exceed, but real
graphs share neighbours: on a 200k-node graph with fanouts 15,10,5 the third hop's
frontier has about 111k real rows of a worst case of 180k, and the first layer runs on
every row. `calibrate` samples a few batches at the worst case, takes the largest
frontier of each hop on any device, and adds headroom; `grow` answers a batch that
needed more anyway (the step reports it and is run again, see
`NodeClassification.train_step`).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.exchange import Exchange
from jgraph.mesh import REPLICATED, ROWS
from jgraph.sampling.loader import NodeLoader
from jgraph.sampling.sampler import NeighborSampler
from jgraph.sharded.graph import ShardedGraph

ROUND = 64          # capacities are multiples of this (fewer distinct shapes)


def loader_seeds(loader: NodeLoader):
    """A node loader's batch as `sample_first_batches` takes it: (seeds, mask, local)."""
    def seeds(order, index):
        return (*loader.batch(order, index), True)
    return seeds


def sample_first_batches(sampler: NeighborSampler, graph: ShardedGraph, exchange: Exchange,
                         loader, take, out_specs, *, seed: int, batches: int,
                         batch_seeds=None) -> list:
    """`take(sample)` (per device, under shard_map; `out_specs` for its result) of each
    of the first `batches` batches of the loader's epoch 0, on the host. batch_seeds:
    (order, index) -> (seeds, mask, local: whether they are the device's own), in the
    step; default: the node loader's batch (`loader_seeds`)."""
    batch_seeds = batch_seeds or loader_seeds(loader)

    def one(graph, order, index):
        seeds, mask, local = batch_seeds(order, index)
        return take(sampler.sample(graph, exchange, seeds, mask, seed=seed, step=index,
                                   local_seeds=local))

    program = jax.jit(jax.shard_map(one, mesh=loader.mesh,
                                    in_specs=(graph.specs(), ROWS, REPLICATED),
                                    out_specs=out_specs))
    order = loader.epoch_order(0)
    return jax.device_get([program(graph, order, jnp.int32(i))
                           for i in range(min(batches, loader.steps_per_epoch))])


def measure_frontiers(sampler: NeighborSampler, graph: ShardedGraph, exchange: Exchange,
                      loader, *, seed: int, batches: int = 8,
                      batch_seeds=None) -> np.ndarray:
    """int64[hops]: per hop (seeds outward), the most src rows any device needed over
    the first `batches` batches of the loader's epoch 0, sampled at the worst case."""
    counts = sample_first_batches(dataclasses.replace(sampler, capacities=None), graph,
                                  exchange, loader, lambda s: s.stats.needed, REPLICATED,
                                  seed=seed, batches=batches, batch_seeds=batch_seeds)
    return np.max(np.stack(counts), axis=0).astype(np.int64)


def with_headroom(needed, worst, headroom: float) -> tuple[int, ...]:
    """Capacities: each need plus `headroom` (a fraction), rounded up to a multiple of
    `ROUND` (at least one), never above the worst case."""
    return tuple(min(int(w), max(-(-math.ceil(int(n) * (1 + headroom)) // ROUND), 1) * ROUND)
                 for n, w in zip(needed, worst))


def calibrate(sampler: NeighborSampler, graph: ShardedGraph, exchange: Exchange,
              loader, *, seed: int, headroom: float = 0.1, batches: int = 8,
              batch_seeds=None, num_seeds: int | None = None) -> NeighborSampler:
    """`sampler` with capacities measured on `loader`'s batches (see the module doc);
    batch_seeds: as `sample_first_batches`; num_seeds: the seeds of one batch (default
    the loader's batch size)."""
    needed = measure_frontiers(sampler, graph, exchange, loader, seed=seed, batches=batches,
                               batch_seeds=batch_seeds)
    worst = sampler.worst_case(graph, num_seeds or loader.batch_size)
    return dataclasses.replace(sampler, capacities=with_headroom(needed, worst, headroom))


def grow(sampler: NeighborSampler, graph: ShardedGraph, num_seeds: int, needed,
         capacity, headroom: float = 0.1) -> NeighborSampler:
    """Larger capacities after a batch overflowed: `needed`/`capacity` are its
    `SampleStats` (per hop). A hop that overflowed gets its need plus headroom; the
    hops after the first one that overflowed sampled from a cut frontier, so their
    needs are low: they grow by that hop's factor over their need (or capacity). Each
    call grows at least one hop (towards the worst case, which cannot overflow)."""
    needed = np.asarray(needed, np.int64)
    capacity = np.asarray(capacity, np.int64)
    worst = np.asarray(sampler.worst_case(graph, num_seeds), np.int64)
    over = needed > capacity
    if not over.any():
        return sampler
    first = int(np.argmax(over))
    factor = needed[first] / capacity[first]
    want = np.where(over, needed, capacity).astype(np.float64)
    want[first + 1:] = np.maximum(needed[first + 1:], capacity[first + 1:]) * factor
    caps = with_headroom(np.ceil(want), worst, headroom)
    return dataclasses.replace(sampler, capacities=caps)
