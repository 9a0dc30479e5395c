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
#: The C++ standard the course's C++ is compiled as: torch 2.14's Inductor passes ``-std=c++20`` for
#: its CPU code, and its headers need C++20 (``cpp/*/CMakeLists.txt`` set ``CMAKE_CXX_STANDARD 20``).
CXX_STANDARD = "c++20"
#: Small programs that use features a compiler gets with each standard (``check_cxx_standard``).
STANDARD_PROBES = {
    "c++17": (
        "#include <optional>\n#include <string_view>\n#include <tuple>\n"
        "template <typename T> constexpr int width() { if constexpr (sizeof(T) > 4) return 8; else return 4; }\n"
        "int course_probe() {\n"
        "  auto [a, b] = std::tuple<int, int>{1, 2};\n"
        '  std::optional<std::string_view> name{"probe"};\n'
        "  return a + b + width<long long>() + static_cast<int>(name->size());\n"
        "}\n"
    ),
    "c++20": (
        "#include <concepts>\n#include <optional>\n#include <string_view>\n"
        "template <std::integral T> constexpr T twice(T x) { return x * 2; }\n"
        "struct Point { int x; int y; };\n"
        "int course_probe() {\n"
        "  constexpr Point p{.x = 1, .y = 2};\n"
        '  std::optional<std::string_view> name{"probe"};\n'
        "  return twice(p.x + p.y) + static_cast<int>(name->size());\n"
        "}\n"
    ),
}


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


def _compile(words: Sequence[str], source: str, flags: Sequence[str], output: str,
             timeout_s: float) -> str | None:
    """Return why compiling ``source`` (C++ text) with the compiler command ``words`` and ``flags``
    into a file named ``output`` failed, or None when it built (in a temporary folder)."""
    cxx = shlex.join(words)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(source)
        try:
            out = subprocess.run([*words, *flags, str(src), "-o", str(Path(tmp) / output)],
                                 capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{cxx} could not be run: {err}"
    if out.returncode != 0:
        first = (out.stderr or out.stdout).strip().splitlines()[:1]
        return f"{cxx} failed on a trivial file: {' '.join(first)}"
    return None


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
    problem = _compile(words, 'extern "C" int course_probe(int x) { return x + 1; }\n',
                       ["-shared", "-fPIC", "-O1"], "probe.so", timeout_s)
    if problem is not None:
        return Toolchain(cxx, False, problem)
    return Toolchain(cxx, True, f"{cxx} builds shared libraries")


def check_cxx_standard(standard: str = CXX_STANDARD, timeout_s: float = 60.0) -> Toolchain:
    """Return whether ``cxx_command()``'s compiler compiles a small program that uses ``standard``'s
    features with ``-std=<standard>`` (``"c++17"`` or ``"c++20"``, the keys of ``STANDARD_PROBES``).

    A compiler too old for the standard rejects the flag or the features (GCC before 10 has no
    ``-std=c++20``; its library has no ``<concepts>``). Raises ValueError for another standard.
    """
    if standard not in STANDARD_PROBES:
        raise ValueError(f"no probe for C++ standard {standard!r}; choose one of {', '.join(STANDARD_PROBES)}")
    try:
        words = cxx_command()
    except CompilerNotFound as err:
        return Toolchain(None, False, str(err))
    cxx = shlex.join(words)
    problem = _compile(words, STANDARD_PROBES[standard], [f"-std={standard}", "-c"], "probe.o", timeout_s)
    if problem is not None:
        return Toolchain(cxx, False, problem.replace("a trivial file", f"a small {standard.upper()} file"))
    return Toolchain(cxx, True, f"{cxx} compiles {standard.upper()} (-std={standard})")
