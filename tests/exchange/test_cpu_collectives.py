"""The exchange must not deadlock on the 8 simulated CPU devices the tests run on.

Run in a child process with a watchdog, because a deadlocked XLA:CPU collective never
returns (and after a while aborts the whole process). Seen with XLA:CPU's default
concurrency-optimized scheduler: collectives nested in the exchange's capacity
`lax.switch` and the independent counters' `psum` ran in different orders on different
devices (some devices waiting in an all-to-all, the others in an all-reduce).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ITERATIONS = 200
WATCHDOG_S = 45

CHILD = textwrap.dedent(f"""
    import faulthandler, os
    faulthandler.dump_traceback_later({WATCHDOG_S}, exit=True)   # a deadlock: exit 1
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np
    from jgraph.sharded import REPLICATED, ROWS, Exchange, ExchangeConfig, make_mesh

    offsets = np.cumsum([0, 5, 0, 12, 7, 70, 3, 9, 16])
    # all_to_all. The gather's capacity of 8 (calibrated) takes rounds: collectives in a
    # loop; the scatter_add's (bound) is 24, a ladder of two rungs.
    n = 24
    exchange = Exchange(offsets, capacities={{n: 8}})
    bound = Exchange(offsets, ExchangeConfig(sizing="bound"))

    def body(ids, valid, values):
        rows, gathered = exchange.gather(ids, valid, lambda q, m: q)
        (_, sums, _), scattered = bound.scatter_add(ids, valid, values)
        return rows, sums, gathered, scattered

    step = jax.jit(jax.shard_map(body, mesh=make_mesh(8), in_specs=(ROWS,) * 3,
                                 out_specs=(ROWS, ROWS, REPLICATED, REPLICATED)))
    rng = np.random.default_rng(0)
    pool = rng.choice(int(offsets[-1]), 30, replace=False)
    for i in range({ITERATIONS}):
        ids = rng.choice(pool, 8 * n).astype(np.int32)
        valid = rng.random(8 * n) < 0.85
        values = rng.normal(size=(8 * n, 4)).astype(np.float32)
        rows, _, gathered, scattered = step(ids, valid, values)
        assert np.array_equal(np.asarray(rows), np.where(valid, ids, 0))
        assert int(scattered.overflow) == 0 and int(gathered.overflow) == 0
    print("completed", i + 1)
""")


@pytest.mark.slow        # processes with their own JAX: 10 s
def test_repeated_exchange_steps_complete_without_a_collective_deadlock():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=dict(os.environ),
                          capture_output=True, text=True, timeout=WATCHDOG_S + 60, check=False)
    stuck = [line for line in proc.stderr.splitlines() if "may be stuck" in line][:4]
    assert proc.returncode == 0 and f"completed {ITERATIONS}" in proc.stdout, (
        f"exit {proc.returncode}; stuck collectives: {stuck or 'none reported'}; "
        f"stderr tail: {proc.stderr[-1500:]}")
