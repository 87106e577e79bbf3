"""Full-batch training (`train.mode: full`), SAR's main mode: one step is the loss over
every training node of the whole graph, each layer computed for every owned node over
its whole in-neighbourhood in windows whose source rows come through the exchange, and
the backward pass fetching each window's rows again instead of keeping them
(`jgraph.train.windows`). Per-device memory is the partition's own rows of each layer
plus one window, so it falls as devices are added.

`FullBatchClassification` is a `NodeClassification` whose step does that: the same
state, checkpoints, metrics, compile and bench paths as sampled training, one step an
epoch (its loader deals each device all of its training seeds at once, which is where
the step reads them from). Dropout (between layers, in attention) draws per step;
evaluation is full-graph.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jgraph.train.step import NodeClassification, TrainState, masked_cross_entropy
from jgraph.train.windows import WINDOW_FLOATS, full_graph_logits, labelled_rows


@dataclasses.dataclass(frozen=True, eq=False)
class FullBatchClassification(NodeClassification):
    """remat: the backward pass fetches every window again (False: keeps their rows);
    window_floats: each window's budget (`jgraph.train.windows.edge_window`)."""

    remat: bool = True
    window_floats: int = WINDOW_FLOATS

    samples = False
    """Its step samples nothing: no sampler capacities or exchange to calibrate."""

    def train_mask(self, order) -> jax.Array:
        """bool[r]: which of this device's labelled rows are training seeds (all of its
        seeds are its loader's one batch)."""
        seeds, mask = self.loader.batch(order, 0)
        layout = self.labels.layout
        r = layout.rows_per_part
        at = jnp.where(mask, layout.local_row(seeds, lax.axis_index(self.exchange.axis)), r)
        return jnp.zeros(r, bool).at[at].set(True, mode="drop")

    def full_loss(self, params, tables, embeddings, data, train, key=None):
        """(loss sum over this device's training rows, (correct, count, ids lost)).
        tables: {ntype: this device's embedding rows} (differentiated)."""
        if self.compute_dtype != jnp.float32:
            params = jax.tree.map(self._compute, params)
            tables = {t: x.astype(self.compute_dtype) for t, x in tables.items()}
        model = nnx.merge(self.graphdef, params)
        states = {t: embeddings[t]._replace(table=tables[t]) for t in tables}
        features = data.features
        if self.compute_dtype != jnp.float32:
            features = jax.tree.map(self._compute, features)
        logits, lost = full_graph_logits(model, self.inputs, features, states, data.graph,
                                         self.exchange, self.window_floats, key=key,
                                         remat=self.remat)
        target, real = labelled_rows(logits.astype(jnp.float32), data.graph,
                                     self.labels.layout, data.labels, self.exchange.axis)
        ok = real & train & (data.labels >= 0)
        loss, correct, count = masked_cross_entropy(target, data.labels, ok)
        return loss, (correct, count, lost)

    def train_step(self, state: TrainState, data, order, index, stop):
        """Per device: one optimizer step on the loss over every training node. The
        state is left as it is (halted) if an exchange lost an id: one out of the
        graph's range (windows move in as many rounds as they need, so none is ever
        left out for want of room)."""
        axis = self.exchange.axis
        tables = {t: state.embeddings[t].table for t in self.inputs.embeddings}
        grad_fn = jax.value_and_grad(self.full_loss, argnums=(0, 1), has_aux=True)
        (loss, (correct, count, lost)), (grads, table_grads) = grad_fn(
            state.params, tables, state.embeddings, data, self.train_mask(order),
            self.dropout_key(state.step))
        total = jnp.maximum(lax.psum(count, axis), 1).astype(jnp.float32)
        grads = jax.tree.map(lambda g: g / total, grads)
        applied = (state.halted == 0) & (lost == 0)
        me = lax.axis_index(axis)
        routed = {}
        for t, table in self.inputs.embeddings.items():
            # Every row of this device's block, each with its own gradient.
            layout = table.layout
            rows = jnp.arange(layout.rows_per_part, dtype=jnp.int32)
            owned = jnp.asarray(layout.starts, jnp.int32)[me] + rows
            real = rows < jnp.asarray(layout.counts, jnp.int32)[me]
            routed[t] = (owned, table_grads[t].astype(jnp.float32) / total, real)
        return self.commit(state, grads, routed, applied, stop, loss, correct, count, total,
                           ())
