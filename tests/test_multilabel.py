"""problem: multi_label — label sets in, sigmoid + BCE, per-label thresholds, set metrics, the whole path."""

import json
import random

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import f1_score

from conftest import NEGATIVE, NEUTRAL, POSITIVE, tiny_overrides
from loracls.cli import main
from loracls.config_reader import load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import class_weight_vector, load_dataset
from loracls.errors import LoraclsError
from loracls.problems import PROBLEMS, Decision, multi_hot, tune_thresholds

GROUPS = {"pos": POSITIVE, "neg": NEGATIVE, "meh": ["ok", "meh", "neutral"]}


def label_sets_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """Each text carries the words of 0-3 groups; its label set names those groups."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        labels = sorted(rng.sample(list(GROUPS), rng.choice([0, 1, 1, 2, 2, 3])))
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 8))] + [str(i)]
        for label in labels:
            words.insert(rng.randrange(len(words) + 1), rng.choice(GROUPS[label]))
        rows.append({"text": " ".join(words), "label": labels})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def sets_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("multilabel") / "sets.jsonl"
    label_sets_frame(400).to_json(path, orient="records", lines=True)
    return path


def _config(path, **values):
    values = {
        "data": str(path),
        "problem": "multi_label",
        "train_size": 200,
        "validation_size": 60,
        "test_size": 60,
        **values,
    }
    return load_config(None, [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in values.items()])


def test_label_cells_lists_separators_and_json_text(sets_jsonl, tmp_path):
    frame = label_sets_frame(400)
    listed = load_dataset(DataSpec.of(_config(sets_jsonl)))
    assert listed.problem == "multi_label" and listed.id2label == {0: "meh", 1: "neg", 2: "pos"}
    separated = tmp_path / "sets.csv"
    frame.assign(label=frame.label.map("|".join)).to_csv(separated, index=False)
    by_separator = load_dataset(DataSpec.of(_config(separated, label_separator="|")))
    as_json_text = tmp_path / "json_cells.csv"
    frame.assign(label=frame.label.map(json.dumps)).to_csv(as_json_text, index=False)
    by_json = load_dataset(DataSpec.of(_config(as_json_text)))
    for dataset in (by_separator, by_json):  # the same sets, the same seeded split
        assert dataset.test.texts == listed.test.texts and dataset.test.labels == listed.test.labels
    assert all(labels == sorted(set(labels)) for labels in listed.train.labels)
    assert any(labels == [] for labels in listed.train.labels)  # an empty set is a valid answer
    counts = listed.class_counts()["train"]
    assert counts["pos"] == sum(2 in labels for labels in listed.train.labels)


def test_splits_keep_the_proportions_of_label_sets(sets_jsonl):
    dataset = load_dataset(DataSpec.of(_config(sets_jsonl, train_size=None)))
    share = {
        name: np.mean([len(s) == 0 for s in getattr(dataset, name).labels]) for name in ("train", "validation", "test")
    }
    assert max(share.values()) - min(share.values()) < 0.05


@pytest.mark.parametrize(
    "cell, message",
    [
        ('["pos", ', "starts like a JSON list but is not one"),
        ('[["pos"]]', "row 1: a multi_label cell must list label names as strings"),
        ('["pos", " "]', "blank label name"),
        ('{"pos": 1}', "row 1: label cell .* is a mapping, not a label set"),
        ("[1, 2]", "row 1: a multi_label cell must list label names as strings, got int"),
    ],
)
def test_bad_label_cells_are_one_line(tmp_path, cell, message):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"text": ["good film", "bad film", "ok film"], "label": ['["pos"]', cell, '["neg"]']}).to_csv(
        path, index=False
    )
    with pytest.raises(LoraclsError, match=message):
        load_dataset(DataSpec.of(_config(path, train_size=1, validation_size=1, test_size=1)))


@pytest.mark.parametrize("cell", [3, {"pos": 1}, [1], ["pos", None], True])
def test_jsonl_cells_that_are_not_label_sets_are_refused_with_their_row(tmp_path, cell):
    path = tmp_path / "bad.jsonl"
    rows = [{"text": "good film", "label": ["pos"]}, {"text": "bad film", "label": cell}, {"text": "ok", "label": []}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(LoraclsError, match="row 1: .*multi_label cell|row 1: label cell"):
        load_dataset(DataSpec.of(_config(path, train_size=1, validation_size=1, test_size=1)))


def test_case_twins_and_conflicting_sets(tmp_path):
    path = tmp_path / "twins.jsonl"
    pd.DataFrame({"text": ["a good film", "a bad film"], "label": [["pos"], ["Pos", "neg"]]}).to_json(
        path, orient="records", lines=True
    )
    with pytest.raises(LoraclsError, match="differ only in case"):
        load_dataset(DataSpec.of(_config(path, train_size=1, validation_size=1, test_size=1)))
    frame = label_sets_frame(60)
    frame = pd.concat([frame, pd.DataFrame({"text": [frame.text[0]], "label": [["neg", "pos", "meh"]]})])
    frame.to_json(tmp_path / "conflict.jsonl", orient="records", lines=True)
    dataset = load_dataset(
        DataSpec.of(_config(tmp_path / "conflict.jsonl", train_size=20, validation_size=10, test_size=10))
    )
    assert any("conflicting labels" in note for note in dataset.notes)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"problem": "single_label", "label_separator": "|"}, "label_separator splits label sets"),
        ({"balance": True}, "balance: true needs one label a text"),
        ({"head_init": "verbalizer"}, "head_init: verbalizer reads one label word"),
    ],
)
def test_config_refuses_what_label_sets_cannot_do(sets_jsonl, values, message):
    with pytest.raises(LoraclsError, match=message):  # each problem type checks the config when data loads
        load_dataset(DataSpec.of(_config(sets_jsonl, **values)))


def test_balanced_weights_are_bce_pos_weights(sets_jsonl):
    config = _config(sets_jsonl, class_weights="balanced")
    dataset = load_dataset(DataSpec.of(config))
    positives = multi_hot(dataset.train.labels, 3).sum(axis=0)
    expected = (len(dataset.train) - positives) / positives
    assert class_weight_vector(config.class_weights, dataset) == pytest.approx(expected.tolist())


def test_bce_loss_is_the_mean_over_examples_and_labels_whatever_the_micro_batches():
    torch.manual_seed(0)
    logits, targets = torch.randn(6, 3), torch.from_numpy(multi_hot([[0], [1, 2], [], [0, 1, 2], [2], [1]], 3))
    whole = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
    loss = PROBLEMS["multi_label"].loss
    parts = sum(loss(logits[i : i + 2], targets[i : i + 2], None, 6) for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)
    weight = torch.tensor([1.0, 2.0, 3.0])
    weighted = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, pos_weight=weight)
    assert loss(logits, targets, weight, 6).item() == pytest.approx(weighted.item(), rel=1e-6)


def test_thresholds_maximise_each_labels_validation_f1():
    rng = np.random.default_rng(0)
    truth = [sorted(k for k in range(3) if rng.random() < 0.4) for _ in range(200)]
    hot = multi_hot(truth, 3)
    probs = np.clip(0.3 * hot + rng.random((200, 3)) * 0.6, 0, 1)  # positives sit higher, but below 0.5 often
    thresholds = tune_thresholds(probs, truth)
    for k, cut in enumerate(thresholds):
        best = max(f1_score(hot[:, k], probs[:, k] >= c) for c in np.arange(0.05, 0.96, 0.05))
        assert f1_score(hot[:, k], probs[:, k] >= cut) == pytest.approx(best)
    assert tune_thresholds(probs, [[] for _ in truth]) == [0.5, 0.5, 0.5]  # no positives: nothing to tune


def test_set_metrics_match_sklearn():
    truth = [[0], [0, 1], [], [2], [1, 2]]
    probs = np.array([[0.9, 0.2, 0.1], [0.8, 0.4, 0.3], [0.1, 0.1, 0.7], [0.2, 0.3, 0.9], [0.3, 0.6, 0.6]])
    decision = Decision("multi_label", thresholds=[0.5, 0.35, 0.5])
    metrics = PROBLEMS["multi_label"].metrics(truth, probs, {0: "a", 1: "b", 2: "c"}, decision)
    chosen = probs >= np.array([0.5, 0.35, 0.5])
    hot = multi_hot(truth, 3)
    assert metrics.accuracy == pytest.approx(np.mean((chosen == hot).all(axis=1)))
    assert metrics.micro_f1 == pytest.approx(f1_score(hot, chosen, average="micro"))
    assert metrics.macro_f1 == pytest.approx(f1_score(hot, chosen, average="macro"))
    assert metrics.per_class["b"].support == 2 and metrics.thresholds["b"] == 0.35
    assert Decision("multi_label", thresholds=[0.5, 0.35, 0.5]).label_of(probs[2], {0: "a", 1: "b", 2: "c"}) == ["c"]


@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory, gemma3_dir, sets_jsonl):
    out = tmp_path_factory.mktemp("multilabel_runs")
    assert (
        main(["train", *tiny_overrides(gemma3_dir, sets_jsonl, out, problem="multi_label", train_size=200, epochs=6)])
        == 0
    )
    return out / "run"


def test_train_saves_thresholds_and_set_metrics(multilabel_run):
    from loracls import runs

    metrics = runs.read_metrics(multilabel_run)
    assert metrics.problem == "multi_label" and metrics.calibration is None
    assert 0 <= metrics.test.micro_f1 <= 1 and set(metrics.test.per_class) == {"meh", "neg", "pos"}
    decision = runs.read_decision(multilabel_run)
    assert decision.problem == "multi_label" and list(metrics.test.thresholds.values()) == decision.thresholds
    merged = json.loads((multilabel_run / "merged" / "config.json").read_text())
    assert merged["problem_type"] == "multi_label_classification"
    fmt = json.loads((multilabel_run / "merged" / "loracls_input.json").read_text())
    assert fmt["decision"]["problem"] == "multi_label" and fmt["decision"]["thresholds"] == decision.thresholds
    assert metrics.export.predictions_equal
    rows = [json.loads(line) for line in (multilabel_run / "predictions" / "test.jsonl").read_text().splitlines()]
    assert all(isinstance(r["label"], list) and isinstance(r["prediction"], list) for r in rows)
    log = [json.loads(line) for line in (multilabel_run / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < losses[0]  # BCE goes down
    assert (multilabel_run / "tfidf.json").is_file() and not (multilabel_run / "baseline.json").exists()


def test_predict_evaluate_and_report_show_label_sets(multilabel_run, tmp_path, capsys):
    from loracls import runs

    texts = tmp_path / "texts.txt"
    texts.write_text("good great film\nthe film was boring\n")
    assert main(["predict", str(multilabel_run), "--file", str(texts)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all(isinstance(r["prediction"], list) for r in rows)
    decision = runs.read_decision(multilabel_run)
    for row in rows:
        chosen = [name for (name, p), cut in zip(row["probabilities"].items(), decision.thresholds) if p >= cut]
        assert row["prediction"] == chosen
    from loracls.inference.engine import Classifier

    merged = Classifier(str(multilabel_run / "merged"), lambda *a: None, precision="fp32")  # decides the same way
    assert merged.decision == decision
    probs = merged.probabilities(texts.read_text().splitlines())
    assert [merged.predicted(row) for row in probs] == [row["prediction"] for row in rows]
    assert np.allclose(probs, [list(row["probabilities"].values()) for row in rows], atol=1e-3)
    assert main(["evaluate", str(multilabel_run)]) == 0
    evaluated = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert evaluated["micro_f1"] == runs.read_metrics(multilabel_run).test.micro_f1
    assert main(["report", str(multilabel_run)]) == 0
    page = (multilabel_run / "report.html").read_text()
    assert "subset accuracy" in page and "threshold" in page and "confusion.png" not in page


@pytest.mark.slow
def test_server_returns_label_sets(multilabel_run):
    from loracls import runs
    from test_serve import Server

    server = Server(multilabel_run / "merged")
    try:
        decision = runs.read_decision(multilabel_run)
        info = server.client.get("/info").json()
        assert info["problem"] == "multi_label" and info["thresholds"] == decision.thresholds
        items = server.client.post("/classify", json={"input": ["good great film", "boring"]}).json()["data"]
        for item in items:
            assert item["labels"] == [
                name for name, p, cut in zip(info["labels"], item["probs"], decision.thresholds) if p >= cut
            ]
            assert item["label"] == info["labels"][int(np.argmax(item["probs"]))]
        bad = server.client.post("/classify", json={"input": 3})
        assert bad.status_code == 422 and "error" in bad.json()
        assert server.client.get("/health").json() == {"status": "ok"}  # still serving
    finally:
        assert server.stop() == 0


def test_a_damaged_set_metrics_file_is_one_line(multilabel_run, tmp_path, capsys):
    import shutil

    from loracls import runs

    run = tmp_path / "run"
    shutil.copytree(multilabel_run, run)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["test"]["thresholds"] = "high"
    (run / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(LoraclsError, match=r"metrics.json: test.thresholds: Input should be a valid dictionary"):
        runs.read_metrics(run)
    decision = run / runs.ADAPTER / runs.CALIBRATION
    decision.write_text(json.dumps({"decision": {"problem": "multi_label", "thresholds": [0.5, 1.5, 0.5]}}))
    assert main(["predict", str(run), "--text", "good film"]) == 2
    assert "thresholds must lie strictly between 0 and 1" in capsys.readouterr().err


def test_sweep_and_evaluate_on_another_file(gemma3_dir, sets_jsonl, multilabel_run, tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    label_sets_frame(30, seed=7).to_json(other, orient="records", lines=True)
    assert main(["evaluate", str(multilabel_run), "--data", str(other)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["examples"] == 30
    out = tmp_path / "sweep"
    args = tiny_overrides(
        gemma3_dir,
        sets_jsonl,
        out,
        problem="multi_label",
        train_size=100,
        epochs=1,
        merge=False,
        baseline=False,
        run_name="grid",
    )
    assert main(["sweep", "--grid", "r=2,4", *args]) == 0
    table = (out / "grid" / "results.md").read_text()
    assert "test_micro_f1" in table and table.count("| r=") == 2
