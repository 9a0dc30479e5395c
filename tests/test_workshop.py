"""Classroom kit: the offline guard, the notebook runner, READY/NOT READY, the README stamp."""

from __future__ import annotations

import json
import os
import socket

import nbformat
import pytest

from course_utils import config
from course_utils.kit import offline, runner, stamp, workshop

ROOT = config.REPO_ROOT


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nbformat.write(nb, path)
    return path


def test_offline_guard_blocks_and_restores():
    offline.uninstall()  # the autouse fixture has it on; check that blocked() puts back "off"
    with offline.blocked():
        with pytest.raises(offline.NetworkBlocked, match="offline"):
            socket.getaddrinfo("pypi.org", 443)
        offline.check_address(("127.0.0.1", 80))
        offline.check_address("/tmp/some.sock")
        with pytest.raises(offline.NetworkBlocked):
            offline.check_address(("93.184.216.34", 443))
    assert not offline.is_installed()
    offline.install()


@pytest.mark.parametrize("host, loop", [("localhost", True), ("127.0.0.1", True), ("::1", True),
                                        ("10.0.0.1", False), ("example.org", False)])
def test_is_loopback(host, loop):
    assert offline.is_loopback(host) is loop


def test_runner_passes_a_good_notebook_and_records_the_mode(tmp_path):
    nb = _notebook(tmp_path / "01_good.ipynb",
                   "import os\nassert os.environ['COURSE_QUICK'] == '1'\nprint('hi')")
    run = runner.run_notebook(nb, quick=True, out_dir=tmp_path / "out")
    assert run.ok and run.error is None and run.mode == "quick" and run.seconds > 0
    executed = nbformat.read(tmp_path / "out" / "01_good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "hi\n"


def test_runner_keeps_figures_in_the_executed_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # as under pytest: the kernel must not inherit it
    nb = _notebook(tmp_path / "01_plot.ipynb",
                   "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);")
    run = runner.run_notebook(nb, quick=True, out_dir=tmp_path / "out")
    assert run.ok, run.error
    outputs = nbformat.read(tmp_path / "out" / "01_plot.ipynb", as_version=4).cells[0].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), outputs


def test_runner_reports_a_failing_cell(tmp_path):
    nb = _notebook(tmp_path / "02_bad.ipynb", "x = 1", "raise ValueError('planted failure')")
    run = runner.run_notebook(nb, quick=False)
    assert not run.ok and "planted failure" in run.error and run.mode == "full"


def test_runner_offline_kernel_cannot_download(tmp_path):
    nb = _notebook(tmp_path / "03_net.ipynb",
                   "import socket\nsocket.getaddrinfo('pypi.org', 443)")
    run = runner.run_notebook(nb, offline=True)
    assert not run.ok and "NetworkBlocked" in run.error


def test_summary_and_verdict(tmp_path):
    runs = [runner.NotebookRun("00_a.ipynb", True, 10.0, "quick"),
            runner.NotebookRun("01_b.ipynb", False, 5.0, "quick", "ValueError: x")]
    summary = runner.write_summary(runs, tmp_path / "s.json")
    assert summary["total_s"] == 15.0 and json.loads((tmp_path / "s.json").read_text())["runs"][1]["ok"] is False
    ready, lines = workshop.verdict([], runs)
    assert not ready and lines[0].startswith("NOT READY") and "01_b.ipynb" in "\n".join(lines)
    ready, lines = workshop.verdict([], runs[:1])
    assert ready and lines[0].startswith("READY")
    ready, lines = workshop.verdict(["c++ compiler: install g++"], runs[:1])
    assert not ready and "g++" in lines[1]
    ready, lines = workshop.verdict([], runs[:1], budget_s=5)
    assert ready and "over the" in lines[-1]


def test_course_notebooks_are_found_in_order():
    names = [p.name for p in runner.course_notebooks()]
    assert names == sorted(names) and names[0].startswith("00_")


README = """intro

| notebook | topic | minutes on a laptop CPU (full / quick) | needs a GPU for |
|---|---|---|---|
| [`00_setup.ipynb`](notebooks/00_setup.ipynb) | setup | 0.5 / 0.3 | nothing |
| [`01_torch_compile.ipynb`](notebooks/01_torch_compile.ipynb) | compile | 2 / 1 | graphs |

after
"""


