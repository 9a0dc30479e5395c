"""The Python floor the course claims is true: every pinned package installs on it, and all claims agree.

A claimed floor that the pins do not support breaks a learner's install (pip refuses the
pinned numpy, onnxruntime or Jupyter on it); these checks read the installed packages'
``Requires-Python`` metadata, so they fail as soon as a pin or the claim moves apart.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_utils import config
from course_utils.kit import doctor


def claimed_floor() -> str:
    """Return the X.Y of pyproject's ``requires-python = ">=X.Y"``."""
    text = (config.REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'requires-python = ">=(\d+\.\d+)"', text).group(1)


def pins() -> dict[str, str]:
    """Return {distribution: version} from constraints.txt."""
    out = {}
    for line in (config.REPO_ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip()] = version.split(";")[0].strip()
    return out


def test_every_pinned_package_supports_the_claimed_floor():
    floor = Version(claimed_floor() + ".0")
    refused = []
    for name, version in pins().items():
        try:
            meta = importlib.metadata.metadata(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a platform-specific pin not installed here
        if meta["Version"] != version:
            continue  # another environment (make test-min); its own pins are checked there
        requires = meta.get("Requires-Python")
        if requires and floor not in SpecifierSet(requires):
            refused.append(f"{name}=={version} requires Python {requires}")
    assert not refused, f"the course claims Python {claimed_floor()}+, but:\n" + "\n".join(refused)


def test_readme_and_doctor_state_the_same_floor():
    floor = claimed_floor()
    readme = (config.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Python {floor}+" in readme
    assert not re.search(r"Python 3\.(\d+)\+", readme.replace(f"Python {floor}+", "")), "README names another floor"
    assert f"{floor}+" in doctor.check_python.__doc__


def test_the_doctor_warns_on_python_3_13_0_and_passes_others(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 13, 0, "final", 0))
    check = doctor.check_python()
    assert check.ok and check.warning and "3.13.1" in check.detail and "make clean setup" in check.fix
    monkeypatch.setattr(sys, "version_info", (3, 13, 1, "final", 0))
    check = doctor.check_python()
    assert check.ok and not check.warning
