"""Link prediction's model: the node encoder (`InputEncoder` + a `LayerStack`, as for
node classification, its last layer giving each node an embedding) and a decoder that
scores an edge from its two ends' embeddings.

Decoders: `dot` (h_src . h_dst) and DistMult (`sum(h_src * r * h_dst)` with one learned
diagonal `r` per relation; Yang et al. 2015, R-GCN's link predictor).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jgraph.models.encoder import InputEncoder
from jgraph.models.stack import LayerStack


class Decoder(enum.Enum):
    DOT = "dot"
    DISTMULT = "distmult"


class LinkPredictor(nnx.Module):
    """encoder, gnn: as `NodeClassifier`'s; __call__ -> the embeddings of the last
    neighbourhood's dst nodes; `score(h_src, h_dst, etype)` -> the edges' logits
    (broadcasting over leading dimensions). DistMult keeps one row per relation of
    `num_relations` (the positives' relations)."""

    def __init__(self, encoder: InputEncoder, gnn: LayerStack, decoder: Decoder,
                 width: int, num_relations: int, *, rngs: nnx.Rngs):
        self.encoder = encoder
        self.gnn = gnn
        self.decoder = Decoder(decoder)
        if self.decoder is Decoder.DISTMULT:
            init = nnx.initializers.normal(1.0 / jnp.sqrt(width))
            self.relations = nnx.Param(1.0 + init(rngs.params(), (num_relations, width)))

    def __call__(self, rows: Mapping, valid: Mapping, neighbourhoods: Sequence,
                 key: jax.Array | None = None) -> jax.Array:
        return self.gnn(self.encoder(rows, valid), neighbourhoods, key)

    def query(self, h_src: jax.Array, etype: jax.Array) -> jax.Array:
        """The source's side of the score: `score(h_src, h_dst, etype)` is
        `sum(query(h_src, etype) * h_dst, -1)` (so one query scores many destinations
        with a matmul)."""
        if self.decoder is Decoder.DISTMULT:
            return h_src * self.relations[...][jnp.maximum(etype, 0)]
        return h_src

    def score(self, h_src: jax.Array, h_dst: jax.Array, etype: jax.Array) -> jax.Array:
        return jnp.sum(self.query(h_src, etype) * h_dst, axis=-1)
