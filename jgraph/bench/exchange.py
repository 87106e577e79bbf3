"""`jgraph bench exchange`: feature-fetch traffic and speed of each exchange strategy,
and the step time of sharded embeddings at two table sizes.

Workload. Each device takes a batch of seeds it owns (training nodes when the graph has
a train split), samples their multi-hop in-neighbourhood on the host (`fanouts` per
hop, uniform with replacement, then deduplicated) and asks for the feature rows of all
those nodes: the fetch a GraphSAGE minibatch makes. Every strategy answers the same
batches; each answer is checked against a plain numpy gather.

Figures. `wire_bytes`: bytes sent between devices per call (ids and rows), summed over
devices, mean over batches. `min_bytes`: bytes of the distinct remote rows the batches
request (each device's distinct ids it does not own, times the row size), the least any
exchange without a cache must move. `wire_bytes_ratio` = wire / min; a cache can take
it below 1.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.bench.common import partition_on_mesh
from jgraph.dist import (REPLICATED, ROWS, DistEmbedding, DistGraph, Exchange, ExchangeConfig,
                         HotCache, RowLayout, SparseAdam, Strategy, make_mesh, request_counts)
from jgraph.dist.mesh import first_devices
from jgraph.partition import PartitionBook
from jgraph.progress import Progress


@dataclasses.dataclass(frozen=True)
class ExchangeBench:
    graph: str
    num_parts: int = 8
    method: str = "metis"
    strategies: tuple[Strategy, ...] = ()          # () = every strategy this backend has
    batch_size: int = 1024
    fanouts: tuple[int, ...] = (15, 10, 5)
    batches: int = 8
    cache: float = 0.0                             # fraction of nodes in the hot cache
    cache_by: str = "degree"                       # degree | frequency
    growth: float = ExchangeConfig.growth
    seed: int = 0
    symmetrize: bool = False
    embedding_rows: tuple[int, ...] = (1_000_000, 10_000_000)
    embedding_dim: int = 32
    embedding_batch: int = 8192
    embedding_steps: int = 10


def available_strategies() -> tuple[Strategy, ...]:
    ragged = () if jax.default_backend() == "cpu" else (Strategy.RAGGED,)
    return (Strategy.ALL_TO_ALL, Strategy.ALL_GATHER, Strategy.RING) + ragged


# -- workload --------------------------------------------------------------------------


def global_csc(dg: DistGraph) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64[N+1], indices int64[E]) of the whole graph in partition ids."""
    indptrs, indices, base = [np.zeros(1, np.int64)], [], 0
    for k in range(dg.num_parts):
        part = dg.parts.part(k)
        indptrs.append(np.asarray(part.indptr[1:]) + base)
        indices.append(np.asarray(part.indices))
        base += part.num_edges
    return np.concatenate(indptrs), np.concatenate(indices)


def neighbourhood(indptr, indices, seeds, fanouts, rng) -> np.ndarray:
    """Sorted distinct nodes of a sampled multi-hop in-neighbourhood, seeds included."""
    nodes, frontier = [seeds], seeds
    for fanout in fanouts:
        deg = indptr[frontier + 1] - indptr[frontier]
        frontier = frontier[deg > 0]
        deg = deg[deg > 0]
        pick = (rng.random((frontier.size, fanout)) * deg[:, None]).astype(np.int64)
        frontier = np.unique(indices[indptr[frontier][:, None] + pick])
        nodes.append(frontier)
    return np.unique(np.concatenate(nodes))


