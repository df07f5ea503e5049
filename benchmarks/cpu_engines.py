"""The CPU inference engines of one run side by side, in one process, on its test split: the PyTorch engine at
bf16 autocast (the default on a CPU with native bf16) and at fp32, the fp32 ONNX export and the int8 one
(`loracls export RUN --format onnx --quantize int8` first). Each engine scores the split `--rounds` times,
the engines taking turns within a round so that a change in the machine's load falls on all of them; the
best round counts. Prints texts/s, the ratio to the bf16 PyTorch engine, test accuracy and the labels that
differ from it.

    python3 benchmarks/cpu_engines.py RUN [--threads 1] [--rounds 3] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def engines(run: str, threads: int | None) -> dict:
    from loracls.inference.engine import Classifier
    from loracls.inference.onnx_engine import OnnxClassifier

    quiet = lambda *a: None  # noqa: E731
    made = {
        "torch-bf16": Classifier(run, quiet, device="cpu", precision="bf16"),
        "torch-fp32": Classifier(run, quiet, device="cpu", precision="fp32"),
        "onnx": OnnxClassifier(run, quiet, engine="onnx", threads=threads),
        "onnx-int8": OnnxClassifier(run, quiet, engine="onnx-int8", threads=threads),
    }
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description="PyTorch bf16 / fp32 and ONNX fp32 / int8 on one run's test split")
    parser.add_argument("run")
    parser.add_argument("--threads", type=int, help="torch and onnxruntime threads (default: all cores)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from loracls import runs
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset

    test = load_dataset(DataSpec.of(runs.read_config(Path(args.run)))).test
    made = engines(args.run, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)  # after the engines: each setup sets torch's threads again
    for engine in made.values():
        engine.probabilities(test.texts[:32])  # warm-up
    seconds = {name: [] for name in made}
    probs = {}
    for _ in range(args.rounds):
        for name, engine in made.items():
            started = time.perf_counter()
            probs[name] = engine.probabilities(test.texts)
            seconds[name].append(time.perf_counter() - started)
    truth = np.asarray(test.labels)
    reference = probs["torch-bf16"].argmax(1)
    base_speed = len(test.texts) / min(seconds["torch-bf16"])
    report = {"run": args.run, "texts": len(test.texts), "threads": args.threads, "rounds": args.rounds}
    for name in made:
        labels = probs[name].argmax(1)
        speed = len(test.texts) / min(seconds[name])
        report[name] = {
            "texts_per_second": speed,
            "ratio_to_torch_bf16": speed / base_speed,
            "accuracy": float(np.mean(labels == truth)),
            "labels_differing_from_torch_bf16": int(np.sum(labels != reference)),
            "seconds": seconds[name],
        }
        print(
            f"{name:11s} {speed:7.1f} texts/s ({speed / base_speed:.2f}x torch-bf16)  accuracy "
            f"{report[name]['accuracy']:.4f}  labels differing from torch-bf16: {int(np.sum(labels != reference))}",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
