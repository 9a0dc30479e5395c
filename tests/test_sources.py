"""Paired notebook sources (course_utils.kit.sources): written, checked and applied back, outputs kept."""

import json
import shutil

from course_utils import config
from course_utils.kit import sources

NB = config.REPO_ROOT / "notebooks" / "00_setup.ipynb"


def copy(tmp_path):
    nb = tmp_path / NB.name
    shutil.copy(NB, nb)
    return nb


def test_a_written_pair_is_in_sync_and_a_stale_or_missing_one_is_named(tmp_path):
    nb = copy(tmp_path)
    assert sources.out_of_sync([nb]) == [f"{nb.name}: no paired source src/{nb.stem}.py"]
    sources.write([nb])
    assert sources.out_of_sync([nb]) == []
    text = sources.source_of(nb).read_text()
    assert text.startswith("# %% [markdown]") and '"outputs"' not in text  # no metadata, no outputs
    sources.source_of(nb).write_text(text.replace("session.start(", "session.start( ", 1))
    [problem] = sources.out_of_sync([nb])
    assert "differs" in problem and "write" in problem


def test_update_takes_the_edited_code_and_keeps_the_other_cells_outputs(tmp_path):
    nb = copy(tmp_path)
    sources.write([nb])
    before = json.loads(nb.read_text())
    src = sources.source_of(nb)
    lines = src.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "session.start(" in ln and not ln.startswith("#"))
    lines[at] = lines[at].rstrip("\n") + "  # edited\n"
    src.write_text("".join(lines))
    sources.update([nb])
    after = json.loads(nb.read_text())
    assert sources.out_of_sync([nb]) == []
    codes = [(b, a) for b, a in zip(before["cells"], after["cells"]) if b["cell_type"] == "code"]
    text = lambda cell: "".join(cell["source"]).rstrip("\n")  # noqa: E731 (jupytext drops a trailing newline)
    edited = [i for i, (b, a) in enumerate(codes) if text(b) != text(a)]
    assert len(edited) == 1 and "# edited" in "".join(codes[edited[0]][1]["source"])
    assert all(b["outputs"] == a["outputs"] for i, (b, a) in enumerate(codes) if i not in edited)
    assert after["metadata"] == before["metadata"]


def test_the_command_line_checks_and_refuses_what_is_not_a_notebook(tmp_path, capsys):
    nb = copy(tmp_path)
    assert sources.main(["check", str(nb)]) == 1
    assert sources.main(["write", str(nb)]) == 0
    assert sources.main(["check", str(nb)]) == 0
    assert sources.main(["check", str(tmp_path / "nope.ipynb")]) == 2
    assert "not a notebook" in capsys.readouterr().err
