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
