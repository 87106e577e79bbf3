"""Checkpoints of a training run, and the signals that ask a run to save and stop.

A checkpoint is WORKDIR/checkpoints/<step>/, written by orbax's `CheckpointManager`
(asynchronously: the arrays are copied to host memory, then written in the background
while training goes on) with three items:

- `state`: the whole `TrainState` — dense parameters, optimizer state, every embedding
  table and its sparse-optimizer state (row-sharded: each process writes the rows of
  its own devices) and the step, which with the run's seed is all its randomness;
- `best`: the parameters and embeddings of the best epoch by validation accuracy so
  far (what the final evaluation scores);
- `meta`: JSON — the loader's position (epoch, batch), the epoch's running sums, the
  metrics rows so far, the best epoch, the RNG seed and step, the resolved config and
  the partitioning it was trained on.

Orbax writes a checkpoint into a temporary folder (<step>.orbax-checkpoint-tmp) and
renames it when complete, so a half-written checkpoint is never listed; one that an
interrupted save left behind is deleted, and said so, when the run starts again. `meta`
also holds a checksum of every array (a sum of position-keyed hashes of its bits: exact,
and the same on any mesh layout), checked after restoring, so a damaged file is caught
even where orbax reads it without complaint. A checkpoint that cannot be read or fails
its checksums is reported, moved to WORKDIR/checkpoints-corrupt/ and the one before it
is used; every process of a job agrees on which. Before a save the free disk space is
checked against the checkpoint's size, and a write the disk refuses (full, read-only)
is a `CheckpointError` naming the folder.

`Checkpoints` is a context manager: leaving it, on an error too, waits for the save in
flight and closes orbax's background machinery (left running, its threads print a
traceback at interpreter shutdown, after jgraph's one-line error).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from jgraph.atomic import free_bytes
from jgraph.hashing import fmix32, hash32
from jgraph.mesh import all_processes, host_sync
from jgraph.progress import EVERY_PROCESS
from jgraph.progress import get as get_logger

CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "checkpoints-corrupt"
FORMAT = 2            # 2: one checksum table over both items


class CheckpointError(ValueError):
    """A checkpoint cannot continue this run (another config or partitioning), or none
    can be read; the message says which and what to do."""


class ModelError(CheckpointError):
    """The trained model on disk (WORKDIR/model) is unreadable, damaged (its values
    differ from its checksums) or cannot be verified; the message names it and says how
    to write it again."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a checkpoint gives back: `state` and `best` as saved (placed on this run's
    mesh), `meta` the JSON item, `step` its step."""

    step: int
    state: Any
    best: Any
    meta: dict


def abstract(tree, specs, mesh):
    """ShapeDtypeStructs of `tree` placed by `specs` (a prefix tree of PartitionSpecs)
    on `mesh`: the target orbax restores into, on any mesh layout."""
    def place(spec, sub):
        sharding = NamedSharding(mesh, spec)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                            sub)
    return jax.tree.map(place, specs, tree, is_leaf=lambda x: isinstance(x, PartitionSpec))


@jax.jit
def _checksums(leaves):
    def one(x):
        x = jnp.asarray(x)
        width = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[x.dtype.itemsize]
        bits = lax.bitcast_convert_type(x, width).astype(jnp.uint32)
        index = lax.iota(jnp.uint32, x.size).reshape(x.shape)
        return jnp.sum(fmix32(hash32(bits, index)), dtype=jnp.uint32)
    return [one(x) for x in leaves]


def checksums(tree) -> dict[str, int]:
    """{leaf path: uint32 checksum of its values} (host ints; device-side hashing)."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0]) or ((), ())
    sums = jax.device_get(_checksums(list(leaves)))
    return {jax.tree_util.keystr(p): int(v) for p, v in zip(paths, sums)}


def mismatched(saved: dict, tree) -> list[str]:
    got = checksums(tree)
    return [k for k in sorted(set(saved) | set(got)) if saved.get(k) != got.get(k)]


def read_failure(error: BaseException | None) -> str:
    """One line saying why a read failed: its innermost cause (orbax wraps TensorStore's
    precise error in a generic one followed by a page of spec)."""
    if error is None:
        return "another process could not read it"
    while error.__cause__ is not None:
        error = error.__cause__
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}"


