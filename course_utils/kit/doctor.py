"""Can this machine run the course? One line per check, and what to do about failures.

Run it as ``python -m course_utils doctor`` (exit status 1 when anything is wrong)
or call ``run_checks()`` from a notebook.

The doctor must answer on a fresh laptop too, from any ``python3`` (even one below the course's
floor, with nothing installed), so this module and everything it imports at the top use the
standard library only. The checks that need the course's packages (torch, packaging, the data sets)
import them when they run, and only once the package checks have found torch; a check that still
cannot import what it needs, or that breaks, becomes a FAIL line with a fix, never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config
from ..toolchain import check_toolchain
from . import host_checks
from .check import Check
from ..text import counted

if TYPE_CHECKING:  # packaging is one of the course's packages: imported where it is used
    from packaging.requirements import Requirement

__all__ = ["Check", "main", "run_checks"]

#: Oldest torch release the course supports (README.md and pyproject.toml say the same; tests tie them).
TORCH_MIN = "2.11"

#: The course's own distribution: its metadata lists what the notebooks need.
DISTRIBUTION = "pytorch2-course"

INSTALL_HINT = "run `make setup` (or `pip install -c constraints.txt -e '.[dev]'`)"


def install_hint() -> str:
    """Return what to do about a missing package: ``INSTALL_HINT``, or, for a Python outside any
    environment while this checkout's ``.venv`` exists, to ask that environment's Python instead."""
    venv = host_checks.venv_python()
    if host_checks.running_environment() is None and venv.exists():
        return (f"this Python is not the course's: run `make doctor` (or `{venv} -m course_utils doctor`); "
                "if .venv is broken, `make setup` repairs it")
    return INSTALL_HINT


def check_python() -> Check:
    """Return whether the running Python is new enough (3.11+, the floor of the pinned packages)."""
    ver = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 11):  # noqa: UP036 (a learner may run the doctor with an older Python)
        rebuild = "`make clean setup PYTHON=python3.11`"
        if install_hint() != INSTALL_HINT:  # .venv exists, and this is another Python: ask .venv's first
            return Check("python", False, f"Python {ver} is too old", f"{install_hint()}; a .venv built with "
                         f"this Python must be rebuilt with Python 3.11 or newer: {rebuild}")
        return Check("python", False, f"Python {ver} is too old",
                     f"install Python 3.11 or newer and build the environment with it: {rebuild}")
    if sys.version_info[:3] == (3, 13, 0):
        return Check.warn("python", f"Python {ver}: torch's guards run slower on it (a CPython bug fixed in 3.13.1; "
                          "torch warns at the first compile)",
                          "install Python 3.13.1 or newer (or 3.11, 3.12) and rebuild the environment with it: "
                          "`make clean setup PYTHON=python3.13`")
    return Check("python", True, f"Python {ver}")


def has_module(name: str) -> bool:
    """Return whether this Python can import the top-level module ``name`` (without importing it)."""
    return importlib.util.find_spec(name) is not None


def check_environment(packages_ok: bool) -> Check:
    """Return which Python environment the doctor runs in, and whether the course can be set up from it.

    It fails only for what ``make setup`` cannot fix by itself: a Python outside the course's ``.venv``
    asked while that ``.venv`` exists (ask ``make doctor`` instead), or no ``.venv`` yet and a Python
    without the ``venv`` or ``ensurepip`` module to make one (Debian and Ubuntu ship them apart).
    ``packages_ok``: the course's packages are all installed in this Python (no environment needed).
    """
    running, venv = host_checks.running_environment(), host_checks.checkout_venv()
    if running is not None:
        kind = "a conda environment" if (running / "conda-meta").is_dir() else "a virtual environment"
        if running.resolve() == venv.resolve():
            return Check("python environment", True, f"{venv} (this checkout's .venv)")
        return Check("python environment", True, f"{running} ({kind}, not this checkout's .venv)")
    if packages_ok:
        return Check("python environment", True, f"{sys.prefix} (no virtual environment; the packages are installed)")
    if host_checks.venv_python().exists():
        where = Path(os.path.realpath(Path(sys.executable).parent))
        if where == Path(os.path.realpath(host_checks.venv_python().parent)):  # .venv's Python, run with -S or -I
            detail = f"this is {sys.executable} started without its environment's packages (-S or -I)"
        else:
            detail = f"this is {sys.executable}, outside the course's {venv}"
        return Check("python environment", False, detail, install_hint())
    missing = [name for name in ("venv", "ensurepip") if not has_module(name)]
    if missing:
        return Check("python environment", False,
                     f"no .venv yet, and this Python ({sys.executable}) cannot make one: it has no "
                     f"{' or '.join(missing)} module",
                     "Debian/Ubuntu: `sudo apt install python3-venv` (python3.11-venv for python3.11), or take "
                     "README's conda route; then `make setup` (`make setup PYTHON=python3.11` picks the Python)")
    return Check("python environment", True, f"no .venv yet; `make setup` makes one ({sys.executable} has the venv module)")


def _declared_in_pyproject(text: str) -> list[str]:
    """Return ``[project] dependencies`` of a ``pyproject.toml`` text, read without ``tomllib``
    (Python < 3.11 has none; the doctor still lists the packages there): the quoted strings of the
    array, comments dropped. The course's file keeps one requirement per line."""
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    array = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", project.group(1) if project else "", re.MULTILINE | re.DOTALL)
    if array is None:
        return []
    lines = (line.split("#", 1)[0] for line in array.group(1).splitlines())
    return [found for line in lines for found in re.findall(r'"([^"]+)"', line)]


