"""`python -m jgraph.launch`: run one command as N processes of one JAX job on this host.

    python -m jgraph.launch --num-processes 2 --devices-per-process 4 -- \\
        jgraph train experiments/sage_cora.yaml --workdir runs/cora2x4

Each process gets the coordinator address and its process id in its environment
(`JAX_COORDINATOR_ADDRESS`, `JGRAPH_NUM_PROCESSES`, `JGRAPH_PROCESS_ID`), which jgraph's
entry points pass to `jax.distributed.initialize`, and its share of the devices: M
simulated CPU devices (`JAX_NUM_CPU_DEVICES`) or GPUs [r*M, (r+1)*M)
(`JAX_LOCAL_DEVICE_IDS`). Every line a process prints comes out prefixed with its rank.

Nothing hangs. When a process exits non-zero (or is killed), the launcher names it,
stops the others (SIGTERM, then SIGKILL after --grace seconds: a job that lost a peer
cannot finish its collectives) and exits non-zero. SIGINT or SIGTERM to the launcher
is passed on to every process, which then checkpoints and exits together; a second
one kills them. A --port already in use is refused before any process starts (status 2);
a command that cannot start is named, with a shell's status (127: not found, 126: not
executable), after stopping the processes already started.

This is the local launcher. Several machines run the same command under SLURM
(`srun`) or Open MPI (`mpirun`), where JAX finds its peers itself: see launch/.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from jgraph.cli.devices import NUM_PROCESSES_ENV, PROCESS_ID_ENV
from jgraph.progress import get as get_logger
from jgraph.progress import setup as setup_logging

POLL_S = 0.05
# Exit statuses of a jgraph command that stopped on SIGINT / SIGTERM after saving.
STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_problem(port: int) -> str | None:
    """Why the coordinator could not listen on `port`, or None if it can (as far as one
    can tell before it tries: something may take the port in between)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the coordinator's server does: a port whose last connections are still in
        # TIME_WAIT (a job just ended on it) can be listened on again.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError as e:
            return "is in use" if e.errno == errno.EADDRINUSE else f"cannot be used ({e.strerror})"
    return None


