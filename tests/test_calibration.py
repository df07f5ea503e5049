"""Temperature scaling, ECE and Brier, and the calibrated probabilities a run writes, predicts and serves."""

import json

import numpy as np
import pytest

from loracls.calibration import brier_score, calibrate, fit_temperature, reliability, softmax
from loracls.cli import main


def test_temperature_undoes_overconfidence():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 1.5, size=(6000, 3))
    labels = [int(rng.choice(3, p=p / p.sum())) for p in softmax(true_logits)]  # float32 sums: renormalised
    assert fit_temperature(3.0 * true_logits, labels) == pytest.approx(3.0, rel=0.1)
    assert fit_temperature(0.5 * true_logits, labels) == pytest.approx(0.5, rel=0.1)
    record = calibrate(3.0 * true_logits[:3000], labels[:3000], 3.0 * true_logits[3000:], labels[3000:])
    assert record.after.ece < record.before.ece and record.after.log_loss < record.before.log_loss
    assert record.after.brier <= record.before.brier


def test_no_temperature_from_a_validation_split_without_errors():
    logits = np.array([[2.0, -1.0], [-1.5, 1.0], [3.0, 0.0], [0.0, 2.5]])
    assert fit_temperature(logits, [0, 1, 0, 1]) is None
    record = calibrate(logits, [0, 1, 0, 1], logits, [0, 1, 1, 1])
    assert record.temperature == 1.0 and "no temperature fitted" in record.note
    assert record.after == record.before


def test_ece_and_brier_on_known_cases():
    perfect = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert reliability(perfect, [0, 1])[0] == 0.0 and brier_score(perfect, [0, 1]) == 0.0
    always_wrong = np.array([[1.0, 0.0], [1.0, 0.0]])
    assert brier_score(always_wrong, [1, 1]) == 2.0 and reliability(always_wrong, [1, 1])[0] == 1.0
    half = np.array([[0.8, 0.2]] * 10)  # 80% confident, right half the time: ECE 0.3
    ece, table = reliability(half, [0] * 5 + [1] * 5)
    assert ece == pytest.approx(0.3) and table.count == [10] and table.accuracy == [0.5]


def test_a_run_is_calibrated_and_predicts_with_its_temperature(trained_runs, capsys):
    run = trained_runs["gemma3"]
    metrics = json.loads((run / "metrics.json").read_text())
    calibration = metrics["calibration"]
    saved = json.loads((run / "adapter" / "loracls_calibration.json").read_text())
    temperature = saved["decision"]["temperature"]
    assert calibration["temperature"] == temperature > 0
    for side in ("before", "after"):
        assert 0 <= calibration[side]["ece"] <= 1 and 0 <= calibration[side]["brier"] <= 2
        assert sum(calibration[side]["reliability"]["count"]) == 60
    exported = json.loads((run / "merged" / "loracls_input.json").read_text())  # one schema
    folded = {**saved["decision"], "temperature": 1.0}  # the temperature is in the exported head's weights
    assert exported == {**saved, "decision": folded}
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "Calibration (test split)" in page and (run / "reliability.png").read_bytes()[:4] == b"\x89PNG"


def test_the_temperature_reaches_predict_from_a_run_and_from_the_merged_model(trained_runs, tmp_path):
    import shutil

    from loracls.inference.engine import Classifier

    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    for saved_at in (run / "adapter" / "loracls_calibration.json", run / "merged" / "loracls_input.json"):
        saved = json.loads(saved_at.read_text())
        saved_at.write_text(json.dumps({**saved, "decision": {**saved["decision"], "temperature": 2.5}}))
    from_run = Classifier(str(run), lambda *a: None)  # the tiny run trained in fp32
    from_merged = Classifier(str(run / "merged"), lambda *a: None, precision="fp32")
    assert from_run.temperature == from_merged.temperature == 2.5
    texts = ["good great film", "awful dull plot"]
    logits = from_run.logits(from_run.encode(texts).ids)
    assert np.allclose(from_run.probabilities(texts), softmax(logits / 2.5), atol=1e-6)
    assert np.allclose(from_run.probabilities(texts), from_merged.probabilities(texts), atol=1e-5)
    negative = {"decision": {"problem": "single_label", "temperature": -1}}
    (run / "adapter" / "loracls_calibration.json").write_text(json.dumps(negative))
    with pytest.raises(Exception, match="temperature must be a positive finite number"):
        Classifier(str(run), lambda *a: None)
