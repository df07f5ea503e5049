"""The verdict's ensemble row (LoRA's and the encoder's calibrated probabilities blended, the weight chosen on
validation only) and the encoder budget (an encoder skipped or stopped early, and the verdict saying so)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import tiny_overrides
from loracls.baselines.encoder import EncoderSkipped, run_encoder
from loracls.baselines.ensemble import blend, fit_ensemble
from loracls.cli import main
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.hardware import Runtime
from loracls.problems import problem_for
from test_encoder_verdict import _config  # the tiny encoder job those tests train

CPU = Runtime(torch.device("cpu"), torch.float32)


def _split(labels):
    return SimpleNamespace(labels=labels)


def _dataset(validation, test, problem="single_label", names=("neg", "pos")):
    return SimpleNamespace(
        kind=problem_for(problem),
        id2label=dict(enumerate(names)),
        validation=_split(validation),
        test=_split(test),
    )


def _complementary(n: int, seed: int):
    """Two models that are each right on a different 70% of the texts, confidently: a blend beats both."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    probs = []
    for shift in (0, n // 2):
        right = np.roll(np.arange(n) < int(0.7 * n), shift)
        p_true = np.where(right, 0.9, 0.4)
        p = np.zeros((n, 2))
        p[np.arange(n), labels] = p_true
        p[np.arange(n), 1 - labels] = 1 - p_true
        probs.append(p)
    return labels.tolist(), probs


def test_a_blend_of_unlike_models_beats_each_and_is_chosen_on_validation():
    labels, (lora, encoder) = _complementary(400, seed=0)
    dataset = _dataset(labels, labels)
    record = fit_ensemble(
        dataset, "accuracy", "mpnet-base", {"validation": lora, "test": lora}, {"validation": encoder, "test": encoder}
    )
    assert record is not None and 0 < record.weight < 1
    alone = [(np.argmax(p, 1) == labels).mean() for p in (lora, encoder)]
    assert record.test.accuracy > max(alone)
    assert set(record.validation_scores) == {f"{w:g}" for w in np.round(np.linspace(0, 1, 21), 2)}
    assert 0 <= record.test_ece <= 1  # single label: the blend's calibration error, a column of the verdict


def test_the_weight_never_sees_the_test_split():
    labels, (lora, encoder) = _complementary(400, seed=1)
    rng = np.random.default_rng(7)
    chosen = []
    for test_labels, test_lora in ((labels, lora), (rng.permutation(labels).tolist(), rng.random((400, 2)))):
        test_lora = test_lora / test_lora.sum(1, keepdims=True)
        record = fit_ensemble(
            _dataset(labels, test_labels),
            "accuracy",
            "m",
            {"validation": lora, "test": test_lora},
            {"validation": encoder, "test": encoder},
        )
        chosen.append((record.weight, record.validation_score))
    assert chosen[0] == chosen[1]  # other test labels and test probabilities: the same weight
    # and other validation data does move it: LoRA right everywhere on validation takes all the weight
    perfect = np.eye(2)[labels] * 0.98 + 0.01
    scores = fit_ensemble(
        _dataset(labels, labels),
        "accuracy",
        "m",
        {"validation": perfect, "test": lora},
        {"validation": encoder, "test": encoder},
    )
    assert scores is None or scores.weight > chosen[0][0]


def test_one_model_alone_is_no_ensemble_row():
    labels, (lora, _) = _complementary(200, seed=2)
    noise = np.full_like(lora, 0.5)  # an encoder that knows nothing: the best weight is LoRA alone
    assert (
        fit_ensemble(
            _dataset(labels, labels),
            "accuracy",
            "m",
            {"validation": lora, "test": lora},
            {"validation": noise, "test": noise},
        )
        is None
    )


def test_multi_label_thresholds_are_refitted_on_the_blend():
    rng = np.random.default_rng(3)
    truth = rng.random((300, 3)) < 0.4
    labels = [[k for k in range(3) if row[k]] for row in truth]
    lora = np.clip(truth * 0.5 + rng.random((300, 3)) * 0.5, 0.01, 0.99)
    encoder = np.clip(truth * 0.5 + rng.random((300, 3)) * 0.5, 0.01, 0.99)
    record = fit_ensemble(
        _dataset(labels, labels, "multi_label", ("a", "b", "c")),
        "macro_f1",
        "m",
        {"validation": lora, "test": lora},
        {"validation": encoder, "test": encoder},
    )
    assert record is not None and len(record.thresholds) == 3
    assert all(0 < t < 1 for t in record.thresholds)
    assert np.allclose(blend(lora, encoder, 0.25), 0.25 * lora + 0.75 * encoder)


def test_the_train_job_writes_an_ensemble_row_it_can_explain(gemma3_dir, data_csv, tmp_path, tiny_encoder_dir):
    out = tmp_path / "out"
    overrides = tiny_overrides(
        gemma3_dir, data_csv, out, encoder_model=str(tiny_encoder_dir), baselines=["encoder"], epochs=2
    )
    assert main(["train", *overrides]) == 0
    run = out / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    rows = {row["name"]: row for row in metrics["verdict"]["rows"]}
    saved = np.load(run / "encoder" / "probabilities.npz")
    assert saved["test"].shape == (60, 2) and np.allclose(saved["test"].sum(1), 1, atol=1e-5)
    if (run / "ensemble.json").is_file():
        ensemble = json.loads((run / "ensemble.json").read_text())
        row = rows[f"ensemble (LoRA + {tiny_encoder_dir})"]
        assert row["accuracy"] == ensemble["test"]["accuracy"] and 0 < ensemble["weight"] < 1
        speeds = rows["LoRA"]["texts_per_second"], rows["encoder"]["texts_per_second"]
        assert row["texts_per_second"] == pytest.approx(1 / (1 / speeds[0] + 1 / speeds[1]))
        assert row["parameters"] == rows["LoRA"]["parameters"] + rows["encoder"]["parameters"]
    else:
        assert not any(name.startswith("ensemble") for name in rows)


def test_an_encoder_over_its_budget_is_skipped_with_the_reason(data_csv, tiny_encoder_dir):
    config = _config(data_csv, tiny_encoder_dir, encoder_budget_s=1e-6)
    with pytest.raises(
        EncoderSkipped,
        match=r"skipped: one epoch on 240 texts is projected at .* beyond "
        r"encoder_budget_s \(1e-06 s\)",
    ):
        run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=lambda *_: None)


