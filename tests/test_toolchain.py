"""The course's one answer to "which C++ compiler?" (course_utils.toolchain)."""

import os
import shutil

import pytest

from course_utils import toolchain


def test_toolchain_found_and_working_here():
    tc = toolchain.check_toolchain()
    assert tc.works, tc.detail


def test_toolchain_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    tc = toolchain.check_toolchain()
    assert not tc.works and tc.compiler is None
    assert "no C++ compiler" in tc.detail


def test_toolchain_broken_compiler(monkeypatch, tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake-cxx: cannot compile' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    tc = toolchain.check_toolchain()
    assert not tc.works and "cannot compile" in tc.detail


def test_cxx_command_splits_cxx_and_looks_programs_up_on_the_given_path(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ here")
    path = os.environ["PATH"]
    assert toolchain.cxx_command({"CXX": "g++ -O2", "PATH": path}) == [gxx, "-O2"]
    with pytest.raises(toolchain.CompilerNotFound, match="no C.. compiler on PATH"):
        toolchain.cxx_command({"PATH": str(tmp_path)})
    with pytest.raises(toolchain.CompilerNotFound, match="names g.., not found"):
        toolchain.cxx_command({"CXX": "g++", "PATH": str(tmp_path)})  # no silent fallback: Inductor would fail too
    assert toolchain.split_launcher(["/opt/bin/sccache", "distcc", "clang++", "-m64"]) == (
        ["/opt/bin/sccache", "distcc"], "clang++", ["-m64"])


def test_the_course_standard_is_the_one_its_cpp_and_inductor_ask_for():
    """``toolchain.CXX_STANDARD`` (the doctor's probe) is what cpp/*/CMakeLists.txt set, and no older than
    the ``-std=`` that the installed torch's Inductor passes for its CPU code."""
    import re

    from torch._inductor import cpp_builder

    from course_utils.config import REPO_ROOT

    number = int(toolchain.CXX_STANDARD.removeprefix("c++"))
    lists = sorted((REPO_ROOT / "cpp").glob("*/CMakeLists.txt"))
    assert lists
    for path in lists:
        assert re.findall(r"set\(CMAKE_CXX_STANDARD (\d+)\)", path.read_text()) == [str(number)], path
    (flag,) = cpp_builder._get_cpp_std_cflag()  # private; the test moves with it if torch renames it
    assert number >= int(re.search(r"c\+\+(\d+)", flag).group(1)), flag
