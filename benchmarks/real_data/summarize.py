"""Markdown tables from the run directories that run.sh wrote: `python3 summarize.py OUT`."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from loracls import runs


def table(header: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        return (
            f"{value:.4f}"
            if isinstance(value, float) and abs(value) <= 1
            else (f"{value:.0f}" if isinstance(value, float) else str(value))
        )

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def finished(out: Path, prefix: str) -> list[tuple[str, runs.Metrics, dict]]:
    found = []
    for run in sorted((out / "runs").glob(prefix + "*")):
        if (run / runs.METRICS).is_file():
            tfidf = json.loads((run / runs.TFIDF).read_text()) if (run / runs.TFIDF).is_file() else None
            found.append((run.name, runs.read_metrics(run), tfidf))
    return found


def curve(out: Path) -> str | None:
    results = out / "runs" / "curve" / "results.csv"
    if not results.is_file():
        return None
    zero = json.loads((out / "curve_zero_shot.json").read_text())
    rows = [
        [r["run"], float(r["test_accuracy"]), float(r["tfidf_accuracy"]), float(r["seconds"])]
        for r in csv.DictReader(results.open())
    ]
    return (
        f"zero-shot {zero['zero_shot']['accuracy']:.4f}, calibrated zero-shot {zero['calibrated']['accuracy']:.4f} "
        f"(the same test split for every point)\n\n" + table(["run", "LoRA test accuracy", "TF-IDF", "seconds"], rows)
    )


def imbalanced(out: Path) -> str | None:
    rows = [
        [
            name,
            m.train.steps,
            m.test.accuracy,
            m.test.macro_f1,
            *(c.recall for c in m.test.per_class.values()),
            tfidf["test"]["macro_f1"] if tfidf else "",
        ]
        for name, m, tfidf in finished(out, "imbalanced")
    ]
    if not rows:
        return None
    classes = list(finished(out, "imbalanced")[0][1].test.per_class)
    return table(["run", "steps", "accuracy", "macro F1", *(f"recall {c}" for c in classes), "TF-IDF macro F1"], rows)


def emotions(out: Path) -> str | None:
    rows = [
        [
            name,
            m.test.accuracy,
            m.test.micro_f1,
            m.test.macro_f1,
            tfidf["test"]["accuracy"],
            tfidf["test"]["micro_f1"],
            tfidf["test"]["macro_f1"],
        ]
        for name, m, tfidf in finished(out, "emotions")
    ]
    return (
        table(
            [
                "run",
                "subset accuracy",
                "micro F1",
                "macro F1",
                "TF-IDF subset accuracy",
                "TF-IDF micro F1",
                "TF-IDF macro F1",
            ],
            rows,
        )
        if rows
        else None
    )


def speeches(out: Path) -> str | None:
    rows = [
        [
            name,
            m.test.accuracy,
            m.test.macro_f1,
            m.train.steps,
            m.train.train_tokens,
            m.train.seconds,
            m.wall_seconds,
            tfidf["test"]["accuracy"] if tfidf else "",
        ]
        for name, m, tfidf in finished(out, "speeches-")
    ]
    return (
        table(
            [
                "run",
                "test accuracy",
                "macro F1",
                "steps",
                "train tokens",
                "loop seconds",
                "whole run seconds",
                "TF-IDF accuracy",
            ],
            rows,
        )
        if rows
        else None
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for title, part in (
        ("learning curve", curve),
        ("imbalanced", imbalanced),
        ("multi-label", emotions),
        ("long documents", speeches),
    ):
        text = part(out)
        if text:
            print(f"### {title}\n\n{text}\n")
