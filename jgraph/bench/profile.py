"""Where a training step's time goes: a per-phase breakdown by measurement.

XLA fuses the whole step into one program, so its phases cannot be timed from inside
it. Instead the breakdown compiles the step's prefixes as programs of their own, each
ending in a cheap reduction of everything it computed (so nothing is optimised away),
times each on the same batches, and takes differences:

  sample      the loader's batch and the neighbour draws, deduplication and blocks
  exchange    routing ids to their owners and answers back: the step's exchanges
              replayed on the same ids, answering rows of the same width
  gather      reading the input rows and labels (owner side and cache), not the routing
  forward     the model and the loss
  backward    the gradients
  optimizer   the optimizer updates (dense, and sparse embedding rows)
  host        the loop's wall time per step beyond the step itself: dispatch, the
              host reading results, the Python between steps

The first five are cumulative programs A1 ⊂ A2 ⊂ ...; a phase is the difference of two
medians, so on a noisy machine a small phase may come out slightly negative.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jgraph.jobs.step import NodeClassification, StepData, TrainState
from jgraph.mesh import REPLICATED, ROWS

PHASES = ("sample", "exchange", "gather", "forward", "backward", "optimizer", "host")


def _checksum(tree) -> jax.Array:
    """A float32 scalar that depends on every leaf (so XLA keeps what made them)."""
    total = jnp.float32(0)
    for leaf in jax.tree.leaves(tree):
        if leaf.dtype == jnp.bool_:
            leaf = leaf.astype(jnp.int32)
        total = total + jnp.sum(leaf).astype(jnp.float32)
    return total


class PhasePrograms:
    """The step's prefixes compiled as programs (state, data, order, index) -> float32,
    and the exchange replays (blocks, ...) -> float32."""

    def __init__(self, job: NodeClassification, data: StepData):
        self.job, self.data = job, data
        self.axis = job.exchange.axis
        specs = (job.state_specs(), job.data_specs(data.graph), ROWS, REPLICATED)
        prefixes = {"sample": self._sample, "gather": self._gather,
                    "forward": self._forward, "backward": self._backward}
        self.prefixes = {name: jax.jit(jax.shard_map(
            fn, mesh=job.mesh, in_specs=specs, out_specs=REPLICATED))
            for name, fn in prefixes.items()}
        self.blocks = jax.jit(jax.shard_map(
            self._blocks, mesh=job.mesh, in_specs=specs, out_specs=ROWS))
        # The exchanges of sampling (each hop's frontier) and of the input rows.
        self.exchanges = {part: jax.jit(jax.shard_map(
            lambda blocks, data, part=part: self._exchanges(blocks, data, part),
            mesh=job.mesh, in_specs=(ROWS, job.data_specs(data.graph)),
            out_specs=REPLICATED)) for part in ("sample", "gather")}

    # -- per device ----------------------------------------------------------------------

    def _batch(self, state: TrainState, data, order, index):
        return self.job.training_batch(state, data, order, index)

    def _sample(self, state, data, order, index):
        seeds, mask = self.job.loader.batch(order, index)
        sample = self.job.sampler.sample(data.graph, self.job.exchange, seeds, mask,
                                         seed=self.job.seed, step=state.step, local_seeds=True)
        return lax.psum(_checksum(sample.blocks), self.axis)

    def _blocks(self, state, data, order, index):
        seeds, mask = self.job.loader.batch(order, index)
        sample = self.job.sampler.sample(data.graph, self.job.exchange, seeds, mask,
                                         seed=self.job.seed, step=state.step, local_seeds=True)
        return tuple((b.dst, b.src) for b in sample.blocks)

    def _gather(self, state, data, order, index):
        batch = self._batch(state, data, order, index)
        return lax.psum(_checksum((batch.blocks, batch.rows, batch.labels)), self.axis)

    def _forward(self, state, data, order, index):
        batch = self._batch(state, data, order, index)
        emb = {t: batch.rows[t] for t in self.job.inputs.embeddings}
        loss, _ = self.job.batch_loss(state.params, emb, batch, self.job.dropout_key(state.step))
        return lax.psum(loss, self.axis)

    def _backward(self, state, data, order, index):
        batch = self._batch(state, data, order, index)
        emb = {t: batch.rows[t] for t in self.job.inputs.embeddings}
        grad_fn = jax.value_and_grad(self.job.batch_loss, argnums=(0, 1), has_aux=True)
        (loss, _), grads = grad_fn(state.params, emb, batch, self.job.dropout_key(state.step))
        return lax.psum(loss + _checksum(grads), self.axis)

    def _exchanges(self, blocks, data, part):
        """The step's routed exchanges on these blocks' ids, answering rows as wide as
        the real ones: part "sample", each sampling hop's frontier (but the first, whose
        seeds are local); part "gather", the input rows of every node type."""
        job, ex = self.job, self.job.exchange
        total = jnp.float32(0)
        widths = [sum(f) for f in job.sampler.hop_fanouts(data.graph)]
        # blocks are in model order; hop h (seeds outward) asks for blocks[-1 - h].dst.
        for hop in range(1, len(blocks) if part == "sample" else 1):
            dst = blocks[-1 - hop][0]
            width = widths[hop]

            def draws(ids, mask, width=width):
                return {"nbr": jnp.broadcast_to(ids[:, None] + 1, (ids.shape[0], width))}
            got, _ = ex.gather(dst, dst >= 0, draws, distinct=True, once=True)
            total = total + _checksum(got)
        src = blocks[0][1]
        for ntype, layout in (job.inputs.layouts.items() if part == "gather" else ()):
            ok = (src >= 0) & layout.contains(src)
            width = job.inputs.widths()[ntype]
            dtype = (data.features[ntype].dtype if ntype in data.features else jnp.float32)

            def rows(ids, mask, width=width, dtype=dtype):
                return jnp.broadcast_to(ids[:, None].astype(dtype), (ids.shape[0], width))
            got, _ = ex.gather(src, ok, rows, distinct=True)
            total = total + _checksum(got)
        return lax.psum(total, self.axis)


def _median_seconds(run: Callable[[int], object], calls: int) -> float:
    run(0)                                     # compile, and warm up
    times = []
    for i in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(run(i))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def phase_breakdown(job: NodeClassification, data: StepData, state: TrainState, step,
                    order, loop_step_seconds: float, calls: int = 5) -> dict[str, float]:
    """{phase: seconds per step} (see the module doc) over the first `calls` batches of
    the epoch `order`; `step` is the compiled training step (it donates its state, so
    it runs last, on a copy), `loop_step_seconds` the training loop's measured wall time
    per step."""
    steps = job.loader.steps_per_epoch
    programs = PhasePrograms(job, data)
    index = lambda i: jnp.int32(i % steps)
    cumulative = {name: _median_seconds(lambda i, fn=fn: fn(state, data, order, index(i)),
                                        calls)
                  for name, fn in programs.prefixes.items()}
    blocks = [programs.blocks(state, data, order, index(i)) for i in range(calls)]
    exchange = {part: _median_seconds(lambda i, fn=fn: fn(blocks[i % calls], data), calls)
                for part, fn in programs.exchanges.items()}
    own = jax.tree.map(jnp.copy, state)
    stop = job.stop_votes()

    def full(i):
        nonlocal own
        own, metrics = step(own, data, order, index(i), stop)
        return metrics
    whole = _median_seconds(full, calls)
    sample, gather = cumulative["sample"], cumulative["gather"]
    return {
        "sample": sample - exchange["sample"],
        "exchange": exchange["sample"] + exchange["gather"],
        "gather": gather - sample - exchange["gather"],
        "forward": cumulative["forward"] - gather,
        "backward": cumulative["backward"] - cumulative["forward"],
        "optimizer": whole - cumulative["backward"],
        "host": loop_step_seconds - whole,
    }
