"""Serving and batch-inference benchmark, ratios measured side by side in one run:

1. `loracls serve RUN` against the naive server (benchmarks/naive_server.py: transformers' pipeline behind
   one FastAPI route, one request at a time) on the same merged model: a bounded load generator on
   127.0.0.1 sends `--requests` single test texts at each concurrency (1, 8, 32) and reports texts/s, p50 and
   p99 latency, the ratio, and whether the labels are identical.
2. Batch `predict` (the loracls engine) on the test split against `transformers.pipeline` with its batching
   (batch_size 32) on the same merged model: texts/s and label agreement.

Both are run with loracls at the run's precision (auto: bf16 autocast on a CPU with native bf16) and at fp32
(the pipeline's own precision), so label identity is judged at equal precision.

    python3 benchmarks/serve_bench.py RUN [--requests 2000] [--concurrency 1,8,32] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    command: list[str], url_pattern: str | None, port: int | None, limit: float = 600
) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.time() + limit
    if url_pattern:  # our server prints the port it took
        for line in process.stdout:
            found = re.search(url_pattern, line)
            if found:
                return process, found.group(1)
            if time.time() > deadline:
                break
        raise RuntimeError("server did not start")
    url = f"http://127.0.0.1:{port}"
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("naive server did not start")


async def load(url: str, texts: list[str], concurrency: int) -> dict:
    """Send every text as one request, at most `concurrency` in flight; latency per request."""
    gate = asyncio.Semaphore(concurrency)
    latencies, labels = [0.0] * len(texts), [""] * len(texts)
    limits = httpx.Limits(max_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(i: int):
            async with gate:
                started = time.perf_counter()
                response = await client.post("/classify", json={"input": texts[i]})
                latencies[i] = time.perf_counter() - started
                labels[i] = response.json()["data"][0]["label"]

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(texts))))
        seconds = time.perf_counter() - started
    return {
        "texts_per_second": len(texts) / seconds,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "labels": labels,
    }


def serving(run: Path, texts: list[str], levels: list[int], precision: str) -> dict:
    ours, url = start(
        [sys.executable, "-m", "loracls", "serve", str(run), "--port", "0", "--precision", precision],
        r"listening on (http://127\.0\.0\.1:\d+)",
        None,
    )
    port = free_port()
    naive, naive_url = start([sys.executable, "benchmarks/naive_server.py", str(run / "merged"), str(port)], None, port)
    result = {}
    try:
        for level in levels:
            mine = asyncio.run(load(url, texts, level))
            theirs = asyncio.run(load(naive_url, texts, level))
            result[str(level)] = {
                "loracls": {k: v for k, v in mine.items() if k != "labels"},
                "naive": {k: v for k, v in theirs.items() if k != "labels"},
                "ratio": mine["texts_per_second"] / theirs["texts_per_second"],
                "labels_identical": mine["labels"] == theirs["labels"],
                "label_agreement": float(np.mean([a == b for a, b in zip(mine["labels"], theirs["labels"])])),
            }
            print(
                f"serve [{precision}] concurrency {level}: loracls {mine['texts_per_second']:.1f} texts/s "
                f"(p50 {mine['p50_ms']:.0f} ms, p99 {mine['p99_ms']:.0f} ms) vs naive {theirs['texts_per_second']:.1f} "
                f"(p50 {theirs['p50_ms']:.0f}, p99 {theirs['p99_ms']:.0f}): {result[str(level)]['ratio']:.2f}x, "
                f"labels identical: {result[str(level)]['labels_identical']}",
                flush=True,
            )
    finally:
        for process in (ours, naive):
            process.terminate()
            process.wait(60)
    return result


def batch_predict(run: Path, texts: list[str], precision: str) -> dict:
    import torch
    from transformers import pipeline

    from loracls.inference.engine import Classifier

    engine = Classifier(str(run), lambda *a: None, device="cpu", precision=precision)
    engine.probabilities(texts[:64])  # warm-up, as the pipeline's below
    started = time.perf_counter()
    ours = engine.probabilities(texts).argmax(1)
    ours_seconds = time.perf_counter() - started
    pipe = pipeline(
        "text-classification", model=str(run / "merged"), trust_remote_code=True, device="cpu", dtype=torch.float32
    )
    pipe(texts[:64], batch_size=32)
    started = time.perf_counter()
    theirs = [r["label"] for r in pipe(texts, batch_size=32)]
    theirs_seconds = time.perf_counter() - started
    ours_labels = [engine.id2label[int(i)] for i in ours]
    return {
        "texts": len(texts),
        "loracls_texts_per_second": len(texts) / ours_seconds,
        "pipeline_texts_per_second": len(texts) / theirs_seconds,
        "ratio": theirs_seconds / ours_seconds,
        "labels_identical": ours_labels == theirs,
        "label_agreement": float(np.mean([a == b for a, b in zip(ours_labels, theirs)])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="loracls serve / batch predict against transformers' pipeline")
    parser.add_argument("run", type=Path)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--precisions", default="auto,fp32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from loracls import runs
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset

    test = load_dataset(DataSpec.of(runs.read_config(args.run))).test.texts
    texts = [test[i % len(test)] for i in range(args.requests)]
    levels = [int(x) for x in args.concurrency.split(",")]
    report = {"run": str(args.run), "requests": args.requests, "cpu_threads": os.cpu_count()}
    for precision in args.precisions.split(","):
        report[f"batch_predict_{precision}"] = batch_predict(args.run, test, precision)
        print(f"batch predict [{precision}]: {json.dumps(report[f'batch_predict_{precision}'])}", flush=True)
        report[f"serve_{precision}"] = serving(args.run, texts, levels, precision)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
