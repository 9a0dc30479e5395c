"""Build and run the course's C++ AOTInductor loader (``cpp/aoti_loader``) from Python.

Notebook 06 compiles a model with AOTInductor into a ``.pt2`` package, then runs the same
package from a small C++ program. This module is the plumbing behind that cell:

- ``toolchain_problem``: why the C++ build cannot run here (no cmake, no compiler), or None.
- ``build_loader``: configure and build the program into ``build/aoti_loader/<torch install>``;
  skipped when the binary is newer than every source file.
- ``run_loader``: run the binary on one float32 tensor and return its output tensor.
- ``write_tensor`` / ``read_tensor``: the tensor file format the program reads and writes.

The tensor file format is deliberately plain, so the C++ side needs no pickle reader:
8 bytes of magic ``AOTITNSR``, an int64 count of dimensions ``n``, ``n`` int64 sizes, then
the float32 values in row-major order; everything little-endian.
"""

from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import config
from ..kit.env import CompilerNotFound, cxx_command, split_launcher

#: The C++ sources (main.cpp, CMakeLists.txt).
SOURCE_DIR = config.REPO_ROOT / "cpp" / "aoti_loader"
#: Name of the executable CMake produces.
BINARY_NAME = "aoti_loader"
#: First bytes of every tensor file.
MAGIC = b"AOTITNSR"


class CppToolchainMissing(RuntimeError):
    """CMake or a C++ compiler is missing; the message says which, and how to install it."""


class LoaderFailed(RuntimeError):
    """The C++ program exited with an error; the message carries what it printed."""


@dataclass(frozen=True)
class Build:
    """The built program: where it is, whether this call (re)built it, and how long that took."""

    binary: Path
    rebuilt: bool
    seconds: float


