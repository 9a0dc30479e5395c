"""The doctor's checks of the machine around Python (course_utils.kit.host_checks) and its own
robustness (a check that breaks, torch or packaging missing): each failure simulated, each with a fix."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_utils import config, toolchain
from course_utils.kit import doctor, host_checks, lab
from course_utils.kit.check import Check


def fake_program(folder: Path, name: str, script: str) -> Path:
    """Write an executable shell script ``folder/name`` and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


# ---- CMake ---------------------------------------------------------------------------------------

def test_missing_cmake_warns_and_says_what_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    check = host_checks.check_cmake()
    assert check.ok and check.warning, check
    line = check.line()
    assert line.startswith("WARN  cmake: not found on PATH") and "notebook 06 skips its C++ programs" in line
    assert "Fix: install CMake 3.18+" in line and "sudo apt install cmake" in line


def test_cmake_version_is_read_and_an_old_one_warns(monkeypatch, tmp_path):
    fake_program(tmp_path, "cmake", 'echo "cmake version 3.16.3"\necho\necho "CMake suite maintained by Kitware"\n')
    monkeypatch.setenv("PATH", str(tmp_path))
    check = host_checks.check_cmake()
    assert check.warning and "is CMake 3.16.3, older than 3.18" in check.detail, check
    fake_program(tmp_path, "cmake", 'echo "cmake version 3.28.0-rc2"\n')
    check = host_checks.check_cmake()
    assert check.ok and not check.warning and check.detail.startswith("CMake 3.28.0 ("), check
    fake_program(tmp_path, "cmake", "echo 'something else'\n")
    assert "does not report a version" in host_checks.check_cmake().detail


def test_cmake_here():
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed here")
    check = host_checks.check_cmake()
    assert check.ok and not check.warning, check.line()


# ---- the C++ standard ----------------------------------------------------------------------------

def test_cxx20_compiles_here():
    if shutil.which("g++") is None and shutil.which("clang++") is None:
        pytest.skip("no C++ compiler here")
    check = host_checks.check_cxx_standard()
    assert check.ok and "C++20" in check.detail, check.line()


def test_compiler_without_cxx20_fails_and_says_it_has_cxx17(monkeypatch, tmp_path):
    # An old compiler: it knows -std=c++17 and refuses -std=c++20 (GCC 9 did).
    cxx = fake_program(tmp_path, "old-g++", 'case "$*" in *-std=c++20*) echo "old-g++: error: unrecognized '
                                            "command-line option '-std=c++20'\" >&2; exit 1;; esac\nexit 0\n")
    monkeypatch.setenv("CXX", str(cxx))
    check = host_checks.check_cxx_standard()
    assert not check.ok
    line = check.line()
    assert line.startswith("FAIL  c++ standard:") and "-std=c++20" in line and "it compiles C++17" in line
    assert "GCC 10+ or Clang 10+" in line and "backend='eager'" in line


def test_the_cxx20_probe_needs_cxx20_features_not_only_the_flag(monkeypatch, tmp_path):
    """A compiler that takes the flag but compiles as C++17 still fails: the probe uses concepts."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ here")
    args = '"$@"'
    cxx = fake_program(tmp_path, "cxx17-only",
                       f'for a in {args}; do shift; case "$a" in -std=c++20) set -- "$@" -std=c++17;; '
                       f'*) set -- "$@" "$a";; esac; done\nexec {gxx} {args}\n')
    monkeypatch.setenv("CXX", str(cxx))
    tc = toolchain.check_cxx_standard("c++20")
    assert not tc.works and "small C++20 file" in tc.detail, tc
    assert toolchain.check_cxx_standard("c++17").works
    with pytest.raises(ValueError, match="no probe for C.. standard 'c..98'"):
        toolchain.check_cxx_standard("c++98")


def test_no_cxx_standard_line_without_a_compiler(monkeypatch, tmp_path):
    """One missing compiler is one FAIL line (c++ compiler), not a second one for its standard."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    names = [c.name for c in doctor.run_checks(compile_probe=False)]
    assert "c++ compiler" in names and "c++ standard" not in names


# ---- the Jupyter kernel --------------------------------------------------------------------------

def write_spec(folder: Path, argv: list[str] | str) -> Path:
    """Write a kernelspec for the course kernel under ``folder`` (a ``kernels`` folder)."""
    spec = folder / lab.KERNEL_NAME / "kernel.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(argv if isinstance(argv, str) else json.dumps({"argv": argv, "language": "python"}))
    return spec


