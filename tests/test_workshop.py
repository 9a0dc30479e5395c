"""Classroom kit: the offline guard, the notebook runner, READY/NOT READY, the README stamp."""

from __future__ import annotations

import json
import socket

import nbformat
import pytest

from course_utils import offline, runner, stamp, workshop


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


def test_stamp_writes_measured_minutes_and_version():
    quick = {"torch": "2.14.1", "date": "2026-11-30",
             "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 30.0},
                      {"notebook": "01_torch_compile.ipynb", "ok": False, "seconds": 9.0}]}
    full = {"torch": "2.14.1", "date": "2026-11-30",
            "runs": [{"notebook": "00_setup.ipynb", "ok": True, "seconds": 90.0}]}
    text, n = stamp.stamp_table(README, quick, full)
    assert n == 1
    lines = text.splitlines()
    assert lines[2].endswith(f"| {stamp.STAMP_HEADER} |") and lines[3] == "|---|---|---|---|---|"
    assert "| 1.5 / 0.5 | nothing | torch 2.14.1, 2026-11-30 (quick+full) |" in lines[4]
    assert lines[5].endswith("| 2 / 1 | graphs |  |")  # failed: not stamped
    again, _ = stamp.stamp_table(text, quick, full)
    assert again == text  # idempotent