def _summaries():
    quick = {"torch": "2.14.1", "date": "2026-11-30", "machine": "x86_64, 2 cores", "cpu_class": "x86-avx2",
             "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 30.0},
                      {"notebook": "01_torch_compile.ipynb", "ok": False, "seconds": 9.0}]}
    full = {**quick, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 90.0}]}
    cold = {**quick, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 300.0}]}
    return quick, full, cold


def test_stamp_writes_measured_minutes_and_version():
    quick, full, cold = _summaries()
    text, n = stamp.stamp_table(README, quick, full, cold)
    assert n == 1
    lines = text.splitlines()
    assert lines[2].endswith(f"| {stamp.MINUTES_HEADER} | needs a GPU for | {stamp.STAMP_HEADER} |")
    assert lines[3] == "|---|---|---|---|---|"
    assert "| 5.0 / 1.5 / 0.5 | nothing | torch 2.14.1, 2026-11-30 (first run+full+quick) |" in lines[4]
    assert lines[5].endswith("| 2 / 1 | graphs |  |")  # failed: not stamped
    again, _ = stamp.stamp_table(text, quick, full, cold)
    assert again == text  # idempotent
    only_quick, _ = stamp.stamp_table(text, quick, None, None)
    assert "| 5.0 / 1.5 / 0.5 |" in only_quick.splitlines()[4]  # figures of runs not given are kept


def test_a_carried_figure_that_a_fresh_run_contradicts_is_dropped():
    quick, full, _ = _summaries()
    readme = README.replace("| 0.5 / 0.3 | nothing |",
                            "| 0.9 / 1.2 / 0.3 | nothing | torch 2.14.1, 2026-11-01 (first run+full+quick) |")
    text, _ = stamp.stamp_table(readme, None, full, None)
    # the fresh full run (1.5 min) outlasts the carried first run (0.9): that one is stale; quick 0.3 still fits
    assert "| ? / 1.5 / 0.3 | nothing | torch 2.14.1, 2026-11-30 (full); torch 2.14.1, 2026-11-01 (quick) |" in text
    assert stamp.drop_contradicted(["5.0", "1.5", "2.0"], [False, True, False]) == ["5.0", "1.5", "?"]
    assert stamp.drop_contradicted(["1.0", "1.5", "0.5"], [True, True, True]) == ["1.0", "1.5", "0.5"]  # all fresh: kept


def test_a_time_line_without_a_first_run_figure_does_not_say_after_that():
    quick, full, _ = _summaries()
    line = stamp.time_line("00_setup.ipynb", None, full, quick)
    assert line.startswith(f"{stamp.TIME_OPEN}1.5 min on a later run (compile cache warm), 0.5 min in quick mode;"), line
    assert "after that" not in line


def test_a_warm_run_that_took_no_less_than_the_first_is_not_stated_as_if_the_cache_slowed_it():
    quick, _, cold = _summaries()
    cold = {**cold, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 60.0}]}
    full = {**cold, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 66.0}]}
    line = stamp.time_line("00_setup.ipynb", cold, full, quick)
    assert ("1.0 min the first time (every cache empty), 1.1 min after that (compile cache warm, yet no faster "
            "in these two runs), 0.5 min in quick mode;") in line, line
    cold = {**cold, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 20.9}]}
    full = {**cold, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 15.1}]}
    # both round to 0.3 min, but the seconds say the warm run was faster: no "yet no faster"
    assert "0.3 min after that (compile cache warm), " in stamp.time_line("00_setup.ipynb", cold, full, quick)
    assert "yet no faster" in stamp.time_line("00_setup.ipynb", full, cold, quick)
    _, full, cold = _summaries()  # 5.0 then 1.5: the cache saved time, the line says nothing more
    assert "1.5 min after that (compile cache warm), " in stamp.time_line("00_setup.ipynb", cold, full, quick)


