"""The doctor's device line: the device the course will use, the accelerator torch sees and what torch is
built for, with each accelerator faked (``fake_machine`` from test_device) and an NVIDIA driver faked unused."""

from __future__ import annotations

import pytest
import torch
from test_device import fake_machine

from course_utils.kit import doctor


@pytest.fixture(autouse=True)
def no_nvidia_driver(monkeypatch, tmp_path):
    """No NVIDIA driver unless a test writes one (this machine's own must not decide the tests)."""
    monkeypatch.setattr(doctor, "NVIDIA_DRIVER_FILE", tmp_path / "proc" / "driver" / "nvidia" / "version")
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


def load_driver(tmp_path) -> None:
    """Make the faked NVIDIA driver file exist (as /proc/driver/nvidia/version does while it is loaded)."""
    driver = doctor.NVIDIA_DRIVER_FILE
    driver.parent.mkdir(parents=True)
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")


def test_the_device_line_here():
    check = doctor.check_device()
    assert check.ok and not check.warning, check.line()
    assert check.detail.startswith(("cpu; accelerator: ", "cuda; accelerator: ")) and "is built for" in check.detail
    assert torch.__version__ in check.detail


@pytest.mark.parametrize(("machine", "line"), [
    ("none", "ok    device: cpu; accelerator: none; torch {v} is built for CPU only"),
    ("nvidia", "ok    device: cuda; accelerator: CUDA: NVIDIA H200 (sm_90); torch {v} is built for CUDA 13.0"),
    ("amd", "ok    device: cuda; accelerator: ROCm/HIP: AMD Instinct MI300X (gfx942); torch {v} is built for "
            "ROCm/HIP 6.4.1"),
    ("apple", "ok    device: cpu; accelerator: MPS (Apple GPU); torch {v} is built for MPS (macOS)"),
])
def test_the_doctor_names_the_accelerator(monkeypatch, machine, line):
    fake_machine(monkeypatch, machine)
    assert doctor.check_device().line() == line.format(v=torch.__version__)


def test_an_absent_course_device_fails_with_a_fix(monkeypatch):
    fake_machine(monkeypatch, "nvidia")
    monkeypatch.setenv("COURSE_DEVICE", "mps")
    check = doctor.check_device()
    assert not check.ok and "asks for MPS, but torch sees no MPS device" in check.detail
    assert "CUDA: NVIDIA H200 (sm_90)" in check.detail and "unset COURSE_DEVICE" in check.fix


def test_a_cpu_only_torch_beside_an_nvidia_driver_warns(monkeypatch, tmp_path):
    fake_machine(monkeypatch, "none")
    load_driver(tmp_path)
    check = doctor.check_device()
    assert check.ok and check.warning, check.line()
    assert "this torch is a CPU-only build, so the GPU goes unused" in check.detail
    assert "`make clean setup` without TORCH=cpu" in check.fix


def test_a_cuda_build_that_sees_no_gpu_beside_a_driver_warns(monkeypatch, tmp_path):
    fake_machine(monkeypatch, "none")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    load_driver(tmp_path)
    check = doctor.check_device()
    assert check.warning and "built for CUDA 13.0) sees no CUDA device" in check.detail
    assert "nvidia-smi" in check.fix and "CUDA_VISIBLE_DEVICES" in check.fix


def test_no_warning_where_torch_uses_the_gpu_or_there_is_no_driver(monkeypatch, tmp_path):
    fake_machine(monkeypatch, "none")
    assert not doctor.check_device().warning  # no driver: a laptop without an NVIDIA GPU
    load_driver(tmp_path)
    fake_machine(monkeypatch, "nvidia")
    assert not doctor.check_device().warning
    assert doctor.unused_gpu("MPS (Apple GPU)", "MPS (macOS)", doctor.NVIDIA_DRIVER_FILE) is None
