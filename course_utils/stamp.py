"""Write the measured times and the "last passed" stamp into README's notebook table.

Reads the summaries that ``make workshop-check`` (quick mode) and ``make report``
(full mode) write, and rewrites, for each notebook that passed, its minutes column
("full / quick") and its last column ("torch 2.14.1, 2026-11-30"). Nothing in those
columns is typed by hand; ``make stamp`` regenerates them from the latest runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import config

NOTEBOOK_RE = re.compile(r"(\d\d_[A-Za-z0-9_]+\.ipynb)")
STAMP_HEADER = "last passed (torch, date)"


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 60:.1f}"


def load_summary(path: Path | None) -> dict[str, Any] | None:
    """Return a run summary, or None when ``path`` is None or missing."""
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _passed(summary: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not summary:
        return {}
    return {r["notebook"]: r for r in summary["runs"] if r["ok"]}


def stamp_table(readme: str, quick: dict[str, Any] | None, full: dict[str, Any] | None) -> tuple[str, int]:
    """Return README text with the notebook table stamped, and how many rows were stamped."""
    quick_ok, full_ok = _passed(quick), _passed(full)
    out, stamped, in_table = [], 0, False
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and cells[0] == "notebook":
            in_table = True
            if cells[-1] != STAMP_HEADER:
                cells.append(STAMP_HEADER)
            line = "| " + " | ".join(cells) + " |"
        elif cells and set(cells[0]) <= {"-", ":"} and in_table:
            line = "|" + "---|" * (len(out[-1].strip().strip("|").split("|")))
        elif in_table and cells:
            match = NOTEBOOK_RE.search(cells[0])
            if len(cells) == 4:
                cells.append("")
            if match and (match.group(1) in quick_ok or match.group(1) in full_ok):
                name = match.group(1)
                q, f = quick_ok.get(name), full_ok.get(name)
                old_full, old_quick = (cells[2].split("/") + ["", ""])[:2]
                cells[2] = (f"{_minutes(f['seconds']) if f else old_full.strip() or '?'} / "
                            f"{_minutes(q['seconds']) if q else old_quick.strip() or '?'}")
                src = quick if q else full
                modes = "+".join(m for m, r in (("quick", q), ("full", f)) if r)
                cells[-1] = f"torch {src['torch']}, {src['date']} ({modes})"  # type: ignore[index]
                stamped += 1
            line = "| " + " | ".join(cells) + " |"
        elif in_table and not cells:
            in_table = False
        out.append(line)
    return "\n".join(out) + "\n", stamped


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils stamp [--quick FILE] [--full FILE]``."""
    import argparse

    build = config.build_dir(create=False)
    parser = argparse.ArgumentParser(prog="python -m course_utils stamp")
    parser.add_argument("--quick", type=Path, default=build / "workshop" / "summary.json")
    parser.add_argument("--full", type=Path, default=build / "report" / "summary.json")
    parser.add_argument("--readme", type=Path, default=config.REPO_ROOT / "README.md")
    args = parser.parse_args(argv)
    quick, full = load_summary(args.quick), load_summary(args.full)
    if quick is None and full is None:
        print(f"no run summaries ({args.quick}, {args.full}): run `make workshop-check` "
              "and/or `make report` first")
        return 1
    text, n = stamp_table(args.readme.read_text(encoding="utf-8"), quick, full)
    args.readme.write_text(text, encoding="utf-8")
    print(f"stamped {n} notebook rows in {args.readme}")
    return 0
