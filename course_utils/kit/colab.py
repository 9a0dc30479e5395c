"""The Open-in-Colab first cell: one source, written into every notebook, checked in the suite.

A notebook opened in Google Colab comes alone, without ``course_utils`` or ``data/``. The cell in
``course_utils/kit/colab_cell.py`` acts only inside Colab (``"google.colab" in sys.modules``): it
clones the course's tagged release, installs it beside Colab's own torch (pinning the torch,
torchvision and torchaudio Colab has, unless torch is older than the course's floor), puts the clone
first on ``sys.path`` (so ``course_utils`` and its ``data/`` come from the clone) and changes into the
clone's ``notebooks/`` (so relative paths work as they do locally). Anywhere else it prints one
line and does nothing.

    python -m course_utils.kit.colab sync  [NB ...]   # write the cell into each notebook (and its twin)
    python -m course_utils.kit.colab check [NB ...]   # exit 1, naming each notebook whose cell differs

The repository URL and the release come from ``pyproject.toml`` (``[project.urls] Repository`` and
``v`` + ``[project] version``), so a fork sets them there and runs ``sync``. The cell goes just
before a notebook's first code cell, tagged ``colab-setup``; its stored output is what the cell
prints when ``sync`` runs it outside Colab.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from .. import config
from . import sources
from ..text import counted

#: The one source of the cell.
CELL_FILE = config.REPO_ROOT / "course_utils" / "kit" / "colab_cell.py"
#: The tag that marks the cell in a notebook (kept by the notebooks' paired sources).
TAG = "colab-setup"
#: What the cell names when pyproject.toml has no repository URL.
PLACEHOLDER_REPOSITORY = "https://github.com/YOUR-ORG/YOUR-REPOSITORY"
_REPOSITORY_LINE = re.compile(r'^(    COURSE_REPOSITORY = )"[^"]*"$', re.MULTILINE)
_RELEASE_LINE = re.compile(r'^(    COURSE_RELEASE = )"[^"]*"$', re.MULTILINE)
_FLOOR_LINE = re.compile(r"^    TORCH_FLOOR = \((\d+), (\d+)\)$", re.MULTILINE)
_SETUPTOOLS_LINE = re.compile(r"^    SETUPTOOLS_FLOOR = (\d+)\b", re.MULTILINE)


def project(root: Path = config.REPO_ROOT) -> dict:
    """Return the ``[project]`` table of ``root``'s pyproject.toml."""
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def release(root: Path = config.REPO_ROOT) -> str:
    """Return the tag the cell installs: ``v`` and the project's version (``v0.1.0``)."""
    return "v" + project(root)["version"]


def repository(root: Path = config.REPO_ROOT) -> str:
    """Return the repository URL the cell clones: ``[project.urls] Repository``, else the placeholder."""
    return project(root).get("urls", {}).get("Repository", PLACEHOLDER_REPOSITORY).removesuffix(".git")


def torch_floor(root: Path = config.REPO_ROOT) -> tuple[int, int]:
    """Return the lowest torch (major, minor) pyproject.toml's ``torch>=`` requirement admits."""
    for requirement in project(root)["dependencies"]:
        match = re.fullmatch(r"torch\s*>=\s*(\d+)\.(\d+)[^,]*(,.*)?", requirement.strip())
        if match:
            return int(match.group(1)), int(match.group(2))
    raise ValueError("pyproject.toml has no `torch>=X.Y` dependency")


def setuptools_floor(root: Path = config.REPO_ROOT) -> int:
    """Return the major version of setuptools that pyproject.toml's ``[build-system] requires`` asks for."""
    requires = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    for requirement in requires:
        match = re.fullmatch(r"setuptools\s*>=\s*(\d+)[^,]*(,.*)?", requirement.strip())
        if match:
            return int(match.group(1))
    raise ValueError("pyproject.toml's [build-system] requires no `setuptools>=N`")


