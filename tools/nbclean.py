"""Strip machine-specific metadata and widget state from notebooks, keeping their outputs.

Usage: python tools/nbclean.py notebooks/*.ipynb
Kept: the course kernelspec, language_info.name, cell tags, outputs (minus widget views).
tests/test_notebooks.py fails on a notebook that was saved without this.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KERNELSPEC = {"display_name": "PyTorch 2 course (.venv)", "language": "python",
              "name": "pytorch2-course"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def clean(nb: dict) -> dict:
    """Return ``nb`` with metadata reduced to what is portable."""
    nb["metadata"] = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and WIDGET_MIME in data:
                del data[WIDGET_MIME]
            out.get("metadata", {}).pop("transient", None)
    return nb


def main(paths: list[str]) -> int:
    for raw in paths:
        path = Path(raw)
        nb = clean(json.loads(path.read_text(encoding="utf-8")))
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"cleaned {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
