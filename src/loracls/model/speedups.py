"""CPU speed-ups applied once while the trainer is set up; each gives the same results, measured faster.

- Frozen Linear weights stored in the autocast dtype (bit-identical outputs, no per-step cast).
- transformers' eager attention on CPU (torch's CPU SDPA backward is slow on short padded sequences).
- LoRA dropout with cheaper random numbers (`loracls.model.lora.CheapRandomDropout`, swapped in when the
  adapters are made).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def store_frozen_linears_in(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Keep frozen Linear weights in the autocast compute dtype (bf16/fp16) instead of fp32.

    Autocast casts every fp32 weight to that dtype in every forward pass; a weight already in it is used as
    is, so the results are the same bit for bit while the per-step cast of all frozen weights (and half
    their memory) goes away. Trainable weights (LoRA, head) stay fp32 for the optimizer. Returns the count."""
    if dtype == torch.float32:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not module.weight.requires_grad:
            module.to(dtype)
            module.register_forward_pre_hook(_contiguous_input)
            count += 1
    return count


def _contiguous_input(_module, args):
    """A Linear stored in bf16 is given a contiguous input. torch 2.13's CPU bf16 matmul takes a slow path for a
    bf16 3-D input that is a strided view (as transformers' `logits_to_keep` slice of the last hidden states
    is): it expands the weight per batch row for a bmm. Gemma 3 270M's LM head on a [32, 1, 640] view took
    106 s against 0.12 s contiguous, and beam-search comments went 20x slower (304 s against 15 s for 8 texts,
    4 beams); a contiguous tensor passes through as itself."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def pick_attention(model: torch.nn.Module, device: torch.device) -> str | None:
    """On CPU, use transformers' eager attention (matmul, softmax, matmul) instead of SDPA.

    torch's CPU SDPA (flash kernel) has a slow backward for the short, padded sequences of classification
    data: on the embedded job it took 13% of a train step, 4x its own forward. Measured on Gemma 3 270M
    (2 cores, bf16 autocast), a forward+backward with eager attention is faster at every length tried:
    0.69 vs 0.74 s (32 x 24 tokens), 1.02 vs 1.16 s (8 x 128), 1.20 vs 1.49 s (2 x 512), 1.58 vs 1.92 s
    (1 x 1024). On GPUs SDPA's fused kernels are kept. Returns the implementation set, or None."""
    if device.type != "cpu":
        return None
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            if getattr(module.config, "_attn_implementation", None) in (None, "sdpa"):
                module.set_attn_implementation("eager")
            return module.config._attn_implementation
    return None


def apply_speedups(model: torch.nn.Module, runtime, quantized: bool, sharded: bool) -> str | None:
    """All of the above that apply here; returns the attention implementation picked (None: unchanged)."""
    if not quantized and not sharded:  # FSDP units keep one dtype per unit; quantized weights stay as they are
        store_frozen_linears_in(model, runtime.dtype)
    return pick_attention(model, runtime.device)
