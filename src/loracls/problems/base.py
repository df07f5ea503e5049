"""The `Problem` protocol, its registry, and the one persisted `Decision`.

A problem type owns everything that differs between "one label a text" and "a set of labels a text": how a
label cell is read, how splits are stratified, the head's loss, how logits become probabilities and labels,
the metrics record, the decision fitted on validation, and the HF `problem_type`. Types are registered by
name (as PEFT registers its tuners) and chosen once, from `Config.problem`; nothing outside `problems/`
branches on the type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from sklearn.metrics import log_loss  # per label, for label sets

from loracls.calibration import CalibrationRecord, check_temperature, mean_nll

if TYPE_CHECKING:
    import pandas as pd

PROBLEMS: dict[str, Problem] = {}


def register(cls: type[Problem]) -> type[Problem]:
    """Class decorator: one instance of each problem type, found by its `name`."""
    PROBLEMS[cls.name] = cls()
    return cls


def problem_for(name: str) -> Problem:
    """The registered problem type called `name` (ValueError names the known ones)."""
    try:
        return PROBLEMS[name]
    except KeyError:
        raise ValueError(f"problem must be one of {', '.join(PROBLEMS)}, got {name!r}") from None


def check_thresholds(values: list[float] | None) -> list[float] | None:
    if values is not None and not all(0.0 < v < 1.0 for v in values):
        raise ValueError(f"thresholds must lie strictly between 0 and 1, got {values}")
    return values


@dataclass
class Decision:
    """How logits become labels, fitted on validation and saved with the adapter and every export."""

    problem: str = "single_label"
    temperature: float = 1.0  # softmax(logits / T) (single_label)
    thresholds: list[float] | None = None  # one per label id (multi_label); None: 0.5 for every label

    def __post_init__(self):
        problem_for(self.problem)
        check_temperature(self.temperature)
        check_thresholds(self.thresholds)

    @property
    def kind(self) -> Problem:
        return PROBLEMS[self.problem]

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return self.kind.probabilities(logits, self)

    def chosen(self, probs: np.ndarray) -> np.ndarray:
        return self.kind.chosen(probs, self)

    def label_of(self, probs_row: np.ndarray, id2label: dict[int, str]) -> str | list[str]:
        """One text's prediction: a label name, or the list of chosen label names (maybe empty)."""
        return self.kind.label_of(self.chosen(probs_row[None, :])[0], id2label)


