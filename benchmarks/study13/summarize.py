"""The study's table (benchmarks/study13/run.sh): every variant's best validation score per set (accuracy; macro
F1 for imbalanced and emotions), the encoders' best validation scores beside, and the mean and spread of each
variant's change against `defaults`. Validation only: the test split is not read here.
`no_extension` needs no run of its own: extend_epochs only adds epochs after the planned ones, so up to the plan's
last step a run without it is the `defaults` run step for step (same seed, same batches; within the rerun noise:
the real no_extension run on emotions, made in a later session, differs by up to 0.7 points a step). Its cell,
where no real run exists, is the best validation score of the `defaults` run's log up to the plan's last step,
marked `*`.
Usage: python3 benchmarks/study13/summarize.py OUT   (writes OUT/results.md and prints it)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

SETS = ["rt", "chinese", "tweets", "imbalanced", "emotions"]


def best_validation(run: Path) -> float | None:
    """The run's best validation score by its select_by, read from train_log.jsonl at the best step."""
    metrics_path = run / "metrics.json"
    if not metrics_path.is_file():
        return None
    validation = json.loads(metrics_path.read_text())["validation"]
    key = _select_key(validation)
    lines = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    at_best = [line for line in lines if line.get("step") == validation["best_step"] and key in line]
    return at_best[-1][key] if at_best else None


def _select_key(validation: dict) -> str:
    return "validation_macro_f1" if validation.get("select_by") == "macro_f1" else "validation_accuracy"


def best_within_plan(run: Path) -> float | None:
    """The best validation score a run reached by the last step of its plan (epochs x steps per epoch, the steps
    per epoch read from a logged step's epoch fraction): what the run would have chosen with extend_epochs: 0."""
    if not (run / "metrics.json").is_file():
        return None
    lines = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    epochs = yaml.safe_load((run / "config.yaml").read_text())["epochs"]
    logged = next(line for line in lines if line.get("epoch"))
    plan_end = round(logged["step"] / logged["epoch"] * epochs)
    key = _select_key(json.loads((run / "metrics.json").read_text())["validation"])
    scores = [line[key] for line in lines if key in line and line["step"] <= plan_end]
    return max(scores) if scores else None


def encoder_scores(runs: Path, name: str) -> dict[str, float]:
    """Each encoder's best validation score on a set over its learning rates: from one `loracls baseline` of the
    whole grid (encoders-SET.json) and from the one-rate processes (enc_MODEL_RATE-SET.json)."""
    paths = [runs / f"encoders-{name}.json", *sorted(runs.glob(f"enc_*-{name}.json"))]
    best: dict[str, float] = {}
    for path in paths:
        if path.is_file():
            for record in json.loads(path.read_text())["encoders"]:
                best[record["model"]] = max(best.get(record["model"], 0.0), abs(record["validation_score"]))
    return best


def table(out: Path) -> str:
    runs = out / "runs"
    names = {p.name.rsplit("-", 1)[0] for p in runs.iterdir() if p.is_dir()}
    variants = sorted(names, key=lambda v: (v != "defaults", v))
    scores = {v: {s: best_validation(runs / f"{v}-{s}") for s in SETS} for v in variants}
    derived = {s for s in SETS if scores.get("no_extension", {}).get(s) is None}
    within_plan = {s: best_within_plan(runs / f"defaults-{s}") for s in derived}
    if any(score is not None for score in within_plan.values()):
        if "no_extension" not in variants:
            variants.append("no_extension")
        scores.setdefault("no_extension", {s: None for s in SETS}).update(within_plan)
    rows = [
        "| variant | " + " | ".join(SETS) + " | mean (sets done) | change vs defaults (min..max) |",
        "|---" * 8 + "|",
    ]
    for variant in variants:
        cells = scores[variant]
        done = [cells[s] for s in SETS if cells[s] is not None]
        base = scores.get("defaults", {})
        changes = [100 * (cells[s] - base[s]) for s in SETS if cells[s] is not None and base.get(s) is not None]
        change = f"{min(changes):+.1f}..{max(changes):+.1f}" if changes and variant != "defaults" else ""
        mean = f"{sum(done) / len(done):.4f} ({len(done)})" if done else "-"
        mark = {s: "*" if variant == "no_extension" and s in derived else "" for s in SETS}
        shown = [f"{cells[s]:.4f}{mark[s]}" if cells[s] is not None else "-" for s in SETS]
        rows.append(f"| {variant} | " + " | ".join(shown) + f" | {mean} | {change} |")
    encoders = {s: encoder_scores(runs, s) for s in SETS}
    for name in sorted({name for found in encoders.values() for name in found}):
        shown = [
            f"{encoders.get(s, {}).get(name):.4f}" if encoders.get(s, {}).get(name) is not None else "-" for s in SETS
        ]
        rows.append(f"| encoder {name} | " + " | ".join(shown) + " | | |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1])
    text = table(out)
    (out / "results.md").write_text(text)
    print(text)