def cell_text(root: Path = config.REPO_ROOT) -> str:
    """Return the cell's source as notebooks carry it: the file with pyproject's URL and release."""
    text = CELL_FILE.read_text(encoding="utf-8").rstrip("\n")
    for pattern, value in ((_REPOSITORY_LINE, repository(root)), (_RELEASE_LINE, release(root))):
        if not pattern.search(text):
            raise ValueError(f"{CELL_FILE.name} lost its line matching {pattern.pattern!r}")
        text = pattern.sub(lambda m, v=value: f'{m.group(1)}"{v}"', text, count=1)
    return text


def cell_floor(text: str) -> tuple[int, int]:
    """Return the ``TORCH_FLOOR`` a cell's text states."""
    match = _FLOOR_LINE.search(text)
    if not match:
        raise ValueError("the cell states no TORCH_FLOOR = (major, minor)")
    return int(match.group(1)), int(match.group(2))


def cell_setuptools_floor(text: str) -> int:
    """Return the ``SETUPTOOLS_FLOOR`` a cell's text states."""
    match = _SETUPTOOLS_LINE.search(text)
    if not match:
        raise ValueError("the cell states no SETUPTOOLS_FLOOR = N")
    return int(match.group(1))


def run_outside_colab(text: str) -> str:
    """Run the cell in a fresh interpreter (no ``google.colab``) and return what it prints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_COLAB_")}
    done = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Colab cell failed outside Colab (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _is_setup_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def problems_in(notebook: dict, text: str) -> list[str]:
    """Return what is wrong with a notebook's Colab cell (missing, repeated, misplaced, different)."""
    cells = notebook.get("cells", [])
    tagged = [i for i, c in enumerate(cells) if _is_setup_cell(c)]
    if not tagged:
        return [f"no code cell tagged {TAG!r}"]
    if len(tagged) > 1:
        return [f"{len(tagged)} cells tagged {TAG!r} (cells {', '.join(str(i + 1) for i in tagged)})"]
    at = tagged[0]
    out = []
    first_code = next(i for i, c in enumerate(cells) if c.get("cell_type") == "code")
    if first_code != at:
        out.append(f"the {TAG!r} cell is cell {at + 1}, but the first code cell is cell {first_code + 1}")
    source = cells[at]["source"]
    if ("".join(source) if isinstance(source, list) else source) != text:
        out.append(f"the {TAG!r} cell differs from {CELL_FILE.name} (run: python -m course_utils.kit.colab sync)")
    return out


def check(paths: Sequence[Path], root: Path = config.REPO_ROOT) -> list[str]:
    """Return one line per problem in the notebooks' Colab cells."""
    import nbformat

    text = cell_text(root)
    return [f"{p.name}: {problem}" for p in paths
            for problem in problems_in(nbformat.read(p, as_version=4), text)]


def sync(paths: Sequence[Path], root: Path = config.REPO_ROOT) -> list[Path]:
    """Write the cell (with the output it prints here) into each notebook and its twin; return the changed."""
    import nbformat

    text = cell_text(root)
    printed = run_outside_colab(text)
    changed = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if not problems_in(nb, text):
            continue
        nb.cells = [c for c in nb.cells if not _is_setup_cell(c)]
        cell = nbformat.v4.new_code_cell(text, metadata={"tags": [TAG]})
        cell.id = TAG
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
        first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
        nb.cells.insert(first_code, cell)
        nbformat.write(nb, path)
        changed.append(path)
    sources.write(changed)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.colab", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("sync", "check"))
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = sources.chosen(args.notebooks)
    if paths is None:
        return 2
    if args.command == "check":
        found = check(paths)
        print("\n".join(found) if found else f"{counted(len(paths), 'notebook')} carry the Colab cell")
        return 1 if found else 0
    changed = sync(paths)
    print(f"wrote the Colab cell into {counted(len(changed), 'notebook')}" +
          (f": {', '.join(p.name for p in changed)}" if changed else " (all were up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
