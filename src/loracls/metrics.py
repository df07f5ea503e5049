"""Classification metrics (sklearn) as a typed record, the rows of a predictions JSONL, and their text form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support


@dataclass
class ClassMetrics:
    precision: float
    recall: float
    f1: float
    support: int


@dataclass
class ConfusionMatrix:
    labels: list[str]
    matrix: list[list[int]]  # rows: true, columns: predicted

    def __post_init__(self):
        n = len(self.labels)
        if n == 0 or len(self.matrix) != n or any(len(row) != n for row in self.matrix):
            raise ValueError(f"the confusion matrix must be {n} x {n} for {n} labels (and n > 0)")


@dataclass
class ClassificationMetrics:
    accuracy: float
    macro_f1: float
    per_class: dict[str, ClassMetrics]
    confusion_matrix: ConfusionMatrix
    examples: int


def classification_metrics(labels: list[int], probs: np.ndarray, id2label: dict[int, str]) -> ClassificationMetrics:
    """Accuracy, per-class precision/recall/F1/support, macro F1, and the confusion matrix (rows = true)."""
    ids = sorted(id2label)
    predictions = probs.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(labels, predictions, labels=ids, zero_division=0)
    per_class = {id2label[k]: ClassMetrics(float(precision[i]), float(recall[i]), float(f1[i]), int(support[i]))
                 for i, k in enumerate(ids)}
    return ClassificationMetrics(
        accuracy=float(accuracy_score(labels, predictions)), macro_f1=float(np.mean(f1)), per_class=per_class,
        confusion_matrix=ConfusionMatrix([id2label[k] for k in ids],
                                         confusion_matrix(labels, predictions, labels=ids).tolist()),
        examples=len(labels))


def prediction_rows(texts: list[str], labels: list[int] | None, probs: np.ndarray, id2label: dict[int, str]) -> list[dict]:
    rows = []
    for i, text in enumerate(texts):
        row = {"text": text}
        if labels is not None:
            row["label"] = id2label[labels[i]]
        row["prediction"] = id2label[int(probs[i].argmax())]
        row["probabilities"] = {id2label[k]: round(float(p), 6) for k, p in enumerate(probs[i])}
        rows.append(row)
    return rows


def format_metrics(metrics: ClassificationMetrics) -> str:
    names = metrics.confusion_matrix.labels
    width = max(8, *(len(n) for n in names))
    lines = [f"accuracy {metrics.accuracy:.4f}   macro F1 {metrics.macro_f1:.4f}   ({metrics.examples} examples)",
             f"{'class':<{width}}  precision  recall     f1  support"]
    for name, row in metrics.per_class.items():
        lines.append(f"{name:<{width}}  {row.precision:9.4f}  {row.recall:6.4f}  {row.f1:5.4f}  {row.support:7d}")
    lines.append("confusion matrix (rows: true, columns: predicted)")
    lines.append(" " * width + "  " + "  ".join(f"{n:>{width}}" for n in names))
    for name, row in zip(names, metrics.confusion_matrix.matrix):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{width}d}" for v in row))
    return "\n".join(lines)
