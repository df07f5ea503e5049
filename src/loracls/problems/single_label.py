"""single_label: one label a text; softmax at the temperature fitted on validation, the top label,
cross-entropy."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from loracls.calibration import CalibrationRecord, calibrate, reliability, softmax
from loracls.errors import LoraclsError
from loracls.metrics import ClassificationMetrics, classification_metrics
from loracls.problem_names import PROBLEM_SUMMARIES
from loracls.problems.base import Decision, Problem, register


@register
class SingleLabel(Problem):
    name = "single_label"
    summary = PROBLEM_SUMMARIES["single_label"]
    hf_problem_type = "single_label_classification"
    accuracy_name = "accuracy"
    score_names = ("accuracy", "macro F1")
    label_heading = "class"
    metrics_type = ClassificationMetrics

    def check_config(self, config) -> None:
        if config.label_separator is not None:
            raise LoraclsError("config: label_separator splits label sets: it needs problem: multi_label")

    def clean_cells(self, labels, missing, spec, source, notes) -> list:
        if missing.any():
            row = int(missing.to_numpy().nonzero()[0][0])
            raise LoraclsError(f"{source}: missing label in column {spec.label_column!r} at row {row}")
        raw = labels.astype(str)
        stripped = raw.str.strip()
        if (stripped == "").any():
            raise LoraclsError(
                f"{source}: blank label in column {spec.label_column!r} at row "
                f"{int((stripped == '').to_numpy().nonzero()[0][0])}"
            )
        if changed := int((stripped != raw).sum()):
            notes.append(f"{source}: removed surrounding spaces from {changed} label(s)")
        return list(stripped)

    def names_in(self, cell) -> tuple[str, ...]:
        return (cell,)

    def label_ids(self, cell, label2id: dict[str, int]) -> int:
        return label2id[cell]

    def strata(self, cells: list, names: list[str]) -> list:
        return list(names)

    def carries(self, label, label_id: int) -> bool:
        return label == label_id

    def balanced_weights(self, train_labels: list, num_labels: int) -> list[float]:
        """n / (classes x n_class), as sklearn's compute_class_weight; a class absent from train keeps 1."""
        from sklearn.utils.class_weight import compute_class_weight

        present = sorted(set(train_labels))
        computed = compute_class_weight("balanced", classes=np.array(present), y=np.array(train_labels))
        by_id = dict(zip(present, computed))
        return [float(by_id.get(i, 1.0)) for i in range(num_labels)]

    def targets(self, labels: list, num_labels: int, device) -> torch.Tensor:
        return torch.tensor(labels, device=device)

    def loss(self, logits, targets, weight, denominator) -> torch.Tensor:
        """Cross-entropy summed over the micro-batch (weight: per class), over the step's examples."""
        return F.cross_entropy(logits, targets, weight=weight, reduction="sum") / denominator

    def probabilities(self, logits: np.ndarray, decision: Decision) -> np.ndarray:
        return softmax(logits, decision.temperature)

    def softened(self, probs: np.ndarray, temperature: float) -> np.ndarray:
        """softmax(log p / T): the logits up to a constant per row, divided by T."""
        return softmax(np.log(np.clip(probs, 1e-12, 1.0)), temperature)

    def chosen(self, probs: np.ndarray, decision: Decision) -> np.ndarray:
        return probs.argmax(axis=1)

    def label_of(self, chosen_row, id2label: dict[int, str]) -> str:
        return id2label[int(chosen_row)]

    def truth(self, labels: list, num_labels: int) -> np.ndarray:
        return np.asarray(labels, dtype=np.int64)

    def fit_decision(self, validation_logits, validation_labels, test_logits, test_labels):
        record: CalibrationRecord = calibrate(validation_logits, validation_labels, test_logits, test_labels)
        return Decision(self.name, temperature=record.temperature), record

    def decision_from_probabilities(self, validation_probs, validation_labels) -> Decision:
        return Decision(self.name)

    def describe(self, decision: Decision, id2label: dict[int, str]) -> str:
        return f"temperature {decision.temperature:.3f} (fitted on validation)"

    def metrics(self, labels, probs, id2label, decision) -> ClassificationMetrics:
        return classification_metrics(labels, probs, id2label)

    def scores(self, metrics: ClassificationMetrics) -> list[float]:
        return [metrics.accuracy, metrics.macro_f1]

    def ece(self, probs: np.ndarray, labels: list) -> float:
        return reliability(probs, labels)[0]

    def headline(self, metrics: ClassificationMetrics) -> float:
        return metrics.accuracy

    def thresholds(self, metrics) -> dict[str, float]:
        return {}

    def beyond_ties(self, probs, differ, decision, margin) -> np.ndarray:
        """A differing top label counts where the adapter's top two classes were more than `margin` apart."""
        top2 = np.sort(probs, axis=1)[:, -2:]
        return differ & ((top2[:, 1] - top2[:, 0]) > margin)
