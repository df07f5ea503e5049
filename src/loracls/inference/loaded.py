"""Using a finished run: reload it (base model + saved adapter and head), predict, evaluate."""

from __future__ import annotations

import numpy as np
from peft import PeftModel

from loracls import runs
from loracls.data.batching import encode
from loracls.data.splits import labelled_split, load_dataset
from loracls.data.tables import read_table
from loracls.errors import LoraclsError, first_line
from loracls.hardware import setup_runtime
from loracls.metrics import ClassificationMetrics, classification_metrics, format_metrics, prediction_rows
from loracls.model.classifier import load_classifier
from loracls.model.scoring import predict_probabilities
from loracls.model.source import resolve_model_dir


class LoadedRun:
    """A run directory reloaded, ready to predict. Every file it reads is checked first."""

    def __init__(self, path: str, log=print):
        self.path = runs.check_run_dir(path)
        self.config = runs.read_config(self.path)
        self.id2label = runs.read_labels(self.path)
        self.runtime = setup_runtime(self.config.device, self.config.precision, self.config.threads)
        loaded = load_classifier(resolve_model_dir(self.config.model, log), self.id2label, log=log)
        self.tokenizer = loaded.tokenizer
        try:
            model = PeftModel.from_pretrained(loaded.model, str(self.path / runs.ADAPTER))
        except Exception as exc:  # a damaged or foreign adapter directory
            raise LoraclsError(f"cannot load the adapter in {self.path / runs.ADAPTER}: "
                               f"{first_line(exc, 200)}") from None
        self.model = model.to(self.runtime.device).eval()

    def probabilities(self, texts: list[str]) -> np.ndarray:
        ids = encode(self.tokenizer, texts, self.config.max_length, self.config.input_template)
        return predict_probabilities(self.model, ids, self.tokenizer.pad_token_id, self.config.eval_batch_size, self.runtime)


def evaluate(run_path: str, data: str | None = None, log=print) -> ClassificationMetrics:
    """Metrics of a run on its own test split, or on another labelled file with the run's columns."""
    run = LoadedRun(run_path, log)
    if data is None:
        split = load_dataset(run.config).test
    else:
        label2id = {name: i for i, name in run.id2label.items()}
        split = labelled_split(read_table(data), run.config, label2id, data)
    metrics = classification_metrics(split.labels, run.probabilities(split.texts), run.id2label)
    log(format_metrics(metrics))
    return metrics


def predict(run_path: str, texts: list[str], log=print) -> list[dict]:
    if not texts:
        raise LoraclsError("predict: no texts given")
    if any(not t.strip() for t in texts):
        raise LoraclsError("predict: empty text given")
    run = LoadedRun(run_path, log)
    return prediction_rows(texts, None, run.probabilities(texts), run.id2label)