def declared_dependencies() -> list[str]:
    """Return the requirement strings of the packages the course needs, from the course's own metadata.

    The checkout's ``pyproject.toml`` is the source when it is there (so a dependency added since the
    last ``make setup`` is still checked); otherwise the installed distribution's metadata, without
    the optional extras (``dev``, ``executorch``). Empty when neither can be found.
    """
    pyproject = config.REPO_ROOT / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text(encoding="utf-8")
        try:
            import tomllib
        except ModuleNotFoundError:  # Python < 3.11 (check_python fails it); read the array by hand
            return _declared_in_pyproject(text)
        return list(tomllib.loads(text)["project"]["dependencies"])
    from importlib import metadata

    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    return [text for text in declared if "extra" not in text.partition(";")[2]]


def required_packages() -> list[Requirement]:
    """Return the packages the course needs (``declared_dependencies()``) as parsed requirements whose
    environment markers hold here. Needs ``packaging``, one of those packages."""
    from packaging.requirements import Requirement

    requirements = [Requirement(text) for text in declared_dependencies()]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def installed_version(name: str) -> str | None:
    """Return the installed version of distribution ``name``, or None if it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _requirement_name(text: str) -> str:
    """Return the distribution name a requirement string starts with (``ray[serve]>=2`` gives ``ray``)."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    return found.group(1) if found else text.strip()


def _names_only(required: Sequence[str]) -> list[Check]:
    """Return one check per requirement without ``packaging``: installed or not, its range unchecked."""
    checks = []
    for text in required:
        name = _requirement_name(str(text))
        found = installed_version(name)
        if found is None:
            checks.append(Check(name, False, "not installed", install_hint()))
        else:
            checks.append(Check(name, True, f"{found} (its version range not checked: packaging is missing)"))
    return checks


def check_packages(required: Sequence[Requirement | str] | None = None) -> list[Check]:
    """Return one check per required package: installed, and within the course's version range.

    Without ``packaging`` (a Python the course is not installed in) each package is only looked up;
    ``packaging``'s own line then fails and says how to install everything.
    """
    try:
        from packaging.requirements import Requirement
        from packaging.version import InvalidVersion
    except ModuleNotFoundError:
        return _names_only([str(r) for r in (declared_dependencies() if required is None else required)])
    checks = []
    for req in required_packages() if required is None else required:
        req = Requirement(req) if isinstance(req, str) else req
        found = installed_version(req.name)
        if found is None:
            checks.append(Check(req.name, False, "not installed", install_hint()))
            continue
        try:
            inside = req.specifier.contains(found, prereleases=True)
        except InvalidVersion:
            checks.append(Check(req.name, False, f"version {found!r} cannot be read", install_hint()))
            continue
        if inside:
            checks.append(Check(req.name, True, found))
        else:
            side = "older" if any(s.operator in (">=", ">", "~=") and not s.contains(found, prereleases=True)
                                  for s in req.specifier) else "newer"
            checks.append(Check(req.name, False, f"{found} is {side} than the course's range {req.specifier}",
                                install_hint()))
    return checks


def summarise_packages(checks: Sequence[Check]) -> list[Check]:
    """Return ``checks``, or one line in their place when none of the packages is installed (a Python
    the course was never installed in: one line to fix, not thirty)."""
    if checks and all(c.detail == "not installed" for c in checks):
        return [Check("packages", False, f"none of the course's {len(checks)} packages is installed in this "
                      f"Python ({sys.executable})", checks[0].fix)]
    return list(checks)


def check_compiler() -> Check:
    """Return whether a C++ compiler exists and builds a shared library (Inductor needs one).

    The compiler is ``toolchain.cxx_command()``'s, the one the C++ loader build (``aoti_cpp``) uses too.
    """
    tc = check_toolchain()
    if tc.works:
        return Check("c++ compiler", True, tc.detail)
    return Check(
        "c++ compiler", False,
        f"{tc.detail}, so torch.compile's default backend (inductor) cannot build CPU code",
        "install one (Debian/Ubuntu: `sudo apt-get install g++`; macOS: `xcode-select --install`; "
        "Windows: MSVC Build Tools) or set CXX to one that is installed, "
        "or compile with backend='eager' / 'aot_eager' meanwhile",
    )


