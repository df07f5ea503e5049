"""Scoring: class probabilities for tokenized texts, in length-sorted batches (little padding)."""

from __future__ import annotations

import numpy as np
import torch

from loracls.data.batching import collate, sorted_batches


@torch.inference_mode()
def predict_probabilities(model, ids: list[list[int]], pad_id: int, batch_size: int, runtime) -> np.ndarray:
    """Softmax probabilities [n, num_labels] in the input order."""
    was_training = model.training
    model.eval()
    out = None
    for batch_indices in sorted_batches([len(x) for x in ids], batch_size):
        batch = collate([ids[i] for i in batch_indices], pad_id)
        with runtime.autocast:
            logits = model(input_ids=batch["input_ids"].to(runtime.device),
                           attention_mask=batch["attention_mask"].to(runtime.device)).logits
        probs = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        if out is None:
            out = np.zeros((len(ids), probs.shape[1]), dtype=np.float64)
        out[batch_indices] = probs
    model.train(was_training)
    return out if out is not None else np.zeros((0, 0))
