"""`loracls distill RUN [--student minilm|mpnet-base|DIR] [--unlabeled FILE]`: the run's calibrated classifier
teaches a small encoder, which then stands beside it in the run's verdict and is served like a run.

The story, top-down (the training job's phases: prepare, teach, fit, test, export, record, under the run's lock):
1. prepare: the finished run, its config and data splits, the student (checked before anything is written), the
   unlabeled texts (a file the user gives, read with predict's streaming reader, or else the data file's texts
   the splits left out; with `--augment K`, K variants of each training text too: `data/augment.py`), and the
   teacher (the run's engine, as predict and serve load it).
2. teach: the teacher's calibrated probabilities on the training split and the unlabeled texts, computed in
   chunks and cached in `RUN/teacher_scores/` (keyed by the texts), so a repeated or interrupted distill does
   not pay for them again.
3. fit: `baselines/student.py` — the student trained on the teacher's probabilities blended with the gold
   labels, once per teacher weight, the best kept on validation; calibrated on validation; tested.
4. test: the teacher on the same test split in the same process: its speed beside the student's, and how often
   the two agree.
5. export: `RUN/student/`, a standard AutoModelForSequenceClassification directory with `loracls_input.json`
   (the temperature folded into the head), written to staging, read back with plain transformers and compared
   with the student in memory, swapped in only when it matches (`export_checked`).
6. record: `RUN/student.json`, and a `student` row in metrics.json's verdict (the verdict decided again).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from loracls import files, runs
from loracls.baselines.encoder import check_encoder
from loracls.baselines.student import StudentSpec, Teaching, check_layers, run_student
from loracls.config import Config
from loracls.data.augment import Augmentation, augmented_texts
from loracls.data.spec import DataSpec
from loracls.data.splits import Dataset, left_out_texts, load_dataset
from loracls.data.text_chunks import CHUNK_ROWS, TextColumn, check_texts, text_chunks
from loracls.errors import Log, LoraclsError, quiet
from loracls.hardware import Runtime, setup_runtime
from loracls.inference.engine import Engine
from loracls.inference.export import compare_predictions, export_checked, refuse_unfaithful, save_text_layout
from loracls.inference.loaded import EngineOptions, engine_for
from loracls.inference.model_card import write_cards
from loracls.jobs.ladder import encoder_row
from loracls.model.classifier import load_standalone
from loracls.model.lora import head_name
from loracls.model.scoring import Batching, predict_logits
from loracls.runs import StudentRecord
from loracls.verdict import FULL_ROW, LORA_ROW, LadderRow, decide

__all__ = ["DistillOptions", "distill", "STUDENT_ROW"]

TEACHER_CHUNK = 512  # texts the teacher scores between two cache writes
STUDENT_ROW = "student"


@dataclass(frozen=True)
class DistillOptions:
    """What `loracls distill` is asked for (the command line's flags)."""

    student: str = "minilm"  # minilm | mpnet-base | an HF encoder directory
    student_layers: int | None = None  # keep this many of the student's layers, spread evenly; None: all
    unlabeled: str | None = None  # a file of texts (the run's text column); None: the data's left-out texts
    max_unlabeled: int | None = 10_000  # at most this many unlabeled texts, drawn with the run's seed
    augment: int = 0  # variants of each training text the teacher labels too (data/augment.py); 0: none
    weights: tuple[float, ...] = (0.5, 1.0)  # the teacher's share of the loss, each tried, the best kept
    temperature: float = 1.0  # distillation temperature (> 1: softer targets); 1: the calibrated probabilities
    learning_rate: float | None = None  # None: what the run's encoder baseline chose for this encoder, else 1e-4
    batch_size: int | None = None  # the teacher's texts a forward pass; None: the run's eval_batch_size
    teacher: str = "auto"  # lora | ensemble | auto: the ensemble row where it is the verdict's best, else LoRA


@dataclass
class DistillJob:
    run: Path
    config: Config
    dataset: Dataset
    unlabeled: list[str]  # the left-out or the user's texts, then the augmented ones
    augmented: int  # how many of `unlabeled` are variants of the training texts
    teacher: Engine
    runtime: Runtime
    options: DistillOptions
    log: Log
    teacher_kind: str = "lora"  # lora | ensemble: which engine `teacher` is (teacher_kind())


def distill(run_path: str, options: DistillOptions = DistillOptions(), log: Log = print) -> StudentRecord:
    """Distill the run's classifier into `options.student`; returns the student's record (also in the run)."""
    with contextlib.ExitStack() as held:
        job = _prepare(run_path, options, log, held)
        teaching = _teach(job)
        spec = StudentSpec(options.student, options.weights, _learning_rate(job), options.student_layers)
        record, fitted = run_student(job.dataset, job.config, job.runtime, spec, teaching, log)
        record.augmented_texts = job.augmented
        record.teacher = job.teacher_kind
        record.export = _export(job, fitted)
        _test_beside_teacher(job, record, fitted)
        _record(job, record)
    return record


# --- the phases -------------------------------------------------------------------------------------


def _prepare(run_path: str, options: DistillOptions, log: Log, held: contextlib.ExitStack) -> DistillJob:
    """Everything checked before anything is written: the run, the options, the student, the unlabeled texts."""
    run = runs.check_run_dir(run_path)
    if not (run / runs.METRICS).is_file():
        raise LoraclsError(f"distill: {run_path} has not finished ({runs.METRICS} missing); resume it first")
    runs.read_metrics(run)  # every run file the end reads is read now: a damaged one costs no distillation
    runs.read_labels(run)
    if not options.weights or any(not 0 < w <= 1 for w in options.weights):
        raise LoraclsError(f"distill: each teacher weight must be > 0 and <= 1, got {list(options.weights)}")
    if options.max_unlabeled is not None and options.max_unlabeled < 0:
        raise LoraclsError(f"distill: --max-unlabeled must be >= 0, got {options.max_unlabeled}")
    if options.learning_rate is not None and not 0 < options.learning_rate < 1:
        raise LoraclsError(f"distill: the learning rate must be > 0 and < 1, got {options.learning_rate}")
    if options.augment < 0:
        raise LoraclsError(f"distill: --augment must be >= 0, got {options.augment}")
    if not 1 <= options.temperature <= 100:  # also refuses nan
        raise LoraclsError(f"distill: --temperature must be >= 1 and <= 100, got {options.temperature}")
    held.enter_context(runs.hold(run))
    config = runs.read_config(run)
    data = DataSpec.of(config)
    dataset = load_dataset(data)
    source = _unlabeled_file(options.unlabeled, data)
    student_config = check_encoder(options.student, log)
    if options.student_layers is not None:
        check_layers(student_config, options.student_layers)
    unlabeled = _at_most(_unlabeled(source, data, dataset, log), options.max_unlabeled, config.seed, log)
    augmented = _augmented(dataset, unlabeled, options.augment, config.seed, log)
    runtime = setup_runtime(config.device, config.precision, config.threads)
    kind = teacher_kind(run, options.teacher)
    teacher = engine_for(str(run), EngineOptions(batch_size=options.batch_size, engine=_ENGINES[kind]), quiet)
    layers = f" ({options.student_layers} of its layers)" if options.student_layers else ""
    log(f"distill: teacher {teacher.source} ({kind}); student {options.student}{layers}")
    return DistillJob(run, config, dataset, unlabeled + augmented, len(augmented), teacher, runtime, options, log, kind)


_ENGINES = {"lora": "torch", "ensemble": "ensemble"}


def teacher_kind(run: Path, asked: str) -> str:
    """lora or ensemble: what was asked, or (auto) the ensemble where its row scores best in the run's verdict
    (the strongest teacher the run has), else LoRA. An ensemble asked of a run without one is refused."""
    has_ensemble = (run / runs.ENSEMBLE).is_file()
    if asked == "ensemble" and not has_ensemble:
        raise LoraclsError(f"distill --teacher ensemble: {run} has no ensemble row ({runs.ENSEMBLE} missing)")
    if asked != "auto":
        return asked
    verdict = runs.read_metrics(run).verdict
    if not has_ensemble or verdict is None:
        return "lora"
    score = {row.name: row.macro_f1 if verdict.metric == "macro_f1" else row.accuracy for row in verdict.rows}
    blend = next((name for name in score if name.startswith("ensemble")), None)
    ahead = blend is not None and all(score[blend] > value for name, value in score.items() if name != blend)
    return "ensemble" if ahead else "lora"  # a tie goes to LoRA: one model to run, not two


def _unlabeled_file(file: str | None, data: DataSpec) -> TextColumn | None:
    """The user's file of unlabeled texts, checked whole (None: the data file's left-out texts)."""
    if file is None:
        return None
    source = TextColumn(file, data.text_column)
    check_texts(source, CHUNK_ROWS)
    return source


def _unlabeled(source: TextColumn | None, data: DataSpec, dataset: Dataset, log: Log) -> list[str]:
    """The unlabeled texts, without the splits' own texts (a test text taught by the teacher would be scored
    against its own answer) and without repeats."""
    if source is None:
        texts = left_out_texts(data, dataset)
        log(f"distill: {len(texts)} texts of {data.data} left out of the splits, scored by the teacher")
        return texts
    read = [text for chunk in text_chunks(source, CHUNK_ROWS) for text in chunk]
    splits = dataset.texts()
    texts = [text for text in dict.fromkeys(read) if text not in splits]
    dropped = len(read) - len(texts)
    log(f"distill: {len(texts)} unlabeled texts from {source.file} ({dropped} repeats or split texts left out)")
    return texts


def _at_most(texts: list[str], limit: int | None, seed: int, log: Log) -> list[str]:
    """A seeded draw of `limit` texts (in their order) where there are more: the teacher's scoring and every
    student epoch grow with them."""
    if limit is None or len(texts) <= limit:
        return texts
    kept = sorted(np.random.default_rng(seed).choice(len(texts), size=limit, replace=False))
    log(f"distill: {limit} of the {len(texts)} unlabeled texts kept (--max-unlabeled)")
    return [texts[i] for i in kept]


def _augmented(dataset: Dataset, unlabeled: list[str], copies: int, seed: int, log: Log) -> list[str]:
    """`copies` variants of each training text (data/augment.py), none equal to a split or unlabeled text."""
    if not copies:
        return []
    exclude = dataset.texts() | set(unlabeled)
    texts = augmented_texts(list(dataset.train.texts), Augmentation(copies), seed, exclude)
    log(f"distill: {len(texts)} augmented variants of the {len(dataset.train.texts)} training texts (--augment)")
    return texts


def _teach(job: DistillJob) -> Teaching:
    train = job.dataset.train
    texts = list(train.texts) + job.unlabeled
    cache = job.run / (runs.TEACHER_SCORES + ("_ensemble" if job.teacher_kind == "ensemble" else ""))
    probabilities = teacher_probabilities(job.teacher, texts, cache, job.log)
    gold = list(train.labels) + [None] * len(job.unlabeled)
    return Teaching(texts, probabilities, gold, temperature=job.options.temperature)


def teacher_probabilities(teacher: Engine, texts: list[str], cache: Path, log: Log = print) -> np.ndarray:
    """The teacher's calibrated probabilities for `texts`. Each text's row is cached in `cache` under the text's
    SHA-256, TEACHER_CHUNK newly scored texts a file, written as they are scored: a killed call continues where
    it stopped, and a later call over other texts (more unlabeled ones, another file) scores only the texts not
    seen before (rt's 3000 left-out texts raised to all 9,752 otherwise paid for 5000 texts twice)."""
    known = _cached_scores(cache, teacher.labels)
    digests = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
    new = {digest: text for digest, text in zip(digests, texts) if digest not in known}
    cached = sum(digest in known for digest in digests)
    todo = list(new)
    number = 1 + max((int(part.stem.split("-")[1]) for part in cache.glob("part-*.npz")), default=-1)
    for start in range(0, len(todo), TEACHER_CHUNK):
        chunk = todo[start : start + TEACHER_CHUNK]
        scores = teacher.probabilities([new[digest] for digest in chunk]).astype(np.float32)
        path, keys = cache / f"part-{number:05d}.npz", np.array(chunk, dtype="U64")
        files.write_file_atomically(path, lambda tmp, k=keys, v=scores: _save_scores(tmp, k, v), "the teacher's scores")
        known.update(zip(chunk, scores))
        number += 1
    log(f"distill: the teacher's probabilities on {len(texts)} texts ({cached} read from {cache})")
    if not texts:
        return np.zeros((0, len(teacher.labels)), dtype=np.float32)
    return np.stack([known[digest] for digest in digests])


def _cached_scores(cache: Path, labels: list[str]) -> dict[str, np.ndarray]:
    """Every row cached for this teacher (its labels in the manifest; another manifest starts the cache anew)."""
    manifest, key = cache / "key.json", {"rows": "sha256 hex of the text", "labels": list(labels)}
    if manifest.is_file() and json.loads(manifest.read_text()) != key:
        for part in [*cache.glob("part-*.npz"), *cache.glob("part-*.npy")]:
            part.unlink()
    cache.mkdir(exist_ok=True)
    files.write_json(manifest, key)
    known: dict[str, np.ndarray] = {}
    for part in sorted(cache.glob("part-*.npz")):
        with np.load(part, allow_pickle=False) as stored:
            known.update(zip(stored["keys"].tolist(), stored["scores"]))
    return known


def _save_scores(path: Path, keys: np.ndarray, scores: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, keys=keys, scores=scores)


def _learning_rate(job: DistillJob) -> float:
    """The option's, else the rate the run's own encoder baseline chose for the same encoder (its grid was
    searched on this validation split), else 1e-4."""
    if job.options.learning_rate is not None:
        return job.options.learning_rate
    return next((enc.learning_rate for enc in runs.read_encoders(job.run) if enc.model == job.options.student), 1e-4)


def _test_beside_teacher(job: DistillJob, record: StudentRecord, fitted) -> None:
    """The exported student and the teacher on the same test texts through the same Engine (tokenizing and
    calibrating included, as predict and serve pay them), timed side by side: student, teacher, student (the
    student's mean of its two passes, so a change of the machine's load between them weighs on both); and the
    share of texts where they agree."""
    test = job.dataset.test.texts
    student_engine = engine_for(str(job.run / runs.STUDENT), EngineOptions(batch_size=job.options.batch_size), quiet)
    student_seconds = _timed(student_engine, test)[1]
    teacher, teacher_seconds = _timed(job.teacher, test)
    student_seconds = (student_seconds + _timed(student_engine, test)[1]) / 2
    record.texts_per_second = len(test) / max(student_seconds, 1e-9)
    record.teacher_texts_per_second = len(test) / max(teacher_seconds, 1e-9)
    kind = job.dataset.kind
    student = kind.chosen(fitted.decision.probabilities(fitted.test_logits), fitted.decision)
    taught = kind.chosen(teacher, job.teacher.decision)
    same = (student == taught) if student.ndim == 1 else (student == taught).all(axis=1)
    record.agreement_with_teacher = float(same.mean())
    ratio = record.texts_per_second / max(record.teacher_texts_per_second, 1e-9)
    job.log(
        f"distill: student {record.model}{_layers_said(record)} (teacher weight {record.teacher_weight:g}): test "
        f"{kind.accuracy_name} {record.test.accuracy:.4f}, macro F1 {record.test.macro_f1:.4f}; agrees with the "
        f"teacher on {100 * record.agreement_with_teacher:.1f}% of test texts; {ratio:.1f}x the teacher's texts/s"
    )


def _layers_said(record: StudentRecord) -> str:
    return f" (layers {','.join(map(str, record.layers))})" if record.layers else ""


def _augmented_said(record: StudentRecord) -> str:
    return f", {record.augmented_texts} of them augmented" if record.augmented_texts else ""


def _timed(engine: Engine, texts: list[str]) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    probabilities = engine.probabilities(texts)
    return probabilities, time.perf_counter() - started


def _export(job: DistillJob, fitted) -> runs.ExportCheck:
    """RUN/student/: the student with its temperature folded into the head, checked after a plain reload.

    Both sides are computed in fp32 without autocast, as the merged export is checked: the check is that the
    saved student computes the function that was trained, not how bf16 rounds near a decision (the in-memory
    bf16 probabilities flipped one multi-label threshold in 500 texts against the fp32 reload, 9e-3 apart)."""
    fit, decision = fitted.fit, fitted.decision
    model = copy.deepcopy(fit.model).to("cpu").float()
    batching = Batching(
        fit.tokenizer.pad_token_id, job.config.eval_batch_size, Runtime(torch.device("cpu"), torch.float32)
    )
    expected = decision.probabilities(predict_logits(model, fit.ids["test"], batching))

    def fill(staging: Path) -> None:
        left = decision.kind.fold_into_head(_final_linear(model), model.config, decision, job.dataset.id2label)
        save_text_layout(model, fit.tokenizer, staging, runs.InputFormat(None, fit.max_length, decision=left))

    def check(staging: Path) -> runs.ExportCheck:
        reloaded = load_standalone(staging)
        left = runs.InputFormat.read(staging / runs.INPUT_FORMAT).decision
        probs = left.probabilities(predict_logits(reloaded, fit.ids["test"], batching))
        result = compare_predictions(expected, probs, "fp32", decision)
        refuse_unfaithful(result, staging, "test texts")
        return result

    result = export_checked(job.run / runs.STUDENT, fill, check, "the student")
    job.log(f"distill: {job.run / runs.STUDENT} (read back with plain transformers: predictions equal)")
    return result


def _final_linear(model) -> torch.nn.Linear:
    """The head's last linear layer (BERT's `classifier` is one; MPNet's ends in `out_proj`): the temperature
    divides its weights and bias."""
    head = getattr(model, head_name(model))
    linears = [module for module in head.modules() if isinstance(module, torch.nn.Linear)]
    if not linears:
        raise LoraclsError(f"distill: {type(model).__name__}'s head has no linear layer to fold the temperature into")
    return linears[-1]


def _record(job: DistillJob, record: StudentRecord) -> None:
    """student.json, and the run's verdict decided again with the student's row (a previous one replaced)."""
    runs.write_record(job.run / runs.STUDENT_RECORD, record)
    metrics = runs.read_metrics(job.run)
    if metrics.verdict is not None:
        verdict = metrics.verdict
        teacher = next((row for row in verdict.rows if _taught(row, record.teacher)), None)
        rows = [row for row in verdict.rows if row.name != STUDENT_ROW] + [student_row(record, teacher)]
        metrics.verdict = decide(rows, verdict.examples, verdict.metric)
        runs.write_record(job.run / runs.METRICS, metrics)
        job.log(f"verdict: {metrics.verdict.reason}")
    write_cards(job.run)  # the student's card, and the others with the verdict's new row


def _taught(row: LadderRow, teacher: str) -> bool:
    """Whether a verdict row is the distill's teacher: the ensemble's, or the decoder's (LoRA or full)."""
    return row.name.startswith("ensemble") if teacher == "ensemble" else row.name in (LORA_ROW, FULL_ROW)


def student_row(record: StudentRecord, teacher: LadderRow | None = None) -> LadderRow:
    """The student's row of the verdict. Its texts/s is put on the scale of the teacher's row (`teacher`: the
    LoRA row, timed in the training job beside the other rows): that row's texts/s times the ratio measured
    side by side in the distill, so every cost ratio the verdict states was measured in one process. Raw
    figures of two processes mislead: on emotions they made LoRA 28.5x the student's cost, side by side 14.2x."""
    speed, ratio = "", None
    if record.teacher_texts_per_second:
        ratio = record.texts_per_second / record.teacher_texts_per_second
        speed = f", {ratio:.1f}x the teacher's texts/s side by side ({record.texts_per_second:.0f} texts/s there)"
    source = "the ensemble" if record.teacher == "ensemble" else teacher.name if teacher is not None else "LoRA"
    detail = (
        f"{record.model}{_layers_said(record)} distilled from {source} (teacher weight {record.teacher_weight:g}, "
        f"{record.unlabeled_texts} unlabeled texts{_augmented_said(record)}), "
        f"best epoch {record.best_epoch} of {record.epochs}{speed}"
    )
    row = encoder_row(record, STUDENT_ROW, detail)
    if ratio is not None and teacher is not None and teacher.texts_per_second:
        row.texts_per_second = teacher.texts_per_second * ratio
    return row
