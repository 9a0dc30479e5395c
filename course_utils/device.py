"""Which device to run on, and guards for cells that only make sense on a GPU.

``COURSE_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``) overrides the automatic choice;
GPU CI sets ``COURSE_DEVICE=cuda`` so a missing GPU fails loudly instead of
silently testing the CPU path.
"""

from __future__ import annotations

import os

import torch


def has_cuda() -> bool:
    """Return True when a usable CUDA device is present."""
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # a broken driver install should read as "no CUDA"
        return False


def cuda_description() -> str:
    """Return the CUDA device name and compute capability, or ``"none"``."""
    if not has_cuda():
        return "none"
    idx = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(idx)
    return f"{torch.cuda.get_device_name(idx)} (sm_{major}{minor})"


def get_device() -> torch.device:
    """Return the device the course should use.

    ``COURSE_DEVICE`` wins when set; otherwise CUDA when available, else CPU.
    Raises RuntimeError when ``COURSE_DEVICE`` asks for CUDA on a machine without it,
    and ValueError for a device string torch does not understand.
    """
    raw = os.environ.get("COURSE_DEVICE", "").strip()
    if not raw:
        return torch.device("cuda" if has_cuda() else "cpu")
    try:
        device = torch.device(raw)
    except RuntimeError as err:
        raise ValueError(
            f"COURSE_DEVICE={raw!r} is not a device torch understands "
            "(try 'cpu' or 'cuda')."
        ) from err
    if device.type == "cuda" and not has_cuda():
        raise RuntimeError(
            f"COURSE_DEVICE={raw!r} asks for CUDA, but torch sees no CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
            "Unset COURSE_DEVICE to run on the CPU."
        )
    return device


def requires_cuda(what: str) -> bool:
    """Return True when CUDA is available; otherwise print why the cell is skipped.

    Use it to guard GPU-only cells::

        if requires_cuda("CUDA graphs replayed by mode='reduce-overhead'"):
            ...  # GPU-only demonstration

    On a CPU machine it prints ``skipped: needs CUDA (<what>)`` and returns False.
    """
    if has_cuda():
        return True
    print(f"skipped: needs CUDA ({what})")
    return False


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` to finish (a no-op on the CPU)."""
    dev = torch.device(device) if device is not None else get_device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
