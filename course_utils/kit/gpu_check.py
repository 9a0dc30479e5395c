"""The course's GPU check: every GPU cell of every notebook executed on the GPU, in one command.

Made for a GPU machine lent briefly, without network, with its own Python and torch: it runs from
the repository with the machine's ``python3`` and the wheels of ``course_utils.kit.gpu_bundle``
installed beside it (``PYTHONPATH``), or from ``.venv`` on a workstation (``make gpu-check``).
In that order, each step logged to ``<out>/gpu-check.log``:

1. the machine: GPU, driver, torch and the packages the notebooks need (``nvidia-smi`` if present);
2. the GPU unit tests (``GPU_UNIT_TESTS``), under pytest;
3. every notebook whose packages are there, whole, under nbval in quick mode, each in a pytest of
   its own, ``--jobs`` at a time (``COURSE_THREADS`` divides the cores between them, 2 at least);
4. the GPU cells of each notebook that cannot run whole here (a package it needs is not installed:
   ``missing_here``; or ``--cells-only``), each on its own through the notebook's own code
   (``course_utils.kit.gpu_cells``), in a process of its own;
5. a summary, ``summary.md`` and ``summary.json``: for each GPU cell whether it ran, was skipped (and
   the guard's reason, from the log the guards write, ``COURSE_GPU_CELLS``), failed or was never
   reached; for each notebook its cells passed and failed; what was left out, and why.

``COURSE_DEVICE`` is set to ``cuda`` when torch sees CUDA and it is unset, so a GPU torch cannot
see fails the doctor loudly. ``--dry-run`` runs the same path with ``COURSE_DEVICE=cpu``, which keeps
the GPU cells off (on a GPU machine too): every GPU cell is then expected to say it was skipped, and
nothing else may fail.
The exit status is 0 when the check passed (on a GPU: every GPU cell ran or is named as left out).
``--deadline-s`` (540 by default) bounds the whole run, so it fits a device call of 10 minutes with
its summary written; the files are copied to ``$OUT`` after each step when that variable is set.

Usage::

    python -m course_utils.kit.gpu_check [--out build/gpu-check] [--jobs 4] [--only 00 08] [--dry-run]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from course_utils import config
from course_utils.kit import doctor, gpu_bundle, gpu_cells

#: Unit tests that exercise the device code (on a GPU, ``test_gpu_real`` runs for real).
GPU_UNIT_TESTS = ("tests/test_device.py", "tests/test_gpu_cells.py", "tests/test_gpu_real.py")
#: Distributions whose versions the machine section lists.
LISTED = ("torch", "triton", "numpy", "onnx", "onnxruntime", "onnxscript", "torchao", "tlparse",
          "nbval", "ipykernel", "pytest", "pytest-xdist", "transformers")
#: At most this many files are copied to ``$OUT`` (the device tool returns 8).
OUT_FILES = ("summary.md", "summary.json", "gpu-check.log", "junit-notebooks.xml", "junit-unit.xml",
             "gpu-cells.jsonl", "results.jsonl")


class Log:
    """Lines to the terminal and to ``gpu-check.log`` at once (from several threads)."""

    def __init__(self, path: Path, stream: TextIO = sys.stdout):
        self.fh = path.open("w", encoding="utf-8")
        self.stream = stream
        self.lock = threading.Lock()

    def __call__(self, line: str = "") -> None:
        with self.lock:
            for target in (self.stream, self.fh):
                target.write(line + "\n")
                target.flush()

    def close(self) -> None:
        self.fh.close()


def missing_here(stem: str) -> list[str]:
    """Return why notebook ``stem`` cannot run whole here: each package it needs that is not installed.

    A package that ``gpu_bundle.TOO_LARGE`` names comes with that reason (it cannot travel to a lent
    GPU machine); on a workstation with the whole course installed the list is empty.
    """
    reasons = []
    for requirement in gpu_bundle.NEEDS.get(stem, ()):
        name = Requirement(requirement).name
        if doctor.installed_version(name) is None:
            reasons.append(f"{name}: {gpu_bundle.TOO_LARGE.get(canonicalize_name(name), 'not installed here')}")
    return reasons


def run_logged(cmd: Sequence[str], log: Callable[[str], None], env: dict[str, str],
               timeout_s: float) -> tuple[int, float]:
    """Run ``cmd`` from the repository root, each line of its output to ``log``; return (status, seconds).

    A command still running after ``timeout_s`` is killed and gives status 124.
    """
    log(f"$ {' '.join(cmd)}")
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd), cwd=config.REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout_s, kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
        status = proc.wait()
    finally:
        watchdog.cancel()
    if killed.is_set():
        log(f"(killed after {timeout_s:.0f} s)")
        status = 124
    return status, time.monotonic() - start


#: Seconds nbval waits for a notebook's kernel to start (its default, 60, is too short for several at once on 2 cores).
KERNEL_STARTUP_S = 180
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|#x1B\[[0-9;?]*[A-Za-z]")
_RAISED = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit|Failure)\b.*")


def failure_line(text: str) -> str:
    """Return the line of a cell failure that names the exception (``AssertionError: ...``), colour codes removed."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    raised = [ln for ln in lines if _RAISED.match(ln)]
    return (raised[-1] if raised else lines[-1] if lines else "")[:300]


