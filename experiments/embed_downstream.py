"""A downstream model on exported embeddings: multinomial logistic regression (numpy,
full-batch gradient descent) on the rows `jgraph embed` wrote, trained on the graph's
train split and scored on each split, beside the GNN's own scores from the run.

    jgraph train experiments/sage_facebook.yaml --devices 8 --set data.num_parts=8 \
        --workdir runs/fb
    jgraph embed runs/fb --out runs/fb/embeddings
    python experiments/embed_downstream.py runs/fb/embeddings runs/fb \
        ../shared/data/facebook_musae.npz

Prints one JSON line: {"logistic_regression": {split: accuracy}, "gnn": {...}}.
"""
import argparse
import json
import os

import numpy as np

import jgraph


def logistic_regression(x, labels, train, steps: int = 500, lr: float = 0.5,
                        l2: float = 1e-4) -> np.ndarray:
    """Weights [F + 1, C] of a softmax regression on standardised x[train]."""
    c = int(labels.max()) + 1
    w = np.zeros((x.shape[1], c))
    y = np.eye(c)[labels[train]]
    for _ in range(steps):
        z = x[train] @ w
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        w -= lr * (x[train].T @ (p - y) / train.size + l2 * w)
    return w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("embeddings", help="what `jgraph embed` wrote")
    parser.add_argument("workdir", help="the run (for its result.json)")
    parser.add_argument("graph", help="the graph's .npz (labels and splits by original id)")
    args = parser.parse_args()
    graph = jgraph.load_npz(args.graph)
    ntype = graph.node_types[0]
    labels = np.asarray(graph.node_data[ntype]["label"])
    splits = {k: np.asarray(v) for k, v in graph.splits[ntype].items() if len(v)}
    ids, rows = jgraph.read_embeddings(args.embeddings, ntype)
    x = np.zeros((labels.size, rows.shape[1]))
    x[ids] = rows
    train = splits["train"]
    x = (x - x[train].mean(0)) / (x[train].std(0) + 1e-6)
    x = np.concatenate([x, np.ones((x.shape[0], 1))], 1)        # a bias column
    w = logistic_regression(x, labels, train)
    accuracy = {s: float(np.mean((x[i] @ w).argmax(1) == labels[i])) for s, i in splits.items()}
    with open(os.path.join(args.workdir, "result.json")) as f:
        result = json.load(f)
    print(json.dumps({"logistic_regression": accuracy, "width": int(rows.shape[1]),
                      "gnn": {k: result[k] for k in ("val_acc", "test_acc") if k in result}}))


if __name__ == "__main__":
    main()
