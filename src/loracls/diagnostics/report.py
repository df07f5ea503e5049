"""`loracls report RUN`: one HTML page (plus PNGs) from a finished run directory.

Loss and validation curves, confusion matrix, baseline vs LoRA table, the most confident mistakes,
and the environment record. Reads only files the run wrote.
"""

from __future__ import annotations

import html
from pathlib import Path

from loracls import files, runs
from loracls.errors import LoraclsError
from loracls.problems import problem_for
from loracls.verdict import standard_error

REPORT = "report.html"


def _read_jsonl(path: Path) -> list[dict]:
    return files.read_jsonl(path, "run file") if path.is_file() else []


def _prediction_row(row) -> bool:
    if not (isinstance(row, dict) and isinstance(row.get("probabilities"), dict) and isinstance(row.get("text"), str)):
        return False
    probs, prediction = row["probabilities"], row.get("prediction")
    named = prediction if isinstance(prediction, list) else [prediction]
    return all(isinstance(name, str) and isinstance(probs.get(name), (int, float)) for name in named) and all(
        isinstance(p, (int, float)) for p in probs.values()
    )


def _confidence_in_mistake(row: dict) -> float:
    """How sure the wrong answer was: the top probability (one label), or (label sets) the largest distance
    from the truth among the labels the prediction got wrong."""
    if not isinstance(row["prediction"], list):
        return row["probabilities"][row["prediction"]]
    truth, chosen = set(row["label"]), set(row["prediction"])
    return max(
        abs(p - (name in truth)) for name, p in row["probabilities"].items() if (name in truth) != (name in chosen)
    )


def confident_mistakes(rows: list[dict], limit: int = 10) -> list[dict]:
    def wrong(row) -> bool:
        label, prediction = row.get("label"), row["prediction"]
        if isinstance(prediction, list):
            return isinstance(label, list) and set(map(str, label)) != set(prediction)
        return label is not None and label != prediction

    mistakes = [r for r in rows if _prediction_row(r) and wrong(r)]
    return sorted(mistakes, key=lambda r: -_confidence_in_mistake(r))[:limit]


