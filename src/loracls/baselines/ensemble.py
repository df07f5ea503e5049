"""The ensemble row of the verdict: LoRA's and the strongest encoder's calibrated probabilities averaged.

Two unlike models (a decoder read at its last token, an encoder read at every token) make unlike mistakes,
and both are already trained in every run: the blend costs no training, only both models at inference.
LoRA's weight w is chosen on the validation split alone from a grid (0, 0.05, ..., 1); a label set's
per-label thresholds are refitted on the blended validation probabilities; the test split only scores the
choice. A weight of 0 or 1 is one model alone: no row is added.
"""

from __future__ import annotations

import numpy as np

from loracls.run_records import EnsembleRecord

__all__ = ["WEIGHTS", "blend", "fit_ensemble"]

WEIGHTS = np.round(np.linspace(0.0, 1.0, 21), 2)  # LoRA's share of the blend


def blend(lora: np.ndarray, encoder: np.ndarray, weight: float) -> np.ndarray:
    """The weighted mean of two models' calibrated probabilities (rows still sum to 1 for one label a text)."""
    return weight * lora + (1.0 - weight) * encoder


def _score(kind, labels: list, probs: np.ndarray, id2label: dict[int, str], select_by: str) -> tuple:
    """(validation score by select_by, higher is better; the decision fitted on these probabilities)."""
    decision = kind.decision_from_probabilities(probs, labels)
    if select_by == "loss":
        return -kind.nll(probs, labels), decision
    metrics = kind.metrics(labels, probs, id2label, decision)
    return (metrics.macro_f1 if select_by == "macro_f1" else kind.headline(metrics)), decision


def fit_ensemble(
    dataset, select_by: str, encoder: str, lora: dict[str, np.ndarray], other: dict[str, np.ndarray]
) -> EnsembleRecord | None:
    """LoRA's weight chosen on validation (ties: the lower validation loss), scored on test; None where
    the best weight is one model alone (0 or 1)."""
    kind, id2label = dataset.kind, dataset.id2label
    labels = dataset.validation.labels
    scores, decisions, losses = {}, {}, {}
    for weight in map(float, WEIGHTS):
        probs = blend(lora["validation"], other["validation"], weight)
        scores[weight], decisions[weight] = _score(kind, labels, probs, id2label, select_by)
        losses[weight] = kind.nll(probs, labels)
    weight = max(scores, key=lambda w: (scores[w], -losses[w]))  # ties (accuracy moves in steps): the lower loss
    if weight in (0.0, 1.0):
        return None
    decision = decisions[weight]
    probs = blend(lora["test"], other["test"], weight)
    return EnsembleRecord(
        encoder=encoder,
        weight=weight,
        validation_score=scores[weight],
        validation_scores={f"{w:g}": s for w, s in scores.items()},
        test=kind.metrics(dataset.test.labels, probs, id2label, decision),
        thresholds=decision.thresholds,
        test_ece=kind.ece(probs, dataset.test.labels),
    )
