"""`jgraph.cost`: the collective bytes read from a compiled program equal what its
collectives deliver (a conditional counts its costliest branch, a loop body once), and
the roofline's terms are the plain arithmetic of the figures it is given."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from jgraph.cost import Costs, Peaks, collective_bytes, roofline

P = 4


def compiled(fn, *args):
    mesh = Mesh(np.array(jax.devices()[:P]), ("parts",))
    spec = PartitionSpec("parts")
    step = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * len(args),
                                 out_specs=PartitionSpec(), check_vma=False))
    return step.lower(*args).compile()


def test_collective_bytes_are_what_each_collective_delivers():
    """all_gather of f32[8, 3] per device delivers [P * 8, 3]; psum of f32[5] its 5
    values; a cond's branches move 16 or 64 int32 rows (the larger counts); a
    fori_loop's body is counted once."""
    def fn(x, ids):
        rows = lax.all_gather(x, "parts", tiled=True)                  # 4 * 8 * 3 * 4 B
        total = lax.psum(jnp.sum(rows, axis=0)[:2].sum() + jnp.zeros(5), "parts")  # 20 B
        small = lambda i: lax.all_to_all(i[:16].reshape(P, 4), "parts", 0, 0).sum()
        large = lambda i: lax.all_to_all(i[:64].reshape(P, 16), "parts", 0, 0).sum()
        moved = lax.cond(ids[0] > 0, small, large, ids)                # 64 * 4 B
        looped = lax.fori_loop(0, ids[1], lambda _, c: c + lax.ppermute(
            c, "parts", [(k, (k + 1) % P) for k in range(P)]), jnp.ones(7))  # 7 * 4 B
        return total.sum() + moved + looped.sum()

    program = compiled(fn, jnp.ones((P * 8, 3)), jnp.arange(P * 64, dtype=jnp.int32))
    got = collective_bytes(program.as_text())
    assert got["all-gather"] == P * 8 * 3 * 4
    assert got["all-to-all"] == 64 * 4
    assert got["collective-permute"] == 7 * 4
    # The psum, and the one XLA adds to replicate the output, are all-reduces of scalars
    # or 5 values: at least the 20 bytes of the psum.
    assert got["all-reduce"] >= 20
    assert Costs.of(program).network_bytes == sum(got.values())


def test_cost_analysis_counts_a_matmul_s_flops():
    def fn(a, b):
        return lax.psum(jnp.sum(a @ b.T), "parts")
    costs = Costs.of(compiled(fn, jnp.ones((P * 32, 64)), jnp.ones((P * 16, 64))))
    assert costs.flops >= 2 * 32 * 16 * 64


PEAKS = Peaks({"bf16": 1000.0, "tf32": 500.0}, memory=100.0, intra_host=10.0,
              inter_host=1.0, per_host=8, network="test link")


@pytest.mark.parametrize("devices,moved,remote", [(8, 30, 0.0), (8, 50, 0.0),
                                                  (64, 30, 56 / 63)])
def test_roofline_is_the_larger_of_compute_and_network(devices, moved, remote):
    """One host: every peer over NVLink; 8 hosts: 56 of the 63 peers over the network."""
    costs = Costs(flops=2000.0, bytes_accessed=300.0, collective_bytes={"all-to-all": moved})
    got = roofline(costs, PEAKS, devices, "tf32", steps_per_epoch=10)
    network = max(moved * (1 - remote) / 10.0, moved * remote / 1.0)
    assert got["compute_seconds"] == 4.0 and got["network_seconds"] == pytest.approx(network)
    assert got["memory_seconds_estimate"] == 3.0
    assert got["step_seconds_lower_bound"] == pytest.approx(max(4.0, network))
    assert got["epoch_seconds_lower_bound"] == pytest.approx(10 * max(4.0, network))
    assert got["bound_by"] == ("network" if network > 4.0 else "compute")
    assert got["lower_bound"] is True
