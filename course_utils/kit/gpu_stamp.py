"""Write README's "last passed on a GPU" column from a GPU check's summary.

``python -m course_utils.kit.gpu_check`` ends with ``summary.json``: per notebook how it ran on the GPU
machine (whole under nbval, or its GPU cells alone) and whether it passed, with the machine's torch
and GPU. This module writes, for each notebook in README's notebook map, the column
``last passed on a GPU (torch, GPU, date)``:

- ``torch 2.11.0+cu130, NVIDIA H200 (sm_90), 2026-12-04 (whole)`` for a notebook that passed whole;
- ``... (GPU cells alone)`` for one whose GPU cells alone ran and passed;
- a notebook that failed, or that the check left out, keeps what the column said before (an
  earlier pass, or ``not yet``).

A dry run (``--dry-run``, no GPU) is refused: it proves nothing about a GPU. Usage::

    python -m course_utils.kit.gpu_stamp [build/gpu-check/summary.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_utils import config
from ..text import counted

GPU_HEADER = "last passed on a GPU (torch, GPU, date)"
CPU_HEADER = "last passed (torch, date)"
NOT_YET = "not yet"


def passed_cells(summary: dict[str, Any]) -> dict[str, str]:
    """Return {notebook stem: the column's text} for each notebook the summary shows passing on a GPU.

    Raises ValueError for a dry run or a summary without the machine's torch, GPU and date.
    """
    if summary.get("dry_run"):
        raise ValueError("this summary is a dry run (COURSE_DEVICE=cpu): it says nothing about a GPU")
    missing = [k for k in ("torch", "gpu", "date") if not summary.get(k) or summary.get(k) == "none"]
    if missing:
        raise ValueError(f"the summary lacks {', '.join(missing)}: write it with a current gpu_check")
    cells_by_nb: dict[str, list[dict[str, Any]]] = {}
    for cell in summary.get("cells", []):
        cells_by_nb.setdefault(cell["label"].split(":")[0], []).append(cell)
    stamped = {}
    for nb in summary.get("notebooks", []):
        if nb["failed"] or not nb.get("passed") or nb["mode"] not in ("whole", "GPU cells alone"):
            continue
        own = cells_by_nb.get(nb["stem"], [])
        if any(not c["outcome"].startswith("ran") for c in own if c["outcome"] != "left out"):
            continue  # a GPU cell skipped on a GPU machine: not a pass of the GPU path
        stamped[nb["stem"]] = f"torch {summary['torch']}, {summary['gpu']}, {summary['date']} ({nb['mode']})"
    return stamped


def stamp_readme(readme: str, stamped: dict[str, str]) -> str:
    """Return README with the GPU column added (if missing) before the CPU one and filled from ``stamped``."""
    out, in_table = [], False
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and cells[0] == "notebook" and CPU_HEADER in cells:
            in_table = True
            if GPU_HEADER not in cells:
                cells.insert(cells.index(CPU_HEADER), GPU_HEADER)
            gpu_col = cells.index(GPU_HEADER)
        elif in_table and not cells:
            in_table = False
        elif in_table and cells and set(cells[0]) <= {"-", ":"}:
            out.append("|" + "---|" * (gpu_col + 2))
            continue
        elif in_table and cells:
            if len(cells) == gpu_col + 1:  # a row without the column yet
                cells.insert(gpu_col, NOT_YET)
            stem = cells[0].split("`")[1].removesuffix(".ipynb") if "`" in cells[0] else ""
            if stem in stamped:
                cells[gpu_col] = stamped[stem]
        if cells:
            line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out) + ("\n" if readme.endswith("\n") else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Stamp README from a GPU check's summary; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.gpu_stamp", description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, nargs="?", default=config.REPO_ROOT / "build" / "gpu-check" / "summary.json")
    parser.add_argument("--readme", type=Path, default=config.REPO_ROOT / "README.md")
    args = parser.parse_args(argv)
    try:
        stamped = passed_cells(json.loads(args.summary.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {args.summary}: {err}", file=sys.stderr)
        return 1
    args.readme.write_text(stamp_readme(args.readme.read_text(encoding="utf-8"), stamped), encoding="utf-8")
    print(f"{counted(len(stamped), 'notebook')} stamped as passed on a GPU in {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
