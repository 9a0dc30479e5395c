"""The doctor's macOS check: OpenMP beside Apple clang (course_utils.kit.host_checks.check_macos_openmp).

No Mac is needed: the platform is passed in, Apple clang is a shell script that answers ``--version`` as
Xcode's does and builds only when it is given an ``omp.h`` folder and ``-lomp``, and Homebrew is a function.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course_utils.kit import doctor, host_checks

APPLE_VERSION = "Apple clang version 16.0.0 (clang-1600.0.26.6)"

#: A stand-in for Xcode's clang++: `--version` like Apple's; a build needs -Xclang -fopenmp, an -I folder
#: holding omp.h, an -L folder holding libomp.dylib and -lomp, as Apple clang with Homebrew's libomp does.
FAKE_APPLE_CLANG = r"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "APPLE_VERSION"; echo "Target: arm64-apple-darwin24.1.0"; exit 0; fi
header=no; lib=no; lomp=no; xclang=no; out=""; prev=""
for a in "$@"; do
  case "$a" in
    -I*) [ -f "${a#-I}/omp.h" ] && header=yes;;
    -L*) [ -f "${a#-L}/libomp.dylib" ] && lib=yes;;
    -lomp) lomp=yes;;
    -fopenmp) [ "$prev" = "-Xclang" ] && xclang=yes;;
  esac
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
if [ $header = no ]; then echo "probe.cpp:1:10: fatal error: 'omp.h' file not found" >&2; exit 1; fi
if [ $xclang = no ]; then echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1; fi
if [ $lib = no ] || [ $lomp = no ]; then echo "ld: library 'omp' not found" >&2; exit 1; fi
: > "$out"
""".replace("APPLE_VERSION", APPLE_VERSION)


def apple_clang(tmp_path: Path) -> dict[str, str]:
    """Write the fake Apple clang and return an environment whose CXX is it (nothing else set)."""
    cxx = tmp_path / "bin" / "clang++"
    cxx.parent.mkdir(parents=True, exist_ok=True)
    cxx.write_text(FAKE_APPLE_CLANG)
    cxx.chmod(0o755)
    return {"CXX": str(cxx), "PATH": str(cxx.parent)}


def libomp(folder: Path, header: bool = True, library: bool = True) -> Path:
    """Make ``folder`` look like an OpenMP install (include/omp.h, lib/libomp.dylib) and return it."""
    (folder / "include").mkdir(parents=True, exist_ok=True)
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    if header:
        (folder / "include" / "omp.h").write_text("int omp_get_max_threads(void);\n")
    if library:
        (folder / "lib" / "libomp.dylib").write_text("")
    return folder


def no_brew() -> None:
    return None


@pytest.fixture(autouse=True)
def no_homebrew_folders(monkeypatch, tmp_path):
    """This machine's real /opt/homebrew (if any) must not leak into the decisions."""
    monkeypatch.setattr(host_checks, "HOMEBREW_LIBOMP", (tmp_path / "nowhere" / "libomp",))


@pytest.mark.parametrize("platform", ["linux", "win32", "freebsd14"])
def test_not_applicable_off_macos(platform, tmp_path):
    assert host_checks.check_macos_openmp(platform=platform, environ=apple_clang(tmp_path), brew_prefix=no_brew) == []


def test_no_line_on_this_linux_machine():
    if not host_checks.sys.platform.startswith("linux"):
        pytest.skip("the course machine is Linux")
    assert host_checks.check_macos_openmp() == []
    assert "openmp" not in [c.name for c in doctor.run_checks(compile_probe=False)]


def test_apple_clang_without_openmp_fails_before_torch_compile_does(tmp_path):
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=apple_clang(tmp_path), brew_prefix=no_brew)
    assert not check.ok
    line = check.line()
    assert line.startswith("FAIL  openmp: ") and APPLE_VERSION in line and "has no OpenMP runtime of its own" in line
    assert "no OMP_PREFIX, no conda environment, no `brew` on PATH" in line
    assert "'omp.h' file not found" in line
    assert "Fix: `brew install libomp`" in line and "llvm-openmp" in line and "OMP_PREFIX" in line
    assert "backend='eager'" in line


def test_homebrew_libomp_is_found_and_the_probe_builds(tmp_path):
    brew = libomp(tmp_path / "homebrew" / "opt" / "libomp")
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=apple_clang(tmp_path), brew_prefix=lambda: brew)
    assert check.ok and not check.warning, check.line()
    assert f"with OpenMP from Homebrew's libomp ({brew})" in check.detail
    assert check.detail.endswith("a small OpenMP library builds")


