"""Find the CUDA toolkit that AOTInductor needs to build a package for a GPU (notebook 06).

``torch._inductor.aoti_compile_and_package`` on a CUDA model writes C++ that includes ``cuda.h``
and links ``-lcuda``. torch takes the toolkit's folder from ``torch.utils.cpp_extension.CUDA_HOME``,
which it guesses once, at import: ``$CUDA_HOME`` or ``$CUDA_PATH``, else two folders above the
``nvcc`` found on ``PATH``, else ``/usr/local/cuda``. That guess is wrong where ``nvcc`` on ``PATH``
is a wrapper script or a link from ``/usr/local/bin`` (the guess is then ``/usr/local``, which has
no ``cuda.h``), and ``-lcuda`` needs a file named ``libcuda.so``, which many machines have only as
the driver's ``libcuda.so.1`` or the toolkit's ``stubs`` folder.

- ``find_cuda_home()``: the first folder, among torch's guess and the usual places, that holds
  ``include/cuda.h``; None when there is none.
- ``libcuda_dir(home)``: a folder holding a ``libcuda.so`` the linker can take; for a driver that
  ships only ``libcuda.so.1``, a folder under the build directory with a ``libcuda.so`` link to it.
- ``prepare()``: do both and point torch and the compiler at them (``CUDA_HOME`` for torch,
  ``LIBRARY_PATH`` for gcc); return None, or why AOTInductor for CUDA cannot build here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .. import config

__all__ = ["candidates", "find_cuda_home", "libcuda_dir", "prepare"]

#: Where a toolkit's ``libcuda.so`` stub may sit, relative to the toolkit's folder.
STUB_DIRS = ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs", "targets/sbsa-linux/lib/stubs")


def _torch_guess() -> str | None:
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME


def candidates(torch_guess: str | None = None, environ: dict[str, str] | None = None,
               nvcc: str | None = None, roots: Iterable[Path] = (Path("/usr/local"), Path("/opt"))) -> list[Path]:
    """Return the folders that may hold the CUDA toolkit, most likely first, without repeats.

    torch's guess first, then ``$CUDA_HOME`` and ``$CUDA_PATH``, then two folders above ``nvcc``
    with its links resolved, then ``cuda`` and ``cuda-*`` (newest version first) under ``roots``.
    """
    env = os.environ if environ is None else environ
    found: list[Path] = []
    for value in (torch_guess, env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if value:
            found.append(Path(value))
    if nvcc:
        found.append(Path(os.path.realpath(nvcc)).parent.parent)
    for root in roots:
        found.append(root / "cuda")
        versions = sorted(root.glob("cuda-*"), key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)],
                          reverse=True)
        found.extend(versions)
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def find_cuda_home(folders: Iterable[Path] | None = None) -> Path | None:
    """Return the first of ``folders`` (default ``candidates()``) that holds ``include/cuda.h``."""
    if folders is None:
        folders = candidates(_torch_guess(), nvcc=shutil.which("nvcc"))
    for folder in folders:
        if (folder / "include" / "cuda.h").is_file():
            return folder
    return None


def _ldconfig_libcuda() -> list[Path]:
    """Return the paths ``ldconfig -p`` lists for libcuda.so and libcuda.so.1 (empty when it cannot say)."""
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None)
    if ldconfig is None:
        return []
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [Path(line.rsplit("=>", 1)[1].strip()) for line in out.splitlines()
            if "=>" in line and line.strip().split()[0] in ("libcuda.so", "libcuda.so.1")]


def libcuda_dir(home: Path, listed: Iterable[Path] | None = None, link_dir: Path | None = None) -> Path | None:
    """Return a folder with a ``libcuda.so`` that ``-lcuda`` can link, or None.

    The driver's ``libcuda.so`` where ``ldconfig`` lists one (``listed``, default its output), else
    the toolkit's stub under ``home``, else a folder ``link_dir`` (default under the build directory)
    holding a ``libcuda.so`` link to the driver's ``libcuda.so.1``.
    """
    listed = list(_ldconfig_libcuda() if listed is None else listed)
    for path in listed:
        if path.name == "libcuda.so" and path.exists():
            return path.parent
    for sub in STUB_DIRS:
        if (home / sub / "libcuda.so").exists():
            return home / sub
    for path in listed:
        if path.name == "libcuda.so.1" and path.exists():
            folder = link_dir if link_dir is not None else config.build_dir() / "cuda_link"
            folder.mkdir(parents=True, exist_ok=True)
            link = folder / "libcuda.so"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(path.resolve())
            return folder
    return None


def prepare() -> str | None:
    """Point torch and the compiler at the CUDA toolkit; return None, or why AOTInductor cannot build for CUDA here.

    Sets ``torch.utils.cpp_extension.CUDA_HOME`` and ``$CUDA_HOME`` to ``find_cuda_home()`` where
    torch guessed otherwise, and puts ``libcuda_dir`` on ``$LIBRARY_PATH`` (gcc searches it for
    ``-l`` libraries). Call it before ``aoti_compile_and_package`` on a CUDA model.
    """
    from torch.utils import cpp_extension

    guess = cpp_extension.CUDA_HOME
    home = find_cuda_home()
    if home is None:
        return (f"no CUDA toolkit headers (include/cuda.h) were found (torch's guess: {guess}; also looked at "
                "$CUDA_HOME, $CUDA_PATH, nvcc's folder, /usr/local/cuda*, /opt/cuda*); install the CUDA toolkit "
                "or set CUDA_HOME to it")
    libs = libcuda_dir(home)
    if libs is None:
        return (f"the CUDA toolkit is at {home}, but no libcuda.so to link was found (neither the driver's, listed by "
                "ldconfig, nor the toolkit's lib64/stubs)")
    if str(home) != str(guess):
        cpp_extension.CUDA_HOME = str(home)
    os.environ["CUDA_HOME"] = str(home)
    paths = [p for p in os.environ.get("LIBRARY_PATH", "").split(os.pathsep) if p]
    if str(libs) not in paths:
        os.environ["LIBRARY_PATH"] = os.pathsep.join([str(libs), *paths])
    return None
