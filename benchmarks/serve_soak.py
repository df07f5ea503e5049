"""A soak of `loracls serve` under mixed load (not a timed test): a real server process on a tiny random Gemma 3
run, 64 concurrent clients sending a fixed number of requests, of which

- valid /classify and /predict requests (1-4 texts),
- oversized ones (33 texts: 413) and malformed ones (bad JSON, an empty text, `top_k: 0`: 422),
- abandoned ones: the client sends a request and closes the connection before the answer.

The server's resident memory and open file descriptors are sampled from /proc while it runs, and each window
of requests gives p50 / p99 latency. The goal (loracls 17): RSS and fds flat within 5% after warm-up, no
status other than the expected ones, p99 steady.

    python3 benchmarks/serve_soak.py [--requests 200000] [--clients 64] [--out soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
WORDS = "good great lovely awful dull boring the film plot was very".split()
EXPECTED = {"valid": {200}, "oversized": {413}, "malformed": {422}}


def tiny_run(folder: Path) -> Path:
    """A tiny random Gemma 3 checkpoint (the suite's) trained for one epoch on synthetic texts."""
    from conftest import synthetic_frame, write_tiny_model

    model = write_tiny_model(folder / "model")
    synthetic_frame(200).to_csv(folder / "train.csv", index=False)
    settings = {
        "model": str(model), "data": str(folder / "train.csv"), "train_size": 100, "validation_size": 30,
        "test_size": 30, "epochs": 1, "baseline": False, "merge": False, "output_dir": str(folder),
        "run_name": "run", "max_length": 32, "precision": "fp32", "min_steps": None, "extend_epochs": 0,
    }  # fmt: skip
    args = [
        arg
        for key, value in settings.items()
        for arg in ("--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    ]
    subprocess.run([sys.executable, "-m", "loracls", "train", *args], check=True, capture_output=True)
    return folder / "run"


def start_server(run: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "loracls", "serve", str(run), "--port", "0", "--max-queue", "100000"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return process, found.group(1)
    raise RuntimeError("server did not start")


def sample(pid: int) -> tuple[float, int]:
    """(resident memory in MB, open file descriptors) of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def request_of(rng: random.Random) -> tuple[str, str, dict | bytes]:
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(rng.randint(1, 4))]
    roll = rng.random()
    if roll < 0.05:
        return "oversized", "/classify", {"input": texts * 33}
    if roll < 0.10:
        return "malformed", "/classify", rng.choice([b"{not json", b'{"input": ""}', b'{"input": "x", "top_k": 0}'])
    if roll < 0.13:
        return "abandoned", "/classify", {"input": texts}
    path = rng.choice(["/classify", "/predict"])
    return "valid", path, {"input": texts} if path == "/classify" else {"inputs": texts}


async def abandon(url: str, body: dict) -> None:
    """Send a request and close the connection without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    head = f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    writer.close()


async def client(url: str, queue: asyncio.Queue, log: list, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            kind, path, body = request_of(rng)
            started = time.perf_counter()
            if kind == "abandoned":
                await abandon(url, body)
                log.append((kind, 0, 0.0))
                continue
            if isinstance(body, bytes):
                response = await http.post(path, content=body, headers={"content-type": "application/json"})
            else:
                response = await http.post(path, json=body)
            log.append((kind, response.status_code, time.perf_counter() - started))


async def soak(url: str, pid: int, requests: int, clients: int, window: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for _ in range(requests):
        queue.put_nowait(None)
    log: list = []
    samples: list = []

    async def watch():
        while True:
            samples.append((len(log), *sample(pid)))
            await asyncio.sleep(2)

    watcher = asyncio.create_task(watch())
    started = time.perf_counter()
    await asyncio.gather(*(client(url, queue, log, seed) for seed in range(clients)))
    seconds = time.perf_counter() - started
    watcher.cancel()
    await asyncio.sleep(2)  # the clients' connections closed
    idle = sample(pid)
    return summarize(log, samples, seconds, window) | {"idle_after": {"rss_mb": idle[0], "fds": idle[1]}}


def summarize(log: list, samples: list, seconds: float, window: int) -> dict:
    unexpected = [(kind, status) for kind, status, _ in log if kind in EXPECTED and status not in EXPECTED[kind]]
    windows = []
    for start in range(0, len(log), window):
        valid = [s for kind, _, s in log[start : start + window] if kind == "valid"]
        if valid:
            windows.append(
                {"from": start, "p50_ms": 1000 * np.median(valid), "p99_ms": 1000 * np.quantile(valid, 0.99)}
            )
    warm = [s for s in samples if s[0] >= len(log) * 0.1] or samples  # under load, after the first 10%
    rss, fds = [s[1] for s in warm], [s[2] for s in warm]
    return {
        "requests": len(log),
        "seconds": seconds,
        "by_kind": {
            kind: sum(1 for k, _, _ in log if k == kind) for kind in ("valid", "oversized", "malformed", "abandoned")
        },
        "unexpected_statuses": len(unexpected),
        "first_unexpected": unexpected[:5],
        "rss_mb_after_warmup": {"first": rss[0], "last": rss[-1], "min": min(rss), "max": max(rss)},
        "fds_after_warmup": {"first": fds[0], "last": fds[-1], "min": min(fds), "max": max(fds)},
        "rss_growth": rss[-1] / rss[0] - 1,
        "windows": windows,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--window", type=int, default=10_000, help="requests per latency window")
    parser.add_argument("--out", default="soak.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run = tiny_run(Path(folder))
        process, url = start_server(run)
        try:
            result = asyncio.run(soak(url, process.pid, args.requests, args.clients, args.window))
        finally:
            process.terminate()
            process.wait(timeout=60)
    Path(args.out).write_text(json.dumps(result, indent=1))
    brief = {k: v for k, v in result.items() if k not in ("samples", "windows")}
    brief["p99_ms_by_window"] = [round(w["p99_ms"], 1) for w in result["windows"]]
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
