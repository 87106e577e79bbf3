"""`python -m jgraph.launch`: every line comes out with its rank; the processes get the
coordinator, their ids and their devices; when one fails or is killed the launcher
names it, stops the others and exits non-zero within seconds; a command that does not
exist or is missing, cannot be executed, or a --port in use is a clear error.

Every launch here has a timeout: a launcher that hangs fails the test instead."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jgraph import launch as launch_module

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 30          # the bound on exiting after a process is killed


def launch(*args, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "jgraph.launch", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_each_process_gets_its_rank_coordinator_and_devices_and_lines_are_prefixed():
    show = ("import os; e = os.environ; print(e['JGRAPH_PROCESS_ID'], e['JGRAPH_NUM_PROCESSES'],"
            " e['JAX_NUM_CPU_DEVICES'], e['JAX_LOCAL_DEVICE_IDS'],"
            " e['JAX_COORDINATOR_ADDRESS'].startswith('127.0.0.1:'));"
            " import sys; print('to stderr', file=sys.stderr)")
    proc = launch("--num-processes", "3", "--devices-per-process", "2", "--",
                  sys.executable, "-c", show)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert lines == ["[rank 0] 0 3 2 0,1 True", "[rank 1] 1 3 2 2,3 True",
                     "[rank 2] 2 3 2 4,5 True"]
    assert sorted(line for line in proc.stderr.splitlines() if "to stderr" in line) == [
        f"[rank {r}] to stderr" for r in range(3)]


def test_a_failing_process_is_named_the_others_stopped_and_its_status_returned():
    # Rank 1 fails at once; rank 0 would sleep for ten minutes.
    script = ("import os, sys, time; r = int(os.environ['JGRAPH_PROCESS_ID']);"
              " time.sleep(0.5 if r == 1 else 600); sys.exit(3)")
    start = time.monotonic()
    proc = launch("--num-processes", "2", "--", sys.executable, "-c", script, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 3
    assert "rank 1 (pid" in proc.stderr and "exited with status 3" in proc.stderr
    assert "rank 1 failed: exiting with status 3" in proc.stderr
    assert took < LIMIT_S, took


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    script = ("import os, signal, sys, time; r = int(os.environ['JGRAPH_PROCESS_ID']);"
              " signal.signal(signal.SIGTERM, signal.SIG_IGN);"
              " time.sleep(0.5 if r == 1 else 600); sys.exit(1)")
    start = time.monotonic()
    proc = launch("--num-processes", "2", "--grace", "1", "--", sys.executable, "-c",
                  script, timeout=60)
    assert proc.returncode == 1 and "rank 1" in proc.stderr
    assert time.monotonic() - start < LIMIT_S


def test_a_command_that_does_not_exist_exits_127_naming_it():
    proc = launch("--num-processes", "2", "--", "no-such-jgraph-command")
    assert proc.returncode == 127
    assert "cannot start 'no-such-jgraph-command'" in proc.stderr


def test_a_port_in_use_is_refused_before_any_rank_starts(tmp_path, capsys):
    marker = tmp_path / "started"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = launch_module.main(["--num-processes", "2", "--port", str(port), "--",
                                   sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    assert code == 2
    assert capsys.readouterr().err == (f"jgraph.launch: port {port} is in use; choose "
                                       f"another --port or leave it out for a free one\n")
    assert not marker.exists()


def test_a_command_that_is_not_executable_exits_126_naming_it(tmp_path, capsys):
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\necho hello\n")                  # no execute permission
    assert launch_module.main(["--num-processes", "2", "--", str(job)]) == 126
    assert f"cannot start {str(job)!r}: Permission denied" in capsys.readouterr().err


def test_a_rank_that_cannot_start_stops_the_ranks_already_started(monkeypatch, capsys):
    started, real_popen = [], subprocess.Popen

    def popen(command, **kwargs):
        if started:         # rank 1: as if the command vanished after rank 0 started
            raise FileNotFoundError(2, "No such file or directory", command[0])
        started.append(real_popen(command, **kwargs))
        return started[0]
    monkeypatch.setattr(launch_module.subprocess, "Popen", popen)
    start = time.monotonic()
    code = launch_module.main(["--num-processes", "3", "--", sys.executable, "-c",
                               "import time; time.sleep(600)"])
    assert code == 127 and time.monotonic() - start < LIMIT_S
    assert "stopping the 1 process(es) already started" in capsys.readouterr().err
    assert started[0].returncode == -signal.SIGKILL                # stopped and reaped


def test_no_command_or_a_bad_count_is_a_usage_error():
    proc = launch("--num-processes", "2")
    assert proc.returncode == 2 and "no command given" in proc.stderr
    proc = launch("--num-processes", "0", "--", "true")
    assert proc.returncode == 2 and "--num-processes must be >= 1" in proc.stderr


# Two JAX processes of one job (gloo collectives on CPU), each reporting "ready" once a
# cross-process psum has run, then summing forever.
JAX_JOB = textwrap.dedent("""
    import os
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jgraph.cli.devices import use_devices
    use_devices(None)
    import jax, numpy as np
    from jgraph.sharded import REPLICATED, ROWS, make_mesh
    mesh = make_mesh()
    x = jax.make_array_from_callback((mesh.size,), jax.sharding.NamedSharding(mesh, ROWS),
                                     lambda i: np.ones(1, np.float32))
    total = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "parts"), mesh=mesh,
                                  in_specs=ROWS, out_specs=REPLICATED))
    print("ready", jax.process_index(), jax.process_count(), float(total(x)[0]), flush=True)
    while True:
        total(x).block_until_ready()
""")


@pytest.mark.slow      # starts a JAX job
def test_killing_one_process_of_a_jax_job_makes_the_launcher_exit_within_30_s_naming_it():
    proc = subprocess.Popen([sys.executable, "-m", "jgraph.launch", "--num-processes", "2",
                             "--devices-per-process", "2", "--", sys.executable, "-c",
                             JAX_JOB], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready = []
        for line in proc.stdout:
            if "] ready" in line:
                ready.append(line.split("] ")[1].strip())
                if len(ready) == 2:
                    break
        assert sorted(ready) == ["ready 0 2 4.0", "ready 1 2 4.0"], ready
        pids = dict(item.split(":") for item in
                    _launcher_line(proc.stderr, "pids").split("pids ")[1].split())
        start = time.monotonic()
        os.kill(int(pids["1"]), signal.SIGKILL)
        code = proc.wait(timeout=LIMIT_S + 30)
        took = time.monotonic() - start
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 128 + signal.SIGKILL
    assert "rank 1 (pid" in err and "was killed by SIGKILL" in err
    assert took < LIMIT_S, took
    print(f"launcher exited {took:.2f}s after the kill")
    assert _gone(int(pids["0"]))                       # the other rank was stopped


def _launcher_line(stream, word):
    for line in stream:
        if line.startswith("jgraph.launch:") and word in line:
            return line.strip()
    raise AssertionError(f"the launcher never printed a line with {word!r}")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
