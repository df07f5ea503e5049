"""Using a finished run: predict and evaluate through the one inference engine (`engine.Classifier`)."""

from __future__ import annotations

from collections.abc import Callable

from loracls import runs
from loracls.data.splits import labelled_split, load_dataset
from loracls.data.tables import read_table
from loracls.errors import LoraclsError
from loracls.inference.engine import Classifier
from loracls.metrics import ClassificationMetrics, MultiLabelMetrics
from loracls.problems import evaluation, prediction_rows, problem_for


def evaluate(
    run_path: str,
    data: str | None = None,
    log=print,
    batch_size: int | None = None,
    device: str | None = None,
    precision: str | None = None,
) -> ClassificationMetrics | MultiLabelMetrics:
    """Metrics of a run on its own test split, or on another labelled file with the run's columns."""
    config = runs.read_config(runs.check_run_dir(run_path))
    if problem_for(config.problem).generative:  # label_and_comment: labels scored by the causal LM
        from loracls.inference.commenter import Commenter

        classifier = Commenter(run_path, log, batch_size, device)
    else:
        classifier = Classifier(run_path, log, batch_size, device, precision)
    if data is None:
        split = load_dataset(config).test
    else:
        label2id = {name: i for i, name in classifier.id2label.items()}
        split = labelled_split(read_table(data), config, label2id, data)
    probs = classifier.probabilities(split.texts, progress=True)
    metrics = evaluation(split.texts, split.labels, probs, classifier.id2label, classifier.decision).metrics
    log(metrics.text())
    return metrics


def predictor(
    run_path: str, log=print, batch_size: int | None = None, device: str | None = None, precision: str | None = None
) -> Callable[[list[str]], list[dict]]:
    """texts -> prediction rows (`text`, `prediction`, `probabilities`; label_and_comment adds `comment`), with
    the run's model loaded once."""
    if problem_for(runs.read_config(runs.check_run_dir(run_path)).problem).generative:
        from loracls.inference.commenter import Commenter

        return Commenter(run_path, log, batch_size, device).predict
    classifier = Classifier(run_path, log, batch_size, device, precision)

    def rows(texts: list[str]) -> list[dict]:
        probs = classifier.probabilities(texts)
        return [row.to_json() for row in prediction_rows(texts, None, probs, classifier.id2label, classifier.decision)]

    return rows


def predict(
    run_path: str,
    texts: list[str],
    log=print,
    batch_size: int | None = None,
    device: str | None = None,
    precision: str | None = None,
) -> list[dict]:
    if not texts:
        raise LoraclsError("predict: no texts given")
    if any(not t.strip() for t in texts):
        raise LoraclsError("predict: empty text given")
    return predictor(run_path, log, batch_size, device, precision)(texts)
