"""README's conda route, the one that needs no admin rights: environment.yml brings every tool
README's system prerequisites name, CI builds it, and the course kernel knows where it runs."""

from __future__ import annotations

import re

import pytest

from course_utils import config
from course_utils.kit import lab

yaml = pytest.importorskip("yaml", reason="PyYAML (installed with transformers) reads the YAML files")

ROOT = config.REPO_ROOT


@pytest.fixture(scope="module")
def conda_deps() -> dict[str, str]:
    """Return {package: version spec} of environment.yml's conda (not pip) dependencies."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", dep).groups()
            deps[name] = spec
    return deps


def test_the_environment_brings_the_system_prerequisites(conda_deps):
    floor = re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert conda_deps["python"] == f"={floor}", "environment.yml's Python should be pyproject's floor (the tested one)"
    assert "cxx-compiler" in conda_deps, "Inductor builds C++ on the CPU"
    assert "make" in conda_deps, "the course's make targets and CMake's default generator"
    cmake_min = {re.search(r"cmake_minimum_required\(VERSION (\d+\.\d+)", p.read_text()).group(1)
                 for p in (ROOT / "cpp").glob("*/CMakeLists.txt")}
    assert conda_deps.get("cmake") == f">={max(cmake_min)}", (conda_deps.get("cmake"), cmake_min)
    readme = (ROOT / "README.md").read_text()
    assert "C++ compiler" in readme and "CMake 3.18+" in readme  # what the prerequisites name


def test_ci_builds_the_conda_environment_and_runs_the_doctor_and_unit_tests():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    job = flow["jobs"]["conda"]
    uses = {step.get("uses", "").split("@")[0]: step for step in job["steps"]}
    setup = uses["conda-incubator/setup-miniconda"]["with"]
    assert setup["environment-file"] == "environment.yml" and setup["activate-environment"] == "pytorch2-course"
    assert job["defaults"]["run"]["shell"].startswith("bash -el"), "only a login shell sees the activated environment"
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert runs.index("course_utils.kit.lab") < runs.index("course_utils doctor") < runs.index("pytest tests")
    assert "cmake --version" in runs
    assert job["if"] == flow["jobs"]["cpu"]["if"], "the conda job runs when the cpu jobs do"


def test_readme_conda_route_registers_the_course_kernel():
    section = (ROOT / "README.md").read_text().split("## The conda route", 1)[1].split("\n## ", 1)[0]
    assert "conda env create -f environment.yml" in section and "python -m course_utils.kit.lab" in section


def test_the_kernel_is_named_after_its_environment(tmp_path):
    assert lab.display_name(tmp_path) == lab.KERNEL_DISPLAY_NAME
    (tmp_path / "conda-meta").mkdir()
    assert lab.display_name(tmp_path) == f"PyTorch 2 course (conda: {tmp_path.name})"
