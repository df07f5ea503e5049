"""`loracls doctor`: can this machine train? Backend, versions, GPU arch vs the torch build, a real matmul,
bf16 support and speed, bitsandbytes. Facts are gathered once; every check is a pure function of them
(so the ROCm / CUDA branches are testable with faked device properties).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

import torch

from loracls.env import backend_name, cpu_flags, cpu_has_native_bf16, cpu_model_name, environment_record
from loracls.errors import LoraclsError

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class DeviceFacts:
    backend: str  # rocm | cuda | mps | cpu
    device_name: str | None = None
    device_arch: str | None = None  # gfx1030 (ROCm), sm_86 (CUDA)
    arch_list: list[str] = field(default_factory=list)  # what the torch build was compiled for
    bf16_supported: bool = False
    hsa_override: str | None = None


@dataclass
class Check:
    name: str
    status: str
    detail: str


def gather_facts() -> DeviceFacts:
    backend = backend_name()
    facts = DeviceFacts(backend=backend, hsa_override=os.environ.get("HSA_OVERRIDE_GFX_VERSION"))
    if backend in ("rocm", "cuda"):
        props = torch.cuda.get_device_properties(0)
        facts.device_name = props.name
        if backend == "rocm":
            facts.device_arch = str(getattr(props, "gcnArchName", "")).split(":")[0] or None
        else:
            facts.device_arch = f"sm_{props.major}{props.minor}"
        facts.arch_list = list(torch.cuda.get_arch_list())
        facts.bf16_supported = bool(torch.cuda.is_bf16_supported())
    else:
        facts.device_name = "Apple MPS" if backend == "mps" else f"CPU: {cpu_model_name()}"
        facts.bf16_supported = backend == "mps" or cpu_has_native_bf16()
    return facts


# --- GPU architecture against the torch build ----------------------------------------------------


def gfx_version(arch: str) -> str | None:
    """gfx1030 -> 10.3.0, gfx906 -> 9.0.6, gfx90a -> 9.0.10 (the HSA_OVERRIDE_GFX_VERSION form)."""
    match = re.fullmatch(r"gfx(\d{1,2})([0-9a-f])([0-9a-f])", arch)
    if not match:
        return None
    return f"{int(match.group(1))}.{int(match.group(2), 16)}.{int(match.group(3), 16)}"


def hsa_override_for(arch: str, arch_list: list[str]) -> str | None:
    """The override that makes a GPU use kernels built for its family's supported sibling (gfx1032 -> gfx1030)."""
    family = arch[:-1]
    siblings = sorted(a for a in arch_list if a.startswith(family) and gfx_version(a))
    return gfx_version(siblings[0]) if siblings else None


def _sm(arch: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)a?", arch)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_arch(facts: DeviceFacts) -> Check:
    if facts.backend not in ("rocm", "cuda"):
        return Check("gpu arch", OK, f"no GPU ({facts.backend}); nothing to match")
    arch, built = facts.device_arch or "?", ", ".join(facts.arch_list) or "none"
    if facts.backend == "rocm":
        if arch in facts.arch_list:
            return Check("gpu arch", OK, f"{arch} is in this torch build ({built})")
        override = hsa_override_for(arch, facts.arch_list)
        if facts.hsa_override:
            return Check("gpu arch", WARN, f"{arch} is not in this torch build ({built}); running with "
                                           f"HSA_OVERRIDE_GFX_VERSION={facts.hsa_override}")
        advice = (f"export HSA_OVERRIDE_GFX_VERSION={override} to run this build's kernels for its sibling"
                  if override else "install a ROCm torch build that lists it (no sibling arch to override to)")
        return Check("gpu arch", FAIL, f"{arch} is not in this torch build ({built}): kernels will fail; {advice}")
    device = _sm(arch)
    if arch in facts.arch_list:
        return Check("gpu arch", OK, f"{arch} is in this torch build ({built})")
    for built_arch in facts.arch_list:
        other = _sm(built_arch)
        if device and other and other[0] == device[0] and other[1] <= device[1] and built_arch.startswith("sm_"):
            return Check("gpu arch", OK, f"{arch} runs the {built_arch} kernels of this torch build")
        if device and other and built_arch.startswith("compute_") and other <= device:
            return Check("gpu arch", WARN, f"{arch} has no prebuilt kernels; PTX {built_arch} will be JIT-compiled (slow start)")
    return Check("gpu arch", FAIL, f"{arch} is not supported by this torch build ({built}); "
                                   f"install a torch built for it (a newer CUDA wheel)")


# --- real computation ----------------------------------------------------------------------------