def test_kernel_pointing_at_a_missing_interpreter_warns(tmp_path):
    spec = write_spec(tmp_path / "kernels", [str(tmp_path / "gone" / ".venv" / "bin" / "python"), "-m", "ipykernel"])
    check = host_checks.check_kernel(dirs=[tmp_path / "kernels"], environment=tmp_path / "env")
    assert check.ok and check.warning, check
    line = check.line()
    assert line.startswith("WARN  jupyter kernel: pytorch2-course") and str(spec) in line
    assert "which does not exist" in line and "Fix: run `make kernel`" in line


def test_kernel_of_another_environment_or_none_warns(tmp_path):
    write_spec(tmp_path / "kernels", [sys.executable, "-m", "ipykernel_launcher"])
    check = host_checks.check_kernel(dirs=[tmp_path / "kernels"], environment=tmp_path / "other-checkout" / ".venv")
    assert check.warning and "which is not in" in check.detail and "another environment" in check.detail
    check = host_checks.check_kernel(dirs=[tmp_path / "nothing-here"], environment=tmp_path)
    assert check.warning and "is not registered" in check.detail and "nothing-here" in check.detail
    broken = tmp_path / "broken"
    write_spec(broken, "{not json")
    check = host_checks.check_kernel(dirs=[broken], environment=tmp_path)
    assert check.warning and "cannot be read as a kernel spec" in check.detail


def test_the_kernel_lab_installs_passes_the_check(tmp_path):
    """The kernel ``make kernel`` registers (this Python) is the one the check accepts; the first folder wins."""
    pytest.importorskip("ipykernel")
    folder = lab.install_kernel(prefix=str(tmp_path / "prefix"))
    later = tmp_path / "later"
    write_spec(later, [str(tmp_path / "missing-python")])
    dirs = [folder.parent, later]
    check = host_checks.check_kernel(dirs=dirs, environment=Path(sys.prefix))
    assert check.ok and not check.warning and sys.executable in check.detail, check.line()
    assert host_checks.find_kernelspec(dirs=dirs) == folder / "kernel.json"


def test_kernel_dirs_with_and_without_jupyter_agree(monkeypatch, tmp_path):
    """The folders are Jupyter's own when it is installed; the written-out rule gives the same ones."""
    paths = pytest.importorskip("jupyter_core.paths")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "first"))
    with_jupyter = host_checks.kernel_dirs()
    assert with_jupyter[0] == tmp_path / "first" / "kernels"
    monkeypatch.setitem(sys.modules, "jupyter_core.paths", None)  # as in a Python without Jupyter
    without = host_checks.kernel_dirs(environment=Path(sys.prefix))
    assert without[0] == tmp_path / "first" / "kernels"
    assert Path(paths.jupyter_data_dir()) / "kernels" in without
    assert without == with_jupyter
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "0")
    monkeypatch.delitem(sys.modules, "jupyter_core.paths")
    with_jupyter = host_checks.kernel_dirs()
    monkeypatch.setitem(sys.modules, "jupyter_core.paths", None)
    assert host_checks.kernel_dirs(environment=Path(sys.prefix)) == with_jupyter


def test_course_environment_is_the_running_one_or_the_checkout_venv(monkeypatch):
    assert host_checks.course_environment() == Path(sys.prefix)  # the tests run in an environment
    monkeypatch.setattr(host_checks, "running_environment", lambda: None)
    assert host_checks.course_environment() == config.REPO_ROOT / ".venv"


# ---- loopback ------------------------------------------------------------------------------------

def test_loopback_works_here():
    check = host_checks.check_loopback()
    assert check.ok, check.line()


def test_loopback_refused_fails_with_a_fix(monkeypatch):
    def refuse(address, timeout=None):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(host_checks.socket, "create_connection", refuse)
    check = host_checks.check_loopback()
    assert not check.ok
    line = check.line()
    assert line.startswith("FAIL  loopback: cannot connect to a socket on 127.0.0.1") and "Connection refused" in line
    assert "notebook 12's torchrun jobs" in line and "ip link set lo up" in line


def test_loopback_down_in_an_empty_network_namespace():
    """For real: a new network namespace starts with loopback down."""
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        pytest.skip("needs Linux's unshare")
    code = "from course_utils.kit import host_checks; print(host_checks.check_loopback(timeout_s=2).line())"
    out = subprocess.run([unshare, "-rn", sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=config.REPO_ROOT, env={**os.environ, "PYTHONPATH": config.child_pythonpath()}, timeout=120)
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"unshare -rn refused here: {out.stderr.strip()}")
    assert out.stdout.startswith("FAIL  loopback:"), out.stdout + out.stderr


