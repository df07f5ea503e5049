"""Using a finished run: predict and evaluate through the one inference engine (`engine.Classifier`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loracls import runs
from loracls.data.spec import DataSpec
from loracls.data.splits import labelled_split, load_dataset
from loracls.data.tables import read_table
from loracls.errors import Log, LoraclsError
from loracls.inference.engine import Classifier
from loracls.metrics import ClassificationMetrics, MultiLabelMetrics
from loracls.problems import evaluation, prediction_rows, problem_for


@dataclass(frozen=True)
class EngineOptions:
    """How a command runs a finished run: the command line's overrides of the run's own settings."""

    batch_size: int | None = None  # texts a forward pass; None: the run's eval_batch_size
    device: str | None = None  # None: the run's device
    precision: str | None = None  # None: the run's precision
    engine: str = "torch"  # torch | onnx | onnx-int8 | ensemble (ray: predict --file --out only)


def engine_for(run_path: str, options: EngineOptions = EngineOptions(), log: Log = print):
    """The engine a command runs: PyTorch (the merged model, or base + adapter merged in memory; a
    label_and_comment run's causal LM), or a run's ONNX export through onnxruntime (`onnx`, `onnx-int8`)."""
    engine, device, precision, batch_size = options.engine, options.device, options.precision, options.batch_size
    if engine == "ray":
        raise LoraclsError("--engine ray scores a file: predict RUN --file IN --out DIR --engine ray")
    if engine == "ensemble":  # the verdict's ensemble row: LoRA and the run's saved encoder, blended
        from loracls.inference.ensemble_engine import Ensemble

        return Ensemble(run_path, log, batch_size, device, precision)
    scorer = "head"  # a merged classifier directory
    if (Path(run_path) / runs.CONFIG).is_file():
        scorer = problem_for(runs.read_config(runs.check_run_dir(run_path)).problem).scorer
    if engine != "torch":
        if scorer != "head":
            raise LoraclsError(f"--engine {engine}: a label_and_comment run has no ONNX export; use --engine torch")
        if device not in (None, "cpu") or precision is not None:
            raise LoraclsError(
                f"--engine {engine} runs on the CPU at the export's precision; drop --device/--precision"
            )
        from loracls.inference.onnx_engine import OnnxClassifier

        return OnnxClassifier(run_path, log, batch_size, engine)
    if scorer == "label_words":
        from loracls.inference.commenter import Commenter

        return Commenter(run_path, log, batch_size, device, precision)
    return Classifier(run_path, log, batch_size, device, precision)


def evaluate(
    run_path: str, data: str | None = None, options: EngineOptions = EngineOptions(), log: Log = print
) -> ClassificationMetrics | MultiLabelMetrics:
    """Metrics of a run on its own test split, or on another labelled file with the run's columns."""
    config = runs.read_config(runs.check_run_dir(run_path))
    classifier = engine_for(run_path, options, log)
    if data is None:
        split = load_dataset(DataSpec.of(config)).test
    else:
        label2id = {name: i for i, name in classifier.id2label.items()}
        split = labelled_split(read_table(data), DataSpec.of(config), label2id, data)
    probs = classifier.probabilities(split.texts, progress=True)
    metrics = evaluation(split.texts, split.labels, probs, classifier.id2label, classifier.decision).metrics
    log(metrics.text())
    return metrics


def predictor(
    run_path: str, options: EngineOptions = EngineOptions(), log: Log = print
) -> Callable[[list[str]], list[dict]]:
    """texts -> prediction rows (`text`, `prediction`, `probabilities`; label_and_comment adds `comment`), with
    the run's model loaded once."""
    runs.check_model_dir(run_path)
    classifier = engine_for(run_path, options, log)
    if classifier.writes_comments:
        return classifier.predict

    def rows(texts: list[str]) -> list[dict]:
        probs = classifier.probabilities(texts)
        return [row.to_json() for row in prediction_rows(texts, None, probs, classifier.id2label, classifier.decision)]

    return rows


def predict(run_path: str, texts: list[str], options: EngineOptions = EngineOptions(), log: Log = print) -> list[dict]:
    if not texts:
        raise LoraclsError("predict: no texts given")
    if any(not t.strip() for t in texts):
        raise LoraclsError("predict: empty text given")
    return predictor(run_path, options, log)(texts)
