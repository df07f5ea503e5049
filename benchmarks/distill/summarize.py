"""loracls 15's table: per set, the teacher (LoRA at the study's defaults), MiniLM fine-tuned on the gold labels
alone (the study's encoders run, else benchmarks/distill/results/gold-SET.json) and MiniLM distilled from the
teacher (benchmarks/distill/results/SET.json), on the same test split, in the set's own measure (the study's
select_by: accuracy, or macro F1 on imbalanced and emotions); texts/s of the student against the
teacher's measured in the same distill process. A tagged record (results/SET-TAG.json: run.sh's TAG, e.g. every
left-out text as the unlabeled set) is one more row of its set. Where results/teacher-SET[-TAG].json exists
(the metrics.json of the teacher the record was distilled from, which run.sh keeps beside each record: a teacher
trained again differs from the study's run), the row's teacher figures are read from it.
Usage: python3 benchmarks/distill/summarize.py STUDY_OUT   (the study's kept results also serve as STUDY_OUT)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
SETS = ["rt", "chinese", "tweets", "imbalanced", "emotions"]


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _gold(study: Path, name: str) -> dict | None:
    """MiniLM on the gold labels alone, the best on validation over its learning rates: the study's encoders
    runs of the set (one process for the grid, or one a rate), else this benchmark's own gold-SET.json."""
    paths = [study / "runs" / f"encoders-{name}.json", *sorted((study / "runs").glob(f"enc_minilm_*-{name}.json"))]
    paths.append(HERE / "results" / f"gold-{name}.json")
    found = [e for p in paths for e in (_read(p) or {}).get("encoders", []) if e["model"] == "minilm"]
    return max(found, key=lambda e: abs(e["validation_score"]), default=None)


def row(study: Path, name: str, tag: str | None = None) -> str | None:
    record = f"{name}-{tag}" if tag else name
    student = _read(HERE / "results" / f"{record}.json")
    metrics = _read(HERE / "results" / f"teacher-{record}.json") or _read(
        study / "runs" / f"defaults-{name}" / "metrics.json"
    )
    if student is None or metrics is None:
        return None
    gold = _gold(study, name)
    measure = metrics["validation"].get("select_by", "accuracy")  # the set's measure (macro F1: imbalanced, emotions)
    key = "macro_f1" if measure == "macro_f1" else "accuracy"
    teacher, own = metrics["test"][key], student["test"][key]
    gold_cell = f"{gold['test'][key]:.4f}" if gold else "-"
    gain = f"{100 * (own - gold['test'][key]):+.1f}" if gold else "-"
    # benchmarks/distill/speed.py where it has run (records of before distill timed the exported student)
    speed = None if tag else _read(HERE / "results" / f"speed-{name}.json")
    ratio = speed["ratio"] if speed else student["texts_per_second"] / student["teacher_texts_per_second"]
    teacher_ece = (metrics.get("calibration") or {}).get("after", {}).get("ece")
    eces = f"{student['test_ece']:.3f} / {teacher_ece:.3f}" if teacher_ece is not None and student["test_ece"] else "-"
    return (
        f"| {name + (f' ({tag})' if tag else '')} | {key.replace('_', ' ')} | {teacher:.4f} | {gold_cell} | "
        f"{own:.4f} | {gain} | {100 * (own - teacher):+.1f} | "
        f"{_weight(student)} | {_unlabeled(student)} | "
        f"{100 * student['agreement_with_teacher']:.1f}% | "
        f"{ratio:.1f}x | {eces} |"
    )


def _weight(student: dict) -> str:
    """The teacher's share of the loss, and the distillation temperature where it is not 1 (--temperature)."""
    heat = student.get("distill_temperature", 1.0)
    return f"{student['teacher_weight']:g}" + (f", T {heat:g}" if heat != 1 else "")


def _unlabeled(student: dict) -> str:
    """The unlabeled texts, the augmented variants of the training texts (--augment) apart."""
    augmented = student.get("augmented_texts", 0)
    return (
        f"{student['unlabeled_texts'] - augmented} + {augmented} augmented"
        if augmented
        else str(student["unlabeled_texts"])
    )


def main() -> None:
    study = Path(sys.argv[1])
    lines = [
        "| set | measure | teacher (LoRA) | MiniLM, gold labels | MiniLM, distilled | vs gold | vs teacher "
        "| teacher weight | unlabeled | agrees | texts/s vs teacher | ECE student / teacher |",
        "|---" * 12 + "|",
    ]
    for name in SETS:
        tags = sorted(p.stem[len(name) + 1 :] for p in (HERE / "results").glob(f"{name}-*.json"))
        lines += [r for r in (row(study, name, tag) for tag in [None, *tags]) if r]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
