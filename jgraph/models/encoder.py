"""The model's front and whole: per-type input rows -> one input matrix -> a GNN.

`InputEncoder` merges the rows `NodeInputs.fetch` returns: with a single node type they
pass through unchanged; with several, each featured type is projected to the common
width by its own linear layer (embeddings are created at that width).
`NodeClassifier` is the encoder followed by a `LayerStack` (GraphSAGE or R-GCN).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jgraph.data.sparse import dense
from jgraph.models.stack import LayerStack


class InputEncoder(nnx.Module):
    """{ntype: rows [n, F_t]} and {ntype: valid bool[n]} -> x float32[n, width].

    One node type: its rows, as they are (sparse rows too: the first layer takes them,
    or densifies them). Several: each featured type through its own Linear(F_t, width),
    sparse rows as an embedding bag; embedded types must already have `width` columns.
    """

    def __init__(self, widths: Mapping[str, int], featured: tuple[str, ...], width: int,
                 *, rngs: nnx.Rngs):
        self.types = tuple(widths)
        self.identity = len(self.types) == 1
        self.width = widths[self.types[0]] if self.identity else width
        self.project = nnx.Dict({
            t: nnx.Linear(widths[t], width, rngs=rngs)
            for t in featured if not self.identity})
        for t in self.types:
            if not self.identity and t not in featured and widths[t] != width:
                raise ValueError(f"the embedding of node type {t!r} has {widths[t]} columns, "
                                 f"the encoder's width is {width}")

    def __call__(self, rows: Mapping, valid: Mapping) -> jax.Array:
        if self.identity:
            (t,) = self.types
            return _floating(rows[t])
        x = 0.0
        for t in self.types:
            r = _floating(rows[t])
            if t in self.project:
                layer = self.project[t]
                r = r @ layer.kernel[...] + layer.bias[...]
            x = x + jnp.where(valid[t][:, None], dense(r), 0.0)
        return x


def _floating(x):
    """Floating rows as they are (float32, or bfloat16 under mixed precision), others
    (integer or boolean features) as float32; sparse rows stay sparse."""
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


class NodeClassifier(nnx.Module):
    """encoder: `InputEncoder`; gnn: a `LayerStack`. __call__(rows, valid,
    neighbourhoods, key=None) -> logits of the last neighbourhood's dst nodes."""

    def __init__(self, encoder: InputEncoder, gnn: LayerStack):
        self.encoder = encoder
        self.gnn = gnn

    def __call__(self, rows: Mapping, valid: Mapping, neighbourhoods: Sequence,
                 key: jax.Array | None = None) -> jax.Array:
        return self.gnn(self.encoder(rows, valid), neighbourhoods, key)
