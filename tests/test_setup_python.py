"""`make setup` with a Python that cannot build the course's .venv: a clear message naming the routes
that need no admin rights, no traceback, and no half-made .venv left behind."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import config

ROOT = config.REPO_ROOT
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def floor() -> str:
    return re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)


def fake_python(folder: Path, sitecustomize: str) -> Path:
    """Return an executable that runs this Python with ``sitecustomize`` run first (at start-up)."""
    site = folder / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(sitecustomize)
    exe = folder / "python3"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def make_setup(python: Path | str, venv: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"VENV={venv}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def assert_no_admin_routes(out: subprocess.CompletedProcess, venv: Path) -> None:
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Traceback" not in text
    assert f"uv python install {floor()}" in text and "environment.yml" in text and "pyenv install" in text, text
    assert not venv.exists(), "a failed check must not leave a .venv for the next make to trust"


def test_a_python_below_the_floor_is_refused_with_the_no_admin_routes(tmp_path):
    exe = fake_python(tmp_path / "fake", "import sys\nsys.version_info = (3, 10, 13, 'final', 0)\n")
    out = make_setup(exe, tmp_path / "venv")
    assert_no_admin_routes(out, tmp_path / "venv")
    assert f"Python 3.10.13) is too old: the course needs Python {floor()} or newer" in out.stderr


def test_a_python_without_ensurepip_is_refused_as_on_debian(tmp_path):
    """Debian and Ubuntu put ensurepip in python3.X-venv; without it `python -m venv` fails half-way."""
    exe = fake_python(tmp_path / "fake", "import sys\nsys.modules['ensurepip'] = None  # as if not installed\n")
    out = make_setup(exe, tmp_path / "venv")
    assert_no_admin_routes(out, tmp_path / "venv")
    own = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "it has no ensurepip module" in out.stderr and f"python{own}-venv" in out.stderr, out.stderr


@pytest.mark.skipif(not sorted(PYENV_VERSIONS.glob("3.10.*")), reason="needs a pyenv Python 3.10 (~/.pyenv/versions)")
def test_a_real_python_3_10_is_refused(tmp_path):
    python = sorted(PYENV_VERSIONS.glob("3.10.*"))[-1] / "bin" / "python"
    out = make_setup(python, tmp_path / "venv")
    assert_no_admin_routes(out, tmp_path / "venv")
    assert "is too old" in out.stderr


def test_a_missing_interpreter_is_named(tmp_path):
    out = make_setup(tmp_path / "no-such-python3", tmp_path / "venv")
    assert out.returncode != 0 and "no Python called" in out.stderr and "uv python install" in out.stderr
    assert f"Python {floor()} or newer" in out.stderr, "the Makefile's message names pyproject's floor"


def test_a_good_python_passes_silently():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_python
    finally:
        sys.path.remove(str(ROOT / "tools"))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check_python.py")], capture_output=True, text=True)
    notes = "".join(line + "\n" for line in check_python.notes(tuple(sys.version_info)))  # 3.13.0 gets one
    assert out.returncode == 0 and out.stdout == "" and out.stderr == notes


def test_the_checks_floor_is_pyprojects():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_python
    finally:
        sys.path.remove(str(ROOT / "tools"))
    found = check_python.floor_from_pyproject(str(ROOT / "pyproject.toml"))
    assert ".".join(map(str, found)) == ".".join(map(str, check_python.DEFAULT_FLOOR)) == floor()


def test_python_3_13_0_gets_a_note_and_the_setup_goes_on():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_python
    finally:
        sys.path.remove(str(ROOT / "tools"))
    (note,) = check_python.notes((3, 13, 0, "final", 0))
    assert "3.13.1" in note and "guards" in note and "uv python install 3.13" in note
    assert check_python.notes((3, 13, 1)) == check_python.notes((3, 11, 7)) == check_python.notes((3, 14, 0)) == []


@pytest.mark.skipif(not (PYENV_VERSIONS / "3.13.0").is_dir(), reason="needs a pyenv Python 3.13.0 (~/.pyenv/versions)")
def test_a_real_python_3_13_0_passes_with_the_note():
    out = subprocess.run([str(PYENV_VERSIONS / "3.13.0" / "bin" / "python"), str(ROOT / "tools" / "check_python.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "" and "Python 3.13.0 works" in out.stderr, out.stderr
