"""Link prediction from the command line: `jgraph partition --link-split` stores the
edge splits, `jgraph train` with task=link trains on them and prints val_mrr, test_mrr
and Hits@k, `jgraph eval` scores the saved model the same, `jgraph bench train --task
link` prints edges_per_s; a partition without edge splits, and a malformed
--link-split, exit 2 with one line naming them. (In-process: JAX already has the 8
devices tests/conftest.py set up.)"""
import json
from pathlib import Path

import pytest

from jgraph.cli import main

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# One epoch of a small model that learns in it: raw (not row-normalised) features, no
# dropout, each positive against 5 negatives by softmax. (With sage_cora.yaml's
# normalised features, dropout and BCE against 1 negative, one epoch ranked cora's test
# edges at an MRR of 0.22-0.26 among 20 negatives, seeds 0-4: no better than the
# untrained model's 0.19-0.21.)
SMALL = ["task=link", "train.epochs=1", "model.hidden=16", "train.fanouts=[5,5]",
         "train.eval_fanouts=[5,5]", "train.batch_size=512", "link.hits=[1,10]",
         "exchange.max_rungs=1", "data.normalize_features=false", "model.dropout=0",
         "model.input_dropout=0", "link.loss=contrastive", "link.negatives=5"]
NEGATIVES = 20          # link.eval_negatives: each held-out edge ranked among 20 nodes
# How far above chance (`chance_ranking`, 20 negatives: MRR 0.174, Hits@1 0.048, Hits@10
# 0.476) the one epoch of SMALL ranks, at least. Measured over train.seed 0-4: val and
# test MRR 0.49-0.54, Hits@1 0.31-0.38, Hits@10 0.90-0.93; the untrained model's
# (train.lr=1e-12, seeds 0-2): MRR 0.20-0.24, Hits@1 0.06-0.09, Hits@10 0.52-0.62.
LEARNED = {"mrr": 0.2, "hits@1": 0.15, "hits@10": 0.25}


def assert_learned(result, chance_ranking, *keys):
    """Each of `keys` ("test_mrr", "val_hits@1", ...) is LEARNED above chance."""
    for key in keys:
        metric = key.split("_", 1)[1]
        floor = chance_ranking(metric, NEGATIVES) + LEARNED[metric]
        assert floor < result[key] <= 1, (key, result[key], floor)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow      # a partition, a training run and an evaluation
def test_partition_with_link_split_then_train_and_eval_print_the_ranking_scores(
        tmp_path, capsys, chance_ranking):
    parts = str(tmp_path / "parts")
    # Prepared as SMALL asks (features as they are).
    code, out, err = run(capsys, "partition", "cora", "--num-parts", "2", "--out", parts,
                         "--link-split", "0.1,0.1", "--eval-negatives", str(NEGATIVES),
                         "--json")
    assert code == 0, err
    counts = json.loads(out)["edge_splits"]
    # cora's 5,278 undirected pairs: 10% each held out, the rest trained on.
    assert counts == {"train": 5278 - 2 * 528, "val": 528, "test": 528}

    workdir = str(tmp_path / "run")
    code, out, err = run(capsys, "train", EXPERIMENT, "--workdir", workdir, "--quiet",
                         "--set", f"data.path={parts}", f"link.eval_negatives={NEGATIVES}",
                         *SMALL)
    assert code == 0, err
    result = json.loads(out)
    assert_learned(result, chance_ranking, "val_mrr", "test_mrr", "val_hits@1",
                   "test_hits@10")
    assert "val_acc" not in result

    code, out, err = run(capsys, "eval", workdir, "--split", "test", "--quiet")
    assert code == 0, err
    scored = json.loads(out)
    assert scored["test_mrr"] == pytest.approx(result["test_mrr"], abs=1e-6)
    assert scored["test_count"] == 528


def test_training_links_on_a_partition_without_edge_splits_exits_2(tmp_path, capsys):
    parts = str(tmp_path / "parts")
    assert run(capsys, "partition", "cora", "--num-parts", "2", "--out", parts)[0] == 0
    code, out, err = run(capsys, "train", EXPERIMENT, "--workdir", str(tmp_path / "run"),
                         "--quiet", "--set", f"data.path={parts}", *SMALL)
    assert code == 2 and out == ""
    # The held-out edges the config asks for, named, and the partition's none.
    assert "task: link" in err and "the graph has none" in err and parts in err
    assert "Traceback" not in err


def test_a_malformed_link_split_exits_2_naming_it(tmp_path, capsys):
    code, _, err = run(capsys, "partition", "cora", "--num-parts", "2",
                       "--out", str(tmp_path / "parts"), "--link-split", "0.1")
    assert code == 2
    assert "--link-split '0.1': give two fractions VAL,TEST" in err
    code, _, err = run(capsys, "partition", "cora", "--num-parts", "2",
                       "--out", str(tmp_path / "parts"), "--link-split", "0.6,0.5")
    assert code == 2 and "leave edges to train on" in err
    code, _, err = run(capsys, "partition", "cora", "--num-parts", "2",
                       "--out", str(tmp_path / "parts"), "--eval-negatives", "10")
    assert code == 2 and "--eval-negatives only apply with --link-split VAL,TEST" in err
    code, _, err = run(capsys, "partition", "cora", "--num-parts", "2",
                       "--out", str(tmp_path / "parts"), "--link-split", "0.1,0.1",
                       "--eval-negatives", "0")
    assert code == 2 and "eval_negatives must be >= 1, got 0" in err


@pytest.mark.slow      # a benchmark epoch
def test_bench_train_task_link_prints_edges_per_second(capsys):
    code, out, err = run(capsys, "bench", "train", "cora", "--task", "link", "--fanouts",
                         "5,5", "--hidden", "16", "--epochs", "1", "--batch-size", "512",
                         "--json")
    assert code == 0, err
    row = json.loads(out)
    assert row["task"] == "link" and row["edges_per_epoch"] == 5278 - 2 * 528
    assert "seeds_per_s" not in row
    # Every training positive once in the one measured epoch.
    assert row["edges_per_s"] * row["seconds"] == pytest.approx(row["edges_per_epoch"])


@pytest.mark.slow      # a training run
def test_a_link_run_without_validation_edges_keeps_its_last_epoch(tmp_path, capsys,
                                                                  chance_ranking):
    code, out, err = run(capsys, "train", EXPERIMENT, "--workdir", str(tmp_path / "run"),
                         "--quiet", "--devices", "2", "--set", "data.num_parts=2",
                         "link.val_fraction=0", f"link.eval_negatives={NEGATIVES}", *SMALL)
    assert code == 0, err
    result = json.loads(out)
    assert result["val_mrr"] is None
    assert_learned(result, chance_ranking, "test_mrr")   # seeds 0-4: 0.52-0.54
    assert result["best_epoch"] == 0          # the last (and only) epoch
