"""``python -m course_utils doctor`` from a Python with nothing installed, as on a fresh laptop before
``make setup``: a report and a verdict, never a traceback.

``-S`` starts this interpreter without site-packages (no torch, no packaging, no Jupyter); the
standard library is all it has. A Python below the course's floor is tried too where one is installed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import config

ROOT = config.REPO_ROOT

#: What the doctor path may import: the standard library and the course's own package.
ONLY_THE_STDLIB = """
import sys
from course_utils.kit import cli
status = cli.main(sys.argv[1:])
outside = sorted({name.split(".")[0] for name in sys.modules} - set(sys.stdlib_module_names)
                 - {"course_utils", "__main__"})
print("third-party modules:", outside)
sys.exit(status)
"""


def bare_env() -> dict[str, str]:
    """Return this environment without the variables that would give a child Python more packages."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def doctor(python: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``python -S -m course_utils doctor args`` in ``cwd`` (its ``course_utils`` is the one run)."""
    return subprocess.run([python, "-S", "-m", "course_utils", "doctor", *args], capture_output=True, text=True,
                          cwd=cwd, env=bare_env(), timeout=300)


def assert_report_not_traceback(out: subprocess.CompletedProcess[str]) -> list[str]:
    """Assert the run printed a report with a failing verdict and no traceback; return its FAIL lines."""
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text, text
    assert re.search(r"\b\d+ problems? found; fix the FAIL lines above", out.stdout), text
    return [line for line in out.stdout.splitlines() if line.startswith("FAIL")]


def test_torch_missing_is_reported_not_raised():
    probe = subprocess.run([sys.executable, "-S", "-c", "import torch"], capture_output=True, env=bare_env())
    assert probe.returncode != 0, "-S still finds torch here; this test would prove nothing"
    fails = assert_report_not_traceback(doctor(sys.executable))
    assert any("make setup" in line for line in fails), fails
    assert any(line.startswith("FAIL  torch checks: device, cpu, torch.compile and data files not checked")
               for line in fails), fails
    assert any(line.startswith("FAIL  packages: none of the course's") for line in fails), fails


def test_the_doctor_path_imports_only_the_standard_library():
    out = subprocess.run([sys.executable, "-S", "-c", ONLY_THE_STDLIB, "doctor", "--fast"], capture_output=True,
                         text=True, cwd=ROOT, env=bare_env(), timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "third-party modules: []" in out.stdout, out.stdout


def test_a_fresh_clone_is_told_to_run_make_setup(tmp_path):
    """A checkout without .venv (the package and pyproject copied): set-up is the fix, and this Python can make it."""
    shutil.copytree(ROOT / "course_utils", tmp_path / "course_utils", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    out = doctor(sys.executable, cwd=tmp_path)
    fails = assert_report_not_traceback(out)
    assert "ok    python environment: no .venv yet; `make setup` makes one" in out.stdout, out.stdout
    (packages,) = [line for line in fails if line.startswith("FAIL  packages:")]
    assert "Fix: run `make setup`" in packages
    assert "disk (checkout): " in out.stdout and str(tmp_path) in out.stdout


def older_pythons() -> list[str]:
    """Return interpreters below the course's 3.11 floor found on this machine (PATH, then pyenv)."""
    found = [shutil.which(f"python3.{minor}") for minor in range(7, 11)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[0-9]*/bin/python3")))
    older = {}
    for exe in filter(None, found):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info < (3, 11), sys.version_info >= (3, 7))"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.split() == ["True", "True"]:
            older.setdefault(os.path.realpath(exe), exe)
    return list(older.values())


def test_a_python_below_the_floor_gets_the_python_line_first():
    pythons = older_pythons()
    if not pythons:
        pytest.skip("no Python between 3.7 and 3.10 on this machine")
    for python in pythons:
        out = doctor(python, "--fast")
        fails = assert_report_not_traceback(out)
        assert fails and fails[0].startswith("FAIL  python: Python 3."), (python, out.stdout)
        assert "is too old" in fails[0] and "make clean setup PYTHON=python3.11" in fails[0]
        assert "the first one (python) first" in out.stdout
