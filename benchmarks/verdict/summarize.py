"""The verdict study's table from its run directories: per data set, TF-IDF, the fine-tuned encoder and LoRA
(attention q,v: the default; all linear layers), test accuracy and macro F1, and inference texts/s."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _rows(metrics: dict) -> dict[str, dict]:
    return {row["name"]: row for row in (metrics.get("verdict") or {}).get("rows", [])}


def main(out: Path) -> None:
    runs = out / "runs"
    columns = [
        "data set",
        "TF-IDF",
        "encoder (MiniLM-L6)",
        "LoRA q,v",
        "LoRA all linear",
        "encoder texts/s",
        "LoRA texts/s",
        "verdict",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|---|")
    gaps = {"qv": [], "all": []}
    for first in sorted(runs.glob("*-qv")):
        name = first.name[:-3]
        if not (first / "metrics.json").is_file():
            continue
        metrics = json.loads((first / "metrics.json").read_text())
        rows, key = _rows(metrics), "macro_f1" if metrics["validation"]["select_by"] == "macro_f1" else "accuracy"
        other = first.with_name(f"{name}-all") / "metrics.json"
        all_linear = json.loads(other.read_text())["test"] if other.is_file() else None
        cell = lambda r, key=key: f"{r[key]:.4f}" if r else ""  # noqa: E731
        encoder = rows.get("encoder")
        for tag, test in (("qv", metrics["test"]), ("all", all_linear)):
            if test is not None and encoder is not None:
                gaps[tag].append(100 * (test[key] - encoder[key]))
        print(
            f"| {name} ({key.replace('_', ' ')}) | {cell(rows.get('TF-IDF'))} | {cell(encoder)} | "
            f"{metrics['test'][key]:.4f} | {f'{all_linear[key]:.4f}' if all_linear else ''} | "
            f"{encoder['texts_per_second']:.0f} | {rows['LoRA']['texts_per_second']:.0f} | "
            f"{metrics['verdict']['ship']} |"
        )
    print("\n| data set | encoder best epoch | encoder train s | LoRA q,v train s | LoRA all linear train s |")
    print("|---|---|---|---|---|")
    for first in sorted(runs.glob("*-qv")):
        if not (first / "encoder.json").is_file() or not (first / "metrics.json").is_file():
            continue
        encoder = json.loads((first / "encoder.json").read_text())
        other = first.with_name(first.name[:-3] + "-all") / "metrics.json"
        seconds = json.loads(other.read_text())["train"]["seconds"] if other.is_file() else None
        print(
            f"| {first.name[:-3]} | {encoder['best_epoch']}/{encoder['epochs']} | {encoder['train_seconds']:.0f} | "
            f"{json.loads((first / 'metrics.json').read_text())['train']['seconds']:.0f} | "
            f"{'' if seconds is None else f'{seconds:.0f}'} |"
        )
    for tag, values in gaps.items():
        if values:
            spread = f", min {min(values):+.1f}, max {max(values):+.1f}"
            mean = statistics.mean(values)
            print(f"\nLoRA {tag} minus encoder, points: mean {mean:+.1f}{spread} over {len(values)} sets")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
