"""Device choice and the GPU guards (course_utils.device), with every accelerator faked present or absent.

No GPU is needed: ``fake_machine`` makes torch.accelerator, torch.cuda, torch.backends.mps and torch.xpu
report the machine a test asks for (a laptop with none, an NVIDIA or AMD GPU, an Apple GPU, an Intel GPU).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from course_utils import device

#: The machines the tests fake: accelerator type, ROCm build or not, and what describes it.
MACHINES = {
    "none": (None, False, "none"),
    "nvidia": ("cuda", False, "CUDA: NVIDIA H200 (sm_90)"),
    "amd": ("cuda", True, "ROCm/HIP: AMD Instinct MI300X (gfx942)"),
    "apple": ("mps", False, "MPS (Apple GPU)"),
    "intel": ("xpu", False, "XPU: Intel(R) Arc(TM) A770 Graphics"),
}


@pytest.fixture(autouse=True)
def _no_course_device(monkeypatch):
    """Each test starts without ``COURSE_DEVICE`` (a GPU check's dry run sets it to cpu); tests that need it set it."""
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


def fake_machine(monkeypatch: pytest.MonkeyPatch, machine: str, count: int = 1) -> None:
    """Make torch report ``machine`` (a key of MACHINES) with ``count`` devices of its accelerator."""
    kind, rocm, _ = MACHINES[machine]
    built = {"nvidia": "cuda", "amd": "cuda", "apple": "mps", "intel": "xpu"}.get(machine)

    def current_accelerator(check_available: bool = False):
        if built is None or (check_available and kind is None):
            return None
        return torch.device(built)

    n = count if kind else 0
    monkeypatch.setattr(torch.accelerator, "current_accelerator", current_accelerator)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: n)
    monkeypatch.setattr(torch.version, "hip", "6.4.1" if rocm else None)
    monkeypatch.setattr(torch.version, "cuda", "13.0" if machine == "nvidia" else None)
    cuda = kind == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n if cuda else 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI300X" if rocm else "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 4) if rocm else (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=0: SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: kind == "mps")
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: machine == "apple")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: kind == "xpu")
    monkeypatch.setattr(torch.xpu, "device_count", lambda: n if kind == "xpu" else 0)
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 0)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i=None: "Intel(R) Arc(TM) A770 Graphics")


# ---- the real machine -------------------------------------------------------------------------

def test_default_device_matches_cuda_availability(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    expected = device.accelerator().type if device.accelerator() is not None else "cpu"
    assert device.get_device().type == expected
    if device.accelerator() is None:
        assert device.accelerator_description() == "none"


def test_override_to_cpu(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert device.get_device() == torch.device("cpu")


def test_nonsense_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "banana")
    with pytest.raises(ValueError, match="not a device torch understands"):
        device.get_device()


def test_a_device_type_the_course_cannot_run_on_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "meta")
    with pytest.raises(ValueError, match="COURSE_DEVICE='meta' names a device the course cannot run on.*'mps'"):
        device.get_device()


def test_torch_build_names_this_wheel():
    build = device.torch_build()
    if torch.version.cuda:
        assert build == f"CUDA {torch.version.cuda}"
    assert build  # never empty: "CPU only" at least


# ---- each accelerator faked present or absent ---------------------------------------------------

@pytest.mark.parametrize("machine", list(MACHINES))
def test_the_automatic_choice_is_the_accelerator_torch_sees(monkeypatch, machine):
    fake_machine(monkeypatch, machine)
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    kind, _, described = MACHINES[machine]
    # MPS only when asked for (COURSE_DEVICE=mps): the CPU lessons stay on a Mac's CPU
    assert device.get_device() == torch.device(kind if kind and kind != "mps" else "cpu")
    assert device.accelerator() == (torch.device(kind) if kind else None)
    assert device.accelerator_description() == described
    assert device.has_cuda() is (kind == "cuda")
    assert device.is_rocm() is (machine == "amd")