# ---- disk space ----------------------------------------------------------------------------------

Usage = collections.namedtuple("Usage", "total used free")


def test_low_disk_space_warns_for_checkout_and_compile_cache(monkeypatch, tmp_path):
    seen = []

    def usage(path):
        seen.append(Path(path))
        return Usage(100 * 2**30, 99 * 2**30, 2**30)

    monkeypatch.setattr(host_checks.shutil, "disk_usage", usage)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "not" / "made" / "yet"))
    checkout, cache, tmp = host_checks.check_disk_space()
    for check in (checkout, cache, tmp):
        assert check.ok and check.warning, check
        assert "only 1.0 GiB free" in check.detail and "below 3 GiB" in check.detail and "full disk" in check.detail
    assert checkout.name == "disk (checkout)" and str(config.REPO_ROOT) in checkout.detail
    assert cache.name == "disk (compile cache)" and "TORCHINDUCTOR_CACHE_DIR" in cache.fix
    assert seen[1] == tmp_path, "a cache folder not made yet is measured on the disk that will hold it"
    assert tmp.name == "disk (temporary directory)" and "TMPDIR" in tmp.fix and "precompiled" in tmp.fix


def test_enough_disk_space_passes_and_a_missing_venv_needs_more(monkeypatch, tmp_path):
    monkeypatch.setattr(host_checks.shutil, "disk_usage", lambda path: Usage(100 * 2**30, 95 * 2**30, 5 * 2**30))
    assert all(c.ok and not c.warning for c in host_checks.check_disk_space())
    # A fresh clone: no environment yet, so `make setup` will install .venv on the checkout's disk.
    monkeypatch.setattr(host_checks, "running_environment", lambda: None)
    monkeypatch.setattr(host_checks, "checkout_venv", lambda: tmp_path / ".venv")
    checkout, cache, tmp = host_checks.check_disk_space()
    assert checkout.warning and "`make setup` installs about 7 GiB into .venv" in checkout.detail, checkout
    assert cache.ok and not cache.warning and tmp.ok and not tmp.warning


def test_the_temporary_directory_check_reports_the_precompiled_headers(monkeypatch, tmp_path):
    headers = tmp_path / "torchinductor_me" / "precompiled_headers"
    headers.mkdir(parents=True)
    (headers / "abc.h.gch").write_bytes(b"x" * 2_500_000)
    monkeypatch.setattr(host_checks.config, "precompiled_header_dir", lambda: headers)
    monkeypatch.setattr(host_checks.shutil, "disk_usage", lambda path: Usage(100 * 2**30, 95 * 2**30, 5 * 2**30))
    tmp = host_checks.check_disk_space()[2]
    assert tmp.ok and "precompiled headers there: 2 MB" in tmp.detail, tmp
    assert host_checks.folder_mb(tmp_path / "missing") == 0.0


# ---- the doctor around the checks ----------------------------------------------------------------

def test_a_check_that_breaks_is_a_fail_line(monkeypatch):
    def needs_a_package():
        import no_such_module_for_the_course  # noqa: F401

    def breaks():
        raise RuntimeError("boom")

    (missing,) = doctor._guarded("data files", needs_a_package)
    assert not missing.ok and "needs no_such_module_for_the_course, which is not installed" in missing.detail
    assert "make setup" in missing.fix
    (broken,) = doctor._guarded("loopback", breaks)
    assert not broken.ok and "the check itself failed (RuntimeError: boom)" in broken.detail
    monkeypatch.setattr(host_checks, "check_loopback", breaks)
    assert any(c.name == "loopback" and not c.ok for c in doctor.run_checks(compile_probe=False))


def test_without_torch_the_torch_checks_are_one_fail_line(monkeypatch):
    monkeypatch.setattr(doctor, "check_packages", lambda: [Check("torch", False, "not installed", doctor.INSTALL_HINT),
                                                           Check("numpy", True, "2.4")])

    def must_not_run():
        raise AssertionError("a torch check ran without torch")

    for name in ("check_device", "check_cpu", "check_inductor", "check_data"):
        monkeypatch.setattr(doctor, name, must_not_run)
    checks = doctor.run_checks()
    names = [c.name for c in checks]
    assert not {"device", "cpu", "torch.compile", "data files"} & set(names)
    (torch_checks,) = [c for c in checks if c.name == "torch checks"]
    assert not torch_checks.ok and "torch not installed" in torch_checks.detail and "make setup" in torch_checks.fix


