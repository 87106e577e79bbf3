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

    def meter(self, desc: str, total: float = 0, unit: str = "",
              interval: float = 10.0) -> Meter:
        """A `Meter` for a long pass of `total` units (edges, rows)."""
        return Meter(self, desc, total, unit, interval)

    def iterate(self, iterable, desc: str, total: int | None = None, initial: int = 0):
        """A progress bar over `iterable`, drawn only on a terminal (redraws would flood
        a log file or the launcher's rank-prefixed output)."""
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        return tqdm(iterable, desc=f"  {desc}", total=total, initial=initial,
                    disable=not (self.enabled and tty), file=self.stream, leave=False,
                    dynamic_ncols=True)



def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _amount(x: float) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.{1 if x < 100 * size else 0}f}{suffix}"
    return f"{int(x)}"


class Meter:
    """Counts a long pass (edges read, rows written) and prints a line every
    `interval` seconds: what, how far, the time spent and the time left.
    `Progress.meter` makes one; silent when its progress is disabled."""

    def __init__(self, progress: Progress, desc: str, total: float, unit: str,
                 interval: float = 10.0):
        self.progress, self.desc, self.total, self.unit = progress, desc, total, unit
        self.interval = interval
        self.done = 0.0
        self.start = self.last = time.perf_counter()

    def update(self, amount: float) -> None:
        self.done += amount
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self.progress.note(self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self.start
        text = f"{self.desc}: {_amount(self.done)}"
        if self.total:
            share = self.done / self.total
            text += f" of {_amount(self.total)} {self.unit} ({share:.0%})"
            if 0 < share < 1:
                text += f", {_duration(elapsed)}, about {_duration(elapsed / share - elapsed)} left"
            else:
                text += f", {_duration(elapsed)}"
        else:
            text += f" {self.unit}, {_duration(elapsed)}"
        return text