def test_a_cuda_build_without_a_gpu_has_no_accelerator(monkeypatch):
    """torch.accelerator names the build's accelerator even with no device; the course asks for one present."""
    fake_machine(monkeypatch, "none")
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: None if check_available else torch.device("cuda"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    assert device.accelerator() is None and device.get_device() == torch.device("cpu")
    assert device.torch_build() == "CUDA 13.0"


def test_several_devices_are_counted(monkeypatch):
    fake_machine(monkeypatch, "nvidia", count=8)
    assert device.accelerator_description() == "CUDA: NVIDIA H200 (sm_90), 8 devices"
    assert device.accelerator_count() == 8


@pytest.mark.parametrize(("machine", "build"), [("nvidia", "CUDA 13.0"), ("amd", "ROCm/HIP 6.4.1"),
                                                ("apple", "MPS (macOS)"), ("none", "CPU only")])
def test_torch_build_is_named(monkeypatch, machine, build):
    fake_machine(monkeypatch, machine)
    assert device.torch_build() == build


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("wanted", ["cuda", "mps", "xpu"])
def test_course_device_names_an_accelerator_present_or_absent(monkeypatch, machine, wanted):
    fake_machine(monkeypatch, machine)
    monkeypatch.setenv("COURSE_DEVICE", wanted)
    kind, _, described = MACHINES[machine]
    if kind == wanted:
        assert device.get_device() == torch.device(wanted)
        return
    label = wanted.upper()
    with pytest.raises(RuntimeError, match=f"COURSE_DEVICE='{wanted}' asks for {label}, but torch sees no {label} "
                                           "device") as err:
        device.get_device()
    message = str(err.value)
    assert f"the accelerator it sees is: {described}" in message and "Unset COURSE_DEVICE" in message
    assert "needs" in message  # what that accelerator would need


def test_cuda_requested_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(device, "has_cuda", lambda: False)
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="COURSE_DEVICE='cuda'.*no CUDA device"):
        device.get_device()


def test_a_device_index_past_the_last_one_is_a_clear_error(monkeypatch):
    fake_machine(monkeypatch, "nvidia", count=2)
    monkeypatch.setenv("COURSE_DEVICE", "cuda:1")
    assert device.get_device() == torch.device("cuda", 1)
    monkeypatch.setenv("COURSE_DEVICE", "cuda:2")
    with pytest.raises(RuntimeError, match=r"asks for CUDA device 2, but torch sees 2 CUDA devices \(indices 0 to 1\)"):
        device.get_device()


def test_rocm_answers_to_cuda(monkeypatch):
    fake_machine(monkeypatch, "amd")
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    assert device.get_device() == torch.device("cuda")
    assert device.cuda_description() == "AMD Instinct MI300X (gfx942)"


def test_torch_without_current_accelerator_falls_back_to_each_backend(monkeypatch):
    """The adapter for a torch below 2.7 (no check_available argument): each backend asked in turn."""
    fake_machine(monkeypatch, "intel")

    def old_current_accelerator():  # torch 2.6's signature
        return torch.device("xpu")

    monkeypatch.setattr(torch.accelerator, "current_accelerator", old_current_accelerator)
    assert device.accelerator() == torch.device("xpu")
    fake_machine(monkeypatch, "none")
    monkeypatch.delattr(torch.accelerator, "current_accelerator")
    assert device.accelerator() is None


def test_a_driver_that_raises_reads_as_absent(monkeypatch):
    fake_machine(monkeypatch, "nvidia")

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert device.has_cuda() is False
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: broken())
    assert device.accelerator() is None and device.accelerator_description() == "none"


# ---- the guards -------------------------------------------------------------------------------

def test_guard_prints_skip_message_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_cuda", lambda: False)
    monkeypatch.setattr(device, "accelerator", lambda: None)
    assert device.requires_cuda("CUDA graphs") is False
    assert capsys.readouterr().out.strip() == "skipped: needs CUDA (CUDA graphs)"


def test_guard_passes_with_cuda(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_cuda", lambda: True)
    monkeypatch.setattr(device, "is_rocm", lambda: False)
    assert device.requires_cuda("CUDA graphs") is True
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("machine", "runs", "printed"), [
    ("none", False, "skipped: needs CUDA (NCCL)"),
    ("nvidia", True, ""),
    ("amd", True, ""),
    ("apple", False, "skipped: needs CUDA (NCCL); torch sees MPS (Apple GPU), which this cell does not use"),
    ("intel", False, "skipped: needs CUDA (NCCL); torch sees XPU: Intel(R) Arc(TM) A770 Graphics, "
                     "which this cell does not use"),
])
def test_requires_cuda_on_each_machine(monkeypatch, capsys, machine, runs, printed):
    fake_machine(monkeypatch, machine)
    assert device.requires_cuda("NCCL") is runs
    assert capsys.readouterr().out.strip() == printed


