import os
import subprocess
import sys

from course_utils.kit import doctor


def test_all_checks_pass_on_the_course_machine():
    checks = doctor.run_checks(compile_probe=False)
    failed = [c.line() for c in checks if not c.ok]
    assert not failed, failed


def test_missing_package_gives_a_fix_line():
    (check,) = doctor.check_packages(["no-such-package-for-the-course>=1.0"])
    assert not check.ok
    line = check.line()
    assert line.startswith("FAIL  no-such-package-for-the-course: not installed")
    assert "make setup" in line


def test_too_old_package_is_reported():
    (check,) = doctor.check_packages(["pytest>=999.0"])
    assert not check.ok and "older than the course's range >=999.0" in check.detail
    (check,) = doctor.check_packages(["pytest<1"])
    assert not check.ok and "newer than the course's range <1" in check.detail


def test_the_package_list_is_the_course_metadata(tmp_path, monkeypatch):
    """The doctor checks exactly pyproject's core dependencies (not the dev or executorch extras)."""
    import tomllib

    declared = tomllib.loads((doctor.config.REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [r.name for r in doctor.required_packages()]
    assert len(names) == len(declared) and "torch" in names and "fastapi" in names
    assert "pytest" not in names and "executorch" not in names
    # Without a checkout (an installed course), the installed distribution's metadata is the source.
    monkeypatch.setattr(doctor.config, "REPO_ROOT", tmp_path)
    assert {r.name for r in doctor.required_packages()} <= set(names)
    assert "torch" in {r.name for r in doctor.required_packages()}


def test_main_exit_status_reflects_problems(capsys):
    bad = [doctor.Check("c++ compiler", False, "no C++ compiler", "install g++")]
    assert doctor.main([], runner=lambda compile_probe: bad) == 1
    out = capsys.readouterr().out
    assert "FAIL  c++ compiler: no C++ compiler. Fix: install g++" in out
    good = [doctor.Check("python", True, "Python 3.11")]
    assert doctor.main([], runner=lambda compile_probe: good) == 0


def test_doctor_cli_without_a_compiler_exits_non_zero(tmp_path):
    """The real command, with PATH emptied so no C++ compiler can be found."""
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "course_utils", "doctor"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(lines) == 1, out.stdout
    assert "c++ compiler" in lines[0] and "backend='eager'" in lines[0]


def test_inductor_probe_works_here():
    check = doctor.check_inductor()
    assert check.ok, check.line()


def test_readme_states_the_same_torch_floor():
    from course_utils.config import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"torch >= {doctor.TORCH_MIN}" in text, "README and doctor.TORCH_MIN disagree"
