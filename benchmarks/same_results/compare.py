"""Compare the two sides of benchmarks/same_results/run.sh: every train-log line's loss and validation score,
the test metrics and every test prediction. Prints one table row per job."""

import json
import sys
from pathlib import Path


def lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines() if line.strip()]


def compare(out: Path, job: str) -> str:
    old, new = out / "old" / job, out / "new" / job
    a, b = lines(old), lines(new)
    losses = [(x["loss"], y["loss"]) for x, y in zip(a, b) if "loss" in x and "loss" in y]
    key = "validation_accuracy"
    scores = [(x[key], y[key]) for x, y in zip(a, b) if key in x and key in y]
    loss_gap = max((abs(x - y) for x, y in losses), default=0.0)
    same_scores = all(x == y for x, y in scores)
    ma, mb = (json.loads((run / "metrics.json").read_text()) for run in (old, new))
    pa, pb = ((run / "predictions" / "test.jsonl").read_text().splitlines() for run in (old, new))
    labels = sum(json.loads(x)["prediction"] == json.loads(y)["prediction"] for x, y in zip(pa, pb))
    extra = ""
    if ma.get("comments"):
        extra = f", ROUGE-L {ma['comments']['rouge_l']:.4f} / {mb['comments']['rouge_l']:.4f}"
    return (
        f"| {job} | {len(losses)} logged losses, largest difference {loss_gap:.2e} | validation scores "
        f"{'equal' if same_scores else 'differ'} ({[round(x, 4) for x, _ in scores]}) | test accuracy "
        f"{ma['test']['accuracy']:.4f} / {mb['test']['accuracy']:.4f}{extra} | {labels} of {len(pa)} test "
        f"predictions equal |"
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    print("| job | losses | validation | test (old / new) | predictions |")
    print("| --- | --- | --- | --- | --- |")
    for job in ("default", "comment"):
        print(compare(out, job))
