"""Problem types, one room each: `single_label`, `multi_label` and `label_and_comment`, registered by name in
`PROBLEMS` and chosen once from `Config.problem` (`problem_for`). Each owns its label cells, loss, decision
and metrics record; the rest of loracls asks the problem instead of branching on it. The names most callers need
(`PROBLEMS`, `Decision`, `problem_for`, `evaluation`, `AnyMetrics`, ...) are importable from here."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Discriminator, Tag

from loracls.problems.base import PROBLEMS, Decision, Problem, problem_for, register
from loracls.problems.evaluation import Evaluation, PredictionRow, evaluation, prediction_rows
from loracls.problems.label_and_comment import IGNORE_INDEX, LabelAndComment, SequenceTargets, training_sequence
from loracls.problems.multi_label import MultiLabel, multi_hot, sigmoid, tune_thresholds
from loracls.problems.single_label import SingleLabel

__all__ = [
    # its modules
    "base",
    "single_label",
    "multi_label",
    "evaluation",
    "label_and_comment",
    # and the names most callers need
    "IGNORE_INDEX",
    "PROBLEMS",
    "AnyMetrics",
    "Decision",
    "Evaluation",
    "LabelAndComment",
    "MultiLabel",
    "PredictionRow",
    "Problem",
    "SequenceTargets",
    "SingleLabel",
    "evaluation",
    "multi_hot",
    "prediction_rows",
    "problem_for",
    "register",
    "sigmoid",
    "training_sequence",
    "tune_thresholds",
]


def _problem_of(value) -> str:
    """Which problem's record a metrics mapping (or object) is: its `problem` field."""
    return value.get("problem", "single_label") if isinstance(value, dict) else value.problem


# the test metrics of any registered problem, as a field of a run record: validated as the one it names
AnyMetrics = Annotated[
    Union[tuple(Annotated[kind.metrics_type, Tag(name)] for name, kind in PROBLEMS.items())],  # noqa: UP007
    Discriminator(_problem_of),
]
