"""Link prediction's sampling: the edge loader, negative sampling, the batch's seeds,
and excluding the batch's own edges from its neighbourhoods (DGL's
`DistEdgeDataLoader` + `as_edge_prediction_sampler(exclude="reverse_id")`).

`EdgeLoader` deals each device the positive edges whose destination it owns (stored
with its partition, see `jgraph.data.links`), shuffled per epoch by a hash of each
edge's id in its split, so a device's order does not depend on the mesh. Negatives are
drawn inside the step (`NegativeSampler`): uniform ones keyed by (run seed, step, edge
id), so an edge trained at a given step gets the same negatives whichever device draws
them; local and joint ones depend on the device by design (its own nodes; one draw
shared by its batch). `link_seeds`
deduplicates a batch's endpoints into the seeds the neighbour sampler expands, and
`exclude_pairs` masks every sampled edge between the two ends of one of the batch's
positives, in either direction (the edge itself and its reverse: the model must not
read the answer it is asked for).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

import jgraph.segments as segments
from jgraph.exchange import running_count
from jgraph.hashing import fmix32, hash32
from jgraph.mesh import ROWS
from jgraph.sampling.blocks import first_occurrence
from jgraph.sampling.loader import LoaderState, NodeLoader
from jgraph.sharded.graph import DistGraph


class EdgeOrder(NamedTuple):
    """One epoch's positives per device, shuffled, -1 after the real ones; each
    int32[P * T] row-sharded: eid (the edge's id in its split), src, dst, etype."""

    eid: jax.Array
    src: jax.Array
    dst: jax.Array
    etype: jax.Array


class EdgeBatch(NamedTuple):
    """One device's batch of positives, int32[B] each (-1 where `mask` is False)."""

    eid: jax.Array
    src: jax.Array
    dst: jax.Array
    etype: jax.Array
    mask: jax.Array


@dataclasses.dataclass(eq=False)
class EdgeLoader:
    """The positives of one edge split, dealt to the devices owning their destinations.

    ids: a `NodeLoader` over the edges' ids (it fixes the batch size, the steps per
    epoch and the padding, exactly as for nodes); edges: `EdgeOrder` in the ids' order
    (sorted by id on each device), not shuffled.
    """

    ids: NodeLoader
    edges: EdgeOrder

    @classmethod
    def from_split(cls, dg: DistGraph, split: str = "train", *, batch_size: int,
                   drop_last: bool = False, seed: int = 0) -> EdgeLoader:
        names = dg.meta.edge_splits
        if split not in names:
            raise KeyError(f"edge split {split!r} is not in {dg.parts.root}; it has "
                           f"{sorted(names) or 'none (partition the graph for link prediction)'}")
        counts = np.array([p.edge_splits[split] for p in dg.meta.parts], np.int64)
        arrays = lambda k: dg.parts.part(k).edge_splits[split]
        ids = NodeLoader.from_parts(dg.mesh, counts, lambda k: arrays(k)["eid"],
                                    batch_size=batch_size, drop_last=drop_last, seed=seed,
                                    rows=dg.rows)
        per = ids.per_device
        column = lambda name: dg.rows(per, (), np.int32, lambda k: arrays(k)[name], fill=-1)
        return cls(ids, EdgeOrder(ids.seeds, column("src"), column("dst"), column("etype")))

    # -- shape of an epoch (as NodeLoader) --------------------------------------------

    @property
    def mesh(self) -> Mesh:
        return self.ids.mesh

    @property
    def batch_size(self) -> int:
        return self.ids.batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.ids.steps_per_epoch

    @property
    def num_seeds(self) -> int:
        """Positive edges in the split."""
        return self.ids.num_seeds

    def advance(self, state: LoaderState) -> LoaderState:
        return self.ids.advance(state)

    # -- device side ---------------------------------------------------------------------

    def epoch_order(self, epoch) -> EdgeOrder:
        """The positives in this epoch's order (a sort by hash(seed, epoch, edge id))."""
        return _shuffle(self.edges, jnp.uint32(self.ids.seed), jnp.asarray(epoch, jnp.uint32),
                        self.mesh, self.ids.axis)

    def batch(self, order: EdgeOrder, step) -> EdgeBatch:
        """In the step: this device's positives of batch `step` of the epoch `order`."""
        start = jnp.asarray(step, jnp.int32) * self.batch_size
        cut = [lax.dynamic_slice_in_dim(a, start, self.batch_size) for a in order]
        return EdgeBatch(*cut, cut[0] >= 0)


@functools.partial(jax.jit, static_argnames=("mesh", "axis"))
def _shuffle(edges, seed, epoch, mesh, axis):
    def shuffle(*columns):
        eid = columns[0]
        key = hash32(fmix32(seed ^ jnp.uint32(0x2545F491)), epoch)
        rank = jnp.where(eid >= 0, hash32(key, eid.astype(jnp.uint32)) >> 1,
                         jnp.uint32(0xFFFFFFFF))
        order = jnp.argsort(rank, stable=True)
        return tuple(c[order] for c in columns)
    return EdgeOrder(*jax.shard_map(shuffle, mesh=mesh, in_specs=(ROWS,) * 4,
                                    out_specs=(ROWS,) * 4)(*edges))


# -- negatives -------------------------------------------------------------------------


class Negatives(enum.Enum):
    """How a positive's k negative destinations are drawn (each of the destination's
    node type):

    uniform: k nodes per positive, uniformly over all nodes (DGL's PerSourceUniform:
      the positive's source with k corrupted destinations); their embeddings come
      through the exchange like any remote node's.
    local: k nodes per positive, uniformly over the device's own partition
      (GraphStorm's local uniform: cheap, their first hop is local; biased towards the
      positive's neighbourhood, so harder).
    joint: k nodes per device and step, shared by all of its positives (GraphStorm's
      joint: k embeddings instead of B x k).
    in_batch: the destinations of the next k positives of the batch.
    """

    UNIFORM = "uniform"
    LOCAL = "local"
    JOINT = "joint"
    IN_BATCH = "in_batch"


class TypeTable(NamedTuple):
    """Where each node type's ids lie, to draw nodes of a type: starts int32[P, T]
    (partition p's first id of type t), cum int32[T, P + 1] (type t's nodes in
    partitions before p), rel_dst int32[R] (each relation's destination type)."""

    starts: np.ndarray
    cum: np.ndarray
    rel_dst: np.ndarray

    @classmethod
    def of(cls, dg: DistGraph) -> TypeTable:
        meta = dg.meta
        ntype = np.asarray(meta.ntype_offsets, np.int64)
        counts = np.diff(ntype, axis=1)                               # [P, T]
        cum = segments.offsets(counts, axis=0).T                      # [T, P + 1]
        rel_dst = [meta.node_types.index(r[2]) for r in meta.relations]
        return cls(ntype[:, :-1].astype(np.int32), cum.astype(np.int32),
                   np.asarray(rel_dst, np.int32))

    def global_ids(self, ntype, j):
        """The global id of node j (0 <= j < that type's count) of type `ntype`."""
        cum = jnp.asarray(self.cum)[ntype]                             # [..., P + 1]
        part = jnp.sum(cum[..., 1:] <= j[..., None], axis=-1)
        part = jnp.minimum(part, self.starts.shape[0] - 1)
        at = jnp.take_along_axis(cum, part[..., None], axis=-1)[..., 0]
        return jnp.asarray(self.starts)[part, ntype] + (j - at)


def _below(h, n):
    """Uniform-ish integers in [0, n) from uint32 hashes (n < 2^31; the bias is below
    n / 2^32)."""
    return (h % jnp.maximum(n, 1).astype(jnp.uint32)).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class NegativeSampler:
    """k negatives per positive, drawn as `kind` says (`Negatives`)."""

    k: int
    kind: Negatives = Negatives.UNIFORM

    def __post_init__(self):
        object.__setattr__(self, "kind", Negatives(self.kind))
        if self.k < 1:
            raise ValueError(f"negatives per positive must be >= 1, got {self.k}")

    def candidates(self, batch_size: int, num_types: int = 1) -> int:
        """How many new endpoints a batch of `batch_size` positives draws."""
        return {Negatives.JOINT: self.k * num_types, Negatives.IN_BATCH: 0}.get(
            self.kind, batch_size * self.k)

    def sample(self, table: TypeTable, batch: EdgeBatch, *, seed, step, axis):
        """(candidates int32[C], where bool[B, k], valid bool[B, k]) in the step: the
        new endpoint ids to embed, and where each negative is among the batch's
        endpoints `[src; dst; candidates]` (B + B + C of them)."""
        b, k = batch.src.shape[0], self.k
        key = hash32(fmix32(jnp.asarray(seed, jnp.uint32) ^ jnp.uint32(0x68E31DA4)),
                     jnp.asarray(step, jnp.uint32))
        ntype = jnp.asarray(table.rel_dst)[jnp.maximum(batch.etype, 0)]      # [B]
        j = jnp.arange(k, dtype=jnp.uint32)
        counts = jnp.asarray(table.cum)[ntype, -1]                            # [B]
        if self.kind is Negatives.IN_BATCH:
            at = (jnp.arange(b)[:, None] + 1 + jnp.arange(k)[None, :]) % b
            valid = batch.mask[:, None] & batch.mask[at] & (ntype[at] == ntype[:, None]) \
                & (at != jnp.arange(b)[:, None])
            return jnp.zeros((0,), jnp.int32), (b + at).astype(jnp.int32), valid
        if self.kind is Negatives.JOINT:
            # k draws per node type, shared by the device's positives of that type.
            types = table.cum.shape[0]
            me = lax.axis_index(axis).astype(jnp.uint32)
            h = hash32(hash32(key, me)[None, None], (jnp.arange(types, dtype=jnp.uint32)[:, None]
                                                    * k + j[None, :]))       # [T, k]
            all_types = jnp.arange(types, dtype=jnp.int32)[:, None]
            sizes = jnp.asarray(table.cum)[all_types, -1]                    # [T, 1]
            cands = table.global_ids(jnp.broadcast_to(all_types, (types, k)),
                                     _below(h, sizes))
            cands = jnp.where(sizes > 0, cands, -1)       # no node of a type: no draw
            where = 2 * b + ntype[:, None] * k + jnp.arange(k)[None, :]
            valid = jnp.broadcast_to(batch.mask[:, None], (b, k))
            return cands.reshape(-1), where.astype(jnp.int32), valid
        h = hash32(hash32(key, batch.eid.astype(jnp.uint32))[:, None], j[None, :])  # [B, k]
        if self.kind is Negatives.LOCAL:
            me = lax.axis_index(axis)
            mine = jnp.asarray(table.cum)[ntype, me + 1] - jnp.asarray(table.cum)[ntype, me]
            local = _below(h, mine[:, None])
            ids = jnp.asarray(table.starts)[me, ntype][:, None] + local
            # A device without nodes of the type draws from all of them.
            ids = jnp.where((mine > 0)[:, None], ids,
                            table.global_ids(ntype[:, None], _below(h, counts[:, None])))
        else:
            ids = table.global_ids(jnp.broadcast_to(ntype[:, None], (b, k)),
                                   _below(h, counts[:, None]))
        valid = jnp.broadcast_to(batch.mask[:, None], (b, k))
        where = 2 * b + jnp.arange(b * k, dtype=jnp.int32).reshape(b, k)
        return jnp.where(valid, ids, -1).reshape(-1), where, valid


# -- the batch's seeds -----------------------------------------------------------------


def dedup(ids: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(unique int32[L], row int32[L]): the distinct valid ids (>= 0) in order of first
    appearance, then -1; and for each entry the row of `unique` holding its id (-1 for
    invalid entries)."""
    n = ids.shape[0]
    first = first_occurrence(ids)
    pos = jnp.arange(n, dtype=jnp.int32)
    head = (ids >= 0) & (first == pos)
    rank = running_count(head) - 1
    unique = jnp.full((n,), -1, jnp.int32).at[jnp.where(head, rank, n)].set(
        ids.astype(jnp.int32), mode="drop")
    return unique, jnp.where(ids >= 0, rank[first], -1)


class LinkSeeds(NamedTuple):
    """A batch's endpoints as seeds: seeds int32[2B + C] distinct, real first (what
    the neighbour sampler expands); src, dst int32[B] and neg int32[B, k] the row of
    `seeds` holding each endpoint (0 where invalid); neg_mask bool[B, k]."""

    seeds: jax.Array
    src: jax.Array
    dst: jax.Array
    neg: jax.Array
    neg_mask: jax.Array


def link_seeds(batch: EdgeBatch, candidates, where, valid) -> LinkSeeds:
    """The seeds of a batch with its negatives (`NegativeSampler.sample`)."""
    b = batch.src.shape[0]
    ends = jnp.concatenate([jnp.where(batch.mask, batch.src, -1),
                            jnp.where(batch.mask, batch.dst, -1), candidates])
    seeds, row = dedup(ends)
    row = jnp.maximum(row, 0)
    neg = jnp.where(valid, row[jnp.maximum(where, 0)], 0)
    return LinkSeeds(seeds, row[:b], row[b:2 * b], neg, valid)


# -- exclusion -------------------------------------------------------------------------


def exclude_pairs(blocks, src, dst, mask, rows: int | None = None
                  ) -> tuple[tuple, jax.Array]:
    """The blocks without any sampled edge between the two ends of a positive (src[i],
    dst[i]) where mask[i], in either direction; and how many slots that masked.

    rows: only the first `rows` dst nodes of each block are looked at (None: all).
    An excluded edge ends at a positive's endpoint, and with `link_seeds` those are
    the first 2B seeds, which every block's dst begins with (a block's src begins with
    its dst, and the next hop's dst is that src): `rows = 2 * B` finds every one."""
    big = jnp.iinfo(jnp.int32).max
    a = jnp.concatenate([jnp.where(mask, src, big), jnp.where(mask, dst, big)])
    b = jnp.concatenate([jnp.where(mask, dst, big), jnp.where(mask, src, big)])
    order = jnp.lexsort((b, a))
    a, b = a[order], b[order]
    n = a.shape[0]
    steps = max(int(n).bit_length(), 1)
    out, removed = [], jnp.int32(0)
    for block in blocks:
        head = block.num_dst if rows is None else min(rows, block.num_dst)
        mask_h, nbr_h = block.mask[:head], block.nbr[:head]
        u = jnp.where(mask_h, block.src[jnp.maximum(nbr_h, 0)], -1)
        v = jnp.broadcast_to(block.dst[:head, None], u.shape)
        lo = jnp.zeros(u.shape, jnp.int32)
        hi = jnp.full(u.shape, n, jnp.int32)
        for _ in range(steps):            # lower bound of (u, v) in the sorted pairs
            mid = (lo + hi) // 2
            am, bm = a[jnp.minimum(mid, n - 1)], b[jnp.minimum(mid, n - 1)]
            less = (am < u) | ((am == u) & (bm < v))
            open_ = lo < hi
            lo = jnp.where(open_ & less, mid + 1, lo)
            hi = jnp.where(open_ & ~less, mid, hi)
        at = jnp.minimum(lo, n - 1)
        hit = mask_h & (lo < n) & (a[at] == u) & (b[at] == v)
        removed = removed + jnp.sum(hit, dtype=jnp.int32)
        hit = jnp.concatenate([hit, jnp.zeros((block.num_dst - head, hit.shape[1]), bool)])
        keep = block.mask & ~hit
        out.append(dataclasses.replace(
            block, mask=keep, nbr=jnp.where(keep, block.nbr, -1),
            etype=None if block.etype is None else jnp.where(keep, block.etype, -1)))
    return tuple(out), removed


__all__ = ["EdgeBatch", "EdgeLoader", "EdgeOrder", "LinkSeeds", "NegativeSampler", "Negatives",
           "TypeTable", "dedup", "exclude_pairs", "link_seeds"]
