"""What machine and software versions the course is running on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import config
from .device import has_cuda

#: Packages whose versions the report lists, in order.
REPORTED_PACKAGES = ("torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "torchao")


@dataclass(frozen=True)
class Toolchain:
    """Whether a C++ compiler that Inductor's CPU backend can use was found and works."""

    compiler: str | None
    works: bool
    detail: str


def package_version(name: str) -> str | None:
    """Return the installed version of distribution ``name``, or None if not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """Return the CPU's model name as the operating system reports it."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5, check=False,
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown"


def find_cxx() -> str | None:
    """Return the path of the C++ compiler Inductor would use (``$CXX`` first), or None."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else []
    candidates += ["g++", "c++", "clang++"]
    for name in candidates:
        found = shutil.which(name.split()[0])
        if found:
            return found
    return None


def check_toolchain(timeout_s: float = 60.0) -> Toolchain:
    """Return whether a C++ compiler is present and builds a trivial shared library.

    This is the cheap check (well under a second). ``doctor`` adds the real one:
    a ``torch.compile`` call in a fresh process.
    """
    cxx = find_cxx()
    if cxx is None:
        return Toolchain(None, False, "no C++ compiler on PATH (looked for $CXX, g++, c++, clang++)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text('extern "C" int course_probe(int x) { return x + 1; }\n')
        try:
            out = subprocess.run(
                [cxx, "-shared", "-fPIC", "-O1", str(src), "-o", str(Path(tmp) / "probe.so")],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return Toolchain(cxx, False, f"{cxx} could not be run: {err}")
    if out.returncode != 0:
        first = (out.stderr or out.stdout).strip().splitlines()[:1]
        return Toolchain(cxx, False, f"{cxx} failed on a trivial file: {' '.join(first)}")
    return Toolchain(cxx, True, f"{cxx} builds shared libraries")


def cuda_description() -> str:
    """Return the CUDA device name and compute capability, or ``"none"``."""
    if not has_cuda():
        return "none"
    idx = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(idx)
    return f"{torch.cuda.get_device_name(idx)} (sm_{major}{minor})"


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
    from . import cpu

    facts = cpu.info()
    rows["cpu class"] = facts.cpu_class + (f" (profile {facts.profile})" if facts.profile else "")
    rows["cpu instruction sets"] = ", ".join(facts.features) or "none tracked"
    rows["int8 dot product"] = facts.int8_dot or "none"
    rows["torch vector code"] = facts.torch_capability
    rows["onnxruntime kernels"] = cpu.onnxruntime_kernels()
    rows["cores"] = str(os.cpu_count() or "unknown")
    rows["torch threads"] = str(torch.get_num_threads())
    rows["cuda"] = cuda_description()
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


def summary() -> str:
    """Return a one-line environment summary for a notebook's setup cell (CPU class included)."""
    from .cpu import cpu_class

    cuda = cuda_description()
    return (
        f"torch {torch.__version__} | python {platform.python_version()} | "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads | "
        f"cpu class: {cpu_class()} | cuda: {cuda} | mode: {config.mode_name()}"
    )
