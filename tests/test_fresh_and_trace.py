"""course_utils.fresh (scripts in new processes, cold caches) and course_utils.trace_report (tlparse)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from course_utils import config, fresh, trace_report

CACHE_PROBE = """
import json, os
from pathlib import Path
cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
print("noise before the result")
print(json.dumps({"cache": cache, "exists": bool(cache) and Path(cache).exists() and any(Path(cache).iterdir()),
                  "extra": os.environ.get("COURSE_FRESH_TEST"), "cwd": os.getcwd()}))
"""


def test_cold_run_gets_its_own_empty_cache_that_is_removed_afterwards():
    first = fresh.run_script(CACHE_PROBE, env={"COURSE_FRESH_TEST": "yes"})
    second = fresh.run_script(CACHE_PROBE)
    assert first["cache"] and second["cache"] and first["cache"] != second["cache"]
    assert first["exists"] is False, "a cold cache must start empty"
    assert not Path(first["cache"]).exists(), "the cold cache is deleted after the run"
    assert first["extra"] == "yes" and second["extra"] is None
    assert Path(first["cwd"]) == config.REPO_ROOT


def test_warm_run_keeps_the_callers_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert fresh.run_script(CACHE_PROBE, cold=False)["cache"] == str(tmp_path)


def test_child_imports_this_course_utils_and_gets_arguments():
    out = fresh.run_script("import sys, json, course_utils\nprint(json.dumps({'file': course_utils.__file__, "
                           "'args': sys.argv[1:]}))", args=["a", 3])
    assert Path(out["file"]).parent == config.REPO_ROOT / "course_utils" and out["args"] == ["a", "3"]


def test_child_env_does_not_touch_os_environ(tmp_path):
    before = dict(os.environ)
    env = fresh.child_env({"X_COURSE": "1"}, tmp_path)
    assert os.environ == before
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path) and env["TRITON_CACHE_DIR"].startswith(str(tmp_path))
    assert env["X_COURSE"] == "1" and str(config.REPO_ROOT) in env["PYTHONPATH"].split(os.pathsep)
    with pytest.raises(TypeError, match="strings"):
        fresh.child_env({"X_COURSE": 1})


@pytest.mark.parametrize("source, error, match", [
    ("import sys\nsys.stderr.write('boom here')\nsys.exit(3)", RuntimeError, "exit code 3:\nboom here"),
    ("print('not json')", ValueError, "not JSON"),
    ("pass", ValueError, "printed nothing"),
    ("print('[1, 2]')", ValueError, "JSON object"),
    ("   ", ValueError, "non-empty"),
])
def test_failures_are_clear(source, error, match):
    with pytest.raises(error, match=match):
        fresh.run_script(source)


def test_last_json_reads_the_last_line_only():
    assert fresh.last_json('{"a": 1}\nlog line\n{"b": 2}\n\n') == {"b": 2}


# ---- tlparse ------------------------------------------------------------------------------------

TRACED = """
import json, torch
def f(x, n):
    y = torch.sin(x)
    print("a graph break")
    return y * n
g = torch.compile(f, backend="eager")
g(torch.randn(4), 2)
g(torch.randn(4, 2), 2)      # another rank: a recompilation
print(json.dumps({"ok": True}))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("trace")
    assert fresh.run_script(TRACED, env={"TORCH_TRACE": str(trace_dir)})["ok"]
    logs = trace_report.trace_logs(trace_dir)
    out = tmp_path_factory.mktemp("report") / "tl_out"
    return trace_report.render(logs[-1], out), logs


def test_tlparse_is_installed():
    binary = trace_report.tlparse_binary()
    assert binary.exists() and os.access(binary, os.X_OK)


def test_render_writes_an_index_and_a_compile_directory(report):
    index, logs = report
    out = index.parent
    assert len(logs) == 1 and index.name == "index.html"
    pages = trace_report.pages(out)
    assert Path("index.html") in pages and all(not p.is_absolute() for p in pages)
    directory = json.loads((out / "compile_directory.json").read_text())
    names = [a["name"] for entry in directory.values() for a in entry["artifacts"]]
    assert any("graph_break" in n for n in names) and any("recompile_reasons" in n for n in names)


def test_render_replaces_an_existing_report(report, tmp_path):
    _, logs = report
    out = tmp_path / "again"
    out.mkdir()
    (out / "stale.html").write_text("old")
    trace_report.render(logs[0], out)
    assert not (out / "stale.html").exists()


def test_trace_and_render_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="TORCH_TRACE"):
        trace_report.trace_logs(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a trace file"):
        trace_report.render(tmp_path / "missing.log", tmp_path / "out")
    bad = tmp_path / "dedicated_log_torch_trace_x.log"
    bad.write_bytes(b"\x00\x01 not a trace")
    try:
        index = trace_report.render(bad, tmp_path / "out")
    except RuntimeError as err:
        assert "tlparse failed" in str(err)
    else:  # tlparse tolerates unknown lines: then the report has no compile IDs
        assert json.loads((index.parent / "compile_directory.json").read_text()) in ({}, [])


def test_missing_tlparse_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(trace_report.shutil, "which", lambda name: None)
    monkeypatch.setattr(trace_report.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match="pip install"):
        trace_report.tlparse_binary()
