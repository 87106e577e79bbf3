"""GAT layers against DGL's `GATConv` written out per node in numpy (same parameters,
both head aggregations, with and without residual), and the softmax split into
windows against the softmax in one piece."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jgraph.models import GAT, GATConv, Neighbourhood
from jgraph.models.stack import aggregate_slots


def f64(x):
    return np.asarray(x, np.float64)


def dgl_gatconv(conv: GATConv, h_src, nbr, mask):
    """DGL's GATConv.forward for a block whose dst nodes are the first src rows:
    feat = fc(h); el = <feat, attn_l>, er = <feat, attn_r> per head; e = leaky_relu(el[u]
    + er[v]); a = softmax of e over v's in-edges; rst = sum a * feat[u]; + res_fc(h_v);
    + bias; heads concatenated or averaged."""
    H, D = conv.heads, conv.out_features
    h = f64(h_src)
    feat = (h @ f64(conv.fc.kernel[...])).reshape(-1, H, D)
    el = np.einsum("nhd,hd->nh", feat, f64(conv.attn_l[...]))
    er = np.einsum("nhd,hd->nh", feat, f64(conv.attn_r[...]))
    out = []
    for v in range(nbr.shape[0]):
        us = nbr[v][mask[v]]
        rst = np.zeros((H, D))
        if us.size:
            e = el[us] + er[v]
            e = np.where(e > 0, e, conv.negative_slope * e)                  # [k, H]
            a = np.exp(e - e.max(0))
            a = a / a.sum(0)
            rst = np.einsum("kh,khd->hd", a, feat[us])
        if conv.residual:
            res = h[v] if conv.res_fc is None else h[v] @ f64(conv.res_fc.kernel[...])
            rst = rst + res.reshape(H, D)
        if conv.bias is not None:
            rst = rst + f64(conv.bias[...]).reshape(H, D)
        out.append(rst.reshape(-1) if conv.concat else rst.mean(0))
    return np.stack(out)


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("residual,in_features", [(False, 6), (True, 6), (True, 12)])
def test_gat_layer_equals_dgls_formula(concat, residual, in_features, random_neighbourhood):
    rng = np.random.default_rng(0)
    conv = GATConv(in_features, 4, 3, concat=concat, residual=residual, rngs=nnx.Rngs(1))
    assert (conv.res_fc is None) == (not residual or in_features == 12)
    # Large inputs: scores far apart, so the softmax needs its maximum.
    h_src = (10 * rng.standard_normal((30, in_features))).astype(np.float32)
    nbr, mask = random_neighbourhood(rng, 30, 12, 5)
    got = conv(jnp.asarray(h_src), jnp.asarray(nbr), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), dgl_gatconv(conv, h_src, nbr, mask),
                               rtol=1e-4, atol=1e-4)


def _partial(conv, messages, nbr, mask, frame=None):
    m_dst = messages[:nbr.shape[0]]
    return aggregate_slots(conv.reduce, conv.merge, messages, nbr, mask,
                           context=lambda key: conv.context(m_dst, key, frame))


@pytest.mark.slow        # 16 s of compiles
def test_windowed_softmax_equals_the_whole_neighbourhoods(random_neighbourhood):
    """A hub's 64 slots cut into windows of 1 to 64 slots, merged by the running
    maximum and sum, or recomputed in the final frame and added up, give the partial
    of all 64 at once: the same layer output."""
    rng = np.random.default_rng(3)
    conv = GATConv(5, 3, 2, rngs=nnx.Rngs(0))
    h_src = jnp.asarray(20 * rng.standard_normal((80, 5)), jnp.float32)
    nbr, mask = random_neighbourhood(rng, 80, 6, 64)
    nbr, mask = jnp.asarray(nbr), jnp.asarray(mask)
    messages = conv.message(h_src)
    whole = _partial(conv, messages, nbr, mask)
    expected = conv.update(h_src[:6], whole)
    for window in (1, 7, 16, 64):
        parts = [_partial(conv, messages, nbr[:, i:i + window], mask[:, i:i + window])
                 for i in range(0, 64, window)]
        merged = parts[0]
        for p in parts[1:]:
            merged = conv.merge(merged, p)
        np.testing.assert_allclose(np.asarray(conv.update(h_src[:6], merged)),
                                   np.asarray(expected), rtol=1e-5, atol=1e-5)
        framed = [_partial(conv, messages, nbr[:, i:i + window], mask[:, i:i + window],
                           frame={"max": whole["max"]}) for i in range(0, 64, window)]
        added = jax.tree.map(lambda *xs: sum(xs), *framed)
        added["max"] = whole["max"]
        np.testing.assert_allclose(np.asarray(conv.update(h_src[:6], added)),
                                   np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_attention_dropout_drops_weights_not_the_normaliser(random_neighbourhood):
    """Without a key (evaluation) no dropout; with one, each output is a sum of the
    kept neighbours' weighted rows over 1 - rate, so its mean over draws is the
    undropped output."""
    rng = np.random.default_rng(5)
    conv = GATConv(4, 3, 2, attn_dropout=0.5, use_bias=False, rngs=nnx.Rngs(0))
    h_src = jnp.asarray(rng.standard_normal((20, 4)), jnp.float32)
    nbr, mask = (jnp.asarray(a) for a in random_neighbourhood(rng, 20, 8, 6))
    plain = np.asarray(conv(h_src, nbr, mask))
    np.testing.assert_allclose(plain, dgl_gatconv(conv, h_src, np.asarray(nbr),
                                                  np.asarray(mask)), rtol=1e-4, atol=1e-5)
    draws = jax.vmap(lambda k: conv(h_src, nbr, mask, key=k))(
        jax.random.split(jax.random.key(0), 4000))
    draws = np.asarray(draws, np.float64)
    assert not np.allclose(draws[0], plain)
    # Unbiased: every output within 5 standard errors of its mean over the draws.
    error = draws.std(0) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - plain) <= 5 * error + 1e-6)


def test_gat_model_concatenates_hidden_heads_and_averages_the_output_heads(random_neighbourhood):
    model = GAT(6, 16, 3, 2, heads=4, out_heads=2, rngs=nnx.Rngs(0))
    assert [c.concat for c in model.convs] == [True, False]
    assert [(c.heads, c.out_features) for c in model.convs] == [(4, 4), (2, 3)]
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.standard_normal((40, 6)), jnp.float32)
    hoods = [Neighbourhood(*(jnp.asarray(a) for a in random_neighbourhood(rng, 40, 20, 4))),
             Neighbourhood(*(jnp.asarray(a) for a in random_neighbourhood(rng, 20, 5, 3)))]
    out = model(h, hoods)
    assert out.shape == (5, 3)
    first = model.convs[0](h, hoods[0].nbr, hoods[0].mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(model.convs[1](
        jax.nn.elu(first), hoods[1].nbr, hoods[1].mask)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of heads"):
        GAT(6, 10, 3, 2, heads=4, rngs=nnx.Rngs(0))


@pytest.mark.slow                  # a training run
def test_gat_trains_on_sampled_blocks_by_name(tmp_path):
    """model.kind gat in sampled training (cora, 2 devices): attention over each sampled
    neighbourhood's slots, then full-graph evaluation of the same parameters."""
    from pathlib import Path

    import jgraph
    config = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
    result = jgraph.train(config, str(tmp_path), progress=False, overrides=[
        "data.num_parts=2", "train.epochs=5", "model.kind=gat", "model.heads=4",
        "model.hidden=32", "model.attn_dropout=0.3", "data.self_loops=true",
        "train.inference=full"])
    assert result["test_acc"] > 0.6     # 0.76 in 5 epochs; chance is below 0.3 (7 classes)
    assert result["config"]["model"]["kind"] == "gat"
