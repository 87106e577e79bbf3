"""A run's working directory: checked before anything is written, and held by one run
at a time.

`jgraph train` writes its partition, checkpoints, logs and model into WORKDIR. Two runs
on one workdir would interleave their logs and delete each other's checkpoints, so the
first takes an exclusive lock on WORKDIR/.lock (an advisory `flock`, released by the
kernel when the process ends, however it ends: a killed run never leaves a stale lock)
and a second is refused with the first's process id.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time

LOCK_FILE = ".lock"


class WorkdirError(ValueError):
    """A workdir that cannot be used: not a directory, not writable, or in use."""


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
    enabled=False (the other processes of a multi-process job, whose first process
    holds it for all) makes it do nothing.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.enabled = enabled
        self.file = None

    def __enter__(self) -> WorkdirLock:
        if not self.enabled:
            return self
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
        file.seek(0)
        file.truncate()
        file.write(f"jgraph process {os.getpid()} (since "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        file.flush()
        self.file = file
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None