def quiet_abandoned_reads() -> None:
    """Call after an orbax restore failed. Orbax 0.12 closes its event loop with the other
    reads still pending; later (at the latest at exit) each prints a traceback: 'Exception
    ignored in <coroutine _read_array_index_and_device_put>' and, from TensorStore's
    threads, 'RuntimeError: Event loop is closed'. Silence exactly those two."""
    previous = sys.unraisablehook
    if getattr(previous, "jgraph_quiet", False):
        return

    def hook(u) -> None:
        abandoned_read = getattr(getattr(u.object, "cr_code", None), "co_name", None) == \
            "_read_array_index_and_device_put"
        closed_loop = (u.object is None and u.exc_type is RuntimeError
                       and str(u.exc_value) == "Event loop is closed")
        if not (abandoned_read or closed_loop):
            previous(u)
    hook.jgraph_quiet = True
    sys.unraisablehook = hook


# How the disk refuses a write, in the words of the OS and of TensorStore (whose errors
# orbax passes on as ValueErrors).
_REFUSALS = ("RESOURCE_EXHAUSTED", "No space left", "Disk quota", "Read-only file system",
             "Permission denied")


@contextlib.contextmanager
def refused_writes(directory: str):
    """Turn a write the disk refuses (full, read-only, no permission) into one
    CheckpointError naming `directory`."""
    try:
        yield
    except Exception as e:
        text = f"{e} {e.__cause__ or ''}"
        if isinstance(e, OSError) or any(word in text for word in _REFUSALS):
            raise CheckpointError(f"{directory}: the disk refused the write "
                                  f"({read_failure(e)})") from None
        raise


def check_space(directory: str, tree, what: str) -> None:
    """Raise CheckpointError when the disk holding `directory` has less free space than
    this process's share of `tree` (what it writes) and a margin."""
    need = sum(shard.data.nbytes for leaf in jax.tree.leaves(tree)
               for shard in getattr(leaf, "addressable_shards", ()) if shard.replica_id == 0)
    need = int(need * 1.1) + (1 << 20)
    free = free_bytes(directory)
    if need > free:
        raise CheckpointError(f"{directory}: {what} needs about {need / 2**20:.1f} MiB and "
                              f"the disk has {free / 2**20:.1f} MiB free; free some space "
                              f"(or give the run a --workdir on another disk)")


