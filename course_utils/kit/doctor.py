"""Can this machine run the course? One line per check, and what to do about failures.

Run it as ``python -m course_utils doctor`` (exit status 1 when anything is wrong)
or call ``run_checks()`` from a notebook.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.version import InvalidVersion

from .. import config
from ..toolchain import check_toolchain
from .env import package_version

#: Oldest torch release the course supports (README.md and pyproject.toml say the same; tests tie them).
TORCH_MIN = "2.11"

#: The course's own distribution: its metadata lists what the notebooks need.
DISTRIBUTION = "pytorch2-course"

INSTALL_HINT = "run `make setup` (or `pip install -c constraints.txt -e '.[dev]'`)"


@dataclass(frozen=True)
class Check:
    """The outcome of one doctor check: ``fix`` says what to do when ``ok`` is False."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        """Return the check as one printable line."""
        if self.ok:
            return f"ok    {self.name}: {self.detail}"
        return f"FAIL  {self.name}: {self.detail}. Fix: {self.fix}"


def check_python() -> Check:
    """Return whether the running Python is new enough (3.11+, the floor of the pinned packages)."""
    ver = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 11):  # noqa: UP036 (a learner may run the doctor with an older Python)
        return Check("python", False, f"Python {ver} is too old",
                     "install Python 3.11 and rebuild the environment with `make clean setup`")
    return Check("python", True, f"Python {ver}")


def required_packages() -> list[Requirement]:
    """Return the packages the course needs, read from the course's own metadata.

    The checkout's ``pyproject.toml`` is the source when it is there (so a dependency added
    since the last ``make setup`` is still checked); otherwise the installed distribution's
    metadata. Optional extras (``dev``, ``executorch``) are left out.
    """
    pyproject = config.REPO_ROOT / "pyproject.toml"
    try:
        import tomllib  # Python 3.11+; an older Python falls back to the metadata (and fails check_python)
    except ModuleNotFoundError:
        tomllib = None
    if pyproject.is_file() and tomllib is not None:
        declared = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    else:
        declared = metadata.requires(DISTRIBUTION) or []
    requirements = [Requirement(text) for text in declared]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def check_packages(required: Sequence[Requirement | str] | None = None) -> list[Check]:
    """Return one check per required package: installed, and within the course's version range."""
    checks = []
    for req in required_packages() if required is None else required:
        req = Requirement(req) if isinstance(req, str) else req
        found = package_version(req.name)
        if found is None:
            checks.append(Check(req.name, False, "not installed", INSTALL_HINT))
            continue
        try:
            inside = req.specifier.contains(found, prereleases=True)
        except InvalidVersion:
            checks.append(Check(req.name, False, f"version {found!r} cannot be read", INSTALL_HINT))
            continue
        if inside:
            checks.append(Check(req.name, True, found))
        else:
            side = "older" if any(s.operator in (">=", ">", "~=") and not s.contains(found, prereleases=True)
                                  for s in req.specifier) else "newer"
            checks.append(Check(req.name, False, f"{found} is {side} than the course's range {req.specifier}",
                                INSTALL_HINT))
    return checks


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


def check_device() -> Check:
    """Return whether ``COURSE_DEVICE`` (if set) names a device this machine has."""
    from ..device import get_device  # imports torch; keep doctor importable without it

    try:
        dev = get_device()
    except (RuntimeError, ValueError) as err:
        return Check("device", False, str(err), "unset COURSE_DEVICE or set it to 'cpu'")
    return Check("device", True, str(dev))


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


def run_checks(compile_probe: bool = True) -> list[Check]:
    """Return every check's outcome; ``compile_probe=False`` skips the slow real compile."""
    checks: list[Check] = [check_python()]
    checks += check_packages()
    torch_ok = all(c.ok for c in checks if c.name == "torch")
    compiler = check_compiler()
    checks.append(compiler)
    if torch_ok:
        checks.append(check_device())
        checks.append(check_cpu(probe=compile_probe))
        if compile_probe and compiler.ok:
            checks.append(check_inductor())
        checks += check_data()
    checks += check_writable_dirs()
    return checks


def main(argv: Sequence[str] | None = None,
         runner: Callable[..., list[Check]] = run_checks) -> int:
    """Print one line per check and return the exit status (0 all good, 1 otherwise)."""
    args = list(argv or [])
    checks = runner(compile_probe="--fast" not in args)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if not c.ok]
    if failed:
        print(f"\n{len(failed)} problem(s) found; fix the FAIL lines above.")
        return 1
    print(f"\nAll {len(checks)} checks passed: this machine can run the course "
          f"({'quick' if config.is_quick() else 'full'} mode).")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
