"""multi_label: a set of labels a text (maybe empty); a sigmoid per label, every label at or above its own
threshold (tuned on the validation split after training), binary cross-entropy."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F

from loracls.errors import LoraclsError, shown
from loracls.metrics import MultiLabelMetrics, multilabel_metrics
from loracls.problem_names import PROBLEM_SUMMARIES
from loracls.problems.base import Decision, Problem, register

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


def _label_set(value, separator: str | None, source: str, row: int) -> tuple[str, ...]:
    """One cell -> its sorted label names: a list (JSONL / Parquet), a JSON list in text ("[\"a\"]"), text
    split by `label_separator`, or one label."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{") and text.endswith("}"):
            raise LoraclsError(
                f"{source}: row {row}: label cell {text[:40]!r} is a mapping, not a label set; give "
                f"a list of labels or text split by label_separator"
            )
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise LoraclsError(
                    f"{source}: row {row}: label cell {text[:40]!r} starts like a JSON list but is not one"
                ) from None
        else:
            value = [] if not text else text.split(separator) if separator is not None else [text]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise LoraclsError(
            f"{source}: row {row}: a multi_label cell must be a list of labels or text, got "
            f"{type(value).__name__} {value!r:.40}"
        )
    odd = [v for v in value if not isinstance(v, str)]
    if odd:
        raise LoraclsError(
            f"{source}: row {row}: a multi_label cell must list label names as strings, got "
            f"{type(odd[0]).__name__} {odd[0]!r:.40} in {value!r:.60}"
        )
    names = [str(v).strip() for v in value]
    if any(not name for name in names):
        raise LoraclsError(f"{source}: row {row}: blank label name in {value!r}")
    return tuple(sorted(set(names)))


