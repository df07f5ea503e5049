"""The student's texts/s against its teacher's, timed as `loracls distill` times them: the exported student
(RUN/student) and the teacher (RUN) through the same Engine on the run's test texts, student, teacher, student,
REPEATS times, in one process with one thread (the ratio of the medians). For runs distilled before distill
timed this way. Writes benchmarks/distill/results/speed-SET.json, read by summarize.py.
Usage: python3 benchmarks/distill/speed.py STUDY_OUT SET [SET ...]"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from loracls import runs
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.errors import quiet
from loracls.inference.loaded import engine_for

HERE = Path(__file__).parent
REPEATS = 3


def _seconds(engine, texts: list[str]) -> float:
    started = time.perf_counter()
    engine.probabilities(texts)
    return time.perf_counter() - started


def measure(run: Path) -> dict:
    texts = load_dataset(DataSpec.of(runs.read_config(run))).test.texts
    teacher, student = engine_for(str(run), log=quiet), engine_for(str(run / runs.STUDENT), log=quiet)
    _seconds(student, texts[:32]), _seconds(teacher, texts[:32])  # warm-up
    student_s, teacher_s = [], []
    for _ in range(REPEATS):
        before = _seconds(student, texts)
        teacher_s.append(_seconds(teacher, texts))
        student_s.append((before + _seconds(student, texts)) / 2)
    student_tps, teacher_tps = len(texts) / statistics.median(student_s), len(texts) / statistics.median(teacher_s)
    return {
        "texts": len(texts),
        "repeats": REPEATS,
        "threads": torch.get_num_threads(),
        "student_texts_per_second": student_tps,
        "teacher_texts_per_second": teacher_tps,
        "ratio": student_tps / teacher_tps,
    }


def main() -> None:
    torch.set_num_threads(1)  # as the distill job runs (the study's `threads: 1`); engines keep the process's
    study = Path(sys.argv[1])
    for name in sys.argv[2:]:
        result = measure(study / "runs" / f"defaults-{name}")
        (HERE / "results" / f"speed-{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(name, json.dumps(result))


if __name__ == "__main__":
    main()
