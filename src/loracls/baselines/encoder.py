"""The baseline a practitioner would otherwise ship: an encoder (all-MiniLM-L6-v2, all-mpnet-base-v2, or any HF
encoder through `encoder_model`; several at once) fine-tuned in full on the same train split and trained to its
best by the rules a careful user applies: epochs until validation stops improving (encoder_patience, a cap of
encoder_epochs), warmup then linear decay, length-grouped batches, and a small learning-rate grid, the best of
each chosen on the same validation split; scored on the same test split, with its cost: train time, inference
texts/s and size.

The model is transformers' AutoModelForSequenceClassification; the loss and the decision (softmax at a
temperature fitted on validation, or a sigmoid per label with thresholds tuned on validation) are the ones
LoRA uses, so the two are compared on the same terms.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

from loracls import files
from loracls.data.batching import collate, length_grouped_batches
from loracls.data.splits import Dataset
from loracls.errors import Log, LoraclsError, first_line
from loracls.model.scoring import Batching, predict_logits
from loracls.model.source import resolve_encoder_dir
from loracls.problems import Decision, evaluation
from loracls.runs import INPUT_FORMAT, EncoderRecord, InputFormat

ENCODER_PROBABILITIES = "probabilities.npz"  # its calibrated probabilities on the validation and test splits
WARMUP_SHARE = 0.1  # of all steps: the usual recipe for fine-tuning BERT-like encoders


def _tokenizer(spec: str, directory) -> AutoTokenizer:
    """The encoder's tokenizer (with its config checked first); one line where either cannot be read."""
    try:
        AutoConfig.from_pretrained(str(directory))
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:
        raise LoraclsError(f"encoder baseline: cannot load {spec}: {first_line(exc, 200)}") from None
    if tokenizer.pad_token_id is None:
        raise LoraclsError(f"encoder baseline: {spec}'s tokenizer has no pad token")
    return tokenizer


def check_encoder(spec: str, log: Log = print):
    """Refuse an encoder that cannot be loaded (its config and tokenizer) before a run directory is made;
    returns its config (distill checks --student-layers against its layer count)."""
    directory = resolve_encoder_dir(spec, log)
    _tokenizer(spec, directory)
    return AutoConfig.from_pretrained(str(directory))


def _load(spec: str, dataset: Dataset, log):
    directory = resolve_encoder_dir(spec, log)
    tokenizer, labels = _tokenizer(spec, directory), dataset.id2label
    problem_type = dataset.kind.hf_problem_type
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(directory),
            num_labels=len(labels),
            id2label=dict(labels),
            label2id={name: i for i, name in labels.items()},
            problem_type=problem_type,
            dtype=torch.float32,
        )
    except Exception as exc:
        raise LoraclsError(
            f"encoder baseline: cannot load {spec} as a sequence classifier: {first_line(exc, 200)}"
        ) from None
    return tokenizer, model


def _encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]


