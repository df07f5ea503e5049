"""The whole job through the CLI on tiny random decoders (Gemma 3 text with its own head, Gemma 4 text generic)."""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from conftest import synthetic_frame, tiny_overrides, tiny_trainer
from loracls.cli import main


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["gemma3", "gemma4"])
def test_run_directory_layout_and_learning(trained_runs, kind):
    run = trained_runs[kind]
    for name in (
        "config.yaml",
        "env.json",
        "labels.json",
        "train_log.jsonl",
        "metrics.json",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
        "merged/config.json",
        "predictions/test.jsonl",
        "predictions/validation_step00010.jsonl",
    ):
        assert (run / name).exists(), name
    env = json.loads((run / "env.json").read_text())
    for key in ("torch", "torch_hip", "torch_cuda", "transformers", "peft", "device_name", "device_arch"):
        assert key in env
    log = read_jsonl(run / "train_log.jsonl")
    steps = [r for r in log if "loss" in r]
    assert [r["step"] for r in steps][:3] == [5, 10, 15]
    assert all(r["tokens_per_second"] > 0 and r["memory_mb"] > 0 and r["lr"] >= 0 for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert any("validation_accuracy" in r for r in log)
    rows = read_jsonl(run / "predictions" / "validation_step00010.jsonl")
    assert len(rows) == 60 and set(rows[0]) == {"text", "label", "prediction", "probabilities"}
    assert sum(rows[0]["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.75, metrics["test"]["accuracy"]
    assert set(metrics["test"]["per_class"]) == {"neg", "pos"}
    assert sum(map(sum, metrics["test"]["confusion_matrix"]["matrix"])) == 60
    assert metrics["export"]["predictions_equal"] and metrics["export"]["max_probability_difference"] < 1e-4
    assert metrics["validation"]["best_accuracy"] >= 0.75
    assert 0 <= metrics["baseline"]["zero_shot_accuracy"] <= 1 and 0 <= metrics["baseline"]["calibrated_accuracy"] <= 1
    assert len(read_jsonl(run / "predictions" / "baseline_test.jsonl")) == 60
    baseline = json.loads((run / "baseline.json").read_text())
    assert set(baseline) >= {"prompt_template", "verbalizers", "zero_shot", "calibrated"}


@pytest.mark.parametrize("kind", ["gemma3", "gemma4"])
def test_merged_model_loads_with_plain_transformers(trained_runs, kind):
    run = trained_runs[kind]
    merged = run / "merged"
    model = AutoModelForSequenceClassification.from_pretrained(merged, trust_remote_code=(kind == "gemma4")).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged)
    rows = read_jsonl(run / "predictions" / "test.jsonl")
    with torch.no_grad():
        for row in rows[:20]:
            logits = model(**tokenizer(row["text"], return_tensors="pt")).logits
            assert model.config.id2label[int(logits.argmax())] == row["prediction"]
    assert not any("lora" in name for name, _ in model.named_parameters())


def test_reload_evaluate_and_predict(trained_runs, capsys, tmp_path):
    run = trained_runs["gemma3"]
    metrics = json.loads((run / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["accuracy"] == pytest.approx(metrics["test"]["accuracy"])
    test_rows = read_jsonl(run / "predictions" / "test.jsonl")
    assert main(["predict", str(run), "--text", test_rows[0]["text"], "--text", test_rows[1]["text"]]) == 0
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["prediction"] for p in predicted] == [test_rows[0]["prediction"], test_rows[1]["prediction"]]
    for a, b in zip(predicted, test_rows[:2]):
        for label, p in a["probabilities"].items():
            assert p == pytest.approx(b["probabilities"][label], abs=1e-4)
    texts = tmp_path / "texts.txt"
    texts.write_text("great superb film\nawful dull boring plot\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(run), "--file", str(texts), "--out", str(out)]) == 0
    assert [r["prediction"] for r in read_jsonl(out)] == ["pos", "neg"]
    other = tmp_path / "other.csv"
    synthetic_frame(40, seed=5).to_csv(other, index=False)
    assert main(["evaluate", str(run), "--data", str(other)]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 40


def test_early_stopping(gemma3_dir, data_csv, tmp_path):
    args = tiny_overrides(
        gemma3_dir, data_csv, tmp_path, learning_rate=1e-9, patience=2, eval_every=2, merge=False, epochs=2
    )
    assert main(["train", *args]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # stopped `patience` validations (every 2 steps) after the best one, well before the planned 30 steps
    assert metrics["train"]["stopped_early"]
    assert metrics["train"]["steps"] == metrics["validation"]["best_step"] + 2 * 2 < 30
    assert not (tmp_path / "run" / "merged").exists()


def test_input_template_run_records_the_format(gemma3_dir, data_csv, tmp_path, capsys):
    args = tiny_overrides(gemma3_dir, data_csv, tmp_path, epochs=3, baseline=False, input_template="the {text} was")
    assert main(["train", *args]) == 0
    run = tmp_path / "run"
    saved = json.loads((run / "merged" / "loracls_input.json").read_text())
    assert saved["input_template"] == "the {text} was" and saved["max_length"] == 32
    assert saved["decision"]["temperature"] > 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["export"]["predictions_equal"]
    row = read_jsonl(run / "predictions" / "test.jsonl")[0]
    capsys.readouterr()
    assert main(["predict", str(run), "--text", row["text"]]) == 0
    assert json.loads(capsys.readouterr().out)["prediction"] == row["prediction"]


def test_patience_counts_validations_that_improve_neither_accuracy_nor_loss(gemma3_dir, data_csv, tmp_path):
    import numpy as np

    from loracls.problems import Decision, evaluation

    script = []

    def scripted(real, model):
        """The validation split scored with the next scripted probabilities (no model pass)."""
        split = dataset.validation
        return evaluation(split.texts, split.labels, script.pop(0), dataset.id2label, Decision())

    trainer, dataset = tiny_trainer(gemma3_dir, data_csv, tmp_path, scripted, patience=2)
    labels = np.asarray(dataset.validation.labels)

    def probs_with(correct: int, right: float, wrong: float | None = None):
        """`correct` of the 4 examples right with probability `right`, the others wrong with `wrong`."""
        out = np.zeros((4, 2))
        for i, label in enumerate(labels):
            predicted, confidence = (label, right) if i < correct else (1 - label, wrong or right)
            out[i, predicted], out[i, 1 - predicted] = confidence, 1 - confidence
        return out

    script += [
        probs_with(3, 0.6),
        probs_with(3, 0.7),
        probs_with(3, 0.7),
        probs_with(2, 0.99, 0.51),
        probs_with(2, 0.9),
        probs_with(2, 0.9),
    ]
    steps = []
    for step in (10, 20, 30, 40, 50, 60):
        trainer.validate(step)
        stopping = trainer.state.stopping
        steps.append((stopping.best_step, stopping.evals_without_gain, stopping.stopped))
    # 20: same accuracy, lower loss -> the new best; 30: nothing better; 40: lower accuracy but the lowest loss
    # so far -> patience starts again, the best stays; 50, 60: neither -> stop after 2
    assert steps == [(10, 0, False), (20, 0, False), (20, 1, False), (20, 0, False), (20, 1, False), (20, 2, True)]
    assert (tmp_path / "adapter").exists()
    log = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["improved"] for r in log] == [True, True, False, False, False, False] and "validation_loss" in log[0]


def _scripted_trainer(gemma3_dir, data_csv, tmp_path, accuracies, **values):
    """A Trainer whose validations score the next scripted accuracy (4 validation texts: 0.25 steps)."""
    import numpy as np

    from loracls.problems import Decision, evaluation

    def scripted(real, model):
        split, correct = dataset.validation, accuracies.pop(0)
        labels = np.asarray(split.labels)
        probs = np.full((4, 2), 0.4)
        for i, label in enumerate(labels):
            probs[i, label if i < correct else 1 - label] = 0.6
        return evaluation(split.texts, split.labels, probs, dataset.id2label, Decision())

    trainer, dataset = tiny_trainer(gemma3_dir, data_csv, tmp_path, scripted, **values)
    return trainer


@pytest.mark.parametrize(
    "accuracies, extensions, still_improving",
    [
        ([1, 2, 3, 4], 2, True),  # better at every end: two epochs added (the cap), and still improving
        ([1, 2, 3, 3], 2, False),  # the second added epoch brings nothing better: the best stays at step 15
        ([1, 2, 2], 1, False),  # the first added epoch brings nothing better: no second
        ([2, 1, 1, 1], 0, False),  # the plan ends below its best: nothing added
    ],
)
def test_epochs_are_added_while_validation_improves(
    gemma3_dir, data_csv, tmp_path, accuracies, extensions, still_improving
):
    """extend_epochs: at the end of the plan, while the last validation is the best, one more epoch (a
    warm restart at a quarter of the peak learning rate), at most extend_epochs; a run that ends on its
    best validation is flagged."""
    values = dict(epochs=2, eval_every=5, extend_epochs=2, batch_size=4, gradient_accumulation=2, patience=None)
    values["min_steps"] = None
    trainer = _scripted_trainer(gemma3_dir, data_csv, tmp_path, list(accuracies), **values)  # 40 texts: 5 steps/epoch
    result = trainer.fit()
    assert trainer.plan.steps_per_epoch == 5 and trainer.plan.total_steps == 10
    assert result.extensions == extensions and result.steps == 10 + 5 * extensions
    assert result.still_improving is still_improving
    if extensions:  # beyond the plan the learning rate restarts below the peak and decays to zero
        lrs = [g["lr"] for g in trainer.opt.optimizer.param_groups]
        assert all(lr < 0.25 * trainer.config.learning_rate for lr in lrs)


def test_a_still_improving_run_is_said_in_the_log_metrics_and_report(gemma3_dir, data_csv, tmp_path, capsys):
    args = tiny_overrides(gemma3_dir, data_csv, tmp_path, epochs=1, eval_every=1000, baselines=["tfidf"])
    assert main(["train", *args]) == 0  # one validation, at the end: it is the best, so the run ends on it
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train"]["still_improving"] and metrics["train"]["extensions"] == 0
    captured = capsys.readouterr()
    assert "the run may be under-trained" in captured.out + captured.err
    assert main(["report", str(run)]) == 0
    assert "yes: the best validation was the last" in (run / "report.html").read_text()
