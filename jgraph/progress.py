"""Progress reporting for long host-side phases (loading, partitioning, writing)."""
from __future__ import annotations

import contextlib
import sys
import time

from tqdm import tqdm


class Progress:
    """Prints each phase and its duration to stderr; silent when disabled.

    `timings` keeps every phase's seconds, whether or not anything is printed.
    """

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.enabled:
            print(f"  {name} ...", file=self.stream, flush=True)
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start
        if self.enabled:
            print(f"  {name}: {self.timings[name]:.1f}s", file=self.stream, flush=True)

    def note(self, message: str):
        if self.enabled:
            print(f"  {message}", file=self.stream, flush=True)

    def iterate(self, iterable, desc: str, total: int | None = None, initial: int = 0):
        """A progress bar over `iterable`, drawn only on a terminal (redraws would flood
        a log file or the launcher's rank-prefixed output)."""
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        return tqdm(iterable, desc=f"  {desc}", total=total, initial=initial,
                    disable=not (self.enabled and tty), file=self.stream, leave=False,
                    dynamic_ncols=True)

