import os
import shutil

import pytest
import torch

from course_utils.kit import env


def test_report_lists_versions_hardware_and_toolchain():
    rows = env.report()
    for key in ("python", "torch", "torchvision", "torchaudio", "onnx", "onnxruntime", "cpu",
                "cores", "torch threads", "cuda", "inductor c++"):
        assert key in rows, key
    assert rows["torch"] == env.package_version("torch")
    assert rows["torch threads"] == str(torch.get_num_threads())
    assert rows["cuda"] == "none" or "sm_" in rows["cuda"]


def test_format_report_has_one_line_per_row():
    rows = {"a": "1", "longer key": "2"}
    text = env.format_report(rows)
    assert text.splitlines() == ["a           1", "longer key  2"]


def test_summary_is_one_line_with_torch_version():
    line = env.summary()
    assert "\n" not in line
    assert torch.__version__ in line and "mode:" in line


def test_package_version_of_missing_package_is_none():
    assert env.package_version("no-such-package-for-the-course") is None


def test_toolchain_found_and_working_here():
    tc = env.check_toolchain()
    assert tc.works, tc.detail


def test_toolchain_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    tc = env.check_toolchain()
    assert not tc.works and tc.compiler is None
    assert "no C++ compiler" in tc.detail


def test_toolchain_broken_compiler(monkeypatch, tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake-cxx: cannot compile' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    tc = env.check_toolchain()
    assert not tc.works and "cannot compile" in tc.detail


def test_cxx_command_splits_cxx_and_looks_programs_up_on_the_given_path(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ here")
    path = os.environ["PATH"]
    assert env.cxx_command({"CXX": "g++ -O2", "PATH": path}) == [gxx, "-O2"]
    with pytest.raises(env.CompilerNotFound, match="no C.. compiler on PATH"):
        env.cxx_command({"PATH": str(tmp_path)})
    with pytest.raises(env.CompilerNotFound, match="names g.., not found"):
        env.cxx_command({"CXX": "g++", "PATH": str(tmp_path)})  # no silent fallback: Inductor would fail too
    assert env.split_launcher(["/opt/bin/sccache", "distcc", "clang++", "-m64"]) == (
        ["/opt/bin/sccache", "distcc"], "clang++", ["-m64"])
