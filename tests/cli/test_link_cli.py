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
SMALL = ["task=link", "train.epochs=1", "model.hidden=16", "train.fanouts=[5,5]",
         "train.eval_fanouts=[5,5]", "train.batch_size=512", "link.hits=[1,10]",
         "exchange.max_rungs=1"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow      # a partition, a training run and an evaluation
def test_partition_with_link_split_then_train_and_eval_print_the_ranking_scores(tmp_path,
                                                                                capsys):
    parts = str(tmp_path / "parts")
    # Prepared as the config asks (sage_cora.yaml normalises the features).
    code, out, err = run(capsys, "partition", "cora", "--num-parts", "2", "--out", parts,
                         "--link-split", "0.1,0.1", "--eval-negatives", "20",
                         "--normalize-features", "--json")
    assert code == 0, err
    counts = json.loads(out)["edge_splits"]
    # cora's 5,278 undirected pairs: 10% each held out, the rest trained on.
    assert counts == {"train": 5278 - 2 * 528, "val": 528, "test": 528}

    workdir = str(tmp_path / "run")
    code, out, err = run(capsys, "train", EXPERIMENT, "--workdir", workdir, "--quiet",
                         "--set", f"data.path={parts}", "link.eval_negatives=20", *SMALL)
    assert code == 0, err
    result = json.loads(out)
    for key in ("val_mrr", "test_mrr", "val_hits@1", "test_hits@10"):
        assert 0 < result[key] <= 1, key
    assert "val_acc" not in result

    code, out, err = run(capsys, "eval", workdir, "--split", "test", "--quiet")
    assert code == 0, err
    scored = json.loads(out)
    assert scored["test_mrr"] == pytest.approx(result["test_mrr"], abs=1e-6)
    assert scored["test_count"] == 528


def test_training_links_on_a_partition_without_edge_splits_exits_2(tmp_path, capsys):
    parts = str(tmp_path / "parts")
    assert run(capsys, "partition", "cora", "--num-parts", "2", "--out", parts,
               "--normalize-features")[0] == 0
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
    assert row["edges_per_s"] > 0 and "seeds_per_s" not in row


@pytest.mark.slow      # a training run
def test_a_link_run_without_validation_edges_keeps_its_last_epoch(tmp_path, capsys):
    code, out, err = run(capsys, "train", EXPERIMENT, "--workdir", str(tmp_path / "run"),
                         "--quiet", "--devices", "2", "--set", "data.num_parts=2",
                         "link.val_fraction=0", "link.eval_negatives=20", *SMALL)
    assert code == 0, err
    result = json.loads(out)
    assert result["val_mrr"] is None and 0 < result["test_mrr"] <= 1
    assert result["best_epoch"] == 0          # the last (and only) epoch
