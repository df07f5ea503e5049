"""The main job, told top-down as named phases: prepare -> baseline -> fit -> test -> export -> metrics.

Every input check (config, data, model, LoRA targets, device) runs in `_prepare` before the run directory
is made, so bad input leaves nothing behind. Under torchrun every process runs the job; rank 0 writes.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from loracls import files, runs
from loracls.baselines.encoder import check_encoder, encoder_specs
from loracls.baselines.zero_shot import check_verbalizers, prompt_setup
from loracls.calibration import CalibrationRecord
from loracls.config import Config, from_dict
from loracls.data.batching import Encoded, TextEncoder, check_texts_have_tokens
from loracls.data.splits import Dataset, class_weight_vector, format_counts, load_dataset
from loracls.hardware import Runtime, environment_record, precision_reason, setup_runtime
from loracls.inference.export import export_merged
from loracls.jobs.ladder import Ladder, run_ladder, say_verdict, verdict_of, zero_shot_skip_reason
from loracls.jobs.preflight import preflight
from loracls.metrics import ClassificationMetrics, MultiLabelMetrics
from loracls.model.classifier import (
    LoadedModel,
    check_max_length,
    head_options,
    init_head_from_verbalizers,
    load_classifier,
)
from loracls.model.lora import LoraReport, LoraSpec, apply_lora
from loracls.model.scoring import check_finite_forward, evaluate, predict_logits
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import apply_speedups
from loracls.problems import Decision, evaluation, problem_for
from loracls.runs import Metrics, ModelSummary
from loracls.training import distributed
from loracls.training.logger import RunLogger
from loracls.training.loop import Trainer, TrainResult, TrainSet
from loracls.training.plan import describe
from loracls.verdict import LadderRow


@dataclass
class Job:
    config: Config
    runtime: Runtime
    dataset: Dataset
    model_dir: Path
    loaded: LoadedModel
    lora: LoraReport
    model: torch.nn.Module  # the PEFT model being trained
    run: Path
    resumed: bool
    log: object
    encoded: dict[str, Encoded]  # split -> its token ids under the long_text policy
    attention: str | None  # the attention implementation the speed-ups chose


def train(config: Config | None, log=print, resume: str | None = None) -> Path:
    """The main job. With `resume`, the run directory's own config and checkpoint are used. The run
    directory's writer lock is held from its first write (or the resume's start) to the end."""
    with contextlib.ExitStack() as held:
        if not distributed.joined():  # the outermost job (not label_and_comment's head baseline inside it) ...
            held.callback(distributed.leave)  # ... leaves the process group it joins, after the locks are released
        problem = runs.read_config(runs.check_resumable(resume)).problem if resume else config.problem
        if problem_for(problem).generative:  # label_and_comment: the causal LM is trained, its own job
            from loracls.jobs.comment import train_label_and_comment

            return train_label_and_comment(config, log, resume, held)
        return _train(config, log, resume, held)


def _train(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> Path:
    started = time.perf_counter()
    job = _prepare(config, log, resume, held)
    ladder = _baselines(job)
    result = _fit(job)
    encoded = {name: job.encoded[name] for name in ("validation", "test")}
    logits, texts_per_second = _best_logits(job, encoded)
    if not distributed.is_main():
        return job.run
    decision, calibration = _decide(job, logits)
    test = _write_test(job, decision.probabilities(logits["test"]), decision)
    summary = _model_summary(job)
    del job.model, job.loaded  # the export starts from the saved adapter
    export = _export(job, encoded["test"].ids)
    lora = LadderRow(
        "LoRA",
        test.accuracy,
        test.macro_f1,
        ece=calibration.after.ece if calibration else None,
        train_seconds=result.seconds,
        texts_per_second=texts_per_second,
        parameters=summary.parameters,
        detail=f"{job.config.model}, r={job.config.r}, {summary.lora_modules} modules",
    )
    metrics = Metrics(
        test=test,
        validation=result.validation_summary(job.config.select_by),
        train=result.summary(),
        model=summary,
        data=job.dataset.class_counts(),
        wall_seconds=time.perf_counter() - started,
        baseline=ladder.summary() if ladder is not None else None,
        export=export,
        data_notes=job.dataset.notes,
        long_texts={name: sum(split.long) for name, split in job.encoded.items()},
        calibration=calibration,
        problem=job.config.problem,
        verdict=verdict_of(ladder, lora, test.examples, job.config.select_by),
    )
    runs.write_record(job.run / runs.METRICS, metrics)
    (job.run / runs.CHECKPOINT).unlink(missing_ok=True)  # finished: nothing left to resume
    runs.remove_leftovers(job.run)
    _say_done(job, metrics)
    return job.run


# --- the phases -------------------------------------------------------------------------------------


def _prepare(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> Job:
    """Runtime, data, model and LoRA, all checked; then the run directory (rank 0 writes, all get its path)."""
    distributed.init_from_environment()
    log = log if distributed.is_main() else _quiet
    resume_dir = runs.check_resumable(resume) if resume else None
    if resume_dir is not None and distributed.is_main():
        held.enter_context(runs.hold(resume_dir))
        for path in runs.remove_leftovers(resume_dir):
            log(f"resume: removed {path.name}, left by the interrupted process")
    config = runs.read_config(resume_dir) if resume_dir is not None else config
    runtime = setup_runtime(config.device, config.precision, config.threads, config.deterministic)
    runtime.device = distributed.local_device(runtime.device)
    preflight(config, runtime)
    dataset = load_dataset(config)
    log("data: class counts\n" + format_counts(dataset))
    check_verbalizers(config, dataset.id2label)
    if (
        config.baseline
        and "zero_shot" in config.baselines
        and problem_for(config.problem).zero_shot_unsupported is None
        or config.head_init == "verbalizer"
    ):
        prompt_setup(config, dataset.id2label)  # refuse a bad prompt before anything is written
    if config.baseline and "encoder" in config.baselines and distributed.is_main():
        for spec in encoder_specs(config, runtime):  # a bad encoder_model is refused before anything is written
            check_encoder(spec, log)
    config = _prompt_as_input(config, dataset)
    model_dir = resolve_model_dir(config.model, log)
    check_max_length(model_dir, config.max_length)
    torch.manual_seed(config.seed)  # head init, LoRA init and dropout follow the seed
    loaded = load_classifier(
        model_dir,
        dataset.id2label,
        log=log,
        quantization=config.quantization,
        head_init="random" if config.head_init == "random" else "zero",
        problem=config.problem,
        **head_options(config),
    )
    if config.head_init == "verbalizer":
        _verbalizer_head(loaded, config, dataset, log)
    model, lora = apply_lora(loaded.model, LoraSpec.of(config), log)
    encoded = _encode_splits(loaded.tokenizer, dataset, config, log)
    weights = class_weight_vector(config, dataset)  # unknown label names are refused before anything is written
    if weights is not None:
        log("loss: class weights " + ", ".join(f"{dataset.id2label[i]}={w:.3g}" for i, w in enumerate(weights)))
    if config.quantization == "none":
        model.to(runtime.device)
    if config.data_parallel == "fsdp" and distributed.world_size() > 1:
        units = distributed.shard_model(model)
        log(f"fsdp: weights sharded over {distributed.world_size()} processes in {units} units")
    attention = apply_speedups(model, runtime, config.quantization != "none", distributed.is_sharded(model))
    check_finite_forward(model, encoded["train"].ids[:4], loaded.tokenizer.pad_token_id, runtime)
    log(f"runtime: device {runtime.device}, precision {precision_reason(runtime, config.precision)}")
    run = resume_dir if resume_dir is not None else new_run(config, runtime, dataset, held)
    log(f"run directory: {run}")
    resumed = resume_dir is not None
    return Job(config, runtime, dataset, model_dir, loaded, lora, model, run, resumed, log, encoded, attention)


def _prompt_as_input(config: Config, dataset: Dataset) -> Config:
    """head_init: verbalizer reads the label word's logits after the zero-shot prompt: without an input_template
    of its own the classifier then reads that prompt (its {choices} filled in)."""
    if config.head_init != "verbalizer" or config.input_template is not None:
        return config
    template, words = prompt_setup(config, dataset.id2label)
    choices = ", ".join(words).replace("{", "{{").replace("}", "}}")  # the words are text, not fields
    return from_dict({"input_template": template.replace("{choices}", choices)}, base=config)


def _verbalizer_head(loaded: LoadedModel, config: Config, dataset: Dataset, log) -> None:
    _, words = prompt_setup(config, dataset.id2label)
    ids = [loaded.tokenizer(" " + word, add_special_tokens=False)["input_ids"] for word in words]
    init_head_from_verbalizers(loaded.model, loaded.model_dir, [token[0] for token in ids])
    several = [w for w, token in zip(words, ids) if len(token) > 1]
    log(
        f"head: initialised from the LM head rows of the verbalizers {', '.join(words)}"
        + (f" (first token only for {', '.join(several)})" if several else "")
    )


def _encode_splits(tokenizer, dataset: Dataset, config: Config, log) -> dict[str, Encoded]:
    """Every split's token ids under the long_text policy, encoded once for the whole job (with chunks every
    window of a long training text is an example with the text's label, or only its first window with
    `chunk_training: first`; an evaluated text is the mean of its windows' logits); how many texts are
    longer than max_length (and what `long_text` does with them) is said, never silent."""
    check_texts_have_tokens(tokenizer, {name: getattr(dataset, name).texts for name in ("train", "validation", "test")})
    encoded, encoder = {}, TextEncoder.for_config(config, tokenizer)
    first_only = config.long_text == "chunks" and config.chunk_training == "first"
    train_encoder = TextEncoder.for_config(config, tokenizer, "truncate") if first_only else encoder
    done = {"truncate": "truncated", "head_tail": "cut to their head and tail", "chunks": "split into windows"}
    for name in ("train", "validation", "test"):
        texts = getattr(dataset, name).texts
        encoded[name] = (train_encoder if name == "train" else encoder).encode(texts)
        count = sum(encoded[name].long)
        if count:
            note = (
                f"data: {count} of {len(texts)} {name} texts ({100 * count / len(texts):.1f}%) are "
                f"longer than max_length {config.max_length} tokens and are {done[config.long_text]} "
                f"(long_text: {config.long_text})"
            )
            dataset.notes.append(note)
            log(note)
    return encoded


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
    """The baseline ladder on the test split, before training (rank 0; a resumed run reads what it wrote)."""
    ladder = None
    if job.config.baseline and distributed.is_main():
        ladder = run_ladder(job.config, job.dataset, job.runtime, job.model_dir, job.loaded.tokenizer, job.run, job.log)
    distributed.barrier()
    return ladder


def _fit(job: Job) -> TrainResult:
    config, dataset, pad_id = job.config, job.dataset, job.loaded.tokenizer.pad_token_id
    train, weights = job.encoded["train"], class_weight_vector(config, dataset)
    train_set = TrainSet(
        ids=train.ids,
        labels=[dataset.train.labels[i] for i in train.owner],
        num_labels=len(dataset.id2label),
        pad_id=pad_id,
        problem=dataset.kind,
        class_weight=None if weights is None else torch.tensor(weights, device=job.runtime.device),
    )
    validate = functools.partial(
        evaluate,
        encoded=job.encoded["validation"],
        split=dataset.validation,
        id2label=dataset.id2label,
        decision=Decision(config.problem),  # thresholds are tuned after training: 0.5 until then
        pad_id=pad_id,
        batch_size=config.eval_batch_size,
        runtime=job.runtime,
    )
    trainer = Trainer(job.model, train_set, validate, config, job.runtime, job.run, RunLogger(job.run, job.log))
    if job.resumed:
        trainer.load_checkpoint()
    job.log(describe(trainer.plan, len(dataset.train), config, job.attention, trainer.opt.scaler.is_enabled()))
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


def _best_logits(job: Job, encoded: dict[str, Encoded]) -> tuple[dict[str, np.ndarray] | None, float | None]:
    """The best checkpoint's logits per text on the validation and test splits (windows averaged), and the
    texts per second of the test split's pass (the verdict's inference cost)."""
    if not (distributed.is_sharded(job.model) or distributed.is_main()):  # a sharded forward needs every process
        return None, None
    logits, seconds = {}, 0.0
    for name, split in encoded.items():
        started = time.perf_counter()
        logits[name] = split.per_text(
            predict_logits(
                job.model, split.ids, job.loaded.tokenizer.pad_token_id, job.config.eval_batch_size, job.runtime
            )
        )
        seconds = time.perf_counter() - started if name == "test" else seconds
    return logits, len(logits["test"]) / max(seconds, 1e-9)


def _decide(job: Job, logits: dict[str, np.ndarray]) -> tuple[Decision, CalibrationRecord | None]:
    """How logits become labels, fitted on validation and saved beside the adapter for predict and serve:
    its problem type's decision (a temperature, judged on test; or one threshold per label)."""
    validation, test = job.dataset.validation, job.dataset.test
    decision, record = job.dataset.kind.fit_decision(
        logits["validation"], validation.labels, logits["test"], test.labels
    )
    runs.InputFormat.of_run(job.config, decision).write(job.run / runs.ADAPTER / runs.CALIBRATION)
    if record is None:
        job.log(f"decision: {job.dataset.kind.describe(decision, job.dataset.id2label)}")
    elif record.note:
        job.log(f"calibration: {record.note}")
    else:
        job.log(
            f"calibration: temperature {record.temperature:.3f} (fitted on validation); test ECE "
            f"{record.before.ece:.4f} -> {record.after.ece:.4f}, Brier {record.before.brier:.4f} -> "
            f"{record.after.brier:.4f}"
        )
    return decision, record


