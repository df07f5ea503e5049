"""benchmarks/bench.py on a tiny decoder: every recipe runs in its own process and reports comparable numbers."""

import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_overrides
from loracls import hardware

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the harness lives outside the package
from bench import main  # noqa: E402

pytestmark = pytest.mark.slow  # whole recipes in subprocesses


def test_fma_peak_doubles_for_bf16_only_where_the_cpu_has_native_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    fp32 = hardware.cpu_fma_peak_flops(torch.float32)
    assert fp32 > 0 and hardware.cpu_fma_peak_flops(torch.bfloat16) == 2 * fp32
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f"})
    assert hardware.cpu_fma_peak_flops(torch.bfloat16) == hardware.cpu_fma_peak_flops(torch.float32) == fp32
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    assert hardware.cpu_fma_peak_flops(torch.float32) == fp32 / 2


def test_gpu_peak_from_the_device_name():
    assert hardware.gpu_peak_flops("NVIDIA H200", torch.bfloat16) == 989e12
    assert hardware.gpu_peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert hardware.gpu_peak_flops("AMD Instinct MI210", torch.float16) == 181e12
    assert hardware.gpu_peak_flops("NVIDIA H200", torch.float32) is None
    assert hardware.gpu_peak_flops("Some Future GPU", torch.bfloat16) is None


def test_bench_reports_each_recipe_and_the_ratios(gemma3_dir, data_csv, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = [
        "--steps",
        "2",
        "--out",
        str(out),
        "--recipes",
        "loracls,seed,hf_trainer,hf_trainer_eager",
        *tiny_overrides(gemma3_dir, data_csv, tmp_path, max_length=64, batch_size=4, gradient_accumulation=2),
    ]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["recipes"]) == {"loracls", "seed", "hf_trainer", "hf_trainer_eager"}
    for name, result in report["recipes"].items():
        assert result["steps"] == 2 and result["tokens_per_second"] > 0 and result["peak_rss_mb"] > 0, name
        assert result["peak_flops"] > 0 and result["mfu"] > 0
        assert result["mfu"] == pytest.approx(
            result["tokens_per_second"] * result["flops_per_token"] / result["peak_flops"]
        )
        assert result["projected_train_minutes"] > 0
    assert report["recipes"]["seed"]["precision"] == "float32"
    # on CPU our loop trains with eager attention; HF Trainer keeps its default unless given eager by hand
    attention = {name: result["attention"] for name, result in report["recipes"].items()}
    assert attention == {"loracls": "eager", "seed": "sdpa", "hf_trainer": "sdpa", "hf_trainer_eager": "eager"}
    ours = report["recipes"]["loracls"]["tokens_per_second"]
    for name in ("seed", "hf_trainer", "hf_trainer_eager"):
        assert report["ratios"][f"loracls_vs_{name}"] == pytest.approx(
            ours / report["recipes"][name]["tokens_per_second"]
        )
    assert set(report["ratios"]) == {"loracls_vs_seed", "loracls_vs_hf_trainer", "loracls_vs_hf_trainer_eager"}
    printed = capsys.readouterr().out
    assert "loracls_vs_seed" in printed and "MFU" in printed


def test_bench_refuses_unknown_recipes(capsys):
    assert main(["--recipes", "loracls,magic"]) == 2
    assert "unknown recipe" in capsys.readouterr().err


def test_bench_full_runs_both_whole_jobs_and_repeats_rounds(gemma3_dir, data_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LORACLS_BENCH_TMP", str(tmp_path / "trainer"))
    out = tmp_path / "bench.json"
    args = [
        "--steps",
        "1",
        "--repeats",
        "2",
        "--recipes",
        "loracls,hf_trainer",
        "--full",
        "--out",
        str(out),
        *tiny_overrides(
            gemma3_dir, data_csv, tmp_path, epochs=2, eval_every=5, patience=2, merge=False, baseline=False
        ),
    ]
    assert main(args) == 0
    report = json.loads(out.read_text())
    for result in report["recipes"].values():
        assert len(result["tokens_per_second_rounds"]) == 2
        assert result["tokens_per_second"] == max(result["tokens_per_second_rounds"])
    for name in ("loracls", "hf_trainer"):
        job = report["full"][name]
        assert 0.0 <= job["test_accuracy"] <= 1.0 and 0.0 <= job["best_validation_accuracy"] <= 1.0, name
        assert 0 < job["steps"] <= 30 and 0 < job["train_seconds"] <= job["wall_seconds"], name
    assert report["ratios"]["whole_job_loracls_vs_hf_trainer"] > 0
    printed = capsys.readouterr().out
    assert "whole job hf_trainer" in printed and "fastest of 2 rounds" in printed
