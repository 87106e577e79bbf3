"""What every jgraph GNN shares: the neighbourhood container, the message-passing
contract of a layer, and the stack of layers with an activation, norm and dropout
between them.

A layer computes, for each dst node, a function of its own row and of its neighbours'
rows, in four steps that let the same parameters serve every caller:

  message(h_src)                      per source row, e.g. the pool transform
  reduce(m_nbr, mask, etype)          neighbour slots -> a partial aggregate
  merge(a, b)                         two partials of disjoint slot sets -> one
  update(h_dst, partial)              the dst node's new row

A sampled Block calls them once over its fixed-width slots (`__call__`). Layer-wise
full-graph inference and full-batch training (`jgraph.jobs.inference`,
`jgraph.jobs.full`) walk a node's in-edges window by window and merge the partials,
so a hub's neighbourhood never needs one row of max-degree width. Partials are dicts
of arrays with the dst node as leading axis; by default a key named "max" merges by
maximum, every other key by sum.

Two opt-ins extend the contract (attention needs both; `jgraph.models.gat`):

  reads_dst = True   reduce is also given, by keyword, `m_dst` (the message of each
                     slot row's destination node, [n_dst, ...]) and `key` (a PRNG key
                     for these slots, e.g. attention dropout; None in evaluation).
  framed = True      the layer merges partials its own way (a softmax's running
                     maximum and sum: `merge` rescales both sides to the larger
                     maximum), and reduce takes `frame`: None, or {"max": [n_dst, ...]}
                     a maximum at least that of these slots. Given a frame, reduce
                     returns its partial relative to it ("max" set to it): such partials
                     of disjoint slot sets then add up, key by key, to their merge in
                     that frame. Windows accumulate by adding, and the backward pass of
                     full-batch training recomputes each window in the final frame.
                     `update` must not read "max" (the frame: no gradient flows
                     through it, as none should through a softmax's shift).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jgraph.data.sparse import SparseRows, dense, register_pytree

register_pytree()      # sparse rows cross jit and shard_map here


class Neighbourhood(NamedTuple):
    """The slots a layer reads; a sampling `Block` has the same three fields.

      nbr: int32[n_dst, W] — index into the layer's h_src; -1 where mask is False.
      mask: bool[n_dst, W] — True for a real neighbour.
      etype: int32[n_dst, W] or None — relation of each slot (-1 where masked); None
        for a single-relation graph.
    """

    nbr: jax.Array
    mask: jax.Array
    etype: jax.Array | None = None


def gather_neighbours(h_src: jax.Array, nbr: jax.Array, mask: jax.Array) -> jax.Array:
    """[n_dst, W, F]: the rows of each neighbour slot, zero where masked."""
    rows = jnp.take(h_src, jnp.where(mask, nbr, 0), axis=0)
    return jnp.where(mask[..., None], rows, jnp.zeros((), h_src.dtype))


def merge_partials(a: dict, b: dict) -> dict:
    """Combine the partial aggregates of two disjoint sets of slots."""
    return {k: jnp.maximum(a[k], b[k]) if k == "max" else a[k] + b[k] for k in a}


def slot_count(mask: jax.Array, dtype) -> jax.Array:
    """[n_dst]: real neighbour slots per node."""
    return jnp.sum(mask, axis=1).astype(dtype)


class MessagePassing(nnx.Module):
    """Base of a layer: subclasses define message, reduce and update.

    A layer whose `accepts_sparse` is True takes `SparseRows` as h_src (sparse input
    features) in `message` and `update`; others are given them dense (`layer_input`).
    """

    accepts_sparse: bool = False
    reads_dst: bool = False
    framed: bool = False

    def message(self, h: jax.Array) -> jax.Array:
        return h

    def reduce(self, m_nbr: jax.Array, mask: jax.Array, etype: jax.Array | None,
               **context) -> dict:
        """Neighbour slots [n_dst, W, ...] -> a partial; `context` as the module says
        (only for layers with reads_dst or framed)."""
        raise NotImplementedError

    def update(self, h_dst: jax.Array, partial: dict) -> jax.Array:
        raise NotImplementedError

    merge = staticmethod(merge_partials)

    def __call__(self, h_src: jax.Array, nbr: jax.Array, mask: jax.Array,
                 etype: jax.Array | None = None, key: jax.Array | None = None) -> jax.Array:
        """h_src [n_src, in] with the dst nodes as its first n_dst rows -> [n_dst, out].
        key: randomness for the slots (layers with reads_dst); None: evaluation."""
        messages = self.message(h_src)
        m_dst = messages[:nbr.shape[0]]
        partial = aggregate_slots(self.reduce, self.merge, messages, nbr, mask, etype,
                                  context=lambda k: self.context(m_dst, k), key=key)
        return self.update(h_src[:nbr.shape[0]], partial)

    def context(self, m_dst: jax.Array, key: jax.Array | None = None,
                frame: dict | None = None) -> dict:
        """The keyword arguments `reduce` takes besides the slots: none for a plain
        layer; m_dst and key with reads_dst; frame when framed."""
        out = {}
        if self.reads_dst:
            out.update(m_dst=m_dst, key=key)
        if self.framed:
            out["frame"] = frame
        return out


def aggregate_slots(reduce, merge, messages, nbr, mask, etype=None, *, context=None,
                    key=None) -> dict:
    """The partial over every slot of a neighbourhood: `reduce` of one slot column at a
    time, `merge`d in a loop. XLA gathers [n_dst, F] rows per column far faster than
    one [n_dst, W, F] gather fused into a reduction, and the backward pass accumulates
    into one buffer instead of scattering every column into its own.
    context: `key -> {keyword: value}` more arguments of reduce (`MessagePassing.context`),
    given column k's key, folded from `key`."""
    def column(k):
        def col(a):
            return lax.dynamic_slice_in_dim(a, k, 1, axis=1)
        rows = gather_neighbours(messages, col(nbr), col(mask))
        more = {} if context is None else context(
            None if key is None else jax.random.fold_in(key, k))
        return reduce(rows, col(mask), None if etype is None else col(etype), **more)

    return lax.fori_loop(1, nbr.shape[1], lambda k, acc: merge(acc, column(k)), column(0))


