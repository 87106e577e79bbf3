"""What jgraph says along the way: progress reporting for long host-side phases
(loading, partitioning, writing, training), and the `jgraph` logger it goes through
with its children (`jgraph.partition`, `jgraph.train`, ...), Python's `logging`.

What a command prints as its result (the JSON line of `--json`, `jgraph info`'s table)
goes to stdout with `print`; everything said along the way (phases and their seconds,
progress lines, warnings) is a log record on stderr:

  INFO     phases, progress lines, notes (what `--quiet` silences)
  DEBUG    more detail (`--verbose`)
  WARNING  what a user should look at (a balance limit not met, a run stopped early)

In a job of several processes a record is written by the first process only, unless
it is logged with `extra=EVERY_PROCESS` (what each process did itself); a process
other than the first names itself ("[process 2/4] ...") unless `jgraph.launch`
already prefixes its lines.

A program that configures `logging` itself (a handler on the root logger) receives
jgraph's records like any other library's, from every process (its handlers, not
jgraph's, decide what each process writes). Otherwise jgraph writes its own to stderr
at INFO, as its commands do; `logging.getLogger("jgraph").setLevel(...)` quiets it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

from tqdm import tqdm

LOGGER = logging.getLogger("jgraph")
EVERY_PROCESS = {"every_process": True}
"""`extra=` of a record each process writes, not only the first."""

LAUNCHED = "JGRAPH_PROCESS_ID"      # set by jgraph.launch, which prefixes each line


def _processes() -> tuple[int, int]:
    """(this process's index, the job's process count); (0, 1) before any
    `jax.distributed` job starts (read without importing JAX)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    try:
        from jax._src import distributed
        state = distributed.global_state
        if state.client is None:
            return 0, 1
        return int(state.process_id), int(state.num_processes or 1)
    except (ImportError, AttributeError):
        return 0, 1


class _JobFilter(logging.Filter):
    """Keeps a record on the first process (or on every one, with EVERY_PROCESS) and
    gives it `job`: the process's name where the line needs one."""

    def filter(self, record: logging.LogRecord) -> bool:
        index, count = _processes()
        if index and not getattr(record, "every_process", False):
            return False
        record.job = (f"[process {index}/{count}] "
                      if count > 1 and LAUNCHED not in os.environ else "")
        return True


class _Handler(logging.StreamHandler):
    """jgraph's own handler: stderr as it is when the record is written (so a test's
    or a notebook's replaced stderr receives it)."""

    def __init__(self):
        super().__init__()
        self.addFilter(_JobFilter())
        self.setFormatter(logging.Formatter("%(job)s%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_handler: _Handler | None = None


def setup(level: int | None = None, command: bool = False) -> logging.Logger:
    """Make jgraph's records visible: its handler on the `jgraph` logger at `level`
    (default INFO), unless the program has configured logging (a handler on the root
    logger: then records go there, and only an explicit `level` is set). `command`: a
    jgraph command's own process (the CLI, the launcher), whose logging is jgraph's
    whatever is configured. Returns the `jgraph` logger. Called by the CLI and by
    every entry point that reports progress."""
    global _handler
    if _handler is None and (command or not logging.getLogger().handlers):
        _handler = _Handler()
        LOGGER.addHandler(_handler)
        LOGGER.propagate = False
    if level is not None:
        LOGGER.setLevel(level)
    elif _handler is not None and LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
    return LOGGER


def level_of(quiet: bool = False, verbose: bool = False) -> int:
    """The level of `--quiet` (warnings only), `--verbose` (debug) or neither (info)."""
    return logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO


def get(name: str) -> logging.Logger:
    """The logger `jgraph.<name>`."""
    return logging.getLogger(f"jgraph.{name}")




class Progress:
    """Says each phase and its duration, and notes along the way: INFO records of the
    `jgraph` logger (above), or lines on `stream` where one is given; silent
    when disabled. Progress bars (`iterate`) are drawn on stderr's terminal.

    `timings` keeps every phase's seconds, whether or not anything is said.
    """

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream
        self.timings: dict[str, float] = {}
        if enabled and stream is None:
            setup()

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
            LOGGER.log(level, "  %s", message)

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
                    disable=not (self.enabled and tty and LOGGER.isEnabledFor(logging.INFO)),
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
