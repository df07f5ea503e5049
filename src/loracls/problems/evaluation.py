"""Probabilities -> what a split's evaluation says: the metrics record, the loss, and one typed row a text.
The one place validation, test, the baselines, `evaluate` and the export checks turn probabilities into
numbers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loracls.problems.base import Decision


@dataclass
class PredictionRow:
    """One line of a predictions JSONL: the text, its true label (set) when known, the decision and every
    label's probability."""

    text: str
    prediction: str | list[str]
    probabilities: dict[str, float]
    label: str | list[str] | None = None

    def to_json(self) -> dict:
        row = {"text": self.text}
        if self.label is not None:
            row["label"] = self.label
        row.update(prediction=self.prediction, probabilities=self.probabilities)
        return row


@dataclass
class Evaluation:
    """A split scored: its metrics record, mean negative log-likelihood, and rows."""

    metrics: object  # the problem's metrics record (ClassificationMetrics, MultiLabelMetrics)
    loss: float
    rows: list[PredictionRow]

    @property
    def finite(self) -> bool:
        return bool(np.isfinite(self.loss))


def prediction_rows(
    texts: list[str], labels: list | None, probs: np.ndarray, id2label: dict[int, str], decision: Decision
) -> list[PredictionRow]:
    kind, chosen = decision.kind, decision.chosen(probs)
    truth = None if labels is None else [kind.label_of(row, id2label) for row in kind.truth(labels, len(id2label))]
    return [
        PredictionRow(
            text=text,
            prediction=kind.label_of(chosen[i], id2label),
            probabilities={id2label[k]: round(float(p), 6) for k, p in enumerate(probs[i])},
            label=None if truth is None else truth[i],
        )
        for i, text in enumerate(texts)
    ]


def evaluation(
    texts: list[str], labels: list, probs: np.ndarray, id2label: dict[int, str], decision: Decision
) -> Evaluation:
    """Metrics, loss and rows of one labelled split (probabilities that are not finite give loss nan and no
    metrics: the caller stops on them)."""
    if not np.isfinite(probs).all():
        return Evaluation(metrics=None, loss=float("nan"), rows=[])
    kind = decision.kind
    return Evaluation(
        metrics=kind.metrics(labels, probs, id2label, decision),
        loss=kind.nll(probs, labels),
        rows=prediction_rows(texts, labels, probs, id2label, decision),
    )
