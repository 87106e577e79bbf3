"""jgraph's messages: the `jgraph` logger and its children (`jgraph.partition`,
`jgraph.train`, ...), through Python's `logging`.

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

import logging
import os
import sys

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
