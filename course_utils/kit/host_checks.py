"""Is the machine around Python ready? CMake, the C++ standard, OpenMP beside Apple clang (macOS only),
the course's Jupyter kernel, loopback networking and free disk space: the doctor's checks that need no
installed package.

Standard library only, so ``python3 -m course_utils doctor`` can run them on a fresh laptop
before ``make setup`` has installed anything.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .. import config, toolchain
from .check import Check
from .lab import KERNEL_NAME

#: Oldest CMake the course's C++ programs build with (``cmake_minimum_required`` in ``cpp/*/CMakeLists.txt``).
CMAKE_MIN = (3, 18)
#: Below this much free space the doctor warns. Inductor's compile cache grows with every graph compiled
#: (it held 1.7 GiB on the machine the course was written on, after many runs), notebooks write exported
#: models, traces and two C++ builds to ``build/``, and a disk that fills up mid-compile fails with errors
#: that do not say the disk is full.
DISK_WARN_GIB = 3.0
#: What ``make setup`` installs into ``.venv`` (7.2 GiB measured on Linux x86_64 with torch's CUDA build).
VENV_GIB = 7.0

_CMAKE_INSTALL = ("install CMake 3.18+ (Debian/Ubuntu: `sudo apt install cmake`; macOS: `brew install cmake`; "
                  "without admin rights: the conda route in README, then `conda install -c conda-forge cmake`)")
_KERNEL_FIX = "run `make kernel` (every `make lab` does it before JupyterLab starts)"


# ---- CMake and the C++ standard -------------------------------------------------------------------

def cmake_version(cmake: str, timeout_s: float = 30.0) -> tuple[int, ...] | None:
    """Return the version ``cmake --version`` reports, as numbers, or None when it reports none."""
    try:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"version\s+(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def check_cmake(timeout_s: float = 30.0) -> Check:
    """Return whether CMake 3.18+ is on PATH: notebook 06 builds its two C++ programs (the AOTInductor
    loader and the LibTorch trainer) with it. Without it those cells are skipped, so this only warns."""
    skipped = "notebook 06 skips its C++ programs (the AOTInductor loader and the LibTorch trainer); the rest runs"
    cmake = shutil.which("cmake")
    if cmake is None:
        return Check.warn("cmake", f"not found on PATH, so {skipped}", _CMAKE_INSTALL)
    version = cmake_version(cmake, timeout_s)
    if version is None:
        return Check.warn("cmake", f"{cmake} does not report a version, so {skipped}", _CMAKE_INSTALL)
    shown = ".".join(map(str, version))
    if version < CMAKE_MIN:
        need = ".".join(map(str, CMAKE_MIN))
        return Check.warn("cmake", f"{cmake} is CMake {shown}, older than {need}, so {skipped}", _CMAKE_INSTALL)
    return Check("cmake", True, f"CMake {shown} ({cmake})")


def check_cxx_standard(standard: str = toolchain.CXX_STANDARD) -> Check:
    """Return whether the C++ compiler compiles ``standard`` (C++20: torch's Inductor and headers need it)."""
    tc = toolchain.check_cxx_standard(standard)
    label = standard.upper()
    if tc.works:
        return Check("c++ standard", True, f"{tc.detail}, as torch.compile's CPU code and notebook 06 need")
    detail = tc.detail
    if standard != "c++17" and toolchain.check_cxx_standard("c++17").works:
        detail += f"; it compiles C++17, but torch.compile's CPU code is built as {label}"
    return Check("c++ standard", False, detail,
                 f"install a compiler that supports {label} (GCC 10+ or Clang 10+; Debian/Ubuntu: "
                 "`sudo apt-get install g++`; macOS: a current `xcode-select --install`) or set CXX to one; "
                 "meanwhile compile with backend='eager' / 'aot_eager'")


# ---- macOS: OpenMP beside Apple clang -------------------------------------------------------------

#: The first line of ``--version`` from Apple's compilers (Xcode's clang++, and its g++, which is clang too).
APPLE_CLANG = re.compile(r"\bApple\b.*\bclang\b")
#: Where Homebrew puts libomp (Apple silicon, then Intel Macs); Inductor finds it only through `brew` on PATH.
HOMEBREW_LIBOMP = (Path("/opt/homebrew/opt/libomp"), Path("/usr/local/opt/libomp"))
#: A tiny OpenMP program: it builds only where the compiler finds ``omp.h`` and links an OpenMP runtime.
OPENMP_PROBE = ('#include <omp.h>\n'
                'extern "C" int course_probe(void) { int n = 0;\n'
                '#pragma omp parallel reduction(+:n)\n  n += 1;\n  return n + omp_get_max_threads(); }\n')
_OPENMP_FIX = ("`brew install libomp` (torch.compile finds it through `brew --prefix libomp`); in a conda environment "
               "`conda install -c conda-forge llvm-openmp`; or set OMP_PREFIX to a folder holding include/omp.h and "
               "lib/libomp.dylib; or set CXX to a compiler that brings OpenMP (Homebrew's `brew install llvm`, then "
               "CXX=$(brew --prefix llvm)/bin/clang++). Meanwhile compile with backend='eager' / 'aot_eager'")


def compiler_version_line(words: Sequence[str], timeout_s: float = 30.0) -> str:
    """Return the first line ``<compiler> --version`` prints (empty when it prints nothing or cannot run)."""
    try:
        out = subprocess.run([*words, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def brew_libomp(timeout_s: float = 30.0) -> Path | None:
    """Return the folder ``brew --prefix libomp`` names, or None without Homebrew on PATH (the folder may
    not exist: brew names where libomp would be installed)."""
    brew = shutil.which("brew")
    if brew is None:
        return None
    try:
        out = subprocess.run([brew, "--prefix", "libomp"], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def openmp_candidates(environ: Mapping[str, str], brew_prefix: Path | None) -> list[tuple[str, Path]]:
    """Return the folders torch.compile would take OpenMP from beside Apple clang, in its order:
    ``$OMP_PREFIX``, the active conda environment (``$CONDA_PREFIX``), Homebrew's libomp."""
    found = []
    if environ.get("OMP_PREFIX"):
        found.append(("OMP_PREFIX", Path(environ["OMP_PREFIX"])))
    if environ.get("CONDA_PREFIX"):
        found.append(("the conda environment", Path(environ["CONDA_PREFIX"])))
    if brew_prefix is not None:
        found.append(("Homebrew's libomp", brew_prefix))
    return found


def _has_omp_header(folder: Path) -> bool:
    """Return whether ``folder/include/omp.h`` exists."""
    return (folder / "include" / "omp.h").is_file()


def openmp_flags(apple: bool, prefix: Path | None) -> list[str]:
    """Return the flags that build an OpenMP shared library: Apple clang takes OpenMP through ``-Xclang``
    and links ``libomp`` from ``prefix``; other compilers take ``-fopenmp`` and bring their own runtime."""
    flags = ["-shared", "-fPIC"]
    if not apple:
        return [*flags, "-fopenmp"]
    extra = [f"-I{prefix / 'include'}", f"-L{prefix / 'lib'}"] if prefix is not None else []
    return [*flags, "-Xclang", "-fopenmp", *extra, "-lomp"]


def check_macos_openmp(platform: str | None = None, environ: Mapping[str, str] | None = None,
                       brew_prefix: Callable[[], Path | None] = brew_libomp, probe: bool = True) -> list[Check]:
    """Return, on macOS only, whether torch.compile's CPU code can use OpenMP (an empty list elsewhere).

    Inductor compiles its CPU kernels with ``-fopenmp``. Apple clang (Xcode's ``clang++``, and its
    ``g++``) ships no OpenMP runtime, so before the first compile fails with ``'omp.h' file not found``
    this finds one where Inductor looks (``$OMP_PREFIX``, the conda environment, ``brew --prefix
    libomp``) and, with ``probe``, builds a tiny OpenMP library the same way. Another compiler (``CXX``
    set to Homebrew's LLVM or GCC) brings its own; the probe checks that too. No compiler at all is the
    ``c++ compiler`` check's failure, not this one's. ``platform`` (default ``sys.platform``),
    ``environ`` (default ``os.environ``) and ``brew_prefix`` are there for tests.
    """
    if not (sys.platform if platform is None else platform).startswith("darwin"):
        return []
    environ = os.environ if environ is None else environ
    try:
        words = toolchain.cxx_command(environ)
    except toolchain.CompilerNotFound:
        return []
    cxx, first = shlex.join(words), compiler_version_line(words)
    apple = bool(APPLE_CLANG.search(first))
    name = "openmp"
    if not apple:
        detail = (f"{cxx} is not Apple clang ({first or 'no --version line'}), and torch.compile expects such a "
                  "compiler to bring its own OpenMP")
        prefix = None
    else:
        candidates = openmp_candidates(environ, brew_prefix())
        usable = [(where, folder) for where, folder in candidates if _has_omp_header(folder)]
        if not usable:
            looked = "; ".join(f"{where}: {folder} has no include/omp.h" for where, folder in candidates)
            hidden = [str(p) for p in HOMEBREW_LIBOMP if _has_omp_header(p)]
            detail = (f"{cxx} is {first}, which has no OpenMP runtime of its own, and none was found "
                      f"({looked or 'no OMP_PREFIX, no conda environment, no `brew` on PATH'}), "
                      "so torch.compile's CPU code fails with \"'omp.h' file not found\"")
            fix = (f"libomp is installed at {hidden[0]}, but torch.compile finds it only through `brew` on PATH: "
                   f"put Homebrew on PATH (`eval \"$({Path(hidden[0]).parents[1] / 'bin' / 'brew'} shellenv)\"`) "
                   f"or set OMP_PREFIX={hidden[0]}" if hidden else _OPENMP_FIX)
            return [Check(name, False, detail, fix)]
        where, prefix = usable[0]
        detail = f"{cxx} is {first}, with OpenMP from {where} ({prefix})"
    if probe:
        # toolchain's own probe compiler: the same command line the c++ compiler check builds with
        problem = toolchain._compile(words, OPENMP_PROBE, openmp_flags(apple, prefix), "probe.dylib", 60.0)
        if problem is not None:
            problem = problem.replace("a trivial file", "the OpenMP probe")
            return [Check(name, False, f"{detail}, but a small OpenMP library does not build: {problem}", _OPENMP_FIX)]
        detail += "; a small OpenMP library builds"
    return [Check(name, True, detail)]


# ---- the course's Jupyter kernel -----------------------------------------------------------------

def running_environment() -> Path | None:
    """Return the virtual or conda environment this Python runs in, or None for a Python outside one."""
    prefix = Path(sys.prefix)
    if sys.prefix != sys.base_prefix or (prefix / "conda-meta").is_dir():
        return prefix
    return None


def checkout_venv() -> Path:
    """Return this checkout's ``.venv`` folder (which ``make setup`` creates), whether it exists or not."""
    return config.REPO_ROOT / ".venv"


def venv_python(venv: Path | None = None) -> Path:
    """Return the Python inside the environment ``venv`` (default: this checkout's ``.venv``)."""
    venv = checkout_venv() if venv is None else venv
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


def course_environment() -> Path:
    """Return the environment the course kernel should run: the one this Python runs in (a conda
    environment counts, for README's conda route), or this checkout's ``.venv`` for a Python outside one."""
    return running_environment() or checkout_venv()


def _user_data_dir() -> Path:
    """Return Jupyter's per-user data folder as ``jupyter --data-dir`` prints it."""
    if os.environ.get("JUPYTER_DATA_DIR"):
        return Path(os.environ["JUPYTER_DATA_DIR"]).expanduser()
    if os.name == "nt":
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming") / "jupyter"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Jupyter"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "jupyter"


def kernel_dirs(environment: Path | None = None) -> list[Path]:
    """Return the folders Jupyter looks for kernels in, in its order (the first folder holding a name wins).

    With Jupyter installed in this Python, its own answer (``jupyter_core.paths.jupyter_path``);
    otherwise the same rule written out: ``$JUPYTER_PATH``, then ``environment`` (default
    ``course_environment()``, the one whose JupyterLab runs the course) and the user's data folder
    (in the other order with ``JUPYTER_PREFER_ENV_PATH=0``), then the system's.
    """
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:  # a Python without Jupyter: the course's JupyterLab runs from its environment
        pass
    else:
        return [Path(folder) for folder in jupyter_path("kernels")]
    environment = course_environment() if environment is None else environment
    roots = [Path(p) for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    # The course's JupyterLab runs in an environment, where Jupyter reads it before the user's folder
    # unless JUPYTER_PREFER_ENV_PATH says otherwise.
    prefer_env = os.environ.get("JUPYTER_PREFER_ENV_PATH", "1").lower() not in ("no", "n", "false", "off", "0", "0.0")
    pair = [environment / "share" / "jupyter", _user_data_dir()]
    roots += pair if prefer_env else pair[::-1]
    if os.name == "nt":
        roots.append(Path(os.environ.get("PROGRAMDATA") or r"C:\ProgramData") / "jupyter")
    else:
        roots += [Path("/usr/local/share/jupyter"), Path("/usr/share/jupyter")]
    return [root / "kernels" for root in roots]


def find_kernelspec(name: str = KERNEL_NAME, dirs: Sequence[Path] | None = None) -> Path | None:
    """Return the ``kernel.json`` Jupyter uses for kernel ``name`` (the first in ``kernel_dirs()``), or None."""
    for folder in kernel_dirs() if dirs is None else dirs:
        spec = Path(folder) / name / "kernel.json"
        if spec.is_file():
            return spec
    return None


def _inside(path: Path, folder: Path) -> bool:
    """Return whether ``path`` is ``folder`` or lies under it (both taken as they are)."""
    return path == folder or folder in path.parents


def check_kernel(dirs: Sequence[Path] | None = None, environment: Path | None = None) -> Check:
    """Return whether the course kernel (``pytorch2-course``) starts an interpreter that exists and
    belongs to ``environment`` (default ``course_environment()``: this checkout's ``.venv``).

    Only a warning when it does not: ``make lab`` registers the kernel again before JupyterLab starts;
    a JupyterLab started another way, or VS Code, would start the wrong Python or none.
    """
    environment = course_environment() if environment is None else environment
    spec = find_kernelspec(KERNEL_NAME, dirs)
    if spec is None:
        looked = ", ".join(str(d) for d in (kernel_dirs(environment) if dirs is None else dirs))
        return Check.warn("jupyter kernel", f"{KERNEL_NAME} is not registered (looked in {looked})", _KERNEL_FIX)
    try:
        argv = json.loads(spec.read_text(encoding="utf-8"))["argv"]
        program = str(argv[0])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        return Check.warn("jupyter kernel", f"{spec} cannot be read as a kernel spec ({err!r})", _KERNEL_FIX)
    found = shutil.which(program) if not os.path.isabs(program) else program
    if found is None or not Path(found).is_file():
        return Check.warn("jupyter kernel", f"{KERNEL_NAME} ({spec}) starts {program}, which does not exist "
                          "(a deleted or moved environment), so JupyterLab cannot start it", _KERNEL_FIX)
    where = Path(os.path.realpath(Path(found).parent))
    if not _inside(where, Path(os.path.realpath(environment))):
        return Check.warn("jupyter kernel", f"{KERNEL_NAME} ({spec}) starts {program}, which is not in {environment}: "
                          "notebooks would run another environment's packages", _KERNEL_FIX)
    return Check("jupyter kernel", True, f"{KERNEL_NAME} starts {program} ({spec})")


# ---- loopback ------------------------------------------------------------------------------------

def check_loopback(timeout_s: float = 5.0) -> Check:
    """Return whether a socket on 127.0.0.1 accepts a connection and passes bytes.

    JupyterLab talks to its kernels over loopback, notebook 10's server listens there and notebook 12's
    torchrun jobs meet there; an empty network namespace, or a security tool, can take it away.
    """
    uses = "JupyterLab's kernels, notebook 10's server and notebook 12's torchrun jobs use it"
    fix = ("on Linux, bring loopback up as root (`ip link set lo up`; a container or network namespace must "
           "start with it up); elsewhere, allow 127.0.0.1 in the firewall, VPN or security software")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            server.settimeout(timeout_s)
            address = server.getsockname()
            with socket.create_connection(address, timeout=timeout_s) as client:
                accepted, _ = server.accept()
                with accepted:
                    client.sendall(b"ping")
                    echoed = accepted.recv(4)
    except OSError as err:
        return Check("loopback", False, f"cannot connect to a socket on 127.0.0.1 ({err}); {uses}", fix)
    if echoed != b"ping":
        return Check("loopback", False, f"a connection on 127.0.0.1 passed {echoed!r} instead of b'ping'", fix)
    return Check("loopback", True, f"127.0.0.1 accepts connections ({uses})")


# ---- disk space ----------------------------------------------------------------------------------

def _existing(path: Path) -> Path:
    """Return ``path`` or its nearest parent that exists (a folder not made yet lives on that disk)."""
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def free_gib(path: Path) -> float:
    """Return the free space, in GiB, of the disk that holds (or will hold) ``path``."""
    return shutil.disk_usage(_existing(path)).free / 2**30


def folder_mb(folder: Path) -> float:
    """Return the size of the files under ``folder`` in MB (10**6 bytes); 0 when it does not exist."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6 if folder.is_dir() else 0.0


def check_disk_space(min_gib: float = DISK_WARN_GIB) -> list[Check]:
    """Return one check each for the checkout's disk, the compile cache's and the temporary directory's
    (where torch keeps Inductor's precompiled headers, over 100 MB per set of compiler flags); each warns
    below ``min_gib`` free (the checkout's below ``min_gib + VENV_GIB`` while ``.venv`` is still to be made)."""
    cache = config.inductor_cache_dir()
    headers = config.precompiled_header_dir()
    places = [("disk (checkout)", config.REPO_ROOT, min_gib,
               "free space on that disk or move the outputs there (COURSE_BUILD_DIR=/a/disk/with/room)"),
              ("disk (compile cache)", cache, min_gib,
               "free space on that disk, or set TORCHINDUCTOR_CACHE_DIR to a folder on a disk with room, "
               "then `make kernel`"),
              ("disk (temporary directory)", headers, min_gib,
               "free space there, or point TMPDIR at a folder on a disk with room: torch keeps Inductor's "
               "precompiled C++ headers there (Linux, macOS), whatever TORCHINDUCTOR_CACHE_DIR says")]
    if running_environment() is None and not venv_python().exists():  # .venv is still to be installed there
        name, folder, _, fix = places[0]
        places[0] = (name, folder, min_gib + VENV_GIB, fix)
    checks = []
    for name, folder, need, fix in places:
        free = free_gib(folder)
        detail = f"{free:.1f} GiB free at {folder}"
        if folder == headers and folder.is_dir():
            detail += f" (Inductor's precompiled headers there: {folder_mb(folder):,.0f} MB)"
        if free >= need:
            checks.append(Check(name, True, detail))
            continue
        why = (f"below {need:.0f} GiB: `make setup` installs about {VENV_GIB:.0f} GiB into .venv, and "
               if need > min_gib else f"below {need:.0f} GiB: ")
        why += "compiles, exported models and C++ builds need room, and a full disk fails them with misleading errors"
        checks.append(Check.warn(name, f"only {detail}, {why}", fix))
    return checks
