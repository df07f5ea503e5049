"""Data parallelism with torch.distributed, launched by `torchrun` or `accelerate launch`.

Every process builds the same global batches (same seed) and takes its slice; after each accumulation
group the gradients of the trainable parameters (LoRA + head: a few hundred thousand numbers) are summed
across processes, which makes N processes with batch B compute what one process computes with batch N*B.
Rank 0 alone validates, writes files and decides early stopping.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init_from_environment() -> None:
    """Join the process group when launched with WORLD_SIZE > 1 (gloo on CPU, nccl on GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)


def local_device(device: torch.device) -> torch.device:
    if device.type == "cuda" and dist.is_initialized():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for param, grad in zip(params, grads):
        n = grad.numel()
        param.grad = flat[offset:offset + n].view_as(param).clone()
        offset += n


def sum_scalar(value: float) -> float:
    if world_size() == 1:
        return value
    box = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.SUM)
    return float(box.item())


def broadcast_object(obj):
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
