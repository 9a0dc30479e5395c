"""The CI workflow: every claimed Python, the lint and AVX2 jobs, the weekly report check, and a
GPU job that never runs a fork's code on the self-hosted runner."""

from __future__ import annotations

import re

import pytest

from course_utils import config

yaml = pytest.importorskip("yaml", reason="PyYAML (installed with transformers) reads the workflow")

WORKFLOW = config.REPO_ROOT / ".github" / "workflows" / "ci.yml"


@pytest.fixture(scope="module")
def flow() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_no_trigger_hands_secrets_or_the_runner_to_forks(flow):
    assert "pull_request_target" not in flow["on"] and "workflow_run" not in flow["on"]


def test_gpu_job_runs_only_trusted_code(flow):
    condition = " ".join(flow["jobs"]["gpu"]["if"].split())
    assert "self-hosted" in flow["jobs"]["gpu"]["runs-on"]
    assert "github.event_name == 'push' && github.ref == 'refs/heads/main'" in condition
    assert "github.event.pull_request.head.repo.full_name == github.repository" in condition
    assert "contains(github.event.pull_request.labels.*.name, 'run-gpu')" in condition
    # every pull_request branch of the condition carries the same-repository check
    for part in condition.split("||"):
        if "pull_request" in part and "event_name" in part:
            assert "head.repo.full_name == github.repository" in part, part


def test_cpu_matrix_covers_the_claimed_pythons(flow):
    floor = re.search(r'requires-python = ">=(\d+\.\d+)"', (config.REPO_ROOT / "pyproject.toml").read_text()).group(1)
    runs = {(m["python"], m["target"]) for m in flow["jobs"]["cpu"]["strategy"]["matrix"]["include"]}
    assert (floor, "test-min") in runs and ("3.11", "test") in runs
    assert max(tuple(map(int, p.split("."))) for p, _ in runs) >= (3, 13)
    steps = _runs(flow["jobs"]["cpu"])
    assert steps.index("qemu-user chromium") < steps.index("make ${{ matrix.target }}")


def test_lint_avx2_and_weekly_report_jobs(flow):
    jobs = flow["jobs"]
    assert "ruff check course_utils tests tools conftest.py notebooks" in _runs(jobs["lint"])
    assert "make test-avx2" in _runs(jobs["cpu-avx2"])
    report = _runs(jobs["full-report"])
    assert report.index("make report") < report.index("tools/check_report.py")
    assert flow["on"]["schedule"] and "workflow_dispatch" in flow["on"]
    assert "schedule" in jobs["full-report"]["if"] and "workflow_dispatch" in jobs["full-report"]["if"]
