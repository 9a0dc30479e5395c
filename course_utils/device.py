"""Which device to run on, which accelerator torch sees, and guards for cells that need one.

PyTorch 2 drives several kinds of accelerator, and ``torch.accelerator`` (torch 2.7 and later, so
every torch the course supports) names the one this build of torch was made for:

- ``cuda``: an NVIDIA GPU, or an AMD GPU with torch's ROCm build (which answers through
  ``torch.cuda`` too and sets ``torch.version.hip``);
- ``mps``: the GPU of an Apple silicon Mac (Metal Performance Shaders);
- ``xpu``: an Intel GPU, with torch's XPU build.

The lessons measure on the CPU on every machine; the GPU cells go further where there is a GPU.
Two guards keep those cells honest on other machines: ``requires_cuda`` for cells written
against ``torch.cuda`` (CUDA graphs, NCCL, CUDA memory snapshots) and ``requires_accelerator``
for cells that run on whichever accelerator is there. ``COURSE_DEVICE`` (``cpu``, ``cuda``,
``cuda:1``, ``mps``, ``xpu``) overrides ``get_device()``'s automatic choice: naming a device the
machine lacks is an error (the doctor's device line fails), so GPU CI sets ``COURSE_DEVICE=cuda``
and a missing GPU fails loudly instead of silently testing the CPU path; ``COURSE_DEVICE=cpu``
makes both guards skip, saying so, on a machine that has a GPU.

``COURSE_GPU_CELLS`` names a JSON-lines file to which every guard appends what it decided (the
cell's ``what``, ran or skipped, and why), so a GPU check can tell which GPU cells really ran
(``course_utils.kit.gpu_check``); unset, nothing is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import NamedTuple

import torch
from .text import counted

#: Device types ``COURSE_DEVICE`` may name, besides the type ``torch.accelerator`` reports.
KNOWN_TYPES = ("cpu", "cuda", "mps", "xpu")

#: What each accelerator type needs, for the error when ``COURSE_DEVICE`` names one that is absent.
_NEEDS = {
    "cuda": "an NVIDIA GPU with its driver and torch's CUDA build, or an AMD GPU with torch's ROCm build",
    "mps": "a Mac with Apple silicon (macOS 12.3 or newer) and torch's macOS wheel",
    "xpu": "an Intel GPU with its driver and torch's XPU build",
}
_LABELS = {"cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}


def _backend_available(kind: str) -> bool:
    """Return whether torch can use a device of type ``kind`` (``cpu``, ``cuda``, ``mps``, ``xpu``) here.

    Asks that backend's own module, so it answers for any type, not only the one
    ``torch.accelerator`` reports. A broken driver install reads as "not available".
    """
    try:
        if kind == "cpu":
            return True
        if kind == "cuda":
            return torch.cuda.is_available() and torch.cuda.device_count() > 0
        if kind == "mps":
            return torch.backends.mps.is_available()
        if kind == "xpu":
            xpu = getattr(torch, "xpu", None)
            return xpu is not None and xpu.is_available() and xpu.device_count() > 0
    except Exception:  # noqa: BLE001 (a driver that fails to load must not stop a notebook)
        return False
    return False


def has_cuda() -> bool:
    """Return True when a usable CUDA device is present (an NVIDIA GPU, or an AMD GPU under ROCm)."""
    return _backend_available("cuda")


def is_rocm() -> bool:
    """Return True when this torch is a ROCm (HIP) build, whose ``torch.cuda`` drives AMD GPUs."""
    return bool(getattr(torch.version, "hip", None))


def accelerator() -> torch.device | None:
    """Return the accelerator torch can use here (a device type without an index), or None.

    ``torch.accelerator.current_accelerator(check_available=True)`` answers: the accelerator this
    build of torch was compiled for, and only when a device of it is there now (a CUDA build on a
    laptop without a GPU gives None). Older torch releases without that call (before 2.7, below the
    course's floor) fall back to asking CUDA, XPU and MPS in turn.
    """
    try:
        found = torch.accelerator.current_accelerator(check_available=True)
    except (AttributeError, TypeError):  # torch < 2.7: no such call, or no check_available
        return next((torch.device(k) for k in ("cuda", "xpu", "mps") if _backend_available(k)), None)
    except RuntimeError:  # a driver that fails while torch looks for it
        return None
    return None if found is None else torch.device(found.type)


def accelerator_count() -> int:
    """Return how many devices of ``accelerator()``'s type torch sees (0 without an accelerator)."""
    acc = accelerator()
    if acc is None:
        return 0
    try:
        return int(torch.accelerator.device_count())
    except (AttributeError, RuntimeError):
        return int(torch.get_device_module(acc.type).device_count())


def _cuda_line(idx: int) -> str:
    """Return one CUDA device's name and architecture: ``sm_XY`` on NVIDIA, the gfx name on ROCm."""
    name = torch.cuda.get_device_name(idx)
    if is_rocm():
        arch = getattr(torch.cuda.get_device_properties(idx), "gcnArchName", "") or "unknown arch"
        return f"{name} ({arch.split(':')[0]})"
    major, minor = torch.cuda.get_device_capability(idx)
    return f"{name} (sm_{major}{minor})"


def cuda_description() -> str:
    """Return the CUDA device name and compute capability (the gfx name on ROCm), or ``"none"``."""
    if not has_cuda():
        return "none"
    return _cuda_line(torch.cuda.current_device())


def accelerator_description() -> str:
    """Return the accelerator torch sees, in words, or ``"none"``.

    ``"CUDA: NVIDIA H200 (sm_90)"``, ``"ROCm/HIP: AMD Instinct MI300X (gfx942)"``,
    ``"MPS (Apple GPU)"``, ``"XPU: Intel(R) Arc(TM) A770 Graphics"``; with more than one device
    of the kind, their number follows (``", 8 devices"``).
    """
    acc = accelerator()
    if acc is None:
        return "none"
    try:
        if acc.type == "cuda":
            line = ("ROCm/HIP: " if is_rocm() else "CUDA: ") + _cuda_line(torch.cuda.current_device())
        elif acc.type == "mps":
            line = "MPS (Apple GPU)"
        elif acc.type == "xpu":
            line = f"XPU: {torch.xpu.get_device_name(torch.xpu.current_device())}"
        else:  # an out-of-tree backend (PrivateUse1, HPU, ...): its type is all torch promises
            line = acc.type.upper()
        count = accelerator_count()
    except Exception as err:  # noqa: BLE001 (a description must not raise)
        return f"{acc.type.upper()} (its details cannot be read: {type(err).__name__}: {err})"
    return line + (f", {count} devices" if count > 1 else "")


class DeviceMemory(NamedTuple):
    """How much memory an accelerator offers: ``total_bytes``, and in words what that figure counts."""

    total_bytes: int
    meaning: str


def accelerator_memory(device: torch.device | str | None = None) -> DeviceMemory | None:
    """Return the memory of ``device`` (default: ``accelerator()``), or None where torch reports none.

    CUDA (NVIDIA, or AMD under ROCm) and XPU report the device's own memory
    (``get_device_properties(i).total_memory``). An Apple GPU shares the Mac's memory with the CPU,
    so for MPS the figure is the working set Metal recommends one process stays within
    (``torch.mps.recommended_max_memory()``), not the size of the RAM. The CPU, other device types
    and a driver that fails to answer give None: a description must not stop a notebook.
    """
    dev = accelerator() if device is None else torch.device(device)
    if dev is None:
        return None
    try:
        if dev.type in ("cuda", "xpu"):
            module = torch.cuda if dev.type == "cuda" else torch.xpu
            idx = dev.index if dev.index is not None else module.current_device()
            return DeviceMemory(int(module.get_device_properties(idx).total_memory), "the device's own memory")
        if dev.type == "mps":
            return DeviceMemory(int(torch.mps.recommended_max_memory()),
                                "the share of the Mac's unified memory Metal recommends for one process")
    except Exception:  # noqa: BLE001 (a description must not raise)
        return None
    return None


def torch_build() -> str:
    """Return which accelerator this torch build was made for: ``"CUDA 13.0"``, ``"ROCm/HIP 6.4"``,
    ``"XPU"``, ``"MPS (macOS)"`` or ``"CPU only"`` (whether or not such a device is present)."""
    if is_rocm():
        return f"ROCm/HIP {torch.version.hip}"
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "xpu", None):
        return "XPU"
    try:
        if torch.backends.mps.is_built():
            return "MPS (macOS)"
    except AttributeError:
        pass
    return "CPU only"