class EncoderFit:
    """Fine-tune, keep the best epoch's weights (by validation), then score the test split."""

    def __init__(self, dataset: Dataset, config, runtime, log, spec: str):
        self.dataset, self.config, self.runtime, self.log, self.name = dataset, config, runtime, log, spec
        self.tokenizer, self.model = _load(spec, dataset, log)
        self.model.to(runtime.device)
        limit = getattr(self.model.config, "max_position_embeddings", 512) or 512
        self.max_length = min(config.max_length, limit)
        self.ids = {
            name: _encode(self.tokenizer, self.texts(name), self.max_length) for name in ("train", "validation", "test")
        }
        self.decision = Decision(dataset.problem)

    @property
    def label(self) -> str:
        """What the log calls it."""
        return f"encoder {self.name}"

    def texts(self, split: str) -> list[str]:
        """The texts a split trains or scores on (a student trains on more than the training split's)."""
        return getattr(self.dataset, split).texts

    def loss(self, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The batch's loss: the problem's own (cross-entropy, or BCE per label) on the gold labels."""
        targets = self.dataset.kind.targets(
            [self.dataset.train.labels[i] for i in rows], len(self.dataset.id2label), self.runtime.device
        )
        return self.dataset.kind.loss(logits, targets, None, len(rows))

    def logits(self, split: str) -> np.ndarray:
        batching = Batching(self.tokenizer.pad_token_id, self.config.eval_batch_size, self.runtime)
        return predict_logits(self.model, self.ids[split], batching)

    def validation_score(self) -> float:
        """The config's select_by on validation, higher is better (loss is negated)."""
        split = self.dataset.validation
        probs = self.decision.probabilities(self.logits("validation"))
        scored = evaluation(split.texts, split.labels, probs, self.dataset.id2label, self.decision)
        if self.config.select_by == "loss":
            return -scored.loss
        if self.config.select_by == "macro_f1":
            return scored.metrics.macro_f1
        return self.dataset.kind.headline(scored.metrics)

    def _backward(self, rows: list[int]) -> None:
        """One training batch's forward pass and the gradients of its loss."""
        batch = collate([self.ids["train"][i] for i in rows], self.tokenizer.pad_token_id)
        with self.runtime.autocast:
            logits = self.model(
                input_ids=batch["input_ids"].to(self.runtime.device),
                attention_mask=batch["attention_mask"].to(self.runtime.device),
            ).logits
        self.loss(rows, logits.float()).backward()

    def _epoch(self, optimizer, scheduler, epoch: int) -> None:
        config = self.config
        batches = length_grouped_batches(
            [len(x) for x in self.ids["train"]], config.encoder_batch_size, config.seed + epoch
        )
        self.model.train()
        for rows in batches:
            self._backward(rows)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

    def train(self, learning_rate: float, deadline: float | None = None) -> EncoderTry:
        """Epochs until `encoder_patience` epochs bring no better validation score (at most encoder_epochs),
        warmup then linear decay over the cap; the model ends holding the best epoch's weights. With a
        `deadline` (perf_counter seconds), no epoch is begun that the last one's time says would end past it."""
        config = self.config
        steps = config.encoder_epochs * math.ceil(len(self.ids["train"]) / config.encoder_batch_size)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate, weight_decay=config.weight_decay)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(WARMUP_SHARE * steps), steps)
        best, curve, state, budget_stop = 0, [], None, False
        for epoch in range(1, config.encoder_epochs + 1):
            began = time.perf_counter()
            self._epoch(optimizer, scheduler, epoch)
            curve.append(self.validation_score())
            self.log(
                f"{self.label} lr {learning_rate:g}: epoch {epoch}/{config.encoder_epochs}, "
                f"validation {config.select_by} {abs(curve[-1]):.4f}"
            )
            if not best or curve[-1] > curve[best - 1]:
                best, state = epoch, copy.deepcopy(self.model.state_dict())
            if config.encoder_patience is not None and epoch - best >= config.encoder_patience:
                break
            now = time.perf_counter()
            if deadline is not None and epoch < config.encoder_epochs and now + (now - began) > deadline:
                budget_stop = True
                self.log(f"{self.label} lr {learning_rate:g}: stopped after epoch {epoch}: encoder_budget_s reached")
                break
        self.model.load_state_dict(state)
        return EncoderTry(learning_rate, best, curve, budget_stop)

    def projected_epoch_seconds(self, batches: int = 3) -> float:
        """One epoch and its validation, projected from `batches` timed training batches. They leave no trace:
        their gradients are dropped (the weights do not move) and the random state (dropout) is put back, so
        training then starts exactly as it would have without the projection."""
        config = self.config
        order = length_grouped_batches([len(x) for x in self.ids["train"]], config.encoder_batch_size, config.seed)
        timed = order[:batches]
        began = time.perf_counter()
        self.model.train()
        with torch.random.fork_rng(devices=[self.runtime.device] if self.runtime.device.type == "cuda" else []):
            for rows in timed:
                self._backward(rows)
        self.model.zero_grad(set_to_none=True)
        per_text = (time.perf_counter() - began) / max(sum(len(rows) for rows in timed), 1)
        return per_text * (len(self.ids["train"]) + len(self.ids["validation"]) / 3)


class EncoderSkipped(LoraclsError):
    """An encoder left out of the run (its budget): the reason is said in the log and the verdict."""


