"""Classification metrics (sklearn) as a typed record, the rows of a predictions JSONL, and their text form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    problem: Literal["single_label"] = "single_label"

    def text(self) -> str:
        """The metrics as a plain-text table, for the log."""
        names = self.confusion_matrix.labels
        width = max(8, *(len(n) for n in names))
        lines = [
            f"accuracy {self.accuracy:.4f}   macro F1 {self.macro_f1:.4f}   ({self.examples} examples)",
            f"{'class':<{width}}  precision  recall     f1  support",
        ]
        for name, row in self.per_class.items():
            lines.append(f"{name:<{width}}  {row.precision:9.4f}  {row.recall:6.4f}  {row.f1:5.4f}  {row.support:7d}")
        lines.append("confusion matrix (rows: true, columns: predicted)")
        lines.append(" " * width + "  " + "  ".join(f"{n:>{width}}" for n in names))
        for name, row in zip(names, self.confusion_matrix.matrix):
            lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{width}d}" for v in row))
        return "\n".join(lines)


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
    problem: Literal["multi_label"] = "multi_label"

    def text(self) -> str:
        """The metrics as a plain-text table, for the log."""
        width = max(8, *(len(n) for n in self.per_class))
        lines = [
            f"subset accuracy {self.accuracy:.4f}   micro F1 {self.micro_f1:.4f}   macro F1 "
            f"{self.macro_f1:.4f}   ({self.examples} examples; {self.mean_labels:.2f} labels a text, "
            f"{self.mean_predicted_labels:.2f} predicted)",
            f"{'label':<{width}}  threshold  precision  recall     f1  support",
        ]
        for name, row in self.per_class.items():
            lines.append(
                f"{name:<{width}}  {self.thresholds[name]:9.2f}  {row.precision:9.4f}  {row.recall:6.4f}  "
                f"{row.f1:5.4f}  {row.support:7d}"
            )
        return "\n".join(lines)


def multilabel_metrics(
    truth: np.ndarray, chosen: np.ndarray, id2label: dict[int, str], thresholds: list[float]
) -> MultiLabelMetrics:
    """From boolean [texts, labels] arrays: the true label sets and the chosen ones (at `thresholds`)."""
    ids = sorted(id2label)
    truth, chosen = truth.astype(int), chosen.astype(int)
    precision, recall, f1, support = precision_recall_fscore_support(truth, chosen, zero_division=0)
    micro = precision_recall_fscore_support(truth, chosen, average="micro", zero_division=0)[2]
    return MultiLabelMetrics(
        accuracy=float(accuracy_score(truth, chosen)),
        micro_f1=float(micro),
        macro_f1=float(np.mean(f1)),
        per_class={
            id2label[k]: ClassMetrics(float(precision[k]), float(recall[k]), float(f1[k]), int(support[k])) for k in ids
        },
        examples=len(truth),
        thresholds={id2label[k]: float(thresholds[k]) for k in ids},
        mean_labels=float(truth.sum(axis=1).mean()) if len(truth) else 0.0,
        mean_predicted_labels=float(chosen.sum(axis=1).mean()) if len(chosen) else 0.0,
    )


def format_metrics(metrics: ClassificationMetrics | MultiLabelMetrics) -> str:
    return metrics.text()


def comment_scores(generated: list[str], references: list[str]) -> tuple[float, float]:
    """(mean ROUGE-L F1, corpus chrF) of generated comments against their references: rouge-score and
    sacrebleu, no metric of our own."""
    from rouge_score import rouge_scorer
    from sacrebleu.metrics import CHRF

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [scorer.score(ref, gen)["rougeL"].fmeasure for gen, ref in zip(generated, references)]
    chrf = CHRF().corpus_score(generated, [references]).score
    return float(sum(rouge) / max(len(rouge), 1)), float(chrf)
