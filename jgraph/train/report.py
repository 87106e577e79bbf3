"""What a run reports: scores from a confusion matrix, metrics.jsonl, result.json and
the plot of loss and accuracy by epoch."""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np


def scores(confusion: np.ndarray) -> dict[str, float]:
    """accuracy and macro-F1 (mean F1 over the classes that occur in the labels or the
    predictions, as scikit-learn's f1_score(average="macro") on those labels)."""
    confusion = np.asarray(confusion, np.float64)
    total = confusion.sum()
    tp = np.diag(confusion)
    true, pred = confusion.sum(1), confusion.sum(0)
    present = (true + pred) > 0
    f1 = np.where(present, 2 * tp / np.maximum(true + pred, 1), 0.0)
    return {"acc": float(tp.sum() / total) if total else float("nan"),
            "macro_f1": float(f1[present].mean()) if present.any() else float("nan"),
            "count": int(total)}


class MetricsLog:
    """Appends one JSON object per line to DIR/metrics.jsonl (written as it goes, so a
    run that stops keeps its epochs)."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.rows: list[dict] = []
        self.enabled = enabled
        if enabled:
            open(self.path, "w").close()

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


def write_json(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def plot_curves(rows: Sequence[dict], path: str, title: str) -> None:
    """PNG: training loss (left) and train/val accuracy (right) by epoch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [r["loss"] for r in rows], marker="o", color="tab:red")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    right.plot(epochs, [r["train_acc"] for r in rows], marker="o", label="train")
    val = [(r["epoch"], r["val_acc"]) for r in rows if r.get("val_acc") is not None]
    if val:
        right.plot(*zip(*val), marker="o", label="val")
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0, 1))
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
