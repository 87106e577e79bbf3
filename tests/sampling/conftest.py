"""Shared pieces of the jgraph.sampling tests: meshes, partitioned graphs, a compiled
sampling step, and the numpy reference every sample is checked against.

Compiles dominate the cost (seconds per sampler on 8 simulated CPU devices), so each
test module builds its `SampleRunner`s once (module-scoped fixtures) and feeds them
many seeds, steps and keys of the same shapes. The exchange uses one capacity rung:
its rung ladder multiplies compile time and is tested in tests/sharded.

The reference neighbourhoods come from the original `Graph`'s edge list mapped through
the partition's `node_map_inv`, not from the partition files the library loads.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgraph.bench.exchange import global_csc
from jgraph.data import Graph, load_dataset
from jgraph.partition import open_partitions, partition_graph
from jgraph.sharded import REPLICATED, ROWS, DistGraph, ExchangeConfig, make_mesh

P = 8
ONE_RUNG = ExchangeConfig(relay=False, max_rungs=1)
"""all_to_all without relay and a single capacity rung (the batch size): exact, and a
fraction of the compile time of the default ladder."""


# -- meshes and graphs -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def mesh8():
    assert len(jax.devices()) == P, "tests/conftest.py should give 8 CPU devices"
    return make_mesh(P)


@pytest.fixture(scope="session")
def mesh1():
    return make_mesh(devices=jax.devices()[:1])


@pytest.fixture(scope="session")
def cora():
    return load_dataset("cora")


def partition(graph: Graph, num_parts: int, method: str, tmp_path_factory, name: str):
    out = tmp_path_factory.mktemp(name) / "parts"
    partition_graph(graph, num_parts, method, out)
    return open_partitions(out)


@pytest.fixture(scope="session")
def cora8(cora, mesh8, tmp_path_factory):
    """cora METIS-partitioned into 8 parts, opened on the 8-device mesh."""
    return DistGraph(partition(cora, P, "metis", tmp_path_factory, "cora8"), mesh8)


def random_simple_graph(rng, num_nodes: int, max_degree: int, zero_degree: int = 0,
                        name: str = "g", **kwargs) -> Graph:
    """A homogeneous graph without self-loops or repeated edges: node v gets a uniformly
    random in-degree in [0, max_degree] (the first `zero_degree` nodes get 0) and that
    many distinct random sources."""
    src, dst = [], []
    for v in range(num_nodes):
        d = 0 if v < zero_degree else int(rng.integers(0, max_degree + 1))
        others = np.delete(np.arange(num_nodes), v)
        src.append(rng.choice(others, d, replace=False))
        dst.append(np.full(d, v))
    return Graph.homogeneous(np.concatenate(src), np.concatenate(dst), num_nodes, name=name,
                             **kwargs)


# -- the numpy reference -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reference:
    """Every in-edge of the partitioned graph, in partition ids, sorted by (dst, relation,
    src) as the partition stores them. indptr: int64[N+1]; src: int64[E]; etype:
    int32[E]; weight: float64[E] (edge data `weight`) or None."""

    indptr: np.ndarray
    src: np.ndarray
    etype: np.ndarray
    weight: np.ndarray | None

    @classmethod
    def of(cls, graph: Graph, dg: DistGraph, weight: str | None = None) -> Reference:
        inv = np.asarray(dg.parts.node_map_inv())
        src, dst, etype = graph.homogeneous_edges()
        src, dst = inv[src], inv[dst]
        order = np.lexsort((src, etype, dst))
        w = None
        if weight is not None:
            w = np.concatenate([graph.edge_data[r][weight] for r in graph.relations])
            w = w.astype(np.float64)[order]
        indptr = np.searchsorted(dst[order], np.arange(graph.total_nodes + 1))
        ref = cls(indptr, src[order], etype[order], w)
        # The partition files hold the same CSC (a cross-check of the reference itself).
        csc_indptr, csc_indices = global_csc(dg)
        np.testing.assert_array_equal(csc_indptr, ref.indptr)
        np.testing.assert_array_equal(csc_indices, ref.src)
        return ref

    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    def degree(self, v) -> np.ndarray:
        v = np.asarray(v)
        return self.indptr[v + 1] - self.indptr[v]

    def edges(self, v: int) -> slice:
        return slice(self.indptr[v], self.indptr[v + 1])

    def nbrs(self, v: int, relation: int | None = None) -> np.ndarray:
        s = self.edges(v)
        if relation is None:
            return self.src[s]
        return self.src[s][self.etype[s] == relation]


# -- running the sampler -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostBlock:
    """A Block on the host, split per device: dst [D, n_dst], src [D, n_src],
    nbr / mask / etype [D, n_dst, W] (etype None for one relation)."""

    dst: np.ndarray
    src: np.ndarray
    nbr: np.ndarray
    mask: np.ndarray
    etype: np.ndarray | None

    def sampled(self, k: int, i: int) -> np.ndarray:
        """Global ids of the neighbours sampled for dst slot i of device k, in slot order."""
        return self.src[k][self.nbr[k, i][self.mask[k, i]]]


@dataclasses.dataclass(frozen=True)
class HostSample:
    blocks: list          # HostBlocks in model order: blocks[-1].dst are the seeds
    stats: object         # SampleStats, host values

    @property
    def hops(self) -> list:
        """The blocks seeds outward (hop 0 first)."""
        return self.blocks[::-1]


class SampleRunner:
    """One compiled `sampler.sample` step on `dg`'s mesh. Call it with seeds int[D, B]
    (device k's batch in row k), an optional mask bool[D, B], and `seed`, `step`
    (traced: every call reuses the one compilation)."""

    def __init__(self, dg: DistGraph, sampler, config: ExchangeConfig = ONE_RUNG,
                 edge_weights=None, local_seeds: bool = False):
        self.dg, self.sampler, self.devices = dg, sampler, dg.mesh.size
        exchange = dg.exchange(config)
        self.traces = 0
        if edge_weights is None:     # a placeholder the unweighted sampler never reads
            edge_weights = jnp.zeros(self.devices, jnp.float32)
        self.edge_weights = edge_weights

        def body(graph, seeds, mask, seed, step, cumw):
            self.traces += 1
            out = sampler.sample(graph, exchange, seeds, mask, seed=seed, step=step,
                                 edge_weights=cumw if sampler.weighted else None,
                                 local_seeds=local_seeds)
            # Every device's own copy of the stats (they must all be equal).
            return out.blocks, jax.tree.map(lambda x: x[None], out.stats)

        self.fn = jax.jit(jax.shard_map(
            body, mesh=dg.mesh,
            in_specs=(dg.graph.specs(), ROWS, ROWS, REPLICATED, REPLICATED, ROWS),
            out_specs=(ROWS, ROWS)))

    def __call__(self, seeds, mask=None, *, seed=0, step=0) -> HostSample:
        seeds = np.asarray(seeds, np.int32)
        mask = np.ones(seeds.shape, bool) if mask is None else np.asarray(mask, bool)
        assert seeds.shape[0] == self.devices
        blocks, stats = self.fn(self.dg.graph, seeds.reshape(-1), mask.reshape(-1),
                                jnp.uint32(seed), jnp.uint32(step), self.edge_weights)
        D = self.devices

        def split(a):
            return np.asarray(a).reshape(D, -1, *a.shape[1:])
        host = [HostBlock(split(b.dst), split(b.src), split(b.nbr), split(b.mask),
                          None if b.etype is None else split(b.etype)) for b in blocks]
        return HostSample(host, jax.tree.map(same_on_every_device, stats))


def same_on_every_device(x) -> np.ndarray:
    """The one value of a statistic every device holds a copy of."""
    x = np.asarray(x)
    assert np.all(x == x[0]), f"devices disagree on a summed statistic: {x}"
    return x[0]


def compact(ids: np.ndarray) -> np.ndarray:
    """Each row's valid ids (>= 0) first, in order, then -1: the layout of `dst`."""
    out = np.full_like(ids, -1)
    for k, row in enumerate(ids):
        real = row[row >= 0]
        out[k, :real.size] = real
    return out


def check_sample(sample: HostSample, ref: Reference, seeds, mask, fanouts,
                 replace: bool, counts: bool = True) -> dict:
    """Assert every documented invariant of a homogeneous-fanout sample against `ref`,
    and return {(hop, node id): sorted tuple of its sampled neighbour ids}, checking
    that every device that sampled a node got the same neighbours.

    Layout (Block's docstring): dst holds the real nodes first, then -1; src[i] ==
    dst[i] for every real dst, then each other sampled neighbour once, then -1; nbr
    indexes src; mask == (nbr >= 0). The seeds' dst are the masked-in seeds, in order,
    and each hop's dst is the previous hop's src.

    fanouts: the number of draws of each hop, seeds outward (a -1 fanout already
    replaced by its cap; per relation: their sum). counts=False leaves the per-node
    counts and repeats to the caller (per relation, a pair may be linked twice; weighted,
    only positive-weight edges count)."""
    seeds, mask = np.asarray(seeds), np.asarray(mask, bool)
    D = seeds.shape[0]
    draws: dict = {}
    dst_expected = compact(np.where(mask, seeds, -1))
    assert len(sample.hops) == len(fanouts)
    for hop, (block, fanout) in enumerate(zip(sample.hops, fanouts)):
        n_dst = block.dst.shape[1]
        assert block.nbr.shape == block.mask.shape == (D, n_dst, fanout)
        assert block.src.shape[1] >= n_dst
        np.testing.assert_array_equal(block.dst, dst_expected)
        np.testing.assert_array_equal(block.mask, block.nbr >= 0)
        for k in range(D):
            dst, src, nbr, m = block.dst[k], block.src[k], block.nbr[k], block.mask[k]
            real_dst = int(np.sum(dst >= 0))
            np.testing.assert_array_equal(src[:real_dst], dst[:real_dst])
            real = int(np.sum(src >= 0))
            assert np.all(src[:real] >= 0) and np.all(src[real:] == -1), \
                f"hop {hop} device {k}: src is not its real ids followed by -1 padding"
            assert np.unique(src[:real]).size == real, f"hop {hop} device {k}: src repeats"
            assert np.all(nbr[m] < real), "nbr points at src padding"
            assert not m[dst < 0].any(), "a padding dst has sampled edges"
            sampled_all = []
            for i in range(real_dst):
                v = int(dst[i])
                got = src[nbr[i][m[i]]]
                true = ref.nbrs(v)
                assert np.isin(got, true).all(), \
                    f"hop {hop}: {got[~np.isin(got, true)]} are not in-neighbours of {v}"
                if counts and replace:
                    assert got.size == (fanout if true.size else 0)
                elif counts:
                    assert np.unique(got).size == got.size, f"node {v}: repeated neighbours"
                    assert got.size == min(true.size, fanout)
                    if true.size <= fanout:
                        np.testing.assert_array_equal(np.sort(got), np.sort(true))
                drawn = tuple(np.sort(got).tolist())
                assert draws.setdefault((hop, v), drawn) == drawn, \
                    f"hop {hop} node {v}: devices disagree on its neighbours"
                sampled_all.append(got)
            # src is exactly the dst nodes and the sampled neighbours, nothing else.
            expected_src = np.union1d(dst[:real_dst],
                                      np.concatenate([np.zeros(0, np.int64)] + sampled_all))
            np.testing.assert_array_equal(np.sort(src[:real]), expected_src)
        dst_expected = block.src      # the next hop computes what this one reads
    return draws


@pytest.fixture(scope="session")
def check():
    """`check_sample` (a fixture, as test modules are imported with importlib)."""
    return check_sample


@pytest.fixture(scope="session")
def compact_rows():
    return compact


@pytest.fixture(scope="session")
def runner_cls():
    return SampleRunner


@pytest.fixture(scope="session")
def reference_of():
    return Reference.of


@pytest.fixture(scope="session")
def simple_graph():
    return random_simple_graph
