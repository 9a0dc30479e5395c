"""Execute the course's notebooks one by one, timing each, optionally with the network blocked.

Used by ``make workshop-check`` (quick mode, offline) and ``make report`` (full mode).
Each notebook runs in a fresh kernel of this Python (like ``pytest --nbval-current-env``);
the executed copy goes to the build directory, never over the notebook in git.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

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


def course_notebooks(folder: Path | None = None) -> list[Path]:
    """Return the course notebooks (``NN_*.ipynb``) in order."""
    folder = folder or config.REPO_ROOT / "notebooks"
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


@contextmanager
def _environment(quick: bool, blocked: bool, results: Path | None) -> Iterator[None]:
    """Set the variables the kernel inherits, and restore them afterwards."""
    changes = {"COURSE_QUICK": "1" if quick else "0", "MPLBACKEND": "Agg",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    changes.update({k: os.environ.get(k, v) for k, v in KERNEL_ENV.items()})  # thread policy
    if results is not None:
        changes["COURSE_RESULTS"] = str(results)
    if blocked:
        changes.update(child_env())
    with config.environment(**changes):
        yield


def _first_error(exc: BaseException) -> str:
    """One readable line from a failed execution (the exception name and message)."""
    text = str(exc).strip()
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
    error = None
    with _environment(quick, offline, results):
        try:
            client.execute()
        except Exception as exc:  # a failing cell, a timeout, a dead kernel
            error = _first_error(exc)
    seconds = time.perf_counter() - start
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / path.name)
    return NotebookRun(notebook=path.name, ok=error is None, seconds=round(seconds, 1),
                       mode=mode, error=error)


#: Where compiled code, exported models and derived data are kept between runs; ``cold=True``
#: points each at an empty folder.
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COURSE_CACHE_DIR", "COURSE_BUILD_DIR")


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
               echo: bool = True, cold: bool = False) -> list[NotebookRun]:
    """Run every notebook in ``paths`` in order, printing one line each as it finishes.

    ``cold=True`` runs them as on a machine that never ran the course: Inductor's and the course's
    caches and build folder start empty (and are thrown away afterwards), so the times include
    every first compile and export.
    """
    runs = []
    with _empty_caches(cold):
        for path in paths:
            run = run_notebook(path, quick=quick, offline=offline, results=results, out_dir=out_dir)
            runs.append(run)
            if echo:
                status = "passed" if run.ok else "FAILED"
                tail = f"  {run.error}" if run.error else ""
                print(f"{run.notebook:<28} {status:<7} {run.seconds:7.1f} s{tail}", flush=True)
    return runs


def write_summary(runs: Sequence[NotebookRun], path: Path, *, cold: bool = False) -> dict:
    """Write the runs plus torch version, Python, date, machine, CPU class and whether the caches
    started empty to ``path`` (JSON); return it."""
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
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary
