"""Small frictions a new user met, fixed: --version, help without "(default: None)",
`jgraph info` on a training workdir pointing at its partition, `jgraph eval` and `jgraph
embed` using the run's device count (a partition directory's too), a failed `jgraph
train` leaving no half-made run, no absl warnings amid a run's lines, and `jgraph
partition --help` stating the budgets the code uses."""
import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from orbax.checkpoint import checkpoint_manager

from jgraph.cli import main
from jgraph.cli.main import build_parser
from jgraph.cli.train import run_devices
from jgraph.partition.chunked import coarse_limit, range_limit

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# sage_cora.yaml made tiny: one epoch of a few steps. A partition directory keeps the
# preparation it was written with: `jgraph partition` without --normalize-features.
TINY = ["train.epochs=1", "model.hidden=8", "train.batch_size=64", "train.fanouts=[5,5]",
        "train.eval_fanouts=[5,5]", "exchange.max_rungs=1", "data.normalize_features=false"]


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory):
    """cora in 2 partitions, written by `jgraph partition`."""
    out = tmp_path_factory.mktemp("cora2") / "parts"
    assert main(["partition", "cora", "--num-parts", "2", "--out", str(out), "--quiet"]) == 0
    return out


def train(workdir, *settings) -> int:
    return main(["train", EXPERIMENT, "--workdir", str(workdir), "--quiet", "--set", *TINY,
                 *settings])


def test_version_names_jgraph_jax_and_python(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith("jgraph 0.") and "(jax 0." in out and "Python 3." in out


@pytest.mark.parametrize("command", ["partition", "info", "train", "eval", "compile"])
def test_help_shows_no_default_of_none(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "default: None" not in capsys.readouterr().out


def test_info_on_a_training_workdir_names_its_partition(tmp_path, capsys):
    (tmp_path / "partition").mkdir()
    (tmp_path / "partition" / "meta.json").write_text("{}")
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"a training run's workdir: its partition is {tmp_path / 'partition'}" in err


def test_eval_uses_as_many_devices_as_the_run_trained_on(tmp_path, monkeypatch):
    assert run_devices(str(tmp_path)) is None                  # no run: JAX's default
    (tmp_path / "partition").mkdir()
    (tmp_path / "partition" / "meta.json").write_text(json.dumps({"num_parts": 4}))
    assert run_devices(str(tmp_path)) == 4
    monkeypatch.setenv("JGRAPH_NUM_PROCESSES", "2")           # per process in a job
    assert run_devices(str(tmp_path)) == 2


def test_eval_counts_the_devices_of_the_partition_directory_a_run_was_given(tmp_path):
    # Such a run has no WORKDIR/partition: its saved config names the directory.
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "meta.json").write_text(json.dumps({"num_parts": 3}))
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(f"data:\n  path: {parts}\n  num_parts: 0\n")
    assert run_devices(str(workdir)) == 3
    (workdir / "config.yaml").write_text("data:\n  path: ../parts\n")   # relative to it
    assert run_devices(str(workdir)) == 3


@pytest.fixture(scope="module")
def after_failed_attempts(cora_parts, tmp_path_factory):
    """A workdir after two failed `jgraph train` attempts and a third that trains from
    the partition directory (TINY's settings), with what each attempt returned, said on
    stderr and left behind. The run is the one the eval test scores, too: one training
    run for both tests."""
    workdir = tmp_path_factory.mktemp("runs") / "x"
    seen = []

    def attempt(*settings):
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            code = train(workdir, *settings)
        seen.append((code, said.getvalue(),
                     sorted(os.listdir(workdir)) if workdir.exists() else None))
    # A config error found once the graph is partitioned into WORKDIR/partition.
    attempt("data.path=cora", "data.num_parts=2", "data.target_type=paper")
    # A workdir holding files of its own.
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    attempt(f"data.path={cora_parts}", "data.num_parts=3")
    attempt(f"data.path={cora_parts}")
    return workdir, seen, (workdir / ".lock").exists()


@pytest.mark.slow      # `jgraph eval` in a process of its own (the run: the fixture's)
def test_eval_of_a_run_trained_from_a_partition_directory_runs_on_its_devices(
        after_failed_attempts):
    workdir, seen, _ = after_failed_attempts
    assert seen[-1][0] == 0                  # trained from the partition directory
    assert not (workdir / "partition").exists() and run_devices(str(workdir)) == 2
    # A new process starts JAX with one CPU device: without --devices, eval (and embed,
    # which asks `run_devices` too) must make the run's two.
    done = subprocess.run([sys.executable, "-m", "jgraph.cli.main", "eval", str(workdir),
                           "--split", "test", "--quiet"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr
    result = json.loads((workdir / "result.json").read_text())
    assert json.loads(done.stdout)["test_acc"] == result["test_acc"]


@pytest.mark.slow      # trains after the failed attempts (the fixture's)
def test_a_failed_train_leaves_no_run_behind_and_the_next_one_trains(after_failed_attempts):
    workdir, seen, locked = after_failed_attempts
    (code, err, left), (code2, err2, left2), (code3, _, left3) = seen
    # A config error found once the graph is partitioned into WORKDIR/partition: the
    # workdir the attempt made goes, with everything in it.
    assert code == 2
    assert "data.target_type 'paper' is not a node type" in err
    assert left is None
    # A workdir holding files of its own keeps them, and only them: no lock file, no
    # empty checkpoints/.
    assert code2 == 2
    assert "has 2 partition(s) but the mesh has 3" in err2
    assert left2 == ["notes.txt"]
    assert code3 == 0
    assert "model" in left3 and (workdir / "model").is_dir()
    assert os.listdir(workdir / "checkpoints")
    assert not locked                                 # the lock goes when a run ends


@pytest.mark.slow      # a training run
def test_a_run_with_a_checkpoint_every_epoch_prints_no_absl_line(cora_parts, tmp_path, capsys,
                                                                  caplog, monkeypatch):
    # Orbax warns, through absl, when a save waited for the one before it longer than a
    # threshold (a slow disk, short epochs); below zero, every save does.
    monkeypatch.setattr(checkpoint_manager, "_WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS", -1.0)
    caplog.set_level(logging.DEBUG)
    assert train(tmp_path / "run", f"data.path={cora_parts}", "train.epochs=3",
                 "checkpoint.every_steps=0") == 0
    assert "absl" not in capsys.readouterr().err
    # absl's records reach stderr through the root logger's handlers (pytest's here).
    assert not [r.getMessage() for r in caplog.records
                if r.name == "absl" and r.levelno >= logging.WARNING]
    assert len(os.listdir(tmp_path / "run" / "checkpoints")) == 3      # one an epoch


def option_help(command: str, flag: str) -> str:
    """`jgraph COMMAND --help`'s text for `flag`, on one line."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    action = next(a for a in sub._actions if flag in a.option_strings)
    return " ".join(action.help.split())


@pytest.mark.parametrize("flag, limit", [("--range-entries", range_limit),
                                         ("--coarse-entries", coarse_limit)])
def test_partition_help_states_the_default_budgets_the_code_uses(flag, limit):
    said = option_help("partition", flag)
    found = re.search(r"default: 2\^(\d+) for one process, 1/\((\d+)N\) of it for each of N "
                      r"processes, at least 2\^(\d+)\)", said)
    assert found, said
    one, share, least = (int(x) for x in found.groups())
    assert limit(1) == 2**one and limit(10**6) == 2**least
    for n in (2, 3, 4, 8, 64, 1024):
        assert limit(n) == max(2**one // (share * n), 2**least), n
