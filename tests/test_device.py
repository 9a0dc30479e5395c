import pytest
import torch

from course_utils import device


def test_default_device_matches_cuda_availability(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    expected = "cuda" if device.has_cuda() else "cpu"
    assert device.get_device().type == expected


def test_override_to_cpu(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert device.get_device() == torch.device("cpu")


def test_cuda_requested_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(device, "has_cuda", lambda: False)
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="COURSE_DEVICE='cuda'.*no CUDA device"):
        device.get_device()


def test_nonsense_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "banana")
    with pytest.raises(ValueError, match="not a device torch understands"):
        device.get_device()


def test_guard_prints_skip_message_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_cuda", lambda: False)
    assert device.requires_cuda("CUDA graphs") is False
    assert capsys.readouterr().out.strip() == "skipped: needs CUDA (CUDA graphs)"


def test_guard_passes_with_cuda(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_cuda", lambda: True)
    assert device.requires_cuda("CUDA graphs") is True
    assert capsys.readouterr().out == ""


def test_synchronize_waits_for_cuda_devices_only(monkeypatch):
    """Timing on a GPU needs the wait; on the CPU there is nothing to wait for (and no CUDA call)."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: waited.append(dev))
    device.synchronize("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    device.synchronize()  # the course's device, here the CPU
    assert waited == []
    device.synchronize("cuda:1")
    device.synchronize(torch.device("cuda", 0))
    assert waited == [torch.device("cuda:1"), torch.device("cuda:0")]
