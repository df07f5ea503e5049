"""The typed records a run writes: what each file of a run directory holds (the layout and the validated
readers are in loracls.runs, which re-exports these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from loracls.calibration import CalibrationRecord
from loracls.metrics import ClassificationMetrics
from loracls.problems import PROBLEMS, AnyMetrics
from loracls.verdict import Verdict

__all__ = [
    "BaselineRecord",
    "TfidfRecord",
    "EncoderRecord",
    "EnsembleRecord",
    "SkippedBaseline",
    "BaselineSummary",
    "ValidationSummary",
    "TrainSummary",
    "ModelSummary",
    "ExportCheck",
    "UntrainedRecord",
    "CommentMetrics",
    "Metrics",
    "TrainLogLine",
    "ValidationLogLine",
    "StudentRecord",
    "Record",
    "PROBLEM_TAGS",
]


@dataclass
class BaselineRecord:
    """baseline.json: the zero-shot prompt baseline on the test split, plain and calibrated."""

    prompt_template: str
    verbalizers: dict[str, str]
    zero_shot: ClassificationMetrics
    calibrated: ClassificationMetrics
    content_free_probabilities: list[float]
    texts_per_second: float | None = None  # the test split's prompts, scored
    calibrated_ece: float | None = None
    parameters: int | None = None  # the base causal LM's


@dataclass
class TfidfRecord:
    """tfidf.json: the TF-IDF + logistic regression baseline on the test split."""

    c: float
    validation_accuracy: float  # label sets: validation micro F1 (what chose C)
    test: AnyMetrics
    seconds: float
    features: int
    texts_per_second: float | None = None  # inference on the test split: features + logistic regression
    ece: float | None = None  # single_label: of the test probabilities
    parameters: int | None = None  # the logistic regressions' coefficients and intercepts


@dataclass
class EncoderRecord:
    """encoder.json: the fine-tuned encoder on the test split, with what it cost."""

    model: str
    epochs: int  # trained
    best_epoch: int  # chosen on validation
    learning_rate: float
    validation_score: float  # the config's select_by on validation (loss: negated)
    test: AnyMetrics
    temperature: float  # single_label: fitted on validation; 1.0 for multi_label
    test_ece: float | None  # single_label: at the fitted temperature
    train_seconds: float
    texts_per_second: float  # inference on the test split (batch eval_batch_size, length-sorted)
    parameters: int
    trainable_parameters: int
    size_mb: float  # weights in fp32
    max_epochs: int | None = None  # the cap (encoder_epochs)
    curve: list[float] = field(default_factory=list)  # validation select_by after each epoch (loss: negated)
    learning_rates: dict[str, float] = field(default_factory=dict)  # the grid: lr -> its best validation score
    still_improving: bool = False  # the best epoch was the cap: more epochs may have helped
    budget_stop: bool = False  # encoder_budget_s ended its training before patience or the cap
    saved: str | None = None  # the run's folder holding the chosen model, ready to ship (None: not kept)


@dataclass
class EnsembleRecord:
    """ensemble.json: LoRA's and the strongest encoder's calibrated probabilities averaged, LoRA's weight chosen
    on validation (a label set's thresholds refitted on the blend), scored on the test split."""

    encoder: str  # the encoder blended with LoRA (its record's model)
    weight: float  # LoRA's share of the blend; the encoder's is 1 - weight
    validation_score: float  # the config's select_by on validation at that weight (loss: negated)
    validation_scores: dict[str, float]  # every weight tried -> its validation score
    test: AnyMetrics
    thresholds: list[float] | None = None  # multi_label: per label, fitted on the blended validation split
    test_ece: float | None = None  # single_label: of the blended test probabilities


@dataclass
class SkippedBaseline:
    """A baseline left out, and why (said in the log and the report)."""

    name: str
    reason: str


@dataclass
class BaselineSummary:
    """The baseline ladder on the test split, beside the LoRA result (None: that baseline was not run)."""

    zero_shot_accuracy: float | None = None
    calibrated_accuracy: float | None = None
    tfidf_accuracy: float | None = None
    tfidf_macro_f1: float | None = None
    encoder_accuracy: float | None = None
    encoder_macro_f1: float | None = None
    skipped: list[SkippedBaseline] = field(default_factory=list)


@dataclass
class ValidationSummary:
    best_accuracy: float  # of the best checkpoint
    best_step: int
    select_by: str = "accuracy"  # what chose the best checkpoint


@dataclass
class TrainSummary:
    steps: int
    stopped_early: bool
    seconds: float  # the loop, validation included
    train_tokens: int
    tokens_per_second: float  # train steps only
    mfu: float | None = None  # share of the device's peak FLOP/s at the precision trained in
    extensions: int = 0  # epochs added because validation still improved at the end of the plan
    still_improving: bool = False  # the best validation was the last one: more training may help


@dataclass
class ModelSummary:
    source: str
    directory: str
    hidden_size: int
    parameters: int
    trainable_parameters: int
    lora_modules: int


@dataclass
class ExportCheck:
    """An export (merged weights, ONNX) checked against the adapter or PyTorch on the test split."""

    examples: int
    predictions_equal: bool  # no disagreement beyond a tie
    disagreements: int
    disagreements_beyond_ties: int
    max_probability_difference: float
    dtype: str = "fp32"  # of the exported weights
    format: str = "merged"  # merged | onnx
    file: str | None = None
    texts_per_second: float | None = None  # the export's, on the test split
    reference_texts_per_second: float | None = None  # what it was checked against (PyTorch), same texts
    comments_equal: float | None = None  # label_and_comment: share of greedy comments equal to the adapter's
    accuracy: float | None = None  # int8 ONNX: the export's test accuracy ...
    reference_accuracy: float | None = None  # ... and the fp32 PyTorch model's, on the same texts
    non_finite: int = 0  # texts on which the export gave NaN or inf
    sequence_padded_to: int | None = None  # ONNX: inputs padded inside the graph to this length (no dynamic one)


@dataclass
class UntrainedRecord:
    """label_and_comment's untrained rung: the run's own prompt before its first step (the adapter disabled) on
    the test split: the label words' accuracy and the ROUGE-L of the comments it writes."""

    accuracy: float
    rouge_l: float


@dataclass
class CommentMetrics:
    """label_and_comment: the generated comments of the test split against the references."""

    examples: int
    rouge_l: float  # mean ROUGE-L F1 (rouge-score, stemmed)
    chrf: float  # corpus chrF (sacrebleu), 0-100
    consistency: float  # share of comments that the run's label scorer, reading the comment alone, gives the label
    mean_tokens: float
    tokens_per_second: float  # generation, batched, on this machine
    candidates: int = 1  # comment_candidates: 1 greedy; N beams, the first that reads back as the label kept
    greedy_rouge_l: float | None = None  # with candidates > 1: the greedy comments' ROUGE-L and consistency ...
    greedy_consistency: float | None = None  # ... on the same test texts, for what the candidates buy
    reference_consistency: float | None = None  # share of reference comments the label scorer gives their label
    zero_shot_accuracy: float | None = None  # the same prompt, untrained: its label words scored
    zero_shot_rouge_l: float | None = None  # the base model's comments after the same prompt and its label
    head_accuracy: float | None = None  # the classification-head LoRA trained on the same split (baselines: head)
    head_macro_f1: float | None = None
    head_train_seconds: float | None = None


@dataclass
class Metrics:
    """metrics.json: what a finished run measured."""

    test: AnyMetrics
    validation: ValidationSummary
    train: TrainSummary
    model: ModelSummary
    data: dict[str, dict[str, int]]  # split -> class -> examples
    wall_seconds: float
    baseline: BaselineSummary | None = None
    export: ExportCheck | None = None
    data_notes: list[str] = field(default_factory=list)
    long_texts: dict[str, int] = field(default_factory=dict)  # split -> texts longer than max_length (truncated)
    calibration: CalibrationRecord | None = None  # single_label: the temperature; multi_label: see test.thresholds
    problem: str = "single_label"
    verdict: Verdict | None = None  # every model side by side on the test split, and which to ship
    comments: CommentMetrics | None = None  # label_and_comment


Record = TypeVar("Record")
PROBLEM_TAGS = tuple(PROBLEMS)  # which member of AnyMetrics: not a place in the file


@dataclass
class TrainLogLine:
    """A train_log.jsonl line every `log_every` steps: the window's mean loss and its speed."""

    step: int
    epoch: float
    loss: float
    lr: float
    memory_mb: float  # peak allocated on CUDA; resident set on CPU
    tokens_per_second: float
    mfu: float | None = None  # None where the device's peak is unknown


@dataclass
class ValidationLogLine:
    """A train_log.jsonl line every `eval_every` steps: the validation split's scores and the stopping rule."""

    step: int
    validation_accuracy: float
    validation_loss: float
    validation_macro_f1: float
    best: float  # validation accuracy of the best step so far
    improved: bool


@dataclass
class StudentRecord(EncoderRecord):
    """student.json: the distilled encoder on the test split (the encoder record's fields; `learning_rates`
    holds the grid of teacher weights, by weight), with its teacher and what it cost beside it."""

    teacher_weight: float = 1.0  # the teacher's share of the loss, chosen on validation
    teacher: str = "lora"  # lora | ensemble: whose probabilities were taught
    distill_temperature: float = 1.0  # the teacher's and student's logits divided by it in the soft term
    training_texts: int = 0  # the training split's texts
    unlabeled_texts: int = 0  # texts with the teacher's probabilities only
    augmented_texts: int = 0  # of those, variants of the training texts (--augment)
    # the teacher on the same test texts, timed beside the student (`texts_per_second`: the exported student
    # through the same Engine, before and after the teacher)
    teacher_texts_per_second: float | None = None
    agreement_with_teacher: float | None = None  # share of test texts where the two choose the same labels
    export: ExportCheck | None = None  # the exported student read back as a user reads it
    weights: dict[str, float] = field(default_factory=dict)  # teacher weight -> best validation score
    layers: list[int] | None = None  # the encoder's layers the student was started from (--student-layers); None: all
