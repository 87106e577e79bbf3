"""The windows of full-graph layers, shared by layer-wise inference
(`jgraph.jobs.inference`) and full-batch training (`jgraph.jobs.full`): every layer
computed for every owned node over its whole in-neighbourhood, in the manner of SAR
(sequential aggregation and rematerialisation, Mostafa 2022).

Layer by layer, each device first turns its own nodes' rows into messages
(`conv.message`, e.g. GraphSAGE's projection, so narrow rows travel), then walks its
partition's in-edges in fixed windows of `edge_window` edges: the window's source rows
come through the exchange, `conv.reduce` makes each edge a partial aggregate (a
one-slot neighbourhood), and the partials are merged into their destination node's
accumulator (`accumulate`: sum, maximum, or a framed layer's running maximum and sum).
After the last window, `conv.update` and the between-layer steps run for all owned
nodes at once. Memory is bounded by the window and by the partition's node rows,
however skewed the degrees are: a hub's in-edges simply span several windows.

The backward pass does not keep the fetched rows: `window_aggregate` is a custom VJP
that walks the windows again, fetches each window's rows a second time, takes the VJP
of that window's partials (in the final frame, so that every window's terms add up),
and sends the rows' cotangents back to their owners (`Exchange.scatter_rows`, gather's
transpose). Per-device memory is then the partition's own rows of each layer plus one
window, not the halo. Where a layer's partials are linear in the fetched rows (sums and
means: GraphSAGE mean and gcn, R-GCN), their VJP needs no row at all, and JAX drops the
second fetch: the backward pass only routes gradients to the owners. Where they are not
(GAT's attention, a pool's maximum), `remat=False` keeps every window's fetched rows
instead of fetching them again (the one-shot variant, for comparison): the same
gradients, no second fetch, memory for every in-edge's row.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jgraph.exchange import owned_index, owned_rows, segment_of
from jgraph.mesh import vary_like
from jgraph.models.stack import MessagePassing, conv_key, layer_input

# Floats (window edges x the widest message) one window fetches: bounds its buffers.
WINDOW_FLOATS = 1 << 22


class Summed(MessagePassing):
    """A layer without parameters whose partial is the sum of its neighbours' rows and
    their count: what walks the in-edges where no model does (the control variates'
    input sums, label propagation)."""

    def reduce(self, m_nbr, mask, etype=None, **context) -> dict:
        return {"sum": jnp.sum(m_nbr, axis=1),
                "count": jnp.sum(mask, axis=1).astype(m_nbr.dtype)}


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
        rows[ntype] = block[owned_index(ids, ok, layout.starts, axis)]
        valid[ntype] = ok
    return encoder(rows, valid)


class Window(NamedTuple):
    """One window of a partition's in-edges (CSC order): valid: bool[w] a real edge;
    src: int32[w] global source ids (-1 where not valid); dst: int32[w] local
    destination index (n where not valid, so scatters drop it); etype: int32[w]."""

    valid: jax.Array
    src: jax.Array
    dst: jax.Array
    etype: jax.Array


def edge_destinations(graph) -> jax.Array:
    """int32[e]: the local destination of each of this device's in-edge positions (n
    past the last edge: indptr's n + 1 entries start n nodes' in-edges and the padding)."""
    return segment_of(graph.indptr, jnp.arange(graph.edges_per_part, dtype=jnp.int32))


def window_edges(graph, edge_dst, w, window: int) -> Window:
    """Window w (of `window` edge positions) of this device's in-edges."""
    n, e = graph.nodes_per_part, graph.edges_per_part
    pos = w * window + jnp.arange(window, dtype=jnp.int32)
    inside = pos < e
    pos = jnp.where(inside, pos, 0)
    valid = inside & graph.edge_mask[pos]
    return Window(valid, jnp.where(valid, graph.indices[pos], -1),
                  jnp.where(valid, edge_dst[pos], n), jnp.where(valid, graph.etype[pos], 0))


