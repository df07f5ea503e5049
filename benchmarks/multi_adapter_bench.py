"""Many runs on one server against one server per run, measured side by side in one call:

1. Memory: the resident set (VmRSS after loading, VmHWM at the end) of `loracls serve RUN1 ... RUNn` against
   the sum over n single-run servers (`loracls serve RUNk`, started one after another).
2. Throughput: texts/s at `--concurrency` (default 32), one text a request, with the requests spread
   round-robin over the n runs on the shared server, against the first run alone on its own server (the
   same texts, the same number of requests, the same threads).
3. Agreement: each request's label from the shared server against its run's single server.

    python3 benchmarks/multi_adapter_bench.py RUN1 RUN2 RUN3 [--requests 600] [--concurrency 32] \
        [--out result.json]

The servers take their torch threads from the runs' `threads` (all cores when unset).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import ROOT, start  # noqa: E402

URL = r"listening on (http://127\.0\.0\.1:\d+)"


def memory_mb(pid: int) -> dict:
    """VmRSS (now) and VmHWM (peak) of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mb": fields["VmRSS"], "peak_mb": fields["VmHWM"]}


async def load(url: str, texts: list[str], models: list[str | None], concurrency: int) -> dict:
    """Each text one /classify request to the model beside it, at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    labels = [""] * len(texts)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def one(i: int):
            async with gate:
                body = {"input": texts[i]} | ({"model": models[i]} if models[i] else {})
                response = await client.post("/classify", json=body)
                response.raise_for_status()
                labels[i] = response.json()["data"][0]["label"]

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(texts))))
        seconds = time.perf_counter() - started
    return {"texts_per_second": len(texts) / seconds, "labels": labels}


def server(runs: list[Path]):
    """A `loracls serve` process (torch threads: the first run's `threads`, as in any serve call)."""
    return start([sys.executable, "-m", "loracls", "serve", *map(str, runs), "--port", "0"], URL, None)


def stop(process) -> None:
    process.terminate()
    process.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description="one server for n runs vs n servers")
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from loracls import runs as run_files
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset

    test = load_dataset(DataSpec.of(run_files.read_config(args.runs[0]))).test.texts
    texts = [test[i % len(test)] for i in range(args.requests)]
    names = [run.name for run in args.runs]
    spread = [names[i % len(names)] for i in range(len(texts))]
    report: dict = {"runs": names, "requests": len(texts), "concurrency": args.concurrency, "cores": os.cpu_count()}

    singles, single_labels = [], {}
    for k, run in enumerate(args.runs):
        process, url = server([run])
        try:
            loaded = memory_mb(process.pid)
            mine = [i for i, name in enumerate(spread) if name == run.name]
            asked = asyncio.run(load(url, [texts[i] for i in mine], [None] * len(mine), args.concurrency))
            single_labels.update(dict(zip(mine, asked["labels"])))
            if k == 0:  # the reference: the first run alone, every text
                report["single_texts_per_second"] = asyncio.run(
                    load(url, texts, [None] * len(texts), args.concurrency)
                )["texts_per_second"]
            singles.append(loaded | {"peak_mb": memory_mb(process.pid)["peak_mb"]})
        finally:
            stop(process)
    process, url = server(args.runs)
    try:
        shared_loaded = memory_mb(process.pid)
        asked = asyncio.run(load(url, texts, spread, args.concurrency))
        shared = shared_loaded | {"peak_mb": memory_mb(process.pid)["peak_mb"]}
    finally:
        stop(process)
    report |= {
        "single_servers": singles,
        "single_servers_peak_mb_sum": sum(s["peak_mb"] for s in singles),
        "shared_server": shared,
        "shared_texts_per_second": asked["texts_per_second"],
        "throughput_ratio": asked["texts_per_second"] / report["single_texts_per_second"],
        "memory_ratio": shared["peak_mb"] / sum(s["peak_mb"] for s in singles),
        "label_agreement": float(np.mean([asked["labels"][i] == single_labels[i] for i in range(len(texts))])),
    }
    print(json.dumps(report, indent=2))
    n, summed = len(names), report["single_servers_peak_mb_sum"]
    print(f"{n} runs on one server: peak {shared['peak_mb']:.0f} MB vs {summed:.0f} MB for {n} servers", end=" ")
    print(f"({report['memory_ratio']:.2f}x); {report['shared_texts_per_second']:.1f} texts/s over the runs", end=" ")
    print(f"vs {report['single_texts_per_second']:.1f} for one run alone ({report['throughput_ratio']:.2f}x)", end=" ")
    print(f"at concurrency {args.concurrency}; labels as each run's own server: {report['label_agreement']:.4f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
