"""Verdicts recorded by name: bench.record_verdict, the report's section on a results file from
another machine, and tools/make_reference.py keeping them (and each figure's date)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from course_utils import bench, config
from course_utils.kit import report


@pytest.fixture
def results(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv("COURSE_RESULTS", str(path))
    return path


def test_verdicts_are_recorded_by_name_beside_results(results):
    cmp = bench.Comparison.from_samples({"eager": [1.0, 1.01, 0.99], "compiled": [0.5, 0.51, 0.49]})
    assert cmp.verdict("compiled", name="t.compiled") == "faster"
    assert cmp.describe("eager", "compiled", name="t.eager").startswith("2.00x slower")
    assert bench.band_verdict(1.0, 1.05, name="t.band") == "no clear difference"
    assert bench.record_verdict("t.by_hand", "Does Not Pay ") == "does not pay"
    bench.record("t.value", 2.0, "x")
    recs = bench.read_results(results)
    verdicts = report.latest_verdicts(recs)
    assert {n: v["verdict"] for n, v in verdicts.items()} == {
        "t.compiled": "faster", "t.eager": "slower", "t.band": "no clear difference", "t.by_hand": "does not pay"}
    assert verdicts["t.compiled"]["context"]["ratio"] == pytest.approx(2.0, rel=0.05)
    assert isinstance(verdicts["t.compiled"]["cores"], int) and isinstance(verdicts["t.compiled"]["threads"], int)
    # the headline rows see only the result, and warn about nothing
    warnings: list[str] = []
    assert list(report.latest_valid(recs, warnings.append)) == ["t.value"] and warnings == []


@pytest.mark.parametrize("name, verdict", [("Bad Name", "faster"), ("t.ok", ""), ("t.ok", "x" * 80), ("t.ok", 3)])
def test_a_bad_verdict_name_or_word_is_a_clear_error(results, name, verdict):
    with pytest.raises(ValueError, match="verdict"):
        bench.record_verdict(name, verdict)
    assert not results.exists()  # nothing half-written


def test_a_noisy_comparison_says_so_in_its_record(results):
    cmp = bench.Comparison.from_samples({"a": [1.0, 1.6, 0.6, 1.4], "b": [1.0, 1.01, 0.99]})
    cmp.verdict("b", name="t.noisy")
    assert report.latest_verdicts(bench.read_results(results))["t.noisy"]["noisy"] is True


def _verdict(name, word, cpu_class="x86-avx512-vnni", cores=2, threads=2, mode="full", noisy=False):
    return {"kind": "verdict", "name": name, "verdict": word, "cpu_class": cpu_class, "cores": cores,
            "threads": threads, "mode": mode, "noisy": noisy}


def test_the_report_lists_each_verdict_that_differs_with_its_likely_cause():
    reference = {"verdicts": {"a.same": _verdict("a.same", "faster"), "a.flip": _verdict("a.flip", "faster"),
                              "a.busy": _verdict("a.busy", "slower"), "a.ref_only": _verdict("a.ref_only", "lower")}}
    mine = [_verdict("a.same", "faster", "x86-avx2"), _verdict("a.flip", "no clear difference", "x86-avx2"),
            _verdict("a.busy", "no clear difference", cpu_class="x86-avx512-vnni", noisy=True),
            _verdict("a.mine_only", "higher"), {"name": "r", "value": 1.0, "unit": "x"}]
    section = report.record_verdict_section(mine, reference)
    assert section.intro.startswith("2 of the 3 verdicts")
    flip = next(i for i in section.items if i.startswith("a.flip"))
    assert "reference faster, yours no clear difference" in flip and "x86-avx512-vnni against x86-avx2" in flip
    busy = next(i for i in section.items if i.startswith("a.busy"))
    assert "busy machine (yours)" in busy
    assert "1 verdict only your run recorded, 1 only the reference" in section.outro
    assert "Why they flip" in section.outro
    # no verdict records: None, so the report falls back to the executed notebooks
    assert report.record_verdict_section([{"name": "r", "value": 1.0}], reference) is None
    assert "no verdicts to compare" in report.record_verdict_section(mine, {}).intro


def test_reference_verdicts_without_a_cpu_class_take_the_reference_machines():
    """A reference file written before verdicts carried their class: a flip on another class is
    still put down to the class, not to chance."""
    bare = {k: v for k, v in _verdict("a.flip", "faster").items() if k != "cpu_class"}
    reference = {"machine": {"cpu_class": "x86-amx"}, "verdicts": {"a.flip": bare}}
    section = report.record_verdict_section([_verdict("a.flip", "slower", "x86-avx2")], reference)
    assert "a different CPU class (x86-amx against x86-avx2)" in section.items[0], section.items


def test_the_report_page_shows_the_section_for_a_results_file_from_another_machine(tmp_path):
    ref = report.load_reference()
    assert ref.get("verdicts"), "data/reference_results.json lost its verdicts: rebuild it with tools/make_reference.py"
    name = next(iter(ref["verdicts"]))
    other = "faster" if ref["verdicts"][name]["verdict"] != "faster" else "slower"
    records = [{**_verdict(name, other, "x86-avx2", cores=8, threads=8)}, {"name": "x.y", "value": 1.0, "unit": "x"}]
    md, _ = report.build(records, tmp_path, executed=tmp_path / "none")
    text = md.read_text()
    assert report.VERDICT_TITLE in text and name.replace("_", "\\_") in text and "other thread counts" in text


@pytest.fixture(scope="module")
def make_reference():
    spec = importlib.util.spec_from_file_location("make_reference", config.REPO_ROOT / "tools" / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_reference_keeps_verdicts_and_dates_and_update_replaces_only_what_was_rerun(make_reference):
    old_recs = [{"name": "a.x", "value": 1.0, "unit": "x", "mode": "full", "time": "2026-11-30T10:00:00+00:00"},
                {"name": "b.x", "value": 2.0, "unit": "x", "mode": "full", "time": "2026-11-30T10:00:00+00:00"},
                {**_verdict("a.v", "faster"), "time": "2026-11-30T10:00:00+00:00"}]
    new_recs = [{"name": "b.x", "value": 3.0, "unit": "x", "mode": "full", "time": "2026-12-01T10:00:00+00:00"},
                {**_verdict("a.v", "slower", mode="quick"), "time": "2026-12-01T09:00:00+00:00"},
                {**_verdict("a.v", "no clear difference"), "time": "2026-12-01T08:00:00+00:00"}]
    machine = {"description": "m", "date": "2026-11-30", "mode": "full"}
    old = {"machine": machine, "results": make_reference.table(make_reference.pick(old_recs)),
           "verdicts": make_reference.verdict_table(old_recs), "classes": {}}
    new = {"machine": {**machine, "date": "2026-12-01"}, "results": make_reference.table(make_reference.pick(new_recs)),
           "verdicts": make_reference.verdict_table(new_recs), "classes": {}}
    assert new["verdicts"]["a.v"]["verdict"] == "no clear difference"  # full mode wins over a later quick one
    merged = make_reference.merge(old, new)
    assert merged["results"]["a.x"] == {"value": 1.0, "unit": "x", "mode": "full", "date": "2026-11-30"}
    assert merged["results"]["b.x"]["value"] == 3.0 and merged["results"]["b.x"]["date"] == "2026-12-01"
    assert merged["machine"]["date"] == "2026-11-30 to 2026-12-01"
    again = make_reference.merge(merged, {**new, "machine": {**machine, "date": "2026-12-02"}})
    assert again["machine"]["date"] == "2026-11-30 to 2026-12-01", "a span merged again stays one span"
    json.dumps(merged)


def test_class_only_files_another_machine_under_its_class_and_replaces_a_profile_section_whole(make_reference):
    machine = {"description": "ref", "date": "2026-11-30", "mode": "full", "cpu_class": "x86-amx"}
    profiled = {"how": "this machine under a CPU profile",
                "results": {"a.x": {"value": 1.0, "unit": "x", "mode": "full", "date": "2026-11-30"},
                            "old.only": {"value": 5.0, "unit": "x", "mode": "full", "date": "2026-11-30"}},
                "verdicts": {}}
    old = {"machine": machine, "results": {"a.x": {"value": 9.0, "unit": "x", "mode": "full", "date": "2026-11-30"}},
           "verdicts": {}, "classes": {"x86-avx2": profiled}}
    native = {"how": "native: AMD laptop, torch 2.14.1",
              "results": {"a.x": {"value": 2.0, "unit": "x", "mode": "full", "date": "2026-12-06"}}, "verdicts": {}}
    merged = make_reference.merge(old, {"classes": {"x86-avx2": native}})
    assert merged["machine"] == machine and merged["results"] == old["results"], "the reference's own figures stay"
    assert merged["classes"]["x86-avx2"]["how"] == native["how"]
    assert merged["classes"]["x86-avx2"]["results"] == native["results"], "no profile figure is left beside native ones"
    again = make_reference.merge(merged, {"classes": {"x86-avx2": {**native, "results": {
        "b.x": {"value": 3.0, "unit": "x", "mode": "full", "date": "2026-12-07"}}}}})
    assert set(again["classes"]["x86-avx2"]["results"]) == {"a.x", "b.x"}, "the same provenance is updated by name"
