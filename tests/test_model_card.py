"""The model cards a run writes in adapter/ and merged/ (and distill in student/), read back with
huggingface_hub's ModelCard as the hub reads them."""

from huggingface_hub import ModelCard

from loracls import runs
from loracls.config import EMBEDDED_MODEL
from loracls.inference.model_card import base_model_id


def test_base_model_is_a_hub_id_never_a_local_path(tmp_path):
    assert base_model_id(EMBEDDED_MODEL) == "google/gemma-3-270m"
    assert base_model_id("google/gemma-3-1b-it") == "google/gemma-3-1b-it"
    assert base_model_id("minilm") == "sentence-transformers/all-MiniLM-L6-v2"
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "model").mkdir()
    assert base_model_id(str(tmp_path / "owner" / "model")) is None and base_model_id("./models/x") is None


def test_a_run_writes_cards_the_hub_parses(trained_runs):
    run = trained_runs["gemma3"]
    metrics = runs.read_metrics(run)
    for folder, library in ((runs.ADAPTER, "peft"), (runs.MERGED, "transformers")):
        card = ModelCard.load(run / folder / "README.md")
        assert card.data.library_name == library and card.data.pipeline_tag == "text-classification"
        assert card.data.base_model is None  # the tiny model is a local directory
        assert "loracls" in card.data.tags and "[More Information Needed]" not in card.text
        accuracy = next(r for r in card.data.eval_results if r.metric_type == "accuracy")
        assert accuracy.metric_value == round(metrics.test.accuracy, 4) and accuracy.dataset_split == "test"
        assert metrics.verdict.reason in card.text and "neg, pos" in card.text
        assert f"train {metrics.data['train']['neg'] + metrics.data['train']['pos']}" in card.text
    adapter_card = (run / runs.ADAPTER / "README.md").read_text()
    assert "PeftModel.from_pretrained" in adapter_card and "a LoRA adapter (rsLoRA, r 4)" in adapter_card
    assert 'pipeline("text-classification"' in (run / runs.MERGED / "README.md").read_text()


def test_a_gemma_runs_cards_carry_the_gemma_license_and_runnable_snippets(trained_runs, tmp_path):
    """The merged card's snippet, copied out of the card and run as written in a fresh process, gives what
    `loracls predict` gives within 1e-3, a long text included (cut at the run's max_length, as in training)."""
    import json
    import re
    import subprocess
    import sys

    from loracls.cli import main

    run = trained_runs["gemma3"]
    for folder in (runs.ADAPTER, runs.MERGED):
        card = ModelCard.load(run / folder / "README.md")
        assert card.data.license == "gemma" and card.data.license_link == "https://ai.google.dev/gemma/terms"
        assert "PATH" not in card.text and "BASE" not in card.text
    snippet = re.search(r"```python\n(.*?)```", (run / runs.MERGED / "README.md").read_text(), re.S).group(1)
    texts = ["good good film", " ".join(["bad film"] * 60)]  # the second is far beyond max_length (32)
    program = snippet.replace('["a text"]', json.dumps(texts)) + "import json\nprint(json.dumps(probabilities))\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    out = tmp_path / "p.jsonl"
    assert main(["predict", str(run), *[a for t in texts for a in ("--text", t)], "--out", str(out)]) == 0
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    for row, scores in zip(ours, theirs, strict=True):
        for item in scores:
            assert abs(row["probabilities"][item["label"]] - item["score"]) < 1e-3
    tokenizer_config = json.loads((run / runs.MERGED / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == runs.read_config(run).max_length
