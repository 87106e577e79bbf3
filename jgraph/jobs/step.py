"""The fused SPMD training step: its template (`Job.train_step`: loss, normalise, gate,
commit), which every kind of job fills in, and node classification on sampled blocks
(`NodeClassification`), the kind the others start from.

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

from jgraph.data.outputs import What
from jgraph.exchange import Exchange
from jgraph.jobs.inference import full_graph_program, outputs_as
from jgraph.jobs.inputs import NodeInputs
from jgraph.jobs.metrics import class_counts, masked_cross_entropy
from jgraph.jobs.signal import optional_signal, seed_reached, with_prior
from jgraph.mesh import REPLICATED, ROWS, replicated, shard_rows
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sharded.graph import ShardedGraph
from jgraph.sharded.tensor import DistTensor


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """params: the model's nnx.Param state (replicated); opt_state: optax state
    (replicated); embeddings: {ntype: EmbeddingState} (row-sharded tables and their
    sparse optimizer state); step: int32 global step (keys the sampler and dropout),
    the number of steps applied; halted: int32, 1 from a step whose sample overflowed
    the sampler's capacities on: that step and every later one leave the state as it
    was, until the host grows the capacities, clears it and runs them again (see
    `NodeClassification.train_step`); extra: the kind's own state, a pytree its job
    class defines and keeps (control variates' histories: per layer above the first,
    the row-sharded table of every node's last input to it; empty otherwise)."""

    params: Any
    opt_state: Any
    embeddings: dict
    step: jax.Array
    halted: jax.Array
    extra: Any = ()


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


class Outcome(NamedTuple):
    """What a kind's loss says of one device's batch besides the loss sum: weight (what
    the loss is a mean over, summed over devices), correct and count (the metrics'),
    out (the kind's own: the logits, the fresh rows of control variates, the ids
    full-batch training lost)."""

    weight: jax.Array
    correct: jax.Array
    count: jax.Array
    out: Any = None


class Writes(NamedTuple):
    """What a step writes besides the dense parameters, routed to the owners:
    embeddings {ntype: (owned ids, gradients, mask)} for the sparse optimizers; stats,
    the routing's exchange statistics (a tuple appended to the batch's); fit, whether
    every write fitted its capacity; rest, the kind's own (control variates' history
    rows)."""

    embeddings: dict
    stats: tuple
    fit: jax.Array
    rest: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class Job:
    """The step's template and what every kind's step closes over (static): the model's
    graph definition, the optimizer, the sampler, loader, exchange and the inputs.
    `seed` keys the sampler, dropout and embedding initialisation. `compute_dtype`:
    what the layers compute in (bfloat16 for mixed precision: parameters, their
    gradients, the optimizer and the loss stay float32). A kind's job class fills in
    the template (`train_step`): its batch (`batch_of`), its loss (`batch_loss`), its
    evaluation (`eval_step`, `full_graph_program`) and what else it changes."""

    graphdef: Any
    tx: optax.GradientTransformation
    sampler: NeighborSampler
    loader: NodeLoader
    exchange: Exchange
    inputs: NodeInputs
    seed: int = 0
    compute_dtype: Any = jnp.float32

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
        """What the step reads: the graph, the inputs' arrays and caches; no labels (a
        kind that has them adds them)."""
        return StepData(graph, self.inputs.arrays(), jnp.zeros((0,), jnp.int32),
                        self.inputs.cache_arrays())

    def data_specs(self, graph: ShardedGraph) -> StepData:
        return StepData(graph.specs(), self.inputs.specs(), REPLICATED,
                        self.inputs.cache_specs())

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

    def evaluating(self, loader: NodeLoader, fanouts) -> Job:
        """This job over the seeds of `loader`, drawing `fanouts`: the job whose
        `compile_eval` evaluates those nodes (a split's, with train.eval_fanouts)."""
        return dataclasses.replace(self, loader=loader, sampler=NeighborSampler(fanouts))

    def eval_specs(self):
        """How `eval_step`'s results lie on the mesh: metrics summed over devices."""
        return REPLICATED

    def compile_eval(self, graph: ShardedGraph, on_trace=None, mesh=None):
        """jit(shard_map(eval_step)): (params, embeddings, data, order, index,
        signal=None) -> batch `index`'s results (`eval_step`, laid out as `eval_specs`
        says); build the job with `evaluating` first. signal: a
        `jgraph.jobs.signal.Signal`, where unreached nodes score the prior. mesh: as
        for `compile_train`."""
        return self._batch_program(graph, self.eval_step, self.eval_specs(), on_trace, mesh)

    def compile_outputs(self, graph: ShardedGraph, what: What, depth: int | None = None,
                        mesh=None):
        """jit(shard_map(outputs_step)): (params, embeddings, data, order, index,
        signal=None) -> batch `index`'s (seeds, outputs, stats) row-sharded (stats
        replicated); build the job with `evaluating` first, its fanouts `depth` hops.
        signal: as for `compile_eval` (it changes logits, probabilities and
        predictions, not embeddings)."""
        def step(params, embeddings, data, order, index, signal=None):
            return self.outputs_step(params, embeddings, data, order, index, what, depth,
                                     signal)
        return self._batch_program(graph, step, (ROWS, ROWS, REPLICATED), None, mesh,
                                   signal_used=what is not What.EMBEDDINGS)

    def _batch_program(self, graph: ShardedGraph, per_device, out_specs, on_trace, mesh,
                       signal_used: bool = True):
        """jit(shard_map(per_device)) of (params, embeddings, data, order, index), and
        of a `Signal` where one is given and used (`jgraph.jobs.signal.optional_signal`)."""
        def step(params, embeddings, data, order, index, *signal):
            if on_trace is not None:
                on_trace()
            return per_device(params, embeddings, data, order, index, *signal)
        return optional_signal(
            step, mesh or self.mesh,
            (REPLICATED, self.inputs.embedding_specs(), self.data_specs(graph), ROWS,
             REPLICATED), out_specs, signal_used)

    def full_graph_program(self, graph: ShardedGraph, masks: dict, mesh=None):
        """The program of layer-wise full-graph inference over every owned node
        (`jgraph.jobs.inference`), scoring the splits of `masks` where the kind does."""
        raise NotImplementedError

    # -- inside the step (per device, under shard_map) --------------------------------

    def batch_loss(self, params, embedding_rows, batch, key=None):
        """(loss sum, `Outcome`) of one device's batch; `embedding_rows` {ntype: rows}
        replace those types' rows of `batch` (they are differentiated)."""
        raise NotImplementedError

    def computing(self, params, rows: dict):
        """(params, rows) in the compute dtype: the one prologue of every kind's loss (the
        casts' gradients bring float32 gradients back to float32 parameters)."""
        if self.compute_dtype == jnp.float32:
            return params, rows
        return (jax.tree.map(self._compute, params),
                {t: r.astype(self.compute_dtype) for t, r in rows.items()})

    def _compute(self, x):
        """x in the compute dtype if it is floating point."""
        return x.astype(self.compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def dropout_key(self, step):
        """Dropout differs per device and per step, from the run's seed."""
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), step),
                                  lax.axis_index(self.exchange.axis))

    def train_step(self, state: TrainState, data: StepData, order, index, stop):
        """Per device (under shard_map): one optimizer step on batch `index` of the
        epoch whose shuffled seeds are `order`. Returns (state, metrics); `stop` is this
        device's block of `stop_votes`.

        The template every kind of job fills in: its batch (`training_batch`), the rows
        it learns (`learned_rows`), its loss (`batch_loss`), whether the batch fitted
        (`fits`), what it writes besides the parameters (`writes`, `written`) and its
        own metrics (`step_metrics`); the loss is normalised, gated and committed here.

        A step is applied only if its batch fitted (a sample within the sampler's
        capacities), its writes fitted the exchange's (a `scatter_add` moves one
        round), and no earlier step halted the state; otherwise the state is returned
        unchanged but for `halted` = 1, and metrics["applied"] is False. The host,
        reading the metrics later (no step waits for it), grows the capacities and runs
        the refused steps again from the first one: the same batches with the same
        random draws, so no id is ever dropped."""
        batch = self.training_batch(state, data, order, index)
        grad_fn = jax.value_and_grad(self.batch_loss, argnums=(0, 1), has_aux=True)
        (loss, outcome), (grads, row_grads) = grad_fn(
            state.params, self.learned_rows(state, batch), batch, self.dropout_key(state.step))
        total = jnp.maximum(lax.psum(outcome.weight, self.exchange.axis), 1
                            ).astype(jnp.float32)
        # params are replicated (not varying over the axis), so shard_map's autodiff
        # already sums their cotangents over devices: no psum here.
        grads = jax.tree.map(lambda g: g / total, grads)
        applied = (state.halted == 0) & self.fits(batch, outcome)
        # Every write reaches its owner first: if one did not fit the exchange's
        # capacity, the step is refused and nothing moves.
        writes = self.writes(batch, outcome, {t: g / total for t, g in row_grads.items()},
                             applied)
        applied = applied & writes.fit
        state, metrics = self.commit(state, grads, writes.embeddings, applied, stop, loss,
                                     outcome.correct, outcome.count, total,
                                     (*batch.stats, *writes.stats))
        return self.written(state, data, writes, applied), {**metrics,
                                                             **self.step_metrics(batch)}

    # The template's parts that every kind shares unless it says otherwise.

    def training_batch(self, state: TrainState, data: StepData, order, index) -> Batch:
        """The batch a training step computes on: batch `index` of the epoch whose seeds
        are `order`, sampled and fetched with the draws of the state's step."""
        return self.batch_of(data, state.embeddings, order, index, state.step)

    def batch_of(self, data: StepData, embeddings, order, index, step):
        """Training batch `index` of the epoch whose seeds are `order`, sampled and
        fetched with the draws of `step`: what a training step computes on (and what
        `measure_exchange` measures)."""
        raise NotImplementedError

    def learned_rows(self, state: TrainState, batch: Batch) -> dict:
        """{ntype: rows} the loss is differentiated by besides the parameters: the
        learnable embeddings' rows the batch fetched."""
        return {t: batch.rows[t] for t in self.inputs.embeddings}

    def fits(self, batch: Batch, outcome: Outcome):
        """Whether the batch fitted: its sample within the sampler's capacities (the
        overflow is summed over devices, so every device agrees)."""
        return batch.stats[0].overflow == 0

    def writes(self, batch: Batch, outcome: Outcome, row_grads: dict, applied) -> Writes:
        """The embedding rows' gradients (`row_grads`, already normalised) sent to their
        owners, for the rows valid where `applied`."""
        routed, stats = self.route_embedding_gradients(batch, row_grads, applied)
        fit = jnp.ones((), bool)
        for st in stats:
            fit = fit & (st.overflow == 0)
        return Writes(routed, (tuple(stats),), fit)

    def written(self, state: TrainState, data: StepData, writes: Writes, applied
                ) -> TrainState:
        """The committed state with the kind's own writes made (none here)."""
        return state

    def step_metrics(self, batch: Batch) -> dict:
        """The kind's own metrics of a step, beside the template's (none here)."""
        return {}

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

    def eval_step(self, params, embeddings, data: StepData, order, index, signal=None):
        """Per device: batch `index`'s evaluation results (laid out as `eval_specs`
        says), without dropout; build the job with `evaluating` first. signal: a
        `jgraph.jobs.signal.Signal` (the seeds it does not reach score the prior), or
        None."""
        raise NotImplementedError

    def outputs_step(self, params, embeddings, data: StepData, order, index,
                     what: What = What.LOGITS, depth: int | None = None, signal=None):
        """Per device: (seeds int32[B], their outputs, stats) of batch `index` of the
        job's loader, without dropout: the rows of layer `depth` (counted from 1; None:
        the last) over the blocks its sampler draws, which must be `depth` hops (build
        the job with `evaluating` over a `NodeLoader` of the nodes), or their softmax or
        argmax as `what` says (`jgraph.jobs.inference.outputs_as`). signal: a
        `jgraph.jobs.signal.Signal`: the labelled seeds it does not reach have the
        prior's logits (what: logits, probabilities, predictions)."""
        seeds, mask = self.loader.batch(order, index)
        sample = self.sampler.sample(data.graph, self.exchange, seeds, mask, seed=self.seed,
                                     step=jnp.int32(0), local_seeds=True)
        rows, valid, input_stats = self.inputs.fetch(
            self.exchange, data.features, embeddings, sample.input_nodes, caches=data.caches)
        params, rows = self.computing(params, rows)
        model = nnx.merge(self.graphdef, params)
        if depth is not None and len(sample.blocks) != depth:
            raise ValueError(f"{len(sample.blocks)} blocks for the rows of layer {depth}")
        h = model.encoder(rows, valid)
        for i, hood in enumerate(sample.blocks):
            h = model.gnn.layer(i, h, hood)
        h = h.astype(jnp.float32)
        if signal is not None:
            h = with_prior(h, seed_reached(signal, sample.seeds, self.labels.layout,
                                           self.exchange.axis), signal.prior)
        return sample.seeds, outputs_as(h, what), (sample.stats, input_stats)


