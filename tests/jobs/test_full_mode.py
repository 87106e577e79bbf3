"""Full-batch training as a run (`train.mode: full`): it trains cora with every shipped
full-batch model kind, one step an epoch over every training node; a run stopped by
SIGTERM resumes to the same per-step losses, epoch rows and result as the run that
never stopped; what it cannot do (link prediction, a feature cache) is refused by name."""
import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from jgraph.config import ConfigError, load
from jgraph.data.datasets import builtin_path
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train.loop import RunStopped, train_and_evaluate

pytestmark = pytest.mark.slow     # whole training runs

ROOT = Path(__file__).resolve().parents[2]
SAGE = str(ROOT / "experiments" / "full_sage_cora.yaml")
GAT = str(ROOT / "experiments" / "full_gat_cora.yaml")
# exchange.max_rungs=1: one compiled branch a transfer, the same numbers (test accuracy
# and final loss equal to the digit), a quicker compile.
SMALL = ["data.num_parts=2", "model.hidden=16", "exchange.max_rungs=1",
         "checkpoint.every_steps=2", "checkpoint.keep=2"]
TIMINGS = {"epoch_seconds", "seeds_per_s", "compile_seconds"}
RUN_ONLY = {"seconds", "seeds_per_s", "resumed_from_step", "checkpoints", "compile_seconds",
            "eval_compile_seconds", "compiles", "compiles_by_step", "capacity_growths",
            "setup_seconds"}


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def quiet():
    return Progress(enabled=False)


# Test accuracy measured at 10 epochs (2 devices / 1 device): sage 0.483 / 0.427, gat
# 0.68 / 0.61; a constant guess's bound is 0.378, and the paired bounds 0.295 and 0.503.
# (At 20 epochs: sage 0.558 / 0.571, gat 0.762 / 0.61.)
EPOCHS = 10


@pytest.mark.parametrize("experiment,extra", [
    (SAGE, [f"train.epochs={EPOCHS}"]),
    (GAT, [f"train.epochs={EPOCHS}", "model.heads=4", "model.hidden=16"])],
    ids=["sage", "gat"])
def test_a_full_batch_run_takes_one_step_an_epoch_over_every_training_node(
        tmp_path, experiment, extra):
    """10 steps of every training node on 2 devices lower the loss, and the model
    learns: its test accuracy beats any model that ignores its input, and falls short
    of the same run's on one device by no more than chance allows two equally good
    models on cora's 1,000 test nodes."""
    result = train_and_evaluate(load(Experiment, experiment, SMALL + extra), str(tmp_path),
                                quiet())
    steps = read_lines(tmp_path / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(1, EPOCHS + 1))
    assert all(s["count"] == 140 and s["batch"] == 0 for s in steps)  # every seed, each step
    rows = read_lines(tmp_path / "metrics.jsonl")
    assert len(rows) == EPOCHS and rows[-1]["loss"] < rows[0]["loss"]
    assert result["compiles"] == 1 and result["inference"] == "full"

    # The same run on one device (its checkpoints, which change nothing it computes,
    # left to the end) is the reference its test accuracy answers to.
    one = [s for s in SMALL if not s.startswith(("data.num_parts", "checkpoint."))]
    reference = train_and_evaluate(
        load(Experiment, experiment, [*one, *extra, "data.num_parts=1",
                                      "checkpoint.every_steps=1000"]),
        str(tmp_path / "one"), quiet())
    labels, test = cora_test_labels()
    acc, one_acc = result["test_acc"], reference["test_acc"]
    assert acc >= above_a_constant_guess(labels[test]), (acc, one_acc)
    assert acc >= one_acc - paired_noise(acc, one_acc, test.size), (acc, one_acc)


def cora_test_labels():
    """(labels, test node ids) of cora as stored (the file the runs load)."""
    raw = np.load(builtin_path("cora"))
    return raw["label"], raw["test_idx"]


def above_a_constant_guess(labels, sds=4.0) -> float:
    """An accuracy a model that ignores its input reaches only by chance: the largest
    class's share of `labels`, plus `sds` binomial standard deviations of an accuracy
    over that many nodes (4: one such model in 30,000 gets there)."""
    share = np.bincount(labels).max() / labels.size
    return share + sds * math.sqrt(share * (1 - share) / labels.size)


def paired_noise(acc, ref_acc, n, sds=4.0) -> float:
    """How far below `ref_acc` an equally good model's accuracy on the same n test nodes
    falls by chance (McNemar's test, one-sided): of the m nodes exactly one of the two
    gets right, each is either's with probability 1/2 under equal skill, so the
    difference of the accuracies has a standard deviation of sqrt(m) / n. Every such
    node is an error of one of them, so m <= n (2 - acc - ref_acc): the bound uses that
    (4 standard deviations: a false alarm one time in 30,000)."""
    return sds * math.sqrt(n * (2 - acc - ref_acc)) / n


def test_a_stopped_full_batch_run_resumes_with_the_same_losses_and_metrics(tmp_path):
    config = load(Experiment, SAGE, SMALL + ["train.epochs=5", "model.dropout=0.5"])
    reference = train_and_evaluate(config, str(tmp_path / "ref"), quiet())

    # One step an epoch: SIGTERM after step 3 is dispatched rides in step 4's stop vote,
    # read when step 4 settles; the run saves there and resumes from step 4.
    def on_step(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(RunStopped, match="after step 4;"):
        train_and_evaluate(config, str(tmp_path / "run"), quiet(), on_step=on_step)
    result = train_and_evaluate(config, str(tmp_path / "run"), quiet())
    assert result["resumed_from_step"] == 4
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
    with pytest.raises(ConfigError, match="no kind of job trains task link with train.mode full"):
        load(Experiment, SAGE, ["task=link"])
    with pytest.raises(ConfigError, match=r"exchange.cache \(0.1\) keeps feature rows"):
        load(Experiment, SAGE, ["exchange.cache=0.1"])


def test_full_batch_training_takes_sparse_features_as_they_are(tmp_path, shared_data):
    """facebook_musae's sparse feature rows go into the first layer as SparseRows (input
    dropout drops stored entries), and training lowers the loss. Three epochs: val
    accuracy measured 0.478 / 0.538 / 0.633 / 0.675 / 0.706 after epochs 1-5, the loss
    falling at each."""
    config = load(Experiment, str(ROOT / "experiments" / "full_sage_facebook.yaml"),
                  [f"data.path={shared_data('facebook_musae.npz')}", "data.num_parts=2",
                   "train.epochs=3", "model.hidden=16", "exchange.max_rungs=1"])
    train_and_evaluate(config, str(tmp_path), quiet())
    rows = read_lines(tmp_path / "metrics.jsonl")
    assert len(rows) == 3 and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["val_acc"] > 0.5                      # 4 classes
