"""Can this machine run it? The GPU's arch against the torch build (with the ROCm HSA_OVERRIDE_GFX_VERSION
fix), and bitsandbytes for 8-bit optimizers / QLoRA. Pure functions of `DeviceFacts`, so the ROCm and CUDA
branches are testable with faked facts; used by `doctor` and by the train job's preflight."""

from __future__ import annotations

import re
from dataclasses import dataclass

from loracls.errors import LoraclsError
from loracls.hardware import DeviceFacts

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    detail: str


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
            return Check(
                "gpu arch",
                WARN,
                f"{arch} is not in this torch build ({built}); running with "
                f"HSA_OVERRIDE_GFX_VERSION={facts.hsa_override}",
            )
        advice = (
            f"export HSA_OVERRIDE_GFX_VERSION={override} to run this build's kernels for its sibling"
            if override
            else "install a ROCm torch build that lists it (no sibling arch to override to)"
        )
        return Check("gpu arch", FAIL, f"{arch} is not in this torch build ({built}): kernels will fail; {advice}")
    device = _sm(arch)
    if arch in facts.arch_list:
        return Check("gpu arch", OK, f"{arch} is in this torch build ({built})")
    for built_arch in facts.arch_list:
        other = _sm(built_arch)
        if device and other and other[0] == device[0] and other[1] <= device[1] and built_arch.startswith("sm_"):
            return Check("gpu arch", OK, f"{arch} runs the {built_arch} kernels of this torch build")
        if device and other and built_arch.startswith("compute_") and other <= device:
            return Check(
                "gpu arch", WARN, f"{arch} has no prebuilt kernels; PTX {built_arch} will be JIT-compiled (slow start)"
            )
    return Check(
        "gpu arch",
        FAIL,
        f"{arch} is not supported by this torch build ({built}); install a torch built for it (a newer CUDA wheel)",
    )


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
        return Check(
            "bitsandbytes",
            WARN,
            f"{'bitsandbytes ' + version if version else 'not installed'}: "
            f"8-bit optimizers and QLoRA are refused ({problem})",
        )
    return Check(
        "bitsandbytes", OK, f"bitsandbytes {version}: optimizer adamw_8bit and quantization 4bit/8bit available"
    )


def require_bitsandbytes(feature: str, backend: str) -> None:
    problem = bitsandbytes_problem(backend)
    if problem:
        raise LoraclsError(f"{feature} cannot work here: {problem}")
