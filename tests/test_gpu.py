"""GPU checks (`pytest -m gpu`; skipped where torch sees no GPU), run by benchmarks/gpu_check.sh when a
machine with a GPU is lent: a bf16 train step with SDPA that never falls back to the CPU, the merged model
against the adapter at bf16 tolerance, resume after kill -9 (GPU RNG included), predict on the GPU, fp16
with its gradient scaler, and QLoRA (or its clear refusal)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conftest import tiny_overrides, tiny_trainer
from loracls.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible to torch")]

COMPUTE = (
    "mm",
    "bmm",
    "addmm",
    "matmul",
    "softmax",
    "scaled_dot_product",
    "embedding",
    "gelu",
    "tanh",
    "rsqrt",
    "mul",
    "add",
    "div",
    "exp",
    "pow",
    "mean",
    "sum",
    "nll_loss",
    "_foreach_",
    "lerp",
    "sqrt",
)


class CpuComputeRecorder(TorchDispatchMode):
    """Records every compute op that touches a CPU tensor of more than one element (0-dim step counters of
    the optimizer are fine; collating token ids on the CPU before `.to(device)` is no compute)."""

    def __init__(self):
        super().__init__()
        self.cpu_ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if any(key in name for key in COMPUTE):
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            if any(t.device.type == "cpu" and t.numel() > 1 for t in tensors):
                self.cpu_ops.append(name)
        return out


def _trainer(gemma3_dir, data_csv, tmp_path, precision="auto", **values):
    from loracls.hardware import setup_runtime

    settings = dict(train_size=64, validation_size=16, test_size=16, max_length=32, batch_size=8, warmup_steps=0)
    runtime = setup_runtime("auto", precision, None)
    trainer, _ = tiny_trainer(
        gemma3_dir, data_csv, tmp_path, runtime=runtime, lora=(4, 8, 0.1, ["q_proj", "v_proj"]),
        gradient_accumulation=2, precision=precision, **settings, **values,
    )  # fmt: skip
    return trainer, trainer.model


def test_bf16_train_step_with_sdpa_never_computes_on_the_cpu(gemma3_dir, data_csv, tmp_path):
    trainer, model = _trainer(gemma3_dir, data_csv, tmp_path)
    assert trainer.runtime.device.type == "cuda" and trainer.runtime.dtype == torch.bfloat16
    assert model.config._attn_implementation == "sdpa"  # GPUs keep SDPA (the speed-ups pick eager on CPU only)
    recorder = CpuComputeRecorder()
    with recorder:
        for step in range(2):
            loss, tokens = trainer.train_step(list(range(16 * step, 16 * step + 16)))
    assert recorder.cpu_ops == [], sorted(set(recorder.cpu_ops))
    assert np.isfinite(loss) and tokens > 0
    for name, param in model.named_parameters():
        assert param.device.type == "cuda", name
    for state in trainer.opt.optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                assert value.device.type == "cuda", key
    assert trainer.mfu_of(1.0) is not None  # a known GPU: MFU is logged


def test_fp16_trains_with_a_gradient_scaler_on_the_gpu(gemma3_dir, data_csv, tmp_path):
    trainer, model = _trainer(gemma3_dir, data_csv, tmp_path, precision="fp16")
    assert trainer.opt.scaler.is_enabled()
    for step in range(4):
        loss, _ = trainer.train_step(list(range(16 * step, 16 * step + 16)))
        assert np.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters() if p.requires_grad)


def test_gpu_rng_state_is_saved_and_restored():
    from loracls.training import checkpoint

    torch.cuda.manual_seed_all(3)
    torch.rand(4, device="cuda")
    state = checkpoint.rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = torch.rand(1000, device="cuda")
    torch.rand(7, device="cuda")
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(1000, device="cuda"), expected)


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory, gemma3_dir, data_csv):
    out = tmp_path_factory.mktemp("gpu_runs")
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, out, precision="auto", epochs=4)]) == 0
    return out / "run"


def test_whole_job_on_the_gpu_and_merged_equals_adapter_in_bf16(gpu_run):
    from peft import PeftModel

    from loracls import runs
    from loracls.data.batching import encode
    from loracls.hardware import Runtime
    from loracls.model.classifier import load_classifier, load_standalone
    from loracls.model.scoring import Batching, predict_probabilities

    env = json.loads((gpu_run / "env.json").read_text())
    assert env["device"].startswith("cuda") and env["precision"] == "bfloat16"
    metrics = runs.read_metrics(gpu_run)
    assert metrics.export.predictions_equal and metrics.train.mfu is not None and metrics.train.mfu > 0
    log = [json.loads(x) for x in (gpu_run / "train_log.jsonl").read_text().splitlines()]
    assert all("mfu" in r for r in log if "loss" in r)
    config, id2label = runs.read_config(gpu_run), runs.read_labels(gpu_run)
    rows = [json.loads(x) for x in (gpu_run / "predictions" / "test.jsonl").read_text().splitlines()]
    loaded = load_classifier(Path(config.model), id2label, log=lambda *a: None)
    ids = encode(loaded.tokenizer, [r["text"] for r in rows], config.max_length)
    bf16 = Runtime(torch.device("cuda"), torch.bfloat16)
    adapter = PeftModel.from_pretrained(loaded.model, str(gpu_run / "adapter")).cuda()
    merged = load_standalone(gpu_run / "merged").cuda()
    batching = Batching(loaded.tokenizer.pad_token_id, 16, bf16)
    a = predict_probabilities(adapter, ids, batching)
    b = predict_probabilities(merged, ids, batching)
    assert np.abs(a - b).max() < 3e-2  # bf16 rounds W x + B A x and (W + B A) x differently
    assert (a.argmax(1) == b.argmax(1)).mean() >= 0.95


def test_predict_runs_on_the_gpu(gpu_run, capsys):
    rows = [json.loads(x) for x in (gpu_run / "predictions" / "test.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert main(["predict", str(gpu_run), "--text", rows[0]["text"], "--text", rows[1]["text"]]) == 0
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for got, want in zip(predicted, rows[:2]):
        for label, p in got["probabilities"].items():
            assert p == pytest.approx(want["probabilities"][label], abs=2e-2)


def test_resume_after_kill_on_the_gpu_matches_an_uninterrupted_run(gemma3_dir, data_csv, tmp_path):
    from test_sweep_resume_scale import straight_and_resumed

    straight_and_resumed(
        gemma3_dir,
        data_csv,
        tmp_path,
        epochs=12,
        eval_every=15,
        baseline=False,
        lora_dropout=0.1,
        precision="fp32",
        deterministic=True,
        merge=False,
    )


def test_qlora_step_or_its_clear_refusal(gemma3_dir, data_csv, tmp_path, capsys):
    from loracls.compat import bitsandbytes_version

    args = tiny_overrides(gemma3_dir, data_csv, tmp_path, quantization="4bit", epochs=1, baseline=False, merge=False)
    if bitsandbytes_version() is None:
        assert main(["train", *args]) == 2
        assert "bitsandbytes is not importable here" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()
    else:
        assert main(["train", *args]) == 0
        assert json.loads((tmp_path / "run" / "metrics.json").read_text())["train"]["steps"] > 0


def test_serve_on_the_gpu(gpu_run):
    from test_serve import Server

    server = Server(gpu_run)
    try:
        info = server.client.get("/info").json()
        assert info["device"].startswith("cuda") and info["precision"] == "bfloat16"
        body = server.client.post("/classify", json={"input": ["good great film", "awful dull plot"]}).json()
        assert [d["num_classes"] for d in body["data"]] == [2, 2]
        assert all(abs(sum(d["probs"]) - 1) < 1e-4 for d in body["data"])
    finally:
        assert server.stop() == 0
