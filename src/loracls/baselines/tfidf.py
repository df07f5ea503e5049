"""The classical baseline: TF-IDF (word 1-2-grams + character 2-5-grams) and logistic regression, fitted on
the same train split, its C chosen on the validation split. Seconds on a CPU; the LLM has to beat it."""

from __future__ import annotations

import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import FeatureUnion

from loracls.calibration import reliability
from loracls.data.splits import Dataset
from loracls.decision import Decision, multi_hot, tune_thresholds
from loracls.metrics import evaluation_metrics
from loracls.runs import TfidfRecord

C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def features() -> FeatureUnion:
    return FeatureUnion(
        [
            ("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, max_features=200_000)),
            (
                "chars",
                TfidfVectorizer(
                    analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2, max_features=300_000
                ),
            ),
        ]
    )


def _fit(train, labels: list, c: float, seed: int, multi_label: bool, num_labels: int):
    model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
    if multi_label:  # one binary classifier per label
        return OneVsRestClassifier(model).fit(train, multi_hot(labels, num_labels))
    return model.fit(train, labels)


def _probabilities(model, features, num_labels: int, multi_label: bool) -> np.ndarray:
    if multi_label:
        return model.predict_proba(features)
    probs = np.zeros((features.shape[0], num_labels))
    probs[:, model.classes_] = model.predict_proba(features)  # a class absent from train keeps probability 0
    return probs


def run_tfidf(dataset: Dataset, seed: int, log=print) -> TfidfRecord:
    """C chosen on validation by accuracy (label sets: micro F1 at 0.5; then thresholds tuned per label on
    validation, as for LoRA)."""
    started = time.perf_counter()
    union, multi, n = features(), dataset.multi_label, len(dataset.id2label)
    train = union.fit_transform(dataset.train.texts)
    validation = union.transform(dataset.validation.texts)
    decision = Decision(dataset.problem)
    best = None
    for c in C_GRID:  # the first of equal validation scores wins: the strongest regularisation
        model = _fit(train, dataset.train.labels, c, seed, multi, n)
        probs = _probabilities(model, validation, n, multi)
        score = _validation_score(probs, dataset.validation.labels, decision, dataset.id2label)
        if best is None or score > best[1]:
            best = (c, score, model, probs)
    c, score, model, validation_probs = best
    if multi:
        decision = Decision("multi_label", thresholds=tune_thresholds(validation_probs, dataset.validation.labels))
    seconds, scored = time.perf_counter() - started, time.perf_counter()
    probs = _probabilities(model, union.transform(dataset.test.texts), n, multi)
    texts_per_second = len(dataset.test.texts) / max(time.perf_counter() - scored, 1e-9)
    record = TfidfRecord(
        c=c,
        validation_accuracy=score,
        test=evaluation_metrics(dataset.test.labels, probs, dataset.id2label, decision),
        seconds=seconds,
        features=int(train.shape[1]),
        texts_per_second=texts_per_second,
        ece=None if multi else reliability(probs, dataset.test.labels)[0],
        parameters=_coefficients(model),
    )
    extra = f", micro F1 {record.test.micro_f1:.4f}" if multi else ""
    log(
        f"baseline (TF-IDF + logistic regression, C={c:g} on validation): test "
        f"{'subset accuracy' if multi else 'accuracy'} {record.test.accuracy:.4f}{extra}, "
        f"macro F1 {record.test.macro_f1:.4f} ({record.seconds:.1f}s)"
    )
    return record


def _validation_score(probs: np.ndarray, labels: list, decision: Decision, id2label: dict[int, str]) -> float:
    if decision.multi_label:
        return evaluation_metrics(labels, probs, id2label, decision).micro_f1
    return float((probs.argmax(axis=1) == np.asarray(labels)).mean())


def _coefficients(model) -> int:
    fitted = model.estimators_ if hasattr(model, "estimators_") else [model]
    return int(sum(m.coef_.size + m.intercept_.size for m in fitted))
