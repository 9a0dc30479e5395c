"""How big a model is: serialized bytes, parameter counts, parameter dtypes."""

from __future__ import annotations

import io
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn


def serialized_bytes(obj: nn.Module | dict[str, Any] | str | os.PathLike[str]) -> int:
    """Return the size in bytes of ``obj`` as ``torch.save`` writes it.

    A module is measured by its ``state_dict()`` (what you would ship); a dict is
    saved as it is; a path is measured on disk. Quantized weights (torchao tensor subclasses)
    are measured as they serialize, also when called under ``torch.inference_mode()``.
    """
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        return path.stat().st_size
    if isinstance(obj, nn.Module):
        # Outside inference mode: torchao's quantized weights cannot be saved from inside it.
        with torch.inference_mode(False):
            obj = obj.state_dict()
    if not isinstance(obj, dict):
        raise TypeError(f"expected a module, a state dict or a path, got {type(obj).__name__}")
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()


def serialized_mb(obj: nn.Module | dict[str, Any] | str | os.PathLike[str]) -> float:
    """Return ``serialized_bytes(obj)`` in megabytes (10**6 bytes)."""
    return serialized_bytes(obj) / 1e6


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Return the number of parameters (tied weights counted once)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    params = model.parameters()  # parameters() already yields each shared tensor once
    return sum(p.numel() for p in params if p.requires_grad or not trainable_only)


def parameter_dtypes(model: nn.Module) -> dict[str, int]:
    """Return {dtype name: number of elements} over the model's parameters and buffers."""
    counts: Counter[str] = Counter()
    for tensor in list(model.parameters()) + list(model.buffers()):
        counts[str(tensor.dtype).removeprefix("torch.")] += tensor.numel()
    return dict(counts)