_COMPILE_PROBE = textwrap.dedent(
    """
    import torch
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    x = torch.randn(64)
    torch.testing.assert_close(f(x), torch.sin(x) * 2 + 1)
    print("compiled")
    """
)


def check_inductor(timeout_s: float = 300.0) -> Check:
    """Return whether ``torch.compile`` with the default backend works, tried in a fresh process."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _COMPILE_PROBE],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        return Check("torch.compile", False, f"a tiny compile took over {timeout_s:.0f} s",
                     "check that the C++ compiler is not blocked (antivirus, a full /tmp disk)")
    if out.returncode == 0 and "compiled" in out.stdout:
        return Check("torch.compile", True, "inductor compiled and ran a small function")
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit status {out.returncode}"
    return Check("torch.compile", False, f"inductor failed: {last}",
                 "fix the C++ compiler (see the line above) or use backend='eager' meanwhile")


#: Present on Linux while NVIDIA's kernel driver is loaded (also inside a container given the GPU).
NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def unused_gpu(accelerator: str, build: str, driver_file: Path | None = None) -> tuple[str, str] | None:
    """Return ``(why, fix)`` when an NVIDIA driver is loaded but torch sees no accelerator, else None.

    ``accelerator`` and ``build`` are ``device.accelerator_description()`` and ``device.torch_build()``.
    A CPU-only torch (``make setup TORCH=cpu``) leaves the GPU unused; a CUDA build that sees no device
    usually means a driver older than the build's CUDA, or ``CUDA_VISIBLE_DEVICES`` hiding the GPUs.
    """
    driver_file = NVIDIA_DRIVER_FILE if driver_file is None else driver_file
    if accelerator != "none" or not driver_file.exists():
        return None
    if build == "CPU only":
        return ("an NVIDIA driver is loaded, but this torch is a CPU-only build, so the GPU goes unused",
                "to use the GPU, `make clean setup` without TORCH=cpu installs torch's CUDA build (about 3.4 GB more)")
    if build.startswith("CUDA"):
        return (f"an NVIDIA driver is loaded, but this torch (built for {build}) sees no CUDA device",
                f"update the NVIDIA driver (`nvidia-smi` prints the newest CUDA it supports; {build} needs at least "
                "that), or unset CUDA_VISIBLE_DEVICES if it hides the GPUs")
    return None


def check_device() -> Check:
    """Return the device the course will use, the accelerator torch sees (CUDA, ROCm, MPS, XPU or none)
    and what this torch is built for; fails when ``COURSE_DEVICE`` names a device this machine lacks,
    and warns when an NVIDIA GPU is there but torch cannot use it."""
    import torch

    from ..device import accelerator_description, get_device, torch_build  # keep doctor importable without torch

    try:
        dev = get_device()
    except (RuntimeError, ValueError) as err:
        return Check("device", False, str(err), "unset COURSE_DEVICE or set it to 'cpu'")
    accelerator, build = accelerator_description(), torch_build()
    detail = f"{dev}; accelerator: {accelerator}; torch {torch.__version__} is built for {build}"
    unused = unused_gpu(accelerator, build)
    if unused is not None:
        return Check.warn("device", f"{detail}; {unused[0]}", unused[1])
    return Check("device", True, detail)


def check_cpu(probe: bool = True) -> Check:
    """Return the CPU class and the instruction sets the course's results depend on (never a failure).

    With ``probe`` it also asks oneDNN, in a fresh process, which ISA it runs and whether
    torch's int8 GEMM uses it. ONNX Runtime picks its kernels from the CPU itself.
    """
    from .. import cpu

    facts = cpu.info()
    detail = facts.line() + "; instruction sets: " + (", ".join(facts.features) or "none tracked")
    if probe:
        onednn = cpu.onednn_report()
        detail += f"; oneDNN: {onednn['isa']}; torch._int_mm runs through {onednn['int_mm']}"
    detail += f"; ONNX Runtime (from the CPU's own flags, whatever the profile): {cpu.onnxruntime_kernels()}"
    return Check("cpu", True, detail)


def check_writable_dirs() -> list[Check]:
    """Return one check per folder the course writes to (cache and build)."""
    checks = []
    for label, getter in (("cache dir", config.cache_dir), ("build dir", config.build_dir)):
        try:
            path = getter(create=True)
            probe = path / ".doctor-probe"
            probe.write_text("ok")
            probe.unlink()
            checks.append(Check(label, True, str(path)))
        except OSError as err:
            checks.append(Check(label, False, f"cannot write: {err}",
                                "point COURSE_CACHE_DIR / COURSE_BUILD_DIR at a writable folder"))
    return checks


def check_data() -> list[Check]:
    """Return one check per shipped data file: present, with the recorded sha256."""
    from ..data import DataFileError, shipped_files, verify

    checks = []
    for name in shipped_files():
        try:
            verify(name)
            checks.append(Check(f"data/{name}", True, "present, checksum matches"))
        except DataFileError as err:
            checks.append(Check(f"data/{name}", False, err.problem, err.fix))
    return checks


def check_mode() -> Check:
    """Return whether ``COURSE_QUICK`` is understood, and the mode it selects."""
    try:
        return Check("course mode", True, config.mode_name())
    except ValueError as err:
        return Check("course mode", False, str(err).rstrip("."), "set COURSE_QUICK=1 for quick mode, or unset it")


def _guarded(name: str, check: Callable[[], Check | list[Check]]) -> list[Check]:
    """Return ``check()``'s outcome as a list; a check that cannot import what it needs, or that
    raises, becomes one FAIL line named ``name`` (the doctor prints a report, never a traceback)."""
    try:
        outcome = check()
    except ModuleNotFoundError as err:
        return [Check(name, False, f"not checked: it needs {err.name or err}, which is not installed", install_hint())]
    except Exception as err:  # noqa: BLE001 (any breakage is reported as this check's failure)
        return [Check(name, False, f"the check itself failed ({type(err).__name__}: {err})",
                      f"{install_hint()}; if this line stays, share it with `python -m course_utils env`")]
    return outcome if isinstance(outcome, list) else [outcome]


def _torch_problem(packages: Sequence[Check]) -> str | None:
    """Return why the checks that import torch cannot run here (from the package checks), or None."""
    torch = next((c for c in packages if c.name == "torch"), None)
    if torch is None:
        return "torch was not among the packages checked"
    if not torch.ok:
        return f"torch {torch.detail}"
    if not has_module("torch"):
        return "torch is installed but cannot be found on this Python's path"
    return None


def run_checks(compile_probe: bool = True) -> list[Check]:
    """Return every check's outcome; ``compile_probe=False`` skips the slow real compile.

    The checks that import torch (device, cpu, torch.compile, data files) run only once the package
    checks found torch; otherwise one FAIL line says they did not run and how to install it.
    """
    checks = _guarded("python", check_python)
    packages = _guarded("packages", check_packages)
    checks += _guarded("python environment", lambda: check_environment(all(c.ok for c in packages)))
    checks += summarise_packages(packages)
    checks += _guarded("course mode", check_mode)
    compiler = _guarded("c++ compiler", check_compiler)
    checks += compiler
    if all(c.ok for c in compiler):
        checks += _guarded("c++ standard", host_checks.check_cxx_standard)
        checks += _guarded("openmp", host_checks.check_macos_openmp)  # macOS only: no line elsewhere
    checks += _guarded("cmake", host_checks.check_cmake)
    problem = _torch_problem(packages)
    if problem is None:
        checks += _guarded("device", check_device)
        checks += _guarded("cpu", lambda: check_cpu(probe=compile_probe))
        if compile_probe and all(c.ok for c in compiler):
            checks += _guarded("torch.compile", check_inductor)
        checks += _guarded("data files", check_data)
    else:
        checks.append(Check("torch checks", False, f"device, cpu, torch.compile and data files not checked: {problem}",
                            install_hint()))
    checks += _guarded("jupyter kernel", host_checks.check_kernel)
    checks += _guarded("loopback", host_checks.check_loopback)
    checks += _guarded("writable dirs", check_writable_dirs)
    checks += _guarded("disk space", host_checks.check_disk_space)
    return checks


def verdict(checks: Sequence[Check]) -> str:
    """Return the doctor's closing line: how many problems to fix, or that the machine is ready."""
    failed = [c for c in checks if not c.ok]
    warned = sum(c.ok and c.warning for c in checks)
    also = f" {counted(warned, 'warning')}: the WARN lines say what they cost and how to fix them." if warned else ""
    if failed:
        return (f"{counted(len(failed), 'problem')} found; fix the FAIL lines above, the first one ({failed[0].name}) "
                f"first: later ones often follow from it.{also}")
    try:
        mode = config.mode_name()
    except ValueError:
        mode = "unknown"
    return f"All {len(checks)} checks passed: this machine can run the course ({mode} mode).{also}"


def main(argv: Sequence[str] | None = None,
         runner: Callable[..., list[Check]] = run_checks) -> int:
    """Print one line per check, then the verdict, and return the exit status (0 all good, 1 otherwise)."""
    args = list(argv or [])
    checks = runner(compile_probe="--fast" not in args)
    for check in checks:
        print(check.line(), flush=True)
    print(f"\n{verdict(checks)}")
    return 1 if any(not c.ok for c in checks) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