def test_a_notebook_is_said_to_find_warm_only_the_caches_it_uses():
    quick, full, cold = _summaries()
    line = stamp.time_line("00_setup.ipynb", cold, full, quick, warm=stamp.WARM_NOTHING)
    assert "1.5 min after that (caches warm; it compiles nothing), " in line, line
    assert "compile cache" not in line
    assert "1.5 min on a later run (caches warm; AOTInductor compiles again, as it has no cache), 0.5 min" in (
        stamp.time_line("00_setup.ipynb", None, full, quick, warm=stamp.WARM_AOT))

    def nb(*code: str) -> dict:
        return {"cells": [{"cell_type": "markdown", "source": ["`torch.compile(model)` in prose only"]}]
                + [{"cell_type": "code", "source": [c]} for c in code]}
    assert stamp.warm_words(nb("sess = ort.InferenceSession(path)")) == stamp.WARM_NOTHING
    assert stamp.warm_words(nb("import torch", "fast = torch.compile(model)")) == stamp.WARM_COMPILED
    assert stamp.warm_words(nb('serve_in_subprocess({"batching": "iteration", "compile": True})')) == stamp.WARM_COMPILED
    assert stamp.warm_words(nb("torch._inductor.aoti_compile_and_package(ep)")) == stamp.WARM_AOT
    assert stamp.warm_words(nb("torch._inductor.aoti_compile_and_package(ep)", "torch.compile(f)")) == stamp.WARM_COMPILED


def test_stamp_writes_each_notebooks_own_time_line(tmp_path):
    quick, full, cold = _summaries()
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": [
        "# 00\n", "**Time on a laptop CPU:** <!-- stamp:time -->old<!-- /stamp:time --> Mostly compiling.\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["fast = torch.compile(model)"]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "00_setup.ipynb"
    path.write_text(json.dumps(nb))
    assert stamp.stamp_notebook(path, cold, full, quick)
    text = "".join(json.loads(path.read_text())["cells"][0]["source"])
    assert ("<!-- stamp:time -->5.0 min the first time (every cache empty), 1.5 min after that (compile cache "
            "warm), 0.5 min in quick mode; measured on the reference machine (2 cores, x86-avx2, "
            "torch 2.14.1, 2026-11-30) and stamped here by `make stamp`. A slower or busy laptop takes longer. "
            "The outputs stored below may come from another machine: the line the imports cell prints names their "
            "CPU class (`cpu class:`).<!-- /stamp:time --> "
            "Mostly compiling."
            in text)
    assert not stamp.stamp_notebook(tmp_path / "01_torch_compile.ipynb", cold, full, quick)  # it failed
    nb["cells"][0]["source"] = ["# 00\n", "no markers\n"]
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="no Markdown cell has the <!-- stamp:time -->"):
        stamp.stamp_notebook(path, cold, full, quick)


def test_stamp_keeps_a_notebooks_paired_source_in_sync(tmp_path):
    """A stamped notebook whose twin then differs would fail tests/test_notebooks.py's sync check."""
    from course_utils.kit import sources

    quick, full, cold = _summaries()
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": [
        "**Time on a laptop CPU:** <!-- stamp:time -->old<!-- /stamp:time -->\n"]},
        {"cell_type": "code", "metadata": {}, "source": ["x = 1\n"], "outputs": [], "execution_count": None}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "00_setup.ipynb"
    path.write_text(json.dumps(nb))
    sources.write([path])
    assert "old" in sources.source_of(path).read_text()
    assert stamp.stamp_notebook(path, cold, full, quick)
    assert sources.out_of_sync([path]) == []
    assert "old" not in sources.source_of(path).read_text()
    assert "1.5 min after that" in sources.source_of(path).read_text()


def test_readme_and_notebooks_state_the_same_times():
    """Both come from the same runs: each notebook's time line repeats its README row."""
    readme = (ROOT / "README.md").read_text()
    rows = {m.group(1): line for line in readme.splitlines()
            if line.startswith("| [`") and (m := stamp.NOTEBOOK_RE.search(line))}
    assert len(rows) == len(runner.course_notebooks()) >= 11
    for path in runner.course_notebooks():
        cell = stamp.time_cell(json.loads(path.read_text()))
        assert cell, f"{path.name}: no stamped time line"
        found = stamp.TIME_RE.search("".join(cell["source"]))
        figures = rows[path.name].split("|")[3].strip()
        if "min" in found.group(0):
            parts = figures.split(" / ")
            warm = "after that" if parts[0] != "?" else "with the compile cache warm"
            for figure, words in zip(parts, ("the first time", warm, "in quick mode"), strict=True):
                if figure == "?":  # not measured yet: the notebook does not state it either
                    assert words not in found.group(0), (path.name, figures, found.group(0))
                else:
                    assert f"{figure} min {words}" in found.group(0), (path.name, figures, found.group(0))


