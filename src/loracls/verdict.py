"""The verdict: every model a run trained or scored on the same test split, in one table of quality and
cost, and one sentence that says which to ship and why.

The rule: the best score (the run's `select_by`: accuracy, or macro F1) sets the bar; a model within one
standard error of it (sqrt(p(1-p)/n) on the n test texts: differences smaller than that are noise on a
split of that size) is as good; of those, the one that scores the most texts per second is shipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["FULL_ROW", "LORA_ROW", "LadderRow", "Verdict", "decide", "standard_error"]

LORA_ROW = "LoRA"  # the trained classifier's row: the one every other row is compared with
FULL_ROW = "full fine-tune"  # the same row where every weight was trained (method: full)


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
    notes: list[str] = field(default_factory=list)  # what was left out of the table, and why (a budget, ...)


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
    """One sentence a user can act on: a win beyond the noise names the margin and the cost; a gap inside the
    noise is called a tie, and the cheaper model is shipped."""
    words = "macro F1" if metric == "macro_f1" else "accuracy"
    others = [r for r in rows if r.name != ship.name]
    if not others:
        return f"ship {_called(ship)}: nothing else was measured"
    best = max(rows, key=lambda r: (_score(r, metric), _speed(r)))
    if best is not ship:  # a tie: the best is within the noise of a cheaper one
        return _tie(best, ship, ship, 100 * (_score(best, metric) - _score(ship, metric)), words, noise)
    runner_up = max(others, key=lambda r: _score(r, metric))
    gap = 100 * (_score(ship, metric) - _score(runner_up, metric))
    if gap <= 100 * noise:
        return _tie(ship, runner_up, ship, gap, words, noise)
    lora = next((r for r in rows if r.name in (LORA_ROW, FULL_ROW)), None)
    if lora is not None and ship is not lora and runner_up is not lora:
        gap_lora = 100 * (_score(ship, metric) - _score(lora, metric))
        versus = (
            f"; {gap_lora:+.1f} over {lora.name}, which costs {_cost_ratio(lora, ship)} {_owner(ship)} cost per text"
        )
    else:
        versus = ""
    return (
        f"ship {_called(ship)}: {gap:+.1f} points of {words} over {_called(runner_up)} (the best alternative; "
        f"noise on this test split is about {100 * noise:.1f}) at {_cost_ratio(ship, runner_up)} "
        f"{_owner(runner_up)} cost per text{versus}"
    )


def _tie(first: LadderRow, second: LadderRow, ship: LadderRow, gap: float, words: str, noise: float) -> str:
    """`first` scores `gap` points above `second`, inside the noise: the cheaper of the two, `ship`, is shipped."""
    other = first if ship is second else second
    return (
        f"a tie: {_ahead(first, second, gap, words)}, inside this test split's noise (about {100 * noise:.1f}): "
        f"ship the cheaper, {_called(ship)} ({_called(other)} costs {_cost_ratio(other, ship)} {_owner(ship)} cost "
        f"per text)"
    )


def _ahead(first: LadderRow, second: LadderRow, gap: float, words: str) -> str:
    if round(gap, 1) == 0:
        return f"{_called(first)} and {_called(second)} score the same {words}"
    return f"{_called(first)} is {gap:.1f} points of {words} ahead of {_called(second)}"


def _owner(row: LadderRow) -> str:
    return f"{_called(row)}'s"


def _called(row: LadderRow) -> str:
    """How a sentence names a row: LoRA by name, the others with "the" (the encoder mpnet-base, the TF-IDF)."""
    return row.name if row.name in (LORA_ROW, FULL_ROW) else f"the {row.name}"


def format_table(verdict: Verdict) -> str:
    """The table as text (the log's side-by-side view)."""
    width = max([22] + [len(r.name) for r in verdict.rows])
    lines = [
        f"{'model':<{width}} {'accuracy':>8} {'± se':>6} {'macro F1':>8} {'ECE':>6} {'train s':>8} {'texts/s':>8} "
        f"{'params':>8}"
    ]
    for r in verdict.rows:
        se = f"{standard_error(r.accuracy, verdict.examples):6.4f}" if verdict.examples else f"{'-':>6}"
        lines.append(
            f"{r.name:<{width}} {r.accuracy:8.4f} {se} {r.macro_f1:8.4f} {_num(r.ece, '6.3f')} "
            f"{_num(r.train_seconds, '8.0f')} {_num(r.texts_per_second, '8.1f')} {_params(r.parameters):>8}"
        )
    notes = [f"left out: {note}" for note in verdict.notes]
    return "\n".join(lines + notes + [f"verdict: {verdict.reason}"])


def _num(value, spec: str) -> str:
    width = int(spec.split(".")[0])
    return f"{value:{spec}}" if value is not None else f"{'-':>{width}}"


def _params(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.0f}k"
