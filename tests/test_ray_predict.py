"""`predict --engine ray`: Ray Data over a pool of 2 actors on a local Ray started and stopped inside the test
(no network), giving the same rows and labels as the local engine, in input order. Skipped only where Ray
cannot import (the `ray` extra is not installed)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from loracls.cli import main
from test_bad_input import one_line_error

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'loracls[ray]'")


@pytest.mark.slow
def test_ray_predict_equals_the_local_engine(trained_runs, tmp_path, capsys):
    run = str(trained_runs["gemma3"])
    texts = [f"{'good great' if i % 3 else 'bad dull'} film number {i}" for i in range(90)]
    source = tmp_path / "in.csv"
    pd.DataFrame({"text": texts, "id": range(90)}).to_csv(source, index=False)
    out = tmp_path / "scored"
    args = ["predict", run, "--file", str(source), "--out", str(out), "--engine", "ray", "--workers", "2"]
    assert main([*args, "--chunk-rows", "16"]) == 0
    assert not ray.is_initialized()  # the local Ray it started is stopped
    table = pd.read_parquet(out)
    local = tmp_path / "local.jsonl"
    assert main(["predict", run, "--file", str(source), "--out", str(local)]) == 0
    expected = [json.loads(line) for line in local.read_text().splitlines()]
    assert list(table["text"]) == texts  # input order
    assert list(table["prediction"]) == [row["prediction"] for row in expected]
    for got, row in zip(table["probabilities"], expected):
        assert got == pytest.approx(row["probabilities"], abs=1e-5)


def test_ray_predict_refusals_are_one_line_before_ray_starts(trained_runs, tmp_path, capsys):
    run = str(trained_runs["gemma3"])
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"text": ["fine", " ", "ok"], "id": [1, 2, 3]}).to_csv(bad, index=False)
    text = tmp_path / "in.txt"
    text.write_text("one\ntwo\n")
    cases = [
        (["--file", str(bad), "--out", str(tmp_path / "o")], "1 empty text(s)"),
        (["--file", str(text), "--out", str(tmp_path / "o")], "--engine ray reads .csv"),
        (["--text", "fine"], "give --file IN and --out DIR"),
    ]
    for extra, message in cases:
        assert message in one_line_error(["predict", run, *extra, "--engine", "ray"], capsys)
    assert "--engine ray scores a file" in one_line_error(["evaluate", run, "--engine", "ray"], capsys)
    assert not ray.is_initialized() and not (tmp_path / "o").exists()
