"""Distributed layer-wise full-graph inference (DGL's `inference`, SAR's full-batch
mode): every layer computed for every owned node over its whole in-neighbourhood.

Layer by layer, each device first turns its own nodes' rows into messages
(`conv.message`, e.g. GraphSAGE's projection, so narrow rows travel), then walks its
partition's in-edges in fixed windows of `edge_window` edges: the window's source rows
come through the exchange, `conv.reduce` makes each edge a partial aggregate (a
one-slot neighbourhood), and the partials are merged into their destination node's
accumulator with the same rule `conv.merge` uses (sum, or max for "max"). After the
last window, `conv.update` and the between-layer steps run for all owned nodes at once.
Memory is bounded by the window and by the partition's node rows, however skewed the
degrees are: a hub's in-edges simply span several windows. Same parameters, same layer
code as sampled training.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jgraph.mesh import REPLICATED, ROWS
from jgraph.models.stack import layer_input
from jgraph.train.report import scores
from jgraph.train.step import class_counts, masked_cross_entropy

# Rows (of the widest message) one window fetches: bounds the window's buffers.
WINDOW_FLOATS = 1 << 22


def edge_window(edges_per_part: int, width: int, budget: int = WINDOW_FLOATS,
                smallest: int = 256) -> int:
    """In-edges per window: about `budget` / width, a power of two in [smallest, 65536],
    and no more than the partition needs."""
    size = int(np.clip(budget // max(width, 1), smallest, 1 << 16))
    size = 1 << (size.bit_length() - 1)
    return min(size, 1 << max(int(edges_per_part - 1).bit_length(), 0))


def local_inputs(inputs, encoder, features, embeddings, graph, axis):
    """x [n, width]: the encoder's input rows of this device's own nodes (no exchange:
    every node's row lives with its owner)."""
    me = lax.axis_index(axis)
    ids = graph.offsets[me] + jnp.arange(graph.nodes_per_part, dtype=jnp.int32)
    rows, valid = {}, {}
    for ntype, layout in inputs.layouts.items():
        ok = graph.node_mask & layout.contains(ids)
        block = inputs.local_rows(features, embeddings, ntype)
        rows[ntype] = block[jnp.where(ok, layout.local_row(ids, me), 0)]
        valid[ntype] = ok
    return encoder(rows, valid)


def full_layer(conv, h, graph, exchange, window: int):
    """conv over every owned node's whole in-neighbourhood; h: [n, F] this device's
    own rows. Returns ([n, out], ids lost by the exchange)."""
    axis = exchange.axis
    me = lax.axis_index(axis)
    n, e = graph.nodes_per_part, graph.edges_per_part
    messages = conv.message(h)
    edge_dst = jnp.searchsorted(graph.indptr, jnp.arange(e, dtype=jnp.int32),
                                side="right").astype(jnp.int32) - 1
    relational = graph.num_relations > 1

    def owner_rows(ids, mask):
        return messages[jnp.where(mask, ids - graph.offsets[me], 0)]

    def one_slot(rows, valid, etype):
        return conv.reduce(rows[:, None, :], valid[:, None],
                           etype[:, None] if relational else None)

    # Built from this device's rows so that the loop carry has their (varying) type.
    acc = one_slot(messages * 0, graph.node_mask & False, jnp.zeros((n,), jnp.int32))

    def body(w, carry):
        acc, lost = carry
        pos = w * window + jnp.arange(window, dtype=jnp.int32)
        inside = pos < e
        pos = jnp.where(inside, pos, 0)
        valid = inside & graph.edge_mask[pos]
        src = jnp.where(valid, graph.indices[pos], -1)
        rows, stats = exchange.gather(src, valid, owner_rows)
        part = one_slot(rows, valid, jnp.where(valid, graph.etype[pos], 0))
        dst = jnp.where(valid, edge_dst[pos], n)            # n: dropped
        acc = {k: (acc[k].at[dst].max(part[k], mode="drop") if k == "max"
                   else acc[k].at[dst].add(part[k], mode="drop")) for k in acc}
        return acc, lost + stats.overflow + stats.out_of_range

    windows = -(-e // window)
    acc, lost = lax.fori_loop(0, windows, body, (acc, jnp.int32(0)))
    return conv.update(h, acc), lost


def full_graph_logits(model, inputs, features, embeddings, graph, exchange,
                      window_floats: int = WINDOW_FLOATS, smallest_window: int = 256):
    """Per device (under shard_map): logits [n, classes] of this device's own nodes
    (local node i is global id offsets[me] + i) and the ids any exchange lost.
    window_floats, smallest_window: bound each window (see `edge_window`)."""
    h = local_inputs(inputs, model.encoder, features, embeddings, graph, exchange.axis)
    gnn = model.gnn
    lost = jnp.int32(0)
    for i, conv in enumerate(gnn.convs):
        h = layer_input(conv, h)
        width = conv.message(jnp.zeros((1, h.shape[1]), h.dtype)).shape[1]
        window = edge_window(graph.edges_per_part, width, window_floats, smallest_window)
        out, missed = full_layer(conv, h, graph, exchange, window)
        h = gnn.post(i, out)
        lost = lost + missed
    return h, lost


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
        me = lax.axis_index(exchange.axis)
        r = data.labels.shape[0]
        rows = jnp.arange(r, dtype=jnp.int32)
        real = rows < jnp.asarray(layout.counts, jnp.int32)[me]
        node = jnp.asarray(layout.starts, jnp.int32)[me] + rows - graph.offsets[me]
        target_logits = logits[jnp.where(real, node, 0)]
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
