"""How many minutes of class each notebook needs: the budget behind the instructor guide's agendas.

A notebook's slot in a workshop is the sum of four parts, each computed from the notebook itself
or from a measurement, never guessed:

- **reading**: the words of its Markdown cells at ``WORDS_PER_MINUTE`` (careful reading of
  technical prose on a screen, slower than reading a novel), rounded up;
- **exercises**: its distinct *Check yourself* exercises (each ``exercises.check("NN.name", ...)``
  id counts once) at ``MINUTES_PER_EXERCISE`` each: read the task, write a few lines, check, retry;
- **discussion**: the instructor's introduction, the walk through the code cells and questions
  (``DISCUSSION_MINUTES``; less for the set-up notebook);
- **machine**: the notebook's quick-mode minutes from README's notebook table (measured by
  ``make stamp`` on the reference machine), rounded up; learners mostly read while a cell runs,
  so counting it in full is the cautious side.

``python -m course_utils.kit.agenda`` prints the table that ``docs/instructor.md`` shows;
``tests/test_instructor_agenda.py`` checks the guide against it. ``--slow-cells FOLDER`` lists the
cells of executed notebooks (``make workshop-check`` leaves them in ``build/workshop/executed``)
that ran longer than ``--over`` seconds, from the timestamps the notebook client records per cell:
the cells an instructor fills with a word about what is happening.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from .stamp import stated_minutes

WORDS_PER_MINUTE = 200
MINUTES_PER_EXERCISE = 6
DISCUSSION_MINUTES = 10
#: Notebooks that need less discussion than the rest: 00 is the set-up check.
DISCUSSION_OVERRIDES = {"00": 5}

#: A word: a run of non-space characters holding at least one letter or digit (so a table's
#: ``|`` and ``---`` are not words, and ``torch.compile`` is one).
_WORD = re.compile(r"\S*[A-Za-z0-9]\S*")
_EXERCISE = re.compile(r"""exercises\.check\(\s*["'](\d\d\.\w+)["']""")


@dataclass(frozen=True)
class Budget:
    """One notebook's minutes in class, part by part."""

    notebook: str
    words: int
    reading: int
    exercises: int
    exercise_minutes: int
    discussion: int
    machine: int

    @property
    def total(self) -> int:
        """Return the notebook's slot in an agenda: reading + exercises + discussion + machine."""
        return self.reading + self.exercise_minutes + self.discussion + self.machine


def _cells(nb: dict[str, Any], kind: str) -> list[str]:
    return ["".join(c.get("source", "")) for c in nb.get("cells", []) if c.get("cell_type") == kind]


def markdown_words(nb: dict[str, Any]) -> int:
    """Return the number of words in a notebook's Markdown cells (``nb`` is the parsed .ipynb)."""
    return sum(len(_WORD.findall(text)) for text in _cells(nb, "markdown"))


def exercise_ids(nb: dict[str, Any]) -> list[str]:
    """Return the distinct exercise ids its code cells check (``exercises.check("NN.name", ...)``), sorted."""
    return sorted({m for text in _cells(nb, "code") for m in _EXERCISE.findall(text)})


def budget(path: Path, quick_minutes: float) -> Budget:
    """Return the class budget of notebook ``path``, whose quick-mode run takes ``quick_minutes``."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read notebook {path}: {err}") from err
    words = markdown_words(nb)
    exercises = len(exercise_ids(nb))
    number = path.name[:2]
    return Budget(notebook=path.name, words=words, reading=math.ceil(words / WORDS_PER_MINUTE),
                  exercises=exercises, exercise_minutes=exercises * MINUTES_PER_EXERCISE,
                  discussion=DISCUSSION_OVERRIDES.get(number, DISCUSSION_MINUTES),
                  machine=math.ceil(quick_minutes))


def course_budgets(root: Path | None = None) -> list[Budget]:
    """Return the budget of every course notebook, with machine minutes from README's table.

    Raises ValueError when README states no quick-mode minutes for a notebook.
    """
    root = root or config.REPO_ROOT
    stated = stated_minutes((root / "README.md").read_text(encoding="utf-8"))
    out = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        quick = stated.get(path.name, ("?", "?", "?"))[2]
        try:
            minutes = float(quick)
        except ValueError:
            raise ValueError(f"README's notebook table states no quick-mode minutes for {path.name}; "
                             "run `make workshop-check JOBS=1` and `make stamp` first") from None
        out.append(budget(path, minutes))
    return out


HEADER = ("| notebook | Markdown words | reading | exercises | exercise minutes | discussion "
          "| machine (quick mode) | minutes in class |")


def table(budgets: list[Budget]) -> str:
    """Return the budgets as the Markdown table the instructor guide shows."""
    rows = [HEADER, "|" + "---|" * 8]
    for b in budgets:
        rows.append(f"| {b.notebook[:2]} | {b.words} | {b.reading} | {b.exercises} | {b.exercise_minutes} "
                    f"| {b.discussion} | {b.machine} | {b.total} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class SlowCell:
    """A code cell that ran for a long time, and where it is."""

    notebook: str
    index: int  #: position among all the notebook's cells, from 0
    section: str  #: the last Markdown heading above it
    first_line: str
    seconds: float


def _when(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def cell_seconds(nb: dict[str, Any], name: str = "") -> list[SlowCell]:
    """Return every timed code cell of an executed notebook with its seconds (input received to
    reply sent, as nbclient records them in ``metadata.execution``); untimed cells are left out."""
    out, section = [], ""
    for index, cell in enumerate(nb.get("cells", [])):
        source = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            section = next((h for h in reversed(re.findall(r"^#+\s+(.*)$", source, re.M))), section)
            continue
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.get("cell_type") != "code" or not (start and end):
            continue
        first = next((ln.strip() for ln in source.splitlines() if ln.strip() and not ln.startswith("# NBVAL")), "")
        out.append(SlowCell(name, index, section, first[:80], round((_when(end) - _when(start)).total_seconds(), 1)))
    return out


def slow_cells(folder: Path, over: float = 30.0) -> list[SlowCell]:
    """Return the code cells of the executed notebooks in ``folder`` that ran ``over`` seconds or
    longer, in course order. Raises ValueError when the folder holds no notebook."""
    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise ValueError(f"no executed notebooks in {folder}; run `make workshop-check` first "
                         "(it leaves them in build/workshop/executed)")
    found = []
    for path in paths:
        found += [c for c in cell_seconds(json.loads(path.read_text(encoding="utf-8")), path.name) if c.seconds >= over]
    return found


def main(argv: list[str] | None = None) -> int:
    """Print the budget table, or with ``--slow-cells`` the long cells of executed notebooks."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.agenda", description=__doc__.split("\n")[0])
    parser.add_argument("--slow-cells", type=Path, metavar="FOLDER", help="executed notebooks to read cell times from")
    parser.add_argument("--over", type=float, default=30.0, help="seconds a cell must run to be listed (default 30)")
    args = parser.parse_args(argv)
    try:
        if args.slow_cells is not None:
            for c in slow_cells(args.slow_cells, args.over):
                print(f"{c.notebook} cell {c.index} ({c.section}): {c.seconds:.1f} s  | {c.first_line}")
            return 0
        budgets = course_budgets()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"reading at {WORDS_PER_MINUTE} words per minute, {MINUTES_PER_EXERCISE} minutes per exercise, "
          f"{DISCUSSION_MINUTES} minutes of discussion ({DISCUSSION_OVERRIDES} for the set-up)")
    print(table(budgets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
