"""The machine: device and precision choice, the one reader of GPU arch / bf16 facts, peak FLOP/s, and the
environment record written into every run directory."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from dataclasses import dataclass, field

import torch

from loracls.errors import LoraclsError

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

# Dense bf16 tensor FLOP/s of known GPUs (vendor figures, no sparsity), matched against the device name;
# the first matching key wins, so longer names come first. Unknown GPUs get no MFU figure.
GPU_BF16_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "H800": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "A10G": 70.0,
    "A10": 125.0,
    "A40": 150.0,
    "A6000": 155.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "T4": 65.0,
    "V100": 125.0,
    "MI300X": 1307.0,
    "MI300A": 981.0,
    "MI250X": 383.0,
    "MI250": 362.0,
    "MI210": 181.0,
    "MI100": 92.0,
}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast

    @property
    def autocast(self):
        if self.dtype == torch.float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)


@dataclass
class DeviceFacts:
    backend: str  # rocm | cuda | mps | cpu
    device_name: str | None = None
    device_arch: str | None = None  # gfx1030 (ROCm), sm_86 (CUDA)
    arch_list: list[str] = field(default_factory=list)  # what the torch build was compiled for
    bf16_supported: bool = False
    hsa_override: str | None = None
    memory_gb: float | None = None


def backend_name() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _cpuinfo_field(name: str) -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(name):
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


def gather_facts(index: int = 0) -> DeviceFacts:
    """Backend, device name and arch, the torch build's archs and bf16 support: read here and nowhere else."""
    backend = backend_name()
    facts = DeviceFacts(backend=backend, hsa_override=os.environ.get("HSA_OVERRIDE_GFX_VERSION"))
    if backend in ("rocm", "cuda"):
        props = torch.cuda.get_device_properties(index)
        facts.device_name = props.name
        if backend == "rocm":
            facts.device_arch = str(getattr(props, "gcnArchName", "")).split(":")[0] or None
        else:
            facts.device_arch = f"sm_{props.major}{props.minor}"
        facts.arch_list = list(torch.cuda.get_arch_list())
        facts.bf16_supported = bool(torch.cuda.is_bf16_supported())
        total = getattr(props, "total_memory", None)
        facts.memory_gb = round(total / 2**30, 1) if total else None
    else:
        facts.device_name = "Apple MPS" if backend == "mps" else f"CPU: {cpu_model_name()}"
        facts.bf16_supported = backend == "mps" or cpu_has_native_bf16()
    return facts


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
    """fp32 on CPUs without native bf16 (bf16 autocast measured ~50x slower there); bf16 on GPUs that have it,
    fp16 (trained with a gradient scaler) on GPUs that do not."""
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if requested != "auto":
        if requested == "fp16" and device.type == "cpu":
            raise LoraclsError("precision fp16 is not supported on CPU; use fp32 or bf16")
        return table[requested]
    if device.type == "cuda":
        return torch.bfloat16 if gather_facts(device.index or 0).bf16_supported else torch.float16
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


