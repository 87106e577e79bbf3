"""The trained model on disk (WORKDIR/model, what `jgraph eval` scores): saved with a
checksum of every array and used only when its values match them. Damage that orbax
reads without complaint (wrong numbers), damage it cannot read, and a model saved
without checksums are each refused in one line naming the model, as `ModelError`, which
the CLI reports as a user error."""
import json
import os
import re
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from jgraph.mesh import REPLICATED, ROWS
from jgraph.sharded import make_mesh
from jgraph.train.checkpoint import CheckpointError, ModelError
from jgraph.train.model import CHECKSUMS_FILE, MODEL_DIR, MODEL_FORMAT, load_model, save_model


def model_on(mesh, seed):
    """Parameters (replicated) and an embedding table (row-sharded), like a run's."""
    rng = np.random.default_rng(seed)
    def put(x, spec):
        return jax.device_put(x.astype(np.float32), NamedSharding(mesh, spec))
    return {"params": {"w": put(rng.normal(size=(256, 64)), REPLICATED),
                       "b": put(rng.normal(size=(7,)), REPLICATED)},
            "embeddings": {"table": put(rng.normal(size=(512, 16)), ROWS)}}


def fake_run(mesh):
    """What `load_model` uses of a `Run`: `job.init(params)` gives a fresh state whose
    params and embeddings are the shapes, dtypes and placements to restore into."""
    fresh = model_on(mesh, seed=99)
    state = SimpleNamespace(params=fresh["params"], embeddings=fresh["embeddings"])
    return SimpleNamespace(params=None, job=SimpleNamespace(init=lambda params: state))


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(None, jax.devices()[:4])


@pytest.fixture
def saved(tmp_path, mesh):
    """A workdir with a saved model (seed 1); returns (workdir, model folder)."""
    model = model_on(mesh, seed=1)
    path = save_model(str(tmp_path), model["params"], model["embeddings"])
    return str(tmp_path), path


def flip(path, where):
    """Invert 64 bytes at the start or in the middle of a file."""
    offset = 0 if where == "start" else os.path.getsize(path) // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(64)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def largest_data_file(model):
    files = [os.path.join(d, f) for d, _, fs in os.walk(model) for f in fs
             if os.sep + "d" + os.sep in os.path.join(d, f)]
    return max(files, key=os.path.getsize)


def test_a_saved_model_loads_with_its_values_and_placement(saved, mesh):
    workdir, path = saved
    with open(os.path.join(path, CHECKSUMS_FILE)) as f:
        record = json.load(f)
    assert record["format"] == MODEL_FORMAT
    assert sorted(record["checksums"]) == ["['embeddings']['table']", "['params']['b']",
                                           "['params']['w']"]
    params, embeddings = load_model(workdir, fake_run(mesh))
    want = model_on(mesh, seed=1)
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(want["params"]["w"]))
    np.testing.assert_array_equal(np.asarray(embeddings["table"]),
                                  np.asarray(want["embeddings"]["table"]))
    assert embeddings["table"].sharding == want["embeddings"]["table"].sharding


def test_flipped_bytes_that_orbax_reads_as_wrong_numbers_are_refused_naming_the_array(
        saved, mesh):
    """64 inverted bytes inside the data of the largest array: orbax returns other
    numbers without complaint (what `jgraph eval` used to score)."""
    workdir, path = saved
    flip(largest_data_file(path), "middle")
    with pytest.raises(ModelError) as e:
        load_model(workdir, fake_run(mesh))
    message = str(e.value)
    # Which array's bytes the largest data file holds depends on how orbax laid the
    # files out on this save; the message must name one of the model's arrays.
    assert re.match(re.escape(f"{path} is damaged: the values of ")
                    + r"(\['params'\]\['[wb]'\]|\['embeddings'\]\['table'\]) differ", message)
    assert "\n" not in message and f"jgraph train {workdir}" in message


@pytest.mark.parametrize("victim", ["data header", "_METADATA"])
def test_flipped_bytes_that_orbax_cannot_read_are_refused_in_one_line(saved, mesh, victim):
    workdir, path = saved
    flip(largest_data_file(path) if victim == "data header" else
         os.path.join(path, "_METADATA"), "start" if victim == "data header" else "middle")
    with pytest.raises(ModelError) as e:
        load_model(workdir, fake_run(mesh))
    message = str(e.value)
    assert message.startswith(f"{path} is unreadable (") and "\n" not in message
    assert "TensorStore({" not in message          # the cause, not orbax's spec dump


def test_a_model_saved_without_checksums_is_refused_saying_how_to_write_it_again(saved, mesh):
    """What an older jgraph wrote (or a save stopped between the arrays and their
    checksums): its values cannot be verified."""
    workdir, path = saved
    os.remove(os.path.join(path, CHECKSUMS_FILE))
    with pytest.raises(ModelError, match="has no checksums") as e:
        load_model(workdir, fake_run(mesh))
    assert str(e.value).startswith(path)
    assert f"jgraph train {os.path.join(workdir, 'config.yaml')} --workdir {workdir}" \
        in str(e.value)


@pytest.mark.parametrize("content", ['{"format": 1, "checks', '{"format": 99, "checksums": {}}',
                                     '[1, 2]'])
def test_an_unreadable_checksums_file_is_refused_naming_it(saved, mesh, content):
    workdir, path = saved
    with open(os.path.join(path, CHECKSUMS_FILE), "w") as f:
        f.write(content)
    with pytest.raises(ModelError, match="is unreadable") as e:
        load_model(workdir, fake_run(mesh))
    assert str(e.value).startswith(os.path.join(path, CHECKSUMS_FILE))


def test_the_cli_reports_a_model_error_in_one_line_as_a_user_error():
    from jgraph.cli.main import user_errors
    assert issubclass(ModelError, CheckpointError)
    assert isinstance(ModelError("x"), user_errors())


def test_saving_again_replaces_the_model_and_its_checksums(saved, mesh):
    workdir, _ = saved
    model = model_on(mesh, seed=2)
    save_model(workdir, model["params"], model["embeddings"])
    assert sorted(os.listdir(os.path.join(workdir))) == [MODEL_DIR]
    params, _ = load_model(workdir, fake_run(mesh))
    np.testing.assert_array_equal(np.asarray(params["b"]), np.asarray(model["params"]["b"]))