def test_packages_are_listed_without_packaging(monkeypatch):
    monkeypatch.setitem(sys.modules, "packaging.requirements", None)  # as in a Python without it
    found, missing = doctor.check_packages(["pytest>=1", "no-such-package-for-the-course[extra]>=1"])
    assert found.ok and found.name == "pytest" and "range not checked" in found.detail
    assert not missing.ok and missing.name == "no-such-package-for-the-course" and missing.detail == "not installed"
    (one,) = doctor.summarise_packages([missing, missing])
    assert one.name == "packages" and "none of the course's 2 packages is installed" in one.detail
    assert doctor.summarise_packages([found, missing]) == [found, missing]


def test_pyproject_is_read_the_same_without_tomllib():
    text = (config.REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert doctor._declared_in_pyproject(text) == tomllib.loads(text)["project"]["dependencies"]


def test_environment_check_names_what_make_setup_cannot_fix(monkeypatch, tmp_path):
    assert doctor.check_environment(packages_ok=True).ok  # the tests run in an environment
    monkeypatch.setattr(host_checks, "running_environment", lambda: None)
    monkeypatch.setattr(host_checks, "checkout_venv", lambda: tmp_path / ".venv")
    fake_program(tmp_path / ".venv" / "bin", "python", "exit 0\n")
    outside = doctor.check_environment(packages_ok=False)
    assert not outside.ok and "outside the course's" in outside.detail and "`make doctor`" in outside.fix
    assert "`make doctor`" in doctor.install_hint()
    shutil.rmtree(tmp_path / ".venv")
    assert doctor.check_environment(packages_ok=False).ok  # no .venv yet: make setup makes it
    monkeypatch.setattr(doctor, "has_module", lambda name: name != "ensurepip")
    no_venv = doctor.check_environment(packages_ok=False)
    assert not no_venv.ok and "cannot make one: it has no ensurepip module" in no_venv.detail
    assert "sudo apt install python3-venv" in no_venv.fix and doctor.install_hint() == doctor.INSTALL_HINT


def test_a_bad_course_quick_is_a_fail_line_not_a_traceback(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_QUICK", "ture")
    assert not doctor.check_mode().ok
    assert doctor.main([], runner=lambda compile_probe: [doctor.check_mode()]) == 1
    assert "FAIL  course mode: COURSE_QUICK='ture' is not understood" in capsys.readouterr().out


def test_warnings_keep_the_exit_status_zero_and_are_counted(capsys):
    checks = [Check("python", True, "Python 3.11"), Check.warn("cmake", "not found on PATH", "install it")]
    assert doctor.main([], runner=lambda compile_probe: checks) == 0
    out = capsys.readouterr().out
    assert "WARN  cmake: not found on PATH. Fix: install it" in out
    assert "All 2 checks passed" in out and "1 warning:" in out
    failing = [Check("python", False, "Python 3.10.13 is too old", "install 3.11"), *checks]
    assert doctor.main([], runner=lambda compile_probe: failing) == 1
    assert "1 problem found; fix the FAIL lines above, the first one (python) first" in capsys.readouterr().out


def test_fast_skips_only_the_compile_probe(monkeypatch):
    ran = []
    monkeypatch.setattr(doctor, "check_inductor", lambda: ran.append("compile") or Check("torch.compile", True, "ok"))
    fast = [c.name for c in doctor.run_checks(compile_probe=False)]
    assert not ran
    for name in ("c++ standard", "cmake", "jupyter kernel", "loopback", "disk (checkout)", "disk (compile cache)"):
        assert name in fast
    full = [c.name for c in doctor.run_checks(compile_probe=True)]
    assert ran == ["compile"] and [n for n in full if n != "torch.compile"] == fast


def test_the_precompiled_header_folder_is_found_without_torch(monkeypatch):
    """Before `make setup` there is no torch: the doctor applies torch 2.14's rule itself."""
    import sys
    import tempfile

    with_torch = config.precompiled_header_dir()
    monkeypatch.setitem(sys.modules, "torch._inductor.runtime.cache_dir_utils", None)  # import now fails
    without = config.precompiled_header_dir()
    assert without.name == "precompiled_headers" and without.parent.parent == Path(tempfile.gettempdir())
    assert without == with_torch, "the fallback must name the folder torch itself uses"
