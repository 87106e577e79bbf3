"""What a run reports: accuracy and macro-F1 from per-class counts (as a per-class
computation from the labels and predictions themselves), metrics.jsonl and the PNG of
the curves."""
import json

import numpy as np
import pytest

from jgraph.jobs.metrics import scores
from jgraph.train.report import JsonLog, plot_curves, read_json_lines, write_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def counts_of(y, p, classes):
    """[3, C]: per class, rows of it, predicted as it, both (what the evaluators sum
    over batches), from a numpy confusion matrix."""
    m = np.zeros((classes, classes), np.int64)
    np.add.at(m, (y, p), 1)
    return np.stack([m.sum(1), m.sum(0), np.diag(m)])


@pytest.mark.parametrize("classes", [3, 100_001])
def test_class_counts_in_the_step_equal_numpy_and_stay_linear_in_classes(classes):
    import jax.numpy as jnp

    from jgraph.jobs.step import class_counts
    rng = np.random.default_rng(classes)
    y = rng.integers(0, min(classes, 5), size=64)
    y[:2] = classes - 1                       # one huge label: C classes, 3 x C counts
    logits = rng.standard_normal((64, classes)).astype(np.float32)
    mask = rng.random(64) < 0.7
    got = np.asarray(class_counts(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask)))
    p = logits.argmax(1)
    want = np.stack([np.bincount(y[mask], minlength=classes),
                     np.bincount(p[mask], minlength=classes),
                     np.bincount(y[mask & (y == p)], minlength=classes)])
    np.testing.assert_array_equal(got, want)


def macro_f1_by_hand(y, p):
    """Mean over the classes in y or p of 2PR/(P+R) (0 without true positives), as
    scikit-learn's f1_score(y, p, average="macro")."""
    f1s = []
    for c in np.union1d(y, p):
        tp = np.sum((y == c) & (p == c))
        fp = np.sum((y != c) & (p == c))
        fn = np.sum((y == c) & (p != c))
        if tp == 0:
            f1s.append(0.0)
            continue
        precision, recall = tp / (tp + fp), tp / (tp + fn)
        f1s.append(2 * precision * recall / (precision + recall))
    return float(np.mean(f1s))


@pytest.mark.parametrize("seed", range(5))
def test_scores_equal_a_per_class_computation_on_random_labels(seed):
    rng = np.random.default_rng(seed)
    classes = 8                      # class 7 never occurs; class 6 only as a prediction
    y = rng.integers(0, 6, size=300)
    p = np.where(rng.random(300) < 0.6, y, rng.integers(0, 7, size=300))
    assert 7 not in y and 7 not in p and 6 not in y and 6 in p
    got = scores(counts_of(y, p, classes))
    assert got["count"] == 300
    assert got["acc"] == pytest.approx(np.mean(y == p), abs=1e-12)
    assert got["macro_f1"] == pytest.approx(macro_f1_by_hand(y, p), abs=1e-12)


def test_macro_f1_leaves_out_classes_that_never_occur_and_counts_predicted_only_ones():
    # Class 0: 2 right of 3; class 1: 1 right, 1 wrongly predicted as 2; class 2: never
    # true (F1 0 but counted); class 3: never true nor predicted (left out).
    y = np.array([0, 0, 0, 1, 1])
    p = np.array([0, 0, 1, 1, 2])
    got = scores(counts_of(y, p, 4))
    f1_0 = 2 * 2 / (3 + 2)            # 2 tp / (3 true + 2 predicted)
    f1_1 = 2 * 1 / (2 + 2)
    assert got["acc"] == pytest.approx(3 / 5)
    assert got["macro_f1"] == pytest.approx((f1_0 + f1_1 + 0.0) / 3)
    assert got["macro_f1"] == pytest.approx(macro_f1_by_hand(y, p))


def test_scores_of_perfect_and_of_empty_counts():
    perfect = scores(np.array([[3, 0, 5], [3, 0, 5], [3, 0, 5]]))
    assert perfect == {"acc": 1.0, "macro_f1": 1.0, "count": 8}
    empty = scores(np.zeros((3, 3)))
    assert empty["count"] == 0 and np.isnan(empty["acc"]) and np.isnan(empty["macro_f1"])


def rows(val):
    return [{"epoch": e, "loss": 2.0 / (e + 1), "train_acc": 0.1 * e, "val_acc": v}
            for e, v in enumerate(val)]


@pytest.mark.parametrize("val", [[0.2, 0.4, 0.5], [None, None, None], [None, 0.4, None]],
                         ids=["with_val", "val_acc_none", "some_val_acc_none"])
def test_plot_curves_writes_a_png(tmp_path, val):
    path = tmp_path / "curves.png"
    assert plot_curves(rows(val), str(path), "a title") is True
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_without_matplotlib_no_png_is_written_and_the_caller_is_told(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import raises ImportError
    assert plot_curves(rows([0.5]), str(tmp_path / "curves.png"), "a title") is False
    assert not (tmp_path / "curves.png").exists()


def test_json_log_appends_one_json_line_per_row_and_write_json_round_trips(tmp_path):
    log = JsonLog(str(tmp_path / "metrics.jsonl"))
    for row in rows([0.5, None]):
        log.write(row)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == log.rows == rows([0.5, None])
    silent = JsonLog(str(tmp_path / "elsewhere.jsonl"), enabled=False)  # a non-writer process
    silent.write({"epoch": 0})
    assert silent.rows == [{"epoch": 0}] and not (tmp_path / "elsewhere.jsonl").exists()
    write_json(str(tmp_path / "r.json"), {"a": 1.5, "b": None})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1.5, "b": None}
    assert not (tmp_path / "r.json.tmp").exists()


def test_a_resumed_json_log_rewrites_its_rows_and_reading_skips_a_cut_off_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"ste')    # a crash mid-line
    assert read_json_lines(str(path)) == [{"step": 1}, {"step": 2}, {"step": 3}]
    log = JsonLog(str(path), rows=[r for r in read_json_lines(str(path)) if r["step"] <= 2])
    log.write({"step": 3})
    assert read_json_lines(str(path)) == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert path.read_text().count("\n") == 3
    assert read_json_lines(str(tmp_path / "none.jsonl")) == []
