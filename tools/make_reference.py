"""Write data/reference_results.json from a real full-mode run's results file.

    python tools/make_reference.py build/report/results.jsonl build/workshop/results.jsonl

Reads one or more results files; keeps the latest full-mode record of each headline name (a
quick-mode one only where no full-mode run recorded it), plus a description of this machine
(CPU model, cores, memory), the versions and the date. The expected ranges live
apart, in data/expected_ranges.json, set by hand.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils import bench, report  # noqa: E402


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        return round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    every = [rec for path in sys.argv[1:] for rec in bench.read_results(path)]
    # a full-mode figure beats a quick-mode one of the same name (quick shrinks the work)
    records = report.latest([r for r in every if r.get("mode") == "quick"]
                            + [r for r in every if r.get("mode") != "quick"])
    if not records:
        sys.exit(f"no results in {', '.join(sys.argv[1:])}")
    modes = {r["mode"] for r in records.values()}
    import torch

    machine = {
        "description": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB, no GPU, {platform.system()}",
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
        "mode": "/".join(sorted(modes)),
        "cpu_class": "/".join(sorted({str(r.get("cpu_class", "unknown")) for r in records.values()})),
    }
    out = {"machine": machine,
           "results": {n: {"value": r["value"], "unit": r["unit"], "mode": r["mode"],
                           "cpu_class": r.get("cpu_class", "unknown")}
                       for n, r in sorted(records.items())}}
    path = ROOT / "data" / report.REFERENCE_FILE
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(records)} results, {machine['description']}")


if __name__ == "__main__":
    main()
