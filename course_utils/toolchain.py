"""Which C++ compiler do Inductor and the course's C++ programs use, and does it build?

One answer for the whole course: the doctor checks ``check_toolchain()``, the environment report
prints it, and the CMake builds in ``deploy`` configure with ``cxx_command()``.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Compilers tried in order when ``$CXX`` is not set: Inductor's default first (g++; clang++ on macOS).
DEFAULT_COMPILERS = ("clang++", "g++", "c++") if sys.platform == "darwin" else ("g++", "c++", "clang++")
#: Programs that run a compiler given as their first argument (``CXX="ccache g++"``).
LAUNCHERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})


@dataclass(frozen=True)
class Toolchain:
    """Whether a C++ compiler that Inductor's CPU backend can use was found and works.

    ``compiler`` is the command line (``cxx_command()`` joined), None when none was found.
    """

    compiler: str | None
    works: bool
    detail: str


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
