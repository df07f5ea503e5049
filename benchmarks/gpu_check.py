"""The prepared GPU check (issue "loracls 5"), one command that runs anywhere and writes JSON:

1. `loracls doctor` (backend, arch vs build, a real matmul, bf16);
2. the GPU tests (`pytest -m gpu`, skipped where no GPU is visible);
3. `benchmarks/bench.py` (our step against HF Trainer + PEFT) on the Gemma 3 270M architecture and on a ~1B Gemma 3
   config, both with random weights (same compute as the real ones; nothing to download), at the default
   recipe (batch 16 x accumulation 2) and at batch 64: train tokens/s, peak memory, MFU against the device's
   peak at the precision trained in, and the ratios.

On a GPU the bench takes `--steps` (default 10) timed steps per recipe; on a CPU 1, so the whole check ends in
minutes on either (on a CPU the ~1B config runs at the default recipe only: 13 min with it on this 2-core
CPU). Assets (the Gemma tokenizer, the Rotten Tomatoes texts) come from `.gpu/` when
benchmarks/prepare_gpu_check.sh made it (for a machine without our dependencies), else from the embedded ones.

    python3 benchmarks/gpu_check.py OUT_DIR      # writes OUT_DIR/gpu_check.json (+ doctor.txt, tests.txt, bench.json)
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / ".gpu"
# Gemma 3 1B's shape (the 270M config is read from the tokenizer's model directory)
GEMMA3_1B = {
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
}


def run(command: list[str], log: Path, timeout: int) -> tuple[int, float]:
    """Run a command, its output into `log` (and echoed); returns (exit code, seconds)."""
    started = time.perf_counter()
    with open(log, "w") as fh:
        try:
            process = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=ROOT
            )
            code, text = process.returncode, process.stdout
        except subprocess.TimeoutExpired as exc:
            code, text = (
                124,
                (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or ""),
            )
        fh.write(text)
    print(text[-4000:], flush=True)
    return code, time.perf_counter() - started


def base_model_dir(work: Path) -> Path:
    """A directory with Gemma 3 270M's config and tokenizer (weights are made at random later)."""
    if (ASSETS / "tokenizer.json.xz").is_file():
        target = work / "gemma3-270m-assets"
        target.mkdir(parents=True, exist_ok=True)
        (target / "tokenizer.json").write_bytes(lzma.decompress((ASSETS / "tokenizer.json.xz").read_bytes()))
        for name in ("tokenizer_config.json", "config.json"):
            (target / name).write_bytes((ASSETS / name).read_bytes())
        return target
    from loracls.config import EMBEDDED_MODEL
    from loracls.model.source import resolve_model_dir

    return resolve_model_dir(EMBEDDED_MODEL, print)


def data_path() -> str:
    if (ASSETS / "rotten_tomatoes.csv").is_file():
        return str(ASSETS / "rotten_tomatoes.csv")
    from loracls.config import EMBEDDED_DATA

    return EMBEDDED_DATA


def random_model(base: Path, target: Path, shape: dict) -> Path:
    """A causal LM of the base config (reshaped by `shape`) with random weights, saved in bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if (target / "config.json").is_file():
        return target
    config = AutoConfig.from_pretrained(base)
    for key, value in shape.items():
        setattr(config, key, value)
    if shape:
        pattern = ["sliding_attention"] * 5 + ["full_attention"]
        config.layer_types = [pattern[i % 6] for i in range(config.num_hidden_layers)]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(base).save_pretrained(target)
    return target


def bench(model: Path, data: str, steps: int, extra: list[str], out: Path, timeout: int) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).with_name("bench.py")),
        "--steps",
        str(steps),
        "--recipes",
        "loracls,hf_trainer",
        "--out",
        str(out),
        "--set",
        f"model={model}",
        "--set",
        f"data={data}",
        *extra,
    ]
    code, seconds = run(command, out.with_suffix(".log"), timeout)
    report = json.loads(out.read_text()) if code == 0 and out.is_file() else {"error": f"exit code {code}"}
    return {**report, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--steps", type=int, help="timed steps per recipe (default: 10 on a GPU, 2 on a CPU)")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    import torch

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    steps = args.steps or (10 if gpu else 1)
    work = Path(os.environ.get("LORACLS_GPU_CHECK_WORK", "/tmp/loracls-gpu-check"))
    result = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": gpu,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "torch": torch.__version__,
        "steps": steps,
    }
    code, _ = run([sys.executable, "-m", "loracls", "doctor"], out / "doctor.txt", 300)
    result["doctor_exit"] = code
    if not args.skip_tests:
        code, seconds = run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_gpu.py", "-rs"],
            out / "tests.txt",
            420,
        )
        summary = (out / "tests.txt").read_text().strip().splitlines()
        result["gpu_tests"] = {"exit": code, "seconds": seconds, "summary": summary[-1] if summary else ""}
    base, data = base_model_dir(work), data_path()
    models = {
        "gemma3-270m": random_model(base, work / "gemma3-270m-random", {}),
        "gemma3-1b": random_model(base, work / "gemma3-1b-random", GEMMA3_1B),
    }
    recipes = {"default": [], "batch64": ["--set", "batch_size=64", "--set", "gradient_accumulation=1"]}
    result["bench"] = {}
    for name, model in models.items():
        for recipe, extra in recipes.items():
            if not gpu and (name, recipe) == ("gemma3-1b", "batch64"):  # ~4 of 13 min on a 2-core CPU
                result["bench"][f"{name}/{recipe}"] = {"skipped": "on a CPU (minutes per step); runs on a GPU"}
                continue
            report = bench(model, data, steps, extra, work / f"bench-{name}-{recipe}.json", 600)
            result["bench"][f"{name}/{recipe}"] = report
            (out / "bench.json").write_text(json.dumps(result["bench"], indent=2))
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print(summarize(result))
    return 0


def summarize(result: dict) -> str:
    lines = [
        f"GPU check on {result['device']} (torch {result['torch']}): doctor exit {result['doctor_exit']}; "
        f"tests: {result.get('gpu_tests', {}).get('summary', 'skipped')}"
    ]
    for name, report in result["bench"].items():
        if "recipes" not in report:
            lines.append(f"{name}: {report.get('error') or report.get('skipped')}")
            continue
        ours, theirs = report["recipes"]["loracls"], report["recipes"]["hf_trainer"]
        mfu = "-" if ours.get("mfu") is None else f"{100 * ours['mfu']:.1f}%"
        memory = ours.get("gpu_peak_memory_mb") or ours["peak_rss_mb"]
        lines.append(
            f"{name}: loracls {ours['tokens_per_second']:.0f} vs HF Trainer {theirs['tokens_per_second']:.0f} "
            f"train tokens/s = {report['ratios']['loracls_vs_hf_trainer']:.2f}x; MFU {mfu}; peak {memory:.0f} MB"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
