"""The node loader (DGL's NodeDataLoader, GLT's DistNeighborLoader, minus the sampling).

Every device trains on the seeds it owns (as DistDGL's `node_split`). Each epoch a
device shuffles its seeds, deterministically from (seed, epoch), and deals them in
batches of `batch_size`; all devices take the same number of steps, and a device that
runs out pads its batches with masked seeds (id -1, mask False). A batch's shape is
static, so a last partial batch would cost a whole batch's work: unless `drop_last`,
the busiest device's seeds are spread evenly over the steps (1,000 seeds in 5 steps of
200 for a batch size of 256, rather than 3 of 256 and one of 232 padded).

The loader's position is explicit, `LoaderState(epoch, step)`, so a checkpoint can
resume mid-epoch: batch `step` of epoch `epoch` is a pure function of the loader and
that state.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

import jgraph.segments as segments
from jgraph.hashing import fmix32, hash32
from jgraph.mesh import AXIS, ROWS, shard_rows
from jgraph.sharded.graph import DistGraph


class LoaderState(NamedTuple):
    """epoch: current epoch (from 0); step: batches of it already taken."""

    epoch: int = 0
    step: int = 0


@dataclasses.dataclass(eq=False)
class NodeLoader:
    """Fields:
      seeds: int32[P * T] row-sharded — device k's own seeds (sorted global ids) in
        block k, -1 after them; T = `per_device`, a multiple of `batch_size`.
      counts: int64[P] — real seeds per device (host).
      batch_size: seeds per device per step: as given with drop_last; otherwise the
        busiest device's seeds over the number of steps batches of the given size
        take (never more than given).
      drop_last, seed: as given; mesh, axis: where `seeds` lives.
    """

    seeds: jax.Array
    counts: np.ndarray
    batch_size: int
    drop_last: bool
    seed: int
    mesh: Mesh
    axis: str = AXIS

    @classmethod
    def from_split(cls, dg: DistGraph, split: str = "train", ntype: str | None = None, *,
                   batch_size: int, drop_last: bool = False, seed: int = 0,
                   most: int | None = None) -> NodeLoader:
        """The nodes of `split` (of `ntype`, or the only type), each on its owner; most:
        as `from_parts`."""
        ntype = ntype or dg._single_type()
        counts = split_counts(dg, split, ntype)
        return cls.from_parts(dg.mesh, counts, lambda k: dg.parts.part(k).splits[ntype][split],
                              batch_size=batch_size, drop_last=drop_last, seed=seed,
                              most=most, rows=dg.rows)

    @classmethod
    def every_node(cls, dg: DistGraph, *, batch_size: int) -> NodeLoader:
        """Every node of the graph, each on its owner."""
        book = dg.book
        return cls.from_parts(dg.mesh, book.part_sizes(),
                              lambda k: np.arange(*book.part_range(k)),
                              batch_size=batch_size, rows=dg.rows)

    @classmethod
    def from_ids(cls, mesh: Mesh, offsets, ids, *, batch_size: int, drop_last: bool = False,
                 seed: int = 0) -> NodeLoader:
        """Any distinct global ids (host array), each dealt to the device owning it."""
        offsets = np.asarray(offsets, np.int64)
        ids = segments.distinct(np.asarray(ids, np.int64))
        if ids.size and (ids[0] < 0 or ids[-1] >= offsets[-1]):
            bad = ids[0] if ids[0] < 0 else ids[-1]
            raise ValueError(f"seed id {int(bad)} is outside the graph's [0, {int(offsets[-1])})")
        bounds = np.searchsorted(ids, offsets)
        counts = np.diff(bounds)
        return cls.from_parts(mesh, counts, lambda k: ids[bounds[k]:bounds[k + 1]],
                              batch_size=batch_size, drop_last=drop_last, seed=seed)

    @classmethod
    def from_parts(cls, mesh: Mesh, counts, part_ids, *, batch_size: int,
                   drop_last: bool = False, seed: int = 0, most: int | None = None,
                   rows=None) -> NodeLoader:
        """Distinct ids dealt by partition: `part_ids(k)` (called for this process's
        partitions only) holds partition k's `counts[k]` ids. most: shape the batches
        for this many seeds on the busiest device (at least its own), so that loaders
        of several sets of seeds share their shapes, and a program compiled for one
        runs the others (`shared_shape`). rows: what builds the seeds' array
        (`DistGraph.rows`; default `shard_rows` on `mesh`)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if counts.size != mesh.size:
            raise ValueError(f"{counts.size} partitions of seeds for a mesh of {mesh.size} devices")
        most = max(int(counts.max(initial=0)), most or 0)
        if drop_last and most < batch_size:
            raise ValueError(f"batch_size {batch_size} with drop_last: no device has a full "
                             f"batch (the most seeds on one device is {most}), so an epoch "
                             f"would have no step")
        # A batch larger than every device's seeds is the whole split: one step, with
        # buffers the size of the seeds, not of the number asked for.
        batch_size = min(batch_size, max(most, 1))
        if not drop_last and most:
            batch_size = -(-most // -(-most // batch_size))     # as many steps, evenly
        per_device = max(-(-most // batch_size), 1) * batch_size
        rows = rows or functools.partial(shard_rows, mesh)
        seeds = rows(per_device, (), np.int32, lambda k: np.asarray(part_ids(k), np.int32),
                     fill=-1)
        return cls(seeds, counts.astype(np.int64), batch_size, drop_last, seed, mesh)

    # -- shape of an epoch ---------------------------------------------------------------

    @property
    def per_device(self) -> int:
        return self.seeds.shape[0] // self.mesh.size

    @property
    def steps_per_epoch(self) -> int:
        """Batches every device takes per epoch: enough for the device with the most
        seeds (its last, partial batch dropped when `drop_last`)."""
        most = int(self.counts.max(initial=0))
        return most // self.batch_size if self.drop_last else -(-most // self.batch_size)

    @property
    def num_seeds(self) -> int:
        return int(self.counts.sum())

    def advance(self, state: LoaderState) -> LoaderState:
        """The position after taking one batch at `state`."""
        step = state.step + 1
        if step >= self.steps_per_epoch:
            return LoaderState(state.epoch + 1, 0)
        return LoaderState(state.epoch, step)

    # -- device side ---------------------------------------------------------------------

    def epoch_order(self, epoch) -> jax.Array:
        """int32[P * T] row-sharded: each device's seeds in this epoch's order, -1 after.

        The order is a sort by hash(seed, epoch, node id): the same on any mesh for a
        device's own seeds, and one compilation for all epochs (epoch is traced).
        """
        return _epoch_order(self.seeds, jnp.uint32(self.seed), jnp.asarray(epoch, jnp.uint32),
                            self.mesh, self.axis)

    def batch(self, order: jnp.ndarray, step) -> tuple[jnp.ndarray, jnp.ndarray]:
        """In the step (inside shard_map): this device's seeds int32[B] and mask bool[B]
        for batch `step` (traced) of the epoch whose `order` block it holds."""
        ids = lax.dynamic_slice_in_dim(order, jnp.asarray(step, jnp.int32) * self.batch_size,
                                       self.batch_size)
        return ids, ids >= 0


def split_counts(dg: DistGraph, split: str, ntype: str) -> np.ndarray:
    """int64[P]: the nodes of `split` of `ntype` on each partition."""
    dg.split_type(split, ntype)
    return np.array([p.splits[ntype][split] for p in dg.meta.parts], np.int64)


def shared_shape(dg: DistGraph, splits, ntype: str) -> int:
    """The `most` that gives loaders of each of `splits` (of `ntype`; those the graph
    has) one shape: the most nodes of any of them on one partition."""
    names = dg.meta.splits.get(ntype, [])
    return max((int(split_counts(dg, s, ntype).max(initial=0)) for s in splits if s in names),
               default=0)


@functools.partial(jax.jit, static_argnames=("mesh", "axis"))
def _epoch_order(seeds, seed, epoch, mesh, axis):
    def shuffle(block):
        key = hash32(fmix32(seed ^ jnp.uint32(0x2545F491)), epoch)
        rank = jnp.where(block >= 0, hash32(key, block.astype(jnp.uint32)) >> 1,
                         jnp.uint32(0xFFFFFFFF))
        return block[jnp.argsort(rank, stable=True)]
    return jax.shard_map(shuffle, mesh=mesh, in_specs=ROWS, out_specs=ROWS)(seeds)
