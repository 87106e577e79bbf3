"""Mixed precision: with compute_dtype bfloat16 the layers' matmuls run in bfloat16,
while the parameters, their gradients, the optimizer state and the loss stay float32;
the loss and gradients agree with float32's to bfloat16's precision."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jgraph.data import load_dataset
from jgraph.models import GraphSAGE, InputEncoder, NodeClassifier
from jgraph.partition import partition_graph
from jgraph.sampling import NeighborSampler, NodeLoader
from jgraph.sharded import REPLICATED, ROWS, DistGraph, ExchangeConfig, make_mesh
from jgraph.train import NodeClassification, NodeInputs

DEVICES = 2


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cora2")
    partition_graph(load_dataset("cora"), DEVICES, "metis", str(root))
    dg = DistGraph(str(root), make_mesh(devices=jax.devices()[:DEVICES]))
    inputs = NodeInputs.of(dg)
    model = NodeClassifier(InputEncoder(inputs.widths(), ("_N",), 16, rngs=nnx.Rngs(0)),
                           GraphSAGE(1433, 32, 7, num_layers=2, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model, nnx.Param)
    f32 = NodeClassification(graphdef, optax.adam(1e-2), NeighborSampler((5, 3)),
                             NodeLoader.from_split(dg, "train", batch_size=32),
                             dg.exchange(ExchangeConfig(max_rungs=1, relay=False)),
                             inputs, labels=dg.ndata("label"), seed=3)
    return dg, f32, dataclasses.replace(f32, compute_dtype=jnp.bfloat16), params


def loss_and_grads(dg, job, params):
    def per_device(params, data, order):
        seeds, mask = job.loader.batch(order, 0)
        batch = job.fetch(data, {}, seeds, mask, jnp.int32(0))
        (loss, _), grads = jax.value_and_grad(job.batch_loss, has_aux=True)(params, {}, batch)
        return jax.lax.psum(loss, "parts"), grads
    fn = jax.jit(jax.shard_map(per_device, mesh=dg.mesh,
                               in_specs=(REPLICATED, job.data_specs(dg.graph), ROWS),
                               out_specs=(REPLICATED, REPLICATED)))
    args = (params, job.data(dg.graph), job.loader.epoch_order(0))
    return fn(*args), fn.lower(*args).as_text()


@pytest.mark.slow      # two gradient programs
def test_bf16_computes_the_layers_in_bf16_and_keeps_float32_parameters_and_loss(jobs):
    dg, f32, bf16, params = jobs
    (loss32, grads32), text32 = loss_and_grads(dg, f32, params)
    (loss16, grads16), text16 = loss_and_grads(dg, bf16, params)
    assert "bf16" not in text32
    # The layers' matmuls: those with the feature width (1433) or the hidden width (32)
    # in their operands (others count ids in blocks of 64, see `running_count`).
    dots = [line for line in text16.splitlines() if "dot_general" in line
            and ("x1433x" in line or "1433xf" in line or "x32xf" in line or "32x" in line)]
    assert dots and all("bf16" in line.split(":")[-1] for line in dots), dots
    assert loss16.dtype == jnp.float32
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads16))
    assert float(loss16) == pytest.approx(float(loss32), rel=2e-2)
    # bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 = 0.2% per value), and
    # a gradient is a bfloat16 sum over the batch's rows (rounding errors of a few
    # hundred terms add up to a few percent): each gradient agrees within 5% in norm.
    for a, b in zip(jax.tree.leaves(grads16), jax.tree.leaves(grads32)):
        assert float(jnp.linalg.norm(a - b)) <= 0.05 * float(jnp.linalg.norm(b))


@pytest.mark.slow        # 8 s of compiles
def test_a_bf16_training_step_updates_float32_parameters(jobs):
    dg, _, bf16, params = jobs
    state = bf16.init(params)
    step = bf16.compile_train(dg.graph)
    new, metrics = step(state, bf16.data(dg.graph), bf16.loader.epoch_order(0),
                        jnp.int32(0), bf16.stop_votes())
    assert bool(metrics["applied"]) and np.isfinite(float(metrics["loss"]))
    leaves = jax.tree.leaves(new.params)
    assert all(x.dtype == jnp.float32 for x in leaves)
    assert any(not np.allclose(a, b) for a, b in zip(leaves, jax.tree.leaves(params)))
