"""Classroom readiness: can this machine run the whole course, offline, in time?

``make workshop-check`` (``python -m course_utils workshop-check``) runs the doctor, then
executes every notebook in quick mode in a fresh kernel with the network blocked (which
also warms the compile caches for the class), prints one line per notebook, and ends
with READY or NOT READY and what to fix. ``--jobs 2`` (the Makefile's default, ``JOBS``) runs
two notebooks at a time, each still alone in its own kernel; the pace check then compares the
elapsed time with the reference machine's run of the same command (README's workshop line),
since per-notebook seconds measured side by side are not the table's one-at-a-time figures.

"Network blocked" means one of two things, and the output says which: with ``--netns``
(``make workshop-check NETNS=1``) on Linux, the check runs in an empty network namespace, so
nothing can reach another machine; otherwise (or where the OS refuses a namespace) the Python
guard of ``course_utils.kit.offline`` refuses connections and lookups beyond loopback in the
kernels, which catches accidental downloads but is not a sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .. import config
from . import netns
from .runner import NotebookRun, course_notebooks, run_course, write_summary

#: The whole course in quick mode should fit in this many seconds on a 2-core laptop.
QUICK_BUDGET_S = 12 * 60
#: Slower than the reference machine by more than this factor: the stated times will not hold.
SLOW_FACTOR = 1.5


#: What the two kinds of "offline" mean, for the output.
NETWORK_REMOVED = "network removed: an empty network namespace, only loopback"
GUARD_ONLY = ("Python guard only: kernels refuse connections and lookups beyond loopback, which "
              "catches accidental downloads; it is not a sandbox (native code can still reach the "
              "network). On Linux, `make workshop-check NETNS=1` removes the network for real")


def network_line() -> str:
    """Return how this process is kept offline: the network really removed, or the guard only."""
    return NETWORK_REMOVED if netns.network_removed() else GUARD_ONLY


def verdict(doctor_failures: Sequence[str], runs: Sequence[NotebookRun],
            budget_s: float = QUICK_BUDGET_S,
            network: str = "Python guard", stated: dict[str, float] | None = None,
            jobs: int = 1, wall_s: float | None = None,
            stated_wall_s: float | None = None) -> tuple[bool, list[str]]:
    """Return (ready, lines to print): READY only when the doctor and every notebook pass.

    With ``jobs`` > 1 the total is the elapsed ``wall_s`` and the pace compares it with
    ``stated_wall_s`` (the reference machine's run with as many jobs); one at a time, the total
    is the notebooks' sum and the pace compares each with ``stated``."""
    fixes = list(doctor_failures)
    tails: dict[str, list[str]] = {}
    for run in runs:
        if not run.ok:
            fixes.append(f"{run.notebook} failed ({run.error}); see the failing cell with "
                         f"`make test-nb NB=notebooks/{run.notebook}`")
            tails[fixes[-1]] = run.output_tail or []
    if not runs:
        fixes.append("no notebooks found under notebooks/")
    total = wall_s if wall_s is not None else sum(r.seconds for r in runs)
    at_once = f", {jobs} at a time" if jobs > 1 else ""
    lines = []
    if fixes:
        lines.append("NOT READY. Fix, then run `make workshop-check` again:")
        for fix in fixes:
            lines.append(f"  - {fix}")
            lines += [f"      | {line}" for line in tails.get(fix, [])]  # what the failing cell printed last
    else:
        lines.append(f"READY: the doctor passed and all {len(runs)} notebooks ran offline "
                     f"({network}) in quick mode in {total / 60:.1f} min{at_once}.")
    if runs and total > budget_s:
        lines.append(f"  note: {total / 60:.1f} min is over the {budget_s / 60:.0f}-minute budget "
                     "for a 2-core laptop; plan for slower machines or a second warm-up run.")
    if jobs > 1 and runs:
        lines += wall_pace_lines(total, stated_wall_s, jobs)
        if fixes:
            lines.append("  (this run had failures, so its elapsed time is not a whole check's)")
    elif runs:
        lines += pace_lines(runs, stated or {})
    return not fixes, lines


def wall_pace_lines(wall_s: float, stated_wall_s: float | None, jobs: int,
                    slow_factor: float = SLOW_FACTOR) -> list[str]:
    """Return the pace line of a run with ``jobs`` notebooks at a time: its elapsed time against
    the reference machine's (None: README states none, so no comparison)."""
    if not stated_wall_s:
        return [f"  pace: README states no reference time for {jobs} notebooks at a time; "
                "run with --jobs 1 to compare notebook by notebook."]
    factor = wall_s / stated_wall_s
    if factor <= slow_factor:
        return [f"  pace: {factor:.1f}x the reference machine's time for this check "
                f"({stated_wall_s / 60:.1f} min, {jobs} at a time); the times the course states should hold here."]
    return [f"  WARNING: this machine took {factor:.1f}x the reference machine's time for this check "
            f"({wall_s / 60:.1f} vs {stated_wall_s / 60:.1f} min, {jobs} at a time), so the times README and each "
            f"notebook state will not hold here: expect about {factor:.1f}x them (first runs and full mode too). "
            "`--jobs 1` names the notebooks furthest behind. A busy machine (close other programs) or a laptop "
            "on battery saving is the usual cause."]


def pace_lines(runs: Sequence[NotebookRun], stated: dict[str, float],
               slow_factor: float = SLOW_FACTOR) -> list[str]:
    """Return a warning when this machine ran quick mode more than ``slow_factor`` times slower than
    the reference machine's stated times (README's table), naming the notebooks furthest behind."""
    pairs = [(r.notebook, r.seconds, stated[r.notebook]) for r in runs if r.ok and stated.get(r.notebook)]
    if not pairs:
        return []
    factor = sum(mine for _, mine, _ in pairs) / sum(ref for _, _, ref in pairs)
    if factor <= slow_factor:
        return [f"  pace: {factor:.1f}x the reference machine's quick-mode time (README's table); "
                "the times the course states should hold here."]
    worst = sorted(pairs, key=lambda p: p[1] / p[2], reverse=True)[:3]
    return [f"  WARNING: this machine took {factor:.1f}x the reference machine's quick-mode time, so the "
            f"times README and each notebook state will not hold here: expect about {factor:.1f}x them "
            "(first runs and full mode too). Slowest against the reference: "
            + ", ".join(f"{name} {mine:.0f} s vs {ref:.0f} s" for name, mine, ref in worst)
            + ". A busy machine (close other programs) or a laptop on battery saving is the usual cause."]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the readiness check; exit status 0 for READY, 1 for NOT READY."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils workshop-check")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every course notebook)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the summary and executed copies (default build/workshop)")
    parser.add_argument("--netns", action="store_true",
                        help="run in an empty network namespace (Linux, unshare) so nothing can "
                             "download; falls back to the Python guard, saying so, where the OS refuses")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once, each in its own kernel (default 1; the Makefile passes JOBS=2)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.netns and not netns.network_removed():
        prefix, how = netns.wrap()
        if prefix is not None:
            print(f"== network: running inside an empty network namespace ({how})", flush=True)
            rest = [a for a in argv if a != "--netns"]
            return subprocess.call([*prefix, sys.executable, "-m", "course_utils", "workshop-check", *rest])
        print(f"== network: no network namespace: {how}. Falling back to the Python guard.", flush=True)
    out = args.out or config.build_dir() / "workshop"
    network = network_line()
    from .. import bench
    from . import doctor

    print("== doctor", flush=True)
    checks = doctor.run_checks()
    for check in checks:
        print(check.line(), flush=True)  # ok, WARN (passes, costs something) or FAIL
    failures = [f"{c.name}: {c.fix}" for c in checks if not c.ok]
    print(f"== notebooks (quick mode; {network})", flush=True)
    paths = args.notebooks or course_notebooks()
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    from .stamp import stated_quick_seconds, stated_workshop_seconds

    readme = (config.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    stated = stated_quick_seconds(readme)
    started = time.perf_counter()
    runs = run_course(paths, quick=True, offline=True, results=results,
                      out_dir=out / "executed", jobs=args.jobs, expected_s=stated)
    wall_s = time.perf_counter() - started
    summary = write_summary(runs, out / "summary.json", jobs=args.jobs, wall_s=wall_s)
    if runs and all(r.ok for r in runs) and not args.notebooks:
        with config.environment(COURSE_RESULTS=os.environ.get("COURSE_RESULTS") or str(results), COURSE_QUICK="1"):
            bench.record("workshop.quick_total_s", summary["wall_s"], "s", notebooks=len(runs),
                         machine=summary["machine"], jobs=args.jobs, notebook_seconds_sum=summary["total_s"])
    ready, lines = verdict(failures, runs, stated=stated,
                           network="network removed" if network == NETWORK_REMOVED else "Python guard only",
                           jobs=args.jobs, wall_s=summary["wall_s"],
                           stated_wall_s=stated_workshop_seconds(readme, args.jobs))
    print("\n".join(lines))
    print(f"(summary: {out / 'summary.json'})")
    return 0 if ready else 1