def machine_lines() -> list[str]:
    """Return what the check runs on: GPU, driver, Python, torch and the listed packages' versions."""
    import torch

    from course_utils import device

    lines = [f"python {sys.version.split()[0]} ({sys.executable})",
             f"torch {torch.__version__}, built for {device.torch_build()}, sees: {device.accelerator_description()}",
             f"COURSE_DEVICE={os.environ.get('COURSE_DEVICE', '')!r}, cores {os.cpu_count()}"]
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                                  "--format=csv,noheader"], capture_output=True, text=True, check=False, timeout=30)
            lines.append(f"nvidia-smi: {smi.stdout.strip() or smi.stderr.strip()}")
        except subprocess.TimeoutExpired:
            lines.append("nvidia-smi: no answer within 30 s")
    # AOTInductor for CUDA (notebook 06) compiles with the CUDA toolkit: where is it?
    from torch.utils import cpp_extension

    from ..deploy import cuda_toolkit

    lines.append(f"CUDA_HOME={os.environ.get('CUDA_HOME', '')!r}, torch's guess {cpp_extension.CUDA_HOME!r}, "
                 f"nvcc: {shutil.which('nvcc') or 'not on PATH'}, folder with include/cuda.h: "
                 f"{cuda_toolkit.find_cuda_home() or 'none found'}")
    for name in LISTED:
        try:
            lines.append(f"  {name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"  {name}: not installed")
    return lines


@dataclass
class NotebookResult:
    """One notebook's outcome: how it ran ("whole", "GPU cells alone"), its cells passed and failed."""

    stem: str
    mode: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    first_failure: str = ""
    left_out: str = ""


def read_junit(path: Path, stem: str | None = None) -> dict[str, NotebookResult]:
    """Return per-notebook counts from nbval's JUnit XML (one test case per cell).

    A test case is filed under the notebook its class name or name mentions, else under ``stem``
    (a collection error has no class name). A file that cannot be read or parsed gives one failure
    for ``stem`` saying so, never an exception.
    """
    found: dict[str, NotebookResult] = {}
    if not path.exists():
        return found
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as err:
        if stem:
            found[stem] = NotebookResult(stem, "whole", failed=1, first_failure=f"{path.name} unreadable: {err}")
        return found
    stems = gpu_bundle.notebook_stems()
    for case in root.iter("testcase"):
        where = f"{case.get('classname') or ''} {case.get('name') or ''}"
        owner = next((s for s in stems if s in where), stem or "")
        res = found.setdefault(owner, NotebookResult(owner, "whole"))
        res.seconds += float(case.get("time") or 0)
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            res.failed += 1
            if not res.first_failure:
                res.first_failure = f"{case.get('name')}: {failure_line((bad.get('message') or '') + chr(10) + (bad.text or ''))}"
        elif case.find("skipped") is not None:
            res.skipped += 1
        else:
            res.passed += 1
    return found


@dataclass
class CellOutcome:
    """One GPU cell's outcome in the check: ran, skipped (why), failed, not reached, or left out (why)."""

    label: str
    what: str
    outcome: str
    detail: str = ""


def cell_outcomes(log_path: Path, whole: Sequence[str], alone: dict[str, list[dict]],
                  junit: dict[str, NotebookResult], left_out: dict[str, str]) -> list[CellOutcome]:
    """Return the outcome of every GPU cell of the course, from the guards' log and the stand-alone runs."""
    decided: dict[str, dict] = {}
    if log_path.exists():
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
                decided[entry["what"]] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by a killed kernel: that cell then reads "not reached"
    out = []
    for cell in gpu_cells.all_guarded():
        if cell.stem in alone:
            run = next((r for r in alone[cell.stem] if r["label"] == cell.label), None)
            if run is None:
                out.append(CellOutcome(cell.label, cell.what, "not reached", "its stand-alone run gave no result"))
                continue
            detail = run["error"].strip().splitlines()[-1] if run["error"].strip() else \
                next((ln for ln in run["output"].splitlines() if ln.startswith("skipped:")), "")
            out.append(CellOutcome(cell.label, cell.what, run["outcome"] + " (alone)", detail))
        elif cell.stem in whole:
            entry = decided.get(cell.what)
            if entry is None:
                res = junit.get(cell.stem)
                why = f"the notebook stopped earlier: {res.first_failure}" if res and res.failed else "no guard line logged"
                out.append(CellOutcome(cell.label, cell.what, "not reached", why))
            elif entry["ran"]:
                res = junit.get(cell.stem)
                ok = res is not None and res.failed == 0
                out.append(CellOutcome(cell.label, cell.what, "ran" if ok else "ran, notebook failed",
                                       entry["device"] if ok else (res.first_failure if res else "")))
            else:
                out.append(CellOutcome(cell.label, cell.what, "skipped", entry["reason"]))
        else:
            out.append(CellOutcome(cell.label, cell.what, "left out", left_out.get(cell.stem, "not selected")))
    return out


def run_alone(stem: str, env: dict[str, str], log: Callable[[str], None], timeout_s: float) -> list[dict]:
    """Run notebook ``stem``'s GPU cells on their own in a fresh Python; return their results as dicts."""
    code = ("import json, sys\nfrom dataclasses import asdict\nfrom course_utils.kit import gpu_cells\n"
            f"runs = gpu_cells.run_gpu_cells({stem!r})\n"
            "for r in runs:\n    print(r.output, end='')\n    print(r.error, end='')\n"
            "print('GPU-CELLS-JSON ' + json.dumps([asdict(r) for r in runs]))\n")
    captured: list[str] = []

    def tee(line: str) -> None:
        captured.append(line)
        if not line.startswith("GPU-CELLS-JSON "):
            log(line)

    status, _ = run_logged([sys.executable, "-c", code], tee, env, timeout_s)
    for line in captured:
        if line.startswith("GPU-CELLS-JSON "):
            return json.loads(line.split(" ", 1)[1])
    return [asdict(gpu_cells.CellRun(cell.label, cell.what, "failed", error=f"its process ended with status {status}"))
            for cell in gpu_cells.Twin(config.REPO_ROOT / "notebooks" / "src" / f"{stem}.py").guarded()]


def summary_markdown(machine: list[str], unit: tuple[int, float], notebooks: list[NotebookResult],
                     cells: list[CellOutcome], passed: bool, dry_run: bool) -> str:
    """Return the summary as Markdown: the machine, unit tests, notebooks, GPU cells and the verdict."""
    lines = ["# GPU check" + (" (dry run: COURSE_DEVICE=cpu, no GPU used)" if dry_run else ""), "", "## Machine", ""]
    lines += [f"    {m}" for m in machine]
    lines += ["", f"## GPU unit tests: exit status {unit[0]} in {unit[1]:.0f} s", "", "## Notebooks", "",
              "| notebook | how | cells passed | failed | seconds | first failure or what was left out |",
              "|---|---|---|---|---|---|"]
    for nb in notebooks:
        lines.append(f"| {nb.stem} | {nb.mode} | {nb.passed} | {nb.failed} | {nb.seconds:.0f} | "
                     f"{(nb.first_failure or nb.left_out).replace('|', '/')} |")
    lines += ["", "## GPU cells", "", "| cell | what it shows | outcome | detail |", "|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.label} | {c.what} | {c.outcome} | {c.detail.replace('|', '/')} |")
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.outcome] = counts.get(c.outcome, 0) + 1
    lines += ["", "GPU cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
              "", f"**{'PASSED' if passed else 'FAILED'}**", ""]
    return "\n".join(lines)


def verdict(unit_status: int, notebooks: list[NotebookResult], cells: list[CellOutcome], dry_run: bool) -> bool:
    """Return whether the check passed: unit tests and notebooks green, and each GPU cell accounted for.

    On a GPU every selected cell must have run (a guard that says skipped there means torch saw no
    usable GPU), apart from those left out for a named reason; in a dry run every cell must say
    skipped. A notebook that ran no cell at all has not passed.
    """
    if unit_status != 0 or any(nb.failed or (nb.mode == "whole" and nb.passed == 0) for nb in notebooks):
        return False
    for c in cells:
        if c.outcome.startswith(("failed", "not reached", "ran, notebook failed")):
            return False
        if c.outcome.startswith("ran" if dry_run else "skipped"):
            return False
    return True


def run_notebooks(stems: Sequence[str], jobs: int, env: dict[str, str], log: Log, out: Path,
                  cell_timeout_s: int, deadline: float) -> dict[str, NotebookResult]:
    """Run each notebook whole under nbval in a pytest of its own, ``jobs`` at a time; return their results.

    Each run has its own JUnit file (``junit/<stem>.xml``) and ends by ``deadline`` (``time.monotonic``)
    at the latest, so a notebook that hangs costs only itself; its output lines are prefixed with its
    number in the log.
    """
    folder = out / "junit"
    folder.mkdir(exist_ok=True)

    def one(stem: str) -> NotebookResult:
        left = deadline - time.monotonic()
        if left < 30:
            return NotebookResult(stem, "whole", failed=1, first_failure="not started: the check's deadline was near")
        prefix = f"[{stem[:2]}] "
        status, seconds = run_logged(
            # a kernel that starts beside several others on a small machine can take over nbval's default 60 s
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", f"--nbval-cell-timeout={cell_timeout_s}",
             f"--nbval-kernel-startup-timeout={KERNEL_STARTUP_S}", "--junitxml", str(folder / f"{stem}.xml"),
             f"notebooks/{stem}.ipynb"],
            lambda line: log(prefix + line), env, left)
        res = read_junit(folder / f"{stem}.xml", stem).get(stem) or NotebookResult(stem, "whole")
        res.seconds = seconds
        if status == 124:
            res.failed += 1
            res.first_failure = res.first_failure or f"not finished within {left:.0f} s (the check's deadline)"
        elif res.passed + res.failed == 0:
            res.failed = 1
            res.first_failure = f"pytest ended with status {status} and ran no cell (see [{stem[:2]}] in the log)"
        log(f"{prefix}{'passed' if not res.failed else 'FAILED'}: {res.passed} cells passed, {res.failed} failed, "
            f"{seconds:.0f} s")
        return res

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(stems, pool.map(one, stems)))


