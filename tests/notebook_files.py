"""The programs a notebook writes with ``%%writefile {FOLDER}/name.py`` cells, for tests to run.

A notebook keeps a program it teaches in a cell the learner reads and edits; the tests take the
same source from the stored ``.ipynb`` so they check what the learner runs, not a copy.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from course_utils import config


def written_files(notebook: str, folder: str) -> dict[str, str]:
    """Return ``{file name: source}`` of every ``%%writefile {folder}/name.py`` code cell of ``notebook``
    (a file name under ``notebooks/``); a file written by two cells is an error."""
    pattern = re.compile(r"^%%writefile \{" + re.escape(folder) + r"\}/(\w+\.py)\n")
    cells = json.loads((config.REPO_ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    files: dict[str, str] = {}
    for cell in cells:
        text = "".join(cell["source"])
        match = pattern.match(text)
        if cell["cell_type"] == "code" and match:
            assert match.group(1) not in files, f"{match.group(1)} is written twice in {notebook}"
            files[match.group(1)] = text[match.end():]
    return files


def write_files(notebook: str, folder: str, into: Path) -> Path:
    """Write the notebook's files into the folder ``into`` (created) and return it."""
    into.mkdir(parents=True, exist_ok=True)
    for name, source in written_files(notebook, folder).items():
        (into / name).write_text(source, encoding="utf-8")
    return into


def import_written(notebook: str, folder: str, name: str, into: Path) -> ModuleType:
    """Write the notebook's files into ``into`` and import ``name`` (a module name) from there."""
    path = write_files(notebook, folder, into) / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"{notebook} has no %%writefile {{{folder}}}/{name}.py cell")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@functools.cache
def written_module(notebook: str, folder: str, name: str) -> ModuleType:
    """Return module ``name`` as ``notebook`` writes it, imported once per test process from a folder
    of its own under ``build/`` (so that a program started from the file finds it there)."""
    root = config.build_dir() / "written"
    root.mkdir(parents=True, exist_ok=True)
    return import_written(notebook, folder, name, Path(tempfile.mkdtemp(prefix=Path(notebook).stem + "-", dir=root)))
