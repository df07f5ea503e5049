"""Evaluation stage: class probabilities for token ids, prediction rows, and sklearn metrics."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

from loracls.data import collate, sorted_batches


@torch.inference_mode()
def predict_probabilities(model, ids: list[list[int]], pad_id: int, batch_size: int, runtime) -> np.ndarray:
    """Softmax probabilities [n, num_labels] in the input order; batches sorted by length (little padding)."""
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


def prediction_rows(texts: list[str], labels: list[int] | None, probs: np.ndarray, id2label: dict[int, str]) -> list[dict]:
    rows = []
    for i, text in enumerate(texts):
        row = {"text": text}
        if labels is not None:
            row["label"] = id2label[labels[i]]
        row["prediction"] = id2label[int(probs[i].argmax())]
        row["probabilities"] = {id2label[k]: round(float(p), 6) for k, p in enumerate(probs[i])}
        rows.append(row)
    return rows


def classification_metrics(labels: list[int], probs: np.ndarray, id2label: dict[int, str]) -> dict:
    """Accuracy, per-class precision/recall/F1/support, macro F1, and the confusion matrix (rows = true)."""
    ids = sorted(id2label)
    predictions = probs.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(labels, predictions, labels=ids, zero_division=0)
    per_class = {id2label[k]: {"precision": float(precision[i]), "recall": float(recall[i]), "f1": float(f1[i]),
                               "support": int(support[i])} for i, k in enumerate(ids)}
    return {
        "accuracy": float(accuracy_score(labels, predictions)),
        "macro_f1": float(np.mean(f1)),
        "per_class": per_class,
        "confusion_matrix": {"labels": [id2label[k] for k in ids],
                             "matrix": confusion_matrix(labels, predictions, labels=ids).tolist()},
        "examples": len(labels),
    }


def format_metrics(metrics: dict) -> str:
    names = metrics["confusion_matrix"]["labels"]
    width = max(8, *(len(n) for n in names))
    lines = [f"accuracy {metrics['accuracy']:.4f}   macro F1 {metrics['macro_f1']:.4f}   ({metrics['examples']} examples)",
             f"{'class':<{width}}  precision  recall     f1  support"]
    for name, row in metrics["per_class"].items():
        lines.append(f"{name:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:5.4f}  {row['support']:7d}")
    lines.append("confusion matrix (rows: true, columns: predicted)")
    lines.append(" " * width + "  " + "  ".join(f"{n:>{width}}" for n in names))
    for name, row in zip(names, metrics["confusion_matrix"]["matrix"]):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{width}d}" for v in row))
    return "\n".join(lines)