def _allowed_types() -> tuple[str, ...]:
    """Return the device types ``COURSE_DEVICE`` may name: ``KNOWN_TYPES`` and this build's accelerator."""
    try:
        built = torch.accelerator.current_accelerator()
    except (AttributeError, TypeError, RuntimeError):
        built = None
    return tuple(dict.fromkeys([*KNOWN_TYPES, *([built.type] if built is not None else [])]))


def _device_count(kind: str) -> int | None:
    """Return how many devices of type ``kind`` torch sees, or None when the backend does not say."""
    try:
        return int(torch.get_device_module(kind).device_count())
    except Exception:  # noqa: BLE001
        return None


def get_device() -> torch.device:
    """Return the device this machine offers the course: what ``COURSE_DEVICE`` names, else the accelerator.

    ``COURSE_DEVICE`` wins when set; otherwise the accelerator torch sees (``accelerator()``:
    CUDA, ROCm or XPU), else the CPU. Apple's MPS is never chosen automatically, only with
    ``COURSE_DEVICE=mps`` (``torch.compile`` on MPS is a prototype). The lessons do not follow it:
    they measure on the CPU on every machine, and the GPU cells ask ``accelerator()`` behind their
    guards. It serves the doctor's device line (so a ``COURSE_DEVICE`` naming a missing GPU fails
    loudly) and ``synchronize()``'s default. Raises RuntimeError when ``COURSE_DEVICE`` names an
    accelerator this machine does not have (or an index past its last device), and ValueError for
    a device string torch does not understand or one the course cannot run on.
    """
    raw = os.environ.get("COURSE_DEVICE", "").strip()
    if not raw:
        acc = accelerator()
        return acc if acc is not None and acc.type != "mps" else torch.device("cpu")
    allowed = _allowed_types()
    try:
        device = torch.device(raw)
    except RuntimeError as err:
        raise ValueError(
            f"COURSE_DEVICE={raw!r} is not a device torch understands "
            f"(try {', '.join(repr(t) for t in allowed)})."
        ) from err
    if device.type not in allowed:
        raise ValueError(f"COURSE_DEVICE={raw!r} names a device the course cannot run on; "
                         f"choose one of {', '.join(repr(t) for t in allowed)}.")
    if device.type == "cpu":
        return device
    available = has_cuda() if device.type == "cuda" else _backend_available(device.type)
    label = _LABELS.get(device.type, device.type.upper())
    if not available:
        needs = f" ({label} needs {_NEEDS[device.type]})" if device.type in _NEEDS else ""
        raise RuntimeError(
            f"COURSE_DEVICE={raw!r} asks for {label}, but torch sees no {label} device{needs}; "
            f"torch {torch.__version__} is built for {torch_build()}, and the accelerator it sees is: "
            f"{accelerator_description()}. Unset COURSE_DEVICE to let the course choose, or set it to 'cpu'."
        )
    count = _device_count(device.type)
    if device.index is not None and count is not None and device.index >= count:
        raise RuntimeError(f"COURSE_DEVICE={raw!r} asks for {label} device {device.index}, but torch sees "
                           f"{counted(count, label + ' device')} (indices 0 to {count - 1}).")
    return device