def test_cold_runs_start_with_empty_caches_and_leave_none_behind(monkeypatch):
    for var in runner.CACHE_VARIABLES:
        monkeypatch.setenv(var, "/somewhere/warm")
    seen = {}
    with runner._empty_caches(True):
        for var in runner.CACHE_VARIABLES:
            folder = os.environ[var]
            seen[var] = folder
            assert folder != "/somewhere/warm" and os.path.isdir(folder) and not os.listdir(folder)
    assert len(set(seen.values())) == len(runner.CACHE_VARIABLES)
    assert all(os.environ[var] == "/somewhere/warm" for var in runner.CACHE_VARIABLES)
    assert not any(os.path.exists(folder) for folder in seen.values())
    with runner._empty_caches(False):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/warm"


def test_a_machine_much_slower_than_the_reference_is_warned_about():
    stated = stamp.stated_quick_seconds("| notebook | what | minutes |\n|---|---|---|\n"
                                        "| [`00_a.ipynb`](x) | a | 0.5 / 0.4 / 0.2 |\n"
                                        "| [`01_b.ipynb`](x) | b | ? / ? / ? |\n"
                                        "| [`02_c.ipynb`](x) | c | 1.0 / 0.8 / 0.5 |\n\nafter the table\n")
    assert stated == {"00_a.ipynb": 12.0, "02_c.ipynb": 30.0}
    on_pace = [runner.NotebookRun("00_a.ipynb", True, 14.0, "quick"), runner.NotebookRun("02_c.ipynb", True, 33.0, "quick")]
    ready, lines = workshop.verdict([], on_pace, stated=stated)
    assert ready and "should hold here" in lines[-1] and "1.1x" in lines[-1]
    slow = [runner.NotebookRun("00_a.ipynb", True, 60.0, "quick"), runner.NotebookRun("02_c.ipynb", True, 60.0, "quick"),
            runner.NotebookRun("01_b.ipynb", True, 500.0, "quick")]  # no stated time: not counted
    ready, lines = workshop.verdict([], slow, stated=stated)
    assert ready and "WARNING" in lines[-1] and "2.9x" in lines[-1] and lines[-1].index("00_a") < lines[-1].index("02_c")
    assert workshop.pace_lines(slow, {}) == []
    # the README the course ships states a quick time for every notebook that has been stamped
    assert stamp.stated_quick_seconds((ROOT / "README.md").read_text())


def test_a_figure_no_run_measured_this_time_is_carried_from_readme_into_the_notebook():
    full = {"torch": "2.14.1", "date": "2026-11-30", "machine": "x86_64, 2 cores", "cpu_class": "x86-avx2",
            "runs": [{"notebook": "11_x.ipynb", "ok": True, "seconds": 144.0}]}
    line = stamp.time_line("11_x.ipynb", None, full, None, carried=("3.9", "2.0", "?"))
    assert "3.9 min the first time" in line and "2.4 min after that" in line and "quick mode" not in line
    assert stamp.time_line("11_x.ipynb", None, None, None, carried=("3.9", "2.0", "1.0")) is None  # nothing ran
    assert stamp.stated_minutes("| notebook | a | m |\n|---|---|---|\n| [`11_x.ipynb`](x) | a | 0.5 / 0.2 |\n") == {
        "11_x.ipynb": ("?", "0.5", "0.2")}


