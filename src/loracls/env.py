"""Environment stage: pick the device and precision, and record versions for every run directory."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from loracls.errors import LoraclsError

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast

    @property
    def autocast(self):
        if self.dtype == torch.float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)


def backend_name() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _cpuinfo_field(field: str) -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model_name() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    return set(_cpuinfo_field("flags").split())


def cpu_has_native_bf16() -> bool:
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def choose_device(requested: str) -> torch.device:
    if requested == "auto":
        backend = backend_name()
        return torch.device({"rocm": "cuda", "cuda": "cuda", "mps": "mps"}.get(backend, "cpu"))
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise LoraclsError(f"config: unknown device {requested!r} (auto, cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoraclsError(f"device {requested!r} asked for, but this torch sees no GPU (torch {torch.__version__})")
    if device.type == "mps" and backend_name() != "mps":
        raise LoraclsError("device 'mps' asked for, but MPS is not available")
    return device


def choose_dtype(requested: str, device: torch.device) -> torch.dtype:
    """fp32 on CPUs without native bf16 (bf16 autocast measured ~50x slower there); bf16 on GPUs that have it."""
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if requested != "auto":
        if requested == "fp16" and device.type == "cpu":
            raise LoraclsError("precision fp16 is not supported on CPU; use fp32 or bf16")
        return table[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def precision_reason(runtime: Runtime, requested: str) -> str:
    name = str(runtime.dtype).replace("torch.", "")
    if requested != "auto":
        return f"{name} (as configured)"
    if runtime.device.type == "cpu":
        if runtime.dtype == torch.bfloat16:
            return f"{name} autocast (this CPU has native bf16: {', '.join(sorted(cpu_flags() & set(BF16_CPU_FLAGS)))})"
        return f"{name} (this CPU has no native bf16; bf16 autocast would be far slower)"
    return f"{name} ({runtime.device.type} default)"


def setup_runtime(device: str, precision: str, threads: int | None) -> Runtime:
    torch.set_num_threads(threads or os.cpu_count() or 1)
    chosen = choose_device(device)
    return Runtime(device=chosen, dtype=choose_dtype(precision, chosen))


def device_description(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        arch = getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}"
        return {"device_name": props.name, "device_arch": arch, "device_memory_gb": round(props.total_memory / 2**30, 1)}
    return {"device_name": cpu_model_name(), "device_arch": platform.machine(),
            "cpu_count": os.cpu_count(), "cpu_native_bf16": cpu_has_native_bf16()}


def environment_record(runtime: Runtime | None = None) -> dict:
    """Versions and device facts written to env.json in every run directory."""
    import peft
    import transformers

    record = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_hip": torch.version.hip,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "backend": backend_name(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import accelerate

        record["accelerate"] = accelerate.__version__
    except ImportError:
        record["accelerate"] = None
    device = runtime.device if runtime else torch.device("cpu")
    record["device"] = str(device)
    record["precision"] = str(runtime.dtype).replace("torch.", "") if runtime else None
    record.update(device_description(device))
    return record