def rank_env(rank: int, num_processes: int, devices: int, coordinator: str) -> dict:
    env = dict(os.environ)
    env.update({
        "JAX_COORDINATOR_ADDRESS": coordinator,
        NUM_PROCESSES_ENV: str(num_processes),
        PROCESS_ID_ENV: str(rank),
        "JAX_NUM_CPU_DEVICES": str(devices),
        "JAX_LOCAL_DEVICE_IDS": ",".join(str(rank * devices + i) for i in range(devices)),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def exit_status(code: int) -> int:
    """A shell's exit status for a child's return code (128 + N when killed by signal N)."""
    return 128 - code if code < 0 else code


class Rank:
    """One process of the job and the threads copying its output, line by line, with
    its rank in front."""

    def __init__(self, rank: int, command: list[str], env: dict, lock: threading.Lock):
        self.rank = rank
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.lock = lock
        self.copiers = [threading.Thread(target=self.copy, args=(pipe, out), daemon=True)
                        for pipe, out in ((self.proc.stdout, sys.stdout),
                                          (self.proc.stderr, sys.stderr))]
        for t in self.copiers:
            t.start()

    def copy(self, pipe, out) -> None:
        prefix = f"[rank {self.rank}] "
        # Progress bars redraw with '\r': each redraw becomes a line of its own.
        for line in iter(pipe.readline, b""):
            for part in line.replace(b"\r", b"\n").decode(errors="replace").splitlines():
                if part.strip():
                    with self.lock:
                        out.write(prefix + part + "\n")
                        out.flush()

    def signal(self, signum: int) -> None:
        """Send `signum` to the process and everything it started."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def drain(self, timeout: float = 2.0) -> None:
        for t in self.copiers:
            t.join(timeout)


class Launcher:
    def __init__(self, command, num_processes: int, devices: int, grace: float,
                 stop_timeout: float, port: int | None = None):
        self.command = command
        self.num_processes = num_processes
        self.devices = devices
        self.grace = grace
        self.stop_timeout = stop_timeout
        self.coordinator = f"127.0.0.1:{port or free_port()}"
        self.lock = threading.Lock()
        self.ranks: list[Rank] = []
        self.stopping: int | None = None     # the signal passed on to the ranks, if any

    def say(self, message: str, level: int = logging.INFO) -> None:
        with self.lock:
            get_logger("launch").log(level, "jgraph.launch: %s", message)

    def on_signal(self, signum, frame) -> None:
        if self.stopping is not None:
            self.say(f"{signal.Signals(signum).name} again: killing every process",
                     logging.WARNING)
            for r in self.ranks:
                r.signal(signal.SIGKILL)
            return
        self.stopping = signum
        self.say(f"{signal.Signals(signum).name}: passing it on to every process "
                 f"(they save a checkpoint and exit; up to {self.stop_timeout:.0f}s)")
        for r in self.ranks:
            r.signal(signum)

    def run(self) -> int:
        handlers = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            status = self.start()
            return self.supervise() if status is None else status
        finally:
            for r in self.ranks:
                r.signal(signal.SIGKILL)
                r.proc.wait()
                r.drain()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    def start(self) -> int | None:
        """Start every rank. If the command cannot start, name it and return a shell's
        status for that (127: not found; 126: not executable), leaving the ranks already
        started to `run`, which stops them."""
        for rank in range(self.num_processes):
            env = rank_env(rank, self.num_processes, self.devices, self.coordinator)
            try:
                self.ranks.append(Rank(rank, self.command, env, self.lock))
            except OSError as e:
                started = (f"; stopping the {len(self.ranks)} process(es) already started"
                           if self.ranks else "")
                self.say(f"cannot start {self.command[0]!r}: {e.strerror or e}{started}",
                         logging.ERROR)
                return 127 if isinstance(e, FileNotFoundError) else 126
        self.say(f"{self.num_processes} processes x {self.devices} device(s), coordinator "
                 f"{self.coordinator}, pids " + " ".join(
                     f"{r.rank}:{r.proc.pid}" for r in self.ranks))
        return None

    def supervise(self) -> int:
        stop_deadline = None
        while True:
            codes = [r.proc.poll() for r in self.ranks]
            failed = [(r, c) for r, c in zip(self.ranks, codes) if c not in (None, 0)]
            if self.stopping is not None:
                stop_deadline = stop_deadline or time.monotonic() + self.stop_timeout
                if all(c is not None for c in codes):
                    return exit_status(-self.stopping) if any(codes) else 0
                if time.monotonic() > stop_deadline:
                    self.say(f"processes still running {self.stop_timeout:.0f}s after "
                             f"{signal.Signals(self.stopping).name}: killing them",
                             logging.WARNING)
                    return exit_status(-self.stopping)
            elif any(c in STOPPED for c in codes):
                # A process was signalled directly, saved with the others (they vote on
                # when to stop) and exited: wait for the rest as after our own signal.
                rank = self.ranks[[c in STOPPED for c in codes].index(True)]
                self.say(f"rank {rank.rank} stopped after a checkpoint (status "
                         f"{rank.proc.returncode}); waiting for the others")
                self.stopping = rank.proc.returncode - 128
            elif failed:
                rank, code = failed[0]
                self.say(f"rank {rank.rank} (pid {rank.proc.pid}) {describe(code)}; "
                         f"stopping the other {self.num_processes - 1} process(es)",
                         logging.ERROR)
                self.stop_others(rank)
                self.say(f"rank {rank.rank} failed: exiting with status {exit_status(code)}",
                         logging.ERROR)
                return exit_status(code) or 1
            elif all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)

    def stop_others(self, failed: Rank) -> None:
        others = [r for r in self.ranks if r is not failed]
        for r in others:
            r.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in others):
            time.sleep(POLL_S)
        for r in others:
            if r.proc.poll() is None:
                r.signal(signal.SIGKILL)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jgraph.launch",
        description="Run COMMAND as NUM_PROCESSES processes of one JAX job on this host, "
                    "each with DEVICES_PER_PROCESS devices; output lines are prefixed with "
                    "the rank. If any process fails, the others are stopped and the "
                    "launcher exits non-zero naming it.",
        epilog="example: python -m jgraph.launch --num-processes 2 --devices-per-process 2 "
               "-- jgraph train experiments/sage_cora.yaml --workdir runs/cora2x2")
    parser.add_argument("--num-processes", type=int, required=True, metavar="N")
    parser.add_argument("--devices-per-process", type=int, default=1, metavar="M",
                        help="simulated CPU devices per process, or GPUs per process "
                             "(process r gets GPUs r*M .. r*M+M-1) (default 1)")
    parser.add_argument("--port", type=int,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--grace", type=float, default=5.0, metavar="S",
                        help="after a process fails, seconds the others get to exit after "
                             "SIGTERM before SIGKILL (default 5)")
    parser.add_argument("--stop-timeout", type=float, default=120.0, metavar="S",
                        help="after SIGINT/SIGTERM to the launcher, seconds the processes "
                             "get to checkpoint and exit (default 120)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command every process runs, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: put it after --, e.g. -- jgraph train CONFIG")
    if args.num_processes < 1:
        parser.error(f"--num-processes must be >= 1, got {args.num_processes}")
    if args.devices_per_process < 1:
        parser.error(f"--devices-per-process must be >= 1, got {args.devices_per_process}")
    if args.port is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port} (leave it out for a "
                     f"free one)")
    setup_logging(command=True)
    launcher = Launcher(command, args.num_processes, args.devices_per_process, args.grace,
                        args.stop_timeout, args.port)
    problem = args.port is not None and port_problem(args.port)
    if problem:
        launcher.say(f"port {args.port} {problem}; choose another --port or leave it out "
                     f"for a free one", logging.ERROR)
        return 2
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