def test_brew_names_a_libomp_that_is_not_installed(tmp_path):
    missing = tmp_path / "homebrew" / "opt" / "libomp"  # `brew --prefix libomp` names it even when absent
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=apple_clang(tmp_path),
                                              brew_prefix=lambda: missing)
    assert not check.ok and f"Homebrew's libomp: {missing} has no include/omp.h" in check.detail
    assert "`brew install libomp`" in check.fix


def test_omp_prefix_then_conda_then_homebrew(tmp_path):
    """The order torch.compile looks in: OMP_PREFIX first, a bad one skipped; then the conda environment."""
    env = apple_clang(tmp_path)
    conda = libomp(tmp_path / "conda-env")
    brew = libomp(tmp_path / "homebrew" / "opt" / "libomp")
    env.update(OMP_PREFIX=str(tmp_path / "not-openmp"), CONDA_PREFIX=str(conda))
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=env, brew_prefix=lambda: brew)
    assert check.ok and f"OpenMP from the conda environment ({conda})" in check.detail, check.line()
    prefix = libomp(tmp_path / "my-openmp")
    env["OMP_PREFIX"] = str(prefix)
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=env, brew_prefix=lambda: brew)
    assert check.ok and f"OpenMP from OMP_PREFIX ({prefix})" in check.detail
    assert [where for where, _ in host_checks.openmp_candidates(env, brew)] == [
        "OMP_PREFIX", "the conda environment", "Homebrew's libomp"]


def test_a_header_without_the_library_fails_the_probe(tmp_path):
    half = libomp(tmp_path / "half", library=False)
    env = {**apple_clang(tmp_path), "OMP_PREFIX": str(half)}
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=env, brew_prefix=no_brew)
    assert not check.ok and "a small OpenMP library does not build" in check.detail
    assert "library 'omp' not found" in check.detail and "`brew install libomp`" in check.fix
    (unprobed,) = host_checks.check_macos_openmp(platform="darwin", environ=env, brew_prefix=no_brew, probe=False)
    assert unprobed.ok  # the header alone is what the decision sees; only the probe finds the missing library


def test_libomp_installed_but_brew_not_on_path(monkeypatch, tmp_path):
    hidden = libomp(tmp_path / "opt" / "homebrew" / "opt" / "libomp")
    monkeypatch.setattr(host_checks, "HOMEBREW_LIBOMP", (hidden,))
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ=apple_clang(tmp_path), brew_prefix=no_brew)
    assert not check.ok and f"libomp is installed at {hidden}" in check.fix
    assert f"OMP_PREFIX={hidden}" in check.fix and str(tmp_path / "opt" / "homebrew" / "bin" / "brew") in check.fix


def test_another_compiler_brings_its_own_openmp(tmp_path):
    """CXX set to a compiler that is not Apple clang: no libomp needed; a real g++ builds the probe."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ here")
    (check,) = host_checks.check_macos_openmp(platform="darwin", environ={"CXX": gxx, "PATH": str(Path(gxx).parent)},
                                              brew_prefix=no_brew)
    assert check.ok, check.line()
    assert "is not Apple clang" in check.detail and "a small OpenMP library builds" in check.detail


def test_no_compiler_is_the_compiler_checks_failure_not_this_ones(tmp_path):
    env = {"PATH": str(tmp_path)}
    assert host_checks.check_macos_openmp(platform="darwin", environ=env, brew_prefix=no_brew) == []


def test_flags_follow_the_compiler():
    assert host_checks.openmp_flags(False, None)[-1] == "-fopenmp"
    flags = host_checks.openmp_flags(True, Path("/opt/homebrew/opt/libomp"))
    assert flags[2:4] == ["-Xclang", "-fopenmp"] and "-I/opt/homebrew/opt/libomp/include" in flags
    assert "-L/opt/homebrew/opt/libomp/lib" in flags and flags[-1] == "-lomp"


def test_apple_compilers_are_recognised():
    for line in (APPLE_VERSION, "Apple LLVM version 10.0.0 (clang-1000.10.44.4)"):
        assert host_checks.APPLE_CLANG.search(line), line
    for line in ("Homebrew clang version 19.1.7", "g++-14 (Homebrew GCC 14.2.0_1) 14.2.0", "clang version 18.1.8"):
        assert not host_checks.APPLE_CLANG.search(line), line
