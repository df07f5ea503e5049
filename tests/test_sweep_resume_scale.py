"""Sweeps, resume after kill -9, NaN stop, and 2-process data parallelism (gloo) on tiny decoders."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_overrides
from loracls.cli import main
from loracls.config_reader import split_alternatives
from loracls.diagnostics.sweep import parse_grid
from loracls.errors import LoraclsError


def test_grid_parsing():
    assert split_alternatives("[q_proj,v_proj],[q_proj,k_proj]") == ["[q_proj,v_proj]", "[q_proj,k_proj]"]
    grid = parse_grid(["r=8,16,32", "target_modules=[q_proj,v_proj],[o_proj]", "train_size=1200,5000"])
    assert grid == {"r": [8, 16, 32], "target_modules": [["q_proj", "v_proj"], ["o_proj"]], "train_size": [1200, 5000]}
    with pytest.raises(LoraclsError, match="did you mean 'r'"):
        parse_grid(["rr=8"])
    assert parse_grid(["input_template=Review: {text} Label:,{text} =>"]) == {
        "input_template": ["Review: {text} Label:", "{text} =>"]
    }


@pytest.mark.slow
def test_sweep_table(gemma3_dir, data_csv, tmp_path, capsys):
    args = [
        "sweep",
        "--grid",
        "r=2,4",
        "target_modules=[q_proj,v_proj],[o_proj]",
        *tiny_overrides(gemma3_dir, data_csv, tmp_path, epochs=2, baseline=False, merge=False, run_name="grid"),
    ]
    assert main(args) == 0
    sweep = tmp_path / "grid"
    rows = (sweep / "results.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("run,validation_accuracy,test_accuracy")
    table = (sweep / "results.md").read_text()
    assert "r=4-target_modules=o_proj" in table and table.count("\n") == 6
    metrics = json.loads((sweep / "r=2-target_modules=q_proj+v_proj" / "metrics.json").read_text())
    assert metrics["model"]["lora_modules"] == 4
    config = (sweep / "r=4-target_modules=o_proj" / "config.yaml").read_text()
    assert "r: 4" in config and "- o_proj" in config


def _train_cmd(args):
    return [sys.executable, "-m", "loracls", "train", *args]


PROCESS_LIMIT = 1800  # seconds: only a hung process is stopped (a busy machine may take many times longer)


def _wait_for_two_validations(run, process) -> None:
    """Until the run has validated twice and holds a checkpoint; it must still be running then (12 validations
    are planned, so the kill lands in the middle whatever the machine's speed)."""
    log = run / "train_log.jsonl"
    deadline = time.time() + PROCESS_LIMIT
    while time.time() < deadline and process.poll() is None:
        lines = log.read_text().splitlines() if log.exists() else []
        if sum('"validation_accuracy"' in line for line in lines) >= 2 and (run / "checkpoint.pt").exists():
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"


def _log_trace(run) -> list[tuple]:
    rows = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("validation_accuracy"), r.get("validation_loss")) for r in rows]


def straight_and_resumed(gemma3_dir, data_csv, tmp_path, **common):
    """The same run twice: once straight, once killed with SIGKILL after two validations and resumed.
    Returns the two runs' folders; their metrics and log traces must be equal."""
    straight = tmp_path / "straight"
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, straight, **common)]) == 0
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _train_cmd(tiny_overrides(gemma3_dir, data_csv, killed, **common)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_two_validations(killed / "run", process)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "run" / "metrics.json").exists()
    leftovers = [
        killed / "run" / ".checkpoint.pt.k2j4h5g6",
        killed / "run" / ".adapter.x9_y8z7w",
        killed / "run" / "predictions" / ".test.jsonl.abcd1234",
    ]  # what a kill mid-write leaves
    leftovers[0].write_bytes(b"half a checkpoint")
    leftovers[1].mkdir()
    leftovers[2].write_text("half")
    assert main(["train", "--resume", str(killed / "run")]) == 0  # the dead process's lock is taken over
    assert not [path for path in leftovers if path.exists()]
    a = json.loads((straight / "run" / "metrics.json").read_text())
    b = json.loads((killed / "run" / "metrics.json").read_text())
    assert a["test"] == b["test"] and a["validation"] == b["validation"] and a["train"]["steps"] == b["train"]["steps"]
    assert _log_trace(straight / "run") == _log_trace(killed / "run")
    return straight / "run", killed / "run"


