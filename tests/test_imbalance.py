"""Imbalanced data: class weights in the loss, checkpoints chosen by macro-F1 or loss."""

import math

import pandas as pd
import pytest
import torch

from conftest import synthetic_frame, tiny_overrides, tiny_trainer
from loracls.cli import main
from loracls.config_reader import load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import class_weight_vector, load_dataset
from loracls.errors import LoraclsError
from loracls.training.stopping import EarlyStopping


@pytest.fixture
def imbalanced_csv(tmp_path):
    frame = synthetic_frame(1200)
    frame = pd.concat([frame[frame.label == "neg"][:100], frame[frame.label == "pos"]], ignore_index=True)  # 1:6
    path = tmp_path / "imbalanced.csv"
    frame.to_csv(path, index=False)
    return path


def _config(path, **values):
    return load_config(
        None,
        [
            f"{k}={v}"
            for k, v in {"data": path, "train_size": 400, "validation_size": 80, "test_size": 80, **values}.items()
        ],
    )


def test_class_weight_vectors(imbalanced_csv):
    dataset = load_dataset(DataSpec.of(_config(imbalanced_csv)))
    counts = dataset.class_counts()["train"]
    assert counts["pos"] > 5 * counts["neg"]
    assert class_weight_vector(_config(imbalanced_csv).class_weights, dataset) is None
    balanced = class_weight_vector(_config(imbalanced_csv, class_weights="balanced").class_weights, dataset)
    n = sum(counts.values())
    assert balanced == pytest.approx([n / (2 * counts["neg"]), n / (2 * counts["pos"])])
    assert class_weight_vector(_config(imbalanced_csv, class_weights="{neg: 4}").class_weights, dataset) == [4.0, 1.0]
    with pytest.raises(LoraclsError, match="class_weights names unknown label.*'negative'"):
        class_weight_vector(_config(imbalanced_csv, class_weights="{negative: 4}").class_weights, dataset)


def test_weighted_loss_is_the_weighted_sum_over_the_group(gemma3_dir, imbalanced_csv, tmp_path):
    from loracls.data.batching import collate

    def normal_head(model):  # a head that is not uniform yet
        torch.nn.init.normal_(model.score.weight)

    losses = {}
    for weights in ("none", {"neg": 3.0}):
        values = dict(validation_size=8, test_size=8, warmup_steps=0, class_weights=weights)
        trainer, dataset = tiny_trainer(gemma3_dir, imbalanced_csv, tmp_path / str(weights), head=normal_head, **values)
        model, train = trainer.model, trainer.train_set
        labels_all = dataset.train.labels
        negatives, positives = (
            [i for i, y in enumerate(labels_all) if y == 0],
            [i for i, y in enumerate(labels_all) if y == 1],
        )
        group = negatives[:6] + positives[:10]
        with torch.no_grad():
            logits = model(**collate([train.ids[i] for i in group], train.pad_id)).logits.float()
        labels = torch.tensor([dataset.train.labels[i] for i in group])
        per_example = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        weight = torch.tensor([3.0 if y == 0 else 1.0 for y in labels.tolist()]) if weights != "none" else 1.0
        losses[str(weights)] = (trainer.train_step(group)[0], float((per_example * weight).sum() / len(group)))
    for got, expected in losses.values():
        assert got == pytest.approx(expected, rel=1e-5)
    assert losses["none"][0] != pytest.approx(losses[str({"neg": 3.0})][0])


def test_unknown_class_weight_label_writes_nothing(gemma3_dir, imbalanced_csv, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", *tiny_overrides(gemma3_dir, imbalanced_csv, out, class_weights={"negative": 2})]) == 2
    assert "class_weights names unknown label" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    "select_by, trace, best",
    [
        ("accuracy", [(0.8, 0.5, 0.6), (0.8, 0.4, 0.7), (0.7, 0.3, 0.75)], 20),
        ("macro_f1", [(0.8, 0.5, 0.6), (0.8, 0.4, 0.7), (0.7, 0.3, 0.75)], 30),
        ("loss", [(0.8, 0.5, 0.6), (0.9, 0.45, 0.7), (0.7, 0.3, 0.75)], 30),
    ],
)
def test_select_by_chooses_the_best_checkpoint(select_by, trace, best):
    rule = EarlyStopping(patience=3, select_by=select_by)
    for step, (accuracy, loss, macro_f1) in zip((10, 20, 30), trace):
        rule.update(step, accuracy, loss, macro_f1)
    assert rule.best_step == best
    assert rule.best_accuracy == trace[best // 10 - 1][0]
    assert not rule.update(40, 0.99, math.nan, 0.99)  # never a non-finite validation


def test_a_run_selected_by_macro_f1_with_balanced_weights(gemma3_dir, imbalanced_csv, tmp_path):
    args = tiny_overrides(
        gemma3_dir,
        imbalanced_csv,
        tmp_path,
        train_size=400,
        validation_size=80,
        test_size=80,
        epochs=3,
        baseline=False,
        merge=False,
        select_by="macro_f1",
        class_weights="balanced",
    )
    assert main(["train", *args]) == 0
    import json

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["validation"]["select_by"] == "macro_f1"
    assert set(metrics["test"]["per_class"]["neg"]) == {"precision", "recall", "f1", "support"}
    assert metrics["data"]["test"]["pos"] > 5 * metrics["data"]["test"]["neg"]  # stratified: the data's proportions
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert all("validation_macro_f1" in r for r in log if "validation_accuracy" in r)