def num_windows(graph, window: int) -> int:
    return -(-graph.edges_per_part // window)


def edge_partial(conv, rows, win: Window, m_dst, relational: bool, key=None, frame=None):
    """conv.reduce of each edge of a window as a one-slot neighbourhood: {key: [w, ...]}.
    m_dst: [w, ...] the destinations' messages (layers that read them); frame: the
    destinations' frame (framed layers)."""
    etype = win.etype[:, None] if relational else None
    return conv.reduce(rows[:, None, :], win.valid[:, None], etype,
                       **conv.context(m_dst, key, frame))


def empty_partial(conv, messages, graph, relational: bool) -> dict:
    """The partial of no slot for each owned node (the accumulators' start), built from
    this device's rows so that a loop carry has their (varying) type."""
    n = graph.nodes_per_part
    zeros = jnp.zeros(n, jnp.int32)
    none = Window(graph.node_mask & False, zeros - 1, zeros, zeros)
    return edge_partial(conv, messages * 0, none, messages, relational)


TIES = "max:ties"
"""The accumulator key counting the slots at each "max" entry (full-batch training's
backward pass)."""


def accumulate(conv, acc: dict, dst, edge_part) -> dict:
    """acc with a window's edges merged in. `edge_part(frame) -> {key: [w, ...]}` is
    the window's `edge_partial`. Plain layers add each edge's partial to its
    destination's ("max": maximum). Framed layers keep a running maximum: the
    destinations' maxima rise to cover the window, their accumulators are rescaled to
    it (`conv.merge` with an empty partial there), and the window's terms, relative to
    it, are added. dst: int32[w] each edge's local destination (out of range: none).
    With a `TIES` key, acc also counts the slots that equal each "max" entry (full-batch
    training's backward pass splits a maximum's gradient evenly between them)."""
    if not conv.framed:
        part = edge_part(None)
        out = {k: (acc[k].at[dst].max(part[k], mode="drop") if k == "max"
                   else acc[k].at[dst].add(part[k], mode="drop")) for k in acc if k != TIES}
        if TIES in acc:
            top = out["max"]
            hit = part["max"] == top[jnp.minimum(dst, top.shape[0] - 1)]
            out[TIES] = jnp.where(acc["max"] == top, acc[TIES], 0).at[dst].add(
                hit.astype(top.dtype), mode="drop")
        return out
    top = acc["max"].at[dst].max(edge_part(None)["max"], mode="drop")
    at = jnp.minimum(dst, top.shape[0] - 1)
    old = {k: v[at] for k, v in acc.items()}
    risen = conv.merge(old, {k: top[at] if k == "max" else jnp.zeros_like(v)
                             for k, v in old.items()})
    acc = {k: v.at[dst].set(risen[k], mode="drop") for k, v in acc.items()}
    part = edge_part({"max": top[at]})
    return {k: top if k == "max" else v.at[dst].add(part[k], mode="drop")
            for k, v in acc.items()}


def labelled_rows(logits, graph, layout, labels, axis):
    """(logits [r, C], real bool[r]) of this device's rows of the labelled type, in the
    order of its `labels` block (layout: the labels' `RowLayout`)."""
    me = lax.axis_index(axis)
    r = labels.shape[0]
    rows = jnp.arange(r, dtype=jnp.int32)
    real = rows < jnp.asarray(layout.counts, jnp.int32)[me]
    node = jnp.asarray(layout.starts, jnp.int32)[me] + rows - graph.offsets[me]
    return logits[jnp.where(real, node, 0)], real


def window_aggregate(conv, h, graph, exchange, window: int, key=None, remat: bool = True):
    """(acc, lost): conv's partial over every owned node's whole in-neighbourhood
    ({key: [n, ...]}), from this device's layer inputs h [n, F] (their messages,
    `conv.message(h)`, are what travels), walking `window` in-edges at a time; lost:
    ids the exchange did not answer (ids out of the graph's range; never for want of
    room: a window moves in as many rounds as it needs). Differentiable
    in conv's parameters and in h (of every device: a row's cotangent goes back to its
    owner). The backward pass keeps only h (and, for a maximum or a framed layer, the
    result) and computes the messages again. key: randomness of the layer's edges
    (attention dropout), folded per window; None in evaluation."""
    graphdef, state = nnx.split(conv)
    like = jax.tree.leaves(h)[-1]
    state = vary_like(state, like)
    relational = graph.num_relations > 1
    n = graph.nodes_per_part
    edge_dst = edge_destinations(graph)
    windows = num_windows(graph, window)

    def messages(state, h):
        return nnx.merge(graphdef, state).message(h)

    def fetch(msgs, win: Window):
        rows, stats = exchange.gather(win.src, win.valid,
                                      owned_rows(msgs, graph.offsets, exchange.axis))
        return rows, stats.overflow + stats.out_of_range

    def window_key(w):
        return None if key is None else jax.random.fold_in(key, w)

    def partial_of(state, rows, win, m_dst, w, frame):
        layer = nnx.merge(graphdef, state)
        return edge_partial(layer, rows, win, m_dst, relational, window_key(w), frame)

    def forward(state, h):
        """(acc, lost, kept) of the layer inputs h."""
        return merged(state, messages(state, h))

    def merged(state, msgs, ties: bool = False):
        """(acc, lost, kept) of the messages msgs: every window's partials merged, the
        ids lost, and (remat=False) every window's fetched rows. ties: also count the
        slots at each maximum (TIES)."""
        layer = nnx.merge(graphdef, state)
        acc = empty_partial(layer, msgs, graph, relational)
        if ties:
            acc[TIES] = jnp.zeros_like(acc["max"])
        kept = vary_like(jnp.zeros((windows if not remat else 0, window, msgs.shape[1]),
                               msgs.dtype), msgs)

        def body(w, carry):
            acc, lost, kept = carry
            win = window_edges(graph, edge_dst, w, window)
            rows, missed = fetch(msgs, win)
            m_dst = msgs[jnp.minimum(win.dst, n - 1)]
            acc = accumulate(layer, acc, win.dst,
                             lambda frame: partial_of(state, rows, win, m_dst, w, frame))
            if not remat:
                kept = lax.dynamic_update_index_in_dim(kept, rows, w, 0)
            return acc, lost + missed, kept

        return lax.fori_loop(0, windows, body, (acc, jnp.int32(0), kept))

    @jax.custom_vjp
    def aggregate(state, h):
        acc, lost, _ = forward(state, h)
        return acc, lost

    def aggregate_fwd(state, h):
        acc, lost, kept = forward(state, h)
        # The result is kept only where the backward pass reads it: a frame, a maximum.
        keep = conv.framed or "max" in acc
        return (acc, lost), (state, h, acc if keep else None, kept)

    def aggregate_bwd(residuals, cotangents):
        state, h, acc, kept = residuals
        g_acc = cotangents[0]
        framed = nnx.merge(graphdef, state).framed
        msgs, message_vjp = jax.vjp(messages, state, h)
        top = ties = None
        if acc is not None and "max" in acc and not framed:
            # A maximum's gradient goes to the slots at it, split between them. Which
            # slots those are is decided on this pass's own messages (a walk over the
            # windows before the gradients'), not compared with the forward's values,
            # which another compilation of the same arithmetic may round differently.
            again = merged(state, msgs, ties=True)[0]
            top, ties = again["max"], again[TIES]

        def body(w, carry):
            g_state, g_msgs = carry
            win = window_edges(graph, edge_dst, w, window)
            rows = fetch(msgs, win)[0] if remat else kept[w]
            at = jnp.minimum(win.dst, n - 1)
            frame = {"max": acc["max"][at]} if framed else None
            part, vjp = jax.vjp(lambda s, r, d: partial_of(s, r, win, d, w, frame),
                                state, rows, msgs[at])
            live = win.valid
            cot = {}
            for k, p in part.items():
                g = g_acc[k][at]
                if k == "max" and not framed:     # split between the slots at the max
                    g = jnp.where(p == top[at], g / jnp.maximum(ties[at], 1), 0)
                cot[k] = jnp.where(live.reshape((-1,) + (1,) * (g.ndim - 1)), g, 0)
            g_s, g_rows, g_dst = vjp(cot)
            back, _ = exchange.scatter_rows(win.src, win.valid, g_rows, n)
            g_msgs = g_msgs.at[win.dst].add(g_dst, mode="drop") + back
            return jax.tree.map(jnp.add, g_state, g_s), g_msgs

        zeros = (jax.tree.map(jnp.zeros_like, state), jnp.zeros_like(msgs))
        g_state, g_msgs = lax.fori_loop(0, windows, body, zeros)
        g_state_msg, g_h = message_vjp(g_msgs)
        return jax.tree.map(jnp.add, g_state, g_state_msg), g_h

    aggregate.defvjp(aggregate_fwd, aggregate_bwd)
    return aggregate(state, h)


def full_batch_layer(gnn, i: int, h, graph, exchange, window: int, key=None,
                     remat: bool = True):
    """Layer i of the stack `gnn` and what follows it (`LayerStack.post`) over every
    owned node's whole in-neighbourhood, differentiably: ([n, out], ids lost). h: [n, F]
    this device's own rows. The update and post steps are rematerialised: the backward
    pass keeps only their inputs."""
    conv = gnn.convs[i]
    acc, lost = window_aggregate(conv, h, graph, exchange, window, conv_key(key, i), remat)
    update = nnx.remat(lambda gnn, h, acc: gnn.post(i, gnn.convs[i].update(h, acc), key))
    return update(gnn, h, acc), lost


def full_graph_logits(model, inputs, features, embeddings, graph, exchange,
                      window_floats: int = WINDOW_FLOATS, smallest_window: int = 256, *,
                      key=None, remat: bool = True):
    """Per device (under shard_map): logits [n, classes] of this device's own nodes
    (local node i is global id offsets[me] + i) and the ids any exchange lost,
    differentiable in the model's parameters and in the embedding tables (this
    device's rows of each). window_floats, smallest_window: bound each window (see
    `edge_window`). key: dropout (between layers and in attention); None: evaluation.
    remat: see the module."""
    layers, lost = full_graph_layers(model, inputs, features, embeddings, graph, exchange,
                                     window_floats, smallest_window, key=key, remat=remat)
    return layers[-1], lost


def full_graph_layers(model, inputs, features, embeddings, graph, exchange,
                      window_floats: int = WINDOW_FLOATS, smallest_window: int = 256, *,
                      key=None, remat: bool = True, depth: int | None = None):
    """`full_graph_logits` with every layer's rows: ([each layer's output [n, width],
    the last one the logits], ids lost). depth: only the first `depth` layers."""
    h = local_inputs(inputs, model.encoder, features, embeddings, graph, exchange.axis)
    gnn = model.gnn
    h = gnn.drop_inputs(h, key)
    lost, layers = jnp.int32(0), []
    for i, conv in enumerate(list(gnn.convs)[:depth]):
        h = layer_input(conv, h)
        width = conv.message(jnp.zeros((1, h.shape[1]), h.dtype)).shape[1]
        window = edge_window(graph.edges_per_part, width, window_floats, smallest_window)
        h, missed = full_batch_layer(gnn, i, h, graph, exchange, window, key, remat)
        layers.append(h)
        lost = lost + missed
    return layers, lost
