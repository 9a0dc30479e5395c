"""Verdict flips between two executed copies of a notebook (course_utils.kit.verdicts), on real copies
of notebook 00 (tests/data/verdicts: the reference run and an avx2 run with a busy core), and the
report's section built from them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from course_utils.kit import report, verdicts

DATA = Path(__file__).parent / "data" / "verdicts"
REFERENCE_NB = DATA / "00_setup_reference.ipynb"
AVX2_NB = DATA / "00_setup_avx2_busy.ipynb"
ROOT = Path(__file__).resolve().parent.parent

#: The matmul verdict (cell index 17) as the avx2 run printed it (the reference printed 0.97x).
MATMUL_TIE = "matmul: compiled is not clearly different from eager (0.98x, inside the timing spread)"
MATMUL_CELL = 17
CHAIN_CELL = 19


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write(nb: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def stdout_of(nb: dict[str, Any], index: int) -> dict[str, Any]:
    """The (single) stdout stream output of cell ``index``."""
    (out,) = [o for o in nb["cells"][index]["outputs"] if o.get("output_type") == "stream" and o["name"] == "stdout"]
    return out


def replace_line(nb: dict[str, Any], index: int, old: str, new: str) -> dict[str, Any]:
    """Return a copy of ``nb`` whose cell ``index`` printed ``new`` where it printed the line ``old``."""
    nb = copy.deepcopy(nb)
    out = stdout_of(nb, index)
    text = "".join(out["text"])
    lines = text.splitlines()
    assert old in lines, f"{old!r} is not a line of cell {index}"
    out["text"] = "\n".join(new if ln == old else ln for ln in lines) + "\n"
    return nb


def line_starting(nb: dict[str, Any], index: int, start: str) -> str:
    (line,) = [ln for ln in "".join(stdout_of(nb, index)["text"]).splitlines() if ln.startswith(start)]
    return line


@pytest.fixture
def flipped(tmp_path: Path) -> Path:
    """The avx2 copy with its matmul verdict turned from a tie into "faster" (a synthetic flip)."""
    nb = replace_line(read(AVX2_NB), MATMUL_CELL, MATMUL_TIE, "matmul: compiled is 1.21x faster than eager")
    return write(nb, tmp_path / "b" / "00_setup.ipynb")


# --- the vocabulary ------------------------------------------------------------------------------

@pytest.mark.parametrize("line, template, direction", [
    ("steady state (1.833 ms vs 18.219 ms per call): compiled is 9.94x faster than eager",
     "steady state (# ms vs # ms per call): compiled is", ("faster",)),
    ("matmul: compiled is not clearly different from eager (0.97x, inside the timing spread)",
     "matmul: compiled is", ("no clear difference",)),
    ("the hand-written int8 layer is 1.83x slower than fp32 nn.Linear (it takes 1.83x the time): it saves storage",
     "the hand-written int# layer is", ("slower",)),
    ("int8 variants SLOWER than fp32 eager on this CPU: hand-written int8 Linear", "int# variants", ("slower",)),
    ("course target: efficiency >= 0.7 -> NOT met on this machine", "course target: efficiency >= # ->", ("not met",)),
    ("course target: batched >= 4x unbatched at 32 clients -> met on this machine",
     "course target: batched >= #x unbatched at # clients ->", ("met",)),
    ("rows per forward pass: 27.7 -> 6.0 (lower, 15% band): the engine now frees rows faster than the HTTP side",
     "rows per forward pass: # -> # (", ("lower", "faster")),
    ("verdict on this machine (x86-avx2): bf16 is 1.30x faster than fp32 compiled",
     "verdict on this machine (<cpu>): bf# is", ("faster",)),
    ("verdict on this machine (2 cores): two Ray replicas served fewer tokens/s than one course server process",
     "verdict on this machine (# cores): two Ray replicas served", ("fewer",)),
    ("compiled epochs were not clearly faster here, so the compile does not pay for itself in this run",
     "compiled epochs were", ("no clear difference", "does not pay")),
    ("the 2.4 s compile pays for itself after about 1,047 calls", "the # s compile", ("pays",)),
    ("verdict: health checks wait for whole generations", "verdict:", ("health checks wait for whole generations",)),
])
def test_a_verdict_line_gives_its_template_and_direction(line, template, direction):
    assert verdicts.parse_line(line) == (template, direction)


@pytest.mark.parametrize("line", [
    "UncapturedHigherOrderOpError: Encountered aliasing during higher order op tracing",
    "this is surfaced on wrapped compiled-region higher-order operators",
    "cold   first call  28.92 s | C++ build  22.25 s | graph cache hits 0, misses 1",
    "mode: full; tensor size for this notebook: 1024 x 1024",
    "Why this verdict says little either way: the two ranks share this machine's cores",
])
def test_lines_without_a_verdict_are_not_verdicts(line):
    assert verdicts.parse_line(line) is None


# --- the real pair -------------------------------------------------------------------------------

def test_the_real_pair_prints_the_same_verdicts_with_other_numbers():
    ref, avx2 = verdicts.load(REFERENCE_NB), verdicts.load(AVX2_NB)
    found = {v.cell: v for v in verdicts.verdicts(ref)}
    assert [v.direction for v in verdicts.verdicts(ref)] == [v.direction for v in verdicts.verdicts(avx2)]
    assert found[MATMUL_CELL].direction == ("no clear difference",) and found[15].direction == ("faster",)
    # the numbers differ between the runs (9.94x against 4.12x steady state), which is not a flip
    assert {v.line for v in verdicts.verdicts(ref)} != {v.line for v in verdicts.verdicts(avx2)}
    assert verdicts.compare(ref, avx2) == []
    a, b = (verdicts.parse_setting(verdicts.setting(nb)) for nb in (ref, avx2))
    assert (a.cpu_class, a.mode, a.busy) == ("x86-avx512-vnni", "full", False)
    assert (b.cpu_class, b.mode, b.busy, b.threads) == ("x86-avx2", "full", True, 2)


def test_numbers_changing_alone_are_not_a_flip(tmp_path):
    nb = read(AVX2_NB)
    old = line_starting(nb, 15, "steady state")
    nb = replace_line(nb, 15, old, "steady state (0.100 ms vs 99.000 ms per call): compiled is 990.00x faster than eager")
    nb = replace_line(nb, MATMUL_CELL, MATMUL_TIE,
                      "matmul: compiled is not clearly different from eager (1.04x, inside the timing spread)")
    assert verdicts.compare(verdicts.load(REFERENCE_NB), verdicts.load(write(nb, tmp_path / "n.ipynb"))) == []


def test_a_changed_direction_is_a_flip_with_the_markdown_after_it(flipped):
    ref = verdicts.load(REFERENCE_NB)
    (d,) = verdicts.compare(ref, verdicts.load(flipped))
    assert d.kind == "flip" and d.cell == MATMUL_CELL
    assert d.a.direction == ("no clear difference",) and d.b.direction == ("faster",)
    assert d.a.line.startswith("matmul: compiled is not clearly") and d.b.line == "matmul: compiled is 1.21x faster than eager"
    source = ref.cells[MATMUL_CELL + 1]["source"]
    assert d.markdown == ("".join(source),)  # the one Markdown cell before the next code cell
    assert d.markdown[0].startswith("Small tensors are a subtler case")
    assert d.noisy == (True, False)  # the reference run warned of a large spread in that cell, this one did not


def test_a_flip_whose_reason_changes_with_it_is_still_a_flip(tmp_path):
    """The notebooks pick the reason they print from the verdict: the text after it is not the identity."""
    nb = read(AVX2_NB)
    old = line_starting(nb, CHAIN_CELL, "the chain on 8 numbers")
    new = ("the chain on 8 numbers: compiled is 1.30x slower than eager (it takes 1.30x the time): "
           "the added per-call checks cost more than the dispatches saved on this machine")
    (d,) = verdicts.compare(verdicts.load(REFERENCE_NB),
                            verdicts.load(write(replace_line(nb, CHAIN_CELL, old, new), tmp_path / "c.ipynb")))
    assert (d.kind, d.cell, d.a.direction, d.b.direction) == ("flip", CHAIN_CELL, ("faster",), ("slower",))


def test_the_same_direction_in_other_words_is_reworded(tmp_path):
    """A list of the variants found faster that names another variant: no direction changed in the line."""
    nb = replace_line(read(AVX2_NB), MATMUL_CELL, MATMUL_TIE,
                      "matmul: compiled is not clearly different from a cold cache (0.98x, inside the timing spread)")
    (d,) = verdicts.compare(verdicts.load(REFERENCE_NB), verdicts.load(write(nb, tmp_path / "w.ipynb")))
    assert (d.kind, d.cell, d.b.direction) == ("reworded", MATMUL_CELL, ("no clear difference",))
    text = "\n".join(verdicts.format_difference(d))
    assert "REWORDED  00_setup_reference.ipynb, cell 18: the same direction (no clear difference) in other words" in text


def test_a_line_of_another_shape_is_only_in_a_and_only_in_b(tmp_path):
    nb = replace_line(read(AVX2_NB), MATMUL_CELL, MATMUL_TIE, "for a matmul compiling made no clear difference")
    diffs = verdicts.compare(verdicts.load(REFERENCE_NB), verdicts.load(write(nb, tmp_path / "s.ipynb")))
    assert [(d.kind, d.cell) for d in diffs] == [("only in A", MATMUL_CELL), ("only in B", MATMUL_CELL)]
    assert diffs[1].b.line == "for a matmul compiling made no clear difference"


def test_a_cell_without_outputs_in_b_is_not_run_once(tmp_path):
    nb = read(AVX2_NB)
    for cell in nb["cells"][CHAIN_CELL:]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    diffs = verdicts.compare(verdicts.load(REFERENCE_NB), verdicts.load(write(nb, tmp_path / "f.ipynb")))
    assert [(d.kind, d.cell) for d in diffs] == [("not run in B", CHAIN_CELL)]


def test_cells_pair_by_source_hash_then_by_position(tmp_path):
    nb = replace_line(read(AVX2_NB), MATMUL_CELL, MATMUL_TIE, "matmul: compiled is 1.21x faster than eager")
    # someone adds a Markdown cell at the top and edits the matmul cell's code: the cell indices move
    # by one, the edited cell no longer has the same hash, and the flip is still found in it
    nb["cells"][MATMUL_CELL]["source"] = "# edited\n" + "".join(nb["cells"][MATMUL_CELL]["source"])
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "# a new title"})
    (d,) = verdicts.compare(verdicts.load(REFERENCE_NB), verdicts.load(write(nb, tmp_path / "m.ipynb")))
    assert (d.kind, d.a.cell, d.b.cell) == ("flip", MATMUL_CELL, MATMUL_CELL + 1)


def test_causes_come_from_the_two_setup_lines():
    ref = verdicts.parse_setting(verdicts.setting(verdicts.load(REFERENCE_NB)))
    avx2 = verdicts.parse_setting(verdicts.setting(verdicts.load(AVX2_NB)))
    kinds = [kind for kind, _ in verdicts.causes(ref, avx2)]
    assert kinds == ["cpu", "busy"]
    assert verdicts.causes(ref, ref) == [("noise", "run-to-run variation")]
    assert verdicts.causes(ref, avx2, names=("the reference", "yours"))[-1] == ("busy", "a busy machine (yours)")
    quick = verdicts.Setting("x86-avx2", 4, 4, "quick")
    assert [k for k, _ in verdicts.causes(ref, quick)] == ["cpu", "mode", "threads"]
    assert all(kind in verdicts.CAUSE_WHY for kind in ("cpu", "mode", "threads", "busy", "noise"))


# --- the command line ----------------------------------------------------------------------------

def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course_utils.kit.verdicts", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_prints_the_flip_and_the_markdown_after_it(flipped):
    done = cli(REFERENCE_NB, flipped)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"FLIP  00_setup_reference.ipynb, cell {MATMUL_CELL + 1}: no clear difference -> faster" in out
    assert f"  A: {MATMUL_TIE.replace('0.98x', '0.97x')}" in out and "  B: matmul: compiled is 1.21x faster than eager" in out
    assert "  markdown: Small tensors are a subtler case." in out
    assert "why it can differ: a different CPU class (x86-avx512-vnni against x86-avx2)" in out
    assert "1 flip, 0 reworded, 0 only in A, 0 only in B, 0 not run in B" in out


def test_cli_pairs_two_folders_by_file_name(tmp_path, flipped):
    write(read(REFERENCE_NB), tmp_path / "a" / "00_setup.ipynb")
    done = cli(tmp_path / "a", flipped.parent)
    assert done.returncode == 0, done.stderr
    assert "FLIP  00_setup.ipynb, cell 18" in done.stdout


def test_cli_on_the_real_pair_finds_no_flip():
    done = cli(REFERENCE_NB, AVX2_NB)
    assert done.returncode == 0 and "no verdict differs" in done.stdout and "0 flip" in done.stdout


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "absent.ipynb", "does not exist"),
    (lambda tmp: write(dict(read(REFERENCE_NB), cells=[dict(c, outputs=[]) if c["cell_type"] == "code" else c
                                                     for c in read(REFERENCE_NB)["cells"]]), tmp / "blank.ipynb"),
     "has not been executed"),
    (lambda tmp: (tmp / "junk.ipynb").write_text("{not json") and tmp / "junk.ipynb", "not valid JSON"),
])
def test_cli_refuses_bad_inputs_with_a_message(tmp_path, make, message):
    done = cli(REFERENCE_NB, make(tmp_path))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_cli_wants_pairs():
    done = cli(REFERENCE_NB)
    assert done.returncode == 2 and "give pairs" in done.stderr and "Traceback" not in done.stderr


# --- the report's section ------------------------------------------------------------------------

def folders(tmp_path: Path, mine: Path) -> tuple[Path, Path]:
    stored, executed = tmp_path / "stored", tmp_path / "executed"
    write(read(REFERENCE_NB), stored / "00_setup.ipynb")
    write(read(mine), executed / "00_setup.ipynb")
    return stored, executed


def test_report_section_lists_a_flip_with_its_causes(tmp_path, flipped):
    stored, executed = folders(tmp_path, flipped)
    section = report.verdict_section(executed, stored)
    (item,) = section.items
    assert item.startswith(f"00_setup, cell {MATMUL_CELL + 1}: reference no clear difference, yours faster")
    # the reference's cell warned of a large spread, and the avx2 run's setup line says BUSY
    assert "a different CPU class (x86-avx512-vnni against x86-avx2)" in item and "a busy machine (both runs)" in item
    assert verdicts.CAUSE_WHY["cpu"] in section.outro


def test_report_section_on_the_real_pair_and_without_copies(tmp_path):
    stored, executed = folders(tmp_path, AVX2_NB)
    same = report.verdict_section(executed, stored)
    assert same.items == () and same.intro.startswith("No verdict in 1 notebook from")
    none = report.verdict_section(tmp_path / "nowhere", stored)
    assert none.items == () and "make report" in none.intro and "--executed FOLDER" in none.intro


def test_report_page_ends_with_the_section(tmp_path, flipped):
    stored, executed = folders(tmp_path, flipped)
    ref = {"machine": {"description": "test box"}, "results": {}, "expected": {}}
    md, page = report.build([{"name": "a.speedup", "value": 2.0}], tmp_path / "out", ref,
                            executed=executed, stored=stored)
    text = md.read_text(encoding="utf-8")
    assert f"## {report.VERDICT_TITLE}" in text
    assert "- 00\\_setup, cell 18: reference no clear difference, yours faster" in text
    assert f"<h2>{report.VERDICT_TITLE.replace(chr(39), '&#x27;')}</h2>" in page.read_text(encoding="utf-8")


def test_report_command_compares_copies_named_by_executed(tmp_path, flipped, monkeypatch):
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    # the stored side is the fixture's reference run, not notebooks/ (whose cells and verdicts move with each run)
    stored, _ = folders(tmp_path / "fixture", flipped)
    section = report.verdict_section
    monkeypatch.setattr(report, "verdict_section", lambda executed, _stored=None: section(executed, stored))
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"name": "a.speedup", "value": 2.0, "unit": "x"}) + "\n", encoding="utf-8")
    assert report.main(["--results", str(results), "--out", str(tmp_path / "out"),
                        "--executed", str(flipped.parent)]) == 0
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "- 00\\_setup, cell 18: reference no clear difference, yours faster" in text


def test_the_course_command_line_runs_the_verdict_listing():
    import subprocess
    import sys

    from course_utils import config

    data = config.REPO_ROOT / "tests" / "data" / "verdicts"
    done = subprocess.run([sys.executable, "-m", "course_utils", "verdicts", str(data / "00_setup_reference.ipynb"),
                           str(data / "00_setup_avx2_busy.ipynb")], capture_output=True, text=True, timeout=120,
                          cwd=config.REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert "00_setup_reference.ipynb" in done.stdout and "0 flip" in done.stdout
