"""`jgraph.cost`: the collective bytes read from a compiled program equal what its
collectives deliver (a conditional counts its costliest branch, a loop body once), and
the roofline's terms equal the seconds worked by hand from the figures it is given."""
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
COSTS = dict(flops=2000.0, bytes_accessed=300.0)


# Worked by hand. A step of 2000 flops at 500 tf32 flop/s computes for 4.0 s; its 300
# bytes at 100 B/s are a 3.0 s memory estimate. Its all_to_all delivers `moved` bytes to
# each device, an equal share from each of its P - 1 peers, and the two kinds of link
# carry their shares at once, so the slower share is the network's time:
#  - 8 devices, one host: all 7 peers over NVLink, 30 B / 10 B/s = 3.0 s < 4.0 s of
#    compute; 50 B: 5.0 s, and the network bounds the step.
#  - 16 devices, 2 hosts: of 15 peers, 7 on the host (14 of 30 B, 1.4 s at 10 B/s) and
#    8 on the other (16 B at 1 B/s: 16.0 s).
#  - 64 devices, 8 hosts: of 63 peers, 7 on the host (30 x 7/63 = 10/3 B, 1/3 s) and 56
#    on other hosts (30 x 56/63 = 80/3 B at 1 B/s: 80/3 s).
@pytest.mark.parametrize("devices,moved,network,bound_by", [
    (8, 30, 3.0, "compute"), (8, 50, 5.0, "network"), (16, 30, 16.0, "network"),
    (64, 30, 80 / 3, "network")])
def test_roofline_is_the_slower_of_compute_and_the_network_worked_by_hand(
        devices, moved, network, bound_by):
    costs = Costs(**COSTS, collective_bytes={"all-to-all": moved})
    got = roofline(costs, PEAKS, devices, "tf32", steps_per_epoch=10)
    step = 4.0 if bound_by == "compute" else network
    assert got["compute_seconds"] == pytest.approx(4.0)
    assert got["network_seconds"] == pytest.approx(network)
    assert got["memory_seconds_estimate"] == pytest.approx(3.0)
    assert got["step_seconds_lower_bound"] == pytest.approx(step)
    assert got["epoch_seconds_lower_bound"] == pytest.approx(10 * step)
    assert got["bound_by"] == bound_by
    assert got["lower_bound"] is True and got["compute_dtype"] == "tf32"


def test_roofline_computes_at_the_peak_of_the_dtype_it_is_given():
    """bf16 matmuls: 2000 flops at 1000 flop/s are 2.0 s, above the 1.0 s that 10 B
    take over NVLink on one host."""
    costs = Costs(**COSTS, collective_bytes={"all-gather": 10})
    got = roofline(costs, PEAKS, 4, "bf16", steps_per_epoch=3)
    assert got["compute_seconds"] == pytest.approx(2.0)
    assert got["network_seconds"] == pytest.approx(1.0)
    assert got["epoch_seconds_lower_bound"] == pytest.approx(6.0)
    assert got["bound_by"] == "compute" and got["compute_dtype"] == "bf16"