@dataclasses.dataclass(frozen=True, eq=False)
class NodeClassification(Job):
    """Node classification on sampled blocks: the `Job` with the label tensor of the
    labelled node type; its loss is the masked cross-entropy of the real seeds, its
    evaluation accuracy and per-class counts."""

    labels: DistTensor = dataclasses.field(kw_only=True)

    def data(self, graph: ShardedGraph) -> StepData:
        return super().data(graph)._replace(labels=self.labels.array)

    def data_specs(self, graph: ShardedGraph) -> StepData:
        return super().data_specs(graph)._replace(labels=ROWS)

    def full_graph_program(self, graph: ShardedGraph, masks: dict, mesh=None):
        """The program that scores the splits of `masks` ({split: bool row-sharded
        array}) by layer-wise full-graph inference (`jgraph.jobs.inference`)."""
        return full_graph_program(self, graph, tuple(masks), mesh)

    # -- inside the step (per device, under shard_map) --------------------------------

    def batch_of(self, data: StepData, embeddings, order, index, step) -> Batch:
        seeds, mask = self.loader.batch(order, index)
        return self.fetch(data, embeddings, seeds, mask, step)

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
        """(loss sum, `Outcome`: weight and count the real seeds, out the logits) of one
        device's batch; `embedding_rows` {ntype: rows} replace those types' rows of
        `batch` (they are differentiated)."""
        params, rows = self.computing(params, {**batch.rows, **embedding_rows})
        model = nnx.merge(self.graphdef, params)
        logits = model(rows, batch.valid, batch.blocks, key).astype(jnp.float32)
        loss, correct, count = masked_cross_entropy(logits, batch.labels, batch.label_mask)
        return loss, Outcome(count, correct, count, logits)

    def eval_step(self, params, embeddings, data: StepData, order, index, signal=None):
        """Per device: {"loss": sum, "correct", "count", "classes": int32[3, C]} of
        batch `index`, summed over devices, without dropout. Build the job with
        `evaluating` (the evaluation split's loader and fanouts) to evaluate a split.
        signal: a `jgraph.jobs.signal.Signal`: the seeds it does not reach score the
        class prior."""
        axis = self.exchange.axis
        seeds, mask = self.loader.batch(order, index)
        batch = self.fetch(data, embeddings, seeds, mask, jnp.int32(0))
        loss, outcome = self.batch_loss(params, {}, batch)
        logits = outcome.out
        if signal is not None:
            logits = with_prior(logits, seed_reached(signal, batch.blocks[-1].dst,
                                                     self.labels.layout, axis),
                                signal.prior)
            loss, correct, _ = masked_cross_entropy(logits, batch.labels, batch.label_mask)
            outcome = outcome._replace(correct=correct)
        out = {"loss": loss, "correct": outcome.correct, "count": outcome.count,
               "classes": class_counts(logits, batch.labels, batch.label_mask)}
        return jax.tree.map(lambda x: lax.psum(x, axis), out)


@functools.cache
def _stop_votes(mesh, vote: int) -> jax.Array:
    return shard_rows(mesh, 1, (), np.int32, lambda k: np.array([vote]))