class _PreviousSaveWait(logging.Filter):
    """Drops orbax's warning that a save waited for the one before it ("Waiting for
    previous save to complete took N seconds"): `Checkpoints.save` waits for that one
    itself and says how long in jgraph's log. absl, which orbax logs through, gives the
    root logger a stderr handler at its first record, so the warning would otherwise
    print as `WARNING:absl:...` amid a run's progress lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Waiting for previous save to complete")


@contextlib.contextmanager
def _previous_save_wait_unsaid():
    """`_PreviousSaveWait` on absl's logger for the duration (orbax logs it from the
    thread that calls save)."""
    absl = logging.getLogger("absl")
    quiet = _PreviousSaveWait()
    absl.addFilter(quiet)
    try:
        yield
    finally:
        absl.removeFilter(quiet)


class Checkpoints:
    """The checkpoints of one workdir: `save` (asynchronous), `restore_latest` (with
    fallback past unreadable ones), `steps`, `clear`; `close` (or leaving `with`) waits
    for the save in flight.

    keep: how many of the newest checkpoints to keep (older ones are deleted).
    """

    def __init__(self, workdir: str, keep: int = 3, asynchronous: bool = True, say=print):
        import orbax.checkpoint as ocp
        self.ocp = ocp
        self.workdir = os.path.abspath(workdir)
        self.directory = os.path.join(self.workdir, CHECKPOINT_DIR)
        self.say = say
        # Seconds spent: saving (until save() returns: the whole write when synchronous,
        # the copy to host memory when asynchronous), and restoring.
        self.timings = {"saves": 0, "save_seconds": 0.0, "restore_seconds": None}
        # Not orbax's cleanup_tmp_directories: it deletes them silently, in a thread
        # nothing waits for (which, at exit, prints a traceback).
        self.discard_unfinished()
        self.manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=asynchronous, create=True))
        self.closed = False

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.close()
            return
        try:                # leaving on an error: that error is the one to report
            self.close()
        except Exception as e:
            self.say(f"the checkpoint in flight was not written ({read_failure(e)})")

    def discard_unfinished(self) -> None:
        """Delete, saying so, the folders of saves that never finished (by orbax's own
        rule for what is temporary). The first process decides; the workdir lock keeps
        any other run from writing here."""
        if jax.process_index() == 0:
            for tmp in self.ocp.path.step.all_temporary_paths(self.directory):
                path = str(tmp.get())
                self.say(f"discarding {path}: the checkpoint of step {tmp.get_final().name} "
                         f"was left unfinished (its save was interrupted)")
                shutil.rmtree(path)
        host_sync("jgraph unfinished checkpoints discarded")

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, best, meta: dict, wait: bool = False) -> None:
        """Start writing checkpoint `step` (returns once the arrays are on the host, or
        once it is on disk with `wait`)."""
        ocp = self.ocp
        start = time.perf_counter()
        # The save before may still be writing (asynchronously), and orbax starts this
        # one only after it: waited for here, the wait is said once, in jgraph's log.
        self.wait()
        waited = time.perf_counter() - start
        if waited > 1:
            get_logger("train").debug("checkpoint %d waited %.1fs for the one before it to "
                                    "finish writing", step, waited)
        check_space(self.directory, {"state": state, "best": best}, f"checkpoint {step}")
        # One pass over both items (best often shares its arrays with state).
        meta = {"format": FORMAT, **meta, "checksums": checksums({"state": state, "best": best})}
        with refused_writes(self.directory), _previous_save_wait_unsaid():
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), best=ocp.args.StandardSave(best),
                meta=ocp.args.JsonSave(meta)), force=True)
            if wait:
                self.manager.wait_until_finished()
        self.timings["saves"] += 1
        self.timings["save_seconds"] += time.perf_counter() - start

    def wait(self) -> None:
        with refused_writes(self.directory):
            self.manager.wait_until_finished()

    def restore_latest(self, state_target, best_target,
                       check: Callable[[dict, str], None] | None = None) -> Restored | None:
        """The newest readable checkpoint restored into the targets (abstract trees
        from `abstract`), or None when there is none.

        `check(meta, path)` may raise `CheckpointError` for a checkpoint that belongs to
        another run; that stops the restore. An unreadable checkpoint is reported and
        moved aside, and the previous one tried.
        """
        ocp = self.ocp
        start = time.perf_counter()
        for step in reversed(self.steps()):
            path = os.path.join(self.directory, str(step))
            meta, error = None, None
            try:
                meta = self.manager.restore(step, args=ocp.args.Composite(
                    meta=ocp.args.JsonRestore()))["meta"]
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise ValueError(f"meta is not a jgraph checkpoint of format {FORMAT}")
            except Exception as e:
                error = e
                quiet_abandoned_reads()
            if all_processes(error is None):
                if check is not None:
                    check(meta, path)
                try:
                    got = self.manager.restore(step, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(state_target),
                        best=ocp.args.StandardRestore(best_target)))
                    bad = mismatched(meta["checksums"], {"state": got["state"],
                                                         "best": got["best"]})
                    if bad:
                        raise ValueError(f"restored values differ from the saved ones "
                                         f"(checksums) in {', '.join(bad[:4])}")
                except Exception as e:
                    error, got = e, None
                    quiet_abandoned_reads()
                if all_processes(error is None):
                    self.timings["restore_seconds"] = time.perf_counter() - start
                    return Restored(step, got["state"], got["best"], meta)
            self.set_aside(step, error)
        return None

    def set_aside(self, step: int, error: Exception | None) -> None:
        path = os.path.join(self.directory, str(step))
        reason = read_failure(error)
        aside = os.path.join(self.workdir, CORRUPT_DIR, str(step))
        self.say(f"checkpoint {path} is unreadable ({reason}); moved to {aside}, "
                 f"trying the one before it")
        host_sync(f"jgraph checkpoint {step} read")
        if jax.process_index() == 0:
            if os.path.exists(aside):
                shutil.rmtree(aside)
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            shutil.move(path, aside)
        host_sync(f"jgraph checkpoint {step} set aside")
        self.manager.reload()

    def clear(self) -> None:
        """Delete every checkpoint (a fresh start in the same workdir)."""
        self.manager.wait_until_finished()
        host_sync("jgraph checkpoints clear")
        if jax.process_index() == 0:
            for step in self.steps():
                self.manager.delete(step)
        host_sync("jgraph checkpoints cleared")
        self.manager.reload()

    def close(self) -> None:
        """Wait for the save in flight and stop orbax's threads (again: nothing)."""
        if not self.closed:
            self.closed = True
            try:
                with refused_writes(self.directory):
                    self.manager.wait_until_finished()
            finally:
                self.manager.close()


class StopRequest:
    """SIGINT and SIGTERM, while active, only set `requested` (the run then saves a
    checkpoint and exits); a second SIGINT interrupts at once. Outside the main
    thread signals cannot be caught and nothing is installed."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested: signal.Signals | None = None
        self.previous: dict = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def handle(self, signum, frame) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = signal.Signals(signum)
            get_logger("train").warning("  %s: saving a checkpoint after this step, then "
                                      "stopping (SIGINT to stop at once)",
                                      self.requested.name, extra=EVERY_PROCESS)
