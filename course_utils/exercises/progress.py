"""Which exercises has this learner passed? The progress record that every check appends to.

Each ``exercises.check`` appends one JSON line per attempt::

    {"notebook": "13", "exercise": "13.locate", "passed": false, "message": "locate([3, 7], 4, 5) ...",
     "time": "2026-05-04T14:03:12+02:00", "learner": "ana"}

Where the record lives (``progress_path``): the file named by ``COURSE_PROGRESS`` when it is set,
otherwise ``$XDG_DATA_HOME/pytorch2-course/progress.jsonl``, which is
``~/.local/share/pytorch2-course/progress.jsonl`` when ``XDG_DATA_HOME`` is unset (on every system,
so an instructor can tell a room where to look). Not under ``/tmp`` (cleared at reboot) and not
inside the repository (a fresh clone or ``git clean`` would lose it). The test suite and the
notebook runner point ``COURSE_PROGRESS`` elsewhere, so their checks never reach a learner's record.
The learner's name in each line is ``COURSE_LEARNER`` when set, else the login name, so an
instructor can collect the files of a class (``python -m course_utils progress --file a.jsonl
--file b.jsonl``).

Recording never breaks a check: when the file cannot be written, ``record`` prints one warning line
(once per location in a session) and the check's verdict is shown as usual. This module needs
neither torch nor the exercise registry; ``summarise`` works on what ``read`` returns.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The folder under the user's data directory that holds the default record.
APP_FOLDER = "pytorch2-course"
#: Messages longer than this are cut in the record (the learner saw them whole).
MESSAGE_CHARS = 200

_warned: set[str] = set()


def data_home() -> Path:
    """Return the user's data folder: ``$XDG_DATA_HOME`` when it is an absolute path, else ``~/.local/share``.

    The XDG Base Directory rule, as ``config.user_cache_home`` applies it to caches: an empty or
    relative ``XDG_DATA_HOME`` is ignored. Where no home folder can be found, the repository's
    git-ignored ``.cache/``.
    """
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg)
    home = os.environ.get("HOME")
    if home:
        return Path(home) / ".local" / "share"
    try:
        return Path.home() / ".local" / "share"
    except (RuntimeError, KeyError):
        from course_utils.config import REPO_ROOT

        return REPO_ROOT / ".cache"


def progress_path() -> Path:
    """Return the progress file: ``COURSE_PROGRESS`` when set, else ``<data home>/pytorch2-course/progress.jsonl``."""
    raw = os.environ.get("COURSE_PROGRESS", "").strip()
    return Path(raw).expanduser() if raw else data_home() / APP_FOLDER / "progress.jsonl"


def learner_name() -> str:
    """Return the name stored with each attempt: ``COURSE_LEARNER``, else the login name, else ``"unknown"``."""
    name = os.environ.get("COURSE_LEARNER", "").strip()
    if name:
        return name
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (some containers): not worth failing a check over
        return "unknown"


def notebook_of(exercise: str) -> str:
    """Return the notebook number an exercise name starts with: ``"13"`` for ``"13.locate"``."""
    return exercise.split(".", 1)[0]


def record(exercise: str, passed: bool, message: str, *, path: Path | None = None) -> Path | None:
    """Return the file that one attempt was appended to, or None when it could not be written.

    Never raises for an unwritable location: it prints one warning line to stderr instead (once per
    location in this process), so the check that called it still shows its verdict.
    """
    line = json.dumps({
        "notebook": notebook_of(exercise),
        "exercise": exercise,
        "passed": bool(passed),
        "message": message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS - 3] + "...",
        "time": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "learner": learner_name(),
    }, ensure_ascii=False)
    target: Path | str = "the progress file"
    try:
        target = path if path is not None else progress_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("ab+") as fh:  # a file edited by hand may lack its last newline: start a line
            fh.seek(0, os.SEEK_END)
            start = b""
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                start = b"" if fh.read(1) == b"\n" else b"\n"
            fh.write(start + line.encode("utf-8") + b"\n")
    except (OSError, ValueError, RuntimeError) as err:  # no home, read-only, a folder in the way, disk full
        if str(target) not in _warned:
            _warned.add(str(target))
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            print(f"warning: progress not saved to {target} ({reason}); set COURSE_PROGRESS to a "
                  "writable file to keep it", file=sys.stderr, flush=True)
        return None
    return target


@dataclass(frozen=True)
class Attempt:
    """One line of a progress file: one check of one answer."""

    notebook: str
    exercise: str
    passed: bool
    message: str
    time: _dt.datetime
    learner: str | None = None


def _attempt(entry: object) -> Attempt:
    """Return the attempt a parsed line describes; ValueError says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    exercise, passed, when = entry.get("exercise"), entry.get("passed"), entry.get("time")
    if not isinstance(exercise, str) or "." not in exercise:
        raise ValueError("no exercise name such as '13.locate'")
    if not isinstance(passed, bool):
        raise ValueError("'passed' is not true or false")
    try:
        time = _dt.datetime.fromisoformat(when) if isinstance(when, str) else None
    except ValueError:
        time = None
    if time is None:
        raise ValueError("no ISO time")
    learner = entry.get("learner")
    return Attempt(notebook=str(entry.get("notebook") or notebook_of(exercise)), exercise=exercise, passed=passed,
                   message=str(entry.get("message", "")), time=time,
                   learner=learner if isinstance(learner, str) and learner else None)


