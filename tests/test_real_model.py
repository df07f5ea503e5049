"""The real Gemma 3 270M (embedded GGUF -> safetensors cache) on a few dozen Rotten Tomatoes examples."""

import json

import pytest

from loracls.cli import main

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """The default job, cut to a few dozen texts and 4 steps, on the real Gemma 3 270M."""
    tmp_path = tmp_path_factory.mktemp("real")
    args = [
        "train",
        "--set",
        "train_size=48",
        "--set",
        "validation_size=16",
        "--set",
        "test_size=16",
        "--set",
        "max_steps=4",
        "--set",
        "eval_every=2",
        "--set",
        "log_every=2",
        "--set",
        "warmup_steps=1",
        "--set",
        f"output_dir={tmp_path}",
        "--set",
        "run_name=real",
    ]
    assert main(args) == 0
    return tmp_path / "real"


def test_real_gemma3_270m_trains_merges_and_reloads(real_run, capsys):
    run = real_run
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["model"]["hidden_size"] == 640 and metrics["model"]["parameters"] > 250e6
    assert metrics["model"]["lora_modules"] == 36
    assert metrics["train"]["steps"] == 4 and metrics["train"]["tokens_per_second"] > 0
    assert metrics["export"]["predictions_equal"] and metrics["export"]["max_probability_difference"] < 1e-3
    assert metrics["data"]["train"] == {"fresh": 24, "rotten": 24}
    from loracls.model.source import packaged_encoder_installed

    # the default encoder: mpnet-base where install.sh put its wheels (109M parameters), else MiniLM-L6 (22.7M)
    mpnet = packaged_encoder_installed("mpnet-base")
    encoder = {row["name"]: row for row in metrics["verdict"]["rows"]}[
        "encoder mpnet-base" if mpnet else "encoder minilm"
    ]
    low, high = (105e6, 112e6) if mpnet else (22e6, 23.5e6)
    assert low < encoder["parameters"] < high and encoder["texts_per_second"] > 0
    assert len((run / "predictions" / "validation_step00002.jsonl").read_text().splitlines()) == 16
    test_rows = [json.loads(line) for line in (run / "predictions" / "test.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert main(["predict", str(run), "--text", test_rows[0]["text"]]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["prediction"] == test_rows[0]["prediction"]
    assert again["probabilities"]["fresh"] == pytest.approx(test_rows[0]["probabilities"]["fresh"], abs=2e-2)


def test_real_run_distills_into_minilm(real_run, capsys):
    """The run's merged Gemma teaches the embedded MiniLM on 32 of the snippets the splits left out; the student
    is exported, read back, joins the verdict and predicts."""
    from loracls import runs

    assert main(["distill", str(real_run), "--max-unlabeled", "32", "--weights", "1"]) == 0
    record = runs.read_student(real_run)
    assert record.model == "minilm" and record.unlabeled_texts == 32 and record.training_texts == 48
    assert record.export.predictions_equal and 22e6 < record.parameters < 23.5e6
    assert record.texts_per_second > record.teacher_texts_per_second > 0  # 22M parameters against 270M
    assert "student" in [row.name for row in runs.read_metrics(real_run).verdict.rows]
    capsys.readouterr()
    assert main(["predict", str(real_run / runs.STUDENT), "--text", "a warm and funny film"]) == 0
    assert json.loads(capsys.readouterr().out)["prediction"] in ("fresh", "rotten")


def test_real_mpnet_base_from_its_wheels_trains_as_a_baseline(tmp_path, capsys):
    """all-mpnet-base-v2 assembled from its five PyPI wheels (installed by `install.sh`), fine-tuned on a few
    dozen Rotten Tomatoes snippets as the encoder baseline (skipped without the wheels)."""
    from loracls.model.source import packaged_encoder_installed

    if not packaged_encoder_installed("mpnet-base"):
        pytest.skip("the mpnet-base wheels are not installed (bash install.sh installs them unless --no-mpnet)")
    args = ["baseline", "--set", "baselines=[encoder]", "--set", "encoder_model=mpnet-base"]
    for key, value in (("train_size", 48), ("validation_size", 16), ("test_size", 16), ("encoder_epochs", 1)):
        args += ["--set", f"{key}={value}"]
    args += ["--set", "encoder_learning_rate=5e-5", "--set", "max_length=64"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)["encoder"]
    assert record["model"] == "mpnet-base" and record["parameters"] > 100e6
    assert 0.0 <= record["test"]["accuracy"] <= 1.0 and record["texts_per_second"] > 0
