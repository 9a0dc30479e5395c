"""The results report: verdicts against the reference, Markdown and self-contained HTML."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from course_utils import bench
from course_utils.kit import report

ROOT = Path(__file__).resolve().parents[1]

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


def test_every_headline_a_notebook_computes_on_a_gpu_has_a_gpu_range():
    """A notebook ``bench.record`` call made with ``device=`` (a GPU cell's headline) needs a "gpu"
    range; the CPU-computed headlines, which are all of them today, are judged by their "cpu"
    ranges, so a "gpu" range with no such call would be a range nothing reads."""
    expected = report.load_reference()["expected"]
    calls = []
    for twin in sorted((ROOT / "notebooks" / "src").glob("*.py")):
        for node in ast.walk(ast.parse(twin.read_text(encoding="utf-8"), filename=str(twin))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "bench"):
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                calls.append((twin.name, name, any(k.arg == "device" for k in node.keywords)))
    assert len(calls) > 50, "the scan found too few bench.record calls: has the notebooks' spelling changed?"
    on_gpu = [(nb, name) for nb, name, gpu in calls if gpu]
    lacking = [(nb, name) for nb, name in on_gpu if not (expected.get(name) or {}).get("gpu")]
    assert not lacking, f"headlines recorded from a GPU without a 'gpu' range in expected_ranges.json: {lacking}"
    unread = sorted(n for n, exp in expected.items() if exp.get("gpu") and n not in {name for _, name in on_gpu})
    assert not unread, f"'gpu' ranges for headlines no notebook computes on a GPU: {unread}"


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

    def fake_run_course(notebooks, quick, results, out_dir, **kwargs):
        seen["results"], seen["out_dir"] = results, out_dir
        return []

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.setenv("COURSE_QUICK", "1")
    import course_utils.kit.runner as runner

    monkeypatch.setattr(runner, "run_course", fake_run_course)
    monkeypatch.setattr(runner, "write_summary", lambda runs, path, **kw: {"total_s": 0.0, "machine": "test"})
    report.main(["--run", "--out", "rel-out"])
    assert seen["results"].is_absolute() and seen["results"] == tmp_path / "rel-out" / "results.jsonl"
    assert seen["out_dir"].is_absolute()
    # main() must not leave its full-mode switch behind: later notebooks in this process would run in full mode
    assert os.environ["COURSE_QUICK"] == "1" and "COURSE_RESULTS" not in os.environ


# --- malformed records, special characters, offline --run (issue 15, item 6) ---

ODD_REFERENCE = {
    "machine": {"description": "test box", "torch": "2.14.1", "python": "3.11", "date": "2026-11-30"},
    "results": {"a.speedup": {"value": 2.0, "unit": "x"}},
    "expected": {"a.speedup": {"cpu": [1.2, 5.0]}},
}


@pytest.mark.parametrize("bad", ["fast", "2.5", None, True, float("nan"), float("inf"), [2.5], {"v": 1}])
def test_a_record_whose_value_is_not_a_number_is_shown_as_invalid(bad, tmp_path, capsys):
    records = [{"name": "a.speedup", "value": bad, "unit": "x", "device": "cpu", "mode": "full"}]
    rows = {r.name: r for r in report.build_rows(records, ODD_REFERENCE)}
    row = rows["a.speedup"]
    assert row.value is None and row.verdict.startswith("invalid value")
    assert "a.speedup" in capsys.readouterr().err  # the warning names the record
    md, page = report.build(records, tmp_path, ODD_REFERENCE)
    assert "invalid value" in md.read_text() and "invalid value" in page.read_text()


def test_an_invalid_record_never_hides_the_others(tmp_path, capsys):
    records = [{"name": "a.speedup", "value": 2.5, "unit": "x", "device": "cpu"},
               {"name": "b.other", "value": "oops", "unit": "x"},
               "not a record", {"value": 1.0}, {"name": 7, "value": 1.0}, {"name": ["x"], "value": 1.0}]
    rows = {r.name: r for r in report.build_rows(records, ODD_REFERENCE)}
    assert set(rows) == {"a.speedup", "b.other"}
    assert rows["a.speedup"].value == 2.5 and rows["a.speedup"].verdict.startswith("in the expected range")
    err = capsys.readouterr().err
    assert "'not a record'" in err and "record 5" in err and "record 6" in err


@pytest.mark.parametrize("device", [0, None, ["cuda:0"], {"type": "cuda"}, 1.5])
def test_a_non_string_device_is_judged_as_unknown_not_a_crash(device, tmp_path, capsys):
    records = [{"name": "a.speedup", "value": 2.5, "unit": "x", "device": device, "mode": "full",
                "cpu_class": ["not", "a", "string"]}]
    (row,) = report.build_rows(records, ODD_REFERENCE)
    assert row.value == 2.5 and row.device is None and row.cpu_class is None
    assert row.verdict == "in the expected range for a CPU machine"
    if device is not None:
        assert "device" in capsys.readouterr().err
    report.build(records, tmp_path, ODD_REFERENCE)


def test_non_string_unit_and_mode_do_not_break_the_pages(tmp_path):
    records = [{"name": "a.speedup", "value": 2.5, "unit": 3, "device": "cpu", "mode": {"full": 1}}]
    (row,) = report.build_rows(records, ODD_REFERENCE)
    assert isinstance(row.unit, str) and row.mode is None
    md, page = report.build(records, tmp_path, ODD_REFERENCE)
    assert "a.speedup" in md.read_text() and "a.speedup" in page.read_text()


MATH_NAMES = ["cost.$usd$", r"a.$\notacommand$", "x^2_y", "price $5", "back\\slash", "tex_%_{}&#~"]


@pytest.mark.parametrize("name", MATH_NAMES)
def test_mathtext_specials_in_names_and_units_are_plotted_literally(name, tmp_path):
    ref = {"machine": {"description": "box"}, "results": {name: {"value": 2.0, "unit": "$"}},
           "expected": {name: {"cpu": [1, 3]}}}
    rows = report.build_rows([{"name": name, "value": 2.5, "unit": "$^_", "device": "cpu"}], ref)
    png = report.plot_png(rows)
    assert png is not None and png.startswith(b"\x89PNG")
    md, page = report.build([{"name": name, "value": 2.5, "unit": "$^_", "device": "cpu"}], tmp_path, ref)
    assert page.read_text().count("data:image/png;base64,") == 1


def test_the_plot_labels_are_not_parsed_as_mathtext(monkeypatch):
    """``$a$`` must come out as the four characters, not as an italic a."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = []
    real_savefig = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        fig.canvas.draw()
        seen.extend((t.get_text(), t.get_parse_math()) for ax in fig.axes for t in ax.get_yticklabels())
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    ref = {"machine": {}, "results": {"m.$a$": {"value": 1.0, "unit": ""}}, "expected": {}}
    report.plot_png(report.build_rows([{"name": "m.$a$", "value": 2.0, "unit": ""}], ref))
    plt.close("all")
    assert ("m.$a$", False) in seen


def test_the_plot_ignores_text_usetex(monkeypatch):
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)  # no LaTeX here: would fail on draw
    ref = {"machine": {}, "results": {"u_s$": {"value": 1.0, "unit": ""}}, "expected": {}}
    assert report.plot_png(report.build_rows([{"name": "u_s$", "value": 2.0, "unit": ""}], ref))


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row, split at pipes that are not backslash-escaped."""
    import re

    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


NASTY = "a|b*c_d`e<f>[g](h)&i\nj"


def test_markdown_escapes_specials_in_names_units_and_notes():
    ref = {"machine": {"description": "box | <b>bold</b> *star* [link](x)", "cpu_class": "x86_`avx`"},
           "results": {NASTY: {"value": 2.0, "unit": "m|s*_"}}, "expected": {NASTY: {"cpu": [1, 3]}}}
    rec = {"name": NASTY, "value": 2.5, "unit": "m|s*_", "device": "cpu", "mode": "fu|ll",
           "cpu_class": "x86_`avx`"}
    text = report.to_markdown(report.build_rows([rec], ref), ref)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "2.5" in ln]
    assert len(rows) == 1, text  # the newline in the name did not split the row
    assert len(_cells(rows[0])) == 6, rows[0]
    for raw in ("<b>", "*star*", "[link]", "m|s", "fu|ll"):
        assert raw not in text, raw
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert "<b>" not in rendered and "<em>" not in rendered and "<a " not in rendered
    assert "x86_`avx`" in rendered and "*star*" in rendered and "m|s*_" in rendered
    assert rendered.count("<tr>") == 2  # the header row and one result row


def test_markdown_shows_a_name_with_backticks_and_pipes_literally():
    markdown_it = pytest.importorskip("markdown_it")
    name = "q`x`|y"
    ref = {"machine": {}, "results": {}, "expected": {name: {"cpu": [0, 1]}}}
    text = report.to_markdown(report.build_rows([{"name": name, "value": 0.5, "unit": ""}], ref), ref)
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    assert "q`x`|y" in rendered and rendered.count("<td>") == 6


def test_html_escapes_names_units_and_notes():
    ref = {"machine": {"description": "<script>alert(1)</script>"}, "results": {},
           "expected": {"x.<b>": {"cpu": [0, 1]}}}
    rec = {"name": "x.<b>", "value": 0.5, "unit": "<i>u</i>", "device": "cpu", "mode": "<em>m</em>",
           "cpu_class": "<u>c</u>"}
    page = report.to_html(report.build_rows([rec], ref), ref)
    body = page.split("<body>")[1]
    for raw in ("<script>", "<b>", "<i>", "<em>", "<u>"):
        assert raw not in body, raw
    assert "x.&lt;b&gt;" in body and "&lt;script&gt;" in body


def test_a_malformed_reference_file_names_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "reference_results.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"reference_results\.json.*git checkout -- data/reference_results\.json"):
        report.load_reference(bad)
    bad.write_text('{"machine": {}, "results": {}}')
    ranges = tmp_path / "expected_ranges.json"
    ranges.write_text('{"other": 1}')
    with pytest.raises(ValueError, match=r"expected_ranges\.json has no 'expected' section"):
        report.load_reference(bad, ranges)
    ranges.write_text('{"expected": {}}')
    bad.write_text('{"machine": {}}')
    with pytest.raises(ValueError, match=r"reference_results\.json has no 'results' section"):
        report.load_reference(bad, ranges)


def test_run_executes_the_notebooks_offline(tmp_path, monkeypatch):
    """``--run`` executes the course with the network guard on, like the tests and workshop-check."""
    import course_utils.kit.runner as runner

    seen = {}

    def fake_run_course(notebooks, **kwargs):
        seen.update(kwargs, notebooks=notebooks)
        return []

    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.setattr(runner, "course_notebooks", lambda: ["nb.ipynb"])
    monkeypatch.setattr(runner, "run_course", fake_run_course)
    monkeypatch.setattr(runner, "write_summary", lambda runs, path, **kw: {"total_s": 0.0, "machine": "test"})
    report.main(["--run", "--out", str(tmp_path)])
    assert seen["notebooks"] == ["nb.ipynb"]
    assert seen["offline"] is True and seen["quick"] is False


def test_checks_are_listed_apart_from_measurements(tmp_path):
    """A result that cannot vary (a one-value range, or 'check' in its expected entry) is a check."""
    ref = report.load_reference()
    assert report.check_reason(ref["expected"]["breaks.count.after"])  # [0, 0] on every machine
    assert "asserted" in report.check_reason(ref["expected"]["breaks.count.before"])
    assert report.check_reason(ref["expected"]["compile.speedup.fusion"]) is None
    assert report.check_reason(None) is None
    records = [{"name": "breaks.count.after", "value": 0.0, "unit": "count", "mode": "full", "device": "cpu"},
               {"name": "compile.speedup.fusion", "value": 5.0, "unit": "x", "mode": "full", "device": "cpu"}]
    md, page = report.build(records, tmp_path, executed=tmp_path / "none")
    text = md.read_text()
    measurements, checks = text.index("## Measurements"), text.index("## Checks")
    assert measurements < text.index("`compile.speedup.fusion`") < checks < text.index("`breaks.count.after`")
    assert report.CHECKS_NOTE.split(":")[0] in text
    assert "<h2>Checks" in page.read_text()


def test_a_vacuously_true_flag_says_so():
    """A flag recorded with context vacuous=... (every case tied, nothing to judge) is not shown as a plain pass."""
    ref = report.load_reference()
    rec = {"name": "func.jac.best_mode_correct", "value": 1.0, "unit": "bool", "mode": "full", "device": "cpu",
           "context": {"vacuous": "every shape tied"}}
    row = next(r for r in report.build_rows([rec], ref) if r.name == "func.jac.best_mode_correct")
    assert row.verdict.startswith("in the expected range") and row.verdict.endswith("(vacuously: every shape tied)")
    plain = next(r for r in report.build_rows([{**rec, "context": {}}], ref) if r.name == rec["name"])
    assert "vacuously" not in plain.verdict


def test_a_result_measured_only_on_some_machines_says_so_when_missing():
    only = {"only_where": "a CPU with native bf16 instructions", "cpu": [0.3, 10]}
    rng, verdict = report.judge(None, only, "cpu", "x86-avx2")
    assert rng is None and "measured only on a CPU with native bf16 instructions" in verdict
    assert report.judge(None, {"cpu": [0.3, 10]}, "cpu")[1].startswith("not measured yet")
    entry = report.load_reference()["expected"]["compile.real.bf16_speedup"]
    assert "native bf16" in entry["only_where"], "notebook 11 records it only where the CPU has native bf16"