def read(path: Path) -> tuple[list[Attempt], list[str]]:
    """Return the attempts in a progress file and one message per line that was skipped.

    Raises FileNotFoundError when there is no such file (or it is a folder).
    """
    if not path.is_file():
        raise FileNotFoundError(f"no progress file at {path}")
    attempts, skipped = [], []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                attempts.append(_attempt(json.loads(line)))
            except json.JSONDecodeError:
                skipped.append(f"{path}, line {number}: not JSON, skipped")
            except ValueError as err:
                skipped.append(f"{path}, line {number}: {err}, skipped")
    return attempts, skipped


@dataclass(frozen=True)
class ExerciseProgress:
    """Where a learner stands on one exercise."""

    exercise: str
    passed: bool
    attempts: int
    last: _dt.datetime


def summarise(attempts: Iterable[Attempt]) -> dict[str, ExerciseProgress]:
    """Return, for each exercise attempted, whether any attempt passed, how many there were and the last one's time."""
    out: dict[str, ExerciseProgress] = {}
    for a in attempts:
        seen = out.get(a.exercise)
        if seen is None:
            out[a.exercise] = ExerciseProgress(a.exercise, a.passed, 1, a.time)
        else:
            out[a.exercise] = ExerciseProgress(a.exercise, seen.passed or a.passed, seen.attempts + 1,
                                               max(seen.last, a.time, key=_comparable))
    return out


def _comparable(time: _dt.datetime) -> _dt.datetime:
    """Return ``time`` as an aware datetime (naive times are taken as local), so any two compare."""
    return time if time.tzinfo is not None else time.astimezone()


def learner_of(attempts: Sequence[Attempt], fallback: str) -> str:
    """Return the learner's name stored in the last attempt that has one, else ``fallback`` (say, the file name)."""
    return next((a.learner for a in reversed(attempts) if a.learner), fallback)


# --- Tables: one learner's exercises, and a class of learners' counts per notebook.

def _when(time: _dt.datetime) -> str:
    return _comparable(time).astimezone().strftime("%Y-%m-%d %H:%M")


def _columns(rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    """Return ``rows`` as lines of aligned columns (the ``right`` ones right-aligned)."""
    right = set(right)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            .rstrip() for row in rows]


def passed_count(summary: dict[str, ExerciseProgress], registered: Sequence[str]) -> int:
    """Return how many of the ``registered`` exercises have a passing attempt in ``summary``."""
    return sum(1 for name in registered if name in summary and summary[name].passed)


def learner_table(summary: dict[str, ExerciseProgress], registered: Sequence[str]) -> str:
    """Return one learner's table: notebook, exercise, best result, attempts, last attempt; then 'n of N passed'.

    Every registered exercise gets a row (untried ones with 0 attempts); an exercise in the record
    that this course no longer has is listed too, marked, and left out of the count.
    """
    rows = [("notebook", "exercise", "best", "attempts", "last attempt")]
    for name in [*registered, *sorted(set(summary) - set(registered))]:
        seen = summary.get(name)
        label = name if name in registered else f"{name} (not in this course)"
        if seen is None:
            rows.append((notebook_of(name), label, "not yet", "0", "-"))
        else:
            rows.append((notebook_of(name), label, "passed" if seen.passed else "not yet", str(seen.attempts),
                         _when(seen.last)))
    tried = sum(1 for name in registered if name in summary)
    total = f"{passed_count(summary, registered)} of {len(registered)} exercises passed ({tried} tried)."
    return "\n".join([*_columns(rows, right=[3]), "", total])


def class_table(learners: Sequence[tuple[str, str, dict[str, ExerciseProgress]]], registered: Sequence[str]) -> str:
    """Return one row per learner (name, file) with the exercises passed in each notebook and in all.

    ``learners`` holds (learner name, file name, summary) triples; the second row gives how many
    exercises each notebook has.
    """
    notebooks = sorted({notebook_of(name) for name in registered})
    per_notebook = {nb: [name for name in registered if notebook_of(name) == nb] for nb in notebooks}
    rows = [("learner", "file", *notebooks, "passed"),
            ("(exercises)", "", *(str(len(per_notebook[nb])) for nb in notebooks), str(len(registered)))]
    for learner, file, summary in learners:
        rows.append((learner, file, *(str(passed_count(summary, per_notebook[nb])) for nb in notebooks),
                     f"{passed_count(summary, registered)} of {len(registered)}"))
    return "\n".join(_columns(rows, right=range(2, len(notebooks) + 3)))


def report(path: Path | None = None, registered: Sequence[str] | None = None) -> str:
    """Return this learner's progress table (default: ``progress_path()``), or a line saying nothing is recorded yet.

    ``registered`` defaults to every exercise of the course. Lines that cannot be read are named
    below the table. In a notebook: ``print(exercises.progress_report())``.
    """
    path = path if path is not None else progress_path()
    if registered is None:
        from course_utils import exercises

        registered = exercises.names()
    try:
        attempts, skipped = read(path)
    except FileNotFoundError:
        return nothing_recorded(path, len(registered))
    return "\n".join([learner_report(path, attempts, registered), *skipped])


def nothing_recorded(path: Path, total: int) -> str:
    """Return the sentence for a learner whose record does not exist yet."""
    return (f"No checks recorded yet: no progress file at {path} (each exercises.check adds a line to it; "
            f"COURSE_PROGRESS moves it). 0 of {total} exercises passed.")


def learner_report(path: Path, attempts: Sequence[Attempt], registered: Sequence[str]) -> str:
    """Return a heading naming the learner and the file, then the learner's table (``learner_table``)."""
    head = f"Progress of {learner_of(attempts, path.stem)} ({path})"
    return "\n".join([head, "", learner_table(summarise(attempts), registered)])
