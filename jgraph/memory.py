"""What a process measures of its own memory, and what it hands back.

The resident memory now (`rss_bytes`) and at its peak (`peak_rss_bytes`), a phase's
peak sampled by a thread (`PhasePeak`), freed pages handed back to the system
(`release_memory`) and glibc's malloc arenas limited (`limit_arenas`). The bounded-memory
jobs (partitioning, conversion, `jgraph embed`) and the benchmarks report and plan by
these numbers.
"""
from __future__ import annotations

import ctypes
import functools
import os
import resource
import sys
import threading


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
    /proc/self/statm; elsewhere the process's peak so far), and its RSS at the start
    (`start`). Sampling leaves the kernel's
    own peak alone, so `/usr/bin/time -v` still reports the whole job's."""

    current: PhasePeak | None = None      # the phase being sampled, if any

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak = interval, rss_bytes()
        self.start = self.peak                 # what the process held as the phase began
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
