"""`jgraph train` and `jgraph eval` as a user meets their errors: exit status 2 and one
line naming the key, the file or the directory, never a traceback. (In-process: JAX
already has the 8 devices tests/conftest.py set up.)"""
from pathlib import Path

import jax
import numpy as np
import pytest

from jgraph.cli import main

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_set_key_exits_2_listing_the_valid_keys(tmp_path, capsys):
    code, out, err = run(capsys, "train", EXPERIMENT, "--set", "no_such.key=1",
                         "--workdir", str(tmp_path / "run"), "--quiet")
    assert code == 2 and out == ""
    assert "jgraph train: error: unknown config key no_such.key" in err
    for key in ("name", "data", "model", "train", "exchange"):
        assert repr(key) in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_unknown_nested_set_key_lists_the_keys_of_its_section(tmp_path, capsys):
    code, _, err = run(capsys, "train", EXPERIMENT, "--set", "train.epoch=3",
                       "--workdir", str(tmp_path / "run"), "--quiet")
    assert code == 2
    assert "unknown config key train.epoch; valid keys under train" in err
    assert "'epochs'" in err and "'fanouts'" in err


def test_one_set_takes_several_assignments_and_checks_each(tmp_path, capsys):
    code, _, err = run(capsys, "train", EXPERIMENT, "--set", "train.epochs=1", "train.epoch=3",
                       "--workdir", str(tmp_path / "run"), "--quiet")
    assert code == 2
    assert "unknown config key train.epoch;" in err and "train.epochs" not in err
    assert not (tmp_path / "run").exists()


def test_fanouts_not_matching_num_layers_exits_2_naming_train_fanouts(tmp_path, capsys):
    code, out, err = run(capsys, "train", EXPERIMENT, "--set", "train.fanouts=[5]",
                         "--workdir", str(tmp_path / "run"), "--quiet")
    assert code == 2 and out == ""
    assert "jgraph train: error: train.fanouts has 1 hops but model.num_layers is 2" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_missing_config_file_exits_2_naming_the_file(tmp_path, capsys):
    missing = str(tmp_path / "no_such_config.yaml")
    code, _, err = run(capsys, "train", missing, "--workdir", str(tmp_path / "run"))
    assert code == 2
    assert f"{missing}: cannot read the config" in err and "Traceback" not in err


def test_config_that_is_not_a_mapping_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    code, _, err = run(capsys, "train", str(bad), "--workdir", str(tmp_path / "run"))
    assert code == 2 and f"{bad}: the top level must be a mapping" in err


def test_more_devices_than_jax_started_with_exits_2(tmp_path, capsys):
    assert len(jax.devices()) == 8     # JAX started (else --devices 9 could still apply)
    code, _, err = run(capsys, "train", EXPERIMENT, "--devices", "9",
                       "--workdir", str(tmp_path / "run"), "--quiet")
    assert code == 2 and "9 devices asked for" in err and "new process" in err


def test_graph_without_a_train_split_exits_2_naming_the_split(tmp_path, capsys):
    rng = np.random.default_rng(0)
    graph = tmp_path / "nosplit.npz"       # feat and label, but no train_idx
    np.savez(graph, src=rng.integers(0, 200, 1000), dst=rng.integers(0, 200, 1000),
             num_nodes=np.int64(200), feat=rng.standard_normal((200, 8)).astype(np.float32),
             label=rng.integers(0, 3, 200))
    code, _, err = run(capsys, "train", EXPERIMENT, "--set", f"data.path={graph}",
                       "--set", "data.num_parts=2", "--workdir", str(tmp_path / "run"),
                       "--quiet")
    assert code == 2
    assert "'train'" in err and "Traceback" not in err


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: None],
                         ids=["empty_directory", "missing_directory"])
def test_eval_on_a_directory_without_a_run_exits_2_naming_it(tmp_path, capsys, make):
    workdir = tmp_path / "not_a_run"
    make(workdir)
    code, out, err = run(capsys, "eval", str(workdir), "--quiet")
    assert code == 2 and out == ""
    assert err.startswith("jgraph eval: error: ")
    assert str(workdir) in err and "config.yaml" in err
    assert "Traceback" not in err

