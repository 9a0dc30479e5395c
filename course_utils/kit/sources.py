"""Which plain-text source goes with each notebook, and is it in sync? Jupytext ``py:percent`` pairs.

Every ``notebooks/NN_topic.ipynb`` (what learners open, with its stored outputs) has a reviewable
twin ``notebooks/src/NN_topic.py``: its cells as ``# %%`` blocks, markdown as comments, no outputs
and no metadata. A code change then shows in review as a plain diff, and the linters, ``duplicates``
and the one-home scans read notebook code as code. ``tests/test_notebooks.py`` fails when a pair
differs.

    python -m course_utils.kit.sources write  [NB ...]   # .ipynb -> src/*.py (after editing in Jupyter)
    python -m course_utils.kit.sources update [NB ...]   # src/*.py -> .ipynb inputs, outputs kept
    python -m course_utils.kit.sources check  [NB ...]   # exit 1, naming each notebook out of sync

Without arguments each command takes every notebook. ``update`` keeps a notebook's outputs for the
cells whose source is unchanged; re-run the notebook (``make execute``) after a code change.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import config
from ..text import counted

NOTEBOOKS = config.REPO_ROOT / "notebooks"
#: The text format, and what it leaves out: every notebook-level field and every cell field but tags.
FORMAT = "py:percent"
OPTIONS = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags"}


def notebooks() -> list[Path]:
    """Return the course's notebooks, in order."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def source_of(notebook: Path) -> Path:
    """Return the path of a notebook's paired source (``notebooks/src/<name>.py``)."""
    return notebook.parent / "src" / (notebook.stem + ".py")


def text_of(notebook: Path) -> str:
    """Return the paired source text that ``notebook`` should have."""
    import jupytext

    nb = jupytext.read(notebook)
    nb.metadata.setdefault("jupytext", {}).update(OPTIONS)
    return jupytext.writes(nb, fmt=FORMAT)


def out_of_sync(paths: Sequence[Path]) -> list[str]:
    """Return a line for each notebook whose paired source is missing or differs."""
    problems = []
    for nb in paths:
        src = source_of(nb)
        if not src.is_file():
            problems.append(f"{nb.name}: no paired source {src.relative_to(nb.parent)}")
        elif src.read_text(encoding="utf-8") != text_of(nb):
            problems.append(f"{nb.name}: {src.name} differs (run: python -m course_utils.kit.sources write "
                            f"or update, whichever side you edited)")
    return problems


def write(paths: Sequence[Path]) -> None:
    """Write each notebook's paired source from the notebook."""
    for nb in paths:
        src = source_of(nb)
        src.parent.mkdir(exist_ok=True)
        src.write_text(text_of(nb), encoding="utf-8")


def update(paths: Sequence[Path]) -> None:
    """Take each notebook's cells from its paired source, keeping the outputs of unchanged cells."""
    import jupytext
    from jupytext.combine import combine_inputs_with_outputs

    for nb_path in paths:
        src = source_of(nb_path)
        if not src.is_file():
            raise FileNotFoundError(f"{src} does not exist: run `write` first")
        stored = jupytext.read(nb_path)
        edited = jupytext.reads(src.read_text(encoding="utf-8"), fmt=FORMAT)
        combined = combine_inputs_with_outputs(edited, stored, fmt=FORMAT)
        combined.metadata = stored.metadata
        jupytext.write(combined, nb_path, fmt="ipynb")


def chosen(given: Sequence[Path]) -> list[Path] | None:
    """Return the notebooks a command names (every notebook when none), or None after printing which
    of them is not a notebook."""
    paths = [p.resolve() for p in given] or notebooks()
    missing = [str(p) for p in paths if p.suffix != ".ipynb" or not p.is_file()]
    if missing:
        print(f"error: not a notebook: {', '.join(missing)}", file=sys.stderr)
        return None
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.kit.sources", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("write", "update", "check"))
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = chosen(args.notebooks)
    if paths is None:
        return 2
    if args.command == "check":
        problems = out_of_sync(paths)
        print("\n".join(problems) if problems else f"{counted(len(paths), 'notebook')} in sync with their sources")
        return 1 if problems else 0
    (write if args.command == "write" else update)(paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