def _cell_format(value) -> str | None:
    """ "list" (a list, or text that starts like a JSON list), "bare" (other text or a value), None (empty)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return "list"
    text = str(value).strip()
    return None if not text else "list" if text.startswith("[") else "bare"


def _check_one_format(cells, source: str) -> None:
    """A file's label cells are all lists or all text: a bare `5` among `["a"]` cells would be a label of its
    own that no other text carries (a mistake in the file, not a label set)."""
    first: dict[str, int] = {}
    for row, value in enumerate(cells):
        kind = _cell_format(value)
        if kind is not None and kind not in first:
            first[kind] = row
            if len(first) == 2:
                break
    if len(first) == 2:
        shown_list, shown_bare = (shown(cells.iloc[first[k]]) for k in ("list", "bare"))
        raise LoraclsError(
            f"{source}: label cells mix lists (first at row {first['list']}: {shown_list}) and bare values "
            f"(first at row {first['bare']}: {shown_bare}); write every cell one way: a list of labels, or text "
            f"split by label_separator"
        )


@register
class MultiLabel(Problem):
    name = "multi_label"
    summary = PROBLEM_SUMMARIES["multi_label"]
    hf_problem_type = "multi_label_classification"
    accuracy_name = "subset accuracy"
    score_names = ("subset accuracy", "micro F1", "macro F1")
    label_heading = "label"
    metrics_type = MultiLabelMetrics
    zero_shot_unsupported = (
        "it picks one label word after a prompt, and a multi_label text may carry several "
        "labels or none (TF-IDF one-vs-rest and the encoder stay)"
    )

    def check_config(self, config) -> None:
        if config.balance:
            raise LoraclsError(
                "config: balance: true needs one label a text; multi_label splits keep the data's "
                "proportions of label sets"
            )
        if config.head_init == "verbalizer":
            raise LoraclsError(
                "config: head_init: verbalizer reads one label word after a prompt; with "
                "problem: multi_label use zero or random"
            )

    def clean_cells(self, labels, missing, spec, source, notes) -> list:
        """An empty cell (CSV reads it as missing) is the empty set."""
        cells = labels.where(~missing, "")
        sets = [_label_set(value, spec.label_separator, source, row) for row, value in enumerate(cells)]
        _check_one_format(cells, source)
        if empty := sum(1 for names in sets if not names):
            notes.append(f"{source}: {empty} text(s) carry no label (kept: an empty set is a valid answer)")
        return sets

    def names_in(self, cell) -> tuple[str, ...]:
        return cell

    def label_ids(self, cell, label2id: dict[str, int]) -> list[int]:
        return sorted(label2id[name] for name in cell)

    def strata(self, cells: list, names: list[str]) -> list:
        """Label sets: each split keeps the data's proportions of label sets."""
        return sorted(set(cells))

    def carries(self, label, label_id: int) -> bool:
        return label_id in label

    def balanced_weights(self, train_labels: list, num_labels: int) -> list[float]:
        """BCE's pos_weight per label: its negatives / its positives (1 for a label no text carries)."""
        carried = multi_hot(train_labels, num_labels).sum(axis=0)
        total = len(train_labels)
        return [float((total - n) / n) if n else 1.0 for n in carried]

    def targets(self, labels: list, num_labels: int, device) -> torch.Tensor:
        return torch.from_numpy(multi_hot(labels, num_labels)).to(device)

    def loss(self, logits, targets, weight, denominator) -> torch.Tensor:
        """Binary cross-entropy averaged over labels (weight: pos_weight per label)."""
        per_label = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=weight, reduction="sum")
        return per_label / (denominator * logits.shape[1])

    def probabilities(self, logits: np.ndarray, decision: Decision) -> np.ndarray:
        return sigmoid(logits)

    def softened(self, probs: np.ndarray, temperature: float) -> np.ndarray:
        """sigmoid(logit(p) / T), each label on its own."""
        p = np.clip(probs, 1e-12, 1 - 1e-7)
        return sigmoid((np.log(p) - np.log1p(-p)) / temperature)

    def chosen(self, probs: np.ndarray, decision: Decision) -> np.ndarray:
        cut = np.asarray(decision.thresholds) if decision.thresholds is not None else DEFAULT_THRESHOLD
        return probs >= cut

    def label_of(self, chosen_row, id2label: dict[int, str]) -> list[str]:
        return [id2label[k] for k in np.flatnonzero(chosen_row)]

    def truth(self, labels: list, num_labels: int) -> np.ndarray:
        return multi_hot(labels, num_labels).astype(bool)

    def fit_decision(self, validation_logits, validation_labels, test_logits, test_labels):
        return self.decision_from_probabilities(sigmoid(validation_logits), validation_labels), None

    def decision_from_probabilities(self, validation_probs, validation_labels) -> Decision:
        return Decision(self.name, thresholds=tune_thresholds(validation_probs, validation_labels))

    def describe(self, decision: Decision, id2label: dict[int, str]) -> str:
        cuts = decision.thresholds or [DEFAULT_THRESHOLD] * len(id2label)
        return "per-label thresholds tuned on validation (best F1 each): " + ", ".join(
            f"{id2label[k]}={t:.2f}" for k, t in enumerate(cuts)
        )

    def metrics(self, labels, probs, id2label, decision) -> MultiLabelMetrics:
        chosen = self.chosen(probs, decision)
        cuts = decision.thresholds or [DEFAULT_THRESHOLD] * len(id2label)
        return multilabel_metrics(self.truth(labels, len(id2label)), chosen, id2label, cuts)

    def scores(self, metrics: MultiLabelMetrics) -> list[float]:
        return [metrics.accuracy, metrics.micro_f1, metrics.macro_f1]

    def headline(self, metrics: MultiLabelMetrics) -> float:
        """Micro F1: subset accuracy is near 0 for most models with many labels and cannot rank them."""
        return metrics.micro_f1

    def thresholds(self, metrics: MultiLabelMetrics) -> dict[str, float]:
        return metrics.thresholds

    def fold_into_head(self, head, config, decision: Decision, id2label: dict[int, str]) -> Decision:
        """A sigmoid per label needs no temperature; the per-label thresholds go into the model config
        (`loracls_thresholds`, by label name) and the model card for clients that read probabilities."""
        cut = decision.thresholds or [DEFAULT_THRESHOLD] * len(id2label)
        config.loracls_thresholds = {id2label[i]: float(t) for i, t in enumerate(cut)}
        return decision

    def served_fields(self, probs_row, decision, id2label) -> dict:
        """`labels`: every label at or above its threshold (maybe none)."""
        return {"labels": decision.label_of(probs_row, id2label)}

    def beyond_ties(self, probs, differ, decision, margin) -> np.ndarray:
        """A differing label counts where the adapter's probability was more than `margin` from its threshold."""
        cut = np.asarray(decision.thresholds) if decision.thresholds is not None else DEFAULT_THRESHOLD
        return (differ & (np.abs(probs - cut) > margin)).any(axis=1)
