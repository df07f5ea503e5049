"""Resumable checkpoints: written atomically after every validation, read with `weights_only=True`.

The file holds only tensors and plain Python values (loop state, optimizer / scheduler / gradient-scaler
state, every process's CPU and GPU RNG states), so loading it never runs code: a crafted pickle is refused
with one line instead of being executed.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loracls import files
from loracls.errors import LoraclsError, first_line
from loracls.model.methods import method_named
from loracls.training import distributed
from loracls.training.plan import Optimization

FORMAT = 2
_STRICT = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
_Count = Field(ge=0)


class StoppingRecord(BaseModel):
    """training.stopping.EarlyStopping's fields."""

    model_config = _STRICT
    patience: int | None
    select_by: Literal["accuracy", "macro_f1", "loss"]
    best_score: float
    best_loss: float
    best_step: int = _Count
    best_accuracy: float
    lowest_loss: float
    evals_without_gain: int = _Count
    stopped: bool


class LoopRecord(BaseModel):
    """training.loop.LoopState's fields."""

    model_config = _STRICT
    stopping: StoppingRecord
    step: int = _Count
    epoch: int = _Count
    group: int = _Count
    train_tokens: int = _Count
    train_seconds: float = Field(ge=0)
    log_lines: int = _Count
    window: dict[Literal["loss", "tokens", "steps", "seconds"], float | int]
    extensions: int = Field(default=0, ge=0)  # epochs added while validation still improved


class RngRecord(BaseModel):
    model_config = _STRICT
    cpu: torch.Tensor
    cuda: list[torch.Tensor]


class OptimizerRecord(BaseModel):
    """torch.optim's state_dict: per-parameter state (by index, or by name when gathered from shards)."""

    model_config = ConfigDict(strict=True, arbitrary_types_allowed=True)
    state: dict[int | str, dict[str, torch.Tensor | float | int]]
    param_groups: list[dict]


class CheckpointRecord(BaseModel):
    """checkpoint.pt: what a resumed run reads, checked in full before anything is loaded into the model."""

    model_config = _STRICT
    format: Literal[2]
    loop: LoopRecord
    trainable: dict[str, torch.Tensor]  # parameter name -> value at the checkpoint's step
    best_state: dict[str, torch.Tensor]  # the best validation's values (empty before the first)
    optimizer: OptimizerRecord
    scheduler: dict
    scaler: dict
    rng: list[RngRecord]  # one per process


def rng_state() -> dict:
    """This process's random generators: the CPU one and every visible GPU's (dropout on a GPU draws there)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": list(cuda)}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise LoraclsError(
                f"the checkpoint holds RNG states of {len(state['cuda'])} GPU(s), this process sees "
                f"{torch.cuda.device_count()}; resume with the same GPUs visible"
            )
        torch.cuda.set_rng_state_all(state["cuda"])


def _optimizer_state(model, optimizer, sharded: bool) -> dict:
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save(path: Path, model, opt: Optimization, loop: dict, trainable: dict, best_state: dict) -> None:
    """Every process calls (each one's RNG state is kept; a sharded model's state is gathered); rank 0 writes."""
    optimizer = opt.optimizer
    sharded = distributed.is_sharded(model)
    rng = distributed.gather_object(rng_state())  # ranks draw different amounts (dropout)
    if not (sharded or distributed.is_main()):
        return
    trainable = distributed.full_copy(trainable)
    optimizer_state = _optimizer_state(model, optimizer, sharded)
    if not distributed.is_main():
        return
    payload = {
        "format": FORMAT,
        "loop": loop,
        "trainable": trainable,
        "best_state": best_state,
        "optimizer": optimizer_state,
        "scheduler": opt.scheduler.state_dict(),
        "scaler": opt.scaler.state_dict(),
        "rng": rng,
    }
    files.write_file_atomically(path, lambda tmp: torch.save(payload, tmp), "the checkpoint")


def read(path: Path) -> dict:
    """The checkpoint's contents; anything but plain tensors and values (code in a pickle) is refused."""
    if not path.is_file():
        raise LoraclsError(f"{path.parent} has no {path.name} to resume from")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise LoraclsError(
            f"{path} holds more than tensors and plain values, refused (loading it could run code): "
            f"{first_line(exc, 160)}"
        ) from None
    except Exception as exc:  # truncated or not a torch file at all
        raise LoraclsError(f"{path} is not a readable loracls checkpoint: {first_line(exc, 160)}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise LoraclsError(f"{path} is not a loracls checkpoint of format {FORMAT} (written by another version?)")
    try:
        CheckpointRecord.model_validate(payload)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise LoraclsError(f"{path} is not a valid loracls checkpoint: {where}: {problem['msg']}") from None
    return payload


def check_fits(payload: dict, trainable: dict[str, torch.Tensor], path: Path) -> None:
    """The checkpoint's tensors have the names and shapes of this model's trainable parameters, and its
    optimizer state one entry of the right shape per parameter (checked before any of it is loaded)."""
    shapes = {name: tuple(value.shape) for name, value in trainable.items()}
    for key in ("trainable", "best_state"):
        saved = {name: tuple(value.shape) for name, value in payload[key].items()}
        if saved and saved != shapes:
            name = next(iter(sorted(set(saved) ^ set(shapes))), None) or next(
                n for n in sorted(saved) if saved[n] != shapes[n]
            )
            raise LoraclsError(
                f"{path} does not fit this model: {key} tensor {name} is "
                f"{saved.get(name, 'absent')}, the model's is {shapes.get(name, 'absent')} "
                f"(a checkpoint of another model or LoRA setting?)"
            )
    indexed = [shapes[name] for name in trainable]
    for key, state in payload["optimizer"]["state"].items():
        expected = indexed[key] if isinstance(key, int) and key < len(indexed) else shapes.get(key)
        if expected is None:
            raise LoraclsError(f"{path} does not fit this model: optimizer state for parameter {key!r}, which it lacks")
        odd = [n for n, v in state.items() if isinstance(v, torch.Tensor) and v.dim() and tuple(v.shape) != expected]
        if odd:
            raise LoraclsError(
                f"{path} does not fit this model: optimizer {odd[0]} of parameter {key!r} is "
                f"{tuple(state[odd[0]].shape)}, the parameter's is {expected}"
            )


def restore(payload: dict, model, opt: Optimization) -> None:
    """Optimizer, scheduler, scaler and this process's RNG state from a checkpoint read by `read`."""
    optimizer, scheduler, scaler = opt.optimizer, opt.scheduler, opt.scaler
    if distributed.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, payload["optimizer"], options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if payload["scaler"]:
        scaler.load_state_dict(payload["scaler"])
    rng = payload["rng"]
    if len(rng) != distributed.world_size():
        raise LoraclsError(
            f"the checkpoint was written by {len(rng)} process(es); resume it with as many "
            f"(now {distributed.world_size()})"
        )
    set_rng_state(rng[distributed.rank()])


def save_adapter(directory: Path, model, state_dict: dict[str, torch.Tensor]) -> None:
    """The best adapter (method full: the best weights) so far, replacing the previous one in one step (rank 0
    writes), saved the way the model's method saves (model/methods.py)."""
    if distributed.is_main():
        method = method_named("lora" if hasattr(model, "peft_config") else "full")
        files.replace_dir(directory, lambda target: method.save(target, model, state_dict), "the best adapter")
