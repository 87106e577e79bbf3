"""A run's working directory: checked before anything is written, held by one run at a
time, and left as the run found it when the run fails before it trains.

`jgraph train` writes its partition, checkpoints, logs and model into WORKDIR. Two runs
on one workdir would interleave their logs and delete each other's checkpoints, so the
first takes an exclusive lock on WORKDIR/.lock (an advisory `flock`, released by the
kernel when the process ends, however it ends: a killed run never leaves a stale lock)
and a second is refused with the first's process id. A run removes the lock file when
it ends, so a workdir holds one only while a run uses it (or after a run was killed).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time

LOCK_FILE = ".lock"


class WorkdirError(ValueError):
    """A workdir that cannot be used: not a directory, not writable, or in use."""


def default_workdir(source, name: str) -> str:
    """Where a run writes unless told: runs/<the config file's name, without .yaml>
    for a config read from a file (`source`, a path), else runs/<config.name>."""
    if isinstance(source, (str, os.PathLike)):
        name = os.path.splitext(os.path.basename(os.fspath(source)))[0]
    return os.path.join("runs", name)


def prepare(workdir: str) -> str:
    """Create `workdir` if needed and check that it is a writable directory; returns it."""
    if any(c in workdir for c in "*?["):
        # Orbax finds checkpoints with glob patterns built from the path.
        raise WorkdirError(f"workdir {workdir} contains * ? or [, which the checkpoint "
                           f"writer reads as a pattern; choose a name without them")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise WorkdirError(f"workdir {workdir} exists and is not a directory")
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise WorkdirError(f"workdir {workdir} is not writable ({e.strerror})") from None
    return workdir


class WorkdirLock:
    """Held while a run uses `workdir`: `with WorkdirLock(workdir): ...`.

    Raises WorkdirError on entry when another process holds it, naming that process.
    Leaving removes the lock file (while still holding it: a run that opened the file
    meanwhile finds it gone from the path and takes a new one). enabled=False (the
    other processes of a multi-process job, whose first process holds it for all)
    makes it do nothing.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.enabled = enabled
        self.file = None

    def __enter__(self) -> WorkdirLock:
        if not self.enabled:
            return self
        while True:
            file = open(self.path, "a+")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                raise WorkdirError(
                    f"workdir {os.path.dirname(self.path)} is in use by {holder}; wait for "
                    f"that run to finish, or give this one another --workdir") from None
            if _is_at(file, self.path):
                break
            file.close()          # locked a file a finishing run had just removed
        file.seek(0)
        file.truncate()
        file.write(f"jgraph process {os.getpid()} (since "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        file.flush()
        self.file = file
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            if _is_at(self.file, self.path):
                os.unlink(self.path)
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def _is_at(file, path: str) -> bool:
    """Whether the open `file` is the one at `path` now."""
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


class RunWorkdir:
    """`with RunWorkdir(workdir) as held: ...; held.training(); ...`: `prepare`, then
    `WorkdirLock` for the whole run, and what a failed run leaves.

    A run that fails before it trains (before `training()`: a config error found once
    the workdir was made, a failure opening, building or compiling the run) in a
    workdir it made, or found empty, removes everything it wrote there (and the
    workdir, if it made it): a failed attempt leaves nothing that looks like a run.
    Anything else a failed run wrote stays (the earlier run's files of a workdir that
    held them; the logs of a run that trained, which say how it failed), but for the
    directories it made and left empty (`checkpoints/` before the first checkpoint).

    enabled=False (the other processes of a multi-process job): `prepare` only; the
    first process holds the workdir and tidies it for all.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.workdir = workdir
        self.lock = WorkdirLock(workdir, enabled)
        self.before: set[str] | None = None      # its entries when the run began
        self.trained = False

    def __enter__(self) -> RunWorkdir:
        if os.path.isdir(self.workdir):
            self.before = set(os.listdir(self.workdir)) - {LOCK_FILE}
        prepare(self.workdir)
        self.lock.__enter__()
        return self

    def training(self) -> None:
        """The run starts training: from here on, what it writes is kept if it fails."""
        self.trained = True

    def __exit__(self, kind, error, trace) -> None:
        held = self.lock.file is not None
        fresh = not self.before and held and kind is not None and not self.trained
        try:
            if held and kind is not None:
                self._remove_made(everything=fresh)
        finally:
            self.lock.__exit__(kind, error, trace)
        if fresh and self.before is None:
            with contextlib.suppress(OSError):      # not empty: another run began there
                os.rmdir(self.workdir)

    def _remove_made(self, everything: bool) -> None:
        """Remove the entries this run made (everything), or those of them that are
        empty directories."""
        for name in sorted(set(os.listdir(self.workdir)) - (self.before or set())
                           - {LOCK_FILE}):
            path = os.path.join(self.workdir, name)
            # Tidying never hides the error that stopped the run.
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    if everything:
                        shutil.rmtree(path)
                    elif not os.listdir(path):
                        os.rmdir(path)
                elif everything:
                    os.unlink(path)
