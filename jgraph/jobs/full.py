"""Full-batch training (`train.mode: full`), SAR's main mode: one step is the loss over
every training node of the whole graph, each layer computed for every owned node over
its whole in-neighbourhood in windows whose source rows come through the exchange, and
the backward pass fetching each window's rows again instead of keeping them
(`jgraph.jobs.windows`). Per-device memory is the partition's own rows of each layer
plus one window, so it falls as devices are added.

`FullBatchClassification` is a `NodeClassification` whose step does that: the same
state, checkpoints, metrics, compile and bench paths as sampled training, one step an
epoch (its loader deals each device all of its training seeds at once, which is where
the step reads them from). Dropout (between layers, in attention) draws per step;
evaluation is full-graph.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jgraph.config import ConfigError
from jgraph.exchange import owned_index
from jgraph.jobs.experiment import Experiment, Inference, Mode
from jgraph.jobs.inference import FullGraphEvaluator
from jgraph.jobs.kind import NodeKind
from jgraph.jobs.metrics import masked_cross_entropy
from jgraph.jobs.run import Run, job_fields, node_parts, seed_loader, with_caches
from jgraph.jobs.step import NodeClassification, Outcome, TrainState, Writes
from jgraph.jobs.table import register
from jgraph.jobs.windows import WINDOW_FLOATS, full_graph_logits, labelled_rows
from jgraph.progress import Progress
from jgraph.sharded import DistGraph


@dataclasses.dataclass(frozen=True, eq=False)
class FullBatchClassification(NodeClassification):
    """remat: the backward pass fetches every window again (False: keeps their rows);
    window_floats: each window's budget (`jgraph.jobs.windows.edge_window`)."""

    remat: bool = True
    window_floats: int = WINDOW_FLOATS


    def train_mask(self, order) -> jax.Array:
        """bool[r]: which of this device's labelled rows are training seeds (all of its
        seeds are its loader's one batch)."""
        seeds, mask = self.loader.batch(order, 0)
        layout = self.labels.layout
        r = layout.rows_per_part
        at = owned_index(seeds, mask, layout.starts, self.exchange.axis, fill=r)
        return jnp.zeros(r, bool).at[at].set(True, mode="drop")

    def training_batch(self, state: TrainState, data, order, index) -> FullBatch:
        return FullBatch(state.embeddings, data, self.train_mask(order))

    def learned_rows(self, state: TrainState, batch: FullBatch) -> dict:
        """Every row of this device's block of each learnable table."""
        return {t: state.embeddings[t].table for t in self.inputs.embeddings}

    def batch_loss(self, params, tables, batch: FullBatch, key=None):
        """(loss sum over this device's training rows, `Outcome` whose out is the ids
        the exchange lost). tables: {ntype: this device's embedding rows}."""
        params, tables = self.computing(params, tables)
        model = nnx.merge(self.graphdef, params)
        states = {t: batch.embeddings[t]._replace(table=tables[t]) for t in tables}
        data = batch.data
        features = data.features
        if self.compute_dtype != jnp.float32:
            features = jax.tree.map(self._compute, features)
        logits, lost = full_graph_logits(model, self.inputs, features, states, data.graph,
                                         self.exchange, self.window_floats, key=key,
                                         remat=self.remat)
        target, real = labelled_rows(logits.astype(jnp.float32), data.graph,
                                     self.labels.layout, data.labels, self.exchange.axis)
        ok = real & batch.train & (data.labels >= 0)
        loss, correct, count = masked_cross_entropy(target, data.labels, ok)
        return loss, Outcome(count, correct, count, lost)

    def fits(self, batch: FullBatch, outcome: Outcome):
        """No exchange lost an id: one out of the graph's range (windows move in as many
        rounds as they need, so none is ever left out for want of room)."""
        return outcome.out == 0

    def writes(self, batch: FullBatch, outcome: Outcome, row_grads: dict, applied) -> Writes:
        """Every row of this device's block of each table, with its own gradient: no
        routing (the rows are this device's own)."""
        me = lax.axis_index(self.exchange.axis)
        routed = {}
        for t, table in self.inputs.embeddings.items():
            layout = table.layout
            rows = jnp.arange(layout.rows_per_part, dtype=jnp.int32)
            owned = jnp.asarray(layout.starts, jnp.int32)[me] + rows
            real = rows < jnp.asarray(layout.counts, jnp.int32)[me]
            routed[t] = (owned, row_grads[t].astype(jnp.float32), real)
        return Writes(routed, (), jnp.ones((), bool))


class FullBatch(NamedTuple):
    """What a full-batch step computes on: the embedding tables' states, the step's
    data and train, bool[r]: which of this device's labelled rows are training seeds.
    stats: none (nothing is sampled; lost ids are the loss's `Outcome`)."""

    embeddings: dict
    data: Any
    train: jax.Array
    stats: tuple = ()


class FullBatchNodes(NodeKind):
    """Full-batch node classification (`train.mode: full`): one step an epoch over every
    training node; validated full-graph each epoch."""

    mode = Mode.FULL
    title = "full-batch node classification"
    samples = False

    def check(self, config: Experiment) -> None:
        """No hot-node cache: each layer's rows are fetched, and no cache holds them."""
        super().check(config)
        if config.exchange.cache > 0:
            raise ConfigError(f"exchange.cache ({config.exchange.cache}) keeps feature "
                              f"rows; train.mode: full fetches each layer's rows, which "
                              f"no cache holds: set exchange.cache=0")

    def bench_fields(self, run: Run, job, state) -> dict:
        """One batch an epoch: nothing is sampled."""
        return {"fanouts": None, "batch_size": None, "capacities": None,
                "worst_case_capacities": None, "seeds_per_epoch": job.loader.num_seeds}

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        t = config.train
        p = node_parts(config, dg)
        # One batch an epoch: every device's training seeds at once.
        most = max(max(part.splits[p.target]["train"] for part in dg.meta.parts), 1)
        job = FullBatchClassification(
            p.graphdef, loader=seed_loader(config, dg, p.target, most, False),
            labels=p.labels, remat=t.rematerialize,
            **job_fields(config, dg.exchange(config.exchange, platform), p.inputs))
        return Run(config, dg, p.target, p.num_classes, with_caches(config, dg, job),
                   p.params, self)

    def validation(self, run: Run, on_trace=None, progress: Progress | None = None):
        """Full-graph, as it trains: the program of the final evaluation (val and test,
        those the graph has), whose test scores ride along each epoch's validation for
        the cost of their masked sums."""
        if not run.has_split("val"):
            return None
        return FullGraphEvaluator(run, [s for s in ("val", "test") if run.has_split(s)],
                                  on_trace)

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        """The validation's `scores` hold every split it scored: the epoch's are val's."""
        return super().epoch_scores(scores["val"])

    def validated_splits(self, scores, evaluator, inference: Inference) -> dict:
        """Full-graph: `evaluate` runs the validation's program, val and test alike."""
        if inference is Inference.FULL and isinstance(evaluator, FullGraphEvaluator):
            return dict(scores)
        return {}


register(FullBatchNodes())