@dataclass
class EncoderTry:
    """One learning rate of the grid: its best epoch and the validation score after every epoch."""

    learning_rate: float
    best_epoch: int
    curve: list[float]
    budget_stop: bool = False  # encoder_budget_s ended it before patience or the cap

    @property
    def score(self) -> float:
        return self.curve[self.best_epoch - 1]


def encoder_specs(config) -> list[str]:
    """The encoders a run trains: the config's, or (null) the strongest one installed: mpnet-base wherever its
    wheels are (the encoder a careful user would ship), else minilm. The device does not change the choice:
    the verdict is the same on a CPU."""
    from loracls.model.source import packaged_encoder_installed

    if config.encoder_model is None:
        return ["mpnet-base" if packaged_encoder_installed("mpnet-base") else "minilm"]
    return config.encoder_model if isinstance(config.encoder_model, list) else [config.encoder_model]


DEFAULT_RATES = {"mpnet-base": [5e-5]}  # the study's best rate on every set it ran (4 of 4); one rate = 1/3 the time
GRID = [5e-5, 1e-4, 2e-4]


def learning_rates(config, spec: str = "") -> list[float]:
    """The rates an encoder tries: the config's, or (null) its default (DEFAULT_RATES, else the grid)."""
    rates = config.encoder_learning_rate
    if rates is None:
        return list(DEFAULT_RATES.get(spec, GRID))
    return list(rates) if isinstance(rates, list) else [rates]


@dataclass
class Fitted:
    """The best of a grid, calibrated on validation and scored on the test split: the fit (its model holds the
    best epoch's weights), the decision fitted on validation, the test logits and what it all took."""

    fit: EncoderFit
    chosen: EncoderTry
    tries: list[EncoderTry]
    decision: Decision
    calibration: object
    test_logits: np.ndarray
    train_seconds: float
    texts_per_second: float
    validation_logits: np.ndarray


def fit_best(
    candidates: list[tuple[Callable[[], EncoderFit], float]], seed: int, budget_s: float | None = None
) -> Fitted:
    """Train every (make the fit, learning rate) candidate from the same seed, keep the best on validation,
    fit its decision on validation and time its pass over the test split. With `budget_s`, an encoder whose
    first epoch is projected beyond it is skipped (EncoderSkipped), and no rate or epoch is begun past it."""
    started, tries, best = time.perf_counter(), [], None
    deadline = None if budget_s is None else started + budget_s
    for make_fit, rate in candidates:
        if best is not None and deadline is not None and time.perf_counter() >= deadline:
            best[0].log(f"encoder: lr {rate:g} not tried: encoder_budget_s ({budget_s:g} s) reached")
            continue
        torch.manual_seed(seed)  # the new head's init and dropout follow the seed
        fit = make_fit()
        if best is None and deadline is not None:
            _check_budget(fit, budget_s)
        tries.append(fit.train(rate, deadline))
        if best is None or tries[-1].score > best[1].score:
            best = (fit, tries[-1])
    fit, chosen = best
    validation_logits = fit.logits("validation")
    train_seconds = time.perf_counter() - started
    scored = time.perf_counter()
    test_logits = fit.logits("test")
    texts_per_second = len(fit.ids["test"]) / max(time.perf_counter() - scored, 1e-9)
    dataset = fit.dataset
    decision, calibration = dataset.kind.fit_decision(
        validation_logits, dataset.validation.labels, test_logits, dataset.test.labels
    )
    return Fitted(
        fit, chosen, tries, decision, calibration, test_logits, train_seconds, texts_per_second, validation_logits
    )


def _check_budget(fit: EncoderFit, budget_s: float) -> None:
    projected = fit.projected_epoch_seconds()
    if projected > budget_s:
        raise EncoderSkipped(
            f"encoder {fit.name} skipped: one epoch on {len(fit.ids['train'])} texts is projected at "
            f"{projected:.0f} s, beyond encoder_budget_s ({budget_s:g} s)"
        )


