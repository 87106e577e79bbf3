"""R-GCN (Schlichtkrull et al., 2018) in Flax NNX, over fixed-width neighbourhoods with
a relation per slot.

    h_i' = W_self h_i + b + sum_r sum_{j in N_r(i)} W_r h_j / c_{i,r}

Normalisation (`Norm`, the `normalization` argument): `relation` (the default)
divides each relation's sum by that relation's neighbour count c_{i,r} = |N_r(i)|,
the paper's (the formula above); `node` divides the whole sum by the node's in-degree
over all relations, c_{i,r} = |N(i)| (DGL's `norm_by_dst`, as its R-GCN examples do).
Either way the partial aggregates (sums and counts) add up window by window in
full-graph inference. Inverse relations are relations of the graph
(`jgraph.data.add_reverse_relations`); the self-connection is `W_self`.

Weight decompositions (`Decomposition`):
  basis: W_r = sum_b a_rb V_b with B bases. With `node` normalisation neighbours are
    summed per basis first, weighting slot j by a[etype_j] (einsum 'iwb,iwf->ibf'),
    and each basis applied once per node; with `relation` they are summed per relation,
    normalised, then mixed into the bases. The per-slot weights are never
    materialised. num_bases <= 0 or >= R gives one full weight per relation.
  block: W_r = blockdiag(Q_r1, ..., Q_rB), B blocks dividing in and out. Neighbours
    are summed per relation, then each relation's blocks applied.

One-hot inputs (`OneHotRelGraphConv`, RGCN's `one_hot_inputs`): the paper's featureless
first layer. On a one-hot input e_j, W_r e_j is row j of W_r, so the layer's weights
are per-node rows: each node's input row holds one slice per relation (and one for the
self-connection), learned as a sharded embedding, and relation r's slot reads slice r
of its neighbour. Far more expressive than one shared embedding through a W_r, at
(R+1) x hidden floats per node.
"""
from __future__ import annotations

import enum
import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from jgraph.models.stack import LayerStack, MessagePassing, aggregate_slots, layer_sizes, slot_count


class Decomposition(enum.Enum):
    BASIS = "basis"
    BLOCK = "block"


class Norm(enum.Enum):
    RELATION = "relation"
    NODE = "node"


def slot_relations(mask, etype) -> jax.Array:
    """int32[n, W]: each slot's relation, 0 where masked or where etype is None."""
    return jnp.zeros(mask.shape, jnp.int32) if etype is None else jnp.where(mask, etype, 0)


def relation_sums(m, mask, rel, num_relations: int) -> dict:
    """Per dst node, the masked slots of m [n, W, F] summed per relation ("sum" [n, R, F])
    and counted per relation ("count" [n, R])."""
    weight = (jax.nn.one_hot(rel, num_relations, dtype=m.dtype)
              * mask[..., None].astype(m.dtype))
    return {"sum": jnp.einsum("iwr,iwf->irf", weight, m), "count": jnp.sum(weight, axis=1)}


