"""Device and process setup for entry points: must run before JAX initialises its backends.

`use_devices` is what every jgraph command calls first. It joins a multi-process job
when one was started (by `python -m jgraph.launch`, SLURM's `srun` or Open MPI's
`mpirun`), then makes the asked-for number of devices available to this process.
Library code never does either: importing jgraph configures nothing.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile


class UsageError(ValueError):
    """A command-line value jgraph cannot use; reported in one line with exit status 2."""


# What `python -m jgraph.launch` sets for each process it starts (with the standard
# JAX_COORDINATOR_ADDRESS, which jax.distributed reads itself).
NUM_PROCESSES_ENV = "JGRAPH_NUM_PROCESSES"
PROCESS_ID_ENV = "JGRAPH_PROCESS_ID"

# A peer that stops answering is declared dead after this many seconds, and every
# other process then fails instead of waiting in a collective forever.
HEARTBEAT_TIMEOUT_S = 30


def use_devices(count: int | None) -> None:
    """Join the multi-process job if there is one, then make `count` devices available
    to this process.

    On CPU (no accelerator, or JAX_PLATFORMS=cpu) jgraph simulates them as host
    devices; on accelerators the mesh uses the devices that are there, and the
    partition/mesh check reports a mismatch. In a multi-process job `count` is per
    process (the launcher's --devices-per-process).
    """
    # XLA:CPU's concurrency-optimised scheduler can order the collectives inside the
    # exchange's lax.switch differently on different simulated devices, which deadlocks.
    # Must be set before JAX initialises its backends.
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    if count is not None and count < 1:
        raise UsageError(f"--devices must be >= 1, got {count}")
    with quiet_cuda_plugin(skip="jax" in sys.modules):
        import jax
    from jax._src import xla_bridge
    started = xla_bridge.backends_are_initialized()
    if count is not None and not started and jax.config.jax_num_cpu_devices < count:
        jax.config.update("jax_num_cpu_devices", count)
    start_distributed()
    # Start the backends here, where the plugin's noise is filtered; in a multi-process
    # job they wait for every process, and nothing may be held back meanwhile.
    with quiet_cuda_plugin(skip=started or distributed_env() is not None):
        jax.devices()
    # Called again in one process (tests, notebooks): never shrink what an earlier call
    # set up; meshes take the first `count` devices, so enough is all it needs.
    if count is not None and started and jax.local_device_count() < count:
        raise UsageError(f"{count} devices asked for, but JAX already started with "
                         f"{jax.local_device_count()}; run the command in a new process")


def distributed_env() -> dict | None:
    """How this process was started, if as one of several: {"launcher": name, ...} with
    the arguments jax.distributed.initialize needs (None where JAX detects them)."""
    env = os.environ
    if NUM_PROCESSES_ENV in env:
        return {"launcher": "jgraph.launch",
                "coordinator_address": env.get("JAX_COORDINATOR_ADDRESS"),
                "num_processes": int(env[NUM_PROCESSES_ENV]),
                "process_id": int(env[PROCESS_ID_ENV])}
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return {"launcher": "slurm"}
    if int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return {"launcher": "mpirun"}
    return None


def start_distributed() -> None:
    """`jax.distributed.initialize` when this process is one of a multi-process job
    (once; a single process does nothing)."""
    import jax
    found = distributed_env()
    if found is None or jax.distributed.is_initialized():
        return
    launcher = found.pop("launcher")
    if launcher == "jgraph.launch" and not found["coordinator_address"]:
        raise UsageError(f"{NUM_PROCESSES_ENV} is set but JAX_COORDINATOR_ADDRESS is not; "
                         f"start processes with `python -m jgraph.launch`")
    jax.distributed.initialize(**found, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)


# What the CUDA plugin (installed by the gpu-compile extra, to build GPU programs on any
# machine) prints on a machine without CUDA: C++ log lines when JAX is imported, and a
# traceback when JAX looks for a GPU. Neither says anything a CPU user can act on.
_PLUGIN_NOISE = ("All log messages before absl::InitializeLog() is called",
                 "cudart_stub.cc", "Could not find cuda drivers on your machine")


def _has_nvidia_gpu() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


# What the plugin's initialisation raises when there is no CUDA driver at all; other
# plugin errors (a version that does not match jax's) are kept.
_NO_CUDA = "Unable to load CUDA. Is it installed?"


class _NoCudaHere(logging.Filter):
    """Drops JAX's "Jax plugin configuration error" whose cause is that CUDA cannot be
    loaded, on machines without an NVIDIA GPU (where that is expected)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Jax plugin configuration error"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (error is not None and _NO_CUDA in str(error))


@contextlib.contextmanager
def quiet_cuda_plugin(skip: bool = False):
    """Import or start JAX without the CUDA plugin's noise on machines without CUDA.

    Its C++ lines go straight to file descriptor 2, so fd 2 is sent to a file for the
    duration and everything else written there is passed on afterwards; its Python log
    record is filtered. Nothing is hidden on a machine with an NVIDIA GPU, and nothing
    is held back where it could wait long (this wraps `import jax` and starting the
    local backends, never `jax.distributed.initialize`). skip: do nothing.
    """
    if skip or _has_nvidia_gpu():
        yield
        return
    log_filter = _NoCudaHere()
    logger = logging.getLogger("jax._src.xla_bridge")
    logger.addFilter(log_filter)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            logger.removeFilter(log_filter)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not any(noise in line for noise in _PLUGIN_NOISE):
                    sys.stderr.write(line)
            sys.stderr.flush()
