"""The main job, told top-down as named phases: prepare -> baseline -> fit -> test -> export -> metrics.

Every input check (config, data, model, LoRA targets, device) runs in `_prepare` before the run directory
is made, so bad input leaves nothing behind. Under torchrun every process runs the job; rank 0 writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from loracls import files, runs
from loracls.baselines.encoder import check_encoder, encoder_specs
from loracls.baselines.zero_shot import check_verbalizers, prompt_setup
from loracls.calibration import CalibrationRecord
from loracls.config import Config
from loracls.config_reader import from_dict
from loracls.data.spec import DataSpec
from loracls.data.splits import Dataset, format_counts, load_dataset
from loracls.errors import Log, quiet
from loracls.hardware import Runtime, environment_record, precision_reason, setup_runtime
from loracls.inference.export import export_run
from loracls.inference.model_card import write_cards
from loracls.jobs.ladder import (
    Ladder,
    ensemble_of,
    run_ladder,
    rungs_of,
    say_verdict,
    verdict_of,
    zero_shot_skip_reason,
)
from loracls.jobs.preflight import preflight
from loracls.model.scorers import Built, Scorer, Setup, scorer_for
from loracls.model.scoring import check_finite_forward
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import apply_speedups
from loracls.problems import Decision, evaluation, problem_for
from loracls.runs import CommentMetrics, Metrics, ModelSummary
from loracls.training import distributed
from loracls.training.logger import RunLogger
from loracls.training.loop import Trainer, TrainResult
from loracls.training.plan import describe
from loracls.training.tracking import Tracking, check_usable, tracking
from loracls.verdict import FULL_ROW, LORA_ROW, LadderRow


@dataclass
class Job:
    setup: Setup  # config, data, base model directory, runtime, log
    scorer: Scorer
    built: Built  # the model being trained, its tokenizer and encoded splits
    run: Path
    resumed: bool
    attention: str | None  # the attention implementation the speed-ups chose
    tracking: Tracking  # report_to's trackers (none: nothing is sent)

    @property
    def config(self) -> Config:
        return self.setup.config

    @property
    def log(self):
        return self.setup.log


def train(config: Config | None, log: Log = print, resume: str | None = None) -> Path:
    """The job, for every problem: its scorer (model/scorers.py) is the one thing that differs. With `resume`,
    the run directory's own config and checkpoint are used. The run directory's writer lock is held from its
    first write (or the resume's start) to the end; `cleanup` runs however the job ends."""
    with contextlib.ExitStack() as held:
        held.callback(_cleanup, joined_before=distributed.joined())
        return _train(config, log, resume, held)


def _train(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> Path:
    started = time.perf_counter()
    job = _prepare(config, log, resume, held)
    ladder = _baselines(job)
    _place(job)
    result = _fit(job)
    logits, texts_per_second = _best_logits(job)
    if not distributed.is_main():
        return job.run
    decision, calibration = _decide(job, logits)
    calibrated = {name: decision.probabilities(values) for name, values in logits.items()}
    ensemble_of(ladder, job.run, job.setup.dataset, job.config.select_by, calibrated, job.log)
    test, comments = _test(job, calibrated["test"], decision)
    summary = _model_summary(job)
    job.built.model = None  # the export starts from the saved adapter
    export = export_run(job.setup, job.scorer, job.built, job.run) if job.config.merge else None
    lora = LadderRow(
        LORA_ROW if job.config.method == "lora" else FULL_ROW,
        test.accuracy,
        test.macro_f1,
        ece=calibration.after.ece if calibration else None,
        train_seconds=result.seconds,
        texts_per_second=texts_per_second,
        parameters=summary.parameters,
        detail=f"{job.config.model}, "
        + (f"r={job.config.r}, {summary.lora_modules} modules" if job.config.method == "lora" else "every weight"),
    )
    metrics = Metrics(
        test=test,
        validation=result.validation_summary(job.config.select_by),
        train=result.summary(),
        model=summary,
        data=job.setup.dataset.class_counts(),
        wall_seconds=time.perf_counter() - started,
        baseline=ladder.summary() if ladder is not None else None,
        export=export,
        data_notes=job.setup.dataset.notes,
        long_texts={name: sum(split.long) for name, split in job.built.encoded.items()},
        calibration=calibration,
        problem=job.config.problem,
        verdict=verdict_of(ladder, lora, test.examples, job.config.select_by),
        comments=_with_rungs(comments, ladder),
    )
    runs.write_record(job.run / runs.METRICS, metrics)
    (job.run / runs.CHECKPOINT).unlink(missing_ok=True)  # finished: nothing left to resume
    runs.remove_leftovers(job.run)
    write_cards(job.run)  # adapter/ and merged/ say what they are, how well and how to load them
    final = {"test_accuracy": test.accuracy, "test_macro_f1": test.macro_f1, "wall_seconds": metrics.wall_seconds}
    job.tracking.metrics(final | ({"test_ece": calibration.after.ece} if calibration else {}), result.steps)
    job.tracking.artifacts([job.run / name for name in (runs.METRICS, runs.CONFIG, runs.TRAIN_LOG)])
    if job.config.problem != "label_and_comment":  # a classifier: MLflow keeps it as a loadable model
        job.tracking.model(job.run / runs.MERGED, job.log)
    _say_done(job, metrics)
    return job.run


# --- the phases -------------------------------------------------------------------------------------


def _prepare(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> Job:
    """Runtime, data, model and LoRA, all checked; then the run directory (rank 0 writes, all get its path)."""
    distributed.init_from_environment()
    log = log if distributed.is_main() else quiet
    resume_dir = runs.check_resumable(resume) if resume else None
    if resume_dir is not None and distributed.is_main():
        held.enter_context(runs.hold(resume_dir))
        for path in runs.remove_leftovers(resume_dir):
            log(f"resume: removed {path.name}, left by the interrupted process")
    config = runs.read_config(resume_dir) if resume_dir is not None else config
    runtime = setup_runtime(config.device, config.precision, config.threads, config.deterministic)
    runtime.device = distributed.local_device(runtime.device)
    preflight(config, runtime)
    check_usable(config.report_to)
    dataset = load_dataset(DataSpec.of(config))
    log("data: class counts\n" + format_counts(dataset))
    scorer = scorer_for(problem_for(config.problem))
    prompt = _check_rungs(config, dataset, runtime, rungs_of(config, scorer.name), log)
    config = _prompt_as_input(config, prompt)
    setup = Setup(config, dataset, resolve_model_dir(config.model, log), runtime, log)
    built = scorer.build(setup, prompt[1] if config.head_init == "verbalizer" else None)
    sharded = config.data_parallel == "fsdp" and distributed.world_size() > 1
    attention = apply_speedups(built.model, runtime, config.quantization != "none", sharded)
    check_finite_forward(built.model, built.probe, built.tokenizer.pad_token_id, runtime)
    log(f"runtime: device {runtime.device}, precision {precision_reason(runtime, config.precision)}")
    run = resume_dir if resume_dir is not None else new_run(config, runtime, dataset, held)
    log(f"run directory: {run}")
    trackers = held.enter_context(tracking(config.report_to if distributed.is_main() else [], run, bool(resume_dir)))
    trackers.params(dataclasses.asdict(config))
    return Job(setup, scorer, built, run, resume_dir is not None, attention, trackers)


def _check_rungs(
    config: Config, dataset: Dataset, runtime: Runtime, rungs: list[str], log
) -> tuple[str, list[str]] | None:
    """A bad prompt, verbalizer or encoder is refused before anything is written. Returns the zero-shot prompt
    and its label words where the zero-shot rung or a verbalizer head needs them (read once, here)."""
    check_verbalizers(config, dataset.id2label)
    zero_shot = "zero_shot_prompt" in rungs and problem_for(config.problem).zero_shot_unsupported is None
    prompt = prompt_setup(config, dataset.id2label) if zero_shot or config.head_init == "verbalizer" else None
    if "encoder" in rungs and distributed.is_main():
        for spec in encoder_specs(config):
            check_encoder(spec, log)
    return prompt


def _prompt_as_input(config: Config, prompt: tuple[str, list[str]] | None) -> Config:
    """head_init: verbalizer reads the label word's logits after the zero-shot prompt: without an input_template
    of its own the classifier then reads that prompt (its {choices} filled in)."""
    if config.head_init != "verbalizer" or config.input_template is not None:
        return config
    template, words = prompt
    choices = ", ".join(words).replace("{", "{{").replace("}", "}}")  # the words are text, not fields
    return from_dict({"input_template": template.replace("{choices}", choices)}, base=config)


def new_run(config: Config, runtime: Runtime, dataset: Dataset, held: contextlib.ExitStack) -> Path:
    """The run directory, held, with its config, env.json and labels (rank 0 makes it; every rank gets it)."""
    run = None
    if distributed.is_main():
        run = runs.new_run_dir(config.output_dir, config.run_name)
        held.enter_context(runs.hold(run))
        runs.write_config(run, config)
        runs.write_record(run / runs.ENV, environment_record(runtime))
        runs.write_labels(run, dataset.id2label)
    return distributed.broadcast_object(run)


def _baselines(job: Job) -> Ladder | None:
    """The baseline ladder on the test split, before training (rank 0; a resumed run reads what it wrote);
    the head LoRA rung is a run of its own, on every process."""
    rungs = rungs_of(job.config, job.scorer.name)
    if not rungs:
        return None
    ladder = None
    if distributed.is_main():
        own = (job.scorer, job.built)
        ladder = run_ladder(job.setup, job.built.tokenizer, job.run, rungs, own)
    distributed.barrier()
    if "head_lora" in rungs:
        ladder = ladder or Ladder()
        ladder.head = head_baseline(job.config, job.run, job.log)
    return ladder


def _place(job: Job) -> None:
    """FSDP: the weights sharded over the processes (after the untrained rung, which reads the whole model)."""
    if job.config.data_parallel == "fsdp" and distributed.world_size() > 1:
        units = distributed.shard_model(job.built.model)
        job.log(f"fsdp: weights sharded over {distributed.world_size()} processes in {units} units")


def _fit(job: Job) -> TrainResult:
    config, built = job.config, job.built
    train_set = job.scorer.train_set(job.setup, built)
    validate = job.scorer.validate(job.setup, built)
    logger = RunLogger(job.run, job.log, job.tracking)
    trainer = Trainer(built.model, train_set, validate, config, job.setup.runtime, logger)
    if job.resumed:
        trainer.load_checkpoint()
    examples = len(job.setup.dataset.train)
    job.log(describe(trainer.plan, examples, config, job.attention, trainer.opt.scaler.is_enabled()))
    result = trainer.fit()
    job.log(
        f"train: {result.steps} steps in {result.seconds:.0f}s, {result.tokens_per_second:.0f} train tokens/s"
        + (f" (MFU {100 * result.mfu:.1f}%)" if result.mfu is not None else "")
        + f"; best validation accuracy {result.best_validation_accuracy:.4f} at step {result.best_step}"
        + (f" ({result.extensions} epoch(s) added while it improved)" if result.extensions else "")
    )
    if result.still_improving:
        job.log(
            f"train: the best validation was the last one (step {result.best_step}): the run may be under-trained; "
            f"more epochs or extend_epochs may help"
        )
    return result


def _best_logits(job: Job) -> tuple[dict[str, np.ndarray] | None, float | None]:
    """The best checkpoint's label scores per text on the validation and test splits, and the texts per
    second of the test split's pass (the verdict's inference cost). After FSDP the first process reads the
    base model and the saved best adapter and goes on alone."""
    if distributed.is_sharded(job.built.model):
        if not distributed.is_main():
            return None, None
        model, _ = job.scorer.load(job.config, job.setup.model_dir, job.setup.dataset.id2label, job.run / runs.ADAPTER)
        job.built.model = model.to(job.setup.runtime.device).eval()
        apply_speedups(job.built.model, job.setup.runtime, False, False)
    elif not distributed.is_main():
        return None, None
    logits, seconds = {}, 0.0
    for name in ("validation", "test"):
        started = time.perf_counter()
        logits[name] = job.scorer.logits(job.setup, job.built, name)
        seconds = time.perf_counter() - started if name == "test" else seconds
    return logits, len(logits["test"]) / max(seconds, 1e-9)


def _decide(job: Job, logits: dict[str, np.ndarray]) -> tuple[Decision, CalibrationRecord | None]:
    """How logits become labels, fitted on validation and saved beside the adapter for predict and serve:
    its problem type's decision (a temperature, judged on test; or one threshold per label)."""
    dataset = job.setup.dataset
    validation, test = dataset.validation, dataset.test
    decision, record = dataset.kind.fit_decision(logits["validation"], validation.labels, logits["test"], test.labels)
    runs.InputFormat.of_run(job.config, decision).write(job.run / runs.ADAPTER / runs.CALIBRATION)
    if record is None:
        job.log(f"decision: {dataset.kind.describe(decision, dataset.id2label)}")
    elif record.note:
        job.log(f"calibration: {record.note}")
    else:
        job.log(
            f"calibration: temperature {record.temperature:.3f} (fitted on validation); test ECE "
            f"{record.before.ece:.4f} -> {record.after.ece:.4f}, Brier {record.before.brier:.4f} -> "
            f"{record.after.brier:.4f}"
        )
    return decision, record


def _test(job: Job, probs: np.ndarray, decision: Decision) -> tuple:
    """The test split's metrics and prediction rows (with the scorer's extra fields: comments), written."""
    test = job.setup.dataset.test
    scored = evaluation(test.texts, test.labels, probs, job.setup.dataset.id2label, decision)
    rows = [row.to_json() for row in scored.rows]
    extras = job.scorer.extras(job.setup, job.built, decision.chosen(probs))
    comments = None
    if extras is not None:
        fields, comments = extras
        rows = [{**row, **extra} for row, extra in zip(rows, fields)]
    files.write_jsonl(job.run / runs.PREDICTIONS / "test.jsonl", rows)
    job.log("test:\n" + scored.metrics.text())
    return scored.metrics, comments


def _with_rungs(comments: CommentMetrics | None, ladder: Ladder | None) -> CommentMetrics | None:
    """label_and_comment's rungs, beside its comment metrics (as its records have always carried them)."""
    if comments is None or ladder is None:
        return comments
    if ladder.untrained is not None:
        comments.zero_shot_accuracy, comments.zero_shot_rouge_l = ladder.untrained.accuracy, ladder.untrained.rouge_l
    if ladder.head is not None:
        comments.head_accuracy, comments.head_macro_f1 = ladder.head.test.accuracy, ladder.head.test.macro_f1
        comments.head_train_seconds = ladder.head.train.seconds
    return comments


def _model_summary(job: Job) -> ModelSummary:
    built = job.built
    return ModelSummary(
        source=job.config.model,
        directory=str(job.setup.model_dir),
        hidden_size=built.hidden_size,
        parameters=built.parameters,
        trainable_parameters=built.lora.trainable,
        lora_modules=len(built.lora.matched),
    )


def _say_done(job: Job, metrics: Metrics) -> None:
    if metrics.verdict is not None and len(metrics.verdict.rows) > 1:
        say_verdict(metrics.verdict, job.log)
    comments = metrics.comments
    job.log(
        f"done in {metrics.wall_seconds:.0f}s: test accuracy {metrics.test.accuracy:.4f}"
        + (
            f", comments ROUGE-L {comments.rouge_l:.4f}, chrF {comments.chrf:.1f}, consistency "
            f"{comments.consistency:.3f}"
            if comments is not None
            else ""
        )
        + f"; metrics in {job.run / runs.METRICS}"
    )


def _cleanup(joined_before: bool) -> None:
    """The end of every job, however it ends (the ExitStack has released the locks first): the outermost job
    leaves the process group it joined (not the head-LoRA rung's run inside another job, which found the
    group joined)."""
    if not joined_before:
        distributed.leave()


# --- the head LoRA rung (label_and_comment) -----------------------------------------------------------


def head_baseline(config: Config, run: Path, log) -> Metrics:
    """The classification-head LoRA on the same data, split (same seed) and settings, trained as its own run in
    RUN/head_baseline: what writing the comment costs or buys in label accuracy. A resumed job reads the
    finished one, resumes it from its checkpoint, or starts it again when it was killed before one."""
    folder = run / runs.HEAD_BASELINE

    def prefixed(message: str) -> None:
        log(f"head baseline: {message}")

    finished, resumable = distributed.broadcast_object(
        ((folder / runs.METRICS).exists(), (folder / runs.CHECKPOINT).exists())
    )  # every process decides as the first one sees the folder
    if not finished:
        with torch.random.fork_rng():  # the comment model trains the same with or without this baseline
            if resumable:
                train(None, prefixed, resume=str(folder))
            else:
                if distributed.is_main():
                    shutil.rmtree(folder, ignore_errors=True)
                distributed.barrier()
                settings = {"problem": "single_label", "comment_column": None, "baseline": False, "merge": False}
                train(dataclasses.replace(config, **settings, output_dir=str(run), run_name=folder.name), prefixed)
    distributed.barrier()  # the first process has written its metrics
    head = runs.read_metrics(folder)
    log(f"baseline (the classification-head LoRA, same split): test accuracy {head.test.accuracy:.4f}")
    return head


# --- the baselines alone ---------------------------------------------------------------------------


def baseline(config: Config, log: Log = print) -> dict:
    """`loracls baseline`: the chosen baselines alone, on the same test split `train` would use: the zero-shot
    record's fields, plus "tfidf" and "encoder", and "skipped" (name -> why)."""
    from loracls.model.tokenizer import load_tokenizer

    runtime = setup_runtime(config.device, config.precision, config.threads)
    dataset = load_dataset(DataSpec.of(config))
    log("data: class counts\n" + format_counts(dataset))
    model_dir = tokenizer = None
    rungs = rungs_of(config, "head")  # the rungs that need no run of their own
    if "zero_shot_prompt" in rungs and zero_shot_skip_reason(config, dataset.id2label) is None:
        prompt_setup(config, dataset.id2label)
        model_dir = resolve_model_dir(config.model, log)
        tokenizer = load_tokenizer(model_dir, log)
    ladder = run_ladder(Setup(config, dataset, model_dir, runtime, log), tokenizer, None, rungs)
    out = runs.to_dict(ladder.zero_shot) if ladder.zero_shot is not None else {}
    if ladder.tfidf is not None:
        out["tfidf"] = runs.to_dict(ladder.tfidf)
    if ladder.encoders:
        out["encoder"] = runs.to_dict(ladder.encoders[0])
        out["encoders"] = [runs.to_dict(record) for record in ladder.encoders]
    out["skipped"] = {skip.name: skip.reason for skip in ladder.skipped}
    return out