def check_matmul(device: torch.device) -> Check:
    """A real matmul on the device, compared with the CPU's result."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=generator)
    b = torch.randn(256, 256, generator=generator)
    expected = a @ b
    try:
        got = (a.to(device) @ b.to(device)).cpu()
    except Exception as exc:  # a broken driver / arch shows up here
        return Check("matmul", FAIL, f"{device} cannot compute: {str(exc).splitlines()[0][:200]}")
    error = float((got - expected).abs().max() / expected.abs().max())
    if not torch.isfinite(got).all() or error > 1e-2:
        return Check("matmul", FAIL, f"{device} computes wrong results (relative error {error:.2e})")
    return Check("matmul", OK, f"256x256 on {device} matches the CPU (relative error {error:.1e})")


def cpu_bf16_speed(repeats: int = 5) -> tuple[float, float]:
    """Seconds per (512x640 @ 640x2048) matmul in fp32 and bf16 on this CPU."""
    a, b = torch.randn(512, 640), torch.randn(640, 2048)
    timings = []
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        start = time.perf_counter()
        for _ in range(repeats):
            x @ y
        timings.append((time.perf_counter() - start) / repeats)
    return timings[0], timings[1]


def check_bf16(facts: DeviceFacts, measure: bool = True) -> Check:
    if facts.backend in ("rocm", "cuda"):
        return Check("bf16", OK if facts.bf16_supported else WARN,
                     "native bf16: training uses bf16 autocast" if facts.bf16_supported
                     else "no bf16 on this GPU: training uses fp16 autocast")
    if facts.backend == "mps":
        return Check("bf16", OK, "MPS: fp32 by default")
    flags = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    speed = ""
    if measure:
        fp32, bf16 = cpu_bf16_speed()
        speed = f"; measured matmul fp32 {fp32 * 1e3:.1f} ms, bf16 {bf16 * 1e3:.1f} ms ({fp32 / bf16:.2f}x)"
    if facts.bf16_supported:
        return Check("bf16", OK, f"CPU has native bf16 ({', '.join(flags)}): auto precision = bf16 autocast{speed}")
    return Check("bf16", OK, f"CPU has no native bf16: auto precision = fp32 (bf16 autocast would be far slower){speed}")


# --- bitsandbytes (8-bit optimizers, QLoRA) ---------------------------------------------------------


def bitsandbytes_version() -> str | None:
    try:
        import bitsandbytes

        return bitsandbytes.__version__
    except Exception:  # import fails in many ways (missing, no GPU library)
        return None


def bitsandbytes_problem(backend: str) -> str | None:
    """Why 8-bit optimizers / QLoRA cannot work here, or None when they can."""
    if backend not in ("cuda", "rocm"):
        return f"they need a CUDA or ROCm GPU and this machine trains on {backend}"
    if bitsandbytes_version() is None:
        return "bitsandbytes is not importable here (pip install bitsandbytes)"
    return None


def check_bitsandbytes(facts: DeviceFacts) -> Check:
    problem = bitsandbytes_problem(facts.backend)
    version = bitsandbytes_version()
    if problem:
        return Check("bitsandbytes", WARN, f"{'bitsandbytes ' + version if version else 'not installed'}: "
                                           f"8-bit optimizers and QLoRA are refused ({problem})")
    return Check("bitsandbytes", OK, f"bitsandbytes {version}: optimizer adamw_8bit and quantization 4bit/8bit available")


def require_bitsandbytes(feature: str, backend: str) -> None:
    problem = bitsandbytes_problem(backend)
    if problem:
        raise LoraclsError(f"{feature} cannot work here: {problem}")


# --- the report ----------------------------------------------------------------------------------


def run_checks(facts: DeviceFacts, device: torch.device, measure: bool = True) -> list[Check]:
    return [check_arch(facts), check_matmul(device), check_bf16(facts, measure), check_bitsandbytes(facts)]


def doctor(log=print) -> int:
    """Print the environment and checks; exit code 1 when the device cannot compute."""
    facts = gather_facts()
    device = torch.device("cuda" if facts.backend in ("rocm", "cuda") else facts.backend)
    record = environment_record()
    log(f"backend       {facts.backend}")
    for key in ("torch", "torch_hip", "torch_cuda", "transformers", "peft", "accelerate", "python"):
        log(f"{key:<13} {record.get(key)}")
    log(f"device        {facts.device_name}" + (f" ({facts.device_arch})" if facts.device_arch else ""))
    if facts.arch_list:
        log(f"torch archs   {', '.join(facts.arch_list)}")
    checks = run_checks(facts, device)
    for check in checks:
        log(f"[{check.status:>4}] {check.name:<12} {check.detail}")
    return 1 if any(c.status == FAIL for c in checks) else 0
