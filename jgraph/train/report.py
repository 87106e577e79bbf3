"""What a run reports: metrics.jsonl, result.json and the plot of loss and accuracy by
epoch."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any


def strict_json(value: Any, **kwargs) -> str:
    """JSON text of `value` with NaN and infinity written as null, so that every line
    jgraph writes is valid JSON (Python's default writes the invalid token NaN)."""
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    return json.dumps(clean(value), allow_nan=False, **kwargs)


class JsonLog:
    """One JSON object per line in a file, written as it goes (a run that stops keeps
    what it logged). It starts from `rows`: those of a resumed run, written again."""

    def __init__(self, path: str, enabled: bool = True, rows=()):
        self.path = path
        self.rows: list[dict] = list(rows)
        self.enabled = enabled
        if enabled:
            with open(self.path, "w") as f:
                f.writelines(strict_json(r) + "\n" for r in self.rows)

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(strict_json(row) + "\n")


def read_json_lines(path: str) -> list[dict]:
    """The complete lines of a JSON-lines file (a line cut off by a crash is left out);
    [] if there is no file."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def write_json(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(strict_json(value, indent=2) + "\n")
    os.replace(tmp, path)


def plot_curves(rows: Sequence[dict], path: str, title: str,
                scores: tuple[str, str] = ("train_acc", "val_acc")) -> bool:
    """PNG: training loss (left) and the training and validation scores (right: the
    rows' fields `scores` names, the run's kind's) by epoch. Returns False (and writes
    nothing) where matplotlib is not installed (the `plots` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [r["loss"] for r in rows], marker="o", color="tab:red")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    train, key = scores
    right.plot(epochs, [r[train] for r in rows], marker="o", label=train.replace("_", " "))
    val = [(r["epoch"], r[key]) for r in rows if r.get(key) is not None]
    if val:
        right.plot(*zip(*val), marker="o", label=key.replace("_", " "))
    right.set(xlabel="epoch", ylabel="score", title="scores", ylim=(0, 1))
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
