"""Scoring: class logits / probabilities for tokenized texts, in length-sorted batches (little padding), and
`evaluate`, the one function that scores a model on a labelled split."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from loracls.calibration import softmax
from loracls.data.batching import Encoded, collate, sorted_batches
from loracls.data.splits import Split
from loracls.errors import LoraclsError
from loracls.problems import Decision, Evaluation, evaluation

PROGRESS_FROM = 2000  # texts: below this a progress bar is noise


def batched_logits(
    ids: list[list[int]], pad_id: int, batch_size: int, forward, progress: bool = False, max_tokens: int | None = None
) -> np.ndarray:
    """Logits [n, num_labels] (float32) in the input order from `forward(padded batch) -> logits`, over
    length-sorted batches; a progress bar with texts/s on long inputs."""
    out = None
    bar = tqdm(
        total=len(ids),
        unit="text",
        desc="predict",
        file=sys.stderr,
        mininterval=1.0,
        disable=not progress or len(ids) < PROGRESS_FROM,
    )
    for batch_indices in sorted_batches([len(x) for x in ids], batch_size, max_tokens):
        logits = forward(collate([ids[i] for i in batch_indices], pad_id))
        if out is None:
            out = np.zeros((len(ids), logits.shape[1]), dtype=np.float32)
        out[batch_indices] = logits
        bar.update(len(batch_indices))
    bar.close()
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


@dataclass(frozen=True)
class Batching:
    """How token ids go through a torch model: padded with `pad_id`, `batch_size` rows a pass, on `runtime`'s
    device under its autocast."""

    pad_id: int
    batch_size: int
    runtime: object


@torch.inference_mode()
def predict_logits(
    model, ids: list[list[int]], batching: Batching, progress: bool = False, max_tokens: int | None = None
) -> np.ndarray:
    """A torch model's logits for `ids` (see batched_logits), under the runtime's device and autocast."""
    runtime = batching.runtime

    def forward(batch: dict) -> np.ndarray:
        with runtime.autocast:
            logits = model(
                input_ids=batch["input_ids"].to(runtime.device),
                attention_mask=batch["attention_mask"].to(runtime.device),
            ).logits
        return logits.float().cpu().numpy()

    was_training = model.training
    model.eval()
    try:
        return batched_logits(ids, batching.pad_id, batching.batch_size, forward, progress, max_tokens)
    finally:
        model.train(was_training)


def predict_probabilities(model, ids: list[list[int]], batching: Batching, progress: bool = False) -> np.ndarray:
    """Softmax probabilities [n, num_labels] (float64) in the input order."""
    logits = predict_logits(model, ids, batching, progress)
    return softmax(logits) if len(logits) else np.zeros((0, 0))


def evaluate(
    model, encoded: Encoded, split: Split, id2label: dict[int, str], decision: Decision, batching: Batching
) -> Evaluation:
    """A model on one labelled split: its logits (windows of a long text averaged), the decision's
    probabilities, then the metrics record, loss and rows (`problems.evaluation`). Pure: writes nothing."""
    logits = encoded.per_text(predict_logits(model, encoded.ids, batching))
    return evaluation(split.texts, split.labels, decision.probabilities(logits), id2label, decision)


def _first_value(output):
    """The tensor a module returned (the first of a tuple, a model output's first field), or None."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    first = getattr(output, "to_tuple", None)
    return _first_value(first()) if first is not None else None


@torch.no_grad()
def check_finite_forward(model, ids: list[list[int]], pad_id: int, runtime) -> None:
    """Refuse a model whose forward gives NaN or inf on a few training texts, naming the first module (in the
    order they run) whose output is not finite: uninitialised buffers, a weight that overflows its dtype."""
    if not ids:
        return
    bad: list[str] = []

    def watch(name):
        def hook(_module, _inputs, output):
            value = _first_value(output)
            if not bad and value is not None and value.is_floating_point() and not torch.isfinite(value).all():
                bad.append(name)

        return hook

    handles = [module.register_forward_hook(watch(name)) for name, module in model.named_modules() if name]
    was_training = model.training
    model.eval()
    try:
        batch = collate(ids, pad_id)
        with runtime.autocast:
            logits = model(
                input_ids=batch["input_ids"].to(runtime.device),
                attention_mask=batch["attention_mask"].to(runtime.device),
            ).logits
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if not torch.isfinite(logits.float()).all():
        where = f"first in {bad[0]}" if bad else "in the head"
        raise LoraclsError(
            f"the model gives non-finite values (NaN or inf) on {len(ids)} training texts, {where}: "
            f"refusing to train on it (check the checkpoint's weights and precision)"
        )
