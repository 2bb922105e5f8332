"""How well a router's tiers match the labels: accuracy, per-class recall, precision, F1 and
macro-F1 over tier indexes (A, B, C order). No torch: promotion scores any exported version with it,
including the bag-of-words router a torch-less setup retrains."""

from __future__ import annotations

from collections.abc import Sequence

from adaptive_rag.contracts import TIERS

LABELS = [t.value for t in TIERS]


def confusion_matrix(truth: Sequence[int], predicted: Sequence[int], n: int = 3) -> list[list[int]]:
    """Rows: true label; columns: predicted label."""
    matrix = [[0] * n for _ in range(n)]
    for t, p in zip(truth, predicted):
        matrix[t][p] += 1
    return matrix


def classification_metrics(truth: Sequence[int], predicted: Sequence[int]) -> dict:
    """Accuracy, per-class recall (the paper's per-class accuracy), precision, F1, macro-F1."""
    matrix = confusion_matrix(truth, predicted)
    total = len(truth)
    per_class = {}
    f1s = []
    for i, label in enumerate(LABELS):
        tp = matrix[i][i]
        support = sum(matrix[i])
        predicted_i = sum(row[i] for row in matrix)
        recall = tp / support if support else float("nan")
        precision = tp / predicted_i if predicted_i else float("nan")
        f1 = (
            2 * precision * recall / (precision + recall)
            if support and predicted_i and precision + recall else 0.0
        )
        if support:
            f1s.append(f1)
        per_class[label] = {"recall": recall, "precision": precision, "f1": f1, "support": support}
    return {
        "n": total,
        "accuracy": sum(matrix[i][i] for i in range(3)) / total if total else float("nan"),
        "macro_f1": sum(f1s) / len(f1s) if f1s else float("nan"),
        "per_class": per_class,
        "confusion_matrix": matrix,
    }
