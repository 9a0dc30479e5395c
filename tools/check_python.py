"""Can this Python build the course's .venv? `make setup` runs this before `python -m venv`.

It checks the two things that make `make setup` fail with a long traceback or a half-made .venv:
a Python below the course's floor (``requires-python`` in pyproject.toml), and a Python without
the ``venv`` or ``ensurepip`` module (Debian and Ubuntu ship ``ensurepip`` apart, in the
``python3-venv`` package, so a stock Ubuntu 24.04 cannot make a virtual environment). When one is
wrong it prints what to do, first the routes that need no admin rights, and exits with status 1.

Run it with the interpreter to check: ``python3.10 tools/check_python.py``. It must run on any
Python a learner may have, so it uses the standard library only and no syntax newer than 2.7.
"""
# ruff: noqa: UP024, UP031, UP032  (it must run where the course's Python does not: no f-strings, old names)

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FLOOR = (3, 11)

NO_ADMIN = """Without admin rights, any of these puts a suitable Python in your home folder:
  - uv (prebuilt Pythons; uv installs itself into ~/.local/bin, see
    https://docs.astral.sh/uv/getting-started/installation/):
        uv python install {floor}
        make setup PYTHON="$(uv python find {floor})"
  - conda or Miniforge (prebuilt Python, C++ compiler and CMake; the environment replaces .venv):
        conda env create -f environment.yml && conda activate pytorch2-course
    then follow README's "The conda route" instead of make setup.
  - pyenv (builds Python from source, so it needs a C compiler and the OpenSSL, zlib, bz2,
    libffi, readline and sqlite headers already on the machine):
        pyenv install {floor}
        make setup PYTHON="$(pyenv root)/versions/$(pyenv latest {floor})/bin/python"
With admin rights on Debian or Ubuntu: {apt}"""


def floor_from_pyproject(path):
    """Return the (major, minor) floor of pyproject.toml's requires-python, or DEFAULT_FLOOR."""
    try:
        with open(path) as handle:
            text = handle.read()
    except (IOError, OSError):
        return DEFAULT_FLOOR
    match = re.search(r'requires-python\s*=\s*">=\s*(\d+)\.(\d+)', text)
    return (int(match.group(1)), int(match.group(2))) if match else DEFAULT_FLOOR


def has_module(name):
    """Return True when this Python can import ``name`` (without importing it)."""
    try:
        import importlib.util
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # Python 2 has no importlib.util; a broken entry in sys.modules
        try:
            __import__(name)
            return True
        except ImportError:
            return False


def problems(version, modules_present, floor):
    """Return the message lines for a Python of ``version`` whose venv/ensurepip presence is
    ``modules_present`` ({name: bool}); an empty list when it can build the course's .venv."""
    here = "%s (Python %s)" % (sys.executable or "this Python", ".".join(str(v) for v in version[:3]))
    want = "%d.%d" % floor
    if tuple(version[:2]) < tuple(floor):
        apt = "sudo apt install python%s python%s-venv, then make setup PYTHON=python%s" % (want, want, want)
        return ["make setup: %s is too old: the course needs Python %s or newer." % (here, want),
                NO_ADMIN.format(floor=want, apt=apt)]
    missing = [name for name in ("venv", "ensurepip") if not modules_present.get(name, False)]
    if missing:
        own = "%d.%d" % tuple(version[:2])
        apt = "sudo apt install python%s-venv (or python3-venv), then make setup again" % own
        return ["make setup: %s cannot create the course's .venv: it has no %s module. Debian and "
                "Ubuntu ship it apart from Python, in the python%s-venv package." % (here, " or ".join(missing), own),
                NO_ADMIN.format(floor=want, apt=apt)]
    return []


def notes(version):
    """Return warnings for a Python of ``version`` that can build the course's .venv but costs part of
    it (the setup goes on): Python 3.13.0, where a CPython bug fixed in 3.13.1 slows torch's guards."""
    if tuple(version[:3]) == (3, 13, 0):
        return ["make setup: note: Python 3.13.0 works, but torch's compiled functions check their guards more "
                "slowly on it (a CPython bug fixed in 3.13.1; torch warns about it). Python 3.13.1 or newer, "
                "or 3.11 or 3.12, avoids that: `uv python install 3.13`, then "
                "make setup PYTHON=\"$(uv python find 3.13)\"."]
    return []


def main():
    """Print what is wrong with this Python for the course and return 1, or print any note and return 0."""
    floor = floor_from_pyproject(os.path.join(ROOT, "pyproject.toml"))
    found = problems(tuple(sys.version_info), {name: has_module(name) for name in ("venv", "ensurepip")}, floor)
    if found:
        sys.stderr.write("\n".join(found) + "\n")
        return 1
    for line in notes(tuple(sys.version_info)):
        sys.stderr.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
