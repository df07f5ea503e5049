"""Data parallelism with torch.distributed, launched by `torchrun` or `accelerate launch`.

Every process builds the same global batches (same seed) and takes its slice; gradients of the trainable
parameters are summed across processes, which makes N processes with batch B compute what one process
computes with batch N*B.

- ddp: each process holds the whole model; after each accumulation group the trainable gradients (LoRA +
  head: a few hundred thousand numbers) are summed with one all-reduce. Rank 0 alone validates.
- fsdp: FSDP2 (`fully_shard`) per decoder layer and on the whole model, so each process holds 1/N of the
  weights and gathers a layer only while it runs; gradients are reduce-scattered as sums. Every process
  takes part in each forward pass, validation included; rank 0 writes the files.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from loracls.errors import LoraclsError


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank; after the job has left its process group, still the one torchrun gave it."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def init_from_environment() -> None:
    """Join the process group when launched with WORLD_SIZE > 1 (gloo on CPU, nccl on GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)


def joined() -> bool:
    """This process is in a process group already (a job started inside another job's)."""
    return dist.is_available() and dist.is_initialized()


def leave() -> None:
    """Leave the process group this process joined (the end of every job; a no-op in a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def local_device(device: torch.device) -> torch.device:
    if device.type == "cuda" and dist.is_initialized():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of decoder layers: its ModuleList holding the most parameters."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        raise LoraclsError(f"data_parallel: fsdp: {type(model).__name__} has no list of layers to shard; use ddp")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def shard_model(model: torch.nn.Module) -> int:
    """FSDP2 over the current process group: one unit per decoder layer, one for the rest; gradients are
    summed (not averaged) so the loss scaling stays the same as with ddp. Returns the number of units."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model, reshard_after_forward=True)  # so that the registered (sharded) params stay the optimizer's
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives: gloo has no PREMUL_SUM
    return len(layers) + 1


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_copy(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies of whole tensors; sharded ones are gathered (a collective: every process must call)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone() for name, t in tensors.items()
    }


def copy_into(param: torch.Tensor, value: torch.Tensor) -> None:
    """param <- value (a whole tensor); a sharded param takes its own shard, with no communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(param, DTensor):
            value = distribute_tensor(
                value.to(param.device, param.dtype), param.device_mesh, param.placements, src_data_rank=None
            )
        param.copy_(value)


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for param, grad in zip(params, grads):
        n = grad.numel()
        param.grad = flat[offset : offset + n].view_as(param).clone()
        offset += n


def sum_scalar(value: float) -> float:
    if world_size() == 1:
        return value
    box = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.SUM)
    return float(box.item())


def gather_object(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every process."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj):
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
