"""`jgraph bench sample`: throughput of the on-device sampler and node loader.

Partition GRAPH into one partition per device, deal its training nodes with the
`NodeLoader`, and run the compiled step "take a batch, sample its blocks" over whole
epochs: one warm-up epoch (which includes the compilation), then `epochs` measured
ones. The step returns the counts (sampled edges, seeds, input nodes), so nothing the
sampler builds can be compiled away.

Figures: `seeds_per_s` (real seeds, padding excluded), `sampled_edges_per_s` (real
sampled neighbour slots over all hops), `compile_seconds` (the first call).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jgraph.bench.common import partition_on_mesh
from jgraph.bench.config import SampleBench
from jgraph.progress import Progress
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sharded import REPLICATED, ROWS


def bench_sample(cfg: SampleBench, progress: Progress) -> dict:
    with partition_on_mesh(cfg.data, seed=cfg.train.seed, bench="sample", progress=progress,
                           splits=("train",)) as (meta, dg):
        loader = NodeLoader.from_split(dg, "train", batch_size=cfg.train.batch_size,
                                       seed=cfg.train.seed)
    mesh = dg.mesh
    sampler = NeighborSampler(cfg.train.fanouts, replace=cfg.replace, impl=cfg.impl)
    exchange = dg.exchange(cfg.exchange)

    def step(graph, order, i, global_step):
        seeds, mask = loader.batch(order, i)
        sample = sampler.sample(graph, exchange, seeds, mask, seed=cfg.train.seed, step=global_step,
                                local_seeds=True)
        inputs = jax.lax.psum(jnp.sum(sample.input_nodes >= 0, dtype=jnp.int32), exchange.axis)
        seeds_real = jax.lax.psum(jnp.sum(mask, dtype=jnp.int32), exchange.axis)
        return sample.stats, seeds_real, inputs

    fn = jax.jit(jax.shard_map(step, mesh=mesh,
                               in_specs=(dg.graph.specs(), ROWS, REPLICATED, REPLICATED),
                               out_specs=REPLICATED))

    def epoch(e, first_step):
        order = loader.epoch_order(e)
        outs = [fn(dg.graph, order, i, first_step + i)
                for i in progress.iterate(range(loader.steps_per_epoch), f"epoch {e}")]
        jax.block_until_ready(outs)
        return outs

    steps = loader.steps_per_epoch
    with progress.phase(f"compiling the sampling step for {mesh.size} device(s)"):
        start = time.perf_counter()
        fn = fn.lower(dg.graph, loader.epoch_order(0), 0, 0).compile()
        compile_s = time.perf_counter() - start
    with progress.phase("warm-up epoch"):
        epoch(0, 0)
    with progress.phase(f"{cfg.train.epochs} measured epoch(s)"):
        start = time.perf_counter()
        outs = [o for e in range(1, cfg.train.epochs + 1) for o in epoch(e, e * steps)]
        seconds = time.perf_counter() - start
    for stats, _, _ in outs:
        stats.check()
    edges = float(sum(int(s.sampled_edges) for s, _, _ in outs))
    seeds = float(sum(int(n) for _, n, _ in outs))
    inputs = float(np.mean([int(x) for _, _, x in outs]))
    return {
        "bench": "sample", "graph": meta.graph_name, "devices": mesh.size,
        "method": meta.method, "fanouts": list(cfg.train.fanouts),
        "batch_size": cfg.train.batch_size,
        "replace": cfg.replace, "impl": cfg.impl, "strategy": exchange.config.strategy.value,
        "growth": cfg.exchange.growth,
        "epochs": cfg.train.epochs, "steps_per_epoch": steps, "seeds_per_epoch": loader.num_seeds,
        "seconds": seconds, "seeds_per_s": seeds / seconds,
        "sampled_edges_per_s": edges / seconds,
        "sampled_edges_per_step": edges / len(outs), "input_nodes_per_step": inputs,
        "compile_seconds": compile_s, "backend": jax.default_backend(),
    }
