"""Print the pins an optional extra adds to the tested set: `pip freeze` of the extra's environment
minus every package constraints.txt already pins.

Used for constraints-executorch.txt, the ExecuTorch extra of notebook 06 (`make executorch`,
`make test-executorch`): after changing the pair, rebuild its environment from constraints.txt and
the new `executorch==...` pin alone, run `make test-executorch`, then

    .venv-et/bin/python tools/freeze_extra.py executorch > constraints-executorch.txt

The extra's pins live in a file of their own, not in constraints.txt, because `make constraints`
rewrites constraints.txt from the main .venv (which has no ExecuTorch) and environment.yml mirrors it
(tests/test_pins.py). pip applies both files together (`-c constraints.txt -c constraints-executorch.txt`),
so a package pinned in both must agree: this tool leaves those out, and tests/test_executorch.py checks it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def norm(name: str) -> str:
    """Return a package name in the normal form pip compares (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_pins(freeze_text: str, constraints_text: str) -> list[str]:
    """Return the ``name==version`` lines of ``freeze_text`` whose package ``constraints_text`` does not
    pin, sorted by name; pip itself and the course's own package are left out."""
    pinned = {norm(ln.split("==")[0]) for ln in constraints_text.splitlines()
              if "==" in ln and not ln.lstrip().startswith("#")}
    out = []
    for line in freeze_text.splitlines():
        if "==" not in line or line.lstrip().startswith("#"):
            continue
        name = norm(line.split("==")[0])
        if name not in pinned and name not in ("pip", "pytorch2-course"):
            out.append(line.strip())
    return sorted(out, key=str.lower)


def header(extra: str) -> str:
    """Return the comment lines that open the extra's constraints file."""
    return "\n".join([
        f"# The tested pins of the optional '{extra}' extra, on top of constraints.txt (pip applies both:",
        f"#   pip install -c constraints.txt -c constraints-{extra}.txt -e '.[dev,{extra}]'; `make {extra}` does).",
        f"# Only packages constraints.txt does not pin. Regenerate: tools/freeze_extra.py {extra} (read it first).",
    ])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not re.fullmatch(r"[a-z0-9-]+", args[0]):
        print("usage: python tools/freeze_extra.py EXTRA   (run with the extra's environment's Python)", file=sys.stderr)
        return 2
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout
    print(header(args[0]))
    print("\n".join(extra_pins(freeze, (ROOT / "constraints.txt").read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
