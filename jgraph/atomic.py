"""Directories written whole or not at all: chunked graphs, and what writes a
partition directory (`jgraph.partition.chunked`, whose work directory stages it).

A directory is written as a sibling `<out>.partial-<host>-<pid>` and renamed to `out`
once complete, so a killed write never leaves a half directory at `out`; the next write
to `out` deletes what a killed one left (a sibling whose process no longer runs).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable

# Sibling directories of `out` named `<out><marker><host>-<pid>`: a write in progress (or
# killed), and the old directory that a write with overwrite is replacing.
STAGING, REPLACED = ".partial-", ".replaced-"


def writer() -> str:
    """This process, as `<host>-<pid>`."""
    return f"{socket.gethostname()}-{os.getpid()}"


def writer_alive(name: str) -> bool:
    """Whether the process that named a directory `...-<host>-<pid>` still runs. One on
    another host counts as gone: concurrent writes to one `out` are not supported."""
    host, _, pid = name.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # alive, another user's
        return True
    return True


def free_bytes(path: str) -> int:
    """Free bytes on the disk that holds `path`, or will: its nearest existing
    ancestor's."""
    where = os.path.abspath(path)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    return shutil.disk_usage(where).free


def occupied(out: str, ours: Callable[[str], bool], what: str, overwrite: bool
             ) -> tuple[str, bool] | None:
    """What stops writing `what` (e.g. "a chunked graph directory") to `out`, as
    (reason, replaceable), or None where nothing does: `out` absent, an empty
    directory, or (with `overwrite`) a directory that `ours` recognises as `what`.
    replaceable: `out` is such a directory, which overwrite would replace; anything
    else is never replaced."""
    if os.path.exists(out) and not os.path.isdir(out):
        return "exists and is not a directory", False
    if not os.path.isdir(out) or not os.listdir(out):
        return None
    if not ours(out):
        return f"is not empty and is not {what}; refusing to replace it", False
    return None if overwrite else (f"is not empty: it is {what}", True)


@contextlib.contextmanager
def atomic_dir(out: str, check: Callable[[], None] = lambda: None):
    """Yields a new, empty sibling of `out` to write into; renames it to `out` if the
    block completes, else deletes it. First deletes what killed writes to `out` left.
    `check()` runs again just before the rename (`out` may have changed meanwhile) and
    raises to refuse it; `out` itself is replaced only if it is an empty directory or
    `check` let it through."""
    staging = staging_dir(out)
    try:
        yield staging
        check()
        publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def clear_leftovers(out: str) -> None:
    """Delete the siblings of `out` that killed writes left."""
    parent, name = os.path.split(out)
    if not os.path.isdir(parent or "."):
        return
    for entry in os.listdir(parent or "."):
        for marker in (STAGING, REPLACED):
            if entry.startswith(name + marker) and not writer_alive(entry[len(name + marker):]):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def staging_dir(out: str) -> str:
    parent = os.path.dirname(out)
    os.makedirs(parent or ".", exist_ok=True)
    clear_leftovers(out)
    staging = out + STAGING + writer()
    shutil.rmtree(staging, ignore_errors=True)      # this process's own, from an earlier call
    os.makedirs(staging)
    return staging


def publish(staging: str, out: str) -> None:
    """Rename the complete directory `staging` to `out`, replacing an empty directory
    or (checked by the caller) an older directory there."""
    if os.path.isdir(out) and not os.listdir(out):
        os.rmdir(out)
    if not os.path.exists(out):
        os.rename(staging, out)
        return
    old = out + REPLACED + writer()
    os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old)


@contextlib.contextmanager
def scratch_beside(path: str, what: str):
    """A new folder beside `path` (`.<name>.<what>-<host>-<pid>.XXXX`, on the same disk)
    for the temporary files of the job writing `path`, removed when the block ends,
    whether it succeeded or not. What killed jobs left there (their process gone) is
    deleted first; nothing else that was there before is touched."""
    where = os.path.abspath(path)
    parent = os.path.dirname(where)
    os.makedirs(parent, exist_ok=True)                      # as the output's will be
    prefix = f".{os.path.basename(where)}.{what}-"
    ours = re.compile(re.escape(prefix) + r"(.+-\d+)\.[A-Za-z0-9_]+")
    for entry in os.listdir(parent):
        left = ours.fullmatch(entry)
        # Another host's counts as alive: only this host's dead processes are known.
        if left and left[1].rpartition("-")[0] == socket.gethostname() \
                and not writer_alive(left[1]):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"{prefix}{writer()}.", dir=parent)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
