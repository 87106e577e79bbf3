"""Graph attention (GAT, Veličković et al., 2018) in Flax NNX, as DGL's `GATConv`.

For each head, an edge u -> v scores e_uv = LeakyReLU(a_l . W h_u + a_r . W h_v); the
scores of v's in-neighbourhood are softmax-normalised and v's new row is the weighted
sum of its neighbours' W h_u, plus an optional residual and a bias. Heads are
concatenated (hidden layers) or averaged (the output layer).

The softmax runs over the whole in-neighbourhood however it is split: a partial holds
the running maximum of the scores ("max", per head), the sum of exp(score - max)
("den") and the weighted rows ("num"); `merge` rescales both sides to the larger
maximum (online softmax). A sampled Block's slot columns, and the edge windows of
full-graph inference and full-batch training, merge that way, so a hub's neighbourhood
never has to fit one window. Given a frame (a maximum at least the slots'), `reduce`
returns its terms relative to it, which then add up across windows (the layer is
`framed`, see `jgraph.models.stack`). Attention dropout drops normalised weights,
never the normaliser (DGL drops the softmax's output): the numerator's terms are
dropped and rescaled, the denominator's are not.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jgraph.models.stack import LayerStack, MessagePassing, layer_sizes

# The "max" of a partial with no slot: below any score, and exp(NO_SCORE - m) is 0 for
# any real maximum m (a finite value, so that two empty partials merge without nan).
NO_SCORE = -1e30


def _xavier(gain: float):
    """Xavier-normal with `gain` (DGL initialises GATConv with the relu gain, sqrt 2)."""
    return nnx.initializers.variance_scaling(gain * gain, "fan_avg", "normal")


class GATConv(MessagePassing):
    """One GAT layer. __call__(h_src [n_src, in], nbr [n_dst, W], mask [n_dst, W],
    key=None) -> [n_dst, heads * out] (concat) or [n_dst, out] (mean over heads).

    Parameters as DGL's: fc (no bias), attn_l and attn_r [heads, out], bias [heads *
    out], and with residual a res_fc (no bias) unless in == heads * out (identity).
    """

    reads_dst = True
    framed = True

    def __init__(self, in_features: int, out_features: int, heads: int, *,
                 concat: bool = True, negative_slope: float = 0.2,
                 attn_dropout: float = 0.0, residual: bool = False, use_bias: bool = True,
                 rngs: nnx.Rngs):
        if heads < 1:
            raise ValueError(f"GAT needs at least one head, got {heads}")
        if not 0.0 <= attn_dropout < 1.0:
            raise ValueError(f"attention dropout is a rate in [0, 1), got {attn_dropout}")
        self.heads, self.out_features, self.concat = heads, out_features, concat
        self.negative_slope, self.attn_dropout = negative_slope, attn_dropout
        width = heads * out_features
        gain = math.sqrt(2.0)
        self.fc = nnx.Linear(in_features, width, use_bias=False,
                             kernel_init=_xavier(gain), rngs=rngs)
        # torch's fans of a [1, heads, out] tensor: heads * out in, out out.
        std = gain * math.sqrt(2.0 / (width + out_features))
        self.attn_l = nnx.Param(std * jax.random.normal(rngs.params(), (heads, out_features)))
        self.attn_r = nnx.Param(std * jax.random.normal(rngs.params(), (heads, out_features)))
        self.bias = nnx.Param(jnp.zeros(width)) if use_bias else None
        self.residual = residual
        self.res_fc = (nnx.Linear(in_features, width, use_bias=False,
                                  kernel_init=_xavier(gain), rngs=rngs)
                       if residual and in_features != width else None)

    @property
    def width(self) -> int:
        return self.heads * self.out_features

    def message(self, h: jax.Array) -> jax.Array:
        """[n, heads * out + 2 heads]: W h, then the source and destination half-scores
        a_l . W h and a_r . W h of each head."""
        feat = self.fc(h)
        per_head = feat.reshape(h.shape[0], self.heads, self.out_features)
        el = jnp.sum(per_head * self.attn_l[...].astype(feat.dtype), axis=-1)
        er = jnp.sum(per_head * self.attn_r[...].astype(feat.dtype), axis=-1)
        return jnp.concatenate([feat, el, er], axis=1)

    def reduce(self, m_nbr, mask, etype=None, *, m_dst, key=None, frame=None) -> dict:
        n, w, _ = m_nbr.shape
        H, D, HD = self.heads, self.out_features, self.width
        feat = m_nbr[..., :HD].reshape(n, w, H, D)
        el = m_nbr[..., HD:HD + H]
        er = m_dst[:, HD + H:HD + 2 * H]
        score = jax.nn.leaky_relu(el + er[:, None, :], self.negative_slope)    # [n, W, H]
        live = mask[..., None]
        score = jnp.where(live, score, jnp.asarray(NO_SCORE, score.dtype))
        if frame is None:
            top = jnp.max(score, axis=1)
        else:
            top = jax.lax.stop_gradient(frame["max"]).astype(score.dtype)
        weight = jnp.where(live, jnp.exp(score - top[:, None, :]), 0)
        kept = weight
        if key is not None and self.attn_dropout > 0:
            keep = jax.random.bernoulli(key, 1.0 - self.attn_dropout, weight.shape)
            kept = jnp.where(keep, weight / (1.0 - self.attn_dropout), 0)
        num = jnp.sum(kept[..., None] * feat, axis=1).reshape(n, HD)
        return {"max": top, "den": jnp.sum(weight, axis=1), "num": num}

    def merge(self, a: dict, b: dict) -> dict:
        top = jnp.maximum(a["max"], b["max"])
        sa, sb = jnp.exp(a["max"] - top), jnp.exp(b["max"] - top)
        n = top.shape[0]

        def scaled(num, s):
            return (num.reshape(n, self.heads, -1) * s[..., None]).reshape(num.shape)
        return {"max": top, "den": a["den"] * sa + b["den"] * sb,
                "num": scaled(a["num"], sa) + scaled(b["num"], sb)}

    def update(self, h_dst, partial) -> jax.Array:
        n = h_dst.shape[0]
        H, D = self.heads, self.out_features
        den = partial["den"][..., None]
        out = partial["num"].reshape(n, H, D) / jnp.where(den > 0, den, 1)
        if self.residual:
            res = h_dst if self.res_fc is None else self.res_fc(h_dst)
            out = out + res.reshape(n, H, D)
        if self.bias is not None:
            out = out + self.bias[...].reshape(H, D)
        return out.reshape(n, H * D) if self.concat else jnp.mean(out, axis=1)


class GAT(LayerStack):
    """Stacked GATConv layers with ELU between them (see `LayerStack`): hidden layers
    of `heads` heads concatenated (hidden = heads x per-head width), the output layer
    of `out_heads` heads averaged."""

    activation = staticmethod(jax.nn.elu)

    def __init__(self, in_features: int, hidden: int, out_features: int, num_layers: int,
                 *, heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0,
                 negative_slope: float = 0.2, residual: bool = False,
                 dropout: float = 0.0, input_dropout: float = 0.0, norm: bool = False,
                 rngs: nnx.Rngs):
        if num_layers > 1 and hidden % heads:
            raise ValueError(f"GAT: hidden ({hidden}) must be a multiple of heads ({heads}): "
                             f"the heads' rows are concatenated")
        sizes = layer_sizes(in_features, hidden, out_features, num_layers)
        convs = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            last = i == num_layers - 1
            convs.append(GATConv(a, b if last else b // heads, out_heads if last else heads,
                                 concat=not last, negative_slope=negative_slope,
                                 attn_dropout=attn_dropout, residual=residual, rngs=rngs))
        self.convs = nnx.List(convs)
        self._between(hidden, num_layers, dropout, norm, rngs, input_dropout)
