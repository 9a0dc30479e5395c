"""Write the bytecode of every module in this Python's site-packages, on all cores: ``python tools/compile_bytecode.py``.

`make setup` installs with ``pip install --no-compile`` and runs this afterwards. pip writes the same
``.pyc`` files, but one file after another on one core (about 60 s of a clean clone's setup on the
reference machine, for some 25,000 files); ``compileall`` with one worker per core does it in about
half the wall time on two cores. The files matter even though Python writes bytecode on first import:
where ``PYTHONDONTWRITEBYTECODE`` is set (some CI images and shells set it), nothing is ever written,
and every process that imports torch would compile its modules from source again.

A module that this Python cannot compile is left out, as pip leaves it out (torch ships a test file
in Python 3.12 syntax, for example); the script says so and exits 0.

Warnings that compiling raises are silenced, as pip silences them: on Python 3.12 and later, some
packages the course installs (pydub, which Gradio brings, among them) have string escapes such as
``'\\('`` that make the compiler print a ``SyntaxWarning`` per line, which says nothing about the course.

Packages' own test suites (every file under a folder named ``tests`` or ``test``: some 3,900 of the
25,000 files, pandas' and sympy's above all) are left out too: nothing the course runs imports them,
and Python still compiles such a file in memory if something ever does.
"""

from __future__ import annotations

import compileall
import os
import re
import sys
import sysconfig
import warnings
from pathlib import Path


def test_suites(folder: Path) -> re.Pattern[str]:
    """Return the pattern of paths below ``folder`` inside a folder named ``tests`` or ``test`` (only below
    it: a ``tests`` folder in the path to ``folder`` itself does not count)."""
    return re.compile(re.escape(str(folder)) + r"[/\\](?:.*[/\\])?tests?[/\\]")


def site_packages() -> list[Path]:
    """Return this interpreter's site-packages folders (purelib and platlib, once each)."""
    paths = {Path(sysconfig.get_path(name)) for name in ("purelib", "platlib")}
    return sorted(p for p in paths if p.is_dir())


def main(argv: list[str] | None = None) -> int:
    """Compile every folder from :func:`site_packages` (or the folders given); always return 0."""
    folders = [Path(a) for a in argv] if argv else site_packages()
    # The workers are forked (Python 3.11: they copy this filter) or started by a fork server (3.12 and
    # later: a fresh interpreter, which reads the variable; this interpreter's `-W` options would be
    # passed on to it and win over the variable, so they are dropped).
    warnings.simplefilter("ignore")
    os.environ["PYTHONWARNINGS"] = "ignore"
    sys.warnoptions.clear()
    for folder in folders:
        # quiet=2: not even the files it leaves out
        ok = compileall.compile_dir(folder, quiet=2, workers=0, rx=test_suites(folder))
        note = "" if ok else " (files this Python cannot compile were left out, as pip leaves them)"
        print(f"bytecode written for {folder}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