def _plot_curves(log: list[runs.TrainLogLine | runs.ValidationLogLine], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in log if isinstance(r, runs.TrainLogLine)]
    evals = [r for r in log if isinstance(r, runs.ValidationLogLine)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot([r.step for r in steps], [r.loss for r in steps], color="tab:blue")
    left.set(title="training loss", xlabel="optimizer step", ylabel="loss")
    right.plot([r.step for r in evals], [r.validation_accuracy for r in evals], marker="o", color="tab:green")
    right.set(title="validation accuracy", xlabel="optimizer step", ylabel="accuracy")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    with files.writing(target, "a report figure"):
        fig.savefig(target, dpi=110)
    plt.close(fig)


def _plot_confusion(confusion, target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, matrix = confusion.labels, confusion.matrix
    size = 1.2 + 0.7 * len(labels)
    fig, axis = plt.subplots(figsize=(size + 1, size))
    image = axis.imshow(matrix, cmap="Blues")
    axis.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    axis.set_yticks(range(len(labels)), labels)
    axis.set(xlabel="predicted", ylabel="true", title="test confusion matrix")
    peak = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            axis.text(j, i, str(value), ha="center", va="center", color="white" if value > peak / 2 else "black")
    fig.colorbar(image, ax=axis, fraction=0.046)
    fig.tight_layout()
    with files.writing(target, "a report figure"):
        fig.savefig(target, dpi=110)
    plt.close(fig)


def _plot_reliability(calibration, target: Path) -> None:
    """Reliability diagram of the test split: accuracy against confidence, before and after the temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(4.8, 4.2))
    axis.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1, label="perfectly calibrated")
    for name, quality, color in (
        ("raw", calibration.before, "tab:red"),
        (f"T = {calibration.temperature:.2f}", calibration.after, "tab:blue"),
    ):
        table = quality.reliability
        axis.plot(table.confidence, table.accuracy, marker="o", color=color, label=f"{name} (ECE {quality.ece:.3f})")
    axis.set(xlabel="confidence (top class)", ylabel="accuracy", title="test reliability", xlim=(0, 1), ylim=(0, 1))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    with files.writing(target, "a report figure"):
        fig.savefig(target, dpi=110)
    plt.close(fig)


def _calibration_section(calibration) -> list[str]:
    if calibration is None:
        return []
    rows = [
        [name, _fmt(q.ece), _fmt(q.brier), _fmt(q.log_loss)]
        for name, q in (
            ("raw probabilities", calibration.before),
            (f"temperature {calibration.temperature:.3f}", calibration.after),
        )
    ]
    return [
        "<h2>Calibration (test split)</h2>",
        '<img src="reliability.png" alt="reliability diagram">',
        _table(["", "ECE", "Brier", "log loss"], rows),
        "<p>The temperature is fitted on the validation split; predict and serve return the calibrated "
        "probabilities.</p>",
    ]


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _shown(value) -> str:
    return ", ".join(map(str, value)) or "(none)" if isinstance(value, list) else str(value)


def _fmt(value) -> str:
    """Rates and fractions with 4 decimals, larger numbers (tokens/s, seconds) with one."""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) <= 1 else f"{value:.1f}"
    return str(value)


def _scores(metrics) -> list[float]:
    """The scores its problem type names (accuracy and macro F1; for label sets micro F1 too)."""
    return problem_for(metrics.problem).scores(metrics)


def _ladder(metrics: runs.Metrics, baseline: runs.BaselineRecord | None, tfidf) -> list[list]:
    rows = []
    if baseline is not None:
        rows += [
            ["zero-shot prompt", *_scores(baseline.zero_shot)],
            ["zero-shot, calibrated", *_scores(baseline.calibrated)],
        ]
    if tfidf is not None:
        rows.append([f"TF-IDF + logistic regression (C={tfidf.c:g})", *_scores(tfidf.test)])
    rows.append(["LoRA", *_scores(metrics.test)])
    return rows


def _verdict_section(metrics: runs.Metrics, comparison: list[list], scores: list[str]) -> list[str]:
    """The one table of quality and cost, the sentence that says what to ship, and any baseline left out."""
    skipped = metrics.baseline.skipped if metrics.baseline is not None else []
    notes = [f"<p>{html.escape(skip.name)} skipped: {html.escape(skip.reason)}</p>" for skip in skipped]
    verdict = metrics.verdict
    if verdict is None:  # a run from before the verdict
        return [_table(["method", *scores], [[method, *map(_fmt, values)] for method, *values in comparison]), *notes]
    rows = [
        [
            r.name,
            r.detail,
            _fmt(r.accuracy) + (f" ± {standard_error(r.accuracy, verdict.examples):.3f}" if verdict.examples else ""),
            _fmt(r.macro_f1),
            "-" if r.ece is None else f"{r.ece:.3f}",
            "-" if r.train_seconds is None else f"{r.train_seconds:.0f}",
            "-" if r.texts_per_second is None else f"{r.texts_per_second:.1f}",
            "-" if r.parameters is None else f"{r.parameters / 1e6:.2f}M",
        ]
        for r in verdict.rows
    ]
    first = problem_for(metrics.test.problem).accuracy_name + " (± one standard error)"
    return [
        f"<p><b>Verdict: {html.escape(verdict.reason)}.</b></p>",
        _table(["model", "what", first, "macro F1", "ECE", "train s", "texts/s (inference)", "parameters"], rows),
        f"<p>Compared by {verdict.metric.replace('_', ' ')}; one standard error on this test split: "
        f"{100 * verdict.noise:.1f} points. Of the models within it of the best, the fastest is shipped.</p>",
        *notes,
    ]


def write_report(run_path: str) -> Path:
    run = Path(run_path)
    if not (run / runs.METRICS).is_file():
        raise LoraclsError(f"{run_path} is not a finished loracls run directory ({runs.METRICS} missing)")
    metrics = runs.read_metrics(run)
    env = runs.to_dict(runs.read_env(run)) if (run / runs.ENV).is_file() else {}
    baseline = runs.read_baseline(run) if (run / runs.BASELINE).is_file() else None
    tfidf = runs.read_tfidf(run) if (run / runs.TFIDF).is_file() else None
    _plot_curves(runs.read_train_log(run) if (run / runs.TRAIN_LOG).is_file() else [], run / "curves.png")
    confusion = getattr(metrics.test, "confusion_matrix", None)  # one label a text: a confusion matrix
    if confusion is not None:
        _plot_confusion(confusion, run / "confusion.png")
    if metrics.calibration is not None:
        _plot_reliability(metrics.calibration, run / "reliability.png")
    files.write_text(
        run / REPORT,
        _page(
            run.name,
            metrics,
            env,
            _ladder(metrics, baseline, tfidf),
            _read_jsonl(run / runs.PREDICTIONS / "test.jsonl"),
        ),
    )
    return run / REPORT


COMMENT_EXAMPLES = 20


def _greedy_rows(comments: runs.CommentMetrics) -> list[list]:
    """With comment_candidates > 1: the greedy comments' figures beside the kept candidates'."""
    if comments.greedy_rouge_l is None:
        return []
    return [
        [f"ROUGE-L of the greedy comments (kept: 1 of {comments.candidates} beams)", comments.greedy_rouge_l]
        + [None, None],
        ["consistency of the greedy comments", comments.greedy_consistency, None, None],
    ]


def _comments_section(metrics: runs.Metrics, test_rows: list) -> list[str]:
    """label_and_comment: labels and comments beside the untrained prompt and the classification-head LoRA,
    and the first test examples with their generated comment."""
    comments = metrics.comments
    if comments is None:
        return []
    scores = [
        ["label accuracy", metrics.test.accuracy, comments.zero_shot_accuracy, comments.head_accuracy],
        ["label macro F1", metrics.test.macro_f1, None, comments.head_macro_f1],
        ["ROUGE-L (mean F1)", comments.rouge_l, comments.zero_shot_rouge_l, None],
        ["chrF", comments.chrf, None, None],
        ["consistency (the comment alone gives the label)", comments.consistency, None, None],
        ["... the reference comments' (they alone give their label)", comments.reference_consistency, None, None],
        *_greedy_rows(comments),
        ["mean comment tokens", comments.mean_tokens, None, None],
        ["generation tokens/s", comments.tokens_per_second, None, None],
        ["train seconds", metrics.train.seconds, None, comments.head_train_seconds],
    ]
    rows = [r for r in test_rows if _prediction_row(r) and isinstance(r.get("comment"), str)][:COMMENT_EXAMPLES]
    examples = [
        [r["text"], _shown(r.get("label", "")), _shown(r["prediction"]), _fmt(max(r["probabilities"].values())),
         r["comment"], str(r.get("reference_comment", ""))]
        for r in rows
    ]  # fmt: skip
    return [
        "<h2>Comments (test split)</h2>",
        _table(
            ["", "trained (label + comment)", "zero-shot (same prompt)", "classification-head LoRA (same split)"],
            [[k, *("-" if v is None else _fmt(v) for v in values)] for k, *values in scores],
        ),
        _table(["text", "true", "predicted", "probability", "generated comment", "reference"], examples),
    ]


def _training_summary(metrics: runs.Metrics) -> list[list]:
    train = metrics.train
    return [
        ["train steps", train.steps],
        ["stopped early", train.stopped_early],
        ["epochs added while validation improved", train.extensions],
        [
            "still improving at the end",
            "yes: the best validation was the last; more epochs may help" if train.still_improving else "no",
        ],
        ["train tokens/s", train.tokens_per_second],
        ["MFU", "unknown" if train.mfu is None else train.mfu],
        ["loop seconds", train.seconds],
        ["wall seconds", metrics.wall_seconds],
        ["best validation accuracy", metrics.validation.best_accuracy],
        ["best step", metrics.validation.best_step],
        ["merged == adapter", metrics.export.predictions_equal if metrics.export else "not exported"],
    ]


def _page(name: str, metrics: runs.Metrics, env: dict, comparison: list[list], test_rows: list) -> str:
    kind = problem_for(metrics.test.problem)
    thresholds = kind.thresholds(metrics.test)  # per label, where the problem type tunes them
    per_class = [
        [label, *([thresholds[label]] if thresholds else []), row.precision, row.recall, row.f1, row.support]
        for label, row in metrics.test.per_class.items()
    ]
    mistakes = [
        [_shown(r["label"]), _shown(r["prediction"]), _confidence_in_mistake(r), r["text"]]
        for r in confident_mistakes(test_rows)
    ]
    scores = list(kind.score_names)
    summary = _training_summary(metrics)
    sections = [
        f"<h1>loracls run {html.escape(name)}</h1>",
        "<h2>Does the LLM pay for itself? Every model on the test split, quality and cost</h2>",
        *_verdict_section(metrics, comparison, scores),
        "<h2>Training</h2>",
        '<img src="curves.png" alt="loss and validation curves">',
        _table(["", ""], [[k, _fmt(v)] for k, v in summary]),
        "<h2>Data</h2>",
        "".join(f"<p>{html.escape(note)}</p>" for note in metrics.data_notes) or "<p>no notes</p>",
        "<h2>Test report</h2>",
        _table(
            [
                kind.label_heading,
                *(["threshold"] if thresholds else []),
                "precision",
                "recall",
                "F1",
                "support",
            ],
            [[r[0], *map(_fmt, r[1:])] for r in per_class],
        ),
        '<img src="confusion.png" alt="confusion matrix">' if hasattr(metrics.test, "confusion_matrix") else "",
        *_calibration_section(metrics.calibration),
        *_comments_section(metrics, test_rows),
        "<h2>Most confident mistakes</h2>",
        _table(["true", "predicted", "confidence", "text"], [[a, b, _fmt(c), t] for a, b, c, t in mistakes])
        if mistakes
        else "<p>none</p>",
        "<h2>Environment</h2>",
        _table(["", ""], [[k, v] for k, v in env.items()]),
    ]
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
        "th{background:#f3f3f3}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>loracls {html.escape(name)}</title>"
        f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n"
    )
