"""The run directory: its layout, the typed records a run writes, and the one validated reader for each.

Every file is written atomically (loracls.files); every reader checks what it reads and turns anything
malformed (a list where a mapping belongs, a missing field, invalid JSON, non-UTF-8 text) into one line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from loracls import files
from loracls.calibration import CalibrationRecord
from loracls.config import check_run_name
from loracls.config_reader import from_dict, read_mapping
from loracls.errors import LoraclsError
from loracls.hardware import Environment
from loracls.metrics import ClassificationMetrics
from loracls.problems import PROBLEMS, AnyMetrics, Decision
from loracls.verdict import Verdict

# file names inside a run directory
CONFIG = "config.yaml"
ENV = "env.json"
LABELS = "labels.json"
TRAIN_LOG = "train_log.jsonl"
METRICS = "metrics.json"
BASELINE = "baseline.json"
TFIDF = "tfidf.json"
UNTRAINED = "untrained.json"  # label_and_comment: the run's prompt before training (the adapter disabled)
ENCODER = "encoder.json"
ADAPTER = "adapter"
MERGED = "merged"
PREDICTIONS = "predictions"
CHECKPOINT = "checkpoint.pt"
CALIBRATION = "loracls_calibration.json"  # inside adapter/: its InputFormat (the decision fitted on validation)
INPUT_FORMAT = "loracls_input.json"  # beside an exported model (merged/, onnx/): the same InputFormat
HEAD_BASELINE = "head_baseline"  # label_and_comment: the classification-head LoRA's own run, inside the run
STUDENT = "student"  # distill: the student, exported (a standard sequence-classifier directory)
STUDENT_RECORD = "student.json"  # distill: the student's record
TEACHER_SCORES = "teacher_scores"  # distill: the teacher's probabilities, cached by chunk
LOCK = ".loracls.lock"  # held (flock) by the one process that writes the run: train, export, sweep


# --- the records -------------------------------------------------------------------------------------


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


def read_train_log(run: Path) -> list[TrainLogLine | ValidationLogLine]:
    """train_log.jsonl, each line checked as the record it is."""
    lines = files.read_jsonl(run / TRAIN_LOG, "run file")
    source = str(run / TRAIN_LOG)
    return [
        parse_record(ValidationLogLine if "validation_accuracy" in line else TrainLogLine, line, source)
        for line in lines
    ]


def to_dict(record) -> dict:
    return dataclasses.asdict(record)


def write_record(path: Path, record) -> None:
    files.write_json(path, to_dict(record))


def parse_record(kind: type[Record], data, source: str) -> Record:
    """A record from parsed JSON, checked field by field; the first problem becomes one line."""
    try:
        return TypeAdapter(kind).validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"] if part not in PROBLEM_TAGS) or "top level"
        raise LoraclsError(f"{source}: {where}: {error['msg']}") from None


def read_record(path: Path, kind: type[Record]) -> Record:
    return parse_record(kind, files.read_json(path, "run file"), str(path))


def read_metrics(run: Path) -> Metrics:
    return read_record(run / METRICS, Metrics)


def read_baseline(run: Path) -> BaselineRecord:
    return read_record(run / BASELINE, BaselineRecord)


def read_tfidf(run: Path) -> TfidfRecord:
    return read_record(run / TFIDF, TfidfRecord)


def read_untrained(run: Path) -> UntrainedRecord:
    return read_record(run / UNTRAINED, UntrainedRecord)


def encoder_file(index: int) -> str:
    """The first encoder's record is encoder.json (as before several encoders), the next encoder.2.json, ..."""
    return ENCODER if index == 0 else f"encoder.{index + 1}.json"


def read_encoder(run: Path, index: int = 0) -> EncoderRecord:
    return read_record(run / encoder_file(index), EncoderRecord)


@dataclass
class StudentRecord(EncoderRecord):
    """student.json: the distilled encoder on the test split (the encoder record's fields; `learning_rates`
    holds the grid of teacher weights, by weight), with its teacher and what it cost beside it."""

    teacher_weight: float = 1.0  # the teacher's share of the loss, chosen on validation
    training_texts: int = 0  # the training split's texts
    unlabeled_texts: int = 0  # texts with the teacher's probabilities only
    teacher_texts_per_second: float | None = None  # the teacher on the same test split, in the same process
    agreement_with_teacher: float | None = None  # share of test texts where the two choose the same labels
    export: ExportCheck | None = None  # the exported student read back as a user reads it
    weights: dict[str, float] = field(default_factory=dict)  # teacher weight -> best validation score


def read_student(run: Path) -> StudentRecord:
    return read_record(run / STUDENT_RECORD, StudentRecord)