class Problem(ABC):
    """One problem type. Labels in a split are what `label_ids` returns: an id, or a sorted list of ids."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what it predicts, in a few words: the config's help for `problem`
    hf_problem_type: ClassVar[str]  # saved in the model config: transformers' pipeline reads it
    accuracy_name: ClassVar[str]  # what `accuracy` of its metrics record means, in words
    score_names: ClassVar[tuple[str, ...]]  # the scores a verdict table shows, in words
    label_heading: ClassVar[str]  # the per-label table's first column
    zero_shot_unsupported: ClassVar[str | None] = None  # why a one-word prompt cannot answer it (None: it can)
    scorer: ClassVar[str] = "head"  # model/scorers.py: "head" (a classification head) or "label_words" (the causal LM)

    # --- export ---------------------------------------------------------------------------------------

    def fold_into_head(self, head, config, decision: Decision, id2label: dict[int, str]) -> Decision:
        """Put the fitted decision into the exported model itself, so that any client's softmax (transformers'
        pipeline, TEI, vLLM) gives the calibrated probabilities; returns the decision left to apply to the
        exported logits. single_label: the temperature divides the head's weights and bias (exact)."""
        with torch.no_grad():
            head.weight.div_(decision.temperature)
            if getattr(head, "bias", None) is not None:
                head.bias.div_(decision.temperature)
        return replace(decision, temperature=1.0)

    # --- data ---------------------------------------------------------------------------------------

    def check_config(self, config) -> None:
        """Refuse settings that make no sense for this problem type (LoraclsError); none by default."""
        return None

    @abstractmethod
    def clean_cells(self, labels: pd.Series, missing: pd.Series, spec, source: str, notes: list[str]) -> list:
        """A table's label column -> cells (a label name, or a sorted tuple of names); bad cells refused."""

    def carried(self, frame: pd.DataFrame, spec, source: str) -> dict[str, list]:
        """Columns a text carries beside its label through the checks and splits (checked here): none."""
        return {}

    @abstractmethod
    def names_in(self, cell) -> tuple[str, ...]:
        """The label names one cleaned cell carries."""

    @abstractmethod
    def label_ids(self, cell, label2id: dict[str, int]):
        """One cleaned cell as the split stores it."""

    @abstractmethod
    def strata(self, cells: list, names: list[str]) -> list:
        """The keys splits are stratified by: one per distinct stratum, in a stable order."""

    @abstractmethod
    def carries(self, label, label_id: int) -> bool:
        """Whether a split's label (id or ids) carries `label_id`."""

    @abstractmethod
    def balanced_weights(self, train_labels: list, num_labels: int) -> list[float]:
        """Loss weights per label id for `class_weights: balanced`."""

    # --- the head -----------------------------------------------------------------------------------

    @abstractmethod
    def targets(self, labels: list, num_labels: int, device) -> torch.Tensor: ...

    @abstractmethod
    def loss(
        self, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None, denominator: int
    ) -> torch.Tensor:
        """One micro-batch's loss as its share of a step's mean over `denominator` examples."""

    # --- decisions and metrics ---------------------------------------------------------------------

    @abstractmethod
    def probabilities(self, logits: np.ndarray, decision: Decision) -> np.ndarray: ...

    @abstractmethod
    def softened(self, probs: np.ndarray, temperature: float) -> np.ndarray:
        """The same probabilities with their logits divided by `temperature` (> 1: softer; distillation)."""

    @abstractmethod
    def chosen(self, probs: np.ndarray, decision: Decision) -> np.ndarray:
        """The decided labels: a label id per row, or a boolean [rows, labels] array."""

    @abstractmethod
    def label_of(self, chosen_row, id2label: dict[int, str]) -> str | list[str]: ...

    @abstractmethod
    def truth(self, labels: list, num_labels: int) -> np.ndarray:
        """A split's labels in the form `chosen` returns, to compare with it."""

    def nll(self, probs: np.ndarray, labels: list) -> float:
        """The mean negative log-likelihood of the true labels (sklearn's log_loss; per label for sets)."""
        truth = self.truth(labels, probs.shape[1])
        if truth.ndim == 2:
            return float(log_loss(truth.ravel(), np.clip(probs.ravel(), 1e-12, 1 - 1e-12), labels=[0, 1]))
        return mean_nll(probs, truth)

    @abstractmethod
    def fit_decision(
        self, validation_logits: np.ndarray, validation_labels: list, test_logits: np.ndarray, test_labels: list
    ) -> tuple[Decision, CalibrationRecord | None]:
        """The decision fitted on validation (a temperature is also judged on test: its record)."""

    @abstractmethod
    def decision_from_probabilities(self, validation_probs: np.ndarray, validation_labels: list) -> Decision:
        """The decision for a model that gives probabilities directly (no temperature to fit)."""

    @abstractmethod
    def describe(self, decision: Decision, id2label: dict[int, str]) -> str:
        """The decision in one log line."""

    @abstractmethod
    def metrics(self, labels: list, probs: np.ndarray, id2label: dict[int, str], decision: Decision):
        """The test metrics record of this problem type."""

    @abstractmethod
    def scores(self, metrics) -> list[float]:
        """The values named by `score_names`, from a metrics record."""

    @abstractmethod
    def headline(self, metrics) -> float:
        """The one score a baseline's settings are chosen by on validation (accuracy; micro F1 for sets)."""

    @abstractmethod
    def thresholds(self, metrics) -> dict[str, float]:
        """Per-label thresholds a metrics record used ({}: none)."""

    def ece(self, probs: np.ndarray, labels: list) -> float | None:
        """Expected calibration error of the top label (None: not defined for this problem type)."""
        return None

    def served_fields(self, probs_row: np.ndarray, decision: Decision, id2label: dict[int, str]) -> dict:
        """What a /classify item adds to vLLM's fields for this problem type ({}: nothing)."""
        return {}

    @abstractmethod
    def beyond_ties(self, probs: np.ndarray, differ: np.ndarray, decision: Decision, margin: float) -> np.ndarray:
        """Which rows' differing decisions are not explained by `probs` sitting within `margin` of a tie."""
