"""label_and_comment: one label a text and a short comment about it, both from the causal LM itself (no
classification head). The training sequence is the prompt, the label word, a newline, the comment and EOS;
the loss covers the label word and the comment, never the prompt. At inference the label is scored, not
sampled (each label word's log-probability after the prompt, as the zero-shot baseline scores it), so it is
always in the label set and its probabilities are calibrated as `single_label`'s; the comment is then
generated after the chosen label."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from loracls.errors import LoraclsError
from loracls.problem_names import PROBLEM_SUMMARIES
from loracls.problems.base import register
from loracls.problems.single_label import SingleLabel

IGNORE_INDEX = -100  # a position with no loss (transformers' convention)
COMMENT_SEPARATOR = "\n"  # between the label word and the comment
DEFAULT_TEMPLATE = "Text: {text}\nLabel:"


def label_words(verbalizers: dict[str, str] | None, id2label: dict[int, str]) -> list[str]:
    """The word trained and scored for each label id: its verbalizer, else the label name."""
    return [(verbalizers or {}).get(id2label[i], id2label[i]) for i in sorted(id2label)]


def prompt_template(input_template: str | None) -> str:
    return input_template or DEFAULT_TEMPLATE


@dataclass
class SequenceTargets:
    """One training sequence's targets, aligned with its token ids: the token each position must be (IGNORE_INDEX
    in the prompt) and its loss weight (the label word's tokens: `label_token_weight`; the comment's and EOS:
    1; the prompt: 0)."""

    token_ids: list[int]
    weights: list[float]


def training_sequence(
    prompt: list[int], label: list[int], separator: list[int], comment: list[int], eos: int, label_weight: float
) -> tuple[list[int], SequenceTargets]:
    """(token ids, targets) of prompt + label word + separator + comment + EOS."""
    answer = label + separator + comment + [eos]
    ids = prompt + answer
    weights = [0.0] * len(prompt) + [label_weight] * len(label) + [1.0] * (len(answer) - len(label))
    return ids, SequenceTargets([IGNORE_INDEX] * len(prompt) + answer, weights)


def _looks_like_a_set(cell) -> bool:
    if isinstance(cell, (list, tuple)) or hasattr(cell, "tolist"):
        return True
    text = str(cell).strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            return isinstance(json.loads(text), list)
        except ValueError:
            return False
    return False


@register
class LabelAndComment(SingleLabel):
    name = "label_and_comment"
    summary = PROBLEM_SUMMARIES["label_and_comment"]
    hf_problem_type = "single_label_classification"  # not a classifier: the merged model is the causal LM
    zero_shot_unsupported = None
    scorer = "label_words"

    def check_config(self, config) -> None:
        super().check_config(config)
        if config.comment_column is None:
            raise LoraclsError("config: problem: label_and_comment needs comment_column (the reference comments)")
        if config.long_text == "chunks":
            raise LoraclsError("config: label_and_comment reads one prompt a text: long_text: truncate or head_tail")
        if config.class_weights != "none":
            raise LoraclsError("config: class_weights apply to a classification head; label_and_comment has none")

    def clean_cells(self, labels, missing, spec, source, notes) -> list:
        sets = labels[~missing].map(_looks_like_a_set)
        if sets.any():
            row = int(sets[sets].index[0])
            raise LoraclsError(
                f"{source}: a label set in column {spec.label_column!r} at row {row}: label_and_comment takes "
                f"one label a text (label sets are problem: multi_label)"
            )
        return super().clean_cells(labels, missing, spec, source, notes)

    def carried(self, frame: pd.DataFrame, spec, source: str) -> dict[str, list]:
        """The reference comments: the column must exist and no comment may be empty."""
        column = spec.comment_column
        if column not in frame.columns:
            raise LoraclsError(f"{source}: comment column {column!r} not found (columns: {', '.join(map(str, frame))})")
        comments = frame[column]
        empty = comments.isna() | (comments.astype(str).str.strip() == "")
        if empty.any():
            row = int(empty.to_numpy().nonzero()[0][0])
            raise LoraclsError(
                f"{source}: {int(empty.sum())} empty comment(s) in column {column!r}, first at row {row}: "
                f"label_and_comment learns from every text's comment"
            )
        return {"comment": list(comments.astype(str).str.strip())}

    def targets(self, labels: list[SequenceTargets], num_labels: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Token targets and weights, [batch, width], padded on the right (as the token ids are) with no loss."""
        width = max(len(t.token_ids) for t in labels)
        ids = torch.full((len(labels), width), IGNORE_INDEX, dtype=torch.long)
        weights = torch.zeros((len(labels), width))
        for row, target in enumerate(labels):
            ids[row, : len(target.token_ids)] = torch.tensor(target.token_ids)
            weights[row, : len(target.weights)] = torch.tensor(target.weights)
        return ids.to(device), weights.to(device)

    def loss(self, logits, targets, weight, denominator) -> torch.Tensor:
        """Each sequence's weighted next-token cross-entropy over its answer tokens (label word, comment, EOS),
        averaged over those tokens; summed over the micro-batch, over the step's examples."""
        ids, weights = targets
        logits, ids, weights = logits[:, :-1], ids[:, 1:], weights[:, 1:]  # position t predicts token t + 1
        per_token = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(ids.shape)
        counted = (ids != IGNORE_INDEX).sum(dim=1).clamp(min=1)
        return ((per_token * weights).sum(dim=1) / counted).sum() / denominator
