"""Full-batch training as a run (`train.mode: full`): it trains cora with every shipped
full-batch model kind, one step an epoch over every training node; a run stopped by
SIGTERM resumes to the same per-step losses, epoch rows and result as the run that
never stopped; what it cannot do (link prediction, a feature cache) is refused by name."""
import json
import os
import signal
from pathlib import Path

import pytest

from jgraph.config import ConfigError, load
from jgraph.progress import Progress
from jgraph.train.experiment import Experiment
from jgraph.train.loop import RunStopped, train_and_evaluate

pytestmark = pytest.mark.slow     # whole training runs

ROOT = Path(__file__).resolve().parents[2]
SAGE = str(ROOT / "experiments" / "full_sage_cora.yaml")
GAT = str(ROOT / "experiments" / "full_gat_cora.yaml")
SMALL = ["data.num_parts=2", "model.hidden=16", "checkpoint.every_steps=2",
         "checkpoint.keep=2"]
TIMINGS = {"epoch_seconds", "seeds_per_s", "compile_seconds"}
RUN_ONLY = {"seconds", "seeds_per_s", "resumed_from_step", "checkpoints", "compile_seconds",
            "eval_compile_seconds", "compiles", "compiles_by_step", "capacity_growths"}


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def quiet():
    return Progress(enabled=False)


@pytest.mark.parametrize("experiment,extra", [
    (SAGE, ["train.epochs=60"]),
    (GAT, ["train.epochs=60", "model.heads=4", "model.hidden=16"])], ids=["sage", "gat"])
def test_a_full_batch_run_takes_one_step_an_epoch_over_every_training_node(
        tmp_path, experiment, extra):
    result = train_and_evaluate(load(Experiment, experiment, SMALL + extra), str(tmp_path),
                                quiet())
    steps = read_lines(tmp_path / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(1, 61))
    assert all(s["count"] == 140 and s["batch"] == 0 for s in steps)  # every seed, each step
    rows = read_lines(tmp_path / "metrics.jsonl")
    assert len(rows) == 60 and rows[-1]["loss"] < rows[0]["loss"]
    assert result["compiles"] == 1 and result["inference"] == "full"
    assert result["test_acc"] > 0.7                    # chance is below 0.3 (7 classes)


def test_a_stopped_full_batch_run_resumes_with_the_same_losses_and_metrics(tmp_path):
    config = load(Experiment, SAGE, SMALL + ["train.epochs=6", "model.dropout=0.5"])
    reference = train_and_evaluate(config, str(tmp_path / "ref"), quiet())

    def on_step(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(RunStopped):
        train_and_evaluate(config, str(tmp_path / "run"), quiet(), on_step=on_step)
    result = train_and_evaluate(config, str(tmp_path / "run"), quiet())
    assert result["resumed_from_step"] is not None
    assert read_lines(tmp_path / "run" / "steps.jsonl") == \
        read_lines(tmp_path / "ref" / "steps.jsonl")

    def rows(d):
        return [{k: v for k, v in r.items() if k not in TIMINGS}
                for r in read_lines(d / "metrics.jsonl")]
    assert rows(tmp_path / "run") == rows(tmp_path / "ref")
    assert {k: v for k, v in result.items() if k not in RUN_ONLY} == \
        {k: v for k, v in reference.items() if k not in RUN_ONLY}


def test_full_mode_needs_no_fanouts_and_refuses_link_prediction():
    config = load(Experiment, SAGE, ["model.num_layers=3", "train.eval_fanouts=[-1,-1,-1]"])
    assert config.train.fanouts != (-1, -1, -1)          # not one per layer: not needed
    with pytest.raises(ConfigError, match="train.mode: full trains node classification"):
        load(Experiment, SAGE, ["task=link"])
    with pytest.raises(ConfigError, match=r"exchange.cache \(0.1\) keeps feature rows"):
        load(Experiment, SAGE, ["exchange.cache=0.1"])


def test_full_batch_training_takes_sparse_features_as_they_are(tmp_path, shared_data):
    """facebook_musae's sparse feature rows go into the first layer as SparseRows (input
    dropout drops stored entries), and training lowers the loss."""
    config = load(Experiment, str(ROOT / "experiments" / "full_sage_facebook.yaml"),
                  [f"data.path={shared_data('facebook_musae.npz')}", "data.num_parts=2",
                   "train.epochs=5", "model.hidden=16"])
    train_and_evaluate(config, str(tmp_path), quiet())
    rows = read_lines(tmp_path / "metrics.jsonl")
    assert len(rows) == 5 and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["val_acc"] > 0.5                      # 4 classes
