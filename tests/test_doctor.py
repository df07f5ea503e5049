"""Doctor checks: real on this CPU; ROCm / CUDA branches through faked device facts and properties."""

from types import SimpleNamespace

import pytest
import torch

from loracls import hardware
from loracls.cli import main
from loracls.compat import FAIL, OK, WARN, check_arch, gfx_version, hsa_override_for
from loracls.config_reader import load_config
from loracls.diagnostics import doctor
from loracls.diagnostics.doctor import check_matmul
from loracls.errors import LoraclsError
from loracls.hardware import DeviceFacts
from loracls.jobs.train import train


@pytest.mark.slow
def test_doctor_on_this_cpu(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for word in ("backend", "torch", "transformers", "peft", "matmul", "bf16", "bitsandbytes"):
        assert word in out
    assert "matches the CPU" in out and "measured matmul fp32" in out


@pytest.mark.parametrize(
    "arch, expected",
    [("gfx1030", "10.3.0"), ("gfx906", "9.0.6"), ("gfx90a", "9.0.10"), ("gfx1100", "11.0.0"), ("sm_80", None)],
)
def test_gfx_versions(arch, expected):
    assert gfx_version(arch) == expected


def test_rocm_arch_mismatch_gives_the_hsa_override():
    facts = DeviceFacts("rocm", "AMD Radeon RX 6600", "gfx1032", ["gfx900", "gfx906", "gfx1030", "gfx1100"])
    check = check_arch(facts)
    assert check.status == FAIL and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in check.detail
    assert hsa_override_for("gfx1102", facts.arch_list) == "11.0.0"
    assert check_arch(DeviceFacts("rocm", "MI210", "gfx90a", ["gfx90a", "gfx942"])).status == OK
    with_override = DeviceFacts("rocm", "RX 6600", "gfx1032", ["gfx1030"], hsa_override="10.3.0")
    assert check_arch(with_override).status == WARN
    lonely = check_arch(DeviceFacts("rocm", "old", "gfx803", ["gfx1030"]))
    assert lonely.status == FAIL and "install a ROCm torch" in lonely.detail


def test_cuda_arch_checks():
    assert check_arch(DeviceFacts("cuda", "A100", "sm_80", ["sm_75", "sm_80", "sm_90"])).status == OK
    assert check_arch(DeviceFacts("cuda", "RTX 3090", "sm_86", ["sm_80", "sm_90"])).status == OK
    assert check_arch(DeviceFacts("cuda", "H100", "sm_90", ["sm_80", "compute_80"])).status == WARN
    new = check_arch(DeviceFacts("cuda", "RTX 5090", "sm_120", ["sm_50", "sm_80", "sm_90"]))
    assert new.status == FAIL and "sm_120" in new.detail


def test_gather_facts_reads_rocm_properties(monkeypatch):
    props = SimpleNamespace(name="AMD Radeon RX 6600", gcnArchName="gfx1032:sramecc-:xnack-", major=10, minor=3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["gfx1030", "gfx1100"])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    facts = hardware.gather_facts()
    assert (facts.backend, facts.device_arch, facts.bf16_supported) == ("rocm", "gfx1032", True)
    assert check_arch(facts).status == FAIL
    monkeypatch.setattr(torch.version, "hip", None)
    facts = hardware.gather_facts()
    assert (facts.backend, facts.device_arch) == ("cuda", "sm_103")


@pytest.mark.slow
def test_device_that_cannot_compute_fails_and_doctor_exits_nonzero(monkeypatch, capsys):
    def broken_to(self, *args, **kwargs):
        raise RuntimeError("HIP error: invalid device function")

    monkeypatch.setattr(torch.Tensor, "to", broken_to)
    check = check_matmul(torch.device("cpu"))
    monkeypatch.undo()
    assert check.status == FAIL and "invalid device function" in check.detail
    monkeypatch.setattr(doctor, "check_matmul", lambda device: doctor.Check("matmul", FAIL, "cannot compute"))
    assert main(["doctor"]) == 1


def test_bitsandbytes_features_refused_on_cpu(tmp_path):
    for key in ("optimizer=adamw_8bit", "quantization=4bit"):
        config = load_config(None, [key, f"output_dir={tmp_path}"])
        with pytest.raises(LoraclsError, match="cannot work here: they need a CUDA or ROCm GPU"):
            train(config)
    assert not any(tmp_path.iterdir())


def test_train_refuses_a_gpu_the_torch_build_cannot_run(monkeypatch):
    from loracls.hardware import Runtime
    from loracls.jobs import preflight

    facts = DeviceFacts("rocm", "AMD Radeon RX 6600", "gfx1032", ["gfx1030", "gfx1100"])
    monkeypatch.setattr(preflight, "gather_facts", lambda index=0: facts)
    with pytest.raises(LoraclsError, match="GPU arch: gfx1032 .*HSA_OVERRIDE_GFX_VERSION=10.3.0"):
        preflight.check_gpu_arch(Runtime(torch.device("cuda"), torch.bfloat16))
    preflight.check_gpu_arch(Runtime(torch.device("cpu"), torch.float32))
