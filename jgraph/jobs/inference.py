"""Distributed layer-wise full-graph inference (DGL's `inference`): every layer
computed for every owned node over its whole in-neighbourhood, window by window
(`jgraph.jobs.windows`), with the same parameters and layer code as sampled training,
scoring the splits of the labelled node type.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jgraph.data.outputs import What
from jgraph.jobs.metrics import class_counts, masked_cross_entropy, scores
from jgraph.jobs.signal import Reach, block_reached, optional_signal, with_prior
from jgraph.jobs.windows import edge_window, full_graph_layers, full_graph_logits, labelled_rows
from jgraph.mesh import REPLICATED, ROWS

__all__ = ["edge_window", "full_graph_logits", "full_graph_program", "full_graph_rows_program",
           "full_graph_scores", "outputs_as", "split_masks"]


def full_graph_program(job, graph, splits, mesh=None):
    """jit(shard_map(...)): the program of `job` (a `NodeClassification`) that scores
    `splits` by full-graph inference on `graph`, `(params, embeddings, data, masks,
    signal=None) -> ({split: {"classes", "loss"}}, ids lost)`, on the job's mesh or on
    `mesh` (to build it for other hardware, see `jgraph.target`); masks: {split: bool
    row-sharded array} of the labelled type's rows (`split_masks`); signal: a
    `jgraph.jobs.signal.Signal`, where the nodes it does not reach score the prior."""
    inputs, exchange, layout = job.inputs, job.exchange, job.labels.layout

    def per_device(params, embeddings, data, masks, signal=None):
        model = nnx.merge(job.graphdef, params)
        graph = data.graph
        logits, lost = full_graph_logits(model, inputs, data.features, embeddings, graph,
                                         exchange)
        target_logits, real = labelled_rows(logits, graph, layout, data.labels,
                                            exchange.axis)
        if signal is not None:
            target_logits = with_prior(target_logits, signal.reached, signal.prior)
        out = {}
        for split, mask in masks.items():
            ok = real & mask & (data.labels >= 0)
            loss, _, _ = masked_cross_entropy(target_logits, data.labels, ok)
            out[split] = {"classes": class_counts(target_logits, data.labels, ok),
                          "loss": loss}
        # lost is already a total over devices (exchange stats are); out is per device.
        return jax.tree.map(lambda x: lax.psum(x, exchange.axis), out), lost

    return optional_signal(
        per_device, mesh or job.mesh,
        (REPLICATED, inputs.embedding_specs(), job.data_specs(graph),
         dict.fromkeys(splits, ROWS)), REPLICATED)


def full_graph_rows_program(job, graph, what: What, layer: int | None, mesh=None):
    """jit(shard_map(...)): `(params, embeddings, data, signal=None) -> (rows, ids
    lost)`, rows [P * n, width] row-sharded: each device's own nodes' output of layer
    `layer` (1 = the first; the last gives the logits) for What.EMBEDDINGS and LOGITS,
    the last layer's softmax for PROBABILITIES, its argmax (int32[P * n]) for
    PREDICTIONS, by layer-wise full-graph inference (evaluation: no dropout). Only the
    layers up to the one read are computed (layer None: every layer, the last read).
    signal: a `jgraph.jobs.signal.Signal` (of a `NodeClassification` job): the
    labelled nodes it does not reach have the prior's logits (LOGITS, PROBABILITIES,
    PREDICTIONS; embeddings are left as they are)."""
    what = What(what)

    def per_device(params, embeddings, data, signal=None):
        model = nnx.merge(job.graphdef, params)
        layers, lost = full_graph_layers(model, job.inputs, data.features, embeddings,
                                         data.graph, job.exchange, depth=layer)
        h = layers[-1]
        if signal is not None:
            h = with_prior(h, block_reached(signal, data.graph, job.labels.layout,
                                            job.exchange.axis), signal.prior)
        return outputs_as(h, what), lost

    return optional_signal(
        per_device, mesh or job.mesh,
        (REPLICATED, job.inputs.embedding_specs(), job.data_specs(graph)),
        (ROWS, REPLICATED), used=what is not What.EMBEDDINGS)


def outputs_as(h: jax.Array, what: What) -> jax.Array:
    """A layer's rows [n, width] as `what` asks: as they are (embeddings, logits), their
    softmax (probabilities) or argmax (predictions, int32[n])."""
    if what is What.PROBABILITIES:
        return jax.nn.softmax(h.astype(jnp.float32), axis=-1)
    if what is What.PREDICTIONS:
        return jnp.argmax(h, axis=-1).astype(jnp.int32)
    return h


def split_masks(run, splits) -> dict:
    """{split: bool row-sharded array}: which rows of the run's labelled type are in
    each split."""
    return {s: run.dg.split_mask(s, run.target).array for s in splits}


class FullGraphEvaluator:
    """Scores of `splits` by full-graph inference over the whole mesh, compiled on the
    first call and reused (the per-epoch validation of full-batch training).
    Called with (params, embeddings): {split: scores (acc, macro_f1, count, loss)}, or
    the scores alone where `splits` is one split's name (as a `SampledEvaluator`)."""

    def __init__(self, run, splits, on_trace=None):
        self.single = splits if isinstance(splits, str) else None
        self.splits = (splits,) if self.single else tuple(splits)
        self.masks = split_masks(run, self.splits)
        self.data = run.job.data(run.dg.graph)
        self.program = full_graph_program(run.job, run.dg.graph, self.splits)
        self.reach = Reach(run)
        self.on_trace = on_trace
        self.compiled = None
        self.compile_seconds = 0.0

    def __call__(self, params, embeddings) -> dict:
        # Nodes no signal reaches score the prior (None: the labelled type has features).
        signal = self.reach(embeddings)
        if self.compiled is None:
            begin = time.perf_counter()
            self.compiled = self.program.lower(params, embeddings, self.data, self.masks,
                                               signal=signal).compile()
            self.compile_seconds = time.perf_counter() - begin
            if self.on_trace is not None:
                self.on_trace()
        out, lost = self.compiled(params, embeddings, self.data, self.masks, signal=signal)
        if int(lost):
            from jgraph.exchange import ExchangeOverflowError
            raise ExchangeOverflowError(f"full-graph inference: {int(lost)} id(s) were lost "
                                        f"by the exchange; leave ExchangeConfig.max_capacity "
                                        f"None")
        result = {}
        for split, got in out.items():
            result[split] = scores(np.asarray(got["classes"]))
            result[split]["loss"] = float(got["loss"]) / max(result[split]["count"], 1)
        return result[self.single] if self.single else result


def full_graph_scores(run, params, embeddings, splits) -> dict:
    """{split: scores (acc, macro_f1, count, loss)} of the target type's nodes in each
    split, from layer-wise full-graph inference over the whole mesh."""
    return FullGraphEvaluator(run, splits)(params, embeddings)
