"""Small frictions a new user met, fixed: --version, help without "(default: None)",
`jgraph info` on a training workdir pointing at its partition, `jgraph eval` using the
run's device count."""
import json

import pytest

from jgraph.cli import main
from jgraph.cli.train import run_devices


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
