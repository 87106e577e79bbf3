"""The files of a bounded-memory partitioning job, and what it measures of itself.

`.npy` files written a block at a time: front to back through a file (`NpyAppender`),
or preallocated and written in place, in any order and by any process (`preallocate`,
`NpyRows`); neither maps the file, whose written pages would count in the process's
memory. `PhasePeak` samples a phase's peak resident memory.
"""
from __future__ import annotations

import ctypes
import functools
import os
import resource
import sys
import threading

import numpy as np


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def release_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc's `malloc_trim`), so
    that what a phase freed stops counting in the process's resident memory (freed
    blocks below glibc's rising mmap threshold stay in the heap otherwise). It cannot
    return pages of fragmented arenas: what the first of 4 processes held through every
    phase after the assignment went only with `limit_arenas`. A no-op where there is
    no glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


M_ARENA_MAX = -8       # mallopt's parameter number (glibc's malloc.h)
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> None:
    """Let glibc's malloc keep at most `arenas` arenas for the threads started from now
    on (its default: 8 per core). Call it before a job's threads start. Each arena's
    freed blocks stay in it, fragmented, and `release_memory` cannot hand them back: in
    the first of 4 processes (which hosts jax.distributed's coordination service) they
    held some 0.6 GiB more than the other processes' from the assignment on, on the
    2^21- and 2^23-node R-MATs alike; with two arenas the processes peak alike. A no-op
    where there is no glibc."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, arenas)


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt         # noqa: B018 (both must exist)
        return libc
    except (OSError, AttributeError):
        return None


def rss_bytes() -> int:
    """The process's resident memory now (Linux /proc/self/statm; elsewhere its peak
    so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


class PhasePeak:
    """A phase's peak RSS, sampled every `interval` seconds by a thread (Linux
    /proc/self/statm; elsewhere the process's peak so far). Sampling leaves the kernel's
    own peak alone, so `/usr/bin/time -v` still reports the whole job's."""

    current: PhasePeak | None = None      # the phase being sampled, if any

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak = interval, rss_bytes()
        self.recent = self.peak                # the peak since `since_last` last asked
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            now = rss_bytes()
            self.peak, self.recent = max(self.peak, now), max(self.recent, now)

    def since_last(self) -> int:
        """The peak since the last call (or the phase's start): what a step between
        two log lines held at most."""
        now = rss_bytes()
        recent, self.recent = max(self.recent, now), now
        return recent

    @classmethod
    def add_child(cls, peak: int) -> None:
        """Count a child process's peak `peak` (bytes) as held beside this process's
        memory now, in the phase being sampled (if any)."""
        phase = cls.current
        if phase is not None:
            now = rss_bytes() + peak
            phase.peak, phase.recent = max(phase.peak, now), max(phase.recent, now)

    def __enter__(self) -> PhasePeak:
        self._thread.start()
        PhasePeak.current = self
        return self

    def __exit__(self, *exc) -> None:
        PhasePeak.current = None
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class NpyAppender:
    """A .npy file of known shape written front to back, a block at a time, through a
    file rather than a memory map (a map's written pages count in the process's RSS
    until it is closed). `append` takes the next rows; `close` checks they filled it."""

    def __init__(self, path: str, dtype, shape: tuple[int, ...]):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), tuple(shape)
        self.rows = 0
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                        "fortran_order": False, "shape": self.shape})

    def append(self, values: np.ndarray, at: int | None = None) -> None:
        """The next rows; `at` (optional): the row they must start at."""
        if at is not None and at != self.rows:
            raise RuntimeError(f"{self.path}: rows from {at} written after {self.rows}")
        values = np.ascontiguousarray(values, self.dtype)
        self.file.write(values.tobytes())
        self.rows += values.shape[0] if values.ndim else 1

    def close(self) -> None:
        self.file.close()
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.path}: {self.rows} rows written of {self.shape[0]}")


def gather(path: str, ids: np.ndarray, rows_per_read: int = 1 << 20) -> np.ndarray:
    """values[ids] of the 1-D .npy file at `path`, `ids` ascending, read a block of rows
    at a time rather than memory-mapped: ids spread over the whole file would keep every
    page of a mapping resident (8 bytes a node of the graph for int64), a block holds
    `rows_per_read` rows."""
    ids = np.asarray(ids, np.int64)
    whole = np.load(path, mmap_mode="r")
    dtype, offset, total = whole.dtype, whole.offset, whole.shape[0]
    del whole
    out = np.empty(ids.size, dtype)
    cuts = np.searchsorted(ids, np.arange(0, total + rows_per_read, rows_per_read))
    with open(path, "rb") as f:
        for b in np.flatnonzero(np.diff(cuts)):
            first = int(b) * rows_per_read
            f.seek(offset + first * dtype.itemsize)
            block = np.fromfile(f, dtype, min(rows_per_read, total - first))
            out[cuts[b]:cuts[b + 1]] = block[ids[cuts[b]:cuts[b + 1]] - first]
    return out


def preallocate(path: str, dtype, shape: tuple[int, ...]) -> None:
    """A .npy file of `shape` whose rows are written later, in any order and by any
    process (`write_rows`): its header, then its full length unwritten (sparse)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                "fortran_order": False, "shape": tuple(shape)})
        f.truncate(f.tell() + np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))


class NpyRows:
    """A preallocated .npy file (`preallocate`) open for writing rows in place."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            read = (np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(f) == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(f)
            self.offset = f.tell()
        self.path, self.shape, self.dtype = path, shape, dtype
        self.row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        self.fd = os.open(path, os.O_WRONLY)

    def write(self, at: int, values: np.ndarray) -> None:
        """Rows [at, at + len(values))."""
        values = np.ascontiguousarray(values, self.dtype)
        rows = values.shape[0] if values.ndim else 1
        if at < 0 or at + rows > self.shape[0]:
            raise RuntimeError(f"{self.path}: rows [{at}, {at + rows}) past its "
                               f"{self.shape[0]}")
        data = memoryview(values.reshape(-1).view(np.uint8))
        offset = self.offset + at * self.row_bytes
        while data.nbytes:
            done = os.pwrite(self.fd, data, offset)
            data, offset = data[done:], offset + done

    def close(self) -> None:
        os.close(self.fd)
