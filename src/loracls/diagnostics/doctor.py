"""`loracls doctor`: can this machine train? Backend, versions, GPU arch vs the torch build, a real matmul,
bf16 support and speed, bitsandbytes. Facts are gathered once; every check is a pure function of them
(so the ROCm / CUDA branches are testable with faked device properties).
"""

from __future__ import annotations

import time

import torch

from loracls.compat import FAIL, OK, WARN, Check, check_arch, check_bitsandbytes
from loracls.errors import Log, first_line
from loracls.hardware import DeviceFacts, cpu_flags, environment_record, gather_facts

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
        return Check("matmul", FAIL, f"{device} cannot compute: {first_line(exc, 200)}")
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
        return Check(
            "bf16",
            OK if facts.bf16_supported else WARN,
            "native bf16: training uses bf16 autocast"
            if facts.bf16_supported
            else "no bf16 on this GPU: training uses fp16 autocast",
        )
    if facts.backend == "mps":
        return Check("bf16", OK, "MPS: fp32 by default")
    flags = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    speed = ""
    if measure:
        fp32, bf16 = cpu_bf16_speed()
        speed = f"; measured matmul fp32 {fp32 * 1e3:.1f} ms, bf16 {bf16 * 1e3:.1f} ms ({fp32 / bf16:.2f}x)"
    if facts.bf16_supported:
        return Check("bf16", OK, f"CPU has native bf16 ({', '.join(flags)}): auto precision = bf16 autocast{speed}")
    return Check(
        "bf16", OK, f"CPU has no native bf16: auto precision = fp32 (bf16 autocast would be far slower){speed}"
    )


# --- the report ----------------------------------------------------------------------------------


def run_checks(facts: DeviceFacts, device: torch.device, measure: bool = True) -> list[Check]:
    return [check_arch(facts), check_matmul(device), check_bf16(facts, measure), check_bitsandbytes(facts)]


def doctor(log: Log = print) -> int:
    """Print the environment and checks; exit code 1 when the device cannot compute."""
    facts = gather_facts()
    device = torch.device("cuda" if facts.backend in ("rocm", "cuda") else facts.backend)
    record = environment_record()
    log(f"backend       {facts.backend}")
    for key in ("torch", "torch_hip", "torch_cuda", "transformers", "peft", "accelerate", "python"):
        log(f"{key:<13} {getattr(record, key)}")
    log(f"device        {facts.device_name}" + (f" ({facts.device_arch})" if facts.device_arch else ""))
    if facts.arch_list:
        log(f"torch archs   {', '.join(facts.arch_list)}")
    checks = run_checks(facts, device)
    for check in checks:
        log(f"[{check.status:>4}] {check.name:<12} {check.detail}")
    return 1 if any(c.status == FAIL for c in checks) else 0
