"""Distributed layer-wise full-graph inference (DGL's `inference`): every layer
computed for every owned node over its whole in-neighbourhood, window by window
(`jgraph.train.windows`), with the same parameters and layer code as sampled training,
scoring the splits of the labelled node type.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax import lax

from jgraph.mesh import REPLICATED, ROWS
from jgraph.train.report import scores
from jgraph.train.step import class_counts, masked_cross_entropy
from jgraph.train.windows import edge_window, full_graph_logits, labelled_rows

__all__ = ["edge_window", "full_graph_logits", "full_graph_program", "full_graph_scores",
           "split_masks"]


def full_graph_program(job, graph, splits, mesh=None):
    """jit(shard_map(...)): the program of `job` (a `NodeClassification`) that scores
    `splits` by full-graph inference on `graph`, `(params, embeddings, data, masks) ->
    ({split: {"classes", "loss"}}, ids lost)`, on the job's mesh or on `mesh` (to build
    it for other hardware, see `jgraph.target`); masks: {split: bool row-sharded array}
    of the labelled type's rows (`split_masks`)."""
    inputs, exchange, layout = job.inputs, job.exchange, job.labels.layout

    def per_device(params, embeddings, data, masks):
        model = nnx.merge(job.graphdef, params)
        graph = data.graph
        logits, lost = full_graph_logits(model, inputs, data.features, embeddings, graph,
                                         exchange)
        target_logits, real = labelled_rows(logits, graph, layout, data.labels,
                                            exchange.axis)
        out = {}
        for split, mask in masks.items():
            ok = real & mask & (data.labels >= 0)
            loss, _, _ = masked_cross_entropy(target_logits, data.labels, ok)
            out[split] = {"classes": class_counts(target_logits, data.labels, ok),
                          "loss": loss}
        # lost is already a total over devices (exchange stats are); out is per device.
        return jax.tree.map(lambda x: lax.psum(x, exchange.axis), out), lost

    return jax.jit(jax.shard_map(
        per_device, mesh=mesh or job.mesh,
        in_specs=(REPLICATED, inputs.embedding_specs(), job.data_specs(graph),
                  dict.fromkeys(splits, ROWS)),
        out_specs=REPLICATED))


def split_masks(run, splits) -> dict:
    """{split: bool row-sharded array}: which rows of the run's labelled type are in
    each split."""
    return {s: run.dg.split_mask(s, run.target).array for s in splits}


def full_graph_scores(run, params, embeddings, splits) -> dict:
    """{split: scores (acc, macro_f1, count, loss)} of the target type's nodes in each
    split, from layer-wise full-graph inference over the whole mesh."""
    program = full_graph_program(run.job, run.dg.graph, splits)
    out, lost = program(params, embeddings, run.job.data(run.dg.graph),
                        split_masks(run, splits))
    if int(lost):
        from jgraph.exchange import ExchangeOverflowError
        raise ExchangeOverflowError(f"full-graph inference: {int(lost)} id(s) were lost by "
                                    f"the exchange; leave ExchangeConfig.max_capacity None")
    result = {}
    for split, got in out.items():
        result[split] = scores(np.asarray(got["classes"]))
        result[split]["loss"] = float(got["loss"]) / max(result[split]["count"], 1)
    return result
