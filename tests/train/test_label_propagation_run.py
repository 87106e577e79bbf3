"""`model.kind: label_propagation`: a run that learns nothing, trained, evaluated,
exported and loaded like any node classification run, on the mesh; its scores equal a
dense numpy label propagation over cora's own graph."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from jgraph import load_dataset, load_run, read_embeddings
from jgraph.cli.main import main
from jgraph.config import ConfigError, load
from jgraph.jobs import kind_of
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train.loop import train_and_evaluate
from jgraph.train.model import evaluate_run

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
STEPS, ALPHA = 10, 0.9
LP = ["data.num_parts=2", "model.kind=label_propagation", f"model.num_layers={STEPS}",
      f"model.alpha={ALPHA}"]


def dense_label_propagation(graph, steps: int, alpha: float) -> np.ndarray:
    """PyG's LabelPropagation over cora's adjacency (symmetric normalisation), the
    training rows clamped to their labels after each step; rows nothing reached hold
    the training labels' frequencies. Probabilities [N, C] (each row summing to 1)."""
    (src, dst), = graph.edges.values()
    n = graph.num_nodes["_N"]
    labels = np.asarray(graph.node_data["_N"]["label"])
    train = np.asarray(graph.splits["_N"]["train"])
    a = np.zeros((n, n))
    np.add.at(a, (dst, src), 1.0)
    degree = a.sum(axis=1)
    inv = np.where(degree > 0, 1 / np.sqrt(np.maximum(degree, 1)), 0.0)
    s = inv[:, None] * a * inv[None]
    y0 = np.zeros((n, labels.max() + 1))
    y0[train, labels[train]] = 1.0
    y = y0.copy()
    for _ in range(steps):
        y = (1 - alpha) * y0 + alpha * s @ y
        y[train] = y0[train]
    prior = y0.sum(axis=0) / y0.sum()
    y = np.where((y > 0).any(axis=1, keepdims=True), y, prior)
    return y / y.sum(axis=1, keepdims=True), labels


@pytest.fixture(scope="module")
def propagated(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lp_cora")
    result = train_and_evaluate(load(Experiment, EXPERIMENT, LP), str(workdir),
                                Progress(enabled=False))
    return str(workdir), result


@pytest.fixture(scope="module")
def reference():
    cora = load_dataset("cora")
    probs, labels = dense_label_propagation(cora, STEPS, ALPHA)
    return probs, labels, {s: np.asarray(cora.splits["_N"][s]) for s in ("val", "test")}


def test_a_label_propagation_run_scores_as_the_dense_reference(propagated, reference):
    workdir, result = propagated
    probs, labels, splits = reference
    for split, ids in splits.items():
        want = np.mean(np.argmax(probs[ids], axis=1) == labels[ids])
        assert result[f"{split}_acc"] == pytest.approx(want, abs=1 / ids.size), split
    # It learns nothing: no steps, no epochs to choose from; the majority baseline is
    # beside it, and it is well above it.
    assert result["steps"] == 0 and result["best_epoch"] is None
    assert result["majority_test_acc"] == pytest.approx(
        np.mean(labels[splits["test"]] == result["majority_class"]))
    assert result["test_acc"] > result["majority_test_acc"] + 0.4
    rows = [json.loads(line)
            for line in Path(workdir, "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["val_acc"] == result["val_acc"]
    assert rows[0]["train_acc"] == 1.0          # the training rows are clamped
    # jgraph eval propagates again and scores the same.
    again = evaluate_run(workdir, progress=Progress(enabled=False))
    assert again["test"]["acc"] == result["test_acc"]


def test_its_probabilities_are_exported_and_answered_as_the_reference(
        propagated, reference, tmp_path, capsys):
    workdir, result = propagated
    probs, labels, splits = reference
    assert main(["embed", workdir, "--out", str(tmp_path / "p"), "--what",
                 "probabilities", "-q"]) == 0
    ids, values = read_embeddings(tmp_path / "p")
    np.testing.assert_allclose(values, probs[ids], rtol=1e-4, atol=1e-5)
    test = splits["test"]
    run = load_run(workdir)
    predicted = run.predict(test)
    assert np.mean(predicted == labels[test]) == result["test_acc"]
    np.testing.assert_allclose(run.probabilities(test[:5]), probs[test[:5]], rtol=1e-4,
                               atol=1e-5)
    # What it does not have is refused, naming it.
    capsys.readouterr()
    assert main(["embed", workdir, "--out", str(tmp_path / "e"), "-q"]) == 2
    assert "label propagation gives class probabilities and predictions, not " \
           "embeddings" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not smoothed"):
        load_run(workdir, smoothed=True)


@pytest.mark.parametrize("setting,message", [
    ("model.alpha=0", "model.alpha must be in (0, 1]"),
    ("train.history_refresh=2", "keeps no histories to refresh")])
def test_bad_settings_are_refused_naming_them(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(Experiment, EXPERIMENT, [*LP, setting])


def test_a_config_written_for_full_batch_training_propagates_labels_too():
    # train.mode and train.sampler say how a model would train, model.one_hot_inputs
    # what an R-GCN reads: label propagation trains and reads nothing, so a config of
    # any of them may be switched to it.
    for setting in ("train.mode=full", "train.sampler=control_variate",
                    "model.one_hot_inputs=true"):
        config = load(Experiment, EXPERIMENT, [*LP, setting])
        assert kind_of(config).model == "label_propagation"
