"""The learner's progress record (every check appends a line), ``progress`` and ``answers`` on the command line."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_utils import exercises
from course_utils.exercises import framework, progress
from course_utils.kit import runner
from course_utils.kit.cli import main


def blocks_needed_wrong(n_tokens: int, block: int) -> int:
    return n_tokens // block  # rounds down: the mistake notebook 13's stub makes


def blocks_needed_right(n_tokens: int, block: int) -> int:
    return -(-n_tokens // block)


@pytest.fixture
def record_file(tmp_path, monkeypatch) -> Path:
    """Point COURSE_PROGRESS at a fresh file, with a fixed learner name, and return its path."""
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("COURSE_PROGRESS", str(path))
    monkeypatch.setenv("COURSE_LEARNER", "ana")
    return path


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---- recording ------------------------------------------------------------------------------------

def test_a_failing_and_a_passing_check_each_append_their_verdict(record_file):
    before = dt.datetime.now().astimezone().replace(microsecond=0)
    wrong = exercises.check("13.blocks_needed", blocks_needed_wrong)
    right = exercises.check("13.blocks_needed", blocks_needed_right)
    assert not wrong and right
    first, second = lines_of(record_file)
    assert first["exercise"] == second["exercise"] == "13.blocks_needed"
    assert first["notebook"] == "13" and first["learner"] == "ana"
    assert first["passed"] is False and "Round UP" in first["message"] and first["message"] == wrong.message
    assert second["passed"] is True and second["message"] == right.message
    assert before <= dt.datetime.fromisoformat(second["time"]) <= dt.datetime.now().astimezone()


def test_a_misspelt_exercise_name_is_feedback_but_not_an_attempt(record_file):
    assert not exercises.check("13.no_such_exercise", blocks_needed_right)
    assert not record_file.exists()


def test_long_messages_are_cut_in_the_record(tmp_path):
    path = progress.record("13.locate", False, "x" * 1000, path=tmp_path / "p.jsonl")
    (line,) = lines_of(path)
    assert len(line["message"]) == progress.MESSAGE_CHARS and line["message"].endswith("...")


def test_a_file_without_its_last_newline_gets_a_new_line(tmp_path):
    path = tmp_path / "p.jsonl"
    progress.record("13.locate", True, "ok", path=path)
    path.write_text(path.read_text(encoding="utf-8").rstrip("\n"), encoding="utf-8")  # as an editor may save it
    progress.record("13.locate", False, "no", path=path)
    assert [line["passed"] for line in lines_of(path)] == [True, False]


@pytest.mark.parametrize("where", ["under a file", "a folder"])
def test_an_unwritable_record_warns_once_and_the_verdict_still_shows(where, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "blocker"
    if where == "a folder":
        blocker.mkdir()
        target = blocker
    else:
        blocker.write_text("a file where a folder should be\n")
        target = blocker / "progress.jsonl"
    monkeypatch.setenv("COURSE_PROGRESS", str(target))
    right = exercises.check("13.blocks_needed", blocks_needed_right)
    wrong = exercises.check("13.blocks_needed", blocks_needed_wrong)
    assert right.correct and not wrong.correct and "Round UP" in wrong.message
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err  # one warning line, not one per check
    assert err[0].startswith(f"warning: progress not saved to {target}") and "COURSE_PROGRESS" in err[0]


def test_the_default_record_is_in_the_users_data_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_PROGRESS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert progress.progress_path() == tmp_path / "data" / "pytorch2-course" / "progress.jsonl"
    for ignored in ("", "relative/data"):  # the XDG rule: only an absolute path counts
        monkeypatch.setenv("XDG_DATA_HOME", ignored)
        assert progress.progress_path() == tmp_path / "home" / ".local" / "share" / "pytorch2-course" / "progress.jsonl"


def test_the_test_suite_and_the_notebook_runner_never_write_a_learners_record():
    suite = Path(os.environ["COURSE_PROGRESS"])  # set by the root conftest for the whole run
    assert suite.is_relative_to(tempfile.gettempdir()) and not suite.is_relative_to(progress.data_home())
    with runner._environment(quick=True, blocked=False, results=None):
        assert os.environ["COURSE_PROGRESS"] == os.devnull  # what the notebook kernels inherit


# ---- python -m course_utils progress -------------------------------------------------------------

def write_record(path: Path, learner: str, verdicts: list[tuple[str, bool]], monkeypatch) -> Path:
    monkeypatch.setenv("COURSE_LEARNER", learner)
    for name, passed in verdicts:
        progress.record(name, passed, "passed" if passed else "a hint", path=path)
    return path


def row_of(out: str, exercise: str) -> list[str]:
    """The words of a learner table's row for ``exercise``: notebook, name, best (1-2 words), attempts, date time."""
    return next(line.split() for line in out.splitlines() if line.split()[1:2] == [exercise])


