"""Render a ``TORCH_TRACE`` log into tlparse's HTML report, offline, and list its pages.

Answers "what did the compiler do in that run?" in a form people attach to bug reports. Running
a program with ``TORCH_TRACE=<folder>`` makes torch write one structured log per process there;
``tlparse`` (a Rust program shipped in the ``tlparse`` wheel) turns a log into ``index.html``, one
folder per compile ID and ``compile_directory.json``, the machine-readable table of contents.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

#: The file name torch gives each process's structured trace inside the TORCH_TRACE folder.
LOG_GLOB = "dedicated_log_torch_trace_*.log"


def tlparse_binary() -> Path:
    """Return the path of the ``tlparse`` program: on PATH, or beside this Python (a venv's bin/).

    FileNotFoundError says how to install it when it is in neither place.
    """
    beside = Path(sys.executable).parent / "tlparse"
    found = shutil.which("tlparse") or (str(beside) if beside.exists() else None)
    if found is None:
        raise FileNotFoundError("tlparse is not installed: `pip install -c constraints.txt tlparse` "
                                "(the wheel ships the program; no network is needed to run it)")
    return Path(found)


def trace_logs(trace_dir: str | Path) -> list[Path]:
    """Return the trace logs in ``trace_dir``, oldest first; FileNotFoundError when there are none."""
    folder = Path(trace_dir)
    logs = sorted(folder.glob(LOG_GLOB), key=lambda p: (p.stat().st_mtime, p.name)) if folder.is_dir() else []
    if not logs:
        raise FileNotFoundError(f"no {LOG_GLOB} in {folder}: was the program run with TORCH_TRACE={folder}, "
                                "and did it compile anything?")
    return logs


def render(log: str | Path, out_dir: str | Path, timeout: float = 300) -> Path:
    """Return the ``index.html`` of tlparse's report on ``log`` (a trace file), written to ``out_dir``.

    ``out_dir`` is replaced if it exists. RuntimeError carries tlparse's message when it fails.
    """
    log, out = Path(log), Path(out_dir)
    if not log.is_file():
        raise FileNotFoundError(f"{log} is not a trace file; pick one with trace_logs(folder)")
    proc = subprocess.run([str(tlparse_binary()), str(log), "-o", str(out), "--overwrite", "--no-browser"],
                          capture_output=True, text=True, timeout=timeout)
    index = out / "index.html"
    if proc.returncode != 0 or not index.exists():
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"tlparse failed on {log} (exit code {proc.returncode}): {message[0] if message else ''}")
    return index


def pages(out_dir: str | Path) -> list[Path]:
    """Return the HTML pages of a rendered report, relative to ``out_dir``, sorted."""
    root = Path(out_dir)
    return sorted(p.relative_to(root) for p in root.rglob("*.html"))
