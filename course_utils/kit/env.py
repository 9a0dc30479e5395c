"""What machine and software versions the course is running on."""

from __future__ import annotations

import importlib.metadata
import os
import platform

import torch

from .. import config
from ..cpu import cpu_model
from ..device import accelerator_description, cuda_description, torch_build
from ..toolchain import check_toolchain

#: Packages whose versions the report lists, in order.
REPORTED_PACKAGES = ("torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "torchao")


def package_version(name: str) -> str | None:
    """Return the installed version of distribution ``name``, or None if not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def report(check_compiler: bool = True) -> dict[str, str]:
    """Return the environment as an ordered mapping of label to value.

    Lists Python and the course's key package versions, CPU model, cores, torch
    threads, CUDA device and capability, and whether Inductor's C++ toolchain works.
    """
    rows: dict[str, str] = {"python": platform.python_version()}
    for name in REPORTED_PACKAGES:
        rows[name] = package_version(name) or "not installed"
    rows["platform"] = f"{platform.system()} {platform.machine()}"
    rows["cpu"] = cpu_model()
    from .. import cpu

    facts = cpu.info()
    rows["cpu class"] = facts.cpu_class + (f" (profile {facts.profile})" if facts.profile else "")
    rows["cpu instruction sets"] = ", ".join(facts.features) or "none tracked"
    rows["int8 dot product"] = facts.int8_dot_text() if facts.hidden_int8_dot else (facts.int8_dot or "none")
    rows["torch vector code"] = facts.torch_capability
    rows["onnxruntime kernels"] = cpu.onnxruntime_kernels()
    rows["cores"] = str(os.cpu_count() or "unknown")
    rows["torch threads"] = str(torch.get_num_threads())
    rows["cuda"] = cuda_description()
    rows["accelerator"] = accelerator_description()
    rows["torch build"] = torch_build()
    rows["torch cuda build"] = torch.version.cuda or "none (CPU build)"
    if check_compiler:
        tc = check_toolchain()
        rows["inductor c++"] = ("ok: " if tc.works else "BROKEN: ") + tc.detail
    rows["course mode"] = config.mode_name()
    return rows


def format_report(rows: dict[str, str] | None = None) -> str:
    """Return ``report()`` (or ``rows``) as an aligned two-column text table."""
    rows = report() if rows is None else rows
    width = max(len(k) for k in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows.items())