def _write_test(job: Job, probs: np.ndarray, decision: Decision) -> ClassificationMetrics | MultiLabelMetrics:
    test = job.dataset.test
    scored = evaluation(test.texts, test.labels, probs, job.dataset.id2label, decision)
    files.write_jsonl(job.run / runs.PREDICTIONS / "test.jsonl", [row.to_json() for row in scored.rows])
    job.log("test:\n" + scored.metrics.text())
    return scored.metrics


def _model_summary(job: Job) -> ModelSummary:
    return ModelSummary(
        source=job.config.model,
        directory=str(job.model_dir),
        hidden_size=job.loaded.hidden_size,
        parameters=job.loaded.parameters,
        trainable_parameters=job.lora.trainable,
        lora_modules=len(job.lora.matched),
    )


def _export(job: Job, test_ids: list[list[int]]):
    if not job.config.merge:
        return None
    return export_merged(job.run, job.model_dir, job.dataset.id2label, test_ids, job.config, job.runtime, job.log)


def _say_done(job: Job, metrics: Metrics) -> None:
    if metrics.verdict is not None and len(metrics.verdict.rows) > 1:
        say_verdict(metrics.verdict, job.log)
    job.log(
        f"done in {metrics.wall_seconds:.0f}s: test accuracy {metrics.test.accuracy:.4f}; "
        f"metrics in {job.run / runs.METRICS}"
    )