@pytest.mark.slow
def test_resume_after_kill_matches_an_uninterrupted_run(gemma3_dir, data_csv, tmp_path):
    common = dict(epochs=12, eval_every=15, baseline=False, lora_dropout=0.1, threads=1)
    straight, killed = straight_and_resumed(gemma3_dir, data_csv, tmp_path, **common)
    for run in (straight, killed):
        assert json.loads((run / "metrics.json").read_text())["export"]["predictions_equal"]
    assert not (killed / "checkpoint.pt").exists()
    assert main(["train", "--resume", str(killed)]) == 2  # finished: nothing to resume


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_best_adapter(
    gemma3_dir, data_csv, tmp_path, monkeypatch, capsys
):
    from loracls.problems import SingleLabel  # a fault injected into the loss of one label a text

    real = SingleLabel.loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] > 40 else loss

    monkeypatch.setattr(SingleLabel, "loss", poisoned)
    args = tiny_overrides(gemma3_dir, data_csv, tmp_path, baseline=False, micro_batch_size=8)  # 2 passes a step
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "loracls: loss is nan at step 21" in err
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_processes_equal_one_process_with_double_batch(gemma3_dir, data_csv, tmp_path, data_parallel):
    common = dict(epochs=2, baseline=False, lora_dropout=0.0, eval_every=5, threads=1, merge=False)
    single = tmp_path / "single"
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, single, batch_size=8, **common)]) == 0
    double = tmp_path / "double"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = tiny_overrides(gemma3_dir, data_csv, double, batch_size=4, data_parallel=data_parallel, **common)
    result = subprocess.run(_torchrun(args), env=env, capture_output=True, text=True, timeout=PROCESS_LIMIT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("fsdp: weights sharded over 2 processes" in result.stdout + result.stderr) == (data_parallel == "fsdp")
    a = json.loads((single / "run" / "metrics.json").read_text())
    b = json.loads((double / "run" / "metrics.json").read_text())
    assert a["train"]["steps"] == b["train"]["steps"] == 30
    assert a["test"]["accuracy"] == b["test"]["accuracy"]
    assert a["validation"] == b["validation"]
    wa = load_file(single / "run" / "adapter" / "adapter_model.safetensors")
    wb = load_file(double / "run" / "adapter" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.allclose(wa[key], wb[key], atol=1e-5), key


def _torchrun(args):
    """2 processes on a free port (torchrun's --standalone rendezvous picks one: no fixed port to collide on)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "loracls",
        "train",
        *args,
    ]


@pytest.mark.slow
def test_fsdp_resume_after_kill_matches_an_uninterrupted_fsdp_run(gemma3_dir, data_csv, tmp_path):
    common = dict(
        epochs=12,
        eval_every=15,
        baseline=False,
        lora_dropout=0.1,
        threads=1,
        merge=False,
        batch_size=4,
        data_parallel="fsdp",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    done = subprocess.run(
        _torchrun(tiny_overrides(gemma3_dir, data_csv, straight, **common)),
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_LIMIT,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _torchrun(tiny_overrides(gemma3_dir, data_csv, killed, **common)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_two_validations(killed / "run", process)
    import psutil

    launcher = psutil.Process(process.pid)
    job = [*launcher.children(recursive=True), launcher]  # the workers run in sessions of their own
    for proc in job:
        proc.send_signal(signal.SIGKILL)
    process.wait()
    psutil.wait_procs(job, timeout=10)
    assert not (killed / "run" / "metrics.json").exists()

    resumed = subprocess.run(
        _torchrun(["--resume", str(killed / "run")]), env=env, capture_output=True, text=True, timeout=PROCESS_LIMIT
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: from step" in resumed.stdout + resumed.stderr
    a = json.loads((straight / "run" / "metrics.json").read_text())
    b = json.loads((killed / "run" / "metrics.json").read_text())
    assert a["test"] == b["test"] and a["validation"] == b["validation"] and a["train"]["steps"] == b["train"]["steps"]
    assert _log_trace(straight / "run") == _log_trace(killed / "run")


def test_fsdp_refuses_a_model_without_a_layer_list():
    from loracls.training.distributed import decoder_layers

    with pytest.raises(LoraclsError, match="no list of layers to shard; use ddp"):
        decoder_layers(torch.nn.Linear(4, 2))
