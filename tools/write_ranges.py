"""Write data/expected_ranges.json in its reviewable layout: one line per result.

    python tools/write_ranges.py          # re-format after editing it by hand or from code

Used by anything that edits the ranges from code (``python -c``), so a diff shows only the
entries that changed.
"""

from __future__ import annotations

import json
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "data" / "expected_ranges.json"


def dumps(data: dict) -> str:
    """Return the ranges file's text: the top-level keys indented, each result on one line."""
    lines = ["{"]
    keys = list(data)
    for i, key in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        if key == "expected":
            lines.append(' "expected": {')
            names = list(data["expected"])
            for j, name in enumerate(names):
                inner = "," if j < len(names) - 1 else ""
                lines.append(f"  {json.dumps(name)}: {json.dumps(data['expected'][name], ensure_ascii=False)}{inner}")
            lines.append(" }" + comma)
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(data[key], ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    data = json.loads(PATH.read_text(encoding="utf-8"))
    text = dumps(data)
    if json.loads(text) != data:  # never write a file that reads back differently
        raise SystemExit("write_ranges: the re-formatted text does not read back as the same data")
    PATH.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
