"""bench on a tiny decoder: every recipe runs in its own process and reports comparable numbers."""

import json

from conftest import tiny_overrides
from loracls.cli import main


def test_bench_reports_each_recipe_and_the_ratios(gemma3_dir, data_csv, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["bench", "--steps", "2", "--out", str(out),
            *tiny_overrides(gemma3_dir, data_csv, tmp_path, max_length=64, batch_size=4, gradient_accumulation=2)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["recipes"]) == {"loracls", "seed", "hf_trainer"}
    for name, result in report["recipes"].items():
        assert result["steps"] == 2 and result["tokens_per_second"] > 0 and result["peak_rss_mb"] > 0, name
        assert 0 < result["fma_peak_share"] < 1.5
        assert result["projected_train_minutes"] >= 0
    assert report["recipes"]["seed"]["precision"] == "float32"
    # the seed pads every sequence to max_length: far more work for the same real tokens
    assert report["ratios"]["loracls_vs_seed"] > 1.0
    assert set(report["ratios"]) == {"loracls_vs_seed", "loracls_vs_hf_trainer"}
    printed = capsys.readouterr().out
    assert "loracls_vs_seed" in printed and "FMA peak" in printed


def test_bench_refuses_unknown_recipes(capsys):
    assert main(["bench", "--recipes", "loracls,magic"]) == 2
    assert "unknown recipe" in capsys.readouterr().err
