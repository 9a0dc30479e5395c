"""Classroom readiness: can this machine run the whole course, offline, in time?

``make workshop-check`` (``python -m course_utils workshop-check``) runs the doctor, then
executes every notebook in quick mode in a fresh kernel with the network blocked (which
also warms the compile caches for the class), prints one line per notebook, and ends
with READY or NOT READY and what to fix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from . import config
from .runner import NotebookRun, course_notebooks, run_course, write_summary

#: The whole course in quick mode should fit in this many seconds on a 2-core laptop.
QUICK_BUDGET_S = 12 * 60


def verdict(doctor_failures: Sequence[str], runs: Sequence[NotebookRun],
            budget_s: float = QUICK_BUDGET_S) -> tuple[bool, list[str]]:
    """Return (ready, lines to print): READY only when the doctor and every notebook pass."""
    fixes = list(doctor_failures)
    for run in runs:
        if not run.ok:
            fixes.append(f"{run.notebook} failed ({run.error}); see the failing cell with "
                         f"`make test-nb NB=notebooks/{run.notebook}`")
    if not runs:
        fixes.append("no notebooks found under notebooks/")
    total = sum(r.seconds for r in runs)
    lines = []
    if fixes:
        lines.append("NOT READY. Fix, then run `make workshop-check` again:")
        lines += [f"  - {fix}" for fix in fixes]
    else:
        lines.append(f"READY: the doctor passed and all {len(runs)} notebooks ran offline "
                     f"in quick mode in {total / 60:.1f} min.")
    if runs and total > budget_s:
        lines.append(f"  note: {total / 60:.1f} min is over the {budget_s / 60:.0f}-minute budget "
                     "for a 2-core laptop; plan for slower machines or a second warm-up run.")
    return not fixes, lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the readiness check; exit status 0 for READY, 1 for NOT READY."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils workshop-check")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every course notebook)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the summary and executed copies (default build/workshop)")
    args = parser.parse_args(argv)
    out = args.out or config.build_dir() / "workshop"
    from . import bench, doctor

    print("== doctor", flush=True)
    checks = doctor.run_checks()
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}", flush=True)
    failures = [f"{c.name}: {c.fix}" for c in checks if not c.ok]
    print("== notebooks (quick mode, network blocked)", flush=True)
    paths = args.notebooks or course_notebooks()
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    runs = run_course(paths, quick=True, offline=True, results=results,
                      out_dir=out / "executed")
    summary = write_summary(runs, out / "summary.json")
    if runs and all(r.ok for r in runs) and not args.notebooks:
        os.environ["COURSE_RESULTS"] = os.environ.get("COURSE_RESULTS") or str(results)
        os.environ["COURSE_QUICK"] = "1"
        bench.record("workshop.quick_total_s", summary["total_s"], "s",
                     notebooks=len(runs), machine=summary["machine"])
    ready, lines = verdict(failures, runs)
    print("\n".join(lines))
    print(f"(summary: {out / 'summary.json'})")
    return 0 if ready else 1