def test_two_jobs_run_every_notebook_in_its_own_kernel_longest_first(tmp_path, capsys):
    """Two at a time: both kernels really overlap, each notebook runs whole in its own kernel, the
    longest expected one starts first, and the runs come back in the order asked."""
    marker = tmp_path / "started"
    marker.mkdir()
    # each notebook notes its kernel's pid and when it started, then waits until both kernels are up
    src = ("import os, time, pathlib\nd = pathlib.Path({d!r})\n(d / '{name}').write_text(str(os.getpid()))\n"
           "deadline = time.time() + 60\nwhile len(list(d.iterdir())) < 2 and time.time() < deadline:\n"
           "    time.sleep(0.05)\nassert len(list(d.iterdir())) >= 2, 'the other notebook never ran alongside'\n")
    paths = [_notebook(tmp_path / f"0{i}_{n}.ipynb", src.format(d=str(marker), name=n), "x = 1\nprint(x)")
             for i, n in enumerate(("a", "b"))]
    runs = runner.run_course(paths, jobs=2, expected_s={"01_b.ipynb": 60.0, "00_a.ipynb": 1.0})
    assert [r.notebook for r in runs] == ["00_a.ipynb", "01_b.ipynb"] and all(r.ok for r in runs)
    pids = {p.name: p.read_text() for p in marker.iterdir()}
    assert len(set(pids.values())) == 2  # two fresh kernels
    printed = capsys.readouterr().out
    assert "00_a.ipynb" in printed and "01_b.ipynb" in printed
    with pytest.raises(ValueError, match="jobs"):
        runner.run_course(paths, jobs=0)


def test_parallel_summary_gives_the_workshop_line_not_per_notebook_minutes(tmp_path):
    runs = [runner.NotebookRun("00_a.ipynb", True, 30.0, "quick"), runner.NotebookRun("01_b.ipynb", True, 20.0, "quick")]
    summary = runner.write_summary(runs, tmp_path / "s.json", jobs=2, wall_s=30.0)
    assert summary["jobs"] == 2 and summary["wall_s"] == 30.0 and summary["total_s"] == 50.0
    assert stamp.per_notebook(summary) is None
    assert stamp.per_notebook(runner.write_summary(runs, tmp_path / "t.json")) is not None
    readme = "intro <!-- stamp:workshop -->(not measured yet)<!-- /stamp:workshop --> more\n"
    assert stamp.stated_workshop_seconds(readme, 2) is None
    text, done = stamp.stamp_workshop(readme, summary)
    assert done and "took 0.5 min with 2 notebooks at a time" in text and text.endswith(" more\n")
    assert stamp.stated_workshop_seconds(text, 2) == 30.0 and stamp.stated_workshop_seconds(text, 1) is None
    failed = dict(summary, runs=[dict(r, ok=False) for r in summary["runs"]])
    assert stamp.stamp_workshop(readme, failed) == (readme, False)  # a failed check states no time


def test_parallel_pace_compares_elapsed_time_with_the_reference_run():
    runs = [runner.NotebookRun("00_a.ipynb", True, 40.0, "quick")]
    ready, lines = workshop.verdict([], runs, jobs=2, wall_s=40.0, stated_wall_s=36.0)
    assert ready and "2 at a time" in lines[0] and "1.1x" in lines[-1] and "should hold" in lines[-1]
    ready, lines = workshop.verdict([], runs, jobs=2, wall_s=90.0, stated_wall_s=36.0)
    assert ready and "WARNING" in lines[-1] and "2.5x" in lines[-1]
    ready, lines = workshop.verdict([], runs, jobs=2, wall_s=40.0, stated_wall_s=None)
    assert "no reference time" in lines[-1]
    # the shipped README states the reference machine's time for the Makefile's default JOBS=2
    readme = (ROOT / "README.md").read_text()
    assert stamp.WORKSHOP_OPEN in readme and stamp.WORKSHOP_CLOSE in readme


