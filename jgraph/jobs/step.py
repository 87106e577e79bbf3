"""The fused SPMD training step for node classification on sampled blocks.

Per device, inside one `shard_map` program: take this step's seeds from the loader,
sample their blocks, fetch the input rows (features, and embedding rows for
featureless types) and the labels through the exchange, run the model, and take the
masked cross-entropy of the real seeds. The loss is the mean over every device's real
seeds, so each device differentiates its *sum* and the gradients are divided by the
global seed count: the result equals one device computing the same blocks together
(and padded seeds never reach it). Dense parameters stay replicated, so shard_map's
autodiff sums their gradients over devices itself; optax updates them identically
everywhere. The gradients of the embedding rows a device fetched go back to the rows'
owners (`DistEmbedding.apply_gradients`), where a sparse optimizer updates only those
rows.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from jgraph.exchange import Exchange
from jgraph.mesh import REPLICATED, ROWS, replicated, shard_rows
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sharded.graph import ShardedGraph
from jgraph.sharded.tensor import DistTensor
from jgraph.train.inputs import NodeInputs


def class_counts(logits, labels, mask):
    """int32[3, C] over the rows where mask is True: per class, how many rows are of it
    (true), predicted as it (predicted), and both (correct). What accuracy and macro-F1
    need, in memory linear in the class count (a confusion matrix is C x C)."""
    num_classes = logits.shape[-1]
    pred = jnp.argmax(logits, axis=-1)
    true = jnp.where(mask, labels, 0).astype(jnp.int32)
    weight = mask.astype(jnp.int32)
    counts = jnp.zeros((3, num_classes), jnp.int32)
    counts = counts.at[0, true].add(weight).at[1, pred].add(weight)
    return counts.at[2, true].add(weight * (pred == true))


def masked_cross_entropy(logits, labels, mask):
    """(sum of losses, correct predictions, count) over the rows where mask is True."""
    labels = jnp.where(mask, labels, 0).astype(jnp.int32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels) & mask
    return (jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(correct, dtype=jnp.int32),
            jnp.sum(mask, dtype=jnp.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """params: the model's nnx.Param state (replicated); opt_state: optax state
    (replicated); embeddings: {ntype: EmbeddingState} (row-sharded tables and their
    sparse optimizer state); step: int32 global step (keys the sampler and dropout),
    the number of steps applied; halted: int32, 1 from a step whose sample overflowed
    the sampler's capacities on: that step and every later one leave the state as it
    was, until the host grows the capacities, clears it and runs them again (see
    `NodeClassification.train_step`); histories: per layer above the first, the
    row-sharded table of every node's last input to it (control-variate sampling,
    `jgraph.train.control_variate`; empty otherwise)."""

    params: Any
    opt_state: Any
    embeddings: dict
    step: jax.Array
    halted: jax.Array
    histories: tuple = ()


class StepData(NamedTuple):
    """The arrays a step reads and never changes: graph (`ShardedGraph`), features
    {ntype: row-sharded array}, labels (row-sharded, of the target type), caches
    {ntype: (ids, rows)} (replicated hot-node feature rows)."""

    graph: ShardedGraph
    features: dict
    labels: jax.Array
    caches: dict = {}      # noqa: RUF012 (a pytree node; never mutated)


class Batch(NamedTuple):
    """One device's sampled batch, ready for the model: blocks, input rows per type,
    their validity, the seed labels and the exchange/sampling statistics."""

    blocks: tuple
    rows: dict
    valid: dict
    labels: jax.Array
    label_mask: jax.Array
    stats: Any


@dataclasses.dataclass(frozen=True, eq=False)
class NodeClassification:
    """What the step closes over (static): the model's graph definition, the optimizer,
    the sampler, loader, exchange, the inputs and the label tensor. `seed` keys the
    sampler, dropout and embedding initialisation. `compute_dtype`: what the layers
    compute in (bfloat16 for mixed precision: parameters, their gradients, the
    optimizer and the loss stay float32)."""

    graphdef: Any
    tx: optax.GradientTransformation
    sampler: NeighborSampler
    loader: NodeLoader
    exchange: Exchange
    inputs: NodeInputs
    labels: DistTensor
    seed: int = 0
    compute_dtype: Any = jnp.float32

    samples = True
    """Its step samples blocks (full-batch training's does not): the run calibrates the
    sampler's capacities and the exchange's from its first batches."""

    # -- host side ---------------------------------------------------------------------

    @property
    def mesh(self):
        return self.loader.mesh

    @property
    def seeds_per_step(self) -> int:
        """Seeds one device's batch expands (the sampler's blocks are sized for it)."""
        return self.loader.batch_size

    def batch_seeds(self, order, index):
        """In the step: (seeds, mask, local) of batch `index` (see
        `jgraph.sampling.capacity.sample_first_batches`)."""
        return (*self.loader.batch(order, index), True)

    def init(self, params) -> TrainState:
        """The first state: params and optimizer state replicated on the mesh (as every
        later state is, so the step does not compile again for another placement),
        embedding tables drawn on their devices."""
        embeddings = self.inputs.init_embeddings(self.mesh, jax.random.key(self.seed))
        # The step donates the state, so it must not share buffers with the caller's
        # params (device_put may reuse a buffer as one of the replicas).
        params = jax.tree.map(jnp.copy, params)
        # Two zeros, not one twice: the step donates each buffer once.
        dense = jax.device_put((params, self.tx.init(params), jnp.zeros((), jnp.int32),
                                jnp.zeros((), jnp.int32)), replicated(self.mesh))
        return TrainState(dense[0], dense[1], embeddings, dense[2], dense[3])

    def data(self, graph: ShardedGraph) -> StepData:
        return StepData(graph, self.inputs.arrays(), self.labels.array,
                        self.inputs.cache_arrays())

    def data_specs(self, graph: ShardedGraph) -> StepData:
        return StepData(graph.specs(), self.inputs.specs(), ROWS, self.inputs.cache_specs())

    def state_specs(self) -> TrainState:
        return TrainState(REPLICATED, REPLICATED, self.inputs.embedding_specs(), REPLICATED,
                          REPLICATED)

    def compile_train(self, graph: ShardedGraph, on_trace=None, mesh=None):
        """jit(shard_map(train_step)): (state, data, order, index, stop) -> (state,
        metrics); the state is donated. `stop` is `stop_votes(...)`; metrics["stop"]
        is the largest vote (a signal number), 0 when no process asked to stop.
        on_trace: called each time the step is traced (compile counting). mesh: where
        it runs, the job's own by default (another one, e.g. of GPU devices described
        by `jgraph.target`, to build the program for other hardware)."""
        def step(state, data, order, index, stop):
            if on_trace is not None:
                on_trace()
            return self.train_step(state, data, order, index, stop)
        sharded = jax.shard_map(
            step, mesh=mesh or self.mesh,
            in_specs=(self.state_specs(), self.data_specs(graph), ROWS, REPLICATED, ROWS),
            out_specs=(self.state_specs(), REPLICATED))
        return jax.jit(sharded, donate_argnums=0)

    def stop_votes(self, signum: int = 0) -> jax.Array:
        """int32[P] row-sharded, this process's vote on its devices: the number of the
        signal that asks the run to stop, or 0.

        A signal reaches the processes of a job at different steps (or only one of
        them); voting through the step's own collectives makes every process see the
        same step's result, so they all stop (and checkpoint) after the same step."""
        return _stop_votes(self.mesh, int(signum))

    def evaluating(self, loader: NodeLoader, fanouts) -> NodeClassification:
        """This job over the seeds of `loader`, drawing `fanouts`: the job whose
        `compile_eval` evaluates those nodes (a split's, with train.eval_fanouts)."""
        return dataclasses.replace(self, loader=loader, sampler=NeighborSampler(fanouts))

    def eval_specs(self):
        """How `eval_step`'s results lie on the mesh: metrics summed over devices."""
        return REPLICATED

    def compile_eval(self, graph: ShardedGraph, on_trace=None, mesh=None):
        """jit(shard_map(eval_step)): (params, embeddings, data, order, index) ->
        batch `index`'s results (`eval_step`, laid out as `eval_specs` says); build
        the job with `evaluating` first. mesh: as for `compile_train`."""
        def step(params, embeddings, data, order, index):
            if on_trace is not None:
                on_trace()
            return self.eval_step(params, embeddings, data, order, index)
        return jax.jit(jax.shard_map(
            step, mesh=mesh or self.mesh,
            in_specs=(REPLICATED, self.inputs.embedding_specs(), self.data_specs(graph), ROWS,
                      REPLICATED),
            out_specs=self.eval_specs()))

    # -- inside the step (per device, under shard_map) --------------------------------

    def fetch(self, data: StepData, embeddings, seeds, mask, step) -> Batch:
        """Sample the blocks of this device's seeds and fetch what the model reads."""
        # A loader deals each device its own seeds: their first hop and their labels
        # are read here, without the exchange.
        sample = self.sampler.sample(data.graph, self.exchange, seeds, mask, seed=self.seed,
                                     step=step, local_seeds=True)
        rows, valid, input_stats = self.inputs.fetch(self.exchange, data.features, embeddings,
                                                     sample.input_nodes, caches=data.caches)
        dst = sample.seeds
        y, label_stats = self.labels.lookup(self.exchange, data.labels, dst, dst >= 0,
                                            local=True)
        return Batch(sample.blocks, rows, valid, y, (dst >= 0) & (y >= 0),
                     (sample.stats, input_stats, label_stats))

    def batch_loss(self, params, embedding_rows, batch: Batch, key=None):
        """(loss sum, (correct, count)) of one device's batch; `embedding_rows`
        {ntype: rows} replace those types' rows of `batch` (they are differentiated)."""
        rows = {**batch.rows, **embedding_rows}
        if self.compute_dtype != jnp.float32:
            params = jax.tree.map(self._compute, params)
            rows = {t: r.astype(self.compute_dtype) for t, r in rows.items()}
        model = nnx.merge(self.graphdef, params)
        logits = model(rows, batch.valid, batch.blocks, key).astype(jnp.float32)
        loss, correct, count = masked_cross_entropy(logits, batch.labels, batch.label_mask)
        return loss, (correct, count, logits)

    def _compute(self, x):
        """x in the compute dtype if it is floating point (the cast's gradient brings
        float32 gradients back to float32 parameters)."""
        return x.astype(self.compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def dropout_key(self, step):
        """Dropout differs per device and per step, from the run's seed."""
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), step),
                                  lax.axis_index(self.exchange.axis))

    def train_step(self, state: TrainState, data: StepData, order, index, stop):
        """Per device (under shard_map): one optimizer step on batch `index` of the
        epoch whose shuffled seeds are `order`. Returns (state, metrics); `stop` is this
        device's block of `stop_votes`.

        A step is applied only if its sample fit the sampler's capacities, its
        embedding gradients fit the exchange's (a `scatter_add` moves one round), and
        no earlier step halted the state; otherwise the state is returned unchanged
        but for `halted` = 1, and metrics["applied"] is False. The host, reading the
        metrics later (no step waits for it), grows the capacities and runs the
        refused steps again from the first one: the same batches with the same
        random draws, so no id is ever dropped."""
        batch = self.batch_of(data, state.embeddings, order, index, state.step)
        (loss, (correct, count, _)), grads = self.gradients(state, batch)
        return self.apply(state, batch, grads, count, stop, loss, correct, count)

    def batch_of(self, data: StepData, embeddings, order, index, step) -> Batch:
        """Training batch `index` of the epoch whose seeds are `order`, sampled and
        fetched with the draws of `step`: what a training step computes on (and what
        `measure_exchange` measures)."""
        seeds, mask = self.loader.batch(order, index)
        return self.fetch(data, embeddings, seeds, mask, step)

    def gradients(self, state: TrainState, batch):
        """(batch_loss's value and aux, (gradients of the dense parameters, of the
        batch's embedding rows)) of one device's batch, with this step's dropout."""
        emb_rows = {t: batch.rows[t] for t in self.inputs.embeddings}
        grad_fn = jax.value_and_grad(self.batch_loss, argnums=(0, 1), has_aux=True)
        return grad_fn(state.params, emb_rows, batch, self.dropout_key(state.step))

    def apply(self, state: TrainState, batch, gradients, weight, stop, loss, correct, count):
        """The update half of a training step, on one device's `batch` (whose blocks,
        input rows' validity and stats it reads) and its `gradients` (`gradients`):
        divided by the global sum of `weight` (what the loss is a mean over), applied
        unless the sample overflowed or an earlier step halted the state. Returns
        (state, metrics) with the loss sum, correct and count summed over devices."""
        axis = self.exchange.axis
        grads, emb_grads = gradients
        total = jnp.maximum(lax.psum(weight, axis), 1).astype(jnp.float32)
        # params are replicated (not varying over the axis), so shard_map's autodiff
        # already sums their cotangents over devices: no psum here.
        grads = jax.tree.map(lambda g: g / total, grads)
        # The sample's overflow is summed over devices: every device agrees.
        applied = (state.halted == 0) & (batch.stats[0].overflow == 0)
        # Embedding gradients travel to their rows' owners first: if any did not fit
        # the exchange's capacity (a scatter_add moves one round), the step is refused
        # and no table moves.
        routed, emb_stats = self.route_embedding_gradients(
            batch, {t: g / total for t, g in emb_grads.items()}, applied)
        for st in emb_stats:
            applied = applied & (st.overflow == 0)
        return self.commit(state, grads, routed, applied, stop, loss, correct, count, total,
                           (*batch.stats, tuple(emb_stats)))

    def route_embedding_gradients(self, batch, emb_grads, when=True):
        """({ntype: (owned ids, summed gradients, mask)}, [stats]): each learnable
        table's gradients (`emb_grads[ntype]`: [n0, dim], one per input row of
        `batch`) sent to their rows' owners (`scatter_add`), those of rows valid where
        `when` holds. None given: zeros, for the stats alone (what calibration
        measures of these scatters)."""
        routed, stats = {}, []
        for t, table in self.inputs.embeddings.items():
            src = batch.blocks[0].src
            grads = (jnp.zeros((src.shape[0], table.dim), jnp.float32) if emb_grads is None
                     else emb_grads[t])
            routed[t], st = table.route_gradients(self.exchange, src, batch.valid[t] & when,
                                                  grads)
            stats.append(st)
        return routed, stats

    def commit(self, state: TrainState, grads, routed, applied, stop, loss, correct, count,
               total, stats):
        """The step's new state and metrics: the dense `grads` (already divided by
        `total`, what the loss is a mean over) applied by the optimizer and the
        embedding rows `routed` ({ntype: (owned ids, gradients, mask)}) by their sparse
        optimizer, where `applied` (else the state is kept, halted); loss, correct and
        count summed over devices, `stats` as they are."""
        axis = self.exchange.axis
        embeddings = {**state.embeddings, **{
            t: table.update_rows(self.exchange, state.embeddings[t], routed[t], applied)
            for t, table in self.inputs.embeddings.items()}}
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        keep = lambda new, old: jax.tree.map(
            lambda a, b: jnp.where(applied, a, b), new, old)
        params = keep(optax.apply_updates(state.params, updates), state.params)
        opt_state = keep(opt_state, state.opt_state)
        metrics = {"loss": lax.psum(loss, axis) / total,
                   "correct": lax.psum(correct, axis), "count": lax.psum(count, axis),
                   "stats": stats, "stop": lax.pmax(stop[0], axis), "applied": applied}
        return dataclasses.replace(state, params=params, opt_state=opt_state,
                                   embeddings=embeddings, step=state.step + applied,
                                   halted=(~applied).astype(jnp.int32)), metrics

    def eval_step(self, params, embeddings, data: StepData, order, index):
        """Per device: {"loss": sum, "correct", "count", "classes": int32[3, C]} of
        batch `index`, summed over devices, without dropout. Build the job with
        `evaluating` (the evaluation split's loader and fanouts) to evaluate a split."""
        axis = self.exchange.axis
        seeds, mask = self.loader.batch(order, index)
        batch = self.fetch(data, embeddings, seeds, mask, jnp.int32(0))
        loss, (correct, count, logits) = self.batch_loss(params, {}, batch)
        out = {"loss": loss, "correct": correct, "count": count,
               "classes": class_counts(logits, batch.labels, batch.label_mask)}
        return jax.tree.map(lambda x: lax.psum(x, axis), out)


@functools.cache
def _stop_votes(mesh, vote: int) -> jax.Array:
    return shard_rows(mesh, 1, (), np.int32, lambda k: np.array([vote]))
