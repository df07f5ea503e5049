"""Classification metrics (sklearn) as a typed record, the rows of a predictions JSONL, and their text form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

from loracls.decision import DEFAULT_THRESHOLD, Decision, multi_hot


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
    per_class = {
        id2label[k]: ClassMetrics(float(precision[i]), float(recall[i]), float(f1[i]), int(support[i]))
        for i, k in enumerate(ids)
    }
    return ClassificationMetrics(
        accuracy=float(accuracy_score(labels, predictions)),
        macro_f1=float(np.mean(f1)),
        per_class=per_class,
        confusion_matrix=ConfusionMatrix(
            [id2label[k] for k in ids], confusion_matrix(labels, predictions, labels=ids).tolist()
        ),
        examples=len(labels),
    )


@dataclass
class MultiLabelMetrics:
    """A set of labels per text: `accuracy` is subset accuracy (the whole set right), F1 micro and macro
    over labels, and per label precision / recall / F1 / support (texts that carry it)."""

    accuracy: float
    micro_f1: float
    macro_f1: float
    per_class: dict[str, ClassMetrics]
    examples: int
    thresholds: dict[str, float]  # the per-label thresholds the predictions used
    mean_labels: float  # labels per text, true sets
    mean_predicted_labels: float


def _problem_of(value) -> str:
    """Which record a metrics mapping (or object) is: label sets have micro F1."""
    has_micro = "micro_f1" in value if isinstance(value, dict) else hasattr(value, "micro_f1")
    return "multi_label" if has_micro else "single_label"


def _discriminated():
    from pydantic import Discriminator, Tag

    return Annotated[
        Annotated[ClassificationMetrics, Tag("single_label")] | Annotated[MultiLabelMetrics, Tag("multi_label")],
        Discriminator(_problem_of),
    ]


def multilabel_metrics(
    label_sets: list[list[int]], probs: np.ndarray, id2label: dict[int, str], thresholds: list[float] | None = None
) -> MultiLabelMetrics:
    ids = sorted(id2label)
    decision = Decision("multi_label", thresholds=thresholds)
    truth, chosen = multi_hot(label_sets, len(ids)).astype(int), decision.chosen(probs).astype(int)
    precision, recall, f1, support = precision_recall_fscore_support(truth, chosen, zero_division=0)
    micro = precision_recall_fscore_support(truth, chosen, average="micro", zero_division=0)[2]
    cuts = thresholds or [DEFAULT_THRESHOLD] * len(ids)
    return MultiLabelMetrics(
        accuracy=float(accuracy_score(truth, chosen)),
        micro_f1=float(micro),
        macro_f1=float(np.mean(f1)),
        per_class={
            id2label[k]: ClassMetrics(float(precision[k]), float(recall[k]), float(f1[k]), int(support[k])) for k in ids
        },
        examples=len(label_sets),
        thresholds={id2label[k]: float(cuts[k]) for k in ids},
        mean_labels=float(truth.sum(axis=1).mean()) if len(truth) else 0.0,
        mean_predicted_labels=float(chosen.sum(axis=1).mean()) if len(chosen) else 0.0,
    )


# the test metrics of either problem, as a field of a run record: validated as the one its keys say
AnyMetrics = _discriminated()


def evaluation_metrics(labels: list, probs: np.ndarray, id2label: dict[int, str], decision=None):
    """The metrics of either kind of problem, by the decision that turns probabilities into labels."""
    if decision is not None and decision.multi_label:
        return multilabel_metrics(labels, probs, id2label, decision.thresholds)
    return classification_metrics(labels, probs, id2label)


def prediction_rows(
    texts: list[str], labels: list | None, probs: np.ndarray, id2label: dict[int, str], decision=None
) -> list[dict]:
    """One row a text: its label (or label set) when known, the prediction, and every label's probability."""
    decision = decision or Decision()
    rows = []
    for i, text in enumerate(texts):
        row = {"text": text}
        if labels is not None:
            row["label"] = [id2label[k] for k in labels[i]] if decision.multi_label else id2label[labels[i]]
        row["prediction"] = decision.label_of(probs[i], id2label)
        row["probabilities"] = {id2label[k]: round(float(p), 6) for k, p in enumerate(probs[i])}
        rows.append(row)
    return rows


def format_metrics(metrics: ClassificationMetrics | MultiLabelMetrics) -> str:
    if isinstance(metrics, MultiLabelMetrics):
        return _format_multilabel(metrics)
    names = metrics.confusion_matrix.labels
    width = max(8, *(len(n) for n in names))
    lines = [
        f"accuracy {metrics.accuracy:.4f}   macro F1 {metrics.macro_f1:.4f}   ({metrics.examples} examples)",
        f"{'class':<{width}}  precision  recall     f1  support",
    ]
    for name, row in metrics.per_class.items():
        lines.append(f"{name:<{width}}  {row.precision:9.4f}  {row.recall:6.4f}  {row.f1:5.4f}  {row.support:7d}")
    lines.append("confusion matrix (rows: true, columns: predicted)")
    lines.append(" " * width + "  " + "  ".join(f"{n:>{width}}" for n in names))
    for name, row in zip(names, metrics.confusion_matrix.matrix):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{width}d}" for v in row))
    return "\n".join(lines)


def _format_multilabel(metrics: MultiLabelMetrics) -> str:
    width = max(8, *(len(n) for n in metrics.per_class))
    lines = [
        f"subset accuracy {metrics.accuracy:.4f}   micro F1 {metrics.micro_f1:.4f}   macro F1 "
        f"{metrics.macro_f1:.4f}   ({metrics.examples} examples; {metrics.mean_labels:.2f} labels a text, "
        f"{metrics.mean_predicted_labels:.2f} predicted)",
        f"{'label':<{width}}  threshold  precision  recall     f1  support",
    ]
    for name, row in metrics.per_class.items():
        lines.append(
            f"{name:<{width}}  {metrics.thresholds[name]:9.2f}  {row.precision:9.4f}  {row.recall:6.4f}  "
            f"{row.f1:5.4f}  {row.support:7d}"
        )
    return "\n".join(lines)