def test_a_cell_that_needs_nvidia_skips_on_rocm(monkeypatch, capsys):
    fake_machine(monkeypatch, "amd")
    assert device.requires_cuda("ONNX Runtime's CUDA provider", allow_rocm=False) is False
    assert capsys.readouterr().out.strip() == ("skipped: needs an NVIDIA GPU (ONNX Runtime's CUDA provider); "
                                               "torch sees ROCm/HIP: AMD Instinct MI300X (gfx942)")
    fake_machine(monkeypatch, "nvidia")
    assert device.requires_cuda("ONNX Runtime's CUDA provider", allow_rocm=False) is True


@pytest.mark.parametrize(("machine", "printed"), [
    ("none", "skipped: needs an NVIDIA GPU with CUDA (FP8 matrix multiplies)"),
    ("apple", "skipped: needs an NVIDIA GPU with CUDA (FP8 matrix multiplies); torch sees MPS (Apple GPU), "
              "which this cell does not use"),
])
def test_a_cell_that_needs_nvidia_says_so_without_cuda(monkeypatch, capsys, machine, printed):
    fake_machine(monkeypatch, machine)
    assert device.requires_cuda("FP8 matrix multiplies", allow_rocm=False) is False
    assert capsys.readouterr().out.strip() == printed


@pytest.mark.parametrize("machine", list(MACHINES))
def test_requires_accelerator_on_each_machine(monkeypatch, capsys, machine):
    fake_machine(monkeypatch, machine)
    present = MACHINES[machine][0] is not None
    assert device.requires_accelerator("batched decoding") is present
    out = capsys.readouterr().out.strip()
    assert out == ("" if present else "skipped: needs an accelerator: CUDA, ROCm, MPS or XPU (batched decoding)")


def test_requires_accelerator_of_some_kinds(monkeypatch, capsys):
    fake_machine(monkeypatch, "apple")
    assert device.requires_accelerator("Inductor's Triton kernels", kinds=("cuda", "xpu")) is False
    assert capsys.readouterr().out.strip() == ("skipped: needs CUDA or XPU (Inductor's Triton kernels); "
                                               "torch sees MPS (Apple GPU), which this cell does not use")
    fake_machine(monkeypatch, "intel")
    assert device.requires_accelerator("Inductor's Triton kernels", kinds=("cuda", "xpu")) is True
    fake_machine(monkeypatch, "none")
    assert device.requires_accelerator("Inductor's Triton kernels", kinds=["cuda"]) is False
    assert capsys.readouterr().out.strip() == "skipped: needs CUDA (Inductor's Triton kernels)"


# ---- waiting for queued work ----------------------------------------------------------------------

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


def test_synchronize_waits_for_mps_and_xpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waited.append("mps"))
    monkeypatch.setattr(torch.xpu, "synchronize", lambda dev=None: waited.append(str(dev)))
    device.synchronize("mps")
    device.synchronize("xpu:0")
    assert waited == ["mps", "xpu:0"]
    fake_machine(monkeypatch, "apple")
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    device.synchronize()  # a Mac's course device is its CPU unless the learner opts in: nothing to wait for
    assert waited == ["mps", "xpu:0"]
    monkeypatch.setenv("COURSE_DEVICE", "mps")
    device.synchronize()  # opted in: the course's device is the Apple GPU
    assert waited[-1] == "mps"


# ---- accelerator_memory ---------------------------------------------------------------------------

GIB = 2**30


@pytest.mark.parametrize("machine, module, attr", [
    ("nvidia", torch.cuda, "get_device_properties"),
    ("amd", torch.cuda, "get_device_properties"),
    ("intel", torch.xpu, "get_device_properties"),
])
def test_accelerator_memory_is_the_device_total(monkeypatch, machine, module, attr):
    fake_machine(monkeypatch, machine)
    asked = []
    monkeypatch.setattr(module, attr, lambda i: asked.append(i) or SimpleNamespace(total_memory=141 * GIB))
    memory = device.accelerator_memory()
    assert memory == device.DeviceMemory(141 * GIB, "the device's own memory")
    assert asked == [0]
    device.accelerator_memory(f"{MACHINES[machine][0]}:1")  # an explicit index is asked for as given
    assert asked == [0, 1]


def test_accelerator_memory_on_a_mac_is_metals_recommended_working_set(monkeypatch):
    fake_machine(monkeypatch, "apple")
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * GIB)
    memory = device.accelerator_memory()
    assert memory.total_bytes == 12 * GIB and "unified memory" in memory.meaning


