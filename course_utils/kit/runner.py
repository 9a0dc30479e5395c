"""Execute the course's notebooks one by one, timing each, optionally with the network blocked.

Used by ``make workshop-check`` (quick mode, offline) and ``make report`` (full mode).
Each notebook runs in a fresh kernel of this Python (like ``pytest --nbval-current-env``);
the executed copy goes to the build directory, never over the notebook in git. With ``jobs=2``
two kernels run at once (each notebook still alone in its own kernel, top to bottom); their
seconds are then measured on a shared machine, so the summary says ``jobs`` and ``make stamp``
takes per-notebook minutes only from runs of one notebook at a time.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import config
from .offline import child_env
from ..threads import KERNEL_ENV


@dataclass(frozen=True)
class NotebookRun:
    """The outcome of executing one notebook."""

    notebook: str
    ok: bool
    seconds: float
    mode: str
    error: str | None = None
    #: the failing cell's last output lines (its printout, then the traceback), colour codes removed
    output_tail: list[str] | None = None


#: matplotlib's backend in a Jupyter kernel: figures become image outputs of their cell
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def course_notebooks(folder: Path | None = None) -> list[Path]:
    """Return the course notebooks (``NN_*.ipynb``) in order."""
    folder = folder or config.REPO_ROOT / "notebooks"
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


@contextmanager
def _environment(quick: bool, blocked: bool, results: Path | None) -> Iterator[None]:
    """Set the variables the kernel inherits, and restore them afterwards."""
    # the inline backend, as in Jupyter, so the executed copies keep their figures (a test run's
    # MPLBACKEND=Agg, inherited, would drop them)
    changes = {"COURSE_QUICK": "1" if quick else "0", "MPLBACKEND": INLINE_BACKEND,
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    changes.update({k: os.environ.get(k, v) for k, v in KERNEL_ENV.items()})  # thread policy
    changes["COURSE_PROGRESS"] = os.devnull  # the shipped stubs' "Not yet" is nobody's progress
    # the course's persistent compile cache, or the learner's own (or a cold run's empty one)
    changes.update(config.compile_cache_env())
    if results is not None:
        changes["COURSE_RESULTS"] = str(results)
    if blocked:
        changes.update(child_env())
    with config.environment(**changes):
        yield


#: terminal colour and cursor codes, which tracebacks from a kernel carry
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """Return ``text`` without terminal colour codes."""
    return _ANSI.sub("", text)


def failing_tail(nb: Any, lines: int = 15) -> list[str]:
    """Return the last ``lines`` output lines of the cell that failed (the last cell with an error
    output), colour codes removed: what the cell printed before it failed, then its traceback."""
    for cell in reversed(nb.cells):
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "error" for o in outputs):
            text = []
            for o in outputs:
                if o.get("output_type") == "stream":
                    text += o.get("text", "").splitlines()
                elif o.get("output_type") == "error":
                    text += [ln for tb in o.get("traceback", []) for ln in plain(tb).splitlines()]
            return [plain(ln) for ln in text if ln.strip()][-lines:]
    return []


def _first_error(exc: BaseException) -> str:
    """One readable line from a failed execution (the exception name and message)."""
    text = plain(str(exc)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line.strip()[:300]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def run_notebook(path: Path, *, quick: bool = True, offline: bool = False,
                 results: Path | None = None, out_dir: Path | None = None,
                 cell_timeout: int = 600) -> NotebookRun:
    """Execute ``path`` top to bottom in a fresh kernel and return how it went (never raises on
    a failing cell: the failure is in the result)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    mode = "quick" if quick else "full"
    start = time.perf_counter()
    error, tail = None, None
    with _environment(quick, offline, results):
        try:
            client.execute()
        except Exception as exc:  # a failing cell, a timeout, a dead kernel
            error = _first_error(exc)
            tail = failing_tail(nb) or [ln for ln in plain(str(exc)).splitlines() if ln.strip()][-15:]
    seconds = time.perf_counter() - start
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / path.name)
    return NotebookRun(notebook=path.name, ok=error is None, seconds=round(seconds, 1),
                       mode=mode, error=error, output_tail=tail)


#: Where compiled code, exported models and derived data are kept between runs; ``cold=True``
#: points each at an empty folder. ``TMPDIR`` is among them because torch 2.14 keeps Inductor's
#: precompiled C++ header under the temporary directory, whatever ``TORCHINDUCTOR_CACHE_DIR`` says.
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COURSE_CACHE_DIR", "COURSE_BUILD_DIR", "TMPDIR")


@contextmanager
def _empty_caches(cold: bool) -> Iterator[None]:
    """With ``cold``, give the kernels empty cache and build folders (removed afterwards)."""
    if not cold:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="course-cold-") as tmp:
        folders = {var: str(Path(tmp) / var.lower()) for var in CACHE_VARIABLES}
        for folder in folders.values():
            Path(folder).mkdir()
        with config.environment(**folders):
            yield


def run_course(paths: Sequence[Path], *, quick: bool = True, offline: bool = False,
               results: Path | None = None, out_dir: Path | None = None,
               echo: bool = True, cold: bool = False, jobs: int = 1,
               expected_s: Mapping[str, float] | None = None) -> list[NotebookRun]:
    """Run every notebook in ``paths``, printing one line each as it finishes; return the runs in
    the order of ``paths``.

    ``jobs`` notebooks run at once (each in its own fresh kernel); with more than one, the
    longest first by ``expected_s`` (seconds per notebook name, e.g. README's stated times), so
    the last to finish is a short one. ``cold=True`` runs them as on a machine that never ran the
    course: Inductor's and the course's caches and build folder start empty (and are thrown away
    afterwards), so the times include every first compile and export.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")

    def one(path: Path) -> NotebookRun:
        run = run_notebook(path, quick=quick, offline=offline, results=results, out_dir=out_dir)
        if echo:
            status = "passed" if run.ok else "FAILED"
            tail = f"  {run.error}" if run.error else ""
            print(f"{run.notebook:<28} {status:<7} {run.seconds:7.1f} s{tail}", flush=True)
        return run

    # the environment is set once around the whole run: kernels started in threads inherit it
    with _empty_caches(cold), _environment(quick, offline, results):
        if jobs == 1:
            return [one(path) for path in paths]
        expected = expected_s or {}
        order = sorted(paths, key=lambda p: -expected.get(p.name, 0.0))
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="course-notebook") as pool:
            futures = {pool.submit(one, path): path for path in order}
            done = {futures[f]: f.result() for f in as_completed(futures)}
    return [done[path] for path in paths]


def write_summary(runs: Sequence[NotebookRun], path: Path, *, cold: bool = False, jobs: int = 1,
                  wall_s: float | None = None) -> dict:
    """Write the runs plus torch version, Python, date, machine, CPU class, whether the caches
    started empty, how many notebooks ran at once (``jobs``) and the elapsed time (``wall_s``) to
    ``path`` (JSON); return it. ``total_s`` is the sum of the notebooks' seconds."""
    import platform

    import torch

    from ..cpu import cpu_class

    summary = {
        "date": _dt.datetime.now(_dt.UTC).date().isoformat(),
        "torch": torch.__version__.split("+")[0],
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpu_class": cpu_class(),
        "cold": cold,
        "runs": [asdict(r) for r in runs],
        "total_s": round(sum(r.seconds for r in runs), 1),
        "jobs": jobs,
        "wall_s": round(wall_s if wall_s is not None else sum(r.seconds for r in runs), 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary
