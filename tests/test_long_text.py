"""Long texts: truncate, head_tail and chunks (windows whose logits are averaged), through train and predict."""

import json
import random

import numpy as np
import pandas as pd
import pytest
from tokenizers import processors

from conftest import NEGATIVE, NEUTRAL, POSITIVE, make_tokenizer, tiny_overrides
from loracls.cli import main
from loracls.data.batching import TextEncoder, encode


def _bos_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tokenizer.convert_tokens_to_ids("<bos>"))]
    )
    return tokenizer


def test_the_three_policies():
    tokenizer = _bos_tokenizer()
    bos = tokenizer.convert_tokens_to_ids("<bos>")
    text = " ".join(str(i) for i in range(40))
    short = "good film"
    truncate = TextEncoder(tokenizer, 16).encode([short, text])
    assert truncate.ids == encode(tokenizer, [short, text], 16) and truncate.long == [False, True]
    assert truncate.owner == [0, 1] and truncate.ids[1][0] == bos and len(truncate.ids[1]) == 16
    head_tail = TextEncoder(tokenizer, 16, long_text="head_tail").encode([short, text])
    words = tokenizer.decode(head_tail.ids[1][1:]).split()
    assert head_tail.ids[1][0] == bos and len(head_tail.ids[1]) == 16
    assert words == [str(i) for i in range(3)] + [str(i) for i in range(28, 40)]  # a quarter head, the rest tail
    chunks = TextEncoder(tokenizer, 16, long_text="chunks", stride=5).encode([short, text])
    assert chunks.owner[0] == 0 and set(chunks.owner[1:]) == {1} and chunks.ids[0] == truncate.ids[0]
    covered = set()
    for row in chunks.ids[1:]:
        assert row[0] == bos and len(row) <= 16
        covered |= set(tokenizer.decode(row[1:]).split())
    assert covered == {str(i) for i in range(40)}
    logits = np.arange(2 * len(chunks.ids), dtype=np.float32).reshape(-1, 2)
    assert np.allclose(chunks.per_text(logits)[1], logits[1:].mean(axis=0))


def test_windows_keep_the_input_template():
    tokenizer = make_tokenizer()
    text = " ".join(str(i) for i in range(30))
    encoded = TextEncoder(tokenizer, 16, "the {text} was", "chunks").encode([text])
    decoded = [tokenizer.decode(row) for row in encoded.ids]
    assert len(decoded) > 2 and all(d.startswith("the ") and d.endswith(" was") for d in decoded)


def _late_sentiment_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """Texts that open with 20 neutral words (more than a 16-token window) before a body of 24 words with four
    sentiment words in it: truncation sees only the opening."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        body = [rng.choice(NEUTRAL) for _ in range(20)]
        for _ in range(4):
            body.insert(rng.randrange(len(body) + 1), rng.choice(POSITIVE if label == "pos" else NEGATIVE))
        rows.append({"text": " ".join([rng.choice(NEUTRAL) for _ in range(20)] + body), "label": label})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def late_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("late") / "late.csv"
    _late_sentiment_frame(500).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory, gemma3_dir, late_csv):
    runs = {}
    for mode in ("truncate", "chunks"):
        out = tmp_path_factory.mktemp(mode)
        args = tiny_overrides(
            gemma3_dir, late_csv, out, max_length=16, long_text=mode, chunk_stride=8, baseline=False, epochs=6
        )
        assert main(["train", *args]) == 0
        runs[mode] = out / "run"
    return runs


@pytest.mark.slow
def test_chunks_see_what_truncation_cuts_off(long_runs):
    accuracy = {
        mode: json.loads((run / "metrics.json").read_text())["test"]["accuracy"] for mode, run in long_runs.items()
    }
    assert accuracy["chunks"] >= 0.85 and accuracy["truncate"] <= 0.75, accuracy
    metrics = json.loads((long_runs["chunks"] / "metrics.json").read_text())
    assert metrics["long_texts"] == {"train": 240, "validation": 60, "test": 60}
    assert any("split into windows (long_text: chunks)" in note for note in metrics["data_notes"])
    assert metrics["export"]["predictions_equal"]


@pytest.mark.slow
def test_predict_and_serve_average_the_windows(long_runs, capsys):
    from loracls.inference.engine import Classifier

    run = long_runs["chunks"]
    rows = [json.loads(x) for x in (run / "predictions" / "test.jsonl").read_text().splitlines()]
    classifier = Classifier(str(run), lambda *a: None)
    assert classifier.long_text == "chunks" and Classifier(str(run / "merged"), lambda *a: None).long_text == "chunks"
    encoded = classifier.encode([rows[0]["text"]])
    assert len(encoded.ids) > 1
    expected = classifier.calibrated(encoded.ids and classifier.logits(encoded.ids).mean(axis=0, keepdims=True))
    capsys.readouterr()
    assert main(["predict", str(run), "--text", rows[0]["text"]]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [got["probabilities"]["neg"], got["probabilities"]["pos"]] == pytest.approx(expected[0].tolist(), abs=1e-5)
    assert got["prediction"] == rows[0]["prediction"]
