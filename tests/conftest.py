"""Test session setup: 8 simulated CPU devices, configured before JAX initialises."""
import os
from pathlib import Path

import pytest

# Entry-point configuration (never done by the library itself): JAX on the CPU with 8
# devices, so sharded code runs on a simulated 8-device mesh.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU's concurrency-optimised scheduler can order the collectives inside the
# exchange's lax.switch differently on different simulated devices, which deadlocks.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

SHARED_DATA = Path(os.environ.get("JGRAPH_SHARED_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data():
    """A function: name -> path of a dataset in ../shared/data, or skip with the reason."""
    def path(name: str) -> Path:
        p = SHARED_DATA / name
        if not p.exists():
            pytest.skip(f"dataset {name} not found at {p} (set JGRAPH_SHARED_DATA)")
        return p
    return path
