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
it below 1. `seconds_per_call`: one call from dispatch to its answers, mean over
batches, after a warm-up call. With `exchange.sizing` calibrated (the default), the
capacities are fitted to what the batches send before anything is measured, as a
training run fits them to its first batches.

Memory. Each program is compiled before anything of its own is allocated, and runs only
if what XLA says it holds (temporaries and answers, on every simulated device at once:
they share this host's memory) fits in the memory available then; otherwise its line
says why it was `skipped`, with `need_bytes` and `available_bytes`.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

import jgraph.segments as segments
from jgraph.bench.common import memory_shortage, partition_on_mesh
from jgraph.bench.config import ExchangeBench
from jgraph.data import SparseRows
from jgraph.exchange import CacheBy, Sizing
from jgraph.exchange import row_bytes as stored_row_bytes
from jgraph.mesh import first_devices, rows_sharding
from jgraph.partition import PartitionBook
from jgraph.progress import Progress
from jgraph.sharded import (
    REPLICATED,
    ROWS,
    DistEmbedding,
    DistGraph,
    Exchange,
    HotCache,
    RowLayout,
    SparseAdam,
    Strategy,
    make_mesh,
    request_counts,
)


def available_strategies() -> tuple[Strategy, ...]:
    """Every strategy this backend has; on CPU, scheduled stands in for ragged_all_to_all
    (elsewhere it runs when named)."""
    cpu = jax.default_backend() == "cpu"
    last = (Strategy.SCHEDULED,) if cpu else (Strategy.RAGGED,)
    return (Strategy.ALL_TO_ALL, Strategy.ALL_GATHER, Strategy.RING) + last


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
        frontier = segments.distinct(indices[indptr[frontier][:, None] + pick])
        nodes.append(frontier)
    return segments.distinct(np.concatenate(nodes))


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
            seeds = rng.choice(pool, min(cfg.train.batch_size, pool.size), replace=False)
            per_device.append(neighbourhood(indptr, indices, np.sort(seeds), cfg.train.fanouts,
                                            rng))
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
        counts[k] = segments.distinct(ids[(ids < lo) | (ids >= hi)]).size
    return counts


def min_bytes(book: PartitionBook, batch: np.ndarray, row_bytes: int) -> int:
    """Bytes of the distinct remote rows one batch [P, n] requests."""
    return int(remote_counts(book, batch).sum()) * row_bytes


# -- the exchange benchmark --------------------------------------------------------------


def time_calls(fn, args_list, check) -> tuple[float, list]:
    """(mean seconds per call, each call's stats), after a warm-up call.

    Calls run one at a time: each one's outputs `(rows, stats)` go to `check(i, rows,
    stats)` and its rows are dropped before the next call starts, so only one call's
    answers (P * n rows: gigabytes for wide features) exist at once, as the memory
    check assumes.
    """
    jax.block_until_ready(fn(*args_list[0]))
    seconds, kept = 0.0, []
    for i, args in enumerate(args_list):
        start = time.perf_counter()
        rows, stats = jax.block_until_ready(fn(*args))
        seconds += time.perf_counter() - start
        check(i, rows, stats)
        kept.append(stats)
        del rows
    return seconds / len(args_list), kept


def check_rows(what: str, features: np.ndarray, ids: np.ndarray, rows: jax.Array) -> None:
    """Compare answers [P * n, ...] (or sparse rows) with a numpy gather of `ids`, one
    device's block at a time (host memory: three blocks of n dense rows)."""
    if isinstance(rows, SparseRows):
        shards = [(i.index[0], SparseRows(i.data, v.data, rows.width).toarray())
                  for i, v in zip(rows.indices.addressable_shards,
                                  rows.values.addressable_shards)]
    else:
        shards = [(shard.index[0], np.asarray(shard.data)) for shard in rows.addressable_shards]
    for index, got in shards:
        block = ids[index]
        want = np.where((block >= 0)[:, None], features[np.maximum(block, 0)], 0)
        if not np.array_equal(got, want):
            raise AssertionError(f"{what} returned wrong rows")


def bench_exchange(cfg: ExchangeBench, progress: Progress) -> Iterator[dict]:
    """One row per strategy, yielded as soon as it is measured; a strategy whose program
    would not fit in memory is skipped with the reason (`skipped`)."""
    rng = np.random.default_rng(cfg.train.seed)
    with partition_on_mesh(cfg.data, seed=cfg.train.seed, bench="exchange", progress=progress,
                           node_data=("feat",)) as (meta, dg):
        mesh = dg.mesh
        devices = list(mesh.devices.flat)
        feat = dg.ndata("feat")
        # Bytes of one row as stored (for sparse rows, its indices and values).
        row_bytes = stored_row_bytes(feat.array)
        dense_bytes = int(np.prod(feat.shape[1:])) * feat.dtype.itemsize
        with progress.phase("sampling request batches"):
            batches = request_batches(dg, cfg, rng)
        cache = HotCache.empty()
        if cfg.exchange.cache > 0:
            if cfg.exchange.cache_by is CacheBy.DEGREE:
                scores = dg.degrees()[1]
            else:   # counted over warm-up batches distinct from the measured ones
                warm = request_batches(dg, cfg, np.random.default_rng(cfg.train.seed + 1))
                scores = request_counts((b for b in warm.reshape(-1, warm.shape[-1])),
                                        meta.num_nodes)
            cache = HotCache.top(scores, cfg.exchange.cache)
        cache_ids, cache_rows = cache.device_args(feat)
        features = feat.to_numpy()
        minimum = float(np.mean([min_bytes(dg.book, b, row_bytes) for b in batches]))
        for strategy in cfg.strategies or available_strategies():
            what = f"the {strategy.value} exchange"
            line = {"bench": "exchange", "graph": meta.graph_name, "strategy": strategy.value,
                    "method": meta.method, "devices": mesh.size}
            args = [(feat.array, jnp.asarray(b.reshape(-1)), cache_ids, cache_rows)
                    for b in batches]

            def program(exchange):
                def body(shard, ids, cids, crows):
                    return feat.lookup(exchange, shard, ids, ids >= 0, cache=(cids, crows))
                return jax.jit(jax.shard_map(body, mesh=mesh,
                                             in_specs=(ROWS, ROWS, REPLICATED, REPLICATED),
                                             out_specs=(ROWS, REPLICATED)))
            exchange = dg.exchange(cfg.exchange_for(strategy))
            if exchange.config.sizing is Sizing.CALIBRATED and mesh.size > 1:
                # As training does: capacities fitted to what the batches send.
                with progress.phase(f"measuring {what}"):
                    measure = program(exchange)
                    exchange = exchange.fitted([measure(*a)[1] for a in args])
            with progress.phase(f"compiling {what} for {mesh.size} device(s)"):
                start = time.perf_counter()
                fn = program(exchange).lower(*args[0]).compile()
                compile_s = time.perf_counter() - start
            # Compiled, nothing allocated yet: does one call fit? Beside the program's own
            # buffers, checking holds three blocks of one device's answers.
            shortage = memory_shortage(fn, devices, arguments_allocated=True,
                                       host_extra=3 * batches.shape[-1] * dense_bytes)
            if shortage:
                skip = shortage.fields(what, "choose another --strategy, fewer --num-parts "
                                             "or a smaller --batch-size")
                progress.note(f"skipping {strategy.value}: {skip['skipped']}")
                yield {**line, **skip, "row_bytes": row_bytes}
                continue

            def check(i, rows, stats, what=what):
                stats.check(what)
                check_rows(what, features, batches[i].reshape(-1), rows)
            with progress.phase(f"exchange {strategy.value}"):
                seconds, stats = time_calls(fn, args, check)
            wire = float(np.mean([float(s.wire_bytes) for s in stats]))
            yield {
                **line, "seconds_per_call": seconds, "compile_seconds": compile_s,
                "wire_bytes": wire, "min_bytes": minimum,
                "wire_bytes_ratio": wire / minimum if minimum else None,
                "capacity": float(np.mean([int(s.capacity) for s in stats])),
                "ids_per_device": int(batches.shape[-1]),
                "distinct_ids": float(np.mean([int(s.requested) for s in stats])),
                "remote_ids": float(np.mean([int(s.non_local) for s in stats])),
                "cache_hits": float(np.mean([int(s.cached) for s in stats])),
                "cache_fraction": cfg.exchange.cache, "cache_rows": len(cache),
                "cache_by": cfg.exchange.cache_by.value,
                "row_bytes": row_bytes, "batch_size": cfg.train.batch_size,
                "fanouts": list(cfg.train.fanouts), "edge_cut_fraction": meta.edge_cut_fraction,
                "growth": cfg.exchange.growth,
            }


# -- the embedding benchmark -------------------------------------------------------------


def even_book(rows: int, parts: int) -> PartitionBook:
    offsets = np.linspace(0, rows, parts + 1).astype(np.int64)
    return PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], 1), ("_N",))


