"""Test session setup: 8 simulated CPU devices, configured before JAX initialises."""
import os
from pathlib import Path

import pytest

# Entry-point configuration (never done by the library itself): JAX on the CPU with 8
# devices, so sharded code runs on a simulated 8-device mesh.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from jgraph.cli.devices import use_devices  # noqa: E402

use_devices(8)      # also sets the XLA:CPU flag the exchange's collectives need

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