def _seen() -> str:
    """Return the clause a skip message adds when torch sees an accelerator the cell cannot use."""
    acc = accelerator_description()
    return "" if acc == "none" else f"; torch sees {acc}, which this cell does not use"


#: The ``what`` of the last guard that let its cell run (``skip_cell`` logs against it).
_last_ran: dict[str, str] = {}


def _log_guard(guard: str, what: str, ran: bool, reason: str = "") -> None:
    """Append one guard's decision to the file ``COURSE_GPU_CELLS`` names (nothing when it is unset).

    A line holds ``guard``, ``what``, ``ran``, ``reason`` (the skip message, empty when the cell
    ran), ``device`` (what torch sees) and ``pid``. An unwritable file is reported on stdout and
    does not stop the cell: the log serves a check, not the lesson.
    """
    if ran:
        _last_ran.update(guard=guard, what=what)
    target = os.environ.get("COURSE_GPU_CELLS", "").strip()
    if not target:
        return
    line = {"guard": guard, "what": what, "ran": ran, "reason": reason,
            "device": accelerator_description(), "pid": os.getpid()}
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
    except OSError as err:
        print(f"note: COURSE_GPU_CELLS={target!r} cannot be written ({err}); the cell goes on")


def skip_cell(reason: str) -> None:
    """Say why a GPU cell whose guard let it run cannot go on here, and log the cell as skipped.

    For a need the guards cannot see (ONNX Runtime built without its CUDA provider): prints
    ``skipped: <reason>`` and appends a "skipped" line for the last guard that ran to the
    ``COURSE_GPU_CELLS`` log, so a GPU check does not count the cell as ran.
    """
    message = f"skipped: {reason}"
    print(message)
    if _last_ran:
        _log_guard(_last_ran["guard"], _last_ran["what"], False, message)


