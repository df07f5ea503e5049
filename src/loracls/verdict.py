"""The verdict: every model a run trained or scored on the same test split, in one table of quality and
cost, and one sentence that says which to ship and why.

The rule: the best score (the run's `select_by`: accuracy, or macro F1) sets the bar; a model within one
standard error of it (sqrt(p(1-p)/n) on the n test texts: differences smaller than that are noise on a
split of that size) is as good; of those, the one that scores the most texts per second is shipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LORA_ROW", "LadderRow", "Verdict", "decide", "standard_error"]

LORA_ROW = "LoRA"  # the trained classifier's row: the one every other row is compared with


@dataclass
class LadderRow:
    """One model on the test split: its quality and its cost (None: not measured for this model)."""

    name: str  # zero-shot | zero-shot, calibrated | TF-IDF | encoder | LoRA
    accuracy: float  # label sets: subset accuracy
    macro_f1: float
    ece: float | None = None  # expected calibration error of the probabilities served
    train_seconds: float | None = None
    texts_per_second: float | None = None  # inference on the test split
    parameters: int | None = None  # all the weights inference needs
    detail: str = ""  # what exactly it is (e.g. the encoder's name, TF-IDF's C)


@dataclass
class Verdict:
    ship: str  # the name of the row to ship
    reason: str  # one sentence
    metric: str  # what was compared: accuracy | macro_f1
    noise: float  # one standard error of the best score on this test split
    rows: list[LadderRow] = field(default_factory=list)
    examples: int = 0  # texts in the test split (each row's standard error is sqrt(p(1-p)/examples))


def _score(row: LadderRow, metric: str) -> float:
    return row.macro_f1 if metric == "macro_f1" else row.accuracy


def _speed(row: LadderRow) -> float:
    return row.texts_per_second if row.texts_per_second is not None else 0.0


def _cost_ratio(a: LadderRow, b: LadderRow) -> str:
    """How much a costs at inference against b, in words ("9.0x", "1/4.2 of")."""
    if not (a.texts_per_second and b.texts_per_second):
        return "an unmeasured"
    ratio = b.texts_per_second / a.texts_per_second
    return f"{ratio:.1f}x" if ratio >= 1 else f"1/{1 / ratio:.1f} of"


def decide(rows: list[LadderRow], examples: int, metric: str = "accuracy") -> Verdict:
    """Which row to ship, and the sentence that says why (see the module's rule)."""
    metric = "macro_f1" if metric == "macro_f1" else "accuracy"
    best = max(rows, key=lambda r: (_score(r, metric), _speed(r)))
    p = min(max(_score(best, metric), 0.0), 1.0)
    noise = math.sqrt(max(p * (1 - p), 1e-12) / max(examples, 1))
    level = [r for r in rows if _score(best, metric) - _score(r, metric) <= noise]
    ship = max(level, key=lambda r: (_speed(r), _score(r, metric)))
    reason = _reason(ship, rows, metric, noise)
    return Verdict(ship=ship.name, reason=reason, metric=metric, noise=noise, rows=rows, examples=examples)


def standard_error(score: float, examples: int) -> float:
    """One standard error of a score that is a share of `examples` texts."""
    p = min(max(score, 0.0), 1.0)
    return math.sqrt(max(p * (1 - p), 1e-12) / max(examples, 1))


def _reason(ship: LadderRow, rows: list[LadderRow], metric: str, noise: float) -> str:
    words = "macro F1" if metric == "macro_f1" else "accuracy"
    lora = next((r for r in rows if r.name == LORA_ROW), None)
    others = [r for r in rows if r.name != ship.name]
    if not others:
        return f"ship {ship.name}: nothing else was measured"
    if ship is lora:
        rival = max(others, key=lambda r: _score(r, metric))
        gap = 100 * (_score(lora, metric) - _score(rival, metric))
        return (
            f"ship LoRA: {gap:+.1f} points of {words} over the {rival.name} (the best alternative; noise on "
            f"this test split is about {100 * noise:.1f}) at {_cost_ratio(lora, rival)} the {rival.name}'s cost "
            f"per text"
        )
    if lora is None:
        return f"ship the {ship.name}: the best {words} for its inference cost"
    gap = 100 * (_score(lora, metric) - _score(ship, metric))
    if gap > 0:
        return (
            f"ship the {ship.name}: LoRA's {gap:+.1f} points of {words} are within this test split's noise "
            f"(about {100 * noise:.1f}), and LoRA costs {_cost_ratio(lora, ship)} the {ship.name}'s cost per text"
        )
    return (
        f"ship the {ship.name}: it is {-gap:.1f} points of {words} ahead of LoRA, and LoRA costs "
        f"{_cost_ratio(lora, ship)} the {ship.name}'s cost per text"
    )


def format_table(verdict: Verdict) -> str:
    """The table as text (the log's side-by-side view)."""
    lines = [
        f"{'model':<22} {'accuracy':>8} {'± se':>6} {'macro F1':>8} {'ECE':>6} {'train s':>8} {'texts/s':>8} "
        f"{'params':>8}"
    ]
    for r in verdict.rows:
        se = f"{standard_error(r.accuracy, verdict.examples):6.4f}" if verdict.examples else f"{'-':>6}"
        lines.append(
            f"{r.name:<22} {r.accuracy:8.4f} {se} {r.macro_f1:8.4f} {_num(r.ece, '6.3f')} "
            f"{_num(r.train_seconds, '8.0f')} {_num(r.texts_per_second, '8.1f')} {_params(r.parameters):>8}"
        )
    return "\n".join(lines + [f"verdict: {verdict.reason}"])


def _num(value, spec: str) -> str:
    width = int(spec.split(".")[0])
    return f"{value:{spec}}" if value is not None else f"{'-':>{width}}"


def _params(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.0f}k"
