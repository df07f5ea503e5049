"""How the decoder is trained, registered by name (PEFT's tuners pattern): `lora` (PEFT adapters on the targets,
the head trained in full) and `full` (every weight of the decoder and the head trained). Each method holds all
its parts: putting it on the model, saving the best weights into RUN/adapter, reading them back onto a fresh
base, and the standalone model the export writes. Nothing else branches on the method.

Full fine-tuning can repair what LoRA cannot reach, the quantization error in frozen Q4_K_M weights among it,
at the price of AdamW's state for every parameter: sized before anything is written and refused where it
cannot fit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Protocol

import torch
from torch import nn

from loracls.errors import Log, LoraclsError, first_line
from loracls.model.lora import LoraReport, LoraSpec, apply_lora, count_parameters, head_name

__all__ = ["METHODS", "Method", "method_named", "method_of", "FULL_WEIGHTS", "full_training_bytes"]

FULL_WEIGHTS = "full_model.safetensors"  # method full: every trained weight, by parameter name, in RUN/adapter
FULL_MARKER = "loracls_full.json"  # beside it: the method and the parameter count, for the reader


class Method(Protocol):
    name: ClassVar[str]

    def apply(self, model: nn.Module, config, runtime, log: Log) -> tuple[nn.Module, LoraReport]:
        """The model made trainable the method's way (nothing written)."""

    def save(self, directory: Path, model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
        """The best weights (the trainable ones' values) into `directory` (a staging folder)."""

    def load_onto(self, base: nn.Module, directory: Path) -> nn.Module:
        """The saved weights on a fresh base built like the trained one."""

    def standalone(self, model: nn.Module) -> nn.Module:
        """The model without any wrapper: what `merged/` holds."""


METHODS: dict[str, type[Method]] = {}


def register(cls):
    METHODS[cls.name] = cls
    return cls


def method_named(name: str) -> Method:
    return METHODS[name]()


def method_of(directory: Path) -> Method:
    """The method whose weights a RUN/adapter folder holds."""
    return method_named("full" if (Path(directory) / FULL_WEIGHTS).is_file() else "lora")


@register
class LoraMethod:
    name = "lora"

    def apply(self, model, config, runtime, log):
        return apply_lora(model, LoraSpec.of(config), log)

    def save(self, directory, model, state_dict):
        model.save_pretrained(directory, state_dict=state_dict)

    def load_onto(self, base, directory):
        from peft import PeftModel

        try:
            return PeftModel.from_pretrained(base, str(directory))
        except Exception as exc:  # a damaged or foreign adapter directory
            raise LoraclsError(f"cannot load the adapter in {directory}: {first_line(exc, 200)}") from None

    def standalone(self, model):
        return model.merge_and_unload()


ADAMW_BYTES = 4 + 4 + 8 + 4  # a parameter's fp32 weight, gradient, AdamW's two moments, the best copy kept


def full_training_bytes(parameters: int) -> int:
    """Memory full fine-tuning needs beyond activations: every parameter's weight, gradient, AdamW's two
    moments and the copy of the best weights kept during training, in fp32."""
    return parameters * ADAMW_BYTES


def available_bytes(device: torch.device) -> int | None:
    """Free memory of the device the model trains on (None: not known, e.g. MPS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


@register
class FullMethod:
    name = "full"

    def apply(self, model, config, runtime, log):
        parameters = sum(p.numel() for p in model.parameters())
        needed, free = full_training_bytes(parameters), available_bytes(runtime.device)
        already = parameters * 4 if runtime.device.type == "cpu" else 0  # the weights are loaded on the CPU now
        if free is not None and needed - already > free:
            raise LoraclsError(
                f"method full: training all {parameters / 1e6:.1f}M parameters needs about {needed / 2**30:.1f} GiB "
                f"(weights, gradients, AdamW's two moments, the best weights kept) and {runtime.device.type} has "
                f"{(free + already) / 2**30:.1f} GiB available: use method: lora (the default), or a machine "
                f"with more memory"
            )
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        head = head_name(model)
        report = LoraReport([], *count_parameters(model), head)
        log(
            f"full fine-tuning: all {report.trainable:,} parameters trained (about "
            f"{needed / 2**30:.1f} GiB with AdamW's state), head {head!r}"
        )
        return model, report

    def save(self, directory, model, state_dict):
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file({name: value.detach().contiguous() for name, value in state_dict.items()}, directory / FULL_WEIGHTS)
        (directory / FULL_MARKER).write_text(json.dumps({"method": self.name, "tensors": len(state_dict)}) + "\n")

    def load_onto(self, base, directory):
        from safetensors.torch import load_file

        try:
            weights = load_file(str(Path(directory) / FULL_WEIGHTS))
        except Exception as exc:
            raise LoraclsError(f"cannot load the trained weights in {directory}: {first_line(exc, 200)}") from None
        names = dict(base.named_parameters())
        unknown = sorted(set(weights) - set(names))
        missing = sorted(set(names) - set(weights))
        if unknown or missing:
            raise LoraclsError(
                f"{directory / FULL_WEIGHTS} does not fit the base model: {len(unknown)} unknown, {len(missing)} "
                f"missing weights (e.g. {(unknown or missing)[0]})"
            )
        with torch.no_grad():
            for name, value in weights.items():
                if names[name].shape != value.shape:
                    raise LoraclsError(
                        f"{directory / FULL_WEIGHTS}: {name} is {tuple(value.shape)}, not {tuple(names[name].shape)}"
                    )
                names[name].copy_(value.to(names[name].dtype))
        return base

    def standalone(self, model):
        return model
