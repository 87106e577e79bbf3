"""GraphSAGE layers against a numpy reference that loops over each node's real
neighbours (no padding, no masks), using the module's own parameters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jgraph.models import Aggregator, GraphSAGE, Neighbourhood, SAGEConv


def linear(layer, x):
    out = x @ np.asarray(layer.kernel[...], np.float64)
    if layer.bias is not None:
        out = out + np.asarray(layer.bias[...], np.float64)
    return out


def reference(conv: SAGEConv, h_src, nbr, mask):
    h_src = np.asarray(h_src, np.float64)
    out = []
    for i in range(nbr.shape[0]):
        neigh = h_src[nbr[i][mask[i]]]
        h_dst = h_src[i]
        if conv.aggregator is Aggregator.MEAN:
            agg = neigh.mean(0) if len(neigh) else np.zeros_like(h_dst)
            out.append(linear(conv.fc_self, h_dst) + linear(conv.fc_neigh, agg))
        elif conv.aggregator is Aggregator.GCN:
            agg = (neigh.sum(0) + h_dst) / (len(neigh) + 1)
            out.append(linear(conv.fc_neigh, agg))
        else:
            pooled = np.maximum(linear(conv.fc_pool, neigh), 0) if len(neigh) else None
            agg = pooled.max(0) if len(neigh) else np.zeros_like(h_dst)
            out.append(linear(conv.fc_self, h_dst) + linear(conv.fc_neigh, agg))
    return np.stack(out)


@pytest.mark.parametrize("aggregator", list(Aggregator))
def test_sage_layer_equals_the_per_node_numpy_reference(aggregator, random_neighbourhood):
    rng = np.random.default_rng(0)
    conv = SAGEConv(6, 5, aggregator=aggregator, rngs=nnx.Rngs(1))
    h_src = rng.standard_normal((30, 6)).astype(np.float32)
    nbr, mask = random_neighbourhood(rng, 30, 12, 4)
    got = conv(jnp.asarray(h_src), jnp.asarray(nbr), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), reference(conv, h_src, nbr, mask),
                               rtol=1e-5, atol=1e-5)


def test_padding_slots_do_not_change_the_output(random_neighbourhood):
    """Whatever index a masked slot holds, the layer ignores it."""
    rng = np.random.default_rng(2)
    conv = SAGEConv(4, 3, rngs=nnx.Rngs(0))
    h_src = jnp.asarray(rng.standard_normal((20, 4)), jnp.float32)
    nbr, mask = random_neighbourhood(rng, 20, 8, 5)
    junk = np.where(mask, nbr, rng.integers(0, 20, nbr.shape)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(conv(h_src, jnp.asarray(nbr), jnp.asarray(mask))),
                                  np.asarray(conv(h_src, jnp.asarray(junk), jnp.asarray(mask))))


def test_graphsage_stacks_layers_in_block_order_and_checks_the_count(random_neighbourhood):
    rng = np.random.default_rng(3)
    model = GraphSAGE(4, 8, 3, num_layers=2, rngs=nnx.Rngs(0))
    h = jnp.asarray(rng.standard_normal((40, 4)), jnp.float32)
    outer = Neighbourhood(*[jnp.asarray(a) for a in random_neighbourhood(rng, 40, 15, 3)])
    inner = Neighbourhood(*[jnp.asarray(a) for a in random_neighbourhood(rng, 15, 6, 3)])
    got = model(h, [outer, inner])
    expected = model.convs[1](jax.nn.relu(model.convs[0](h, *outer)), *inner)
    assert got.shape == (6, 3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)
    with pytest.raises(ValueError, match="1 blocks for a 2-layer model"):
        model(h, [outer])