def find_tools() -> dict[str, str]:
    """Return {"cmake": path, "cxx": command line} for the tools the build needs.

    The compiler is ``env.cxx_command()``'s, the same one the doctor checks (``$CXX`` first, a
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
    """Return why the C++ loader cannot be built on this machine, or None when it can."""
    try:
        find_tools()
    except CppToolchainMissing as err:
        return str(err)
    return None


def torch_lib_dir() -> Path:
    """Return the ``lib`` folder of the installed torch wheel (libtorch_cpu.so and friends)."""
    return Path(torch.__file__).resolve().parent / "lib"


def _sources(source_dir: Path) -> list[Path]:
    return sorted(p for p in source_dir.iterdir() if p.is_file())


def _is_fresh(binary: Path, source_dir: Path) -> bool:
    if not binary.exists():
        return False
    newest = max(p.stat().st_mtime for p in _sources(source_dir))
    return binary.stat().st_mtime > newest


def default_build_dir() -> Path:
    """``build/aoti_loader/<torch version>-<install hash>``: one build per torch installation, so
    a second environment (``make test-min``'s torch 2.11) never reuses a binary linked to another."""
    import hashlib

    where = hashlib.sha256(str(Path(torch.__file__).resolve()).encode()).hexdigest()[:8]
    return config.build_dir() / "aoti_loader" / f"torch-{torch.__version__.replace('+', '_')}-{where}"


#: The compiler options a build folder was configured with (``_forget_other_compiler``).
COMPILER_STAMP = "course-compiler.txt"


def _forget_other_compiler(build_dir: Path, compiler: list[str]) -> bool:
    """Drop CMake's cache in ``build_dir`` unless it was configured with ``compiler``; return
    whether it did. When the compiler changes, CMake empties its cache itself but keeps only the
    changed variables, so the next configure fails without ``CMAKE_PREFIX_PATH``; starting clean
    avoids that (a folder configured before this stamp existed starts clean once)."""
    cache = build_dir / "CMakeCache.txt"
    stamp = build_dir / COMPILER_STAMP
    if not cache.exists():
        return False
    if stamp.exists() and stamp.read_text(encoding="utf-8") == "\n".join(compiler) + "\n":
        return False
    cache.unlink()
    shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    return True


def build_loader(build_dir: str | Path | None = None, *, force: bool = False,
                 source_dir: str | Path | None = None, timeout_s: float = 600) -> Build:
    """Return the ``Build`` of the C++ loader, configuring and compiling it when needed.

    Builds into ``build_dir`` (default ``default_build_dir()``) against the
    installed torch (``torch.utils.cmake_prefix_path``). Nothing is rebuilt when the binary
    is newer than every file in ``source_dir``, unless ``force``. Raises
    CppToolchainMissing when cmake or a compiler is missing, and RuntimeError with CMake's
    output when configuring or compiling fails.
    """
    tools = find_tools()
    source_dir = Path(source_dir) if source_dir is not None else SOURCE_DIR
    build_dir = Path(build_dir) if build_dir is not None else default_build_dir()
    binary = build_dir / BINARY_NAME
    if not force and _is_fresh(binary, source_dir):
        return Build(binary, False, 0.0)
    start = time.perf_counter()
    compiler = cmake_compiler_args(tools["cxx"])
    _forget_other_compiler(build_dir, compiler)
    configure = [tools["cmake"], "-S", str(source_dir), "-B", str(build_dir),
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                 *compiler, "-DCMAKE_BUILD_TYPE=Release",
                 f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    cache = build_dir / "CMakeCache.txt"
    if shutil.which("ninja") and not cache.exists():
        configure += ["-G", "Ninja"]
    steps = [configure, [tools["cmake"], "--build", str(build_dir)]]
    for cmd in steps:
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


def write_tensor(path: str | Path, tensor: torch.Tensor) -> Path:
    """Return ``path`` after writing ``tensor`` (as float32, on the CPU) in the loader's format."""
    t = tensor.detach().to("cpu", torch.float32).contiguous()
    path = Path(path)
    with path.open("wb") as fh:
        fh.write(MAGIC)
        fh.write(struct.pack("<q", t.dim()))
        fh.write(struct.pack(f"<{t.dim()}q", *t.shape))
        fh.write(t.numpy().astype("<f4", copy=False).tobytes())
    return path


def read_tensor(path: str | Path) -> torch.Tensor:
    """Return the float32 tensor stored in ``path`` (the loader's format); ValueError if malformed."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path} is not a tensor file (it does not start with {MAGIC!r})")
    (ndim,) = struct.unpack_from("<q", data, 8)
    if not 0 <= ndim <= 16:
        raise ValueError(f"{path}: implausible number of dimensions {ndim}")
    shape = struct.unpack_from(f"<{ndim}q", data, 16)
    offset = 16 + 8 * ndim
    count = 1
    for size in shape:
        count *= size
    if len(data) - offset != 4 * count:
        raise ValueError(f"{path}: shape {tuple(shape)} needs {4 * count} bytes of values, "
                         f"found {len(data) - offset}")
    values = torch.frombuffer(bytearray(data[offset:]), dtype=torch.float32) if count else torch.empty(0)
    return values.reshape(shape).clone()


def loader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment the binary needs: the wheel's ``lib`` folder on LD_LIBRARY_PATH.

    The package's shared object is opened with dlopen at run time and links libtorch.so;
    the binary's own RUNPATH does not cover libraries it opens, so the loader must find
    them through LD_LIBRARY_PATH (DYLD_LIBRARY_PATH on macOS).
    """
    env = dict(os.environ)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env[var] = os.pathsep.join(p for p in (str(torch_lib_dir()), env.get(var, "")) if p)
    env.update(extra or {})
    return env


def run_loader(binary: str | Path, package: str | Path, x: torch.Tensor, *,
               work_dir: str | Path | None = None, env: dict[str, str] | None = None,
               timeout_s: float = 120) -> torch.Tensor:
    """Return the output tensor of the C++ loader run on ``package`` with input ``x``.

    ``x`` and the output go through files in a private folder made for this call inside
    ``work_dir`` (default: next to the binary) and removed afterwards, also when the program
    fails or times out; so calls may share ``work_dir``, even at the same time. ``env`` adds
    environment variables (e.g. ``{"AOTI_RUNTIME_CHECK_INPUTS": "1"}``). Raises LoaderFailed
    with the program's message when it exits with an error, and subprocess.TimeoutExpired
    after ``timeout_s`` seconds.
    """
    binary = Path(binary)
    work = Path(work_dir) if work_dir is not None else binary.parent
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="run-") as private:
        in_path = write_tensor(Path(private) / "input.bin", x)
        out_path = Path(private) / "output.bin"
        proc = subprocess.run([str(binary), str(package), str(in_path), str(out_path)],
                              capture_output=True, text=True, env=loader_env(env), timeout=timeout_s)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise LoaderFailed(f"{binary.name} exited with {proc.returncode}: "
                               f"{lines[0] if lines else '(no message)'}")
        return read_tensor(out_path)
