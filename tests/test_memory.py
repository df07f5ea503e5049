"""Activation memory is bounded by a cap on padded tokens per forward/backward pass, with the same gradient."""

import torch
from safetensors.torch import load_file

from conftest import tiny_overrides
from loracls.cli import main
from loracls.data.batching import sorted_batches
from loracls.hardware import release_free_memory


def test_a_step_is_cut_into_passes_under_the_token_cap():
    lengths = [256] * 20 + [40] * 12
    passes = sorted_batches(lengths, 32, 4096)
    assert sorted(i for p in passes for i in p) == list(range(32))  # every text once
    assert all(len(p) * max(lengths[i] for i in p) <= 4096 for p in passes)
    assert [len(p) for p in passes] == [16, 16]  # 16 long texts, then 4 long ones padded with 12 short
    assert sorted_batches(lengths, 32, None) == [sorted(range(32), key=lambda i: -lengths[i])]


def test_the_token_cap_leaves_the_trained_weights_unchanged(gemma3_dir, data_csv, tmp_path):
    adapters = []
    for name, cap in (("whole", None), ("cut", 40)):  # 16 texts of 4-12 tokens a step: cut into several passes
        args = tiny_overrides(
            gemma3_dir,
            data_csv,
            tmp_path,
            run_name=name,
            micro_batch_tokens=cap,
            max_steps=3,
            eval_every=3,
            baseline=False,
            merge=False,
            lora_dropout=0.0,
            threads=1,
        )
        assert main(["train", *args]) == 0
        adapters.append(load_file(tmp_path / name / "adapter" / "adapter_model.safetensors"))
    assert adapters[0].keys() == adapters[1].keys()
    for key in adapters[0]:
        torch.testing.assert_close(adapters[0][key], adapters[1][key], rtol=1e-4, atol=1e-5)
    release_free_memory()  # callable anywhere; a no-op where glibc is not the allocator
