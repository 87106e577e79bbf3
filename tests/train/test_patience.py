"""train.patience: a run stops once that many epochs in a row have not bettered its best
validation score, keeps the best epoch's model, and, started again, stays stopped."""
import json
from pathlib import Path

import pytest

from jgraph.config import ConfigError, load
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train.loop import train_and_evaluate

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
# A high learning rate: cora's validation accuracy peaks within a few epochs of 30.
# Validated on sampled neighbourhoods (10, 10), not every neighbour's: the exact ones
# (up to 168 x 168 slots a seed on cora) were most of each epoch's time.
QUICK = ["data.num_parts=1", "train.epochs=30", "train.lr=0.05", "train.patience=2",
         "train.eval_fanouts=[10,10]"]


def rows(workdir) -> list[dict]:
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text()
            .splitlines()]


@pytest.mark.slow        # a training run, then the same command again
def test_a_run_stops_after_patience_epochs_without_a_better_validation_score(tmp_path):
    config = load(Experiment, str(EXPERIMENTS / "sage_cora.yaml"), QUICK)
    result = train_and_evaluate(config, str(tmp_path), Progress(enabled=False))
    logged = rows(tmp_path)
    best = result["best_epoch"]
    assert len(logged) == result["epochs_trained"] == best + 1 + 2 < 30
    scores = [r["val_acc"] for r in logged]
    assert scores[best] == max(scores) == result["val_acc"]
    assert all(s <= scores[best] for s in scores[best + 1:])
    # Started again on its workdir, it resumes where it stopped: no more epochs.
    again = train_and_evaluate(config, str(tmp_path), Progress(enabled=False))
    assert rows(tmp_path) == logged
    assert again["test_acc"] == result["test_acc"] and again["best_epoch"] == best


def test_patience_needs_a_validation_split(tmp_path):
    config = load(Experiment, str(EXPERIMENTS / "rgcn_aifb.yaml"),
                  ["data.path=" + str(EXPERIMENTS.parents[1] / "shared" / "data" / "aifb.npz"),
                   "train.patience=3", "train.epochs=1"])
    with pytest.raises(ConfigError, match="train.patience=3: early stopping watches the "
                                          "validation score"):
        train_and_evaluate(config, str(tmp_path), Progress(enabled=False))


@pytest.mark.parametrize("value", ["0", "true"])
def test_a_patience_below_one_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match="train.patience"):
        load(Experiment, str(EXPERIMENTS / "sage_cora.yaml"), [f"train.patience={value}"])
