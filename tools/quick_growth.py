"""How much did quick mode grow? Notebooks at an older commit and as they are now, timed side by side.

    python tools/quick_growth.py --base REV [--rounds 2] [--record NAME] notebooks/01_torch_compile.ipynb ...

Each round executes every notebook twice in quick mode (``COURSE_QUICK=1``), the version at ``REV``
(from a git worktree of ``REV``, importing that commit's own ``course_utils``, so an API the notebook
used then still exists) and the working tree's, alternating which goes first, in the course's kernel; the first round warms
the compile caches for both, and the later rounds are the ones reported (per notebook: the median
seconds of each version and the growth). A notebook that did not exist at ``REV`` counts from zero.
Both versions run on the same machine in the same minutes, so load on the machine reaches both;
run it on a quiet machine all the same. ``--record NAME`` records the summed growth as a headline
result (``bench.record(NAME, seconds, "s", base=REV, notebooks=...)``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from course_utils import config  # noqa: E402
KERNEL = "pytorch2-course"


def execute(notebook: Path, out_dir: Path, package_root: Path | None = None) -> float:
    """Execute ``notebook`` in quick mode into ``out_dir``; return its wall seconds (raise on failure).

    ``package_root`` (a checkout) goes first on the kernel's PYTHONPATH, so its ``course_utils`` is the
    one imported.
    """
    env = {**os.environ, "COURSE_QUICK": "1", "COURSE_PROGRESS": "/dev/null"}
    if package_root is not None:
        env["PYTHONPATH"] = config.child_pythonpath(package_root, environ=env)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "--output-dir", str(out_dir), f"--ExecutePreprocessor.kernel_name={KERNEL}",
                           "--ExecutePreprocessor.timeout=1800", str(notebook)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{notebook} failed in quick mode:\n{done.stderr[-3000:]}")
    return seconds


def old_copy(worktree: Path, notebook: Path) -> Path | None:
    """Return ``notebook``'s path in the base commit's worktree, or None if it did not exist then."""
    path = worktree / notebook.resolve().relative_to(REPO)
    return path if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/quick_growth.py", description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (before the additions)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the first warms the caches (default 2)")
    parser.add_argument("--record", help="record the summed growth under this headline name")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first only warms the caches)")
    times: dict[str, dict[str, list[float]]] = {nb.name: {"base": [], "now": []} for nb in args.notebooks}
    with tempfile.TemporaryDirectory(prefix="quick-growth-") as tmp:
        work = Path(tmp)
        base = work / "base-checkout"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach", str(base), args.base],
                       check=True)
        try:
            run_rounds(args, times, work, base)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    report(args, times)
    return 0


def run_rounds(args: argparse.Namespace, times: dict[str, dict[str, list[float]]], work: Path, base: Path) -> None:
    """Run the alternating rounds, adding the warm rounds' seconds to ``times``."""
    olds = {nb.name: old_copy(base, nb) for nb in args.notebooks}
    for rnd in range(args.rounds):
        for i, nb in enumerate(args.notebooks):
            order = [("base", olds[nb.name]), ("now", nb)]
            if (rnd + i) % 2:
                order.reverse()
            for label, path in order:
                if path is None:
                    continue
                seconds = execute(path, work / label, base if label == "base" else None)
                print(f"round {rnd + 1}: {nb.name} {label}: {seconds:.1f} s", flush=True)
                if rnd > 0:
                    times[nb.name][label].append(seconds)


def report(args: argparse.Namespace, times: dict[str, dict[str, list[float]]]) -> None:
    """Print each notebook's warm medians and the growth; record the sum when asked."""
    total = 0.0
    print(f"\nquick mode, median of {args.rounds - 1} warm round(s), base {args.base} against the working tree:")
    for name, t in times.items():
        base = statistics.median(t["base"]) if t["base"] else 0.0
        now = statistics.median(t["now"])
        total += now - base
        print(f"  {name}: {base:.1f} s -> {now:.1f} s ({now - base:+.1f} s)")
    print(f"  together: {total:+.1f} s")
    if args.record:
        from course_utils import bench

        bench.record(args.record, total, "s", base=args.base, notebooks=sorted(times), rounds=args.rounds)
        print(f"recorded {args.record}")


if __name__ == "__main__":
    sys.exit(main())