def test_stamp_takes_quick_minutes_from_one_run_and_the_workshop_line_from_another(tmp_path):
    """`stamp --quick serial.json --workshop two.json`: per-notebook minutes from the one-at-a-time
    run, README's workshop line from the two-at-a-time run; a two-at-a-time --quick alone gives no minutes."""
    serial = {"torch": "2.14.1", "date": "2026-11-30", "machine": "x86_64, 2 cores", "cpu_class": "x86-avx2",
              "jobs": 1, "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 24.0}], "total_s": 24.0}
    two = dict(serial, jobs=2, wall_s=240.0, runs=[{"notebook": "00_setup.ipynb", "ok": True, "seconds": 60.0}])
    for name, summary in (("serial.json", serial), ("two.json", two)):
        (tmp_path / name).write_text(json.dumps(summary))
    readme = tmp_path / "README.md"
    readme.write_text(README.replace("intro", "intro <!-- stamp:workshop -->?<!-- /stamp:workshop -->"))
    (tmp_path / "nbs").mkdir()
    args = ["--full", str(tmp_path / "none.json"), "--cold", str(tmp_path / "none.json"),
            "--readme", str(readme), "--notebooks", str(tmp_path / "nbs")]
    assert stamp.main(["--quick", str(tmp_path / "serial.json"), "--workshop", str(tmp_path / "two.json"), *args]) == 0
    text = readme.read_text()
    assert "| ? / 0.5 / 0.4 |" in text and stamp.stated_workshop_seconds(text, 2) == 240.0
    readme.write_text(README.replace("intro", "intro <!-- stamp:workshop -->?<!-- /stamp:workshop -->"))
    assert stamp.main(["--quick", str(tmp_path / "two.json"), *args]) == 0
    text = readme.read_text()
    assert "| 0.5 / 0.3 |" in text and stamp.stated_workshop_seconds(text, 2) == 240.0  # minutes kept


def test_a_failure_shows_its_output_tail_without_colour_codes_and_the_pace_still_prints(tmp_path):
    """NOT READY names the cause and shows what the failing cell printed, in plain text, and the
    pace line is printed too (a failed check used to drop it)."""
    nb = _notebook(tmp_path / "04_bad.ipynb", "print('step one done')\nraise RuntimeError('the \\x1b[31mred\\x1b[0m cause')")
    run = runner.run_notebook(nb, quick=True)
    assert not run.ok and run.output_tail
    assert "step one done" in run.output_tail[0] and any("the red cause" in ln for ln in run.output_tail)
    assert not any("\x1b" in ln for ln in run.output_tail) and "\x1b" not in run.error
    ok = runner.NotebookRun("00_a.ipynb", True, 40.0, "quick")
    ready, lines = workshop.verdict([], [ok, run], jobs=2, wall_s=60.0, stated_wall_s=50.0)
    text = "\n".join(lines)
    assert not ready and "      | step one done" in text and "the red cause" in text
    assert "pace:" in text and "had failures" in text
    ready, lines = workshop.verdict([], [ok, run], stated={"00_a.ipynb": 40.0})
    assert "pace:" in "\n".join(lines)


def test_a_carried_figure_keeps_its_own_date_and_a_rerun_mode_gets_the_new_one():
    """No stamped sentence claims a date for a figure it did not measure (issue: carried figures
    used to read "measured ... on <this run's date>")."""
    row = ("| notebook | what | minutes | gpu | last passed (torch, date) |\n|---|---|---|---|---|\n"
           "| [`11_x.ipynb`](x) | a | 3.9 / 2.0 / 1.0 | nothing | torch 2.14.1, 2026-11-30 (first run+full+quick) |\n")
    full = {"torch": "2.14.1", "date": "2026-12-01", "machine": "x86_64, 2 cores", "cpu_class": "x86-avx2",
            "runs": [{"notebook": "11_x.ipynb", "ok": True, "seconds": 144.0}]}
    text, n = stamp.stamp_table(row, None, full, None)
    assert n == 1
    assert "| 3.9 / 2.4 / 1.0 |" in text
    assert "torch 2.14.1, 2026-12-01 (full); torch 2.14.1, 2026-11-30 (first run+quick) |" in text
    dates = stamp.stated_dates(text)["11_x.ipynb"]
    assert dates == {"first run": ("2.14.1", "2026-11-30"), "full": ("2.14.1", "2026-12-01"),
                     "quick": ("2.14.1", "2026-11-30")}
    line = stamp.time_line("11_x.ipynb", None, full, None, stamp.stated_minutes(text)["11_x.ipynb"], dates)
    assert "3.9 min: torch 2.14.1, 2026-11-30" in line and "2.4 min: torch 2.14.1, 2026-12-01" in line
    assert "1.0 min: torch 2.14.1, 2026-11-30" in line
    # a carried figure whose date README does not give says so instead of borrowing this run's
    bare = stamp.time_line("11_x.ipynb", None, full, None, ("3.9", "2.0", "?"), {})
    assert "3.9 min: date not recorded" in bare and "2.4 min: torch 2.14.1, 2026-12-01" in bare
    # all from one run: one date, as before
    assert stamp.format_passed({m: ("2.14.1", "2026-12-01") for m in stamp.MODES}) == \
        "torch 2.14.1, 2026-12-01 (first run+full+quick)"
    assert stamp.parse_passed("") == {}
