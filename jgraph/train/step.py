"""The fused SPMD training step for node classification on sampled blocks.

Per device, inside one `shard_map` program: take this step's seeds from the loader,
sample their blocks, fetch the input features through the exchange, run the model,
and take the masked cross-entropy of the real seeds. The loss is the mean over every
device's real seeds, so each device differentiates its *sum* and the gradients are
summed over devices and divided by the global seed count: the result equals one device computing
the same blocks together (and padded seeds never reach it). Dense parameters stay
replicated, so shard_map's autodiff psums their gradients itself; optax updates them
identically everywhere.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from jgraph.dist.exchange import Exchange
from jgraph.dist.mesh import replicated
from jgraph.dist.tensor import DistTensor
from jgraph.sampling import NeighborSampler, NodeLoader


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
    """params: the model's nnx.Param state (replicated); opt_state: optax state;
    step: int32 global step (keys the sampler and dropout)."""

    params: Any
    opt_state: Any
    step: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class NodeClassification:
    """What the step closes over (static): the model's graph definition, the optimizer,
    the sampler, loader, exchange, and the feature and label tensors. `seed` keys the
    sampler and dropout."""

    graphdef: Any
    tx: optax.GradientTransformation
    sampler: NeighborSampler
    loader: NodeLoader
    exchange: Exchange
    feat: DistTensor
    labels: DistTensor
    seed: int = 0

    def init(self, params) -> TrainState:
        """The first state, replicated on the mesh (as every later state is, so the
        step does not compile again for a different input placement)."""
        state = TrainState(params, self.tx.init(params), jnp.zeros((), jnp.int32))
        return jax.device_put(state, replicated(self.loader.mesh))

    def batch_loss(self, params, graph, feat_shard, label_shard, seeds, mask, step, train):
        """(loss sum, (correct, count, exchange/sample stats)) of one device's batch."""
        sample = self.sampler.sample(graph, self.exchange, seeds, mask, seed=self.seed,
                                     step=step)
        src = sample.input_nodes
        x, feat_stats = self.feat.lookup(self.exchange, feat_shard, src, src >= 0,
                                         distinct=True)
        dst = sample.seeds
        y, label_stats = self.labels.lookup(self.exchange, label_shard, dst, dst >= 0,
                                            distinct=True)
        model = nnx.merge(self.graphdef, params)
        key = None
        if train:   # dropout differs per device and per step, from the run's seed
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), step),
                                     lax.axis_index(self.exchange.axis))
        logits = model(x.astype(jnp.float32), [(b.nbr, b.mask) for b in sample.blocks], key)
        loss, correct, count = masked_cross_entropy(logits, y, (dst >= 0) & (y >= 0))
        return loss, (correct, count, (sample.stats, feat_stats, label_stats))

    def train_step(self, state: TrainState, graph, feat_shard, label_shard, order, index):
        """Per device (under shard_map): one optimizer step on batch `index` of the
        epoch whose shuffled seeds are `order`. Returns (state, metrics)."""
        axis = self.exchange.axis
        seeds, mask = self.loader.batch(order, index)
        grad_fn = jax.value_and_grad(self.batch_loss, has_aux=True)
        (loss, (correct, count, stats)), grads = grad_fn(
            state.params, graph, feat_shard, label_shard, seeds, mask, state.step, True)
        total = jnp.maximum(lax.psum(count, axis), 1).astype(jnp.float32)
        # params are replicated (not varying over the axis), so shard_map's autodiff
        # already sums their cotangents over devices: no psum here.
        grads = jax.tree.map(lambda g: g / total, grads)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": lax.psum(loss, axis) / total,
                   "correct": lax.psum(correct, axis), "count": lax.psum(count, axis),
                   "stats": stats}
        return TrainState(params, opt_state, state.step + 1), metrics

    def eval_step(self, params, graph, feat_shard, label_shard, order, index):
        """Per device: (loss sum, correct, count) of batch `index`, summed over devices,
        without dropout. Build the job with the evaluation split's loader and the
        evaluation sampler (`dataclasses.replace`) to evaluate a split."""
        axis = self.exchange.axis
        seeds, mask = self.loader.batch(order, index)
        loss, (correct, count, _) = self.batch_loss(params, graph, feat_shard, label_shard,
                                                    seeds, mask, jnp.int32(0), False)
        return lax.psum(loss, axis), lax.psum(correct, axis), lax.psum(count, axis)
