"""The plan of a training run, fixed before its first step: steps per epoch and in all, the micro-batches a
step runs as, warmup, and the optimizer, schedule and gradient scaler. Pure functions of the config."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import get_scheduler

from loracls.config import Config
from loracls.data.batching import length_grouped_batches

# padded tokens a pass on CPU: a 12-step run on Chinese reviews at max_length 256 (fp32) peaked at 14.2 GB RSS
# with whole 32-text passes, 8.7 GB with passes of 4096 tokens and 6.3 GB with 2048 (docs/benchmarks.md "Memory")
CPU_PASS_TOKENS = 2048


@dataclass
class Plan:
    """How many steps, and how each step is cut into forward/backward passes."""

    steps_per_epoch: int
    total_steps: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    world: int = 1

    def groups(self, lengths: list[int], config: Config, epoch: int) -> list[list[int]]:
        """One list of example indices per optimizer step of this epoch (all processes together), by length."""
        size = config.batch_size * config.gradient_accumulation * self.world
        return length_grouped_batches(lengths, size, config.seed + epoch)


def plan_steps(num_examples: int, config: Config, world: int = 1) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps)."""
    per_epoch = math.ceil(num_examples / (config.batch_size * config.gradient_accumulation * world))
    total = max(per_epoch * config.epochs, config.min_steps or 0)
    return per_epoch, min(total, config.max_steps) if config.max_steps else total


def micro_batch_size(config: Config, device: torch.device) -> int:
    """Examples per forward/backward. On CPU memory is plentiful and bigger matmuls run faster, so the
    accumulation steps run as one micro-batch (same gradient: the loss is a mean over the whole step)."""
    if config.micro_batch_size is not None:
        return config.micro_batch_size
    return config.batch_size * config.gradient_accumulation if device.type == "cpu" else config.batch_size


def micro_batch_tokens(config: Config, device: torch.device) -> int | None:
    if config.micro_batch_tokens is not None:
        return config.micro_batch_tokens
    return CPU_PASS_TOKENS if device.type == "cpu" else None


def make_plan(num_examples: int, config: Config, device: torch.device, world: int = 1) -> Plan:
    per_epoch, total = plan_steps(num_examples, config, world)
    return Plan(per_epoch, total, micro_batch_size(config, device), micro_batch_tokens(config, device), world)


def warmup_steps(config: Config, total_steps: int) -> int:
    """`warmup_steps`, but never more than a quarter of the run: 64 examples x 3 epochs are 6 steps, which a
    100-step warmup would spend at a few percent of the learning rate."""
    return min(config.warmup_steps, total_steps // 4)


def make_optimizer(params, config: Config) -> torch.optim.Optimizer:
    if config.optimizer == "adamw_8bit":  # availability checked before the run starts
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=config.peak_learning_rate, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.peak_learning_rate, weight_decay=config.weight_decay)


@dataclass
class Optimization:
    """The optimizer over the trainable parameters, its schedule, and the fp16 gradient scaler (off otherwise)."""

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler

    @classmethod
    def for_model(cls, model, config: Config, runtime, total_steps: int) -> Optimization:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, config)
        scheduler = get_scheduler(
            config.scheduler if config.scheduler != "constant" else "constant_with_warmup",
            optimizer,
            num_warmup_steps=warmup_steps(config, total_steps),
            num_training_steps=total_steps,
        )
        fp16 = runtime.dtype == torch.float16  # fp16 overflows without loss scaling; bf16 does not need it
        scaler = torch.amp.GradScaler(runtime.device.type if fp16 else "cpu", enabled=fp16)
        return cls(params, optimizer, scheduler, scaler)


def describe(plan: Plan, examples: int, config: Config, attention: str | None, fp16: bool) -> str:
    """The one line a run says about its plan before the first step."""
    return (
        f"train: {examples} examples, {plan.steps_per_epoch} optimizer steps/epoch, "
        f"{plan.total_steps} steps (batch {config.batch_size} x accumulation {config.gradient_accumulation}"
        + (f" x {plan.world} processes" if plan.world > 1 else "")
        + f"; micro-batches of {plan.micro_batch_size}"
        + (f" and at most {plan.micro_batch_tokens} padded tokens" if plan.micro_batch_tokens else "")
        + (f"; {attention} attention" if attention else "")
        + ("; fp16 with gradient scaling" if fp16 else "")
        + ")"
    )