@dataclass
class InputFormat:
    """How callers must turn texts into inputs and logits into labels: the template and length trained
    with, what happens to longer texts, and the decision fitted on validation. One schema for
    adapter/loracls_calibration.json and the loracls_input.json beside every export."""

    input_template: str | None = None
    max_length: int = 512
    long_text: str = "truncate"
    chunk_stride: int | None = None
    decision: Decision = field(default_factory=Decision)

    @classmethod
    def of_run(cls, config, decision: Decision) -> InputFormat:
        return cls(config.input_template, config.max_length, config.long_text, config.chunk_stride, decision)

    def write(self, path: Path) -> None:
        write_record(path, self)

    @classmethod
    def read(cls, path: Path) -> InputFormat:
        """The saved format (the defaults where none was saved); a temperature must be positive and finite,
        thresholds strictly between 0 and 1."""
        return read_record(path, cls) if path.is_file() else cls()


def read_decision(run: Path) -> Decision:
    """The decision saved beside a run's adapter."""
    return InputFormat.read(run / ADAPTER / CALIBRATION).decision


def read_env(run: Path) -> Environment:
    return read_record(run / ENV, Environment)


def read_labels(run: Path) -> dict[int, str]:
    """labels.json: {"0": name, "1": name, ...}: ids 0..n-1, at least two, names distinct and non-empty."""
    path = run / LABELS
    raw = parse_record(dict[str, str], files.read_json(path, "run file"), str(path))
    if sorted(raw) != [str(i) for i in range(len(raw))] or len(raw) < 2:
        raise LoraclsError(f'{path}: ids must be "0".."n-1" for n >= 2 labels, got {sorted(raw)}')
    names = list(raw.values())
    if len(set(names)) != len(names) or not all(name.strip() for name in names):
        raise LoraclsError(f"{path}: label names must be distinct and non-empty")
    return {int(i): name for i, name in raw.items()}


def write_labels(run: Path, id2label: dict[int, str]) -> None:
    files.write_json(run / LABELS, {str(i): name for i, name in sorted(id2label.items())})


def read_config(run: Path):
    """The Config a run was made with (its config.yaml), checked like any other config."""
    path = Path(run) / CONFIG
    values = read_mapping(path, "run file")
    try:
        return from_dict(values)
    except LoraclsError as exc:
        raise LoraclsError(f"{path}: {exc}") from None


def write_config(run: Path, config) -> None:
    files.write_text(run / CONFIG, yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True))


# --- finding and making run directories --------------------------------------------------------------


def new_run_dir(output_dir: str, run_name: str | None) -> Path:
    name = check_run_name(run_name or time.strftime("run-%Y%m%d-%H%M%S"))
    path = Path(output_dir) / name
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise LoraclsError(f"run directory {path} already exists and is not empty (choose another run_name)")
    (path / PREDICTIONS).mkdir(parents=True, exist_ok=True)
    return path


def owning_run(path: Path) -> Path | None:
    """The run a path is or sits in as one of its exported models (RUN/merged, RUN/student); None otherwise."""
    path = Path(path)
    if (path / CONFIG).is_file():
        return path
    if path.name in (MERGED, STUDENT) and (path.parent / CONFIG).is_file():
        return path.parent
    return None


def check_model_dir(path: str) -> Path:
    """A finished run directory, or an exported model directory (RUN/merged, RUN/student, a copy of either)."""
    model = Path(path)
    if (model / CONFIG).exists():
        return check_run_dir(path)
    if not (model / "config.json").is_file():
        raise LoraclsError(
            f"{path} is not a finished loracls run directory ({CONFIG} missing), nor an exported model "
            f"directory (config.json missing)"
        )
    return model


def check_resumable(path: str) -> Path:
    run = Path(path)
    if (run / METRICS).exists():
        raise LoraclsError(f"{path} already finished ({METRICS} exists); nothing to resume")
    for name in (CONFIG, LABELS, CHECKPOINT):
        if not (run / name).exists():
            raise LoraclsError(f"cannot resume {path}: {name} missing (a run is resumable after its first validation)")
    return run


def hold(run: Path):
    """The run directory's writer lock, for the life of a `with` block: a second writer is refused in one
    line naming the live PID; a lock left by a dead process is taken over."""
    return files.exclusive(Path(run) / LOCK, wait=False, what=f"run directory {run}")


def remove_leftovers(run: Path) -> list[Path]:
    """The temp files and staging folders a killed writer left in a run directory (a resume starts with this,
    a finished run ends with it)."""
    return files.remove_leftovers(run) + files.remove_leftovers(Path(run) / PREDICTIONS)


def check_run_dir(path: str) -> Path:
    run = Path(path)
    for name in (CONFIG, LABELS, ADAPTER):
        if not (run / name).exists():
            raise LoraclsError(f"{path} is not a finished loracls run directory ({name} missing)")
    return run
