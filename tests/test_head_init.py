"""head_init: verbalizer makes step 0 the zero-shot classifier; zero and random as asked."""

import json

import torch
import yaml
from transformers import AutoModelForCausalLM

from conftest import tiny_overrides
from loracls.cli import main
from loracls.model.classifier import HeadSpec, init_head_from_verbalizers, load_classifier


def test_a_verbalizer_head_computes_the_prompts_label_logits(gemma3_dir):
    loaded = load_classifier(gemma3_dir, {0: "neg", 1: "pos"}, log=lambda *a: None)
    tokenizer = loaded.tokenizer
    words = ["bad", "good"]
    token_ids = [tokenizer(" " + w, add_special_tokens=False)["input_ids"][0] for w in words]
    init_head_from_verbalizers(loaded.model, gemma3_dir, token_ids)
    causal = AutoModelForCausalLM.from_pretrained(gemma3_dir).eval()
    for prompt in ("the film was", "a dull plot and the actor was very"):
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            classifier_logits = loaded.model(input_ids=ids).logits[0]
            lm_logits = causal(input_ids=ids).logits[0, -1, token_ids]
        assert torch.allclose(classifier_logits, lm_logits, atol=1e-4), (classifier_logits, lm_logits)


def test_zero_and_random_heads(gemma3_dir):
    zero = load_classifier(gemma3_dir, {0: "a", 1: "b"}, log=lambda *a: None)
    assert torch.count_nonzero(zero.model.score.weight) == 0
    random = load_classifier(gemma3_dir, {0: "a", 1: "b"}, log=lambda *a: None, head=HeadSpec(init="random"))
    assert torch.count_nonzero(random.model.score.weight) > 0


def test_a_run_with_a_verbalizer_head_reads_the_prompt(gemma3_dir, data_csv, tmp_path, capsys):
    args = tiny_overrides(
        gemma3_dir,
        data_csv,
        tmp_path,
        head_init="verbalizer",
        epochs=2,
        baseline=False,
        verbalizers={"neg": "bad", "pos": "good"},
    )
    assert main(["train", *args]) == 0
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["head_init"] == "verbalizer" and "Answer with one of: bad, good." in config["input_template"]
    assert "head: initialised from the LM head rows of the verbalizers bad, good" in capsys.readouterr().err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["export"]["predictions_equal"]
