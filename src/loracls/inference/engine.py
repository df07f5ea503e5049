"""The classifier in use, loaded once for the fastest inference: a finished run directory (its merged/
model when present, else base + adapter merged in memory) or a merged model directory. No PEFT wrapper,
weights stored in the compute precision chosen as in training, length-sorted batches. `predict`,
`evaluate` and `serve` all go through it, so they compute the same probabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from loracls import runs
from loracls.data.batching import Encoded, TextEncoder
from loracls.errors import Log, LoraclsError
from loracls.hardware import setup_runtime
from loracls.model.classifier import HeadSpec, load_classifier, load_standalone
from loracls.model.scoring import Batching, predict_logits
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import store_frozen_linears_in
from loracls.model.tokenizer import load_tokenizer
from loracls.problems import Decision


class Engine(Protocol):
    """What predict, evaluate and serve use of a loaded run, whatever computes it (torch, ONNX, several
    adapters on one base, a label_and_comment run). Nothing outside an engine asks it what it is."""

    name: str
    source: str  # where its weights were read from, in words
    labels: list[str]
    id2label: dict[int, str]
    decision: Decision
    writes_comments: bool  # label_and_comment: `comments` writes one after each chosen label
    tokenizer: object  # the run's tokenizer (serve's /tokenize and /decode)
    max_length: int  # tokens of a text the model reads (longer: truncated, or windows under long_text: chunks)
    long_text: str
    input_template: str | None
    precision: str  # the compute precision, in words (/info)
    runtime: object  # the device it computes on (/info)

    def encode(self, texts: list[str]) -> Encoded: ...

    def logits(self, ids: list[list[int]], progress: bool = False, max_tokens: int | None = None) -> np.ndarray: ...

    def calibrated(self, logits: np.ndarray) -> np.ndarray: ...

    def probabilities(self, texts: list[str], progress: bool = False) -> np.ndarray: ...

    def comments(self, texts: list[str], chosen) -> list[str]: ...

    def served_runs(self) -> dict[str, Engine]:
        """The runs a server answers for: this engine alone, or (several adapters) each of its runs."""

    def score(self, ids: list[list[int]], models: list[str], max_tokens: int | None = None) -> list | np.ndarray:
        """Rows of any mix of the served runs (`models`: each row's run), in one pass where the engine can."""


class RunFormat:
    """What a served run is beyond its weights: labels, the input format trained with (template, max_length,
    long_text) and the decision fitted on validation. `Classifier` and each run of an `AdapterSet` share it."""

    def _setup_format(self, path) -> None:
        self.labels = [self.id2label[i] for i in range(len(self.id2label))]
        thresholds = self.decision.thresholds
        if thresholds is not None and len(thresholds) != len(self.labels):
            raise LoraclsError(f"{path}: {len(thresholds)} thresholds saved for {len(self.labels)} labels")
        self.encoder = TextEncoder(
            self.tokenizer, self.max_length, self.input_template, self.long_text, self.chunk_stride
        )

    writes_comments = False

    @property
    def precision(self) -> str:
        return str(self.runtime.dtype).replace("torch.", "")

    def comments(self, texts: list[str], chosen) -> list[str]:
        raise LoraclsError(f"{self.name} is a classifier: it writes no comments")

    def served_runs(self) -> dict[str, Engine]:
        return {self.name: self}

    def score(self, ids: list[list[int]], models: list[str], max_tokens: int | None = None) -> np.ndarray:
        return self.logits(ids, max_tokens=max_tokens)

    def encode(self, texts: list[str], **cut) -> Encoded:
        """Token ids under the run's long_text policy (one row per text, or per window of a long text); `cut`:
        TextEncoder.encode's keep_end / last_tokens, where a client asks for them."""
        return self.encoder.encode(texts, **cut)

    @property
    def temperature(self) -> float:
        return self.decision.temperature

    def calibrated(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities as fitted after training: softmax at the temperature, or a sigmoid per label."""
        return self.decision.probabilities(logits)

    def predicted(self, probs_row: np.ndarray) -> str | list[str]:
        """One text's label, or (multi_label) its list of labels at or above their thresholds."""
        return self.decision.label_of(probs_row, self.id2label)

    def probabilities(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """Calibrated probabilities, one row a text (`logits` is the engine's own)."""
        encoded = self.encode(texts)
        return self.calibrated(encoded.per_text(self.logits(encoded.ids, progress)))


class Classifier(RunFormat):
    def __init__(
        self,
        path: str,
        log: Log = print,
        batch_size: int | None = None,
        device: str | None = None,
        precision: str | None = None,
    ):
        source = Path(path)
        if (source / runs.CONFIG).is_file() and (source / runs.LABELS).is_file():
            self._from_run(source, log, device, precision)
        elif (source / "config.json").is_file():
            self._from_merged(source, log, device, precision)
        else:
            raise LoraclsError(f"{path} is not a finished loracls run directory, nor a merged model directory")
        self.batch_size = batch_size or self.batch_size
        for param in self.model.parameters():
            param.requires_grad_(False)
        store_frozen_linears_in(self.model, self.runtime.dtype)  # no per-batch cast under autocast
        self.model.to(self.runtime.device).eval()
        self._setup_format(path)

    def _from_run(self, run: Path, log, device: str | None, precision: str | None) -> None:
        runs.check_run_dir(str(run))
        config = runs.read_config(run)
        self.name, self.id2label = run.name, runs.read_labels(run)
        self.max_length, self.input_template = config.max_length, config.input_template
        self.long_text, self.chunk_stride = config.long_text, config.chunk_stride
        self.batch_size = config.eval_batch_size
        self.decision = runs.read_decision(run)
        self.runtime = setup_runtime(device or config.device, precision or config.precision, config.threads)
        merged = run / runs.MERGED
        if (merged / "config.json").is_file():
            self.model, self.tokenizer = load_standalone(merged), load_tokenizer(merged, log)
            self.decision = runs.InputFormat.read(merged / runs.INPUT_FORMAT).decision  # the temperature is in the head
            self.source = str(merged)
            return
        from loracls.model.methods import method_of

        loaded = load_classifier(resolve_model_dir(config.model, log), self.id2label, log=log, head=HeadSpec.of(config))
        method = method_of(run / runs.ADAPTER)
        trained = method.load_onto(loaded.model, run / runs.ADAPTER)
        self.model, self.tokenizer = method.standalone(trained), loaded.tokenizer
        self.source = f"{config.model} + {run / runs.ADAPTER} (merged in memory)"

    def _from_merged(self, directory: Path, log, device: str | None, precision: str | None) -> None:
        self.model = load_standalone(directory)  # a damaged folder: one line
        self.tokenizer = load_tokenizer(directory, log)
        run = runs.owning_run(directory)
        inside = run is not None and directory.name == runs.STUDENT  # served beside its teacher: a distinct name
        self.name, self.source = f"{run.name}-{directory.name}" if inside else directory.name, str(directory)
        self.id2label = {int(i): str(name) for i, name in self.model.config.id2label.items()}
        fmt = runs.InputFormat.read(directory / runs.INPUT_FORMAT)
        self.input_template, self.max_length, self.decision = fmt.input_template, fmt.max_length, fmt.decision
        self.long_text, self.chunk_stride = fmt.long_text, fmt.chunk_stride
        # a model folder inside a run (RUN/student, RUN/merged) runs on the run's device, precision, threads and
        # batch size; a folder on its own on what the machine has
        config = runs.read_config(run) if run is not None else None
        self.batch_size = config.eval_batch_size if config else 32
        self.runtime = (
            setup_runtime(device or config.device, precision or config.precision, config.threads)
            if config
            else setup_runtime(device or "auto", precision or "auto", None)
        )

    def logits(self, ids: list[list[int]], progress: bool = False, max_tokens: int | None = None) -> np.ndarray:
        """Row logits; `max_tokens` caps the padded tokens of one forward pass (the server's mixed batches)."""
        batching = Batching(self.tokenizer.pad_token_id, self.batch_size, self.runtime)
        return predict_logits(self.model, ids, batching, progress, max_tokens)
