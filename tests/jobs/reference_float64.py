"""A reference of full-batch GraphSAGE (mean) and GAT that shares no code with jgraph:
the layers written out from their papers' (and DGL's) definitions over a raw edge list,
with segment sums and a segment softmax, in float64; its gradients by JAX's autodiff.

    python reference_float64.py sage|gat GRAPH.npz PARAMS.npz OUT.npz [--slope 0.2]

GRAPH.npz: src, dst int[E] (an edge u -> v: v reads u), feat [N, F], label int[N],
train_idx int[T]. PARAMS.npz: each layer's weights named `convs.{i}.{module}.{leaf}`
(`fc_self.kernel`, `fc_neigh.kernel`, `fc_neigh.bias`; `fc.kernel`, `attn_l`,
`attn_r`, `bias`), kernels [in, out]. OUT.npz: `loss` (cross-entropy summed over the
training nodes) and `grad:{name}` of each parameter, in float64; `loss32` and
`grad32:{name}` the same arithmetic in float32 (the rounding float32 alone brings).

Run it in a process of its own with JAX_ENABLE_X64=1 (x64 is process-wide in JAX, so
the test process that starts it keeps float32): it refuses to run without.
"""
import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np


def segment_sum(x, segment, n):
    """[n, ...]: the rows of x summed by segment (a row per node, zero where none)."""
    return jax.ops.segment_sum(x, segment, num_segments=n)


def sage_layer(p, h, src, dst, n):
    """GraphSAGE with the mean aggregator (Hamilton et al., 2017; DGL's SAGEConv):
    h_v W_self + mean over in-edges u -> v of h_u W_neigh + b (a node without
    in-edges averages nothing: zeros)."""
    degree = segment_sum(jnp.ones(src.shape[0], h.dtype), dst, n)
    mean = segment_sum(h[src], dst, n) / jnp.maximum(degree, 1.0)[:, None]
    return h @ p["fc_self.kernel"] + mean @ p["fc_neigh.kernel"] + p["fc_neigh.bias"]


def gat_layer(p, h, src, dst, n, concat, slope):
    """GAT (Velickovic et al., 2018; DGL's GATConv, no residual): per head, W h, the
    score of u -> v LeakyReLU(a_l . W h_u + a_r . W h_v), softmax over v's in-edges,
    the weighted sum of W h_u, plus the bias; heads concatenated or averaged."""
    heads, width = p["attn_l"].shape
    feat = (h @ p["fc.kernel"]).reshape(n, heads, width)
    el = jnp.sum(feat * p["attn_l"], axis=-1)                              # [n, H]
    er = jnp.sum(feat * p["attn_r"], axis=-1)
    score = jax.nn.leaky_relu(el[src] + er[dst], slope)                    # [E, H]
    # The softmax's shift (each node's largest score) changes nothing but overflow.
    top = jax.lax.stop_gradient(jax.ops.segment_max(score, dst, num_segments=n))
    weight = jnp.exp(score - top[dst])
    alpha = weight / segment_sum(weight, dst, n)[dst]
    out = segment_sum(alpha[..., None] * feat[src], dst, n) + p["bias"].reshape(heads, width)
    return out.reshape(n, heads * width) if concat else jnp.mean(out, axis=1)


def logits(kind, params, x, src, dst, slope):
    """The layer stack: relu (GraphSAGE) or ELU (GAT) between layers, none after the
    last; GAT's hidden layers concatenate their heads, its output layer averages."""
    n = x.shape[0]
    layers = sorted({int(name.split(".")[1]) for name in params})
    h = x
    for i in layers:
        p = {name.split(".", 2)[2]: v for name, v in params.items()
             if name.startswith(f"convs.{i}.")}
        last = i == layers[-1]
        if kind == "sage":
            h = sage_layer(p, h, src, dst, n)
            h = h if last else jax.nn.relu(h)
        else:
            h = gat_layer(p, h, src, dst, n, concat=not last, slope=slope)
            h = h if last else jax.nn.elu(h)
    return h


def summed_cross_entropy(z, labels):
    """Cross-entropy of each row's logits against its label, summed over rows."""
    return jnp.sum(jax.nn.logsumexp(z, axis=1) - jnp.take_along_axis(
        z, labels[:, None], axis=1)[:, 0])


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("sage", "gat"))
    parser.add_argument("graph")
    parser.add_argument("params")
    parser.add_argument("out")
    parser.add_argument("--slope", type=float, default=0.2)
    args = parser.parse_args(argv)
    if not jax.config.jax_enable_x64:
        sys.exit("run with JAX_ENABLE_X64=1: the reference computes in float64")
    graph, weights = np.load(args.graph), np.load(args.params)
    src, dst = jnp.asarray(graph["src"]), jnp.asarray(graph["dst"])
    train = np.asarray(graph["train_idx"])
    labels = jnp.asarray(graph["label"][train])
    out = {}
    for dtype, suffix in ((np.float64, ""), (np.float32, "32")):
        x = jnp.asarray(graph["feat"], dtype)
        params = {k: jnp.asarray(weights[k], dtype) for k in weights.files}

        def loss(params, x=x):
            return summed_cross_entropy(logits(args.kind, params, x, src, dst, args.slope)[
                train], labels)
        value, grads = jax.value_and_grad(loss)(params)
        out[f"loss{suffix}"] = np.asarray(value)
        out.update({f"grad{suffix}:{k}": np.asarray(g) for k, g in grads.items()})
    np.savez(args.out, **out)


if __name__ == "__main__":
    main(sys.argv[1:])