def make_deterministic() -> None:
    """torch's deterministic algorithms (GPU atomics otherwise make two runs differ in the last bits)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before any GPU work
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def setup_runtime(device: str, precision: str, threads: int | None, deterministic: bool = False) -> Runtime:
    torch.set_num_threads(threads or os.cpu_count() or 1)
    if deterministic:
        make_deterministic()
    chosen = choose_device(device)
    return Runtime(device=chosen, dtype=choose_dtype(precision, chosen))


# --- peak FLOP/s, for the MFU the train loop logs --------------------------------------------------


def cpu_fma_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s at the precision trained in: threads x clock x 2 FMA pipes x SIMD lanes x 2 (AVX-512 / AVX2 have
    16 / 8 fp32 lanes); bf16 on a CPU with native bf16 (`avx512_bf16`: two bf16 products per fp32 lane and
    instruction) doubles it. bf16 elsewhere runs through fp32 units, so the fp32 peak applies. AMX tiles
    (`amx_bf16`) are not counted: on such CPUs the share shown is an upper bound."""
    try:
        with open("/proc/cpuinfo") as fh:
            mhz = max(float(line.split(":")[1]) for line in fh if line.startswith("cpu MHz"))
    except (OSError, ValueError):
        mhz = 2000.0
    flags = cpu_flags()
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    per_lane = 2 if dtype == torch.bfloat16 and "avx512_bf16" in flags else 1
    return torch.get_num_threads() * mhz * 1e6 * 2 * lanes * per_lane * 2


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """Dense bf16/fp16 tensor peak of a known GPU (fp32 runs get no figure: tensor cores are not in use)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for key, tflops in GPU_BF16_PEAK_TFLOPS.items():
        if key.lower() in (device_name or "").lower():
            return tflops * 1e12
    return None


def peak_flops(runtime: Runtime) -> float | None:
    """The device's peak FLOP/s at the precision trained in, or None when it is not known."""
    if runtime.device.type == "cpu":
        return cpu_fma_peak_flops(runtime.dtype)
    if runtime.device.type == "cuda":
        return gpu_peak_flops(gather_facts(runtime.device.index or 0).device_name or "", runtime.dtype)
    return None


# --- the environment record ------------------------------------------------------------------------


def device_description(device: torch.device) -> dict:
    if device.type == "cuda":
        facts = gather_facts(device.index or 0)
        return {"device_name": facts.device_name, "device_arch": facts.device_arch, "device_memory_gb": facts.memory_gb}
    return {
        "device_name": cpu_model_name(),
        "device_arch": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_native_bf16": cpu_has_native_bf16(),
    }


@dataclass
class Environment:
    """env.json in every run directory (and what `doctor` prints): versions and device facts."""

    python: str
    platform: str
    torch: str
    torch_hip: str | None
    torch_cuda: str | None
    transformers: str
    peft: str
    accelerate: str | None
    backend: str
    torch_threads: int
    device: str
    precision: str | None  # the compute dtype trained in; None outside a run
    device_name: str | None = None
    device_arch: str | None = None
    device_memory_gb: float | None = None  # GPUs
    cpu_count: int | None = None  # CPUs
    cpu_native_bf16: bool | None = None  # CPUs


def environment_record(runtime: Runtime | None = None) -> Environment:
    """Versions and device facts written to env.json in every run directory."""
    import peft
    import transformers

    try:
        import accelerate

        accelerate_version = accelerate.__version__
    except ImportError:
        accelerate_version = None
    device = runtime.device if runtime else torch.device("cpu")
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        torch=torch.__version__,
        torch_hip=torch.version.hip,
        torch_cuda=torch.version.cuda,
        transformers=transformers.__version__,
        peft=peft.__version__,
        accelerate=accelerate_version,
        backend=backend_name(),
        torch_threads=torch.get_num_threads(),
        device=str(device),
        precision=str(runtime.dtype).replace("torch.", "") if runtime else None,
        **device_description(device),
    )


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (find_library runs ldconfig), or None under another allocator."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Give memory the allocator holds but no tensor uses back to the system (glibc's malloc_trim): after
    training steps and validation batches of changing shapes, freed blocks stay in the heap and the
    resident size keeps growing. A no-op where glibc is not the allocator."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def memory_mb(device: torch.device) -> float:
    """Peak allocated memory on CUDA; the resident set of this process elsewhere (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20
    except OSError:
        return 0.0


# --- Ray (the optional `ray` extra) -----------------------------------------------------------------


@contextlib.contextmanager
def ray_session(address: str | None, cpus: int | None = None, command: str = "--engine ray"):
    """Ray for the length of a command: a cluster joined at `address` (`auto`, `ray://host:10001`), or with
    none a local Ray with `cpus` logical CPUs, started here and stopped after. One `loracls:` line where
    the `ray` extra is missing."""
    try:
        import ray
    except ImportError:
        raise LoraclsError(f"{command} needs the ray extra: pip install 'loracls[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        if not address:  # Ray starts its workers at nice 15: on a busy machine they would starve
            os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(
            address=address,
            num_cpus=None if address else cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="WARNING",
        )
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()
