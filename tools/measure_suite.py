"""Time `make test` from a clean clone and say where the time goes (per test file and notebook).

    python tools/measure_suite.py [--workers N] [--cold] [--keep] [--results build/suite-results.jsonl]

Clones this repository's committed HEAD into a temporary folder, runs `make test` there (the
environment build included, as CI and a newcomer pay it), prints the wall time of the whole command,
the environment build's share, and the slowest test files and notebooks (summed from pytest's JUnit
report), and records the headline result ``suite.make_test_s`` with the clone's own Python.
Run it on a quiet machine: it measures this machine, not the code alone. It times a fixed Python
loop before and after the run and records both (``calibration_before_s``, ``calibration_after_s``),
so that two runs of different days can be told apart from a change in the code.

``--cold`` is what a CI runner sees: the clone gets an empty user cache folder (``XDG_CACHE_HOME``,
so the course's Inductor cache under it starts empty; ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` unset), an empty temporary directory (``TMPDIR``, since Inductor keeps its
precompiled headers in ``<temporary directory>/torchinductor_<user>/precompiled_headers`` whatever cache
folder is set: about 150 MB each, some 10 s of g++ to build, one per set of compiler flags; this user's
own headers are left untouched), pip's download cache is off, and the record says ``cold: true``.
``make report-cold`` (``course_utils.kit.runner``) starts notebooks the same way.
Without it, the run reuses this user's warm compile cache (``~/.cache/pytorch2-course``).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def per_file_seconds(junit: Path) -> dict[str, float]:
    """Return {test file or notebook: summed seconds of its test cases} from a JUnit XML report."""
    totals: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "?").split(".")  # notebooks.00_setup.ipynb, tests.test_x[.TestClass]
        name = ".".join(parts[-2:]) if parts[-1] == "ipynb" else (parts[1] + ".py" if len(parts) > 1 else parts[0])
        totals[name] += float(case.get("time", 0))
    return dict(totals)


def cold_env(env: dict[str, str], cache: Path) -> dict[str, str]:
    """Return ``env`` with every compile cache pointed at the empty folder ``cache``, the temporary
    directory (where Inductor's precompiled headers go) at the empty folder ``cache/tmp``, and pip's cache off."""
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in env.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    return {**out, "XDG_CACHE_HOME": str(cache), "TMPDIR": str(cache / "tmp"), "PIP_NO_CACHE_DIR": "1"}


def cpu_times() -> tuple[float, float] | None:
    """Return (idle, total) CPU time of all cores so far, in clock ticks, from ``/proc/stat`` (None
    where there is none): two readings say what share of a stretch the cores sat idle."""
    try:
        fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user ... steal


def idle_share(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Return the share of CPU time spent idle between two ``cpu_times`` readings (None if either is missing)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def calibration_s(repeats: int = 5, n: int = 10_000_000) -> float:
    """Return the median seconds of a fixed pure-Python loop: how fast this machine runs right now.

    On the 2-core virtual machine the course is measured on, the host's other guests change how fast
    a core runs (one test file took 234 s in one cold run and 128 s in the next, with one 10 s job
    removed in between). Recorded beside the suite's time (before and after it), this says whether two
    runs can be compared; it does not correct either.
    """
    return statistics.median(timeit.repeat("total = 0\nfor i in range(n): total += i", setup=f"n = {int(n)}",
                                           number=1, repeat=repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/measure_suite.py")
    parser.add_argument("--workers", default="2", help="WORKERS for make test (0: one process)")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    parser.add_argument("--cold", action="store_true",
                        help="empty user cache (compile caches) and no pip cache, as on a fresh CI runner")
    parser.add_argument("--results", type=Path, default=REPO / "build" / "suite-results.jsonl")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    clone = Path(tempfile.mkdtemp(prefix="course-suite-"))
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    junit = clone / "build" / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PYTEST_"))}
    # not under the temporary directory: the suite checks that the course's cache never is (a reboot empties it)
    cold_cache = REPO / "build" / f"suite-cold-cache-{os.getpid()}"
    if args.cold:
        env = cold_env(env, cold_cache)
    speed_before = calibration_s()
    start, cpu_start = time.perf_counter(), cpu_times()
    setup = subprocess.run(["make", "setup"], cwd=clone, env=env)
    setup_s, cpu_setup = time.perf_counter() - start, cpu_times()
    test = subprocess.run(["make", "test", f"WORKERS={args.workers}", f"PYTEST_ARGS=--junitxml={junit}"],
                          cwd=clone, env=env) if setup.returncode == 0 else setup
    total_s, cpu_end = time.perf_counter() - start, cpu_times()
    speed_after = calibration_s()
    print(f"\nmake test (clean clone, WORKERS={args.workers}{', cold caches' if args.cold else ''}): {total_s / 60:.1f} min "
          f"({setup_s / 60:.1f} building .venv, {(total_s - setup_s) / 60:.1f} pytest); exit {test.returncode}")
    print(f"machine speed (a fixed Python loop, median of 5): {speed_before:.2f} s before, {speed_after:.2f} s after; "
          "compare runs only at similar speeds")
    idle = {part: idle_share(a, b) for part, a, b in (("setup", cpu_start, cpu_setup), ("pytest", cpu_setup, cpu_end))}
    if None not in idle.values():
        print(f"cores idle: {idle['setup']:.0%} of the environment build, {idle['pytest']:.0%} of pytest "
              "(time the suite's processes spent waiting, or one core working alone)")
    if junit.exists():
        args.results.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(junit, args.results.parent / "suite-junit.xml")  # per test case, for a closer look
        files = per_file_seconds(junit)
        notebooks = sum(v for k, v in files.items() if k.endswith(".ipynb"))
        print(f"summed test time: notebooks {notebooks / 60:.1f} min, unit tests "
              f"{(sum(files.values()) - notebooks) / 60:.1f} min (summed over workers)")
        for name, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {seconds:7.1f} s  {name}")
    if test.returncode == 0:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        code = ("import sys; from course_utils import bench; bench.record('suite.make_test_s', float(sys.argv[1]), "
                "'s', workers=sys.argv[2], setup_s=float(sys.argv[3]), cold=sys.argv[4] == '1', "
                "calibration_before_s=float(sys.argv[5]), calibration_after_s=float(sys.argv[6]))")
        subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", code, str(total_s), args.workers, str(setup_s),
                        "1" if args.cold else "0", f"{speed_before:.3f}", f"{speed_after:.3f}"],
                       cwd=clone, env={**env, "COURSE_RESULTS": str(args.results.resolve())}, check=True)
        print(f"recorded suite.make_test_s in {args.results}")
    shutil.rmtree(cold_cache, ignore_errors=True)
    if args.keep:
        print(f"clone kept at {clone}")
    else:
        shutil.rmtree(clone, ignore_errors=True)
    return test.returncode


if __name__ == "__main__":
    sys.exit(main())
