"""The student of `loracls distill`: an encoder (the same ones as the encoder baseline) fine-tuned on a
teacher's calibrated probabilities, over the training split and any unlabeled texts, with the gold labels where
they exist. Trained by the encoder baseline's rules (epochs until validation on the gold labels stops improving,
warmup then linear decay, length-grouped batches), the teacher's share of the loss chosen on validation.

The loss of a batch is `weight` x the problem's loss against the teacher's probabilities (single_label:
cross-entropy to the soft targets, which is the KL divergence to the teacher plus the teacher's entropy, a
constant; multi_label: BCE to each label's probability) plus (1 - `weight`) x the problem's loss against the
gold labels of the batch's labelled texts (Hinton et al. 2015; DistilBERT). The teacher's probabilities are
already calibrated (its fitted temperature); a distillation `temperature` T > 1 softens them further (the
teacher's logits and the student's divided by T, the soft term scaled by T^2 so that its gradients keep their
size, as Hinton et al. do).

A student can be made cheaper than its encoder by keeping some of its layers (`layers`): DistilBERT's
initialisation (Sanh et al. 2019: one layer of two), the kept layers spread evenly from the first, the config's
layer count changed with them so the exported student reloads as the smaller model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification

from loracls.baselines.encoder import EncoderFit, Fitted, encoder_record, fit_best
from loracls.data.splits import Dataset
from loracls.errors import Log, LoraclsError
from loracls.runs import EncoderRecord, StudentRecord

__all__ = ["Teaching", "StudentFit", "StudentSpec", "run_student", "check_layers", "keep_layers", "layers_kept"]


@dataclass(frozen=True)
class Teaching:
    """What the student learns from: `texts` (the training split's, then the unlabeled ones), the teacher's
    calibrated `probabilities` for each (one row a text), each text's `gold` label (None: unlabeled), and the
    teacher's share of the loss (`weight`; the gold labels get the rest) and the distillation `temperature`."""

    texts: list[str]
    probabilities: np.ndarray
    gold: list
    weight: float = 1.0
    temperature: float = 1.0  # the distillation temperature (1: the calibrated probabilities as they are)

    @property
    def unlabeled(self) -> int:
        return sum(label is None for label in self.gold)


class StudentFit(EncoderFit):
    """An EncoderFit whose training texts and loss are the teaching's (see the module's loss)."""

    def __init__(self, dataset: Dataset, config, runtime, log, student: StudentSpec, teaching: Teaching):
        self.teaching, self.weight, self.temperature = teaching, teaching.weight, teaching.temperature
        self.soft = dataset.kind.softened(teaching.probabilities, teaching.temperature).astype(np.float32)
        super().__init__(dataset, config, runtime, log, student.model)
        self.layers = None if student.layers is None else keep_layers(self.model, student.layers)

    @property
    def label(self) -> str:
        layers = f", layers {','.join(map(str, self.layers))}" if self.layers else ""
        heat = f", temperature {self.temperature:g}" if self.temperature != 1 else ""
        return f"student {self.name} (teacher weight {self.weight:g}{heat}{layers})"

    def texts(self, split: str) -> list[str]:
        return self.teaching.texts if split == "train" else super().texts(split)

    def loss(self, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        kind, device, labels = self.dataset.kind, self.runtime.device, len(self.dataset.id2label)
        soft = torch.as_tensor(self.soft[rows], device=device)
        scale = self.temperature**2
        loss = self.weight * scale * kind.loss(logits / self.temperature, soft, None, len(rows))
        gold = [(i, self.teaching.gold[row]) for i, row in enumerate(rows) if self.teaching.gold[row] is not None]
        if gold and self.weight < 1:
            targets = kind.targets([label for _, label in gold], labels, device)
            picked = logits[torch.tensor([i for i, _ in gold], device=device)]
            loss = loss + (1 - self.weight) * kind.loss(picked, targets, None, len(gold))
        return loss


@dataclass(frozen=True)
class StudentSpec:
    """Which student: the encoder (`minilm`, `mpnet-base` or an HF encoder directory), the teacher weights tried
    (the best on validation is kept) and the learning rate."""

    model: str
    weights: tuple[float, ...]
    learning_rate: float
    layers: int | None = None  # the encoder's layers the student keeps (spread evenly); None: all


def _encoder_layers(model) -> torch.nn.ModuleList:
    """The encoder's stack of layers (BERT, RoBERTa, MPNet, DeBERTa: `encoder.layer` of the base model)."""
    stack = getattr(getattr(model.base_model, "encoder", None), "layer", None)
    if not isinstance(stack, torch.nn.ModuleList) or len(stack) != model.config.num_hidden_layers:
        raise LoraclsError(f"distill: {type(model).__name__} has no encoder.layer stack to keep layers of")
    return stack


def layers_kept(total: int, count: int) -> list[int]:
    """Which of `total` layers a student of `count` keeps: spread evenly from the first (6 -> 3: 0, 2, 4)."""
    if not 1 <= count <= total:
        raise LoraclsError(f"distill: --student-layers must be between 1 and the encoder's {total}, got {count}")
    return [i * total // count for i in range(count)]


def check_layers(encoder_config, count: int) -> list[int]:
    """Refuse a layer count the encoder cannot keep before anything is written: the model is built from its
    config on the meta device (no weights, no memory) to find its stack of layers."""
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(encoder_config)
    return layers_kept(len(_encoder_layers(model)), count)


def keep_layers(model, count: int) -> list[int]:
    """Keep `count` of the model's encoder layers (layers_kept), in place; returns the indices kept."""
    stack = _encoder_layers(model)
    kept = layers_kept(len(stack), count)
    model.base_model.encoder.layer = torch.nn.ModuleList(stack[i] for i in kept)
    model.config.num_hidden_layers = count
    return kept


def run_student(
    dataset: Dataset, config, runtime, student: StudentSpec, teaching: Teaching, log: Log = print
) -> tuple[StudentRecord, Fitted]:
    """Train the student once per teacher weight, from the same seed; keep the best on validation (gold
    labels), calibrate it on validation and score it on the test split."""
    spec, weights, rate = student.model, student.weights, student.learning_rate
    make = functools.partial(StudentFit, dataset, config, runtime, log, student)
    fitted = fit_best([(functools.partial(make, replace(teaching, weight=w)), rate) for w in weights], config.seed)
    base = encoder_record(fitted, spec, config)
    scores = {f"{weight:g}": trained.score for weight, trained in zip(weights, fitted.tries)}
    record = StudentRecord(
        **{f.name: getattr(base, f.name) for f in fields(EncoderRecord)},
        teacher_weight=fitted.fit.weight,
        distill_temperature=teaching.temperature,
        training_texts=len(teaching.texts) - teaching.unlabeled,
        unlabeled_texts=teaching.unlabeled,
        weights=scores,
        layers=fitted.fit.layers,
    )
    record.learning_rates = {f"{rate:g}": fitted.chosen.score}
    return record, fitted
