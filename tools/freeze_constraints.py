"""Print a constraints file pinning everything installed in this environment.

Used by `make constraints` after deliberately upgrading packages in .venv;
the course package itself and pip are left out. Update environment.yml to match
(tests/test_pins.py checks it).

Why `pip freeze` and not a resolver's lock file with hashes (pip-compile --generate-hashes, uv pip
compile): the file is a *constraints* file (`pip install -c`), and pip does not enforce hashes
there (a hashed constraint turns on --require-hashes for the requirements, which then fail: pypa/pip
issues 9243 and 12956), while the course's own editable install cannot carry a hash at all. The
tested set is what was installed and tested, which is exactly what `pip freeze` records.
"""

import subprocess
import sys

HEADER = """\
# Exact tested set installed by 'make' (pip install -c constraints.txt).
# Regenerate: make constraints (then run make test). Package metadata keeps ranges.
# Python 3.11, Linux x86_64; nvidia-* and triton apply only where torch's CUDA build pulls them in."""


def main() -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                         capture_output=True, text=True, check=True).stdout
    pins = [ln for ln in out.splitlines()
            if "==" in ln and not ln.lower().startswith(("pip==", "pytorch2-course=="))]
    print(HEADER)
    print("\n".join(sorted(pins, key=str.lower)))


if __name__ == "__main__":
    main()
