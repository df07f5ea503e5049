"""The label_and_comment job, as named phases: prepare -> fit -> decide -> test (labels, then comments) -> metrics.

LoRA trains the causal LM itself (no classification head) on prompt + label word + newline + comment + EOS,
with the loss on the label word and the comment only (`problems.label_and_comment`). The same loop,
checkpoints, resume and validation as classification: validation scores each label word after the prompt
(`model.label_scoring`, the zero-shot baseline's scorer), so the label is always in the label set. After
training a temperature is fitted on validation; on the test split the chosen label's comment is generated
(greedy, at most `max_comment_tokens`) and scored against the reference comments (ROUGE-L, chrF), and for
consistency the run's own label scorer reads each comment alone.
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
from peft import PeftModel
from transformers import AutoModelForCausalLM

from loracls import files, runs
from loracls.config import Config
from loracls.data.splits import Dataset, Split, format_counts, load_dataset
from loracls.errors import LoraclsError
from loracls.hardware import Runtime, precision_reason, setup_runtime
from loracls.inference.export import compare_predictions
from loracls.jobs.preflight import preflight
from loracls.jobs.train import new_run, train
from loracls.metrics import comment_scores
from loracls.model.checkpoint import load_causal_lm
from loracls.model.generation import Generated, comments_after_labels
from loracls.model.label_scoring import LabelScorer
from loracls.model.lora import LoraReport, LoraSpec, apply_causal_lora
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import apply_speedups
from loracls.model.tokenizer import load_tokenizer
from loracls.problems import Decision, Evaluation, evaluation, training_sequence
from loracls.problems.label_and_comment import COMMENT_SEPARATOR, label_words, prompt_template
from loracls.runs import CommentMetrics, ExportCheck, Metrics, ModelSummary
from loracls.training import distributed
from loracls.training.logger import RunLogger
from loracls.training.loop import Trainer, TrainResult, TrainSet
from loracls.training.plan import describe


@dataclass
class CommentJob:
    config: Config
    runtime: Runtime
    dataset: Dataset
    model_dir: Path
    tokenizer: object
    model: torch.nn.Module  # the PEFT causal LM being trained
    lora: LoraReport
    run: Path
    resumed: bool
    log: object
    template: str
    words: list[str]  # the label word of each label id

    def scorer(self) -> LabelScorer:
        config = self.config
        return LabelScorer(
            self.model, self.tokenizer, self.template, self.words, config.max_length, config.eval_batch_size,
            self.runtime,
        )  # fmt: skip


def train_label_and_comment(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> Path:
    started = time.perf_counter()
    job = _prepare(config, log, resume, held)
    baselines = job.config.baselines if job.config.baseline else []
    zero_shot = None
    if "zero_shot" in baselines and not job.resumed and distributed.is_main():
        zero_shot = _zero_shot(job)
    distributed.barrier()
    if _sharding(job.config):
        units = distributed.shard_model(job.model)
        job.log(f"fsdp: weights sharded over {distributed.world_size()} processes in {units} units")
    head = _head_baseline(job) if "head" in baselines else None  # under torchrun: a distributed run too
    result = _fit(job)
    if not distributed.is_main():
        return job.run
    if distributed.is_sharded(job.model):  # the test phase runs here alone: the base + the saved best adapter
        job.model = _reloaded(job)
    logits = {name: _label_logprobs(job, getattr(job.dataset, name).texts) for name in ("validation", "test")}
    test = job.dataset.test
    decision, calibration = job.dataset.kind.fit_decision(
        logits["validation"], job.dataset.validation.labels, logits["test"], test.labels
    )
    runs.InputFormat.of_run(job.config, decision).write(job.run / runs.ADAPTER / runs.CALIBRATION)
    probs = decision.probabilities(logits["test"])
    scored = evaluation(test.texts, test.labels, probs, job.dataset.id2label, decision)
    comments = _test_comments(job, test, decision.chosen(probs), scored)
    export = _export(job, decision) if job.config.merge else None
    if zero_shot is not None:
        comments.zero_shot_accuracy, comments.zero_shot_rouge_l = zero_shot
    if head is not None:
        comments.head_accuracy, comments.head_macro_f1 = head.test.accuracy, head.test.macro_f1
        comments.head_train_seconds = head.train.seconds
    job.log("test:\n" + scored.metrics.text())
    metrics = _metrics(job, result, scored, calibration, comments, time.perf_counter() - started)
    metrics.export = export
    runs.write_record(job.run / runs.METRICS, metrics)
    (job.run / runs.CHECKPOINT).unlink(missing_ok=True)
    runs.remove_leftovers(job.run)
    job.log(
        f"done in {metrics.wall_seconds:.0f}s: test accuracy {scored.metrics.accuracy:.4f}, comments ROUGE-L "
        f"{comments.rouge_l:.4f}, chrF {comments.chrf:.1f}, consistency {comments.consistency:.3f}"
        + (f" (zero-shot: accuracy {zero_shot[0]:.4f}, ROUGE-L {zero_shot[1]:.4f})" if zero_shot else "")
        + (f"; the classification-head LoRA: accuracy {head.test.accuracy:.4f}" if head else "")
        + f"; metrics in {job.run / runs.METRICS}"
    )
    return job.run


def _metrics(job: CommentJob, result: TrainResult, scored: Evaluation, calibration, comments, seconds) -> Metrics:
    return Metrics(
        test=scored.metrics,
        validation=result.validation_summary(job.config.select_by),
        train=result.summary(),
        model=ModelSummary(
            job.config.model,
            str(job.model_dir),
            job.model.config.hidden_size,
            job.lora.total,
            job.lora.trainable,
            len(job.lora.matched),
        ),  # fmt: skip
        data=job.dataset.class_counts(),
        wall_seconds=seconds,
        data_notes=job.dataset.notes,
        calibration=calibration,
        problem=job.config.problem,
        comments=comments,
    )


# --- the phases -------------------------------------------------------------------------------------


def _prepare(config: Config | None, log, resume: str | None, held: contextlib.ExitStack) -> CommentJob:
    """Every input checked before the run directory is made (or the interrupted run's own config read)."""
    distributed.init_from_environment()
    log = log if distributed.is_main() else _quiet
    resume_dir = runs.check_resumable(resume) if resume else None
    if resume_dir is not None and distributed.is_main():
        held.enter_context(runs.hold(resume_dir))
        runs.remove_leftovers(resume_dir)
    config = runs.read_config(resume_dir) if resume_dir is not None else config
    runtime = setup_runtime(config.device, config.precision, config.threads, config.deterministic)
    runtime.device = distributed.local_device(runtime.device)
    preflight(config, runtime)
    dataset = load_dataset(config)
    log("data: class counts\n" + format_counts(dataset))
    words, template = label_words(config.verbalizers, dataset.id2label), prompt_template(config.input_template)
    model_dir = resolve_model_dir(config.model, log)
    tokenizer = load_tokenizer(model_dir, log)
    torch.manual_seed(config.seed)
    base = load_causal_lm(model_dir, log=log)
    model, lora = apply_causal_lora(base, LoraSpec.of(config), log)
    model.to(runtime.device)
    apply_speedups(model, runtime, False, _sharding(config))
    log(f"runtime: device {runtime.device}, precision {precision_reason(runtime, config.precision)}")
    run = resume_dir if resume_dir is not None else new_run(config, runtime, dataset, held)
    log(f"run directory: {run}")
    return CommentJob(
        config, runtime, dataset, model_dir, tokenizer, model, lora, run, resume_dir is not None, log, template, words
    )  # fmt: skip


def _sharding(config: Config) -> bool:
    return config.data_parallel == "fsdp" and distributed.world_size() > 1


def _reloaded(job: CommentJob) -> torch.nn.Module:
    model = _saved_adapter(job)
    apply_speedups(model, job.runtime, False, False)
    return model


def _saved_adapter(job: CommentJob) -> torch.nn.Module:
    """The run's saved adapter on a fresh fp32 base, in eval mode."""
    base = load_causal_lm(job.model_dir)
    return PeftModel.from_pretrained(base, str(job.run / runs.ADAPTER)).to(job.runtime.device).eval()


def _quiet(*_args, **_kwargs) -> None:
    """The log of every process but the first."""


def _train_set(job: CommentJob) -> TrainSet:
    """Prompt + label word + separator + comment (at most max_comment_tokens) + EOS per training text."""
    scorer, tokenizer, config, split = job.scorer(), job.tokenizer, job.config, job.dataset.train
    separator = tokenizer(COMMENT_SEPARATOR, add_special_tokens=False)["input_ids"]
    comments = tokenizer(split.comments, add_special_tokens=False)["input_ids"]
    ids, targets = [], []
    for prompt, label, comment in zip(scorer._prompt_ids(split.texts), split.labels, comments):
        sequence, target = training_sequence(
            prompt, scorer.verbalizer_ids[label], separator, comment[: config.max_comment_tokens],
            tokenizer.eos_token_id, config.label_token_weight,
        )  # fmt: skip
        ids.append(sequence)
        targets.append(target)
    return TrainSet(ids, targets, len(job.dataset.id2label), tokenizer.pad_token_id, job.dataset.kind)


def _fit(job: CommentJob) -> TrainResult:
    split, dataset = job.dataset.validation, job.dataset
    decision = Decision(job.config.problem)

    def validate(model) -> Evaluation:
        probs = decision.probabilities(_label_logprobs(job, split.texts))
        return evaluation(split.texts, split.labels, probs, dataset.id2label, decision)

    trainer = Trainer(
        job.model, _train_set(job), validate, job.config, job.runtime, job.run, RunLogger(job.run, job.log)
    )
    if job.resumed:
        trainer.load_checkpoint()
    job.log(describe(trainer.plan, len(dataset.train), job.config, None, trainer.opt.scaler.is_enabled()))
    result = trainer.fit()
    job.log(
        f"train: {result.steps} steps in {result.seconds:.0f}s; best validation accuracy "
        f"{result.best_validation_accuracy:.4f} at step {result.best_step}"
    )
    return result


def _label_logprobs(job: CommentJob, texts: list[str]) -> np.ndarray:
    """log p(label word | prompt) per text and label, with the model in eval mode (no dropout)."""
    was_training = job.model.training
    job.model.eval()
    try:
        return job.scorer().label_logprobs(texts)
    finally:
        job.model.train(was_training)


def _comments(job: CommentJob, texts: list[str], chosen, candidates: int | None = None) -> Generated:
    """The current model's comments after each text's chosen label (at most max_comment_tokens; greedy, or the
    first of `comment_candidates` beams that reads back as the label)."""
    config = job.config
    return comments_after_labels(
        job.model, job.tokenizer, job.scorer(), texts, chosen, config.max_comment_tokens, config.eval_batch_size,
        job.runtime, candidates or config.comment_candidates,
    )  # fmt: skip


def _zero_shot(job: CommentJob) -> tuple[float, float]:
    """The same prompt with no training (the adapter disabled, before its first step): (test accuracy of the
    label words scored, ROUGE-L of the comments the base model writes after its chosen label)."""
    test = job.dataset.test
    with job.model.disable_adapter():
        chosen = _label_logprobs(job, test.texts).argmax(axis=1)
        written = _comments(job, test.texts, chosen)
    accuracy = float((chosen == np.asarray(test.labels)).mean())
    rouge_l, _ = comment_scores(written.texts, test.comments)
    job.log(f"baseline (zero-shot, the same prompt untrained): accuracy {accuracy:.4f}, comments ROUGE-L {rouge_l:.4f}")
    return accuracy, rouge_l


def _head_baseline(job: CommentJob) -> Metrics:
    """The classification-head LoRA on the same data, split (same seed) and settings, trained as its own run in
    RUN/head_baseline: what writing the comment costs or buys in label accuracy. A resumed job reads the
    finished one, resumes it from its checkpoint, or starts it again when it was killed before one."""
    folder = job.run / runs.HEAD_BASELINE

    def log(message: str) -> None:
        job.log(f"head baseline: {message}")

    finished, resumable = distributed.broadcast_object(
        ((folder / runs.METRICS).exists(), (folder / runs.CHECKPOINT).exists())
    )  # every process decides as the first one sees the folder
    if not finished:
        with torch.random.fork_rng():  # the comment model trains the same with or without this baseline
            _train_head(job, folder, resumable, log)
    distributed.barrier()  # the first process has written its metrics
    head = runs.read_metrics(folder)
    job.log(f"baseline (the classification-head LoRA, same split): test accuracy {head.test.accuracy:.4f}")
    return head


def _train_head(job: CommentJob, folder: Path, resumable: bool, log) -> None:
    if resumable:
        train(None, log, resume=str(folder))
        return
    if distributed.is_main():
        shutil.rmtree(folder, ignore_errors=True)
    distributed.barrier()
    settings = {"problem": "single_label", "comment_column": None, "baseline": False, "merge": False}
    train(dataclasses.replace(job.config, **settings, output_dir=str(job.run), run_name=folder.name), log)


def _test_comments(job: CommentJob, test: Split, chosen: np.ndarray, scored: Evaluation) -> CommentMetrics:
    """Generate each test text's comment after its chosen label; score it against the reference; write the
    rows (the prediction row, the comment, the reference). With several candidates, the greedy comments too,
    for what the candidates buy; and how often the reference comments themselves read back as their label."""
    started = time.perf_counter()
    generated = _comments(job, test.texts, chosen)
    seconds = time.perf_counter() - started
    rouge_l, chrf = comment_scores(generated.texts, test.comments)
    read_back = _label_logprobs(job, generated.texts).argmax(axis=1)
    references = _label_logprobs(job, test.comments).argmax(axis=1)
    rows = [
        {**row.to_json(), "comment": comment, "reference_comment": reference}
        for row, comment, reference in zip(scored.rows, generated.texts, test.comments)
    ]
    files.write_jsonl(job.run / runs.PREDICTIONS / "test.jsonl", rows)
    record = CommentMetrics(
        examples=len(test.texts),
        rouge_l=rouge_l,
        chrf=chrf,
        consistency=_share(read_back == chosen),
        mean_tokens=float(np.mean(generated.tokens)) if generated.tokens else 0.0,
        tokens_per_second=sum(generated.tokens) / max(seconds, 1e-9),
        candidates=job.config.comment_candidates,
        reference_consistency=_share(references == np.asarray(test.labels)),
    )
    if record.candidates > 1:
        greedy = _comments(job, test.texts, chosen, candidates=1)
        record.greedy_rouge_l, _ = comment_scores(greedy.texts, test.comments)
        record.greedy_consistency = _share(_label_logprobs(job, greedy.texts).argmax(axis=1) == chosen)
    return record


def _share(agrees: np.ndarray) -> float:
    return float(np.mean(agrees)) if len(agrees) else 0.0


def _export(job: CommentJob, decision: Decision) -> ExportCheck:
    """The saved adapter on a fresh full-precision base -> merge_and_unload -> run/merged (the causal LM, its
    tokenizer and loracls_input.json), checked against that adapter on the test split, both in fp32 without
    autocast, as classification's export: the check is that the two compute the same function, not how a bf16
    matmul rounds W x + B A x against (W + B A) x (under bf16 autocast 1 of 200 WordNet labels flipped). The
    same labels (beyond ties) and the share of equal comments (the same decoding: greedy, or the candidates'
    rule)."""
    test, config = job.dataset.test, job.config
    exact = dataclasses.replace(job, model=_saved_adapter(job), runtime=Runtime(job.runtime.device, torch.float32))
    adapter_probs = decision.probabilities(_label_logprobs(exact, test.texts))
    chosen = decision.chosen(adapter_probs)
    adapter_comments = _comments(exact, test.texts, chosen).texts
    merged = exact.model.merge_and_unload()

    def fill(staging: Path) -> None:
        merged.save_pretrained(staging, save_original_format=False)  # the text layout (see inference/export.py)
        job.tokenizer.save_pretrained(staging)
        runs.InputFormat.of_run(config, decision).write(staging / runs.INPUT_FORMAT)

    files.replace_dir(job.run / runs.MERGED, fill, "the merged model")
    standalone = AutoModelForCausalLM.from_pretrained(str(job.run / runs.MERGED), dtype=torch.float32)
    exact.model = standalone.to(job.runtime.device).eval()
    merged_probs = decision.probabilities(_label_logprobs(exact, test.texts))
    check = compare_predictions(adapter_probs, merged_probs, "fp32", decision)
    again = _comments(exact, test.texts, chosen)
    equal = [a == b for a, b in zip(again.texts, adapter_comments)]
    check.comments_equal = float(np.mean(equal)) if equal else 1.0
    if not check.predictions_equal:
        raise LoraclsError(
            f"the merged model disagrees with the adapter on {check.disagreements_beyond_ties} of {check.examples} "
            f"test labels; {job.run / runs.MERGED} is not a faithful export"
        )
    job.log(
        f"export: merged causal LM in {job.run / runs.MERGED}; test labels equal the adapter's in fp32 (max "
        f"probability difference {check.max_probability_difference:.2e}), {100 * check.comments_equal:.0f}% of "
        "comments equal"
    )
    return check
