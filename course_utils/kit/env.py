"""What machine and software versions the course is running on."""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config
from ..device import has_cuda

#: Compilers tried in order when ``$CXX`` is not set: Inductor's default first (g++; clang++ on macOS).
DEFAULT_COMPILERS = ("clang++", "g++", "c++") if sys.platform == "darwin" else ("g++", "c++", "clang++")
#: Programs that run a compiler given as their first argument (``CXX="ccache g++"``).
LAUNCHERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})

#: Packages whose versions the report lists, in order.
REPORTED_PACKAGES = ("torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "torchao")


@dataclass(frozen=True)
class Toolchain:
    """Whether a C++ compiler that Inductor's CPU backend can use was found and works.

    ``compiler`` is the command line (``cxx_command()`` joined), None when none was found.
    """

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


class CompilerNotFound(RuntimeError):
    """No usable C++ compiler command: ``$CXX`` names a program that is missing, or none was found."""


def split_launcher(words: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """Return ``(launcher, compiler, flags)`` of a compiler command given as argv words.

    The launcher is the leading words whose program is a compiler launcher (``ccache g++``:
    ``["ccache"]``, ``"g++"``, ``[]``); flags are the words after the compiler. Raises
    ``CompilerNotFound`` for an empty command or one that is only launchers.
    """
    launcher = list(itertools.takewhile(lambda w: Path(w).name in LAUNCHERS, words))
    rest = list(words[len(launcher):])
    if not rest:
        raise CompilerNotFound(f"no C++ compiler: the command {shlex.join(words)!r} names only a launcher")
    return launcher, rest[0], rest[1:]


def _inductor_compilers() -> list[str]:
    """Return the compiler names Inductor is configured to try, if its config is already loaded
    (importing it just to ask costs a second; its default is the first of ``DEFAULT_COMPILERS``)."""
    inductor = sys.modules.get("torch._inductor.config")
    cxx = getattr(getattr(inductor, "cpp", None), "cxx", ())
    return [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if isinstance(c, str) and c.strip()]


def _resolve(words: list[str], launcher: list[str], compiler: str, path: str | None) -> list[str] | None:
    """Return ``words`` with the launcher and compiler programs as full paths (looked up on ``path``,
    a PATH value; None: the process's), or None if one is missing."""
    programs = [shutil.which(w, path=path) for w in (*launcher, compiler)]
    if not all(programs):
        return None
    return [*programs, *words[len(launcher) + 1:]]  # type: ignore[list-item]


def cxx_command(environ: Mapping[str, str] | None = None) -> list[str]:
    """Return the C++ compiler command as argv words, programs as full paths: the course's one answer
    to "which compiler?", used by the doctor (``check_toolchain``) and the C++ loader build (``aoti_cpp``).

    ``$CXX`` in ``environ`` (default ``os.environ``; its ``PATH`` too) decides when set, as for Inductor: it is
    split with ``shlex``, so a launcher works (``CXX="ccache g++"`` gives ``[".../ccache", ".../g++"]``),
    and it is not replaced by another compiler when it names a missing program (Inductor would fail
    then too). Without it: the compilers Inductor is configured with, then ``DEFAULT_COMPILERS``.
    Raises ``CompilerNotFound`` saying what was looked for.
    """
    environ = os.environ if environ is None else environ
    raw, path = environ.get("CXX"), environ.get("PATH")
    if raw is not None:
        try:
            words = shlex.split(raw)
        except ValueError as err:
            raise CompilerNotFound(f"no C++ compiler: $CXX={raw!r} cannot be split into words ({err})") from None
        if not words:
            raise CompilerNotFound("no C++ compiler: $CXX is set but empty (unset it, or name a compiler)")
        launcher, compiler, _ = split_launcher(words)
        found = _resolve(words, launcher, compiler, path)
        if found is None:
            missing = [w for w in (*launcher, compiler) if shutil.which(w, path=path) is None]
            raise CompilerNotFound(f"no C++ compiler: $CXX={raw!r} names {', '.join(missing)}, not found on PATH")
        return found
    names = list(dict.fromkeys([*_inductor_compilers(), *DEFAULT_COMPILERS]))
    for name in names:
        try:
            words = shlex.split(name)
            found = _resolve(words, *split_launcher(words)[:2], path)
        except (ValueError, CompilerNotFound):  # a configured name that is no command: try the next
            continue
        if found is not None:
            return found
    raise CompilerNotFound(f"no C++ compiler on PATH (looked for $CXX, {', '.join(names)})")


def check_toolchain(timeout_s: float = 60.0) -> Toolchain:
    """Return whether a C++ compiler is present and builds a trivial shared library.

    The compiler is ``cxx_command()``'s. This is the cheap check (well under a second).
    ``doctor`` adds the real one: a ``torch.compile`` call in a fresh process.
    """
    try:
        words = cxx_command()
    except CompilerNotFound as err:
        return Toolchain(None, False, str(err))
    cxx = shlex.join(words)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text('extern "C" int course_probe(int x) { return x + 1; }\n')
        try:
            out = subprocess.run(
                [*words, "-shared", "-fPIC", "-O1", str(src), "-o", str(Path(tmp) / "probe.so")],
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
    from .. import cpu

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
    from ..cpu import cpu_class

    cuda = cuda_description()
    return (
        f"torch {torch.__version__} | python {platform.python_version()} | "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads | "
        f"cpu class: {cpu_class()} | cuda: {cuda} | mode: {config.mode_name()}"
    )
