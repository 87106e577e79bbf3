"""GraphSAGE (Hamilton et al., 2017) in Flax NNX, over fixed-width neighbourhoods.

A layer reads `h_src` [n_src, F] (rows of a Block's `src`) and a neighbourhood: `nbr`
int32[n_dst, W] indexing `h_src`, `mask` bool[n_dst, W]. The dst nodes are the first
n_dst rows of `h_src` (the Block layout). A sampled Block is such a neighbourhood; so is
a chunk of the full graph with every in-neighbour (layer-wise inference), so both use
the same parameters and the same code.

Aggregators, as DGL's `SAGEConv`:
  mean: fc_self(h_dst) + fc_neigh(mean of neighbours)
  gcn:  fc_neigh((sum of neighbours + h_dst) / (degree + 1))
  pool: fc_self(h_dst) + fc_neigh(max of relu(fc_pool(neighbours)))
A node with no neighbour aggregates zeros.
"""
from __future__ import annotations

import enum
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


class Aggregator(enum.Enum):
    MEAN = "mean"
    GCN = "gcn"
    POOL = "pool"


def gather_neighbours(h_src: jax.Array, nbr: jax.Array, mask: jax.Array) -> jax.Array:
    """[n_dst, W, F]: the rows of each neighbour slot, zero where masked."""
    rows = jnp.take(h_src, jnp.where(mask, nbr, 0), axis=0)
    return jnp.where(mask[..., None], rows, jnp.zeros((), h_src.dtype))


class SAGEConv(nnx.Module):
    """One GraphSAGE layer. __call__(h_src [n_src, in], nbr [n_dst, W], mask [n_dst, W])
    -> [n_dst, out]."""

    def __init__(self, in_features: int, out_features: int, *,
                 aggregator: Aggregator = Aggregator.MEAN, use_bias: bool = True,
                 rngs: nnx.Rngs):
        self.aggregator = Aggregator(aggregator)
        if self.aggregator is Aggregator.POOL:
            self.fc_pool = nnx.Linear(in_features, in_features, rngs=rngs)
        if self.aggregator is not Aggregator.GCN:
            self.fc_self = nnx.Linear(in_features, out_features, use_bias=False, rngs=rngs)
        self.fc_neigh = nnx.Linear(in_features, out_features, use_bias=use_bias, rngs=rngs)

    def __call__(self, h_src: jax.Array, nbr: jax.Array, mask: jax.Array) -> jax.Array:
        n_dst = nbr.shape[0]
        h_dst = h_src[:n_dst]
        count = jnp.sum(mask, axis=1, keepdims=True).astype(h_src.dtype)
        if self.aggregator is Aggregator.POOL:
            pooled = jax.nn.relu(self.fc_pool(h_src))
            rows = gather_neighbours(pooled, nbr, mask)
            # relu output is >= 0, so a masked slot's 0 never wins over a real one.
            return self.fc_self(h_dst) + self.fc_neigh(jnp.max(rows, axis=1))
        total = jnp.sum(gather_neighbours(h_src, nbr, mask), axis=1)
        if self.aggregator is Aggregator.GCN:
            return self.fc_neigh((total + h_dst) / (count + 1))
        return self.fc_self(h_dst) + self.fc_neigh(total / jnp.maximum(count, 1))


class GraphSAGE(nnx.Module):
    """Stacked SAGEConv layers: relu, optional layer norm and dropout between layers.

    __call__(h_input, neighbourhoods, key=None) takes the input rows of the outermost
    hop's src and one (nbr, mask) pair per layer in model order (blocks[0] first), and
    returns the logits of the last layer's dst nodes. Dropout runs only with a key.
    """

    def __init__(self, in_features: int, hidden: int, out_features: int, num_layers: int, *,
                 aggregator: Aggregator = Aggregator.MEAN, dropout: float = 0.0,
                 norm: bool = False, rngs: nnx.Rngs):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        sizes = [in_features] + [hidden] * (num_layers - 1) + [out_features]
        self.layers = nnx.List([SAGEConv(a, b, aggregator=aggregator, rngs=rngs)
                                for a, b in zip(sizes[:-1], sizes[1:])])
        self.norms = nnx.List([nnx.LayerNorm(hidden, rngs=rngs) if norm else None
                               for _ in range(num_layers - 1)])
        self.dropout = nnx.Dropout(dropout)

    def layer(self, i: int, h_src: jax.Array, nbr: jax.Array, mask: jax.Array,
              key: jax.Array | None = None) -> jax.Array:
        """Layer i alone (layer-wise full-graph inference calls it chunk by chunk).
        key: dropout randomness; None = evaluation (no dropout)."""
        h = self.layers[i](h_src, nbr, mask)
        if i < len(self.layers) - 1:
            h = jax.nn.relu(h)
            if self.norms[i] is not None:
                h = self.norms[i](h)
            if key is not None:
                h = self.dropout(h, deterministic=False, rngs=jax.random.fold_in(key, i))
        return h

    def __call__(self, h: jax.Array, neighbourhoods: Sequence[tuple[jax.Array, jax.Array]],
                 key: jax.Array | None = None) -> jax.Array:
        if len(neighbourhoods) != len(self.layers):
            raise ValueError(f"{len(neighbourhoods)} blocks for a {len(self.layers)}-layer model")
        for i, (nbr, mask) in enumerate(neighbourhoods):
            h = self.layer(i, h, nbr, mask, key)
        return h