def run_encoder(
    dataset: Dataset, config, runtime, spec: str, log: Log = print, save_to: Path | None = None
) -> EncoderRecord:
    """Fine-tune `spec` once per learning rate of the grid (each from the same initial weights, the same seed),
    keep the one with the best validation score, and score it on the test split. With `save_to`, the chosen
    model is saved there ready to ship (weights, tokenizer, its decision) with its calibrated probabilities
    on validation and test (the ensemble row blends them with LoRA's)."""
    make_fit = functools.partial(EncoderFit, dataset, config, runtime, log, spec)
    fitted = fit_best([(make_fit, rate) for rate in learning_rates(config, spec)], config.seed, config.encoder_budget_s)
    record = encoder_record(fitted, spec, config)
    if save_to is not None:
        save_encoder(fitted, save_to)
        record.saved = save_to.name
    _say(record, dataset, log)
    return record


def save_encoder(fitted: Fitted, folder: Path) -> None:
    """The chosen encoder as a standalone transformers classifier (AutoModelForSequenceClassification reads
    it), its input format and decision (loracls_input.json, as beside every export: predict and serve read the
    folder as a model) and its calibrated probabilities (ENCODER_PROBABILITIES); written to
    staging and swapped into place whole."""
    fit, decision = fitted.fit, fitted.decision

    def fill(staging: Path) -> None:
        fit.model.save_pretrained(str(staging), safe_serialization=True)
        fit.tokenizer.save_pretrained(str(staging))
        InputFormat(None, fit.max_length, "truncate", None, decision).write(staging / INPUT_FORMAT)
        np.savez(
            staging / ENCODER_PROBABILITIES,
            validation=decision.probabilities(fitted.validation_logits),
            test=decision.probabilities(fitted.test_logits),
        )

    files.replace_dir(folder, fill)


def read_encoder_probabilities(folder: Path) -> dict[str, np.ndarray] | None:
    """A saved encoder's calibrated probabilities on validation and test (None: not saved, or unreadable)."""
    path = folder / ENCODER_PROBABILITIES
    try:
        with np.load(path) as saved:
            return {"validation": saved["validation"], "test": saved["test"]}
    except (OSError, KeyError, ValueError):
        return None


def encoder_record(fitted: Fitted, spec: str, config) -> EncoderRecord:
    """What a fitted encoder measured: its grid, its curve, its test metrics and its cost."""
    fit, chosen, tries, decision, calibration = (
        fitted.fit,
        fitted.chosen,
        fitted.tries,
        fitted.decision,
        fitted.calibration,
    )
    dataset, test_logits = fit.dataset, fitted.test_logits
    parameters = sum(p.numel() for p in fit.model.parameters())
    return EncoderRecord(
        model=spec,
        epochs=len(chosen.curve),
        best_epoch=chosen.best_epoch,
        learning_rate=chosen.learning_rate,
        validation_score=chosen.score,
        test=dataset.kind.metrics(dataset.test.labels, decision.probabilities(test_logits), dataset.id2label, decision),
        temperature=decision.temperature,
        test_ece=None if calibration is None else calibration.after.ece,
        train_seconds=fitted.train_seconds,
        texts_per_second=fitted.texts_per_second,
        parameters=parameters,
        trainable_parameters=sum(p.numel() for p in fit.model.parameters() if p.requires_grad),
        size_mb=parameters * 4 / 2**20,
        max_epochs=config.encoder_epochs,
        curve=chosen.curve,
        learning_rates={f"{t.learning_rate:g}": t.score for t in tries},
        still_improving=chosen.best_epoch == config.encoder_epochs,
        budget_stop=chosen.budget_stop,
    )


def _say(record: EncoderRecord, dataset: Dataset, log) -> None:
    grid = ", ".join(f"{rate} {abs(score):.4f}" for rate, score in record.learning_rates.items())
    log(
        f"baseline (encoder {record.model}, fine-tuned, lr {record.learning_rate:g} of [{grid}] on validation, "
        f"best epoch {record.best_epoch} of {record.epochs} trained, at most {record.max_epochs}): test "
        f"{dataset.kind.accuracy_name} {record.test.accuracy:.4f}, macro F1 {record.test.macro_f1:.4f} "
        f"({record.train_seconds:.0f}s to train, {record.texts_per_second:.0f} texts/s)"
    )
    if record.still_improving:
        log(f"baseline: encoder {record.model} was still improving at its last epoch; raise encoder_epochs")
