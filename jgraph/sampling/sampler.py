"""Multi-layer neighbour sampling on the device, inside the compiled step.

`NeighborSampler(fanouts=(15, 10, 5))` samples, from each seed, 15 in-neighbours, then
10 of each of those, then 5: fanouts are listed from the seeds outward, as PyG's
`num_neighbors`. (DGL's `MultiLayerNeighborSampler` lists the same thing input layer
first: `[5, 10, 15]`.) A fanout of -1 takes every in-neighbour, up to `max_fanout`
(default: the graph's largest in-degree, so truly all). A hop's fanout may also be a
tuple with one entry per relation (RGCN): that many neighbours along each relation.

Distributed: each hop's frontier goes through the owner-routed `Exchange`; every node is
sampled by the device that owns its in-edges, and the sampled neighbour ids come back.
The draw of a node is keyed by (seed, step, hop, global node id) only, so a node gets
the same neighbours whichever device asks and however the graph is partitioned (for
the same relabelled graph).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.exchange import Exchange, owned_index
from jgraph.hashing import fmix32, hash32
from jgraph.kernels.sample import Impl, check_impl, draw_positions
from jgraph.sampling.blocks import build_block_counted, compact_front, src_capacity
from jgraph.sampling.weighted import bisect, bisect_steps, weighted_edges, weighted_positions
from jgraph.sharded.graph import ShardedGraph

Fanout = int | tuple[int, ...]


def stream_key(seed, step, hop) -> jnp.ndarray:
    """uint32 key of one hop of one step of a run."""
    key = fmix32(jnp.asarray(seed, jnp.uint32) ^ jnp.uint32(0x5BD1E995))
    return hash32(hash32(key, jnp.asarray(step, jnp.uint32)), jnp.asarray(hop, jnp.uint32))


def node_keys(stream: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """uint32 key of each global node id's draw within one stream."""
    return hash32(stream, ids.astype(jnp.uint32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleStats:
    """Counts summed over devices.

      sampled_edges: int32 — real (masked-in) neighbour slots over all hops.
      truncated: int32 — nodes whose degree exceeded a -1 fanout's cap, so they got
        `max_fanout` neighbours instead of all.
      exchange: tuple of per-hop `ExchangeStats`.
      needed: int32[hops] — per hop (seeds outward), the most src rows any device
        needed (its real dst and distinct new neighbours): the frontier sizes that
        capacities are calibrated from.
      capacity: int32[hops] — the hops' static src capacities.
      overflow: int32 — src rows that did not fit their capacity, summed over devices
        and hops: nonzero means the blocks are incomplete (see
        `NeighborSampler.capacities`).
    """

    sampled_edges: jax.Array
    truncated: jax.Array
    exchange: tuple
    needed: jax.Array
    capacity: jax.Array
    overflow: jax.Array

    def check(self) -> SampleStats:
        for hop, stats in enumerate(self.exchange):
            stats.check(f"sampling hop {hop}")
        if int(self.overflow):
            raise SampleOverflowError(
                f"sampling needed {[int(x) for x in self.needed]} src rows per hop, more "
                f"than the capacities {[int(x) for x in self.capacity]}: "
                f"{int(self.overflow)} rows did not fit; sample with larger "
                f"NeighborSampler.capacities (or None, the worst case)")
        return self


class SampleOverflowError(RuntimeError):
    """A batch's frontier needed more rows than a hop's calibrated capacity."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sample:
    """blocks: `Block`s in model order — blocks[0] reads the input features (its `src`
    are the nodes whose features to fetch), blocks[-1] has the seeds as `dst`.
    stats: `SampleStats`."""

    blocks: tuple
    stats: SampleStats

    @property
    def seeds(self) -> jax.Array:
        return self.blocks[-1].dst

    @property
    def input_nodes(self) -> jax.Array:
        return self.blocks[0].src


@dataclasses.dataclass(frozen=True)
class NeighborSampler:
    """fanouts: per hop, seeds outward; an int (any relation) or a tuple of one int per
    relation; -1 = all in-neighbours (up to `max_fanout`).
    replace: draw with replacement (then a node always gets `fanout` draws, repeats
    allowed, and a -1 fanout is not allowed).
    weighted: draw with probability proportional to edge weight (`edge_weights`
    argument of `sample`); without replacement this is successive sampling: each next
    neighbour is drawn from the rest in proportion to weight. Edges of weight 0 are
    never drawn.
    max_fanout: the cap of a -1 fanout; None = the graph's largest in-degree.
    impl: the draw kernel, "auto" (Pallas in a program lowered for a GPU, XLA
    elsewhere), "xla" or "pallas" (interpreted off GPU);
    weighted draws always run in XLA.
    capacities: per hop (seeds outward), the static number of src rows the hop's block
    holds; None (or a value above it) = the worst case, where every sampled slot is a
    new node (`src_capacity`), which no batch can exceed. Smaller capacities, measured
    from the graph (`jgraph.sampling.capacity`), make every later hop and layer
    smaller; a batch that needs more is reported in `SampleStats.overflow`, never
    silently cut.
    """

    fanouts: tuple[Fanout, ...]
    replace: bool = False
    weighted: bool = False
    max_fanout: int | None = None
    impl: Impl = "auto"
    capacities: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "fanouts", tuple(
            tuple(int(x) for x in f) if isinstance(f, (tuple, list)) else int(f)
            for f in self.fanouts))
        if not self.fanouts:
            raise ValueError("fanouts: give at least one hop")
        for hop, f in enumerate(self.fanouts):
            for x in (f if isinstance(f, tuple) else (f,)):
                if x < -1 or (x == -1 and self.replace):
                    raise ValueError(
                        f"fanouts[{hop}] = {f}: each fanout is >= 0, or -1 for all "
                        f"neighbours (not with replace=True)")
        if self.max_fanout is not None and self.max_fanout < 1:
            raise ValueError(f"max_fanout must be >= 1, got {self.max_fanout}")
        if self.capacities is not None:
            object.__setattr__(self, "capacities", tuple(int(c) for c in self.capacities))
            if len(self.capacities) != len(self.fanouts) or min(self.capacities) < 1:
                raise ValueError(f"capacities {list(self.capacities)}: give one count "
                                 f">= 1 per hop ({len(self.fanouts)} hops)")
        check_impl(self.impl)

    # -- shapes --------------------------------------------------------------------------

    def hop_fanouts(self, graph: ShardedGraph) -> list[tuple[int, ...]]:
        """Per hop, the static number of draws per relation (one entry: any relation)."""
        cap = self.max_fanout or max(graph.max_in_degree, 1)
        return [tuple(cap if x == -1 else x for x in f) for f in self._given(graph)]

    def _given(self, graph: ShardedGraph) -> list[tuple[int, ...]]:
        out = []
        for hop, f in enumerate(self.fanouts):
            if isinstance(f, tuple) and len(f) != graph.num_relations:
                raise ValueError(f"fanouts[{hop}] has {len(f)} entries but the graph has "
                                 f"{graph.num_relations} relations")
            out.append(f if isinstance(f, tuple) else (f,))
        return out

    def shapes(self, graph: ShardedGraph, num_seeds: int) -> list[tuple[int, int, int]]:
        """(n_dst, width, n_src) of each hop, seeds outward: the worst case (see
        `src_capacity`), or `capacities` where they are smaller (never below n_dst)."""
        shapes, n_dst = [], num_seeds
        for hop, f in enumerate(self.hop_fanouts(graph)):
            width = sum(f)
            n_src = src_capacity(n_dst, width, graph.num_nodes)
            if self.capacities is not None:
                n_src = max(n_dst, min(n_src, self.capacities[hop]))
            shapes.append((n_dst, width, n_src))
            n_dst = n_src
        return shapes

    def worst_case(self, graph: ShardedGraph, num_seeds: int) -> list[int]:
        """Per hop, the src capacity no batch of `num_seeds` seeds can exceed."""
        unbounded = dataclasses.replace(self, capacities=None)
        return [n_src for _, _, n_src in unbounded.shapes(graph, num_seeds)]

    # -- the step ------------------------------------------------------------------------

    def sample(self, graph: ShardedGraph, exchange: Exchange, seeds, seed_mask, *,
               seed, step, edge_weights=None, local_seeds: bool = False) -> Sample:
        """Sample the blocks of `seeds` (int32[B] global ids, distinct where `seed_mask`).

        The real seeds are moved to the front (a loader's batches already are), so
        `blocks[-1].dst` lists them in the order the blocks use.

        Runs inside `shard_map` over `exchange.axis`; `graph` is this device's shard.
        seed, step: ints or traced uint32 scalars that, with hop and node id, key every
        draw. edge_weights: per-node cumulative edge weights from `edge_weight_cumsum`
        (needed when `weighted`). local_seeds: the seeds are this device's own nodes
        (a `NodeLoader`'s always are), so the first hop is sampled here without the
        exchange; a seed owned elsewhere is then counted in the hop's `out_of_range`
        (and `SampleStats.check` raises), never sampled silently wrong.
        """
        if self.weighted and edge_weights is None:
            raise ValueError("a weighted sampler needs edge_weights (see edge_weight_cumsum)")
        dst = compact_front(jnp.where(seed_mask, seeds.astype(jnp.int32), -1))
        blocks, stats, edges, truncated = [], [], jnp.int32(0), jnp.int32(0)
        needed, capacity = [], []
        hops = zip(self.hop_fanouts(graph), self._given(graph),
                   self.shapes(graph, dst.shape[0]))
        for hop, (fanout, given, (_, _, n_src)) in enumerate(hops):
            owner_fn = self._owner_fn(graph, fanout, [x == -1 for x in given],
                                      stream_key(seed, step, hop), edge_weights, exchange.axis)
            if hop == 0 and local_seeds:
                got, hop_stats = exchange.gather_local(dst, dst >= 0, owner_fn)
            else:
                # once: the draw is compiled once, not once per capacity rung.
                got, hop_stats = exchange.gather(dst, dst >= 0, owner_fn, distinct=True,
                                                 once=True)
            block, need = build_block_counted(dst, got["nbr"] - 1,
                                              got["rel"] - 1 if "rel" in got else None,
                                              n_src, graph.num_nodes)
            blocks.append(block)
            needed.append(need)
            capacity.append(n_src)
            stats.append(hop_stats)
            edges = edges + jnp.sum(block.mask, dtype=jnp.int32)
            if "cut" in got:
                truncated = truncated + jnp.sum(got["cut"], dtype=jnp.int32)
            dst = lax.optimization_barrier(block.src)
        axis = exchange.axis
        needed = jnp.stack(needed)
        overflow = jnp.sum(jnp.maximum(needed - jnp.asarray(capacity, jnp.int32), 0))
        return Sample(tuple(reversed(blocks)), SampleStats(
            lax.psum(edges, axis), lax.psum(truncated, axis), tuple(stats),
            lax.pmax(needed, axis), jnp.asarray(capacity, jnp.int32),
            lax.psum(overflow, axis)))

    def _owner_fn(self, graph, fanout, capped, stream, edge_weights, axis):
        """Answers, for owned ids, {"nbr": neighbour id + 1, "rel": relation + 1 (graphs
        with several relations), "cut": truncated (hops with a -1 fanout)}: zero means
        none, so the exchange's zero padding reads as "no neighbour". capped[r]: the
        fanout of relation slot r was -1 (all neighbours, up to the cap)."""

        def fn(ids, mask):
            local = owned_index(ids, mask, graph.offsets, axis)
            lo = graph.indptr[local]
            deg = jnp.where(mask, graph.in_degree[local], 0)
            keys = node_keys(stream, ids)
            if len(fanout) == 1:
                segments = [(lo, deg, keys, fanout[0], capped[0])]
            else:
                segments = []
                for r, f in enumerate(fanout):
                    if f == 0:
                        continue
                    r_lo, r_hi = self._relation_range(graph, lo, deg, r)
                    segments.append((r_lo, r_hi - r_lo, hash32(keys, 0x10000 + r), f,
                                     capped[r]))
            pos = jnp.concatenate([
                self._draw(s_lo, d, k, f, edge_weights, graph.max_in_degree, lo, every)
                for s_lo, d, k, f, every in segments], axis=1)
            pos = lax.optimization_barrier(pos)     # keep the draws out of the gathers
            ok = pos >= 0
            safe = jnp.where(ok, pos, 0)
            out = {"nbr": jnp.where(ok, graph.indices[safe] + 1, 0)}
            if graph.num_relations > 1:
                out["rel"] = jnp.where(ok, graph.etype[safe] + 1, 0)
            if any(capped):
                cut = jnp.zeros(ids.shape, bool)
                for _, d, _, f, is_cap in segments:
                    if is_cap:
                        cut = cut | (d > f)
                out["cut"] = cut & mask
            return out
        return fn

    def _draw(self, lo, deg, keys, fanout, edge_weights, max_degree, node_lo, every):
        if every and fanout >= max_degree and not self.replace:
            # -1 with a cap no node exceeds: every edge, no draw (a draw of this width
            # would take `fanout` sequential steps). Weighted: those with weight.
            if self.weighted:
                return weighted_edges(lo, deg, fanout, edge_weights, node_lo)
            j = jnp.arange(fanout, dtype=jnp.int32)
            return jnp.where(j[None, :] < deg[:, None], lo[:, None] + j, -1)
        if self.weighted:
            return weighted_positions(lo, deg, keys, fanout, self.replace, edge_weights,
                                      max_degree, node_lo)
        return draw_positions(lo, deg, keys, fanout, self.replace, self.impl)

    @staticmethod
    def _relation_range(graph, lo, deg, r):
        """[first, end) of each node's in-edges of relation r (in-edges are sorted by
        relation within a node), by a fixed number of bisection steps."""
        steps = bisect_steps(graph.max_in_degree)
        last = graph.etype.shape[0] - 1

        def lower_bound(target):
            return bisect(lo, lo + deg, steps,
                          lambda p: graph.etype[jnp.minimum(p, last)] < target)
        return lower_bound(r), lower_bound(r + 1)