def test_an_encoder_that_reaches_its_budget_stops_after_a_whole_epoch(data_csv, tiny_encoder_dir, monkeypatch):
    from loracls.baselines import encoder as module

    config = _config(data_csv, tiny_encoder_dir, encoder_budget_s=1000.0, encoder_epochs=5)
    monkeypatch.setattr(module.EncoderFit, "projected_epoch_seconds", lambda self, batches=3: 1.0)
    clock = iter(range(0, 10**6, 400))  # every reading of the clock 400 s later: one epoch "takes" 400+ s
    monkeypatch.setattr(module.time, "perf_counter", lambda: float(next(clock)))
    logs = []
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=logs.append)
    assert record.budget_stop and record.epochs < 5
    assert any("encoder_budget_s reached" in line for line in logs)


def test_the_verdict_says_which_encoder_its_budget_left_out(gemma3_dir, data_csv, tmp_path, tiny_encoder_dir):
    out = tmp_path / "out"
    overrides = tiny_overrides(
        gemma3_dir,
        data_csv,
        out,
        encoder_model=str(tiny_encoder_dir),
        baselines=["tfidf", "encoder"],
        epochs=2,
        encoder_budget_s=1e-6,
    )
    assert main(["train", *overrides]) == 0
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    assert [row["name"] for row in metrics["verdict"]["rows"]] == ["TF-IDF", "LoRA"]
    assert len(metrics["verdict"]["notes"]) == 1 and "encoder_budget_s" in metrics["verdict"]["notes"][0]
    assert metrics["baseline"]["skipped"][0]["name"] == f"encoder {tiny_encoder_dir}"
    assert not (out / "run" / "encoder.json").exists()


def test_predict_and_evaluate_run_the_ensemble_row(gemma3_dir, data_csv, tmp_path, tiny_encoder_dir, capsys):
    from loracls import runs
    from loracls.inference.loaded import EngineOptions, engine_for

    out = tmp_path / "out"
    overrides = tiny_overrides(
        gemma3_dir, data_csv, out, encoder_model=str(tiny_encoder_dir), baselines=["encoder"], epochs=2
    )
    assert main(["train", *overrides]) == 0
    run = out / "run"
    # the kept encoder is the one the verdict scored: read as a model folder, it gives the saved test probabilities
    from loracls.config_reader import read_run_config

    test_texts = load_dataset(DataSpec.of(read_run_config(run))).test.texts
    saved = np.load(run / "encoder" / "probabilities.npz")["test"]
    assert np.allclose(engine_for(str(run / "encoder")).probabilities(test_texts), saved, atol=1e-4)
    if not (run / "ensemble.json").is_file():  # no blend helped on validation: the engine says so in one line
        assert main(["predict", str(run), "--text", "good", "--engine", "ensemble"]) == 2
        assert "has no ensemble row" in capsys.readouterr().err
        return
    record = runs.read_ensemble(run)
    engine = engine_for(str(run), EngineOptions(engine="ensemble"))
    lora = engine_for(str(run))
    encoder = engine_for(str(run / "encoder"))
    texts = ["good good film", "bad film"]
    blended = record.weight * lora.probabilities(texts) + (1 - record.weight) * encoder.probabilities(texts)
    assert np.allclose(engine.probabilities(texts), blended)
    capsys.readouterr()
    assert main(["evaluate", str(run), "--engine", "ensemble"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["accuracy"] == pytest.approx(record.test.accuracy)  # the verdict's row, computed again
    assert main(["serve", str(run), "--engine", "ensemble", "--port", "0"]) == 2


def test_the_budgets_projection_leaves_training_as_it_was(data_csv, tiny_encoder_dir):
    """The timed batches drop their gradients and put the random state back: a budget that is not reached
    trains exactly what no budget trains."""
    records = []
    for budget in (None, 1e9):
        config = _config(data_csv, tiny_encoder_dir, encoder_budget_s=budget)
        dataset = load_dataset(DataSpec.of(config))
        records.append(run_encoder(dataset, config, CPU, str(tiny_encoder_dir), log=lambda *_: None))
    assert records[0].curve == records[1].curve and records[0].test.accuracy == records[1].test.accuracy
