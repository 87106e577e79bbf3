"""What a node classification step and its evaluation count: the masked loss, per-class
counts, and the scores (accuracy, macro-F1) made from them."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def class_counts(logits, labels, mask):
    """int32[3, C] over the rows where mask is True: per class, how many rows are of it
    (true), predicted as it (predicted), and both (correct). What accuracy and macro-F1
    need, in memory linear in the class count (a confusion matrix is C x C)."""
    num_classes = logits.shape[-1]
    pred = jnp.argmax(logits, axis=-1)
    true = jnp.where(mask, labels, 0).astype(jnp.int32)
    weight = mask.astype(jnp.int32)
    counts = jnp.zeros((3, num_classes), jnp.int32)
    counts = counts.at[0, true].add(weight).at[1, pred].add(weight)
    return counts.at[2, true].add(weight * (pred == true))


def masked_cross_entropy(logits, labels, mask):
    """(sum of losses, correct predictions, count) over the rows where mask is True."""
    labels = jnp.where(mask, labels, 0).astype(jnp.int32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels) & mask
    return (jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(correct, dtype=jnp.int32),
            jnp.sum(mask, dtype=jnp.int32))



def accuracy(logits, labels, mask) -> float:
    """The share of `mask`'s rows whose highest score is their label (arrays of one
    layout, row-sharded or not), counted where they live (`class_counts`); 0 for none."""
    true, _, correct = np.asarray(_class_counts(logits, labels, mask)).sum(axis=1)
    return int(correct) / max(int(true), 1)


_class_counts = jax.jit(class_counts)


@jax.jit
def _probability_counts(probs, labels, mask):
    """class_counts and the summed negative log-likelihood of the rows' labels."""
    truth = jnp.take_along_axis(probs, jnp.where(mask, labels, 0)[:, None], axis=1)[:, 0]
    nll = -jnp.log(jnp.maximum(truth, 1e-12))
    return class_counts(probs, labels, mask), jnp.sum(jnp.where(mask, nll, 0.0))


def probability_scores(probs, labels, mask) -> dict[str, float]:
    """`scores` of class probabilities (float [n, C]) against `labels` where `mask`
    is True, with `loss`: their mean negative log-likelihood (the cross-entropy a
    model's logits give; a probability of 0 counts as 1e-12)."""
    classes, nll = _probability_counts(probs, labels, mask)
    out = scores(np.asarray(classes))
    out["loss"] = float(nll) / max(out["count"], 1)
    return out


def scores(classes: np.ndarray) -> dict[str, float]:
    """accuracy and macro-F1 from per-class counts [3, C] (true, predicted, correct; see
    `class_counts`): macro-F1 is the mean F1 over the classes that occur in the labels
    or the predictions, as scikit-learn's f1_score(average="macro") on those labels."""
    true, pred, tp = np.asarray(classes, np.float64)
    total = true.sum()
    present = (true + pred) > 0
    f1 = np.where(present, 2 * tp / np.maximum(true + pred, 1), 0.0)
    return {"acc": float(tp.sum() / total) if total else float("nan"),
            "macro_f1": float(f1[present].mean()) if present.any() else float("nan"),
            "count": int(total)}
