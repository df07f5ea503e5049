"""Model FLOPs utilisation, as nanoGPT's loop logs it: achieved training FLOP/s over the device's peak."""

from __future__ import annotations

import torch


def non_embedding_parameters(model: torch.nn.Module) -> int:
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def train_flops_per_token(model: torch.nn.Module) -> int:
    """4 x non-embedding parameters: forward (2) + backward to the activations (2); frozen weights get no
    weight gradient, and LoRA's own weights are too few to count."""
    return 4 * non_embedding_parameters(model)


def mfu(tokens_per_second: float, flops_per_token: int, peak: float | None, devices: int = 1) -> float | None:
    """Share of the peak (of all `devices` together) that `tokens_per_second` amounts to; None when unknown."""
    if not peak:
        return None
    return tokens_per_second * flops_per_token / (peak * devices)
