"""Notebook hygiene and structure; nbval itself executes them (see pyproject's addopts)."""

import json
import re
import subprocess
import sys

import pytest

from course_utils import config

ROOT = config.REPO_ROOT
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ALLOWED_NB_METADATA = {"kernelspec", "language_info"}


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


def test_every_notebook_is_collected_by_nbval():
    """A notebook that nbval silently skips is a failure: every code cell must be an item."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "notebooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for path in NOTEBOOKS:
        rel = path.relative_to(ROOT).as_posix()
        items = [ln for ln in out.stdout.splitlines() if ln.startswith(rel + "::")]
        assert len(items) == len(code_cells(load(path))), f"{rel}: {len(items)} items collected"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_saved_clean(path):
    nb = load(path)
    assert set(nb["metadata"]) <= ALLOWED_NB_METADATA, set(nb["metadata"]) - ALLOWED_NB_METADATA
    assert nb["metadata"]["kernelspec"]["name"] == "pytorch2-course"
    lang = nb["metadata"].get("language_info", {})
    assert set(lang) <= {"name"}, "language_info carries machine-specific versions"
    for cell in nb["cells"]:
        assert not (set(cell.get("metadata", {})) - {"tags"}), cell.get("metadata")
        for out in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in out.get("data", {})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_and_its_paired_source_agree(path):
    """notebooks/src/<name>.py is the notebook's reviewable twin (course_utils.kit.sources)."""
    from course_utils.kit import sources

    assert sources.out_of_sync([path]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_come_from_one_top_to_bottom_run(path):
    counts = [c["execution_count"] for c in code_cells(load(path))]
    assert all(isinstance(n, int) for n in counts), "some cells were never run"
    assert counts == list(range(1, len(counts) + 1)), "cells were not run once, in order"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_template(path):
    nb = load(path)
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    code = "\n".join("".join(c["source"]) for c in code_cells(nb))
    assert "".join(nb["cells"][0]["source"]).startswith("# "), "first cell must be the title"
    for heading in ("What you will learn", "Check yourself", "Summary"):
        assert heading in md, f"missing section: {heading}"
    assert re.search(r"(?i)time on a laptop CPU", md), "state the time on a laptop CPU"
    assert "session.start(" in code, "the setup cell must call session.start()"
    assert "exercises.check(" in code, "exercises must be checked by a course_utils checker"
    assert "NBVAL_SKIP" not in code, "notebook cells may not be skipped"


def test_readme_maps_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert path.name in readme, f"README's notebook map lacks {path.name}"
