"""The results report: verdicts against the reference, Markdown and self-contained HTML."""

from __future__ import annotations

import os

import pytest

from course_utils import bench, report

REFERENCE = {
    "machine": {"description": "test box", "torch": "2.14.1", "python": "3.11", "date": "2026-11-30"},
    "results": {"a.speedup": {"value": 2.0, "unit": "x"}, "b.err": {"value": 1e-7, "unit": ""}},
    "expected": {"a.speedup": {"cpu": [1.2, 5.0], "gpu": None}, "b.err": {"cpu": [0, 1e-4], "gpu": [0, 1e-4]},
                 "c.missing": {"cpu": [0, 1]}},
}


def test_judge():
    assert report.judge(2.0, {"cpu": [1, 3]}, "cpu")[1].startswith("in the expected range")
    assert report.judge(0.5, {"cpu": [1, 3]}, "cpu")[1].startswith("below")
    assert report.judge(9.0, {"cpu": [1, 3]}, "cpu")[1].startswith("above")
    assert "no expected range for a GPU" in report.judge(2.0, {"cpu": [1, 3], "gpu": None}, "gpu")[1]
    assert "not measured" in report.judge(None, {"cpu": [1, 3]}, "cpu")[1]


def test_rows_use_the_latest_record_and_the_device_kind(results_file):
    bench.record("a.speedup", 0.9, "x")
    bench.record("a.speedup", 2.5, "x")
    records = bench.read_results()
    records.append({"name": "b.err", "value": 3e-7, "unit": "", "device": "cuda:0", "mode": "full"})
    rows = {r.name: r for r in report.build_rows(records, REFERENCE)}
    assert rows["a.speedup"].value == 2.5 and rows["a.speedup"].verdict.startswith("in the expected range for a CPU")
    assert rows["b.err"].verdict == "in the expected range for a GPU machine"
    assert rows["c.missing"].value is None and "not measured" in rows["c.missing"].verdict


def test_build_writes_markdown_and_self_contained_html(tmp_path, results_file):
    bench.record("a.speedup", 0.5, "x")
    md, page = report.build(bench.read_results(), tmp_path, REFERENCE)
    text = md.read_text()
    assert "| `a.speedup` | 0.5 x |" in text and "below the expected range" in text and "test box" in text
    html = page.read_text()
    assert "data:image/png;base64," in html and "<script" not in html and "http" not in html.split("<body>")[1]


def test_reference_file_is_complete_and_consistent():
    ref = report.load_reference()
    for name, exp in ref["expected"].items():
        lo, hi = exp["cpu"]
        assert lo <= hi, name
        assert exp.get("gpu") is None or exp["gpu"][0] <= exp["gpu"][1], name
    missing = set(ref["results"]) - set(ref["expected"])
    assert not missing, f"reference results without an expected range: {sorted(missing)}"
    assert ref["machine"]["description"] and ref["machine"]["date"]


def test_cli_without_results_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    assert report.main(["--results", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 1
    assert "make report" in capsys.readouterr().out


def test_missing_reference_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="git checkout"):
        report.load_reference(tmp_path / "nope.json")


def test_every_headline_result_in_the_notebooks_has_an_expected_range():
    import json
    import re

    from course_utils import config

    ranges = json.loads((config.data_dir() / report.RANGES_FILE).read_text())["expected"]
    recorded = set()
    for path in sorted((config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            recorded |= set(re.findall(r'bench\.record\(\s*"([a-z0-9_.]+)"', "".join(cell["source"])))
    assert recorded, "no bench.record calls found in the notebooks"
    assert not recorded - set(ranges), f"no expected range for {sorted(recorded - set(ranges))}"


def test_a_cpu_class_range_wins_over_the_shared_cpu_range():
    expected = {"cpu": [1.3, 10], "cpu:x86-avx2": [0.05, 1.0], "gpu": None}
    assert report.judge(0.2, expected, "cpu", "x86-avx2") == ((0.05, 1.0), "in the expected range for an x86-avx2 CPU")
    assert report.judge(0.2, expected, "cpu", "x86-avx512-vnni")[1] == "below the expected range for a CPU machine"
    assert report.judge(0.2, expected, "cpu")[1] == "below the expected range for a CPU machine"
    assert report.judge(0.2, expected, "gpu", "x86-avx2")[1] == "no expected range for a GPU machine yet"


def test_the_report_names_the_learners_cpu_class(tmp_path):
    ref = {"machine": {"description": "ref box", "cpu_class": "x86-avx512-vnni"}, "results": {},
           "expected": {"q.ratio": {"cpu": [0.1, 0.7], "cpu:x86-avx2": [0.1, 2.0]}}}
    rec = {"name": "q.ratio", "value": 1.5, "unit": "x", "mode": "full", "device": "cpu", "cpu_class": "x86-avx2"}
    rows = report.build_rows([rec], ref)
    assert rows[0].verdict == "in the expected range for an x86-avx2 CPU"
    text = report.to_markdown(rows, ref)
    assert "Your machine: CPU class x86-avx2" in text and "the reference is x86-avx512-vnni" in text


def test_reference_figures_of_the_learners_class_are_preferred():
    ref = {"machine": {"description": "ref", "cpu_class": "x86-avx512-vnni"},
           "results": {"q.ratio": {"value": 0.3, "unit": "x"}},
           "classes": {"x86-avx2": {"results": {"q.ratio": {"value": 2.5, "unit": "x"}}}},
           "expected": {"q.ratio": {"cpu": [0.1, 5]}}}
    avx2 = {"name": "q.ratio", "value": 2.0, "unit": "x", "mode": "full", "device": "cpu", "cpu_class": "x86-avx2"}
    assert report.build_rows([avx2], ref)[0].reference == 2.5
    assert report.build_rows([dict(avx2, cpu_class="x86-amx")], ref)[0].reference == 0.3
    assert report.build_rows([], ref)[0].reference == 0.3


def test_relative_out_and_results_paths_are_made_absolute(tmp_path, monkeypatch):
    """The kernels that write results run in notebooks/, so a relative path must not reach them."""
    seen = {}

    def fake_run_course(notebooks, quick, results, out_dir):
        seen["results"], seen["out_dir"] = results, out_dir
        return []

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.setenv("COURSE_QUICK", "1")
    import course_utils.runner as runner

    monkeypatch.setattr(runner, "run_course", fake_run_course)
    monkeypatch.setattr(runner, "write_summary", lambda runs, path: {"total_s": 0.0, "machine": "test"})
    report.main(["--run", "--out", "rel-out"])
    assert seen["results"].is_absolute() and seen["results"] == tmp_path / "rel-out" / "results.jsonl"
    assert seen["out_dir"].is_absolute()
    # main() must not leave its full-mode switch behind: later notebooks in this process would run in full mode
    assert os.environ["COURSE_QUICK"] == "1" and "COURSE_RESULTS" not in os.environ