class LayerStack(nnx.Module):
    """Layers with an activation (`activation`, relu unless a subclass says otherwise),
    optional layer norm and dropout between them (not after the last), and optional
    dropout of the input rows (DGL's GraphSAGE drops its input features too).
    Subclasses fill `self.convs` and call `_between(...)`.

    __call__(h, neighbourhoods, key=None) takes the input rows of the outermost hop's
    src and one neighbourhood per layer in model order (blocks[0] first), and returns
    the last layer's dst rows. Dropout runs only with a key.
    """

    convs: nnx.List
    activation = staticmethod(jax.nn.relu)

    def _between(self, hidden: int, num_layers: int, dropout: float, norm: bool,
                 rngs: nnx.Rngs, input_dropout: float = 0.0) -> None:
        self.norms = nnx.List([nnx.LayerNorm(hidden, rngs=rngs) if norm else None
                               for _ in range(num_layers - 1)])
        self.dropout = nnx.Dropout(dropout)
        self.input_dropout = nnx.Dropout(input_dropout)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def post(self, i: int, h: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """What follows layer i's conv: activation, norm, dropout (nothing after the
        last)."""
        if i < len(self.convs) - 1:
            h = self.activation(h)
            if self.norms[i] is not None:
                h = self.norms[i](h)
            if key is not None:
                h = self.dropout(h, deterministic=False, rngs=jax.random.fold_in(key, i))
        return h

    def drop_inputs(self, h, key: jax.Array | None = None):
        """The input rows with `input_dropout` applied (with a key: in training)."""
        if key is None or self.input_dropout.rate == 0:
            return h
        # Sparse rows drop stored entries: the zeros they leave out stay zero anyway.
        drop = functools.partial(self.input_dropout, deterministic=False,
                                 rngs=jax.random.fold_in(key, len(self.convs)))
        return h.with_values(drop(h.values)) if isinstance(h, SparseRows) else drop(h)

    def layer(self, i: int, h_src: jax.Array, hood, key: jax.Array | None = None) -> jax.Array:
        """Layer i alone on one neighbourhood (anything with nbr, mask, etype).
        key: dropout randomness; None = evaluation (no dropout)."""
        conv = self.convs[i]
        return self.post(i, conv(layer_input(conv, h_src), hood.nbr, hood.mask, hood.etype,
                                 key=conv_key(key, i)), key)

    def __call__(self, h: jax.Array, neighbourhoods: Sequence, key: jax.Array | None = None
                 ) -> jax.Array:
        if len(neighbourhoods) != len(self.convs):
            raise ValueError(f"{len(neighbourhoods)} blocks for a {len(self.convs)}-layer model")
        h = self.drop_inputs(h, key)
        for i, hood in enumerate(neighbourhoods):
            h = self.layer(i, h, hood, key)
        return h


def conv_key(key: jax.Array | None, i: int) -> jax.Array | None:
    """Layer i's own randomness (attention dropout), apart from the dropout after it."""
    return None if key is None else jax.random.fold_in(jax.random.fold_in(key, i), 1)


def layer_input(conv: MessagePassing, h):
    """The input rows of `conv`: as they are, or dense if they are `SparseRows` the
    layer does not take."""
    return h if conv.accepts_sparse else dense(h)


def layer_sizes(in_features: int, hidden: int, out_features: int, num_layers: int) -> list[int]:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return [in_features] + [hidden] * (num_layers - 1) + [out_features]
