"""Build the course's C++ programs (``cpp/<name>/``) with CMake against the installed torch, and run them.

One helper for every program (the AOTInductor loader, the LibTorch trainer):

- ``toolchain_problem``: why no C++ program can be built here (no cmake, no compiler), or None.
- ``build_project``: configure and build one CMake project into
  ``build/<binary>/torch-<version>-<install hash>``; skipped when the binary is newer than every
  source file; a folder configured with another compiler starts clean.
- ``run_program``: run a built program with the wheel's libraries on the library path; raise
  ``ProgramFailed`` with its message when it fails.
- ``shared_libraries``: what a binary or shared object loads at run time (``ldd``), with sizes.

The compiler is ``toolchain.cxx_command()``'s, the course's one answer to "which compiler?".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config
from ..toolchain import CompilerNotFound, cxx_command, split_launcher

#: The compiler options a build folder was configured with (``forget_other_compiler``).
COMPILER_STAMP = "course-compiler.txt"


class CppToolchainMissing(RuntimeError):
    """CMake or a C++ compiler is missing; the message says which, and how to install it."""


class ProgramFailed(RuntimeError):
    """A built C++ program exited with an error; the message carries what it printed."""


@dataclass(frozen=True)
class Build:
    """The built program: where it is, whether this call (re)built it, and how long that took."""

    binary: Path
    rebuilt: bool
    seconds: float


@dataclass(frozen=True)
class SharedLibrary:
    """One library a binary loads at run time: its name, where it was found (None: not found), its size."""

    name: str
    path: Path | None
    size_bytes: int

    @property
    def origin(self) -> str:
        """Return where it comes from: "torch" (the wheel's lib folder), "python package" (another
        wheel in site-packages, such as NVIDIA's CUDA runtime), "system", or "missing"."""
        if self.path is None:
            return "missing"
        where = self.path.resolve()
        if where.parent == torch_lib_dir():
            return "torch"
        return "python package" if "site-packages" in where.parts else "system"


def find_tools() -> dict[str, str]:
    """Return {"cmake": path, "cxx": command line} for the tools a build needs.

    The compiler is ``toolchain.cxx_command()``'s, the same one the doctor checks (``$CXX`` first, a
    launcher such as ``ccache g++`` included), joined with ``shlex.join``. Raises
    CppToolchainMissing naming the missing tool and how to get it.
    """
    cmake = shutil.which("cmake")
    if cmake is None:
        raise CppToolchainMissing(
            "cmake was not found on PATH. Install it (Debian/Ubuntu: `sudo apt install cmake`; "
            "macOS: `brew install cmake`; or `pip install cmake` in the course environment).")
    try:
        cxx = cxx_command()
    except CompilerNotFound as err:
        raise CppToolchainMissing(
            f"{err}. Install one (Debian/Ubuntu: `sudo apt install g++`; macOS: `xcode-select --install`), "
            "or set CXX to one that is installed.") from None
    return {"cmake": cmake, "cxx": shlex.join(cxx)}


def cmake_compiler_args(cxx: str) -> list[str]:
    """Return the CMake ``-D`` options that make it build with the compiler command line ``cxx``.

    CMake wants a launcher apart from the compiler: ``ccache g++ -m64`` gives
    ``-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER=g++ -DCMAKE_CXX_FLAGS=-m64``.
    """
    launcher, compiler, flags = split_launcher(shlex.split(cxx))
    args = [f"-DCMAKE_CXX_COMPILER={compiler}"]
    if launcher:
        args.insert(0, f"-DCMAKE_CXX_COMPILER_LAUNCHER={';'.join(launcher)}")
    if flags:
        args.append(f"-DCMAKE_CXX_FLAGS={shlex.join(flags)}")
    return args


def toolchain_problem() -> str | None:
    """Return why the course's C++ programs cannot be built on this machine, or None when they can."""
    try:
        find_tools()
    except CppToolchainMissing as err:
        return str(err)
    return None


def torch_lib_dir() -> Path:
    """Return the ``lib`` folder of the installed torch wheel (libtorch_cpu.so and friends)."""
    return Path(torch.__file__).resolve().parent / "lib"


def default_build_dir(name: str) -> Path:
    """Return ``build/<name>/torch-<version>-<install hash>``: one build per torch installation, so
    a second environment (``make test-min``'s torch 2.11) never reuses a binary linked to another."""
    where = hashlib.sha256(str(Path(torch.__file__).resolve()).encode()).hexdigest()[:8]
    return config.build_dir() / name / f"torch-{torch.__version__.replace('+', '_')}-{where}"


def _is_fresh(binary: Path, source_dir: Path) -> bool:
    """Return whether ``binary`` is newer than every file of its project and of the shared ``../common``."""
    if not binary.exists():
        return False
    folders = [source_dir, source_dir.parent / "common"]
    newest = max(p.stat().st_mtime for folder in folders if folder.is_dir() for p in folder.iterdir() if p.is_file())
    return binary.stat().st_mtime > newest


def forget_other_compiler(build_dir: Path, compiler: list[str]) -> bool:
    """Return whether CMake's cache in ``build_dir`` was dropped because it was configured with
    other compiler options than ``compiler``. When the compiler changes, CMake empties its cache
    itself but keeps only the changed variables, so the next configure fails without
    ``CMAKE_PREFIX_PATH``; starting clean avoids that (a folder configured before this stamp
    existed starts clean once)."""
    cache = build_dir / "CMakeCache.txt"
    stamp = build_dir / COMPILER_STAMP
    if not cache.exists():
        return False
    if stamp.exists() and stamp.read_text(encoding="utf-8") == "\n".join(compiler) + "\n":
        return False
    cache.unlink()
    shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    return True


def build_project(source_dir: str | Path, binary_name: str, build_dir: str | Path | None = None, *,
                  force: bool = False, timeout_s: float = 600) -> Build:
    """Return the ``Build`` of the CMake project in ``source_dir``, configuring and compiling it when needed.

    Builds ``binary_name`` into ``build_dir`` (default ``default_build_dir(binary_name)``) against
    the installed torch (``torch.utils.cmake_prefix_path``, its C++ ABI flag passed as
    ``TORCH_CXX11_ABI``). Nothing is rebuilt when the binary is newer than every file in
    ``source_dir``, unless ``force``. Raises CppToolchainMissing when cmake or a compiler is
    missing, FileNotFoundError when ``source_dir`` has no CMakeLists.txt, and RuntimeError with
    CMake's output when configuring or compiling fails.
    """
    tools = find_tools()
    source_dir = Path(source_dir)
    if not (source_dir / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{source_dir} holds no CMakeLists.txt: not a CMake project")
    build_dir = Path(build_dir) if build_dir is not None else default_build_dir(binary_name)
    binary = build_dir / binary_name
    if not force and _is_fresh(binary, source_dir):
        return Build(binary, False, 0.0)
    with _exclusive(build_dir):  # a notebook and a test (or two test workers) may build at once
        if not force and _is_fresh(binary, source_dir):
            return Build(binary, False, 0.0)  # another process built it while this one waited
        return _configure_and_build(tools, source_dir, build_dir, binary, timeout_s)


@contextlib.contextmanager
def _exclusive(build_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``build_dir`` across processes (POSIX; elsewhere no lock)."""
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: builds there are not run concurrently by the course
        yield
        return
    with open(build_dir.parent / f".{build_dir.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _configure_and_build(tools: dict[str, str], source_dir: Path, build_dir: Path, binary: Path,
                         timeout_s: float) -> Build:
    """Return the ``Build`` after running CMake's configure and build steps (see ``build_project``)."""
    start = time.perf_counter()
    compiler = cmake_compiler_args(tools["cxx"])
    forget_other_compiler(build_dir, compiler)
    configure = [tools["cmake"], "-S", str(source_dir), "-B", str(build_dir),
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                 *compiler, "-DCMAKE_BUILD_TYPE=Release",
                 f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    for cmd in (configure, [tools["cmake"], "--build", str(build_dir)]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {out.returncode}):\n"
                               f"{(out.stdout + out.stderr)[-4000:]}")
        if cmd is configure:
            (build_dir / COMPILER_STAMP).write_text("\n".join(compiler) + "\n", encoding="utf-8")
    if not binary.exists():
        raise RuntimeError(f"the build finished but {binary} is missing")
    binary.touch()  # mark it newer than the sources even if the linker left an old timestamp
    return Build(binary, True, time.perf_counter() - start)


def library_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return this process's environment with the wheel's ``lib`` folder first on LD_LIBRARY_PATH
    (DYLD_LIBRARY_PATH on macOS), plus ``extra``. Libraries a program opens itself at run time
    (an AOTInductor package's shared object) are found through it, not through the binary's RUNPATH."""
    env = dict(os.environ)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env[var] = os.pathsep.join(p for p in (str(torch_lib_dir()), env.get(var, "")) if p)
    env.update(extra or {})
    return env


def run_program(argv: Sequence[str | Path], *, env: dict[str, str] | None = None,
                timeout_s: float = 120) -> str:
    """Return what the program ``argv`` printed on stdout, run with ``library_env(env)``.

    Raises ProgramFailed with the program's first error line when it exits with an error, and
    subprocess.TimeoutExpired after ``timeout_s`` seconds.
    """
    argv = [str(a) for a in argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=library_env(env), timeout=timeout_s)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise ProgramFailed(f"{Path(argv[0]).name} exited with {proc.returncode}: "
                            f"{lines[0] if lines else '(no message)'}")
    return proc.stdout


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|(\S+))")


def shared_libraries(path: str | Path, env: dict[str, str] | None = None) -> list[SharedLibrary]:
    """Return the shared libraries ``path`` (a program or a shared object) loads at run time, as ``ldd``
    resolves them with ``library_env(env)``, each with its size on disk (0 when not found).

    Linux only: raises RuntimeError naming the platform elsewhere, or when ``ldd`` is missing or fails.
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError(f"listing shared libraries uses ldd, which is Linux-only (this is {sys.platform})")
    ldd = shutil.which("ldd")
    if ldd is None:
        raise RuntimeError("ldd was not found on PATH (it ships with the C library: Debian's libc-bin)")
    proc = subprocess.run([ldd, str(path)], capture_output=True, text=True, env=library_env(env), timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"ldd {path} failed: {(proc.stderr or proc.stdout).strip()}")
    found = []
    for line in proc.stdout.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        where = Path(match.group(3)) if match.group(3) else None
        found.append(SharedLibrary(match.group(1), where, where.stat().st_size if where else 0))
    return found