def _quiet(*_args, **_kwargs) -> None:
    pass


# --- the baselines alone ---------------------------------------------------------------------------


def baseline(config: Config, log=print) -> dict:
    """`loracls baseline`: the chosen baselines alone, on the same test split `train` would use: the zero-shot
    record's fields, plus "tfidf" and "encoder", and "skipped" (name -> why)."""
    from loracls.model.tokenizer import load_tokenizer

    runtime = setup_runtime(config.device, config.precision, config.threads)
    dataset = load_dataset(config)
    log("data: class counts\n" + format_counts(dataset))
    model_dir = tokenizer = None
    if "zero_shot" in config.baselines and zero_shot_skip_reason(config, dataset.id2label) is None:
        prompt_setup(config, dataset.id2label)
        model_dir = resolve_model_dir(config.model, log)
        tokenizer = load_tokenizer(model_dir, log)
    ladder = run_ladder(config, dataset, runtime, model_dir, tokenizer, None, log)
    out = runs.to_dict(ladder.zero_shot) if ladder.zero_shot is not None else {}
    if ladder.tfidf is not None:
        out["tfidf"] = runs.to_dict(ladder.tfidf)
    if ladder.encoders:
        out["encoder"] = runs.to_dict(ladder.encoders[0])
        out["encoders"] = [runs.to_dict(record) for record in ladder.encoders]
    out["skipped"] = {skip.name: skip.reason for skip in ladder.skipped}
    return out
