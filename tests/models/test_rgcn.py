"""R-GCN layers against a numpy reference that loops over each node's real neighbours
(no padding, no masks), using the module's own parameters; and the window property
(reduce over disjoint slot ranges, merge, update == one call) that layer-wise inference
relies on, for SAGEConv and RelGraphConv."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jgraph.models import (
    RGCN,
    Aggregator,
    Decomposition,
    Neighbourhood,
    Norm,
    OneHotRelGraphConv,
    RelGraphConv,
    SAGEConv,
    gather_neighbours,
    one_hot_width,
)

IN, OUT, RELS, N_DST, N_SRC, WIDTH = 6, 4, 5, 12, 30, 4


def random_neighbourhood(rng, n_src, n_dst, width, num_relations):
    nbr = rng.integers(0, n_src, (n_dst, width)).astype(np.int32)
    etype = rng.integers(0, num_relations, (n_dst, width)).astype(np.int32)
    mask = rng.random((n_dst, width)) < 0.6
    mask[0] = False                                 # a node with no neighbour
    mask[1] = True                                  # a node with every slot filled
    return np.where(mask, nbr, -1), mask, np.where(mask, etype, -1).astype(np.int32)


def f64(param):
    return np.asarray(param[...], np.float64)


def relation_weights(conv: RelGraphConv) -> np.ndarray:
    """[R, in, out]: W_r built the textbook way from the module's parameters."""
    if conv.decomposition is Decomposition.BASIS:
        bases = f64(conv.bases)
        if conv.per_relation:
            return bases
        return np.einsum("rb,bio->rio", f64(conv.coef), bases)
    blocks = f64(conv.blocks)                       # [R, B, in/B, out/B]
    r, b, fi, fo = blocks.shape
    weights = np.zeros((r, b * fi, b * fo))
    for rel in range(r):
        for k in range(b):
            weights[rel, k * fi:(k + 1) * fi, k * fo:(k + 1) * fo] = blocks[rel, k]
    return weights


def reference(conv: RelGraphConv, h_src, nbr, mask, etype):
    h_src = np.asarray(h_src, np.float64)
    weights = relation_weights(conv)
    out = []
    for i in range(nbr.shape[0]):
        row = np.zeros(weights.shape[2])
        slots = np.flatnonzero(mask[i])
        for w in slots:
            message = h_src[nbr[i, w]] @ weights[etype[i, w]]
            if conv.norm is Norm.RELATION:     # c_{i,r}: neighbours of i along r
                message /= np.sum(etype[i, slots] == etype[i, w])
            row += message
        if conv.norm is Norm.NODE:
            row /= max(len(slots), 1)
        if conv.fc_self is not None:
            row += h_src[i] @ f64(conv.fc_self.kernel)
        if conv.bias is not None:
            row += f64(conv.bias)
        out.append(row)
    return np.stack(out)


CONFIGS = {
    "basis3": dict(decomposition=Decomposition.BASIS, num_bases=3),
    "basis0": dict(decomposition=Decomposition.BASIS, num_bases=0),
    "block2": dict(decomposition=Decomposition.BLOCK, num_bases=2),
}


