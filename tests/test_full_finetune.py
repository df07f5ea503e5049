"""`method: full`: every weight of the decoder and head trained in the same loop, with the same checks and
exports as LoRA; AdamW's state sized and refused up front where it cannot fit."""

import json
import shutil

import numpy as np
import pytest

from conftest import tiny_overrides
from loracls import runs
from loracls.cli import main
from loracls.inference.loaded import engine_for
from loracls.model import methods


def test_a_full_run_trains_every_weight_and_exports_like_lora(gemma3_dir, data_csv, tmp_path, capsys):
    out = tmp_path / "out"
    args = tiny_overrides(gemma3_dir, data_csv, out, method="full", full_learning_rate=3e-3, baselines=["tfidf"])
    assert main(["train", *args]) == 0
    err = capsys.readouterr().err
    assert "full fine-tuning: all" in err and "parameters trained" in err
    run = out / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["model"]["trainable_parameters"] == metrics["model"]["parameters"]
    assert metrics["model"]["lora_modules"] == 0
    assert metrics["test"]["accuracy"] >= 0.7, metrics["test"]["accuracy"]  # the synthetic words decide the label
    assert (run / "adapter" / methods.FULL_WEIGHTS).is_file() and not (run / "adapter" / "adapter_config.json").exists()
    assert metrics["export"]["predictions_equal"]  # merged/ (the model itself) checked against the saved weights
    names = [row["name"] for row in metrics["verdict"]["rows"]]
    assert "full fine-tune" in names and "LoRA" not in names
    # read back from the saved weights on a fresh base (no merged/), as predict does without an export
    texts = ["good good film", "bad bad film"]
    merged = engine_for(str(run)).probabilities(texts)
    shutil.rmtree(run / "merged")
    again = engine_for(str(run)).probabilities(texts)
    assert np.allclose(merged, again, atol=1e-4)


def test_full_fine_tuning_that_cannot_fit_is_refused_before_the_run_dir(
    gemma3_dir, data_csv, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(methods, "available_bytes", lambda device: 1024)  # a machine with 1 KiB free
    out = tmp_path / "out"
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, out, method="full")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("loracls: method full: training all") and "use method: lora" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "values, message",
    [
        ({"method": "full", "problem": "label_and_comment"}, "method full trains a classifier head"),
        ({"method": "full", "quantization": "4bit"}, "quantization .QLoRA. is for method lora"),
        ({"method": "everything"}, "method must be one of lora, full"),
    ],
)
def test_full_fine_tuning_settings_that_cannot_work_are_refused(values, message):
    from loracls.config_reader import from_dict
    from loracls.errors import LoraclsError

    with pytest.raises(LoraclsError, match=message):
        from_dict(values)


def test_the_full_methods_weights_must_fit_the_base(gemma3_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    from loracls.errors import LoraclsError
    from loracls.model.classifier import load_classifier

    loaded = load_classifier(gemma3_dir, {0: "neg", 1: "pos"}, log=lambda *_: None)
    folder = tmp_path / "adapter"
    folder.mkdir()
    save_file({"not.a.weight": torch.zeros(2)}, folder / methods.FULL_WEIGHTS)
    assert isinstance(methods.method_of(folder), methods.FullMethod)
    with pytest.raises(LoraclsError, match="does not fit the base model: 1 unknown"):
        methods.method_of(folder).load_onto(loaded.model, folder)
    assert runs.ADAPTER == "adapter"