class RelGraphConv(MessagePassing):
    """One R-GCN layer. __call__(h_src [n_src, in], nbr, mask, etype [n_dst, W]) ->
    [n_dst, out]; etype None means every slot is relation 0."""

    def __init__(self, in_features: int, out_features: int, num_relations: int, *,
                 decomposition: Decomposition = Decomposition.BASIS, num_bases: int = 0,
                 self_loop: bool = True, use_bias: bool = True, norm: Norm = Norm.RELATION,
                 rngs: nnx.Rngs):
        if num_relations < 1:
            raise ValueError(f"num_relations must be >= 1, got {num_relations}")
        self.decomposition = Decomposition(decomposition)
        self.norm = Norm(norm)
        self.num_relations = num_relations
        init = nnx.initializers.glorot_uniform(in_axis=-2, out_axis=-1, batch_axis=(0,))
        if self.decomposition is Decomposition.BASIS:
            bases = num_bases if 0 < num_bases < num_relations else num_relations
            self.per_relation = bases == num_relations
            self.bases = nnx.Param(init(rngs.params(), (bases, in_features, out_features)))
            if not self.per_relation:
                coef_init = nnx.initializers.glorot_uniform()
                self.coef = nnx.Param(coef_init(rngs.params(), (num_relations, bases)))
        else:
            blocks = num_bases
            if blocks < 1 or in_features % blocks or out_features % blocks:
                raise ValueError(f"block decomposition: {blocks} blocks must divide both "
                                 f"in_features={in_features} and out_features={out_features}")
            self.per_relation = True
            block_init = nnx.initializers.glorot_uniform(in_axis=-2, out_axis=-1,
                                                         batch_axis=(0, 1))
            self.blocks = nnx.Param(block_init(
                rngs.params(), (num_relations, blocks, in_features // blocks,
                                out_features // blocks)))
        self.fc_self = (nnx.Linear(in_features, out_features, use_bias=False, rngs=rngs)
                        if self_loop else None)
        self.bias = nnx.Param(jnp.zeros((out_features,))) if use_bias else None

    def reduce(self, m_nbr, mask, etype=None) -> dict:
        rel = slot_relations(mask, etype)
        if self.per_relation or self.norm is Norm.RELATION:
            out = relation_sums(m_nbr, mask, rel, self.num_relations)
        else:
            live = mask[..., None].astype(m_nbr.dtype)
            weight = jnp.take(self.coef[...], rel, axis=0).astype(m_nbr.dtype) * live
            out = {"sum": jnp.einsum("iwk,iwf->ikf", weight, m_nbr)}
        if self.norm is Norm.NODE:
            out["count"] = slot_count(mask, m_nbr.dtype)           # [n]
        return out                                 # count [n, R] with relation norm

    def update(self, h_dst, partial) -> jax.Array:
        count = jnp.maximum(partial["count"], 1)
        agg = partial["sum"] / (count[..., None] if self.norm is Norm.RELATION
                                else count[:, None, None])
        if self.decomposition is Decomposition.BASIS:
            if not self.per_relation and self.norm is Norm.RELATION:
                agg = jnp.einsum("irf,rb->ibf", agg, self.coef[...])
            out = jnp.einsum("ikf,kfo->io", agg, self.bases[...])
        else:
            q = self.blocks[...]
            n, r, blocks = agg.shape[0], q.shape[0], q.shape[1]
            agg = agg.reshape(n, r, blocks, q.shape[2])
            out = jnp.einsum("irkf,rkfo->iko", agg, q).reshape(n, blocks * q.shape[3])
        if self.fc_self is not None:
            out = out + self.fc_self(h_dst)
        if self.bias is not None:
            out = out + self.bias[...]
        return out


class OneHotRelGraphConv(MessagePassing):
    """The first R-GCN layer on one-hot inputs (see the module doc): no weights but the
    bias; h_src rows are [slice_0 | ... | slice_{R-1} | self slice] of out_features each
    (no self slice without self_loop). __call__ as RelGraphConv's."""

    def __init__(self, out_features: int, num_relations: int, *, self_loop: bool = True,
                 use_bias: bool = True, norm: Norm = Norm.RELATION):
        if num_relations < 1:
            raise ValueError(f"num_relations must be >= 1, got {num_relations}")
        self.norm = Norm(norm)
        self.num_relations = num_relations
        self.out_features = out_features
        self.self_loop = self_loop
        self.bias = nnx.Param(jnp.zeros((out_features,))) if use_bias else None

    @property
    def slices(self) -> int:
        return self.num_relations + int(self.self_loop)

    @property
    def in_features(self) -> int:
        return self.slices * self.out_features

    def _sums(self, m, mask, rel) -> dict:
        """m [n, W, out]: each slot's own relation slice."""
        if self.norm is Norm.RELATION:
            return relation_sums(m, mask, rel, self.num_relations)
        live = mask[..., None].astype(m.dtype)
        return {"sum": jnp.sum(m * live, axis=1), "count": slot_count(mask, m.dtype)}

    def reduce(self, m_nbr, mask, etype=None) -> dict:
        rel = slot_relations(mask, etype)
        n, w, _ = m_nbr.shape
        rows = m_nbr.reshape(n, w, self.slices, self.out_features)
        m = jnp.take_along_axis(rows, rel[:, :, None, None], axis=2)[:, :, 0]
        return self._sums(m, mask, rel)

    def update(self, h_dst, partial) -> jax.Array:
        count = jnp.maximum(partial["count"], 1)
        if self.norm is Norm.RELATION:
            out = jnp.sum(partial["sum"] / count[..., None], axis=1)
        else:
            out = partial["sum"] / count[:, None]
        if self.self_loop:
            r, f = self.num_relations, self.out_features
            out = out + h_dst[:, r * f:(r + 1) * f]
        if self.bias is not None:
            out = out + self.bias[...]
        return out

    def __call__(self, h_src, nbr, mask, etype=None, key=None) -> jax.Array:
        if h_src.shape[1] != self.in_features:
            raise ValueError(f"one-hot R-GCN layer: input rows have {h_src.shape[1]} columns, "
                             f"expected {self.slices} slices x {self.out_features} = "
                             f"{self.in_features}")
        rel = slot_relations(mask, etype)
        # Gather only each slot's own slice: row (node, relation) of the sliced table.
        partial = aggregate_slots(self._sums, self.merge, h_src.reshape(-1, self.out_features),
                                  nbr * self.slices + rel, mask, rel)
        return self.update(h_src[:nbr.shape[0]], partial)


class RGCN(LayerStack):
    """Stacked RelGraphConv layers (see `LayerStack` for the call and what runs between).
    one_hot_inputs: the first layer is a `OneHotRelGraphConv`; in_features must then be
    `one_hot_width(...)`."""

    def __init__(self, in_features: int, hidden: int, out_features: int, num_layers: int,
                 num_relations: int, *, decomposition: Decomposition = Decomposition.BASIS,
                 num_bases: int = 0, self_loop: bool = True,
                 normalization: Norm = Norm.RELATION, dropout: float = 0.0,
                 input_dropout: float = 0.0, norm: bool = False,
                 one_hot_inputs: bool = False, rngs: nnx.Rngs):
        sizes = layer_sizes(in_features, hidden, out_features, num_layers)
        if one_hot_inputs:
            first = OneHotRelGraphConv(sizes[1], num_relations, self_loop=self_loop,
                                       norm=normalization)
            if in_features != first.in_features:
                raise ValueError(f"one-hot R-GCN inputs must be {first.slices} slices x "
                                 f"{sizes[1]} = {first.in_features} wide, got {in_features}")
        else:
            first = RelGraphConv(sizes[0], sizes[1], num_relations, decomposition=decomposition,
                                 num_bases=num_bases, self_loop=self_loop, norm=normalization,
                                 rngs=rngs)
        convs = [
            RelGraphConv(a, b, num_relations, decomposition=decomposition,
                         num_bases=num_bases, self_loop=self_loop, norm=normalization,
                         rngs=rngs)
            for a, b in itertools.pairwise(sizes[1:])]
        self.convs = nnx.List([first] + convs)
        self._between(hidden, num_layers, dropout, norm, rngs, input_dropout)


def one_hot_width(hidden: int, out_features: int, num_layers: int, num_relations: int,
                  self_loop: bool = True) -> int:
    """Input width an RGCN with one_hot_inputs needs: a slice per relation (and self)."""
    first_out = out_features if num_layers == 1 else hidden
    return (num_relations + int(self_loop)) * first_out
