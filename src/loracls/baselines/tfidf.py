"""The classical baseline: TF-IDF (word 1-2-grams + character 2-5-grams) and logistic regression, fitted on
the same train split, its C chosen on the validation split. Seconds on a CPU; the LLM has to beat it."""

from __future__ import annotations

import time

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import FeatureUnion

from loracls.data.splits import Dataset
from loracls.errors import Log
from loracls.problems import Decision
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


def _fit(train, truth: np.ndarray, c: float, seed: int):
    """One logistic regression (label ids), or one per label (a boolean [texts, labels] truth)."""
    model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
    return OneVsRestClassifier(model).fit(train, truth) if truth.ndim == 2 else model.fit(train, truth)


def _probabilities(model, features, num_labels: int) -> np.ndarray:
    probs = np.zeros((features.shape[0], num_labels))
    columns = model.classes_ if hasattr(model, "coef_") else slice(None)  # one-vs-rest: a column per label
    probs[:, columns] = model.predict_proba(features)  # a class absent from train keeps probability 0
    return probs


def run_tfidf(dataset: Dataset, seed: int, log: Log = print) -> TfidfRecord:
    """C chosen on validation by accuracy (label sets: micro F1 at 0.5; then thresholds tuned per label on
    validation, as for LoRA)."""
    started = time.perf_counter()
    kind, n = dataset.kind, len(dataset.id2label)
    union = features()
    train = union.fit_transform(dataset.train.texts)
    validation = union.transform(dataset.validation.texts)
    decision, best = Decision(dataset.problem), None
    for c in C_GRID:  # the first of equal validation scores wins: the strongest regularisation
        model = _fit(train, kind.truth(dataset.train.labels, n), c, seed)
        probs = _probabilities(model, validation, n)
        score = kind.headline(kind.metrics(dataset.validation.labels, probs, dataset.id2label, decision))
        if best is None or score > best[1]:
            best = (c, score, model, probs)
    c, score, model, validation_probs = best
    decision = kind.decision_from_probabilities(validation_probs, dataset.validation.labels)
    seconds, scored = time.perf_counter() - started, time.perf_counter()
    probs = _probabilities(model, union.transform(dataset.test.texts), n)
    texts_per_second = len(dataset.test.texts) / max(time.perf_counter() - scored, 1e-9)
    record = TfidfRecord(
        c=c,
        validation_accuracy=score,
        test=kind.metrics(dataset.test.labels, probs, dataset.id2label, decision),
        seconds=seconds,
        features=int(train.shape[1]),
        texts_per_second=texts_per_second,
        ece=kind.ece(probs, dataset.test.labels),
        parameters=_coefficients(model),
    )
    scores = ", ".join(f"{name} {value:.4f}" for name, value in zip(kind.score_names, kind.scores(record.test)))
    log(f"baseline (TF-IDF + logistic regression, C={c:g} on validation): test {scores} ({record.seconds:.1f}s)")
    return record


def _coefficients(model) -> int:
    fitted = model.estimators_ if hasattr(model, "estimators_") else [model]
    return int(sum(m.coef_.size + m.intercept_.size for m in fitted))
