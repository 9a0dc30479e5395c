"""Course-wide settings read from the environment, in one place.

``COURSE_QUICK=1`` (set by ``make test``) switches every notebook to small sizes
and few iterations. ``COURSE_RESULTS`` names a JSON-lines file that
``bench.record`` appends headline results to. ``COURSE_DATA_DIR``,
``COURSE_CACHE_DIR`` and ``COURSE_BUILD_DIR`` move the course's folders. Inductor's compile
cache goes to ``inductor_cache_dir()``, a folder in the user's cache that survives a reboot.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

#: The repository root: the folder that holds ``course_utils/`` and ``data/``.
REPO_ROOT = Path(__file__).resolve().parent.parent


def is_quick() -> bool:
    """Return True when quick mode is on (``COURSE_QUICK`` is 1/true/yes/on).

    Raises ValueError for a value that is neither on nor off, so a typo such as
    ``COURSE_QUICK=ture`` does not silently run the full-size course.
    """
    raw = os.environ.get("COURSE_QUICK", "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(
        f"COURSE_QUICK={raw!r} is not understood; use COURSE_QUICK=1 for quick mode "
        "or leave it unset for full mode."
    )


def pick(quick: T, full: T) -> T:
    """Return ``quick`` in quick mode and ``full`` otherwise.

    Notebooks size their experiments with it, e.g. ``n = pick(256, 4096)``.
    """
    return quick if is_quick() else full


def mode_name() -> str:
    """Return ``"quick"`` or ``"full"``."""
    return "quick" if is_quick() else "full"


def _dir_from_env(var: str, default: Path) -> Path:
    raw = os.environ.get(var)
    return Path(raw).expanduser().resolve() if raw else default


def data_dir() -> Path:
    """Return the folder of files the course ships (``data/``, or ``COURSE_DATA_DIR``)."""
    return _dir_from_env("COURSE_DATA_DIR", REPO_ROOT / "data")


def cache_dir(create: bool = True) -> Path:
    """Return the folder for regenerable caches (``.cache/``, or ``COURSE_CACHE_DIR``)."""
    path = _dir_from_env("COURSE_CACHE_DIR", REPO_ROOT / ".cache")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


#: Where the course keeps Inductor's compile cache, inside the user's cache folder.
INDUCTOR_CACHE_PARTS = ("pytorch2-course", "inductor")


def user_cache_home(environ: Mapping[str, str] | None = None) -> Path:
    """Return the user's cache folder: ``$XDG_CACHE_HOME`` when it is an absolute path, else ``~/.cache``.

    The XDG Base Directory rule: an empty or relative ``XDG_CACHE_HOME`` is ignored. Where no home
    folder can be found (no ``HOME``, no password entry), the repository's git-ignored ``.cache/``.
    """
    environ = os.environ if environ is None else environ
    xdg = (environ.get("XDG_CACHE_HOME") or "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg)
    home = environ.get("HOME")
    if home:
        return Path(home) / ".cache"
    try:
        return Path.home() / ".cache"
    except (RuntimeError, KeyError):
        return REPO_ROOT / ".cache"


def build_tag() -> str:
    """Return the torch release and Python this process runs, as a folder name: ``torch-2.14.1-py3.11``.

    Read from the installed package's metadata, so torch is not imported.
    """
    try:  # imported here: the doctor must start on a Python below the floor to say so (3.7 has no importlib.metadata)
        import importlib.metadata

        version = importlib.metadata.version("torch")
    except ImportError:  # no importlib.metadata, or no torch (PackageNotFoundError is an ImportError)
        version = "none"
    return f"torch-{version}-py{sys.version_info.major}.{sys.version_info.minor}"


#: Settings that change the C++ Inductor writes, or how it builds it, with the short name each gets
#: in the folder's name. Torch's own cache keys miss ``ATEN_CPU_CAPABILITY``: torch 2.14.1 with one
#: folder for two of its values handed the ``default`` profile a graph compiled for AVX2, and its C++
#: (``at::vec::Vectorized``) then failed to build. ``TORCHINDUCTOR_CPP_MARCH`` is in the key
#: (``cpp.march``) but kept apart as well, so a profile's folder never mixes with the real CPU's.
ISA_VARIABLES: tuple[tuple[str, str], ...] = (("ATEN_CPU_CAPABILITY", "aten"), ("TORCHINDUCTOR_CPP_MARCH", "march"))


def cache_tag(environ: Mapping[str, str] | None = None) -> str:
    """Return the compile cache's folder name: ``build_tag()``, plus each setting of ``ISA_VARIABLES``
    that ``environ`` (default: this process's environment) sets, as in
    ``torch-2.14.1-py3.11-aten-avx2-march-haswell`` (a CPU profile's folder)."""
    environ = os.environ if environ is None else environ
    parts = [build_tag()]
    for variable, short in ISA_VARIABLES:
        value = re.sub(r"[^A-Za-z0-9._]+", "_", (environ.get(variable) or "").strip())
        if value:
            parts.append(f"{short}-{value}")
    return "-".join(parts)


def precompiled_header_dir() -> Path:
    """Return where torch keeps Inductor's precompiled C++ headers: under the temporary directory
    (``<tmp>/torchinductor_<user>/precompiled_headers``, torch 2.14's ``codecache._HEADER_DIR``), whatever
    ``TORCHINDUCTOR_CACHE_DIR`` says, so emptying the course's cache folder leaves them. torch's own rule
    where torch imports; the same rule, by hand, where it does not (before ``make setup``)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return Path(default_cache_dir()) / "precompiled_headers"
    except Exception:  # no torch yet, or one that fails to import
        import getpass
        import tempfile

        try:
            user = getpass.getuser()
        except Exception:  # a container without a user entry
            user = "unknown"
        safe_user = re.sub(r'[\\/:*?"<>|]', "_", user)
        return Path(tempfile.gettempdir()) / f"torchinductor_{safe_user}" / "precompiled_headers"


def precompiled_headers(folder: Path | None = None) -> list[Path]:
    """Return the precompiled C++ header files under ``folder`` (default ``precompiled_header_dir()``):
    GCC names them ``.gch``, clang and Apple's compilers ``.pch``. Empty when the folder does not exist."""
    folder = precompiled_header_dir() if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.rglob("*") if f.suffix in (".gch", ".pch") and f.is_file())


def inductor_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return the folder for Inductor's compile cache in this course: ``TORCHINDUCTOR_CACHE_DIR``
    when the learner set it, else ``<user cache>/pytorch2-course/inductor/<cache_tag()>``.

    Inductor's own default is under the temporary directory (``/tmp/torchinductor_<user>``), which
    many Linux systems empty at boot, so a cache warmed the day before a workshop would be gone.
    The course kernel, the notebook runner and the test suite all set the variable from here
    (``compile_cache_env``). Each torch release and Python gets a folder of its own: one folder
    shared by torch 2.14.1 on Python 3.11 and torch 2.11.0 on Python 3.12 crashed the second
    (``malloc(): unaligned tcache chunk detected`` in notebook 11's FlexAttention cell, on the CPU),
    while a folder of its own, cold or warm, did not. So does each CPU profile (``cache_tag``). The
    folder is not created (Inductor creates it on first use).
    """
    environ = os.environ if environ is None else environ
    chosen = (environ.get("TORCHINDUCTOR_CACHE_DIR") or "").strip()
    if chosen:
        return Path(chosen).expanduser().absolute()
    return user_cache_home(environ).joinpath(*INDUCTOR_CACHE_PARTS, cache_tag(environ))


def compile_cache_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the variables that give a child process (a kernel, a test) the course's compile cache:
    ``{"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache_dir(environ))}``."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache_dir(environ))}


def build_dir(create: bool = True) -> Path:
    """Return the folder for build outputs such as traces and exported models (``build/``).

    It is git-ignored; ``COURSE_BUILD_DIR`` moves it.
    """
    path = _dir_from_env("COURSE_BUILD_DIR", REPO_ROOT / "build")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def results_path() -> Path | None:
    """Return the results file named by ``COURSE_RESULTS``, or None when unset."""
    raw = os.environ.get("COURSE_RESULTS", "").strip()
    return Path(raw).expanduser().resolve() if raw else None


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables inside a with-block and put the previous values back afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def child_pythonpath(*first: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str:
    """Return the ``PYTHONPATH`` of a Python child process that must import this ``course_utils``.

    The folders ``first`` (say, ``tools/offline``), then ``REPO_ROOT``, then the entries that
    ``environ`` (default ``os.environ``) already has; each folder once, empty entries dropped.
    Every module that starts Python children (servers, notebook kernels) builds it here.
    """
    own = [str(os.fspath(folder)) for folder in first]
    if any(os.pathsep in folder for folder in own):
        raise ValueError(f"a folder for PYTHONPATH cannot contain {os.pathsep!r}: {own}")
    environ = os.environ if environ is None else environ
    inherited = str(environ.get("PYTHONPATH") or "").split(os.pathsep)
    paths: list[str] = []
    for entry in [*own, str(REPO_ROOT), *inherited]:
        if entry and entry not in paths:
            paths.append(entry)
    return os.pathsep.join(paths)
