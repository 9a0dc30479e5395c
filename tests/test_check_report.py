"""tools/check_report.py: the weekly full-mode job fails when a headline result leaves its range."""

from __future__ import annotations

import importlib.util
import json

import pytest

from course_utils import config
from course_utils.kit import report


@pytest.fixture(scope="module")
def check_report():
    spec = importlib.util.spec_from_file_location("check_report", config.REPO_ROOT / "tools" / "check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _a_result_with_a_cpu_range() -> tuple[str, float, float]:
    expected = report.load_reference()["expected"]
    name = next(n for n, e in sorted(expected.items()) if e.get("cpu") and e["cpu"][1] > 0)
    low, high = expected[name]["cpu"]
    return name, float(low), float(high)


def _write(path, *records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_in_range_passes_and_out_of_range_fails_naming_the_row(check_report, tmp_path, capsys):
    name, low, high = _a_result_with_a_cpu_range()
    results = tmp_path / "results.jsonl"
    inside = {"name": name, "value": (low + high) / 2, "unit": "", "device": "cpu", "mode": "full"}
    assert check_report.main([_write(results, inside)]) == 0
    assert "in its expected range" in capsys.readouterr().out
    # the latest record of a name counts, as in the report
    assert check_report.main([_write(results, inside, {**inside, "value": high * 10 + 1})]) == 1
    out = capsys.readouterr().out
    assert f"{name}:" in out and "above the expected range" in out and "1 headline result" in out
    assert check_report.main([_write(results, {**inside, "value": low - 1 - abs(low)})]) == 1
    assert "below the expected range" in capsys.readouterr().out


def test_no_results_is_a_failure(check_report, tmp_path, capsys):
    assert check_report.main([str(tmp_path / "missing.jsonl")]) == 1
    assert "make report" in capsys.readouterr().out


def test_an_invalid_value_fails_the_check(check_report, tmp_path, capsys):
    name, low, high = _a_result_with_a_cpu_range()
    bad = {"name": name, "value": "fast", "unit": "", "device": "cpu", "mode": "full"}
    assert check_report.main([_write(tmp_path / "results.jsonl", bad)]) == 1
    out = capsys.readouterr().out
    assert f"{name}: invalid value" in out and "1 headline result" in out
