"""Checks that run before anything is written: a setup that cannot work is refused up front, in one line."""

from __future__ import annotations

from loracls.compat import FAIL, check_arch, require_bitsandbytes
from loracls.config import Config
from loracls.errors import LoraclsError
from loracls.hardware import backend_name, gather_facts


def check_memory_savers(config: Config, runtime) -> None:
    """8-bit optimizers and QLoRA need bitsandbytes on a GPU: refuse them clearly anywhere else."""
    backend = backend_name() if runtime.device.type == "cuda" else runtime.device.type
    if config.optimizer == "adamw_8bit":
        require_bitsandbytes("optimizer adamw_8bit", backend)
    if config.quantization != "none":
        require_bitsandbytes(f"quantization {config.quantization} (QLoRA)", backend)


def check_gpu_arch(runtime) -> None:
    """A torch build without kernels for this GPU fails late and obscurely: refuse up front with the fix."""
    if runtime.device.type != "cuda":
        return
    check = check_arch(gather_facts(runtime.device.index or 0))
    if check.status == FAIL:
        raise LoraclsError(f"GPU arch: {check.detail}")


def preflight(config: Config, runtime) -> None:
    check_memory_savers(config, runtime)
    check_gpu_arch(runtime)
