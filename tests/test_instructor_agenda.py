"""The instructor guide's agendas add up: each notebook's slot is the budget table's figure, the clock
runs without gaps, a day holds at most six hours of teaching, and the table matches the notebooks."""

from __future__ import annotations

import json
import math
import re

import pytest

from course_utils import config
from course_utils.kit import agenda, stamp

GUIDE = config.REPO_ROOT / "docs" / "instructor.md"
README = config.REPO_ROOT / "README.md"
TEACHING_LIMIT = 360  # minutes of teaching in one day, breaks not counted
HALF_DAY = 210  # minutes from start to end, breaks included

_CLOCK = re.compile(r"^(\d+):(\d\d)[–-](\d+):(\d\d)$")
_NOTEBOOK = re.compile(r"^\*\*(\d\d)\*\*")
_PAUSE = ("break", "lunch")


def section(text: str, heading: str) -> str:
    """Return the text under the ``## `` heading that starts with ``heading``, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/instructor.md has no section '## {heading}...'"
    return match.group(1)


def rows(text: str) -> list[list[str]]:
    """Return the cells of each Markdown table row in ``text`` (header and rule rows left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out[1:] if out else out


def budget_table(text: str) -> dict[str, list[int]]:
    """Return {notebook number: [words, reading, exercises, exercise minutes, discussion, machine,
    minutes in class]} from the guide's budget table."""
    part = section(text, "How long each notebook takes")
    assert agenda.HEADER in part, "the budget table's header changed; update agenda.HEADER or the guide"
    table = part[part.index(agenda.HEADER):].split("\n\n")[0]
    return {cells[0]: [int(c) for c in cells[1:]] for cells in rows(table)}


def plan(text: str, heading: str) -> list[tuple[int, int, int, str]]:
    """Return (start, end, minutes, block) for each row of the agenda under ``heading`` (clock in minutes)."""
    out = []
    for clock, minutes, block, *_ in rows(section(text, heading)):
        match = _CLOCK.match(clock)
        assert match, f"{heading}: '{clock}' is not a clock range like 0:25–1:12"
        assert minutes.isdigit(), f"{heading}: the second column should be minutes, not '{minutes}'"
        h1, m1, h2, m2 = map(int, match.groups())
        out.append((h1 * 60 + m1, h2 * 60 + m2, int(minutes), block))
    assert out, f"{heading}: no agenda rows"
    return out


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def table(guide) -> dict[str, list[int]]:
    return budget_table(guide)


def test_the_budget_table_adds_up_by_its_stated_rule(table):
    assert sorted(table) == [p.name[:2] for p in sorted((config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    for number, (words, reading, exercises, exercise_min, discussion, machine, total) in table.items():
        assert reading == math.ceil(words / agenda.WORDS_PER_MINUTE), number
        assert exercise_min == exercises * agenda.MINUTES_PER_EXERCISE, number
        assert discussion == agenda.DISCUSSION_OVERRIDES.get(number, agenda.DISCUSSION_MINUTES), number
        assert total == reading + exercise_min + discussion + machine, number


def test_the_budget_table_matches_the_notebooks_and_readme(table):
    """Words within 15% of today's notebooks (prose changes a little all the time), exercises exactly,
    and machine minutes that cover README's measured quick-mode run."""
    quick = stamp.stated_quick_seconds(README.read_text(encoding="utf-8"))
    for path in sorted((config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        words, _, exercises, *_, machine, _ = table[path.name[:2]]
        now = agenda.markdown_words(nb)
        hint = "re-run `python -m course_utils.kit.agenda` and update docs/instructor.md's table and agendas"
        assert abs(words - now) <= 0.15 * now, f"{path.name}: the table says {words} words, the notebook has {now}; {hint}"
        assert exercises == len(agenda.exercise_ids(nb)), f"{path.name}: exercises changed; {hint}"
        assert machine * 60 >= quick[path.name], f"{path.name}: README's quick run is longer than the table's {machine} min"


@pytest.mark.parametrize("heading", ["Half-day agenda", "Full-day agenda", "A second day"])
def test_each_agenda_runs_without_gaps_and_uses_the_tables_minutes(guide, table, heading):
    rows_ = plan(guide, heading)
    assert rows_[0][0] == 0, f"{heading}: the clock starts at 0:00"
    for (_, end, _, _), (start, *_) in zip(rows_, rows_[1:]):
        assert start == end, f"{heading}: a gap or overlap at {end // 60}:{end % 60:02d}"
    for start, end, minutes, block in rows_:
        assert end - start == minutes, f"{heading}: '{block}' runs {end - start} min by the clock, {minutes} stated"
        if match := _NOTEBOOK.match(block):
            assert minutes == table[match.group(1)][-1], (
                f"{heading}: notebook {match.group(1)} has {minutes} min, the budget table {table[match.group(1)][-1]}")
    teaching = sum(minutes for *_, minutes, block in rows_ if not block.lower().startswith(_PAUSE))
    assert teaching <= TEACHING_LIMIT, f"{heading}: {teaching} min of teaching is more than six hours"
    if heading == "Half-day agenda":
        assert rows_[-1][1] <= HALF_DAY, f"the half day ends at {rows_[-1][1]} min, after 3.5 hours"
    for *_, block in rows_:
        assert "make report" not in block and "full mode" not in block, f"{heading}: a full-mode run does not fit a day"


def test_the_two_days_cover_every_notebook_once(guide):
    def notebooks(heading: str) -> list[str]:
        return [m.group(1) for *_, block in plan(guide, heading) if (m := _NOTEBOOK.match(block))]

    day1, day2 = notebooks("Full-day agenda"), notebooks("A second day")
    every = [p.name[:2] for p in sorted((config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    assert sorted(day1 + day2) == every
    assert {"11", "12", "13"} <= set(day2)


def test_the_parser_catches_a_plan_that_does_not_add_up():
    bad = ("## Full-day agenda\n\n| clock | minutes | block |\n|---|---|---|\n"
           "| 0:00–0:25 | 25 | **00** set-up |\n| 0:25–1:20 | 50 | **01** compile |\n")
    (*_, (start, end, minutes, _)) = plan(bad, "Full-day agenda")
    assert end - start != minutes  # 55 minutes by the clock, 50 stated: the test above would fail


def _nb(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_words_exercises_and_budget_are_counted_from_the_notebook(tmp_path):
    nb = _nb({"cell_type": "markdown", "source": ["# A title\n", "| a | b |\n|---|---|\n| `torch.compile` | 2 |\n"]},
             {"cell_type": "code", "source": ['exercises.check("07.x", a)\n', "if exercises.check('07.x', a):\n",
                                              '    exercises.check("07.y", b)\n']})
    assert agenda.markdown_words(nb) == 6  # A, title, a, b, `torch.compile`, 2: the table's | and --- are not words
    assert agenda.exercise_ids(nb) == ["07.x", "07.y"]  # a second check of the same exercise counts once
    path = tmp_path / "07_demo.ipynb"
    path.write_text(json.dumps(nb))
    b = agenda.budget(path, quick_minutes=0.4)
    assert (b.reading, b.exercise_minutes, b.discussion, b.machine) == (1, 2 * agenda.MINUTES_PER_EXERCISE, 10, 1)
    assert b.total == 1 + 2 * agenda.MINUTES_PER_EXERCISE + 10 + 1
    assert agenda.table([b]).splitlines()[2].startswith("| 07 | 6 | 1 | 2 |")


def test_slow_cells_come_from_the_clients_timestamps(tmp_path):
    def timed(start: str, end: str, first: str) -> dict:
        return {"cell_type": "code", "source": [first + "\n"], "outputs": [],
                "metadata": {"execution": {"iopub.execute_input": start, "shell.execute_reply": end}}}

    nb = _nb({"cell_type": "markdown", "source": ["## 2 · Compile a block\n"]},
             timed("2026-12-01T10:00:00.000Z", "2026-12-01T10:00:41.500Z", "model = build()"),
             timed("2026-12-01T10:00:42.000Z", "2026-12-01T10:00:44.000Z", "print(model)"),
             {"cell_type": "code", "source": ["x = 1\n"], "metadata": {}, "outputs": []})
    (tmp_path / "11_demo.ipynb").write_text(json.dumps(nb))
    (found,) = agenda.slow_cells(tmp_path, over=30)
    assert (found.notebook, found.index, found.section, found.first_line, found.seconds) == (
        "11_demo.ipynb", 1, "2 · Compile a block", "model = build()", 41.5)
    assert len(agenda.slow_cells(tmp_path, over=1)) == 2
    with pytest.raises(ValueError, match="make workshop-check"):
        agenda.slow_cells(tmp_path / "empty")