@pytest.mark.slow      # a per-node numpy loop
@pytest.mark.parametrize("norm", list(Norm))
@pytest.mark.parametrize("self_loop", [True, False], ids=["self_loop", "no_self_loop"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_rgcn_layer_equals_the_per_node_numpy_reference(config, self_loop, norm):
    rng = np.random.default_rng(0)
    conv = RelGraphConv(IN, OUT, RELS, self_loop=self_loop, norm=norm, rngs=nnx.Rngs(1),
                        **CONFIGS[config])
    assert hasattr(conv, "coef") == (config == "basis3")   # the decomposition really used
    # The bias is initialised to zero; give it values so the reference checks it.
    conv.bias[...] = jnp.asarray(rng.standard_normal(OUT), jnp.float32)
    h_src = rng.standard_normal((N_SRC, IN)).astype(np.float32)
    nbr, mask, etype = random_neighbourhood(rng, N_SRC, N_DST, WIDTH, RELS)
    assert not mask[0].any() and mask[1].all()
    got = conv(jnp.asarray(h_src), jnp.asarray(nbr), jnp.asarray(mask), jnp.asarray(etype))
    assert got.shape == (N_DST, OUT)
    np.testing.assert_allclose(np.asarray(got), reference(conv, h_src, nbr, mask, etype),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_masked_slots_nbr_and_etype_junk_do_not_change_the_output(config):
    rng = np.random.default_rng(2)
    conv = RelGraphConv(IN, OUT, RELS, rngs=nnx.Rngs(0), **CONFIGS[config])
    h_src = jnp.asarray(rng.standard_normal((N_SRC, IN)), jnp.float32)
    nbr, mask, etype = random_neighbourhood(rng, N_SRC, N_DST, WIDTH, RELS)
    junk_nbr = np.where(mask, nbr, rng.integers(0, N_SRC, nbr.shape)).astype(np.int32)
    junk_etype = np.where(mask, etype, rng.integers(0, RELS, etype.shape)).astype(np.int32)
    clean = conv(h_src, jnp.asarray(nbr), jnp.asarray(mask), jnp.asarray(etype))
    dirty = conv(h_src, jnp.asarray(junk_nbr), jnp.asarray(mask), jnp.asarray(junk_etype))
    np.testing.assert_array_equal(np.asarray(clean), np.asarray(dirty))


WINDOW_LAYERS = {
    **{f"sage_{a.value}": (lambda a=a: SAGEConv(IN, OUT, aggregator=a, rngs=nnx.Rngs(3)))
       for a in Aggregator},
    "rgcn_basis": lambda: RelGraphConv(IN, OUT, RELS, num_bases=3, rngs=nnx.Rngs(3)),
    "rgcn_basis_node_norm": lambda: RelGraphConv(IN, OUT, RELS, num_bases=3, norm=Norm.NODE,
                                                 rngs=nnx.Rngs(3)),
    "rgcn_block": lambda: RelGraphConv(IN, OUT, RELS, decomposition=Decomposition.BLOCK,
                                       num_bases=2, rngs=nnx.Rngs(3)),
}


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("layer", list(WINDOW_LAYERS))
def test_reduce_over_two_disjoint_slot_windows_then_merge_equals_one_call(layer, split):
    rng = np.random.default_rng(4)
    conv = WINDOW_LAYERS[layer]()
    h_src = jnp.asarray(rng.standard_normal((N_SRC, IN)), jnp.float32)
    nbr, mask, etype = (jnp.asarray(a) for a in
                        random_neighbourhood(rng, N_SRC, N_DST, WIDTH, RELS))

    def partial(cols):
        nbr_p, mask_p, etype_p = nbr[:, cols], mask[:, cols], etype[:, cols]
        return conv.reduce(gather_neighbours(conv.message(h_src), nbr_p, mask_p),
                           mask_p, etype_p)

    merged = conv.merge(partial(slice(0, split)), partial(slice(split, WIDTH)))
    got = conv.update(h_src[:N_DST], merged)
    np.testing.assert_allclose(np.asarray(got), np.asarray(conv(h_src, nbr, mask, etype)),
                               rtol=1e-5, atol=1e-6)


def test_rgcn_stack_without_etype_on_a_single_relation_graph_equals_its_layers_in_order():
    rng = np.random.default_rng(5)
    model = RGCN(IN, 8, 3, num_layers=2, num_relations=1, rngs=nnx.Rngs(0))
    h = jnp.asarray(rng.standard_normal((40, IN)), jnp.float32)
    outer_nbr, outer_mask, _ = random_neighbourhood(rng, 40, 15, 3, 1)
    inner_nbr, inner_mask, _ = random_neighbourhood(rng, 15, 6, 3, 1)
    outer = Neighbourhood(jnp.asarray(outer_nbr), jnp.asarray(outer_mask))
    inner = Neighbourhood(jnp.asarray(inner_nbr), jnp.asarray(inner_mask))
    assert outer.etype is None and inner.etype is None
    got = model(h, [outer, inner])
    expected = model.convs[1](jax.nn.relu(model.convs[0](h, outer.nbr, outer.mask)),
                              inner.nbr, inner.mask)
    assert got.shape == (6, 3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)
    # etype None means relation 0 everywhere: the per-node reference with all-zero types.
    first = model.convs[0](h, outer.nbr, outer.mask)
    np.testing.assert_allclose(
        np.asarray(first),
        reference(model.convs[0], h, outer_nbr, outer_mask, np.zeros_like(outer_nbr)),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_bases", [4, 0])
def test_block_decomposition_whose_blocks_do_not_divide_the_features_raises(num_bases):
    # 6 input features: 4 blocks do not divide them; 0 blocks is no block count at all.
    with pytest.raises(ValueError, match="blocks"):
        RGCN(IN, 8, 3, num_layers=2, num_relations=RELS, decomposition=Decomposition.BLOCK,
             num_bases=num_bases, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="blocks"):
        RelGraphConv(IN, OUT, RELS, decomposition=Decomposition.BLOCK, num_bases=num_bases,
                     rngs=nnx.Rngs(0))


# -- one-hot inputs (the paper's featureless first layer) --------------------------------

def one_hot_rows(conv: RelGraphConv) -> np.ndarray:
    """Per source node j: [W_0[j] | ... | W_{R-1}[j] | W_self[j]], what a RelGraphConv on
    one-hot inputs reads (its W_r has a row per node)."""
    weights = relation_weights(conv)                # [R, n_src, out]
    rows = [weights[r] for r in range(weights.shape[0])]
    if conv.fc_self is not None:
        rows.append(f64(conv.fc_self.kernel))
    return np.concatenate(rows, axis=1).astype(np.float32)


@pytest.mark.parametrize("norm", list(Norm))
@pytest.mark.parametrize("self_loop", [True, False], ids=["self_loop", "no_self_loop"])
def test_one_hot_layer_equals_a_per_relation_rgcn_layer_on_one_hot_inputs(self_loop, norm):
    rng = np.random.default_rng(6)
    dense = RelGraphConv(N_SRC, OUT, RELS, num_bases=0, self_loop=self_loop, norm=norm,
                         rngs=nnx.Rngs(2))
    dense.bias[...] = jnp.asarray(rng.standard_normal(OUT), jnp.float32)
    sliced = OneHotRelGraphConv(OUT, RELS, self_loop=self_loop, norm=norm)
    sliced.bias[...] = dense.bias[...]
    assert sliced.in_features == (RELS + int(self_loop)) * OUT
    nbr, mask, etype = (jnp.asarray(a) for a in
                        random_neighbourhood(rng, N_SRC, N_DST, WIDTH, RELS))
    want = dense(jnp.eye(N_SRC, dtype=jnp.float32), nbr, mask, etype)
    rows = jnp.asarray(one_hot_rows(dense))
    got = sliced(rows, nbr, mask, etype)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)

    # reduce over full rows, in two windows, then merge and update: the same.
    def partial(cols):
        return sliced.reduce(gather_neighbours(sliced.message(rows), nbr[:, cols], mask[:, cols]),
                             mask[:, cols], etype[:, cols])

    merged = sliced.merge(partial(slice(0, 1)), partial(slice(1, WIDTH)))
    np.testing.assert_allclose(np.asarray(sliced.update(rows[:N_DST], merged)),
                               np.asarray(want), rtol=1e-5, atol=1e-6)


def test_one_hot_rgcn_takes_the_first_layer_width_and_rejects_any_other():
    width = one_hot_width(8, 3, num_layers=2, num_relations=RELS)
    assert width == (RELS + 1) * 8
    assert one_hot_width(8, 3, num_layers=1, num_relations=RELS, self_loop=False) == RELS * 3
    model = RGCN(width, 8, 3, num_layers=2, num_relations=RELS, one_hot_inputs=True,
                 rngs=nnx.Rngs(0))
    assert isinstance(model.convs[0], OneHotRelGraphConv)
    assert isinstance(model.convs[1], RelGraphConv)
    rng = np.random.default_rng(7)
    nbr, mask, etype = (jnp.asarray(a) for a in random_neighbourhood(rng, 20, 6, 3, RELS))
    h = jnp.asarray(rng.standard_normal((20, width)), jnp.float32)
    assert model(h, [Neighbourhood(nbr, mask, etype),
                     Neighbourhood(nbr[:2] % 6, mask[:2], etype[:2])]).shape == (2, 3)
    with pytest.raises(ValueError, match=f"slices x 8 = {width} wide, got {width - 1}"):
        RGCN(width - 1, 8, 3, num_layers=2, num_relations=RELS, one_hot_inputs=True,
             rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=f"expected {RELS + 1} slices"):
        model.convs[0](h[:, :-1], nbr, mask, etype)
