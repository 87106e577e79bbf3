"""Correct & Smooth of a trained node classification run (`smooth.after_training`, and
`jgraph smooth WORKDIR` on a finished run), its alphas chosen on validation from a grid
that holds the base predictions, so validation never falls; on cora it lifts a briefly
trained GraphSAGE. Its predictions are what `jgraph embed --smoothed` writes and
`jgraph.load_run(..., smoothed=True)` answers."""
import json
from pathlib import Path

import numpy as np
import pytest

from jgraph import load_dataset, load_run, read_embeddings
from jgraph.cli.main import main
from jgraph.config import ConfigError, load
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train.loop import train_and_evaluate
from jgraph.train.smooth import RESULT, smooth_run

pytestmark = pytest.mark.slow     # a training run, then the propagations

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# sage_cora.yaml, 2 devices, 3 epochs: a weaker base predictor (seed 0: test accuracy
# 0.753, and 0.783 corrected and smoothed with the default grid), smoothed as it ends
# with 20 steps a propagation.
BRIEF = ["data.num_parts=2", "train.epochs=3", "train.batch_size=70",
         "exchange.max_rungs=1", "smooth.after_training=true", "smooth.correct_steps=20",
         "smooth.smooth_steps=20"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sage_cora")
    result = train_and_evaluate(load(Experiment, EXPERIMENT, BRIEF), str(workdir),
                                Progress(enabled=False))
    return str(workdir), result


def test_a_run_smoothed_after_training_exports_and_answers_its_smoothed_predictions(
        trained, tmp_path):
    workdir, result = trained
    smoothed = json.loads((Path(workdir) / RESULT).read_text())
    assert result["smoothed_val_acc"] == smoothed["val_acc"] >= smoothed["base_val_acc"]
    assert result["smoothed_test_acc"] == smoothed["test_acc"]
    assert smoothed["correct_steps"] == smoothed["smooth_steps"] == 20
    assert result["smoothed_test_acc"] > result["test_acc"] + 0.02, result
    # jgraph embed --smoothed writes predictions that score the smoothed accuracy.
    assert main(["embed", workdir, "--out", str(tmp_path / "p"), "--what", "predictions",
                 "--smoothed", "-q"]) == 0
    cora = load_dataset("cora")
    labels, test = cora.node_data["_N"]["label"], cora.splits["_N"]["test"]
    predicted = by_id(*read_embeddings(tmp_path / "p"))[test]
    assert np.mean(predicted == labels[test]) == result["smoothed_test_acc"]
    # The model's own predictions are what they were (the run's test accuracy, within a
    # node: full-graph inference against the sampled evaluation of every neighbour).
    assert main(["embed", workdir, "--out", str(tmp_path / "m"), "--what", "predictions",
                 "-q"]) == 0
    own = by_id(*read_embeddings(tmp_path / "m"))[test]
    assert np.mean(own == labels[test]) == pytest.approx(result["test_acc"], abs=2 / 1000)
    # load_run answers a few nodes as the export; its probabilities are the rows'.
    run = load_run(workdir, smoothed=True)
    np.testing.assert_array_equal(run.predict(test[:50]), predicted[:50])
    probs = run.probabilities(test[:50])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(np.argmax(probs, axis=1), predicted[:50])
    with pytest.raises(ConfigError, match="Correct & Smooth gives class probabilities and "
                                          "predictions, not embeddings"):
        run.embed(test[:5])


def by_id(ids, values):
    out = np.empty_like(values, shape=(ids.max() + 1, *values.shape[1:]))
    out[ids] = values
    return out


def test_smooth_keeps_validation_and_lifts_cora(trained, capsys):
    workdir, trained_result = trained
    code = main(["smooth", workdir, "--correct-steps", "20", "--smooth-steps", "20",
                 "--correct-alphas", "0,0.8,1", "--smooth-alphas", "0,0.8", "-q"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    result = json.loads((Path(workdir) / RESULT).read_text())
    assert printed["test_acc"] == result["test_acc"]
    # The base is the run's model: full-graph inference scores what the run's sampled
    # evaluation of every neighbour scored (within a node or two).
    assert result["base_test_acc"] == pytest.approx(trained_result["test_acc"], abs=2 / 1000)
    assert result["base_val_acc"] == pytest.approx(trained_result["val_acc"], abs=2 / 500)
    # Six grid points; both alphas 0 are the base predictions, scored alike.
    assert [(p["correct_alpha"], p["smooth_alpha"]) for p in result["grid"]] == [
        (0.0, 0.0), (0.0, 0.8), (0.8, 0.0), (0.8, 0.8), (1.0, 0.0), (1.0, 0.8)]
    assert result["grid"][0]["val_acc"] == result["base_val_acc"]
    assert result["val_acc"] == max(p["val_acc"] for p in result["grid"])
    assert result["val_acc"] >= result["base_val_acc"]
    assert result["test_acc"] > result["base_test_acc"] + 0.02, result


def test_a_fixed_scale_is_used_as_given(trained):
    workdir, _ = trained
    result = smooth_run(workdir, {"correct_steps": 10, "smooth_steps": 10,
                                  "correct_alphas": (0.0, 1.0), "smooth_alphas": (0.0,),
                                  "autoscale": False, "scale": 0.5},
                        Progress(enabled=False))
    assert result["autoscale"] is False and result["scale"] == 0.5
    assert len(result["grid"]) == 2 and result["val_acc"] >= result["base_val_acc"]


@pytest.mark.parametrize("argv,message", [
    (["--correct-alphas", "0,1.5"], "smooth.correct_alphas are alphas in [0, 1]"),
    (["--smooth-steps", "-1"], "smooth.smooth_steps must be >= 0")])
def test_bad_settings_exit_2_naming_them(trained, capsys, argv, message):
    workdir, _ = trained
    assert main(["smooth", workdir, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_directory_without_a_run_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="not a trained run"):
        smooth_run(str(tmp_path), progress=Progress(enabled=False))
