"""Device setup for entry points: must run before JAX initialises its backends."""
from __future__ import annotations

import os


class UsageError(ValueError):
    """A command-line value jgraph cannot use; reported in one line with exit status 2."""


def use_devices(count: int | None) -> None:
    """Make `count` devices available to the command.

    On CPU (no accelerator, or JAX_PLATFORMS=cpu) jgraph simulates them as host
    devices; on accelerators the mesh uses the devices that are there, and the
    partition/mesh check reports a mismatch.
    """
    # XLA:CPU's concurrency-optimised scheduler can order the collectives inside the
    # exchange's lax.switch differently on different simulated devices, which deadlocks.
    # Must be set before JAX initialises its backends.
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    import jax
    from jax._src import xla_bridge
    if count is None:
        return
    if count < 1:
        raise UsageError(f"--devices must be >= 1, got {count}")
    if xla_bridge.backends_are_initialized() or jax.config.jax_num_cpu_devices >= count:
        # Called again in one process (tests, notebooks): never shrink what an earlier
        # call set up; meshes take the first `count` devices, so enough is all it needs.
        if jax.device_count() < count:
            raise UsageError(f"{count} devices asked for, but JAX already started with "
                             f"{jax.device_count()}; run the command in a new process")
        return
    jax.config.update("jax_num_cpu_devices", count)
