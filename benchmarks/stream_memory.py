"""Peak memory of `loracls predict RUN --file IN --out OUT.jsonl` against the number of rows: streaming keeps
it flat (the goal: 1M short rows within 10% of 10k rows).

The run is the tests' tiny random Gemma 3 (tests/conftest.py), trained for a few steps, so that the model's
own cost is small and what grows with the input (reading, scoring, writing) is what shows. Each size is one
`loracls predict` process; its peak RSS is the kernel's (`os.wait4` rusage, ru_maxrss).

Usage: python3 benchmarks/stream_memory.py [ROWS ...]   (default: 10000 100000 1000000)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import TINY_ENCODER, synthetic_frame, tiny_overrides, write_tiny_model  # noqa: E402
from loracls.cli import main  # noqa: E402


def tiny_run(work: Path) -> Path:
    model = write_tiny_model(work / "model")
    TINY_ENCODER[:] = [model]  # tiny_overrides names one; no baseline is run
    data = work / "train.csv"
    synthetic_frame(500).to_csv(data, index=False)
    assert main(["train", *tiny_overrides(model, data, work / "runs", epochs=1, merge=True, baseline=False)]) == 0
    return work / "runs" / "run"


def write_input(path: Path, rows: int) -> None:
    texts = list(synthetic_frame(1000)["text"])
    with open(path, "w", encoding="utf-8") as out:
        out.write("text\n")
        for i in range(rows):
            out.write(f"{texts[i % len(texts)]} {i}\n")


def peak_rss(run: Path, source: Path, out: Path) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of one predict process."""
    started = time.perf_counter()
    args = [sys.executable, "-m", "loracls", "predict", str(run), "--file", str(source), "--out", str(out)]
    process = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"predict failed on {source}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started


if __name__ == "__main__":
    sizes = [int(n) for n in sys.argv[1:]] or [10_000, 100_000, 1_000_000]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = tiny_run(work)
        print("| rows | peak RSS (MB) | seconds | rows/s |\n| --- | --- | --- | --- |")
        for rows in sizes:
            source, out = work / f"in-{rows}.csv", work / f"out-{rows}.jsonl"
            write_input(source, rows)
            mb, seconds = peak_rss(run, source, out)
            print(f"| {rows} | {mb:.0f} | {seconds:.0f} | {rows / seconds:.0f} |", flush=True)
            source.unlink()
            out.unlink()
