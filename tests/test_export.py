"""Export routes, each checked against torch: ONNX (onnxruntime), a bf16 merged model, and their refusals."""

import json
import re
import shutil

import pytest

from conftest import tiny_overrides
from loracls.cli import main


@pytest.fixture
def run_copy(trained_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    return run


@pytest.mark.slow
def test_onnx_export_matches_pytorch(run_copy, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert main(["export", str(run_copy), "--format", "onnx"]) == 0
    check = json.loads(capsys.readouterr().out)
    assert check["examples"] == 60 and check["max_probability_difference"] < 1e-3 and check["disagreements"] == 0
    assert check["format"] == "onnx" and check["predictions_equal"]
    assert check["texts_per_second"] > 0 and check["reference_texts_per_second"] > 0
    folder = run_copy / "onnx"
    assert (folder / "model.onnx").is_file() and (folder / "tokenizer.json").is_file()
    assert json.loads((folder / "labels.json").read_text()) == {"0": "neg", "1": "pos"}
    assert json.loads((folder / "export_check.json").read_text()) == check
    # a plain onnxruntime user: tokenizer + model file, nothing of loracls
    import numpy as np
    import onnxruntime
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    encoded = tokenizer(["great superb film", "awful dull boring plot"], padding=True, return_tensors="np")
    logits = session.run(
        None,
        {
            "input_ids": encoded["input_ids"].astype(np.int64),
            "attention_mask": encoded["attention_mask"].astype(np.int64),
        },
    )[0]
    assert logits.argmax(1).tolist() == [1, 0]
    # a second export is refused until --force, which replaces the export (never some other folder)
    assert main(["export", str(run_copy), "--format", "onnx"]) == 2
    assert "add --force to replace it" in capsys.readouterr().err
    assert main(["export", str(run_copy), "--format", "onnx", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["disagreements"] == 0
    assert not [p.name for p in run_copy.glob(".onnx.*")]
    other = run_copy / "predictions"
    assert main(["export", str(run_copy), "--format", "onnx", "--force", "--out", str(other)]) == 2
    assert "not an ONNX export" in capsys.readouterr().err and (other / "test.jsonl").is_file()


def test_onnx_exporter_failure_is_one_line_and_leaves_nothing(run_copy, monkeypatch, capsys):
    pytest.importorskip("onnxscript")
    import torch

    def cannot(*args, **kwargs):
        raise RuntimeError("Found <class 'DynamicCache'> in output, which is not a known type\nmore")

    monkeypatch.setattr(torch.onnx, "export", cannot)
    assert main(["export", str(run_copy), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loracls: the ONNX exporter") and "RuntimeError: Found <class 'DynamicCache'>" in err[-1]
    assert not (run_copy / "onnx").exists()


def test_an_onnx_graph_with_fixed_input_axes_is_not_kept(run_copy, monkeypatch, capsys):
    """An exporter that fixes the batch and sequence axes at the example's shape (which no padding inside the
    graph can undo) makes a graph that fails on every other input: refused, nothing written."""
    pytest.importorskip("onnxscript")
    import torch

    from loracls.inference import onnx_export

    def static(model, example, longest, pad_to, pad_id):
        return torch.export.export(onnx_export._Logits(model).eval(), (), kwargs=example, strict=False)

    monkeypatch.setattr(onnx_export, "_program", static)
    assert main(["export", str(run_copy), "--format", "onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        r"loracls: the ONNX exporter fixed input_ids's batch at 2, input_ids's sequence at \d+, .*"
        r"\(it cannot keep them dynamic\); not kept",
        err[-1],
    ), err[-1]
    assert not (run_copy / "onnx").exists() and not list(run_copy.glob(".onnx*"))


def test_bf16_merged_model_is_half_the_size_and_checked(run_copy, capsys):
    before = (run_copy / "merged" / "model.safetensors").stat().st_size
    assert main(["export", str(run_copy), "--format", "merged", "--dtype", "bf16"]) == 0
    check = json.loads(capsys.readouterr().out)
    assert check["dtype"] == "bf16" and check["predictions_equal"] and check["examples"] == 60
    assert 0 < check["max_probability_difference"] < 5e-2
    after = (run_copy / "merged" / "model.safetensors").stat().st_size
    assert after < 0.6 * before
    metrics = json.loads((run_copy / "metrics.json").read_text())
    assert metrics["export"] == check
    assert main(["predict", str(run_copy), "--text", "great superb film"]) == 0


def test_merge_dtype_in_the_train_job(gemma3_dir, data_csv, tmp_path):
    args = tiny_overrides(gemma3_dir, data_csv, tmp_path, epochs=2, baseline=False, merge_dtype="bf16")
    assert main(["train", *args]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["export"]["dtype"] == "bf16" and metrics["export"]["predictions_equal"]
    config = json.loads((tmp_path / "run" / "merged" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


def test_export_refusals(run_copy, capsys):
    assert main(["export", str(run_copy), "--format", "onnx", "--dtype", "bf16"]) == 2
    assert "writes fp32" in capsys.readouterr().err
    assert main(["export", str(run_copy.parent / "nowhere"), "--format", "merged"]) == 2
    assert "not a finished loracls run" in capsys.readouterr().err


@pytest.mark.slow
def test_int8_onnx_export_is_checked_against_fp32(run_copy, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert main(["export", str(run_copy), "--format", "onnx", "--quantize", "int8"]) == 0
    fp32, int8 = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert fp32["dtype"] == "fp32" and fp32["predictions_equal"]
    assert int8["dtype"] == "int8" and int8["examples"] == fp32["examples"] == 60
    assert int8["file"].endswith("model.int8.onnx") and (run_copy / "onnx" / "model.int8.onnx").is_file()
    assert (
        0 <= int8["accuracy"] <= 1
        and int8["reference_accuracy"] == json.loads((run_copy / "metrics.json").read_text())["test"]["accuracy"]
    )  # fp32 PyTorch on the test split: the run's own figure
    assert json.loads((run_copy / "onnx" / "export_check.int8.json").read_text()) == int8
    # the int8 weights are smaller than the fp32 ones (the embeddings stay fp32, so not 4x)
    folder = run_copy / "onnx"
    fp32_bytes = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
    assert sum(p.stat().st_size for p in folder.glob("model.int8.onnx*")) < fp32_bytes
    # the exports as engines: evaluate, predict and serve run them through onnxruntime
    capsys.readouterr()
    assert main(["evaluate", str(run_copy), "--engine", "onnx-int8"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["accuracy"] == int8["accuracy"]
    texts = ["great superb film", "awful dull boring plot"]
    rows = {}
    for engine in ("torch", "onnx", "onnx-int8"):
        assert main(["predict", str(run_copy), "--engine", engine, *[a for t in texts for a in ("--text", t)]]) == 0
        rows[engine] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for torch_row, onnx_row in zip(rows["torch"], rows["onnx"]):
        assert onnx_row["prediction"] == torch_row["prediction"]
        assert onnx_row["probabilities"] == pytest.approx(torch_row["probabilities"], abs=1e-3)
    assert [set(r["probabilities"]) for r in rows["onnx-int8"]] == [{"neg", "pos"}] * 2
    from loracls.inference.onnx_engine import OnnxClassifier
    from test_serve_contract import ask

    (answer,) = ask(OnnxClassifier(str(run_copy), lambda *a: None), [("POST", "/classify", {"input": texts})])
    assert answer.status_code == 200
    assert [item["label"] for item in answer.json()["data"]] == [r["prediction"] for r in rows["onnx"]]


def test_a_failed_export_check_leaves_the_previous_export_in_place(run_copy, monkeypatch, capsys):
    """The merged export is checked in staging: after a failed check the old merged/ is untouched."""
    import hashlib

    import numpy as np

    def digest():
        return hashlib.sha256((run_copy / "merged" / "model.safetensors").read_bytes()).hexdigest()

    before = digest()

    def nan_probabilities(directory, ids):
        return np.full((len(ids), 2), np.nan, dtype=np.float32)

    monkeypatch.setattr("loracls.inference.plain_check.plain_probabilities", nan_probabilities)
    assert main(["export", str(run_copy), "--format", "merged", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "gives NaN or inf on 60 of 60 test texts read by plain transformers" in err, err
    assert "nothing was replaced" in err and digest() == before
    assert not [p.name for p in run_copy.glob(".merged*")]