def request_batches(dg: DistGraph, cfg: ExchangeBench, rng) -> np.ndarray:
    """int32[batches, P, n] global ids per device, -1 padded to one static n."""
    indptr, indices = global_csc(dg)
    ntype = dg.node_types[0]
    out = []
    for _ in range(cfg.batches):
        per_device = []
        for k in range(dg.num_parts):
            split = dg.parts.part(k).splits.get(ntype, {})
            lo, hi = dg.book.part_range(k)
            pool = np.asarray(split["train"]) if "train" in split else np.arange(lo, hi)
            seeds = rng.choice(pool, min(cfg.batch_size, pool.size), replace=False)
            per_device.append(neighbourhood(indptr, indices, np.sort(seeds), cfg.fanouts, rng))
        out.append(per_device)
    n = max(ids.size for batch in out for ids in batch)
    n = -(-n // 8) * 8
    padded = np.full((cfg.batches, dg.num_parts, n), -1, np.int32)
    for b, batch in enumerate(out):
        for k, ids in enumerate(batch):
            padded[b, k, :ids.size] = ids
    return padded


def remote_counts(book: PartitionBook, batch: np.ndarray) -> np.ndarray:
    """int64[P]: distinct ids each device of one batch [P, n] asks other devices for."""
    counts = np.zeros(len(batch), np.int64)
    for k, ids in enumerate(batch):
        ids = ids[ids >= 0]
        lo, hi = book.part_range(k)
        counts[k] = np.unique(ids[(ids < lo) | (ids >= hi)]).size
    return counts


def min_bytes(book: PartitionBook, batch: np.ndarray, row_bytes: int) -> int:
    """Bytes of the distinct remote rows one batch [P, n] requests."""
    return int(remote_counts(book, batch).sum()) * row_bytes


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def all_gather_bytes(book: PartitionBook, batches: np.ndarray, row_bytes: int,
                     growth: float) -> int:
    """Answer buffers the all_gather strategy holds at once, summed over devices.

    Every device answers the requests of all P devices padded to one capacity rung
    (at most `growth` times the largest remote count), so each holds P * cap rows
    before the reduce-scatter, and simulated devices share this host's memory.
    """
    P = batches.shape[1]
    cap = growth * max(int(remote_counts(book, b).max()) for b in batches)
    return int(P * P * cap * row_bytes)


# -- the exchange benchmark --------------------------------------------------------------


def time_calls(fn, args_list, warmup_args) -> tuple[float, float, list]:
    """(compile seconds, mean seconds per call, outputs)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*warmup_args))
    compile_s = time.perf_counter() - start
    outs, start = [], time.perf_counter()
    for args in args_list:
        outs.append(fn(*args))
    jax.block_until_ready(outs)
    return compile_s, (time.perf_counter() - start) / len(args_list), outs


def bench_exchange(cfg: ExchangeBench, progress: Progress) -> Iterator[dict]:
    """One row per strategy, yielded as soon as it is measured."""
    rng = np.random.default_rng(cfg.seed)
    with partition_on_mesh(cfg.graph, cfg.num_parts, cfg.method, symmetrized=cfg.symmetrize,
                           seed=cfg.seed, bench="exchange", progress=progress,
                           node_data=("feat",)) as (meta, dg):
        mesh = dg.mesh
        feat = dg.ndata("feat")
        row_bytes = int(np.prod(feat.shape[1:])) * feat.dtype.itemsize
        with progress.phase("sampling request batches"):
            batches = request_batches(dg, cfg, rng)
        cache = HotCache.empty()
        if cfg.cache > 0:
            if cfg.cache_by == "degree":
                scores = dg.degrees()[1]
            else:   # counted over warm-up batches distinct from the measured ones
                warm = request_batches(dg, dataclasses.replace(cfg, seed=cfg.seed + 1),
                                       np.random.default_rng(cfg.seed + 1))
                scores = request_counts((b for b in warm.reshape(-1, warm.shape[-1])),
                                        meta.num_nodes)
            cache = HotCache.top(scores, cfg.cache)
        cache_ids, cache_rows = cache.device_args(feat)
        features = feat.to_numpy()
        minimum = float(np.mean([min_bytes(dg.book, b, row_bytes) for b in batches]))
        for strategy in cfg.strategies or available_strategies():
            line = {"bench": "exchange", "graph": meta.graph_name, "strategy": strategy.value,
                    "method": meta.method, "devices": mesh.size}
            if strategy is Strategy.ALL_GATHER and jax.default_backend() == "cpu":
                need = all_gather_bytes(dg.book, batches, row_bytes, cfg.growth)
                if need > host_memory_bytes() // 2:
                    reason = (f"all_gather would hold {need / 2**30:.1f} GiB of answer rows "
                              f"across {mesh.size} simulated devices, over half this "
                              f"host's memory; choose another --strategy")
                    progress.note(f"skipping all_gather: {reason}")
                    yield {**line, "skipped": reason, "row_bytes": row_bytes}
                    continue
            exchange = dg.exchange(ExchangeConfig(strategy=strategy, growth=cfg.growth))

            def body(shard, ids, cids, crows, exchange=exchange):
                return feat.lookup(exchange, shard, ids, ids >= 0, cache=(cids, crows))
            fn = jax.jit(jax.shard_map(body, mesh=mesh,
                                       in_specs=(ROWS, ROWS, REPLICATED, REPLICATED),
                                       out_specs=(ROWS, REPLICATED)))
            args = [(feat.array, jnp.asarray(b.reshape(-1)), cache_ids, cache_rows)
                    for b in batches]
            with progress.phase(f"compiling the {strategy.value} exchange for {mesh.size} "
                                f"device(s)"):
                start = time.perf_counter()
                fn = fn.lower(*args[0]).compile()
                compile_s = time.perf_counter() - start
            with progress.phase(f"exchange {strategy.value}"):
                _, seconds, outs = time_calls(fn, args, args[0])
            for b, (got, stats) in zip(batches, outs):
                stats.check(f"exchange {strategy.value}")
                ids = b.reshape(-1)
                want = np.where((ids >= 0)[:, None], features[np.maximum(ids, 0)], 0)
                if not np.array_equal(np.asarray(got), want):
                    raise AssertionError(f"exchange {strategy.value} returned wrong rows")
            wire = float(np.mean([float(s.wire_bytes) for _, s in outs]))
            yield {
                **line, "seconds_per_call": seconds, "compile_seconds": compile_s,
                "wire_bytes": wire, "min_bytes": minimum,
                "wire_bytes_ratio": wire / minimum if minimum else None,
                "capacity": float(np.mean([int(s.capacity) for _, s in outs])),
                "ids_per_device": int(batches.shape[-1]),
                "distinct_ids": float(np.mean([int(s.requested) for _, s in outs])),
                "remote_ids": float(np.mean([int(s.non_local) for _, s in outs])),
                "cache_hits": float(np.mean([int(s.cached) for _, s in outs])),
                "cache_fraction": cfg.cache, "cache_rows": len(cache), "cache_by": cfg.cache_by,
                "row_bytes": row_bytes, "batch_size": cfg.batch_size,
                "fanouts": list(cfg.fanouts), "edge_cut_fraction": meta.edge_cut_fraction,
                "growth": cfg.growth,
            }


# -- the embedding benchmark -------------------------------------------------------------


def even_book(rows: int, parts: int) -> PartitionBook:
    offsets = np.linspace(0, rows, parts + 1).astype(np.int64)
    return PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], 1), ("_N",))


def bench_embedding(cfg: ExchangeBench, num_rows: int, progress: Progress) -> dict:
    """One training step of a sharded table: lookup, gradient, sparse Adam update."""
    mesh = make_mesh(cfg.num_parts, first_devices(cfg.num_parts))
    book = even_book(num_rows, cfg.num_parts)
    emb = DistEmbedding(RowLayout.of(book), cfg.embedding_dim, SparseAdam(0.01))
    exchange = Exchange(book.offsets, platform=mesh.devices.flat[0].platform)
    with progress.phase(f"embedding table of {num_rows:,} rows"):
        state = emb.init(mesh, jax.random.key(cfg.seed))
        jax.block_until_ready(state)

    def step(state, ids, target):
        valid = ids >= 0
        rows, _ = emb.lookup(exchange, state, ids, valid)
        grads = jax.grad(lambda r: 0.5 * jnp.sum((r - target) ** 2))(rows)
        return emb.apply_gradients(exchange, state, ids, valid, grads)

    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(emb.specs(), ROWS, ROWS),
                               out_specs=(emb.specs(), REPLICATED)), donate_argnums=0)
    rng = np.random.default_rng(cfg.seed)
    n = cfg.embedding_batch
    target = jnp.asarray(rng.standard_normal((cfg.num_parts * n, cfg.embedding_dim),
                                             dtype=np.float32))
    id_sets = [jnp.asarray(rng.integers(0, num_rows, cfg.num_parts * n, dtype=np.int32))
               for _ in range(cfg.embedding_steps + 1)]
    start = time.perf_counter()
    state, stats = fn(state, id_sets[0], target)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for ids in id_sets[1:]:
        state, stats = fn(state, ids, target)
    jax.block_until_ready(state)
    seconds = (time.perf_counter() - start) / cfg.embedding_steps
    stats.check("embedding gradient exchange")
    return {"bench": "embedding", "rows": num_rows, "dim": cfg.embedding_dim,
            "devices": mesh.size, "ids_per_device": n, "optimizer": "sparse_adam",
            "strategy": exchange.config.strategy.value, "seconds_per_step": seconds,
            "compile_seconds": compile_s,
            "table_bytes": num_rows * cfg.embedding_dim * 4 * 3}