def test_accelerator_memory_is_none_without_an_accelerator_or_an_answer(monkeypatch):
    fake_machine(monkeypatch, "none")
    assert device.accelerator_memory() is None
    assert device.accelerator_memory("cpu") is None
    fake_machine(monkeypatch, "nvidia")

    def broken(i):
        raise RuntimeError("driver gone")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    assert device.accelerator_memory() is None


# ---- the guards' log (COURSE_GPU_CELLS), read by the GPU check ----------------------------------

def test_each_guard_logs_whether_its_cell_ran_and_why(monkeypatch, tmp_path, capsys):
    log = tmp_path / "gpu_cells.jsonl"
    monkeypatch.setenv("COURSE_GPU_CELLS", str(log))
    fake_machine(monkeypatch, "none")
    assert device.requires_cuda("CUDA graphs") is False
    assert device.requires_accelerator("batched decoding", kinds=("cuda", "xpu")) is False
    fake_machine(monkeypatch, "nvidia")
    assert device.requires_cuda("CUDA graphs") is True
    fake_machine(monkeypatch, "amd")
    assert device.requires_cuda("FP8", allow_rocm=False) is False
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["guard"], x["what"], x["ran"]) for x in lines] == [
        ("requires_cuda", "CUDA graphs", False), ("requires_accelerator", "batched decoding", False),
        ("requires_cuda", "CUDA graphs", True), ("requires_cuda", "FP8", False)]
    printed = capsys.readouterr().out.splitlines()
    skipped = [x["reason"] for x in lines if not x["ran"]]
    assert skipped == printed and all(r.startswith("skipped: ") for r in skipped)
    assert lines[2]["reason"] == "" and lines[2]["device"] == "CUDA: NVIDIA H200 (sm_90)"
    assert lines[3]["device"].startswith("ROCm/HIP")


@pytest.mark.parametrize("machine", ["nvidia", "amd", "apple", "intel"])
def test_course_device_cpu_keeps_the_gpu_cells_off_a_gpu_and_says_so(monkeypatch, tmp_path, capsys, machine):
    log = tmp_path / "gpu_cells.jsonl"
    monkeypatch.setenv("COURSE_GPU_CELLS", str(log))
    monkeypatch.setenv("COURSE_DEVICE", "CPU ")
    fake_machine(monkeypatch, machine)
    assert device.requires_accelerator("batched decoding") is False
    assert device.requires_cuda("CUDA graphs") is False
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("skipped: COURSE_DEVICE=cpu keeps the GPU cells off (batched decoding); "
                      f"unset it to run this cell on {MACHINES[machine][2]}")
    # A machine without CUDA still gets the plainer reason: it needs CUDA.
    assert out[1].startswith("skipped: COURSE_DEVICE=cpu" if MACHINES[machine][0] == "cuda" else "skipped: needs CUDA")
    assert [json.loads(line)["ran"] for line in log.read_text().splitlines()] == [False, False]
    monkeypatch.setenv("COURSE_DEVICE", "cuda" if MACHINES[machine][0] == "cuda" else MACHINES[machine][0])
    assert device.requires_accelerator("batched decoding") is True


def test_skip_cell_logs_the_cell_its_guard_let_run_as_skipped(monkeypatch, tmp_path, capsys):
    log = tmp_path / "gpu_cells.jsonl"
    monkeypatch.setenv("COURSE_GPU_CELLS", str(log))
    fake_machine(monkeypatch, "nvidia")
    assert device.requires_cuda("ONNX Runtime on CUDA", allow_rocm=False) is True
    device.skip_cell("this onnxruntime build has no CUDA provider")
    assert capsys.readouterr().out.strip() == "skipped: this onnxruntime build has no CUDA provider"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["what"], x["ran"]) for x in lines] == [("ONNX Runtime on CUDA", True), ("ONNX Runtime on CUDA", False)]
    assert lines[-1]["reason"] == "skipped: this onnxruntime build has no CUDA provider"


def test_without_the_variable_the_guards_write_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_GPU_CELLS", raising=False)
    monkeypatch.chdir(tmp_path)
    fake_machine(monkeypatch, "none")
    device.requires_cuda("CUDA graphs")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_log_does_not_stop_the_cell(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COURSE_GPU_CELLS", str(tmp_path / "missing" / "log.jsonl"))
    fake_machine(monkeypatch, "nvidia")
    assert device.requires_cuda("CUDA graphs") is True
    assert "cannot be written" in capsys.readouterr().out
