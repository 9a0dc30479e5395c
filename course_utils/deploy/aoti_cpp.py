"""Build and run the course's C++ AOTInductor loader (``cpp/aoti_loader``) from Python.

Notebook 06 compiles a model with AOTInductor into a ``.pt2`` package, then runs the same
package from a small C++ program. This module is the plumbing behind that cell:

- ``toolchain_problem``: why the C++ build cannot run here (no cmake, no compiler), or None.
- ``build_loader``: configure and build the program into ``build/aoti_loader/<torch install>``;
  skipped when the binary is newer than every source file.
- ``run_loader``: run the binary on one float32 tensor and return its output tensor.
- ``write_tensor`` / ``read_tensor``: the tensor file format the program reads and writes.

Building and running are ``cmake_build``'s (shared with the LibTorch trainer, ``libtorch_cpp``),
the file format is ``tensor_file``'s; the names are re-exported here so code written against this
module keeps working.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .. import config
from .cmake_build import (COMPILER_STAMP, Build, CppToolchainMissing, ProgramFailed, build_project,
                          cmake_compiler_args, find_tools, library_env, run_program, toolchain_problem,
                          torch_lib_dir)
from .cmake_build import default_build_dir as _project_build_dir
from .cmake_build import forget_other_compiler as _forget_other_compiler
from .tensor_file import MAGIC, read_tensor, write_tensor

__all__ = ["BINARY_NAME", "COMPILER_STAMP", "MAGIC", "SOURCE_DIR", "Build", "CppToolchainMissing", "LoaderFailed",
           "build_loader", "cmake_compiler_args", "default_build_dir", "find_tools", "loader_env", "read_tensor",
           "run_loader", "toolchain_problem", "torch_lib_dir", "write_tensor", "_forget_other_compiler"]

#: The C++ sources (main.cpp, CMakeLists.txt).
SOURCE_DIR = config.REPO_ROOT / "cpp" / "aoti_loader"
#: Name of the executable CMake produces.
BINARY_NAME = "aoti_loader"


class LoaderFailed(ProgramFailed):
    """The C++ loader exited with an error; the message carries what it printed."""


def default_build_dir() -> Path:
    """Return ``build/aoti_loader/<torch version>-<install hash>``: one build per torch installation."""
    return _project_build_dir(BINARY_NAME)


def build_loader(build_dir: str | Path | None = None, *, force: bool = False,
                 source_dir: str | Path | None = None, timeout_s: float = 600) -> Build:
    """Return the ``Build`` of the C++ loader, configuring and compiling it when needed.

    ``cmake_build.build_project`` on ``source_dir`` (default ``SOURCE_DIR``) into ``build_dir``
    (default ``default_build_dir()``); see there for when it rebuilds and what it raises
    (CppToolchainMissing when cmake or a compiler is missing).
    """
    return build_project(source_dir if source_dir is not None else SOURCE_DIR, BINARY_NAME,
                         build_dir if build_dir is not None else default_build_dir(),
                         force=force, timeout_s=timeout_s)


def loader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment the binary needs: the wheel's ``lib`` folder on LD_LIBRARY_PATH.

    The package's shared object is opened with dlopen at run time and links libtorch.so;
    the binary's own RUNPATH does not cover libraries it opens, so the loader must find
    them through LD_LIBRARY_PATH (DYLD_LIBRARY_PATH on macOS).
    """
    return library_env(extra)


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
        try:
            run_program([binary, package, in_path, out_path], env=env, timeout_s=timeout_s)
        except ProgramFailed as err:
            raise LoaderFailed(str(err)) from None
        return read_tensor(out_path)