def _kept_off(guard: str, what: str) -> bool:
    """Return True (after printing why) when ``COURSE_DEVICE=cpu`` keeps GPU cells off a machine that has a GPU."""
    if os.environ.get("COURSE_DEVICE", "").strip().lower() != "cpu":
        return False
    message = (f"skipped: COURSE_DEVICE=cpu keeps the GPU cells off ({what}); "
               f"unset it to run this cell on {accelerator_description()}")
    print(message)
    _log_guard(guard, what, False, message)
    return True


def requires_cuda(what: str, *, allow_rocm: bool = True) -> bool:
    """Return True when CUDA is available; otherwise print why the cell is skipped.

    Use it for cells written against ``torch.cuda`` (CUDA graphs, NCCL, CUDA memory snapshots)::

        if requires_cuda("CUDA graphs replayed by mode='reduce-overhead'"):
            ...  # GPU-only demonstration

    ROCm builds drive AMD GPUs through ``torch.cuda``, so they pass; ``allow_rocm=False`` is for
    cells that need NVIDIA's own software (ONNX Runtime's CUDA provider, FP8 on sm_89+).
    Without CUDA it prints ``skipped: needs CUDA (<what>)`` (``skipped: needs an NVIDIA GPU with CUDA
    (<what>)`` with ``allow_rocm=False``), naming the accelerator torch does see (MPS, XPU) when there
    is one, and returns False. ``COURSE_DEVICE=cpu`` keeps the cell off a GPU that is there (it says so).
    """
    if has_cuda() and (allow_rocm or not is_rocm()):
        if _kept_off("requires_cuda", what):
            return False
        _log_guard("requires_cuda", what, True)
        return True
    if has_cuda():  # a ROCm build, and the cell needs NVIDIA
        message = f"skipped: needs an NVIDIA GPU ({what}); torch sees {accelerator_description()}"
    else:
        needs = "CUDA" if allow_rocm else "an NVIDIA GPU with CUDA"
        message = f"skipped: needs {needs} ({what}){_seen()}"
    print(message)
    _log_guard("requires_cuda", what, False, message)
    return False


def requires_accelerator(what: str, kinds: Iterable[str] | None = None) -> bool:
    """Return True when torch sees an accelerator (of one of ``kinds``, if given); otherwise print
    why the cell is skipped.

    Use it for cells that run on whichever accelerator is there, with ``dev = accelerator()``::

        if requires_accelerator("batched decoding on a GPU"):
            dev = accelerator()
            ...

    ``kinds`` narrows the accelerators the cell supports (``("cuda", "xpu")`` for a cell that reads
    Inductor's Triton kernels, which MPS does not get). It prints
    ``skipped: needs an accelerator: CUDA, ROCm, MPS or XPU (<what>)`` on a machine with none, and
    skips, saying so, when ``COURSE_DEVICE=cpu`` keeps GPU cells off.
    """
    acc = accelerator()
    wanted = None if kinds is None else tuple(kinds)
    if acc is not None and (wanted is None or acc.type in wanted):
        if _kept_off("requires_accelerator", what):
            return False
        _log_guard("requires_accelerator", what, True)
        return True
    if wanted is None:
        message = f"skipped: needs an accelerator: CUDA, ROCm, MPS or XPU ({what})"
    else:
        names = " or ".join(_LABELS.get(k, k.upper()) for k in wanted)
        message = f"skipped: needs {names} ({what}){_seen()}"
    print(message)
    _log_guard("requires_accelerator", what, False, message)
    return False


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` (default: the course's device) to finish; a no-op on the CPU."""
    dev = torch.device(device) if device is not None else get_device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
    elif dev.type == "xpu":
        torch.xpu.synchronize(dev)
    elif dev.type != "cpu":
        torch.get_device_module(dev.type).synchronize()
