"""Resumable checkpoints: written atomically after every validation, read with `weights_only=True`.

The file holds only tensors and plain Python values (loop state, optimizer / scheduler / gradient-scaler
state, every process's CPU and GPU RNG states), so loading it never runs code: a crafted pickle is refused
with one line instead of being executed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from loracls import files
from loracls.errors import LoraclsError, first_line
from loracls.training import distributed

FORMAT = 2


def rng_state() -> dict:
    """This process's random generators: the CPU one and every visible GPU's (dropout on a GPU draws there)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": list(cuda)}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise LoraclsError(f"the checkpoint holds RNG states of {len(state['cuda'])} GPU(s), this process sees "
                               f"{torch.cuda.device_count()}; resume with the same GPUs visible")
        torch.cuda.set_rng_state_all(state["cuda"])


def _optimizer_state(model, optimizer, sharded: bool) -> dict:
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save(path: Path, model, optimizer, scheduler, scaler, loop: dict, trainable: dict, best_state: dict) -> None:
    """Every process calls (each one's RNG state is kept; a sharded model's state is gathered); rank 0 writes."""
    sharded = distributed.is_sharded(model)
    rng = distributed.gather_object(rng_state())  # ranks draw different amounts (dropout)
    if not (sharded or distributed.is_main()):
        return
    trainable = distributed.full_copy(trainable)
    optimizer_state = _optimizer_state(model, optimizer, sharded)
    if not distributed.is_main():
        return
    payload = {"format": FORMAT, "loop": loop, "trainable": trainable, "best_state": best_state,
               "optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
               "rng": rng}
    files.write_file_atomically(path, lambda tmp: torch.save(payload, tmp), "the checkpoint")


def read(path: Path) -> dict:
    """The checkpoint's contents; anything but plain tensors and values (code in a pickle) is refused."""
    if not path.is_file():
        raise LoraclsError(f"{path.parent} has no {path.name} to resume from")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise LoraclsError(f"{path} holds more than tensors and plain values, refused (loading it could run code): "
                           f"{first_line(exc, 160)}") from None
    except Exception as exc:  # truncated or not a torch file at all
        raise LoraclsError(f"{path} is not a readable loracls checkpoint: {first_line(exc, 160)}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise LoraclsError(f"{path} is not a loracls checkpoint of format {FORMAT} (written by another version?)")
    return payload


def restore(payload: dict, model, optimizer, scheduler, scaler) -> None:
    """Optimizer, scheduler, scaler and this process's RNG state from a checkpoint read by `read`."""
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
        raise LoraclsError(f"the checkpoint was written by {len(rng)} process(es); resume it with as many "
                           f"(now {distributed.world_size()})")
    set_rng_state(rng[distributed.rank()])
