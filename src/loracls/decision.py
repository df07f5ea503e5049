"""How a classifier's logits become probabilities, labels and a loss, for both kinds of problem:

- single_label: one label a text; softmax at the fitted temperature, the top label, cross-entropy.
- multi_label: a set of labels a text; a sigmoid per label, every label at or above its own threshold (tuned
  on the validation split after training), binary cross-entropy.

Training, validation, test, predict, serve and the export check all decide through one `Decision`, saved
beside the adapter (`loracls_calibration.json`) and the merged model (`loracls_input.json`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from loracls.calibration import check_temperature, softmax

THRESHOLD_GRID = np.round(np.arange(0.05, 0.96, 0.05), 2)  # candidate per-label thresholds
DEFAULT_THRESHOLD = 0.5


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Per-label probabilities (float64), computed as torch computes them (in float32)."""
    return torch.sigmoid(torch.from_numpy(np.asarray(logits, dtype=np.float32))).numpy().astype(np.float64)


def multi_hot(label_sets: list[list[int]], num_labels: int) -> np.ndarray:
    out = np.zeros((len(label_sets), num_labels), dtype=np.float32)
    for row, ids in enumerate(label_sets):
        out[row, list(ids)] = 1.0
    return out


def check_thresholds(values: list[float] | None) -> list[float] | None:
    if values is not None and not all(0.0 < v < 1.0 for v in values):
        raise ValueError(f"thresholds must lie strictly between 0 and 1, got {values}")
    return values


@dataclass
class Decision:
    problem: str = "single_label"
    temperature: float = 1.0  # single_label: softmax(logits / T)
    thresholds: list[float] | None = None  # multi_label: one per label id; None: 0.5 for every label

    def __post_init__(self):
        if self.problem not in ("single_label", "multi_label"):
            raise ValueError(f"problem must be single_label or multi_label, got {self.problem!r}")
        check_temperature(self.temperature)
        check_thresholds(self.thresholds)

    @property
    def multi_label(self) -> bool:
        return self.problem == "multi_label"

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits) if self.multi_label else softmax(logits, self.temperature)

    def chosen(self, probs: np.ndarray) -> np.ndarray:
        """Multi-label: a boolean [n, labels] array of chosen labels; single-label: the top label id per row."""
        if not self.multi_label:
            return probs.argmax(axis=1)
        cut = np.asarray(self.thresholds) if self.thresholds is not None else DEFAULT_THRESHOLD
        return probs >= cut

    def label_of(self, probs_row: np.ndarray, id2label: dict[int, str]) -> str | list[str]:
        """One text's prediction: a label name, or the list of chosen label names (maybe empty)."""
        chosen = self.chosen(probs_row[None, :])[0]
        if self.multi_label:
            return [id2label[k] for k in np.flatnonzero(chosen)]
        return id2label[int(chosen)]


def training_loss(
    logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None, multi_label: bool, denominator: int
) -> torch.Tensor:
    """The loss of one micro-batch as its share of a step's mean over `denominator` examples: cross-entropy
    (targets: label ids; weight: per class) or binary cross-entropy averaged over labels (targets: multi-hot;
    weight: pos_weight per label)."""
    if multi_label:
        per_label = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=weight, reduction="sum")
        return per_label / (denominator * logits.shape[1])
    return F.cross_entropy(logits, targets, weight=weight, reduction="sum") / denominator


def label_tensor(labels: list, num_labels: int, multi_label: bool, device) -> torch.Tensor:
    if multi_label:
        return torch.from_numpy(multi_hot(labels, num_labels)).to(device)
    return torch.tensor(labels, device=device)


def mean_loss(probs: np.ndarray, labels: list, multi_label: bool) -> float:
    """Validation loss from probabilities: the mean negative log-likelihood (per label for multi_label)."""
    if multi_label:
        truth = multi_hot(labels, probs.shape[1])
        clipped = np.clip(probs, 1e-12, 1 - 1e-12)
        return float(-(truth * np.log(clipped) + (1 - truth) * np.log(1 - clipped)).mean())
    labels = np.asarray(labels)
    return float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)).mean())


def tune_thresholds(probs: np.ndarray, label_sets: list[list[int]]) -> list[float]:
    """Per label, the threshold on THRESHOLD_GRID with the best validation F1 (ties: the one nearest 0.5);
    a label without a positive validation example keeps 0.5."""
    truth = multi_hot(label_sets, probs.shape[1]).astype(bool)
    thresholds = []
    for k in range(probs.shape[1]):
        if not truth[:, k].any():
            thresholds.append(DEFAULT_THRESHOLD)
            continue
        best = None
        for cut in sorted(THRESHOLD_GRID, key=lambda c: abs(c - DEFAULT_THRESHOLD)):
            chosen = probs[:, k] >= cut
            hits = int((chosen & truth[:, k]).sum())
            f1 = 2 * hits / max(int(chosen.sum()) + int(truth[:, k].sum()), 1)
            if best is None or f1 > best[0] + 1e-12:
                best = (f1, float(cut))
        thresholds.append(best[1])
    return thresholds
