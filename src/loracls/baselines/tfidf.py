"""The classical baseline: TF-IDF (word 1-2-grams + character 2-5-grams) and logistic regression, fitted on
the same train split, its C chosen on the validation split. Seconds on a CPU; the LLM has to beat it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import FeatureUnion
from sklearn.feature_extraction.text import TfidfVectorizer

from loracls.data.splits import Dataset
from loracls.metrics import ClassificationMetrics, classification_metrics

C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


@dataclass
class TfidfRecord:
    """tfidf.json: the TF-IDF + logistic regression baseline on the test split."""
    c: float
    validation_accuracy: float
    test: ClassificationMetrics
    seconds: float
    features: int


def features() -> FeatureUnion:
    return FeatureUnion([
        ("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, max_features=200_000)),
        ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2,
                                  max_features=300_000)),
    ])


def run_tfidf(dataset: Dataset, seed: int, log=print) -> TfidfRecord:
    started = time.perf_counter()
    union = features()
    train = union.fit_transform(dataset.train.texts)
    validation, test = union.transform(dataset.validation.texts), union.transform(dataset.test.texts)
    best = None
    for c in C_GRID:  # the first of equal validation accuracies wins: the strongest regularisation
        model = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(train, dataset.train.labels)
        accuracy = float((model.predict(validation) == dataset.validation.labels).mean())
        if best is None or accuracy > best[1]:
            best = (c, accuracy, model)
    c, accuracy, model = best
    probs = np.zeros((test.shape[0], len(dataset.id2label)))
    probs[:, model.classes_] = model.predict_proba(test)  # a class absent from train keeps probability 0
    record = TfidfRecord(c=c, validation_accuracy=accuracy,
                         test=classification_metrics(dataset.test.labels, probs, dataset.id2label),
                         seconds=time.perf_counter() - started, features=int(train.shape[1]))
    log(f"baseline (TF-IDF + logistic regression, C={c:g} on validation): test accuracy {record.test.accuracy:.4f}, "
        f"macro F1 {record.test.macro_f1:.4f} ({record.seconds:.1f}s)")
    return record
