"""GraphSAGE (Hamilton et al., 2017) in Flax NNX, over fixed-width neighbourhoods.

A layer reads `h_src` [n_src, F] (rows of a Block's `src`) and a neighbourhood (`nbr`,
`mask`; see `Neighbourhood`). The dst nodes are the first n_dst rows of `h_src` (the
Block layout). A sampled Block is such a neighbourhood, and layer-wise full-graph
inference feeds the same layers window by window (see `jgraph.models.stack`), so both
use the same parameters.

Aggregators, as DGL's `SAGEConv`:
  mean: fc_self(h_dst) + fc_neigh(mean of neighbours)
  gcn:  fc_neigh((sum of neighbours + h_dst) / (degree + 1))
  pool: fc_self(h_dst) + fc_neigh(max of relu(fc_pool(neighbours)))
A node with no neighbour aggregates zeros.

When a mean or gcn layer narrows (in > out), fc_neigh's kernel is applied to each source
row before the neighbour sum rather than after (DGL's `lin_before_mp`): the same
function, but the gather moves `out` columns per neighbour slot instead of `in`. Such a
layer takes sparse input rows (`SparseRows`) as they are: its kernels multiply them as
an embedding bag.
"""
from __future__ import annotations

import enum
import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from jgraph.models.stack import LayerStack, MessagePassing, layer_sizes, slot_count


class Aggregator(enum.Enum):
    MEAN = "mean"
    GCN = "gcn"
    POOL = "pool"


class SAGEConv(MessagePassing):
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
        self.project_first = (self.aggregator is not Aggregator.POOL
                              and in_features > out_features)
        # Projecting first, the layer only multiplies its input by kernels, which
        # sparse rows do as an embedding bag.
        self.accepts_sparse = self.project_first

    def message(self, h: jax.Array) -> jax.Array:
        if self.aggregator is Aggregator.POOL:
            return jax.nn.relu(self.fc_pool(h))
        if self.project_first:
            return h @ self.fc_neigh.kernel[...]
        return h

    def _neigh(self, x: jax.Array, projected: bool) -> jax.Array:
        """fc_neigh(x), where x may already have had the kernel applied."""
        if not projected:
            return self.fc_neigh(x)
        bias = self.fc_neigh.bias
        return x if bias is None else x + bias[...]

    def reduce(self, m_nbr, mask, etype=None) -> dict:
        count = slot_count(mask, m_nbr.dtype)
        if self.aggregator is Aggregator.POOL:
            # relu output is >= 0, so a masked slot's 0 never wins over a real one, and
            # 0 is the identity of the merge.
            return {"max": jnp.max(m_nbr, axis=1), "count": count}
        return {"sum": jnp.sum(m_nbr, axis=1), "count": count}

    def _self_and_neigh(self, h_dst, agg) -> jax.Array:
        """fc_self(h_dst) + fc_neigh(agg) as one matmul of the concatenated rows."""
        kernel = jnp.concatenate([self.fc_self.kernel[...], self.fc_neigh.kernel[...]])
        out = jnp.concatenate([h_dst, agg], axis=1) @ kernel
        bias = self.fc_neigh.bias
        return out if bias is None else out + bias[...]

    def update(self, h_dst, partial) -> jax.Array:
        count = partial["count"][:, None]
        if self.aggregator is Aggregator.POOL:
            return self._self_and_neigh(h_dst, partial["max"])
        if self.aggregator is Aggregator.GCN:
            own = self.message(h_dst)
            return self._neigh((partial["sum"] + own) / (count + 1), self.project_first)
        mean = partial["sum"] / jnp.maximum(count, 1)
        if self.project_first:
            return h_dst @ self.fc_self.kernel[...] + self._neigh(mean, projected=True)
        return self._self_and_neigh(h_dst, mean)


class GraphSAGE(LayerStack):
    """Stacked SAGEConv layers (see `LayerStack` for the call and what runs between)."""

    def __init__(self, in_features: int, hidden: int, out_features: int, num_layers: int, *,
                 aggregator: Aggregator = Aggregator.MEAN, dropout: float = 0.0,
                 input_dropout: float = 0.0, norm: bool = False, rngs: nnx.Rngs):
        sizes = layer_sizes(in_features, hidden, out_features, num_layers)
        self.convs = nnx.List([SAGEConv(a, b, aggregator=aggregator, rngs=rngs)
                               for a, b in itertools.pairwise(sizes)])
        self._between(hidden, num_layers, dropout, norm, rngs, input_dropout)
