"""``python -m course_utils progress [--file F ...]``: which exercises has a learner (or a class) passed?

Without ``--file`` it reads this learner's own record (``COURSE_PROGRESS``, else
``~/.local/share/pytorch2-course/progress.jsonl`` or its ``$XDG_DATA_HOME`` equivalent; see
``course_utils.exercises.progress``) and prints a row per
exercise: notebook, exercise, best result (passed / not yet), attempts, last attempt; then how many
of the course's exercises are passed. With one ``--file`` it prints that file's table; with several
(an instructor who collected the class's files) one row per learner with the exercises passed per
notebook. A line that cannot be read is skipped and named; a missing file is an error (exit 1) and
the other files are still shown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from ..text import counted


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils progress",
        description="Show which exercises are passed: one learner's table, or one row per learner for several files.")
    parser.add_argument("--file", action="append", type=Path, metavar="F", default=None,
                        help="a progress file (repeat for several learners); default: COURSE_PROGRESS, else "
                             "$XDG_DATA_HOME (or ~/.local/share)/pytorch2-course/progress.jsonl")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the progress table(s) and return 0, or 1 when a named file is missing or unreadable."""
    args = _parser().parse_args(argv)
    from course_utils import exercises
    from course_utils.exercises import progress

    registered = exercises.names()
    own = args.file is None
    files: list[Path] = [progress.progress_path()] if own else args.file
    status = 0
    loaded: list[tuple[Path, list[progress.Attempt]]] = []
    for path in files:
        try:
            attempts, skipped = progress.read(path)
        except FileNotFoundError:
            if own:
                print(progress.nothing_recorded(path, len(registered)))
                return 0
            print(f"error: no progress file at {path}", file=sys.stderr)
            status = 1
            continue
        except OSError as err:
            print(f"error: cannot read {path}: {err.strerror or err}", file=sys.stderr)
            status = 1
            continue
        for line in skipped:
            print(f"warning: {line}", file=sys.stderr)
        loaded.append((path, attempts))
    if len(files) == 1:
        for path, attempts in loaded:
            print(progress.learner_report(path, attempts, registered))
    elif loaded:
        learners = [(progress.learner_of(attempts, path.stem), path.name, progress.summarise(attempts))
                    for path, attempts in loaded]
        print(f"Exercises passed per notebook, {counted(len(learners), 'learner')}:\n")
        print(progress.class_table(learners, registered))
    return status


if __name__ == "__main__":
    sys.exit(main())
