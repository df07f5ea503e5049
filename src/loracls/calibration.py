"""Calibrated probabilities: one temperature fitted on the validation split's logits (the best checkpoint's),
judged on the test split by expected calibration error (ECE), Brier score and log loss, before and after.
The temperature is saved with the adapter and the merged model; `predict` and `serve` apply it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from sklearn.metrics import brier_score_loss, log_loss

BINS = 15
LOG_T_BOUNDS = (-3.0, 3.0)  # T in 0.05 .. 20


@dataclass
class Reliability:
    """Top-label reliability: per confidence bin, the mean confidence, the accuracy and the count."""

    confidence: list[float]
    accuracy: list[float]
    count: list[int]


@dataclass
class CalibrationQuality:
    ece: float
    brier: float
    log_loss: float
    reliability: Reliability


@dataclass
class CalibrationRecord:
    temperature: float
    before: CalibrationQuality  # test split, raw probabilities
    after: CalibrationQuality  # test split, probabilities at the fitted temperature
    note: str | None = None  # why the temperature was not fitted (kept at 1)


def check_temperature(value: float) -> float:
    """A temperature read back from a file: positive and finite, else ValueError."""
    if not (0 < value < float("inf")):
        raise ValueError(f"temperature must be a positive finite number, got {value}")
    return value


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities (float64) from logits at a temperature, computed as torch computes them (in float32):
    the one softmax of validation, test, predict and serve."""
    z = torch.from_numpy(np.asarray(logits, dtype=np.float32))
    if temperature != 1.0:
        z = z / temperature
    return torch.softmax(z, dim=-1).numpy().astype(np.float64)


def mean_nll(probs: np.ndarray, labels: list[int]) -> float:
    """The mean negative log-likelihood of the true labels: sklearn's log_loss, the one NLL of calibration,
    validation and the problems."""
    probs = _distribution(np.clip(probs, 1e-12, 1.0))
    return float(log_loss(labels, probs, labels=list(range(probs.shape[1]))))


def _distribution(probs: np.ndarray) -> np.ndarray:
    """Rows as float64 that sum to 1 (a float32 softmax sums to 1 only within ~1e-7, which sklearn flags)."""
    probs = np.asarray(probs, dtype=np.float64)
    return probs / probs.sum(axis=1, keepdims=True)


def fit_temperature(logits: np.ndarray, labels: list[int]) -> float | None:
    """The temperature minimising the validation log loss, or None when the minimum lies at the edge of
    T in [0.05, 20]: a validation split the model (nearly) never gets wrong keeps lowering its log loss as T
    shrinks, and says nothing about how confident the model should be where it errs."""

    def nll(log_t: float) -> float:
        return mean_nll(softmax(logits, float(np.exp(log_t))), labels)

    best = minimize_scalar(nll, bounds=LOG_T_BOUNDS, method="bounded")
    if min(nll(LOG_T_BOUNDS[0]), nll(LOG_T_BOUNDS[1])) <= best.fun + 1e-6:  # no minimum inside the range
        return None
    return float(np.exp(best.x))


def reliability(probs: np.ndarray, labels: list[int], bins: int = BINS) -> tuple[float, Reliability]:
    """(ECE, the bins): the count-weighted gap between confidence and accuracy over equal-width bins."""
    labels = np.asarray(labels)
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    correct = (predicted == labels).astype(float)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    table = Reliability([], [], [])
    ece = 0.0
    for b in range(bins):
        members = which == b
        if members.any():
            table.confidence.append(float(confidence[members].mean()))
            table.accuracy.append(float(correct[members].mean()))
            table.count.append(int(members.sum()))
            ece += members.mean() * abs(table.confidence[-1] - table.accuracy[-1])
    return float(ece), table


def brier_score(probs: np.ndarray, labels: list[int]) -> float:
    """Mean over examples of the squared distance to the one-hot label (0 is perfect, 2 the worst):
    sklearn's multiclass Brier score, not halved for two classes."""
    probs = _distribution(probs)
    return float(brier_score_loss(labels, probs, labels=list(range(probs.shape[1])), scale_by_half=False))


def quality(probs: np.ndarray, labels: list[int]) -> CalibrationQuality:
    ece, table = reliability(probs, labels)
    return CalibrationQuality(
        ece=ece,
        brier=brier_score(probs, labels),
        log_loss=mean_nll(probs, labels),
        reliability=table,
    )


def calibrate(
    validation_logits: np.ndarray, validation_labels: list[int], test_logits: np.ndarray, test_labels: list[int]
) -> CalibrationRecord:
    temperature, note = fit_temperature(validation_logits, validation_labels), None
    if temperature is None:
        temperature, note = (
            1.0,
            (
                "no temperature fitted: the validation log loss has no minimum inside T in "
                "[0.05, 20] (a validation split with (almost) no errors); probabilities are kept as they are"
            ),
        )
    return CalibrationRecord(
        temperature=temperature,
        before=quality(softmax(test_logits), test_labels),
        after=quality(softmax(test_logits, temperature), test_labels),
        note=note,
    )
