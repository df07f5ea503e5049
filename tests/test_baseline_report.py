import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import make_tokenizer, synthetic_frame
from loracls.baselines.zero_shot import calibrate, prompt_setup
from loracls.cli import main
from loracls.config_reader import load_config
from loracls.errors import LoraclsError
from loracls.hardware import Runtime
from loracls.model.label_scoring import LabelPrompt
from loracls.model.label_scoring import LabelScorer as ZeroShotScorer


def test_calibration_removes_the_prompt_bias():
    # the prompt alone prefers label 0 three to one; content-free inputs reveal it
    scores = np.log(np.array([[0.8, 0.2], [0.7, 0.3], [0.6, 0.4]]))
    content_free = np.log(np.array([[0.75, 0.25], [0.75, 0.25]]))
    calibrated = calibrate(scores, content_free)
    assert calibrated.argmax(1).tolist() == [0, 1, 1]
    assert np.allclose(calibrated.sum(1), 1.0)


def test_scores_are_exact_log_probabilities_despite_left_padding(gemma3_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma3_dir).eval()
    tokenizer = make_tokenizer()
    runtime = Runtime(torch.device("cpu"), torch.float32)
    scorer = ZeroShotScorer(model, tokenizer, LabelPrompt("{text} was", ["good", "very good"], 64), 4, runtime)
    assert [len(v) for v in scorer.verbalizer_ids] == [1, 2]
    texts = ["the film", "a very long boring plot and the actor was dull"]
    scores = scorer.label_logprobs(texts)
    for row, text in enumerate(texts):
        for column, continuation in enumerate(scorer.verbalizer_ids):
            ids = tokenizer(f"{text} was")["input_ids"] + continuation
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
            expected = sum(logprobs[len(ids) - len(continuation) - 1 + k, t].item() for k, t in enumerate(continuation))
            assert scores[row, column] == pytest.approx(expected, abs=1e-4)


def test_prompt_setup_defaults_and_refusals():
    config = load_config()
    template, words = prompt_setup(config, {0: "fresh", 1: "rotten"})
    assert words == ["positive", "negative"] and "{text}" in template
    custom = load_config(None, ["data=x.csv", "verbalizers={a: alpha}"])
    assert prompt_setup(custom, {0: "a", 1: "b"})[1] == ["alpha", "b"]
    with pytest.raises(LoraclsError, match="must contain {text}"):
        prompt_setup(load_config(None, ["prompt_template=no slot"]), {0: "a", 1: "b"})


def test_baseline_command(gemma3_dir, data_csv, tiny_encoder_dir, capsys):
    args = [
        "baseline",
        "--set",
        f"model={gemma3_dir}",
        "--set",
        f"data={data_csv}",
        "--set",
        "train_size=100",
        "--set",
        "validation_size=20",
        "--set",
        "test_size=40",
        "--set",
        "precision=fp32",
        "--set",
        f"encoder_model={tiny_encoder_dir}",
        "--set",
        "encoder_epochs=1",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["zero_shot"]["examples"] == 40 and result["verbalizers"] == {"neg": "neg", "pos": "pos"}
    assert len(result["content_free_probabilities"]) == 2
    assert result["tfidf"]["test"]["examples"] == 40 and result["encoder"]["test"]["examples"] == 40
    assert result["encoder"]["epochs"] == 1 and result["skipped"] == {}


def test_report_html_and_pngs(trained_runs, capsys):
    run = trained_runs["gemma3"]
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    for text in (
        "Does the LLM pay for itself?",
        "zero-shot, calibrated",
        "TF-IDF",
        "encoder",
        "Verdict: ship",
        "validation accuracy",
        "Most confident mistakes",
        "Environment",
        "transformers",
        "curves.png",
        "confusion.png",
    ):
        assert text in page, text
    for name in ("curves.png", "confusion.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((run / "metrics.json").read_text())
    assert f"{metrics['test']['accuracy']:.4f}" in page
    tfidf = json.loads((run / "tfidf.json").read_text())
    assert (
        f"{tfidf['test']['accuracy']:.4f}" in page
        and metrics["baseline"]["tfidf_accuracy"] == tfidf["test"]["accuracy"]
    )


def test_report_refuses_an_unfinished_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a finished loracls run" in capsys.readouterr().err


def test_multiclass_baseline_and_report(gemma3_dir, tmp_path, capsys):
    from conftest import tiny_overrides

    classes = {"pos": ["good", "great", "superb"], "neg": ["bad", "awful", "dull"], "mid": ["ok", "meh", "so-so"]}
    data = tmp_path / "three.parquet"
    synthetic_frame(300, classes=classes).to_parquet(data)
    args = tiny_overrides(gemma3_dir, data, tmp_path, train_size=180, validation_size=60, test_size=60, epochs=5)
    assert main(["train", *args]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test"]["confusion_matrix"]["labels"] == ["mid", "neg", "pos"]
    assert metrics["test"]["accuracy"] > 0.7
    baseline = json.loads((tmp_path / "run" / "baseline.json").read_text())
    assert len(baseline["content_free_probabilities"]) == 3
    assert main(["report", str(tmp_path / "run")]) == 0


def test_zero_shot_cost_is_one_pass_per_batch_whatever_the_number_of_labels(gemma3_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma3_dir).eval()
    calls = {"n": 0}
    forward = model.forward

    def counting(*args, **kwargs):
        calls["n"] += 1
        return forward(*args, **kwargs)

    model.forward = counting
    runtime = Runtime(torch.device("cpu"), torch.float32)
    texts = [f"the film {i} was" for i in range(10)]
    six_words = LabelPrompt("{text}", ["good", "bad", "ok", "meh", "dull", "fine"], 64)
    six = ZeroShotScorer(model, make_tokenizer(), six_words, 4, runtime)
    assert six.label_logprobs(texts).shape == (10, 6) and calls["n"] == 3  # ceil(10 / 4) batches
    calls["n"] = 0
    two_tokens = ZeroShotScorer(model, make_tokenizer(), LabelPrompt("{text}", ["good", "very good"], 64), 4, runtime)
    two_tokens.label_logprobs(texts)
    assert calls["n"] == 6  # the prompts once, plus one short continuation pass for the two-token label


def test_tfidf_baseline_learns_and_keeps_every_label(tmp_path):
    from loracls.baselines.tfidf import C_GRID, run_tfidf
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset

    path = tmp_path / "d.csv"
    synthetic_frame(400).to_csv(path, index=False)
    config = load_config(
        None,
        [
            f"data={path}",
            "train_size=200",
            "validation_size=60",
            "test_size=60",
            "labels=[neg, pos, other]",
            "balance=false",
        ],
    )
    record = run_tfidf(load_dataset(DataSpec.of(config)), seed=0, log=lambda *a: None)
    assert record.c in C_GRID and record.features > 0 and record.seconds > 0
    assert record.test.accuracy >= 0.9 and record.validation_accuracy >= 0.9
    assert record.test.per_class["other"].support == 0 and record.test.confusion_matrix.labels == [
        "neg",
        "pos",
        "other",
    ]