def merge_junit(folder: Path, target: Path) -> None:
    """Write the test suites of every JUnit file in ``folder`` into one file, ``target`` (unreadable ones left out)."""
    merged = ET.Element("testsuites")
    for path in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError):
            continue
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)


def publish(out: Path) -> None:
    """Copy the check's files to ``$OUT`` (the device tool's return folder) when that is set."""
    target = os.environ.get("OUT")
    if target and Path(target).is_dir():
        for name in OUT_FILES:
            if (out / name).exists():
                shutil.copy2(out / name, Path(target) / name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; return 0 when it passed."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=config.REPO_ROOT / "build" / "gpu-check")
    parser.add_argument("--jobs", type=int, default=4, help="notebooks at a time (default 4)")
    parser.add_argument("--only", nargs="*", default=None, help="notebook numbers to run (default: all)")
    parser.add_argument("--cells-only", nargs="*", default=None,
                        help="notebook numbers whose GPU cells run alone instead of the whole notebook")
    parser.add_argument("--no-unit", action="store_true", help="leave out the GPU unit tests")
    parser.add_argument("--dry-run", action="store_true", help="COURSE_DEVICE=cpu: the same path without a GPU")
    parser.add_argument("--deadline-s", type=float, default=540,
                        help="the whole check ends within this many seconds, summary included (default 540)")
    parser.add_argument("--cell-timeout-s", type=int, default=240,
                        help="limit for one notebook cell (default 240; nbval waits this long on a kernel that died)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    env = dict(os.environ)
    if args.dry_run:
        env["COURSE_DEVICE"] = "cpu"
    elif not env.get("COURSE_DEVICE"):
        import torch

        env["COURSE_DEVICE"] = "cuda" if torch.cuda.is_available() else "cpu"
    os.environ["COURSE_DEVICE"] = env["COURSE_DEVICE"]
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "gpu-check.log").exists():
        parser.error(f"--out {out} holds files but no gpu-check.log: name an empty folder or a GPU check's own")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    guard_log, results = out / "gpu-cells.jsonl", out / "results.jsonl"
    env.update({"COURSE_QUICK": "1", "COURSE_GPU_CELLS": str(guard_log), "COURSE_RESULTS": str(results),
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": config.child_pythonpath(environ=env)})
    log = Log(out / "gpu-check.log")
    start = time.monotonic()
    deadline = start + args.deadline_s - 20  # 20 s for the stand-alone cells' reports and the summary
    log(f"== gpu-check {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}" + (" (dry run)" if args.dry_run else ""))
    machine = machine_lines()
    for line in machine:
        log(line)
    no_gpu = not args.dry_run and env["COURSE_DEVICE"] == "cpu"
    if no_gpu:
        log("torch sees no CUDA GPU here: this run checks nothing about a GPU and cannot pass "
            "(use --dry-run on a machine without one)")

    log("== the course's doctor (logged, not judged: the GPU machine lacks the packages left out below)")
    run_logged([sys.executable, "-m", "course_utils", "doctor"], log, env, 60)

    stems = gpu_bundle.notebook_stems()
    if args.only:
        stems = [s for s in stems if s.split("_")[0] in {o.zfill(2) for o in args.only}]
    blocked = {stem: missing_here(stem) for stem in stems}
    for stem in args.cells_only or ():
        for s_ in stems:
            if s_.startswith(stem.zfill(2)) and not blocked[s_]:
                blocked[s_] = ["asked for with --cells-only"]
    whole = [s for s in stems if not blocked[s]]
    alone = [s for s in stems if blocked[s]]
    left_out = {s: "; ".join(blocked[s]) for s in alone}
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]

    unit = (0, 0.0)
    if not args.no_unit:
        log("== GPU unit tests")
        unit = run_logged([*pytest_cmd, "--junitxml", str(out / "junit-unit.xml"), *GPU_UNIT_TESTS], log, env,
                          min(180, max(10, deadline - time.monotonic())))
        publish(out)

    results_by_nb: dict[str, NotebookResult] = {}
    # first the GPU cells that run alone (seconds each), then the whole notebooks up to the deadline
    alone_runs: dict[str, list[dict]] = {}
    for stem in alone:
        extra = gpu_bundle.NOT_ON_THE_MACHINE.get(stem)
        why = left_out[stem] = left_out[stem] + (f"; {extra}" if extra else "")
        if stem not in gpu_cells.STATE:
            log(f"== {stem}: left out ({why})")
            results_by_nb[stem] = NotebookResult(stem, "left out", left_out=why)
            continue
        log(f"== {stem}: its GPU cells alone ({why})")
        runs = alone_runs[stem] = run_alone(stem, env, log, min(180, max(10, deadline - time.monotonic())))
        failed = [r for r in runs if r["outcome"] in ("failed", "not run")]
        results_by_nb[stem] = NotebookResult(
            stem, "GPU cells alone", passed=len(runs) - len(failed), failed=len(failed),
            seconds=sum(r["seconds"] for r in runs), left_out=why,
            first_failure=failed[0]["error"].strip().splitlines()[-1] if failed else "")

    publish(out)
    if whole:
        jobs = min(args.jobs, len(whole))
        # at least 2 threads each: Inductor writes no OpenMP loops for one thread, and notebook 03 reads them
        nb_env = {**env, "COURSE_THREADS": str(max(2, (os.cpu_count() or 1) // jobs))}
        log(f"== {len(whole)} notebooks whole, quick mode, {jobs} at a time, COURSE_DEVICE={env['COURSE_DEVICE']}")
        results_by_nb.update(run_notebooks(whole, jobs, nb_env, log, out, args.cell_timeout_s, deadline))
        merge_junit(out / "junit", out / "junit-notebooks.xml")
        publish(out)
    notebooks = [results_by_nb[s] for s in stems if s in results_by_nb]
    cells = cell_outcomes(guard_log, whole, alone_runs, results_by_nb, left_out)
    passed = verdict(unit[0], notebooks, cells, args.dry_run) and not no_gpu
    text = summary_markdown(machine, unit, notebooks, cells, passed, args.dry_run)
    (out / "summary.md").write_text(text, encoding="utf-8")
    import torch

    from course_utils import device

    (out / "summary.json").write_text(json.dumps({
        "passed": passed, "dry_run": args.dry_run, "seconds": round(time.monotonic() - start, 1),
        "torch": torch.__version__, "gpu": device.cuda_description(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "jobs": args.jobs, "machine": machine,
        "unit_status": unit[0], "notebooks": [asdict(n) for n in notebooks], "cells": [asdict(c) for c in cells]},
        indent=1) + "\n", encoding="utf-8")
    log(text)
    log(f"== gpu-check {'PASSED' if passed else 'FAILED'} after {time.monotonic() - start:.0f} s")
    log.close()
    publish(out)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
