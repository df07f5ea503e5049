"""The run directory: its layout and the one validated reader for each record it holds (loracls.run_records).

Every file is written atomically (loracls.files); every reader checks what it reads and turns anything
malformed (a list where a mapping belongs, a missing field, invalid JSON, non-UTF-8 text) into one line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from loracls import files
from loracls.config import check_run_name
from loracls.config_reader import read_run_config
from loracls.errors import LoraclsError
from loracls.hardware import Environment
from loracls.problems import Decision
from loracls.run_records import (  # noqa: F401  (re-exported: runs.Metrics, runs.EncoderRecord, ...)
    PROBLEM_TAGS,
    BaselineRecord,
    BaselineSummary,
    CommentMetrics,
    EncoderRecord,
    EnsembleRecord,
    ExportCheck,
    Metrics,
    ModelSummary,
    Record,
    SkippedBaseline,
    StudentRecord,
    TfidfRecord,
    TrainLogLine,
    TrainSummary,
    UntrainedRecord,
    ValidationLogLine,
    ValidationSummary,
)

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
ENSEMBLE = "ensemble.json"  # LoRA and the strongest encoder blended (the verdict's ensemble row)
ADAPTER = "adapter"
MERGED = "merged"
PREDICTIONS = "predictions"
CHECKPOINT = "checkpoint.pt"
CALIBRATION = "loracls_calibration.json"  # inside adapter/: its InputFormat (the decision fitted on validation)
INPUT_FORMAT = "loracls_input.json"  # beside an exported model (merged/, onnx/): the same InputFormat
HEAD_BASELINE = "head_baseline"  # label_and_comment: the classification-head LoRA's own run, inside the run
STUDENT = "student"  # distill: the student, exported (a standard sequence-classifier directory)
STUDENT_RECORD = "student.json"  # distill: the student's record
TEACHER_SCORES = "teacher_scores"  # distill: the teacher's probabilities, cached a row per text (its SHA-256)
LOCK = ".loracls.lock"  # held (flock) by the one process that writes the run: train, export, sweep


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


def read_encoders(run: Path) -> list[EncoderRecord]:
    """Every encoder record of a run, in order (encoder.json, encoder.2.json, ... until one is missing)."""
    records = []
    while (Path(run) / encoder_file(len(records))).is_file():
        records.append(read_encoder(run, len(records)))
    return records


def encoder_folder(index: int) -> str:
    """Where the chosen weights of encoder `index` are kept: encoder/, encoder.2/, ... (beside its record)."""
    return "encoder" if index == 0 else f"encoder.{index + 1}"


def read_ensemble(run: Path) -> EnsembleRecord:
    return read_record(run / ENSEMBLE, EnsembleRecord)


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
    return read_run_config(run)


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
