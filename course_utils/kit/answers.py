"""``python -m course_utils answers [NOTEBOOK] [EXERCISE]``: the exercises' reference solutions, offline.

The source printed is what ``exercises.solution_source(name)`` reveals in a notebook. Without
arguments it lists the exercises, notebook by notebook; with a notebook (``13``, ``13_serving_engine``)
it prints that notebook's solutions; with an exercise too (``locate``, or ``13.locate`` alone) just that
one. A name that does not exist is answered with the valid ones (exit 2).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence


class _Unknown(Exception):
    """A notebook or exercise name that does not exist; the message lists the valid ones."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils answers",
        description="Print the exercises' reference solutions (no arguments: list the exercises).")
    parser.add_argument("notebook", nargs="?", help="a notebook (13, 13_serving_engine) or a full exercise name (13.locate)")
    parser.add_argument("exercise", nargs="?", help="an exercise of that notebook (locate or 13.locate)")
    return parser


def _titles() -> dict[str, str]:
    """Return each notebook number's topic from the notebook files (``13`` -> ``serving_engine``), where they exist."""
    from .. import config

    return {p.stem[:2]: p.stem[3:] for p in (config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def _by_notebook(names: Sequence[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(name.split(".", 1)[0], []).append(name)
    return out


def listing(names: Sequence[str]) -> str:
    """Return the exercises grouped by notebook, with how to print a solution."""
    titles = _titles()
    lines = ["Exercises with a reference solution (python -m course_utils answers NOTEBOOK [EXERCISE]):", ""]
    for nb, members in _by_notebook(names).items():
        lines.append(f"{nb} {titles.get(nb, '')}".rstrip())
        lines += [f"  {name}" for name in members]
    return "\n".join(lines)


def select(names: Sequence[str], notebook: str | None, exercise: str | None) -> list[str]:
    """Return the exercise names that ``notebook`` and ``exercise`` pick; ``_Unknown`` lists the valid ones."""
    groups = _by_notebook(names)
    if notebook is None:
        return list(names)
    notebook = notebook.strip()
    if exercise is None and "." in notebook and not notebook.endswith((".ipynb", ".py")):
        notebook, exercise = notebook.split(".", 1)[0], notebook
    match = re.fullmatch(r"(?:nb)?(\d{1,2})(?:_\w*)?(?:\.ipynb|\.py)?", notebook.rsplit("/", 1)[-1])
    number = match.group(1).zfill(2) if match else notebook
    if number not in groups:
        raise _Unknown(f"no notebook {notebook!r} with exercises; notebooks: {', '.join(groups)}")
    if exercise is None:
        return groups[number]
    full = exercise.strip() if exercise.strip().startswith(number + ".") else f"{number}.{exercise.strip()}"
    if full not in groups[number]:
        raise _Unknown(f"notebook {number} has no exercise {exercise!r}; its exercises: {', '.join(groups[number])}")
    return [full]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the listing or the chosen solutions; return 0, 2 for an unknown name, 1 if a solution cannot be shown."""
    args = _parser().parse_args(argv)
    from course_utils import exercises
    from course_utils.exercises.framework import quiet, summary

    names = exercises.names()
    if args.notebook is None:
        print(listing(names))
        return 0
    try:
        chosen = select(names, args.notebook, args.exercise)
    except _Unknown as err:
        print(f"error: {err}. Run `python -m course_utils answers` for the list.", file=sys.stderr)
        return 2
    status = 0
    for n, name in enumerate(chosen):
        try:
            with quiet():  # some solutions compile or export: keep their logs out of the printout
                source = exercises.solution_source(name)
        except Exception as err:  # noqa: BLE001 - one broken solution should not hide the others
            print(f"error: the solution of {name} could not be shown ({summary(err)})", file=sys.stderr)
            status = 1
            continue
        print(("\n" if n else "") + f"# {name}\n{source.rstrip()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
