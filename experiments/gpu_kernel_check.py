"""On a GPU: the compiled Pallas draw kernel equals the XLA reference bit for bit (the
CPU tests can only run it interpreted), and how long each takes on 1M nodes.

    python experiments/gpu_kernel_check.py        # exit status 1 on any difference
"""
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jgraph.kernels.sample import draw_positions_pallas, draw_positions_reference


def nodes(rng, m, fanout):
    """(lo, deg, key) as the kernel tests draw them: degrees 0, around the fanout, up to
    3 x fanout + 5, and a few huge ones."""
    deg = rng.integers(0, 3 * fanout + 6, m)
    deg[:4] = [0, max(fanout - 1, 0), fanout, fanout + 1]
    deg[4:8] = [0, 1, 10**6, 2**31 - 2]
    lo = rng.integers(0, 10**6, m)
    lo[6:8] = 0                                     # keep lo + deg inside int32
    key = rng.integers(0, 2**32, m, dtype=np.uint64).astype(np.uint32)
    return jnp.asarray(lo.astype(np.int32)), jnp.asarray(deg.astype(np.int32)), jnp.asarray(key)


def draws(fanout, replace, pallas):
    if pallas:
        return jax.jit(functools.partial(draw_positions_pallas, fanout=fanout, replace=replace,
                                         interpret=False))
    return jax.jit(functools.partial(draw_positions_reference, fanout=fanout, replace=replace))


def median_seconds(f, *args, reps=20):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> int:
    if jax.default_backend() != "gpu":
        print(f"needs a GPU; JAX's backend is {jax.default_backend()}", file=sys.stderr)
        return 2
    print("jax", jax.__version__, jax.devices()[0].device_kind, flush=True)
    ok = True
    for fanout in (1, 3, 5, 10, 15, 25):
        for m in (37, 300, 100_003):
            for replace in (False, True):
                args = nodes(np.random.default_rng(fanout * 7 + m), m, fanout)
                expected = np.asarray(draws(fanout, replace, pallas=False)(*args))
                got = np.asarray(draws(fanout, replace, pallas=True)(*args))
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    ok = False
                    print(f"differs: fanout {fanout}, {m} nodes, replace {replace}", flush=True)
    print("kernel equals reference on GPU:", ok, flush=True)
    for fanout in (5, 15):
        args = nodes(np.random.default_rng(0), 1 << 20, fanout)
        xla = median_seconds(draws(fanout, False, pallas=False), *args)
        pallas = median_seconds(draws(fanout, False, pallas=True), *args)
        print(json.dumps({"draw": "time", "nodes": 1 << 20, "fanout": fanout,
                          "xla_ms": xla * 1e3, "pallas_ms": pallas * 1e3,
                          "speedup": xla / pallas}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