def class_row(out: str, learner: str) -> dict[str, str]:
    """A class table's row for ``learner``, keyed by the header (learner, file, 00 ... 13, passed)."""
    rows = [line.split() for line in out.splitlines() if line.split()]
    header = next(r for r in rows if r[0] == "learner")
    return dict(zip(header, next(r for r in rows if r[0] == learner)))


def test_progress_of_one_file_has_a_row_per_exercise_and_the_count_of_the_registry(tmp_path, monkeypatch, capsys):
    path = write_record(tmp_path / "ana.jsonl", "ana", [("13.blocks_needed", False), ("13.blocks_needed", True),
                                                        ("13.blocks_needed", False), ("00.rms_norm", False)], monkeypatch)
    assert main(["progress", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"Progress of ana ({path})" in out
    assert row_of(out, "13.blocks_needed")[:5] == ["13", "13.blocks_needed", "passed", "3",
                                                     dt.datetime.now().strftime("%Y-%m-%d")]
    assert row_of(out, "00.rms_norm")[2:5] == ["not", "yet", "1"]
    assert row_of(out, "13.locate")[2:] == ["not", "yet", "0", "-"]  # untried exercises are listed too
    total = len(exercises.names())
    assert f"1 of {total} exercises passed (2 tried)." in out
    assert sum(1 for line in out.splitlines() if line[:2].isdigit()) == total  # every exercise has its row


def test_the_total_comes_from_the_registry(tmp_path, monkeypatch, capsys):
    course = len(exercises.names())
    extra = framework.Exercise("13.extra", lambda answer: "ok", lambda: None, list)
    monkeypatch.setitem(framework._REGISTRY, "13.extra", extra)
    path = write_record(tmp_path / "ana.jsonl", "ana", [("13.extra", True)], monkeypatch)
    assert main(["progress", "--file", str(path)]) == 0
    assert f"1 of {course + 1} exercises passed" in capsys.readouterr().out


def test_progress_of_several_files_is_one_row_per_learner_with_counts_per_notebook(tmp_path, monkeypatch, capsys):
    ana = write_record(tmp_path / "a.jsonl", "ana", [("13.blocks_needed", True), ("13.locate", True),
                                                     ("13.locate", True), ("00.rms_norm", False)], monkeypatch)
    bob = write_record(tmp_path / "b.jsonl", "bob", [("00.rms_norm", True), ("13.locate", False)], monkeypatch)
    assert main(["progress", "--file", str(ana), "--file", str(bob)]) == 0
    out = capsys.readouterr().out
    per_nb = {nb: str(sum(n.startswith(nb + ".") for n in exercises.names())) for nb in ("00", "13")}
    total = len(exercises.names())
    assert class_row(out, "ana") == {"learner": "ana", "file": "a.jsonl", "00": "0", "01": "0", "02": "0", "03": "0",
                                     "04": "0", "05": "0", "06": "0", "07": "0", "08": "0", "09": "0", "10": "0",
                                     "11": "0", "12": "0", "13": "2", "passed": "2"}
    assert class_row(out, "bob") | {"passed": None} == {**class_row(out, "ana"), "learner": "bob", "file": "b.jsonl",
                                                        "00": "1", "13": "0", "passed": None}
    assert out.splitlines()[-2].endswith(f"2 of {total}") and out.splitlines()[-1].endswith(f"1 of {total}")
    counts = next(line.split() for line in out.splitlines() if line.startswith("(exercises)"))
    assert counts[1] == per_nb["00"] and counts[-2] == per_nb["13"] and counts[-1] == str(total)


def test_a_file_without_a_learner_name_is_named_by_its_file(tmp_path, capsys):
    path = tmp_path / "carol.jsonl"
    path.write_text(json.dumps({"exercise": "13.locate", "passed": True, "time": "2026-05-04T10:00:00"}) + "\n")
    other = tmp_path / "dan.jsonl"
    other.write_text(json.dumps({"exercise": "13.locate", "passed": False, "time": "2026-05-04T10:00:00"}) + "\n")
    assert main(["progress", "--file", str(path), "--file", str(other)]) == 0
    out = capsys.readouterr().out
    assert class_row(out, "carol")["13"] == "1" and class_row(out, "dan")["13"] == "0"


def test_bad_lines_are_skipped_and_named(tmp_path, monkeypatch, capsys):
    path = write_record(tmp_path / "ana.jsonl", "ana", [("13.locate", True)], monkeypatch)
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"exercise": "13.locate", "passed": tr\n')           # cut off mid-line
        fh.write('["not", "an", "object"]\n')
        fh.write('{"exercise": "13.locate", "passed": "yes", "time": "2026-05-04T10:00:00"}\n')
        fh.write("\n")                                                # blank lines are not errors
        fh.write('{"exercise": "13.locate", "passed": false, "time": "yesterday"}\n')
    progress.record("13.locate", False, "a hint", path=path)
    assert main(["progress", "--file", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"warning: {path}, line 2: not JSON, skipped",
        f"warning: {path}, line 3: not a JSON object, skipped",
        f"warning: {path}, line 4: 'passed' is not true or false, skipped",
        f"warning: {path}, line 6: no ISO time, skipped"]
    assert row_of(captured.out, "13.locate")[2:4] == ["passed", "2"]


def test_a_missing_file_is_a_clear_error_and_the_others_still_show(tmp_path, monkeypatch, capsys):
    ana = write_record(tmp_path / "a.jsonl", "ana", [("13.locate", True)], monkeypatch)
    missing = tmp_path / "nobody.jsonl"
    assert main(["progress", "--file", str(missing)]) == 1
    assert capsys.readouterr().err.strip() == f"error: no progress file at {missing}"
    assert main(["progress", "--file", str(ana), "--file", str(missing)]) == 1
    captured = capsys.readouterr()
    assert f"no progress file at {missing}" in captured.err and class_row(captured.out, "ana")["13"] == "1"


def test_own_progress_before_any_check_says_so(record_file, capsys):
    assert main(["progress"]) == 0
    assert f"No checks recorded yet: no progress file at {record_file}" in capsys.readouterr().out
    assert "No checks recorded yet" in exercises.progress_report()


def test_own_progress_after_checks_in_the_notebook_and_on_the_command_line(record_file, capsys):
    exercises.check("13.blocks_needed", blocks_needed_right)
    table = exercises.progress_report()
    assert row_of(table, "13.blocks_needed")[2:4] == ["passed", "1"] and f"1 of {len(exercises.names())}" in table
    assert main(["progress"]) == 0
    assert capsys.readouterr().out.strip() == table.strip()


# ---- python -m course_utils answers --------------------------------------------------------------

def test_answers_without_arguments_lists_every_exercise(capsys):
    assert main(["answers"]) == 0
    listed = [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert listed == exercises.names()


@pytest.mark.parametrize("args", [["13", "locate"], ["13.locate"], ["13_serving_engine", "13.locate"], ["nb13", "locate"]])
def test_answers_prints_one_solution(args, capsys):
    assert main(["answers", *args]) == 0
    out = capsys.readouterr().out
    assert out == f"# 13.locate\n{exercises.solution_source('13.locate').rstrip()}\n"
    assert "def locate(" in out and "pos % block" in out


def test_answers_for_a_notebook_prints_each_of_its_solutions(capsys):
    assert main(["answers", "13"]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# 13.")]
    assert heads == ["# 13.accept_drafts", "# 13.blocks_needed", "# 13.locate"]


def test_answers_to_a_bad_name_lists_the_valid_ones(capsys):
    assert main(["answers", "13", "lookup"]) == 2
    err = capsys.readouterr().err
    assert "notebook 13 has no exercise 'lookup'" in err and "13.accept_drafts, 13.blocks_needed, 13.locate" in err
    assert main(["answers", "42"]) == 2
    err = capsys.readouterr().err
    assert "no notebook '42'" in err and "00, 01, 02" in err and "13" in err


def test_the_commands_run_as_a_module_without_a_traceback(tmp_path):
    env = {**os.environ, "COURSE_PROGRESS": str(tmp_path / "p.jsonl")}
    bad = subprocess.run([sys.executable, "-m", "course_utils", "answers", "13.nope"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "13.locate" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "course_utils", "progress", "--file", str(tmp_path / "x.jsonl")],
                             capture_output=True, text=True, timeout=120, env=env)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr and "no progress file" in missing.stderr


# ---- the notebooks tell learners both --------------------------------------------------------------

@pytest.mark.parametrize("number", sorted({name[:2] for name in exercises.names()}))
def test_every_notebook_says_how_to_reveal_a_solution_and_see_progress(number):
    from course_utils.config import REPO_ROOT

    (path,) = (REPO_ROOT / "notebooks").glob(f"{number}_*.ipynb")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    hint = [md for md in markdown if f'exercises.solution_source("{number}.' in md]
    assert hint, f"{path.name}: no markdown cell shows exercises.solution_source for its exercises"
    assert any("exercises.progress_report()" in md for md in hint), f"{path.name}: the hint cell omits progress"
    named = {n for md in hint for n in exercises.names() if f'"{n}"' in md}
    assert named, f"{path.name}: the hint names no exercise of this notebook"
