"""label_and_comment on the tiny causal LM: the training sequence and its loss mask, the label scorer reading
exactly the tokens trained on, bounded greedy generation, and the data refusals."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import make_tokenizer, synthetic_frame
from loracls.config_reader import load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.errors import LoraclsError
from loracls.files import read_jsonl
from loracls.hardware import Runtime
from loracls.model.generation import Decoding, comments_after_labels, generate
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.problems import IGNORE_INDEX, PROBLEMS, training_sequence

CPU = Runtime(torch.device("cpu"), torch.float32)
PROBLEM = PROBLEMS["label_and_comment"]


@pytest.fixture(scope="module")
def causal_lm(gemma3_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(gemma3_dir).eval()


def _sequence(tokenizer, text="the film was good", word="good", comment="great plot ok", weight=1.0):
    scorer = LabelScorer(None, tokenizer, LabelPrompt("{text} was", [word], 64), 4, CPU)
    prompt = scorer._prompt_ids([text])[0]
    comment_ids = tokenizer(comment, add_special_tokens=False)["input_ids"]
    return (
        prompt,
        scorer.verbalizer_ids[0],
        comment_ids,
        *training_sequence(prompt, scorer.verbalizer_ids[0], [], comment_ids, tokenizer.eos_token_id, weight),
    )


def test_the_prompt_carries_no_loss_and_the_answer_all_of_it():
    tokenizer = make_tokenizer()
    prompt, label, comment, ids, targets = _sequence(tokenizer, weight=2.0)
    assert ids == prompt + label + comment + [tokenizer.eos_token_id]
    assert targets.token_ids[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert targets.token_ids[len(prompt) :] == ids[len(prompt) :]
    assert targets.weights == [0.0] * len(prompt) + [2.0] * len(label) + [1.0] * (len(comment) + 1)
    logits = torch.randn(1, len(ids), len(tokenizer), requires_grad=True)
    loss = PROBLEM.loss(logits, PROBLEM.targets([targets], 0, "cpu"), None, 1)
    loss.backward()
    grad = logits.grad[0].abs().sum(-1)
    # position t predicts token t + 1: the prompt's positions but its last predict prompt tokens: no gradient
    assert torch.all(grad[: len(prompt) - 1] == 0) and torch.all(grad[len(prompt) - 1 : -1] > 0)
    assert grad[-1] == 0  # nothing follows EOS


def test_the_loss_is_the_weighted_mean_over_the_answer_tokens(causal_lm):
    tokenizer = make_tokenizer()
    prompt, label, comment, ids, targets = _sequence(tokenizer)
    with torch.no_grad():
        logits = causal_lm(torch.tensor([ids])).logits
        hf = causal_lm(torch.tensor([ids]), labels=torch.tensor([targets.token_ids])).loss  # transformers' own
    ours = PROBLEM.loss(logits, PROBLEM.targets([targets], 0, "cpu"), None, 1)
    assert ours.item() == pytest.approx(hf.item(), rel=1e-5)
    _, _, _, _, heavy = _sequence(tokenizer, weight=3.0)
    logprobs = torch.log_softmax(logits[0], -1)
    per_token = [-logprobs[t - 1, ids[t]].item() for t in range(len(prompt), len(ids))]
    expected = (3.0 * sum(per_token[: len(label)]) + sum(per_token[len(label) :])) / len(per_token)
    assert PROBLEM.loss(logits, PROBLEM.targets([heavy], 0, "cpu"), None, 1).item() == pytest.approx(expected, rel=1e-5)
    pair = PROBLEM.targets([targets, heavy], 0, "cpu")
    two = PROBLEM.loss(torch.cat([logits, logits]), pair, None, 4)
    assert two.item() == pytest.approx((hf.item() + expected) / 4, rel=1e-5)  # a share of the step's mean


def test_the_label_scorer_reads_the_label_tokens_that_were_trained(causal_lm):
    tokenizer = make_tokenizer()
    words = ["good", "bad"]
    scorer = LabelScorer(causal_lm, tokenizer, LabelPrompt("{text} was", words, 64), 4, CPU)
    text = "the film was good"
    scores = scorer.label_logprobs([text])[0]
    for k, word in enumerate(words):
        prompt, label, comment, ids, targets = _sequence(tokenizer, text=text, word=word)
        with torch.no_grad():
            logprobs = torch.log_softmax(causal_lm(torch.tensor([ids])).logits[0], -1)
        trained = sum(logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(label))
        assert scores[k] == pytest.approx(trained, abs=1e-4)


def _generated_with_eos_at(model, eos: int, call: int, run):
    """`run()` while a forward hook on the LM head makes EOS the most likely token at the `call`-th forward
    pass (a torch hook: nothing of loracls is patched)."""
    calls = {"n": 0}

    def boost(module, inputs, logits):
        calls["n"] += 1
        if calls["n"] >= call:
            logits[..., eos] += 1e4

    handle = model.lm_head.register_forward_hook(boost)
    try:
        return run()
    finally:
        handle.remove()


def test_generation_stops_at_eos_and_at_the_bound(causal_lm):
    tokenizer = make_tokenizer()
    prompts = [tokenizer("the film was")["input_ids"], tokenizer("a long dull plot and the actor")["input_ids"]]
    bounded = generate(causal_lm, tokenizer, prompts, Decoding(3, 2, CPU))
    assert all(n <= 3 for n in bounded.tokens) and len(bounded.texts) == 2
    alone = [generate(causal_lm, tokenizer, [p], Decoding(3, 1, CPU)).texts[0] for p in prompts]
    assert bounded.texts == alone  # batched and left-padded = one at a time
    eos = tokenizer.eos_token_id
    # EOS made the most likely next token from the first forward pass on: generation ends at once
    stopped = _generated_with_eos_at(
        causal_lm, eos, 1, lambda: generate(causal_lm, tokenizer, prompts, Decoding(5, 2, CPU))
    )
    assert stopped.tokens == [0, 0] and stopped.texts == ["", ""]
    # from the third pass on: two tokens, then EOS; the comment is those two, EOS dropped
    two = _generated_with_eos_at(
        causal_lm, eos, 3, lambda: generate(causal_lm, tokenizer, prompts, Decoding(5, 2, CPU))
    )
    assert two.tokens == [2, 2] and all(len(text.split()) == 2 for text in two.texts)


def test_candidates_keep_the_first_beam_that_reads_back_as_the_chosen_label(causal_lm):
    tokenizer = make_tokenizer()
    scorer = LabelScorer(causal_lm, tokenizer, LabelPrompt("{text} was", ["good", "bad"], 64), 4, CPU)
    texts = ["the film was", "a long dull plot", "the actor", "good fun", "bad jokes and", "the story", "it was"]
    texts, chosen = [*texts, "plot and actor"], [1, 0] * 4
    prompts = scorer.answer_prompts(texts, chosen, tokenizer("\n", add_special_tokens=False)["input_ids"])
    beams = generate(causal_lm, tokenizer, prompts, Decoding(4, 6, CPU, beams=3))
    assert len(beams.texts) == 24 and all(n <= 4 for n in beams.tokens)
    kept = comments_after_labels(causal_lm, tokenizer, scorer, texts, chosen, Decoding(4, 6, CPU, beams=3))
    first, agrees = [], []
    for i, label in enumerate(chosen):
        candidates = beams.texts[3 * i : 3 * i + 3]
        read = list(scorer.label_logprobs(candidates).argmax(axis=1))
        assert kept.texts[i] == (candidates[read.index(label)] if label in read else candidates[0])
        first.append(read[0] == label)
        agrees.append(label in read)
    assert sum(agrees) > sum(first)  # these texts exercise the rule: a later beam was kept at least once
    greedy = comments_after_labels(causal_lm, tokenizer, scorer, texts, chosen, Decoding(4, 6, CPU))
    assert greedy.texts == generate(causal_lm, tokenizer, prompts, Decoding(4, 6, CPU)).texts  # one candidate: greedy


# --- data -----------------------------------------------------------------------------------------------


def _frame(n=300):
    frame = synthetic_frame(n)
    frame["why"] = ["the story was " + ("good" if label == "pos" else "bad") for label in frame["label"]]
    return frame


def _config(path, *extra):
    values = ["problem=label_and_comment", "comment_column=why", f"data={path}", "train_size=60"]
    return load_config(None, [*values, "validation_size=20", "test_size=20", *extra])


def test_comments_travel_with_their_texts_through_the_splits(tmp_path):
    path = tmp_path / "d.csv"
    frame = _frame()
    frame.to_csv(path, index=False)
    dataset = load_dataset(DataSpec.of(_config(path)))
    expected = dict(zip(frame["text"], frame["why"]))
    for split in (dataset.train, dataset.validation, dataset.test):
        assert split.comments is not None and len(split.comments) == len(split.texts)
        assert all(expected[t] == c for t, c in zip(split.texts, split.comments))
    assert isinstance(dataset.train.labels[0], int)


@pytest.mark.parametrize(
    "change, extra, message",
    [
        (lambda f: f.drop(columns=["why"]), [], "comment column 'why' not found"),
        (lambda f: f.assign(why=[""] + list(f["why"][1:])), [], "1 empty comment"),
        (lambda f: f.assign(label=['["pos", "neg"]'] + list(f["label"][1:])), [], "one label a text"),
        (lambda f: f, ["comment_column=null"], "needs comment_column"),
        (lambda f: f, ["long_text=chunks"], "long_text: truncate or head_tail"),
    ],
)
def test_bad_label_and_comment_input_is_one_line(tmp_path, change, extra, message):
    path = tmp_path / "d.csv"
    change(_frame()).to_csv(path, index=False)
    with pytest.raises(LoraclsError, match=message):
        load_dataset(DataSpec.of(_config(path, *extra)))


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_processes_train_the_comment_model_as_one_with_double_batch(gemma3_dir, tmp_path, data_parallel):
    """torchrun with 2 processes (gloo) and batch 4 each = one process with batch 8: the same validation at
    every step, the same adapter, the same test labels and comments; the head baseline runs distributed too."""
    import os
    import subprocess

    from safetensors.torch import load_file

    from conftest import tiny_overrides
    from loracls.cli import main
    from test_sweep_resume_scale import PROCESS_LIMIT, _torchrun

    path = tmp_path / "d.csv"
    _frame(300).to_csv(path, index=False)
    common = dict(problem="label_and_comment", comment_column="why", max_comment_tokens=4, epochs=2, eval_every=5)
    common.update(train_size=80, validation_size=20, test_size=20, merge=False, threads=1, lora_dropout=0.0)
    common.update(verbalizers={"neg": "bad", "pos": "good"}, learning_rate=2e-2, baselines=["head"])
    single, double = tmp_path / "single", tmp_path / "double"
    assert main(["train", *tiny_overrides(gemma3_dir, path, single, batch_size=8, **common)]) == 0
    args = tiny_overrides(gemma3_dir, path, double, batch_size=4, data_parallel=data_parallel, **common)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(_torchrun(args), env=env, capture_output=True, text=True, timeout=PROCESS_LIMIT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("fsdp: weights sharded over 2 processes" in result.stdout + result.stderr) == (data_parallel == "fsdp")
    a, b = (json.loads((run / "run" / "metrics.json").read_text()) for run in (single, double))
    assert a["train"]["steps"] == b["train"]["steps"] and a["validation"] == b["validation"]
    assert a["test"]["accuracy"] == b["test"]["accuracy"] and a["comments"]["head_accuracy"] is not None
    wa, wb = (load_file(run / "run" / "adapter" / "adapter_model.safetensors") for run in (single, double))
    # fp32 sums in another order (one batch of 8 against two of 4 all-reduced), and Adam at lr 2e-2 carries
    # the difference: up to 1.3e-5 on an AVX2-only CPU (weights up to 0.23); a process that trained on its half
    # alone would be orders of magnitude off
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)
    rows = [[r["comment"] for r in read_jsonl(run / "run" / "predictions" / "test.jsonl")] for run in (single, double)]
    assert rows[0] == rows[1]


def test_list_cells_from_jsonl_are_refused(tmp_path):
    rows = [{"text": f"t {i}", "label": ["pos"] if i == 3 else "pos", "why": "w"} for i in range(40)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(LoraclsError, match="a label set in column 'label' at row 3"):
        load_dataset(DataSpec.of(_config(path)))


# --- the whole job ----------------------------------------------------------------------------------------


def test_label_and_comment_trains_end_to_end_on_the_tiny_model(gemma3_dir, tmp_path, capsys):
    from conftest import tiny_overrides
    from loracls.cli import main

    path = tmp_path / "d.csv"
    _frame(400).to_csv(path, index=False)
    extra = dict(problem="label_and_comment", comment_column="why", max_comment_tokens=4, epochs=4)
    extra["comment_candidates"] = 2  # beams, the first that reads back as the label kept; the greedy beside
    extra["verbalizers"] = {"neg": "bad", "pos": "good"}  # words the tiny vocabulary has
    extra["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    extra.update(r=8, lora_alpha=16, learning_rate=2e-2)  # a random tiny LM learns its frozen vocabulary slowly
    args = tiny_overrides(gemma3_dir, path, tmp_path, train_size=120, validation_size=40, test_size=40, **extra)
    assert main(["train", *args]) == 0
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    comments = metrics["comments"]
    assert comments["examples"] == 40 and comments["mean_tokens"] <= 4
    assert 0 <= comments["rouge_l"] <= 1 and 0 <= comments["chrf"] <= 100 and 0 <= comments["consistency"] <= 1
    assert metrics["test"]["accuracy"] > 0.5  # the label words are learnable in a few steps
    assert comments["candidates"] == 2 and 0 <= comments["greedy_rouge_l"] <= 1
    assert 0 <= comments["greedy_consistency"] <= 1 and 0 <= comments["reference_consistency"] <= 1
    assert 0 <= comments["zero_shot_accuracy"] <= 1 and 0 <= comments["zero_shot_rouge_l"] <= 1  # untrained
    assert comments["rouge_l"] > comments["zero_shot_rouge_l"]  # the trained comments are the references' kind
    # the classification-head LoRA beside it: its own run inside this one, on the very same test split
    head = run / "head_baseline"
    assert 0 <= comments["head_accuracy"] <= 1 and comments["head_train_seconds"] > 0
    assert json.loads((head / "metrics.json").read_text())["test"]["accuracy"] == comments["head_accuracy"]
    head_texts = [row["text"] for row in read_jsonl(head / "predictions" / "test.jsonl")]
    assert head_texts == [row["text"] for row in read_jsonl(run / "predictions" / "test.jsonl")]
    rows = read_jsonl(run / "predictions" / "test.jsonl")
    assert {"text", "label", "prediction", "probabilities", "comment", "reference_comment"} <= set(rows[0])
    assert all(row["prediction"] in ("neg", "pos") for row in rows)  # scored, never sampled: always a label
    assert (run / "adapter" / "adapter_model.safetensors").exists() and not (run / "checkpoint.pt").exists()
    export = metrics["export"]  # the merged causal LM, checked against the adapter
    assert export["predictions_equal"] and export["comments_equal"] >= 0.9 and (run / "merged" / "config.json").exists()
    merged_format = json.loads((run / "merged" / "loracls_input.json").read_text())
    assert merged_format == json.loads((run / "adapter" / "loracls_calibration.json").read_text())
    saved = json.loads((run / "adapter" / "loracls_calibration.json").read_text())
    assert saved["decision"]["problem"] == "label_and_comment" and saved["decision"]["temperature"] > 0
    # predict from the run: the same label probabilities as the test split's, and a comment after the label
    capsys.readouterr()
    assert main(["predict", str(run), "--text", rows[0]["text"], "--text", rows[1]["text"]]) == 0
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row, again in zip(rows, predicted):
        assert again["prediction"] == row["prediction"] and again["comment"] == row["comment"]
        assert again["probabilities"] == pytest.approx(row["probabilities"], abs=1e-5)
    assert main(["evaluate", str(run)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["accuracy"] == metrics["test"]["accuracy"]
    _served_comments_are_predicts(run, rows[:2], predicted)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "Comments (test split)" in page and page.count("<tr>") >= 20 and rows[0]["reference_comment"] in page
    assert "classification-head LoRA (same split)" in page and "consistency of the greedy comments" in page


def _served_comments_are_predicts(run, rows, predicted):
    """`serve`'s /classify (in-process) gives each text the label and comment `predict` gave, and /info says
    the problem type."""
    from loracls.inference.commenter import Commenter
    from test_serve_contract import ask

    texts = [row["text"] for row in rows]
    requests = [
        ("POST", "/classify", {"input": texts}),
        ("GET", "/info", None),
        ("POST", "/generate", {"inputs": texts}),
        ("POST", "/generate", {"inputs": texts, "model": "another"}),  # /generate picks its run like the others
    ]
    classify, info, generated, elsewhere = ask(Commenter(str(run), lambda *a: None), requests)
    assert elsewhere.status_code == 404 and elsewhere.json()["error_type"] == "NotFound"
    assert classify.status_code == 200 and info.json()["problem"] == "label_and_comment"
    assert generated.status_code == 200
    for item, again in zip(generated.json(), predicted):
        assert item["label"] == again["prediction"] and item["comment"] == again["comment"]
    for item, again in zip(classify.json()["data"], predicted):
        assert item["label"] == again["prediction"] and item["comment"] == again["comment"]
        assert item["probs"] == pytest.approx(list(again["probabilities"].values()), abs=1e-5)


@pytest.mark.slow
def test_a_bf16_run_exports_the_adapter_merged_into_the_fp32_base(gemma3_dir, tmp_path):
    """Under bf16 autocast the frozen weights are stored in bf16 while training; the export merges the saved
    adapter into a fresh fp32 base and checks it against that adapter in fp32."""
    from safetensors import safe_open

    from conftest import tiny_overrides
    from loracls.cli import main

    path = tmp_path / "d.csv"
    _frame(400).to_csv(path, index=False)
    extra = dict(problem="label_and_comment", comment_column="why", max_comment_tokens=4, epochs=2, precision="bf16")
    extra.update(verbalizers={"neg": "bad", "pos": "good"}, learning_rate=2e-2, baseline=False, merge=True)
    args = tiny_overrides(gemma3_dir, path, tmp_path, train_size=120, validation_size=40, test_size=40, **extra)
    assert main(["train", *args]) == 0
    run = tmp_path / "run"
    export = json.loads((run / "metrics.json").read_text())["export"]
    assert export["predictions_equal"] and export["dtype"] == "fp32" and export["comments_equal"] == 1.0
    with safe_open(str(run / "merged" / "model.safetensors"), "pt") as weights:
        assert {str(weights.get_slice(name).get_dtype()) for name in weights.keys()} == {"F32"}


def test_a_killed_label_and_comment_run_resumes_to_the_same_result(gemma3_dir, tmp_path):
    from test_sweep_resume_scale import straight_and_resumed

    path = tmp_path / "d.csv"
    _frame(400).to_csv(path, index=False)
    common = dict(problem="label_and_comment", comment_column="why", max_comment_tokens=4, epochs=4, eval_every=5)
    common.update(train_size=120, validation_size=40, test_size=40, baseline=False, merge=False, threads=1)
    common.update(verbalizers={"neg": "bad", "pos": "good"}, lora_dropout=0.1, learning_rate=2e-2)
    straight, killed = straight_and_resumed(gemma3_dir, path, tmp_path, **common)
    a, b = (json.loads((run / "metrics.json").read_text())["comments"] for run in (straight, killed))
    for key in ("rouge_l", "chrf", "consistency", "mean_tokens"):
        assert a[key] == b[key], key
    rows = [[row["comment"] for row in read_jsonl(run / "predictions" / "test.jsonl")] for run in (straight, killed)]
    assert rows[0] == rows[1]
