"""Progress reporting for long host-side phases (loading, partitioning, writing)."""
from __future__ import annotations

import contextlib
import logging
import sys
import time

from tqdm import tqdm

from jgraph import logs


class Progress:
    """Says each phase and its duration, and notes along the way: INFO records of the
    `jgraph` logger (`jgraph.logs`), or lines on `stream` where one is given; silent
    when disabled. Progress bars (`iterate`) are drawn on stderr's terminal.

    `timings` keeps every phase's seconds, whether or not anything is said.
    """

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream
        self.timings: dict[str, float] = {}
        if enabled and stream is None:
            logs.setup()

    @contextlib.contextmanager
    def phase(self, name: str):
        self.note(f"{name} ...")
        start = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - start
        self.note(f"{name}: {self.timings[name]:.1f}s")

    def note(self, message: str):
        self._say(logging.INFO, message)

    def detail(self, message: str):
        """A note for `--verbose` only (DEBUG), or on `stream` where one is given."""
        self._say(logging.DEBUG, message)

    def _say(self, level: int, message: str):
        if not self.enabled:
            return
        if self.stream is not None:
            print(f"  {message}", file=self.stream, flush=True)
        else:
            logs.LOGGER.log(level, "  %s", message)

    def meter(self, desc: str, total: float = 0, unit: str = "",
              interval: float = 10.0) -> Meter:
        """A `Meter` for a long pass of `total` units (edges, rows)."""
        return Meter(self, desc, total, unit, interval)

    def iterate(self, iterable, desc: str, total: int | None = None, initial: int = 0):
        """A progress bar over `iterable`, drawn only on a terminal (redraws would flood
        a log file or the launcher's rank-prefixed output)."""
        stream = self.stream or sys.stderr
        tty = hasattr(stream, "isatty") and stream.isatty()
        return tqdm(iterable, desc=f"  {desc}", total=total, initial=initial,
                    disable=not (self.enabled and tty and logs.LOGGER.isEnabledFor(logging.INFO)),
                    file=stream, leave=False, dynamic_ncols=True)



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