def bench_embedding(cfg: ExchangeBench, num_rows: int, progress: Progress) -> dict:
    """One training step of a sharded table: lookup, gradient, sparse Adam update. A table
    whose step would not fit in memory is skipped with the reason (`skipped`)."""
    mesh = make_mesh(cfg.data.num_parts, first_devices(cfg.data.num_parts))
    book = even_book(num_rows, cfg.data.num_parts)
    emb = DistEmbedding(RowLayout.of(book), cfg.embedding_dim, SparseAdam(0.01))
    exchange = Exchange(book.offsets, platform=mesh.devices.flat[0].platform)
    line = {"bench": "embedding", "rows": num_rows, "dim": cfg.embedding_dim,
            "devices": mesh.size, "optimizer": "sparse_adam",
            "table_bytes": num_rows * cfg.embedding_dim * 4 * 3}

    def step(state, ids, target):
        valid = ids >= 0
        rows, _ = emb.lookup(exchange, state, ids, valid)
        grads = jax.grad(lambda r: 0.5 * jnp.sum((r - target) ** 2))(rows)
        return emb.apply_gradients(exchange, state, ids, valid, grads)

    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(emb.specs(), ROWS, ROWS),
                               out_specs=(emb.specs(), REPLICATED)), donate_argnums=0)
    rng = np.random.default_rng(cfg.train.seed)
    n = cfg.embedding_batch
    target = jnp.asarray(rng.standard_normal((cfg.data.num_parts * n, cfg.embedding_dim),
                                             dtype=np.float32))
    id_sets = [jnp.asarray(rng.integers(0, num_rows, cfg.data.num_parts * n, dtype=np.int32))
               for _ in range(cfg.embedding_steps + 1)]
    # Compile against the table's shape before creating it: the step's arguments are
    # the whole table and its Adam state, which must fit beside its temporaries.
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows_sharding(mesh)),
        jax.eval_shape(lambda: emb.init(mesh, jax.random.key(cfg.train.seed))))
    start = time.perf_counter()
    fn = fn.lower(shapes, id_sets[0], target).compile()
    compile_s = time.perf_counter() - start
    shortage = memory_shortage(fn, list(mesh.devices.flat), arguments_allocated=False)
    if shortage:
        skip = shortage.fields(f"an embedding table of {num_rows:,} rows",
                               "choose smaller --embedding-rows or --embedding-dim")
        progress.note(f"skipping the {num_rows:,}-row embedding table: {skip['skipped']}")
        return {**line, **skip}
    with progress.phase(f"embedding table of {num_rows:,} rows"):
        state = emb.init(mesh, jax.random.key(cfg.train.seed))
        jax.block_until_ready(state)
    state, stats = fn(state, id_sets[0], target)          # warm-up
    jax.block_until_ready(state)
    start = time.perf_counter()
    for ids in id_sets[1:]:
        state, stats = fn(state, ids, target)
    jax.block_until_ready(state)
    seconds = (time.perf_counter() - start) / cfg.embedding_steps
    stats.check("embedding gradient exchange")
    return {**line, "ids_per_device": n, "strategy": exchange.config.strategy.value,
            "seconds_per_step": seconds, "compile_seconds": compile_s}
