"""Every released model family (tests/families.py: the released top-level class and on-disk layout, tiny and
random) trained end to end: train, predict, evaluate, the merged export read back by plain transformers'
pipeline in a fresh process (same labels, probabilities within 1e-3 of `loracls predict`), and ONNX."""

import asyncio
import json
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from conftest import make_tokenizer, synthetic_frame, tiny_overrides
from families import BY_NAME, FAMILIES, towers_without_backends, write_family
from loracls.cli import main
from loracls.runs import read_config

# hybrid linear-attention decoders: the sequence length cannot stay dynamic; exported padded to max_length
ONNX_PADDED = {"olmo-hybrid", "qwen3.5-moe"}
TEXTS = ["good great film", "awful dull boring plot", "the movie was very lovely", "clumsy messy script"]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family.name: write_family(root / family.name, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def family_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("family_data") / "train.csv"
    synthetic_frame(200).to_csv(path, index=False)
    return path


def family_overrides(model_dir, data, out, **extra):
    values = dict(train_size=100, validation_size=30, test_size=30, epochs=2, eval_every=10, baselines=["tfidf"])
    return tiny_overrides(model_dir, data, out, **{**values, **extra})


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_the_decoder_is_transformers_own(family_dirs, name):
    """The classifier's decoder computes what the released class's own language model computes."""
    from loracls.model.classifier import load_classifier

    family, directory = BY_NAME[name], family_dirs[name]
    notes = []
    loaded = load_classifier(directory, {0: "neg", 1: "pos"}, log=notes.append)
    with towers_without_backends():
        released = getattr(transformers, family.architecture).from_pretrained(str(directory)).eval()
    ids = torch.tensor([[5, 6, 7, 8, 20, 30]])
    with torch.no_grad():
        ours = loaded.model.model(input_ids=ids).last_hidden_state
        theirs = released.get_decoder()(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours, theirs)
    skipped = [line for line in notes if "skipped, never loaded" in line]
    assert bool(skipped) == family.multimodal, notes
    if family.towers:  # the towers the release ships are named as skipped, with their sizes
        assert "never loaded: none" not in skipped[0] and "M)" in skipped[0], skipped


@pytest.fixture(scope="module")
def family_runs(family_dirs, family_data, tmp_path_factory):
    """Every family trained once (train, evaluate, predict), and every merged model read back by transformers'
    pipeline in one fresh process: {name: (run, log, metrics, evaluated, predicted, plain)}."""
    import contextlib
    import io

    results = {}
    for family in FAMILIES:
        out = tmp_path_factory.mktemp(f"run_{family.name}")
        logged = io.StringIO()
        with contextlib.redirect_stdout(logged), contextlib.redirect_stderr(logged):
            code = main(["train", *family_overrides(family_dirs[family.name], family_data, out)])
        assert code == 0, logged.getvalue()[-2000:]
        run = out / "run"
        answers = io.StringIO()
        with contextlib.redirect_stdout(answers):
            assert main(["evaluate", str(run)]) == 0
            assert main(["predict", str(run), *[arg for text in TEXTS for arg in ("--text", text)]]) == 0
        lines = answers.getvalue().splitlines()
        evaluated, predicted = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
        metrics = json.loads((run / "metrics.json").read_text())
        results[family.name] = [run, logged.getvalue(), metrics, evaluated, predicted]
    plain = _pipeline_in_a_fresh_process([results[f.name][0] / "merged" for f in FAMILIES], TEXTS)
    for family, rows in zip(FAMILIES, plain):
        results[family.name].append(rows)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_family_end_to_end(family_runs, capsys, name):
    family = BY_NAME[name]
    run, log, metrics, evaluated, predicted, plain = family_runs[name]
    if family.fused_targets:
        assert "defaults to its fused qkv_proj" in log
    assert metrics["export"]["predictions_equal"] and metrics["export"]["non_finite"] == 0
    assert evaluated["accuracy"] == pytest.approx(metrics["test"]["accuracy"])
    # a user with plain transformers, in a fresh process: the same labels and calibrated probabilities
    for ours, theirs in zip(predicted, plain, strict=True):
        assert max(theirs, key=theirs.get) == ours["prediction"]
        for label, probability in ours["probabilities"].items():
            assert theirs[label] == pytest.approx(probability, abs=1e-3)
    assert not any(key.startswith(("language_model.", "model.language_model.")) for key in _merged_keys(run))
    code = main(["export", str(run), "--format", "onnx"])
    assert code == 0, capsys.readouterr().err
    check = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert check["predictions_equal"] and check["max_probability_difference"] < 1e-3
    assert check["sequence_padded_to"] == (read_config(run).max_length if name in ONNX_PADDED else None)


def _merged_keys(run):
    return load_file(str(run / "merged" / "model.safetensors")).keys()


def _pipeline_in_a_fresh_process(merged_dirs, texts):
    """transformers' text-classification pipeline on each merged model, in one fresh process that imports
    nothing of loracls (`trust_remote_code` only where the export carries the generic head's module)."""
    script = (
        "import json, sys\n"
        "from transformers import pipeline\n"
        "out = []\n"
        "for directory, remote in json.loads(sys.argv[1]):\n"
        "    classify = pipeline('text-classification', model=directory, trust_remote_code=remote, top_k=None)\n"
        "    out.append([{r['label']: r['score'] for r in row} for row in classify(json.loads(sys.argv[2]))])\n"
        "print(json.dumps(out))\n"
    )
    jobs = [(str(m), "auto_map" in json.loads((m / "config.json").read_text())) for m in merged_dirs]
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(jobs), json.dumps(texts)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_serve_classifies_with_a_gemma4_wrapper_run(family_runs):
    from loracls.inference.engine import Classifier
    from loracls.inference.server import create_app

    run, predicted = family_runs["gemma4-e2b"][0], family_runs["gemma4-e2b"][4]
    app = create_app(Classifier(str(run), log=lambda *_: None))

    async def ask():
        async with app.app.router.lifespan_context(app.app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://loracls") as client:
                return await client.post("/classify", json={"input": TEXTS})

    answer = asyncio.run(ask())
    assert answer.status_code == 200
    data = answer.json()["data"]
    assert [item["label"] for item in data] == [row["prediction"] for row in predicted]
    expected = [[row["probabilities"][label] for label in ("neg", "pos")] for row in predicted]
    np.testing.assert_allclose([item["probs"] for item in data], expected, atol=1e-5)


def test_modules_on_a_wrapper_lists_the_language_model_and_the_skipped_towers(family_dirs, capsys):
    assert main(["modules", str(family_dirs["gemma4-e2b"])]) == 0
    out = capsys.readouterr().out
    assert "language model under model.language_model.*" in out and "model.vision_tower" in out
    assert "model.layers.*.self_attn.q_proj" in out and "vision_tower.encoder" not in out.split("\n", 1)[1]
    assert main(["modules", str(family_dirs["phi3"])]) == 0
    assert "takes ['qkv_proj']" in capsys.readouterr().out


def test_written_targets_stay_strict_on_a_fused_layout(family_dirs, family_data, tmp_path, capsys):
    args = family_overrides(family_dirs["phi3"], family_data, tmp_path, target_modules=["q_proj", "v_proj"])
    assert main(["train", *args]) == 2
    assert "match no module" in capsys.readouterr().err and not tmp_path.joinpath("run").exists()


def test_a_wrapper_with_towers_but_no_language_model_is_refused(family_dirs, family_data, tmp_path, capsys):
    import shutil

    broken = tmp_path / "towers_only"
    shutil.copytree(family_dirs["gemma4-e2b"], broken)
    weights = load_file(str(broken / "model.safetensors"))
    kept = {key: value for key, value in weights.items() if ".language_model." not in key}
    save_file(kept, str(broken / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    assert main(["train", *family_overrides(broken, family_data, out)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.match(r"loracls: checkpoint .* holds \d+ of its language model's \d+ weights", last), last
    assert "model.vision_tower" in last
    assert not out.exists()


def test_texts_with_no_tokens_are_refused(family_dirs, family_data, tmp_path, capsys):
    """Qwen3.5's tokenizer class reads a word-level vocabulary as no tokens at all: chance accuracy, silently,
    unless refused at encoding."""
    import shutil

    wrong = tmp_path / "wrong_tokenizer"
    shutil.copytree(family_dirs["qwen3.5-moe"], wrong)
    make_tokenizer().save_pretrained(wrong)
    out = tmp_path / "out"
    assert main(["train", *family_overrides(wrong, family_data, out)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("loracls: data: ") and "texts encode to no tokens, e.g." in last
    assert "does not fit this data" in last
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name, extra", [("gemma3-270m", {}), ("gemma3-270m", {"bidirectional_attention": True})])
def test_mean_pooling_trains_exports_and_reads_back_the_same(family_dirs, family_data, tmp_path, name, extra):
    """pooling: mean (the generic head with MeanPooling's forward, on a family that has transformers' own
    last-token head): trained, and the merged model read back by plain transformers gives the same
    probabilities (its module carries MeanPooling's source)."""
    args = family_overrides(family_dirs[name], family_data, tmp_path, pooling="mean", **extra)
    assert main(["train", *args]) == 0
    run = tmp_path / "run"
    config = json.loads((run / "merged" / "config.json").read_text())
    assert config["loracls_pooling"] == "mean" and "auto_map" in config
    assert config.get("use_bidirectional_attention", False) is bool(extra)
    assert "class MeanPooling" in (run / "merged" / "modeling_loracls_generic.py").read_text()
    assert json.loads((run / "metrics.json").read_text())["export"]["predictions_equal"]
