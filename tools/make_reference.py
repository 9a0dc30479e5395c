"""Write data/reference_results.json from a real full-mode run's results file.

    python tools/make_reference.py build/report/results.jsonl build/workshop/results.jsonl

Reads one or more results files; keeps the latest full-mode record of each headline name (a
quick-mode one only where no full-mode run recorded it), plus a description of this machine
(CPU model, cores, memory, CPU class), the versions and the date. Records made under a CPU
profile (``python -m course_utils cpu --profile avx2 -- ...``) carry that class and are kept
apart under ``classes``, so the report can compare a learner with the figures of their class. The expected ranges live
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

from course_utils import bench  # noqa: E402
from course_utils.kit import report  # noqa: E402


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


def pick(records: list[dict]) -> dict[str, dict]:
    """Return the latest record of each name, a full-mode one winning over a quick-mode one."""
    return report.latest([r for r in records if r.get("mode") == "quick"]
                         + [r for r in records if r.get("mode") != "quick"])


def table(records: dict[str, dict]) -> dict[str, dict]:
    return {n: {"value": r["value"], "unit": r["unit"], "mode": r["mode"]} for n, r in sorted(records.items())}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    every = [rec for path in sys.argv[1:] for rec in bench.read_results(path)]
    if not every:
        sys.exit(f"no results in {', '.join(sys.argv[1:])}")
    import torch

    from course_utils import cpu

    native = cpu.classify(platform.machine(), cpu.capabilities(), torch.backends.cpu.get_cpu_capability())[0]
    by_class: dict[str, list[dict]] = {}
    for rec in every:  # records from a CPU profile (make test-avx2, ...) carry that profile's class
        by_class.setdefault(str(rec.get("cpu_class") or native), []).append(rec)
    records = pick(by_class.get(native) or every)
    machine = {
        "description": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB, no GPU, {platform.system()}",
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
        "mode": "/".join(sorted({r["mode"] for r in records.values()})),
        "cpu_class": native,
    }
    out = {"machine": machine, "results": table(records),
           "classes": {cls: {"how": "native" if cls == native else "this machine under a CPU profile",
                             "results": table(pick(recs))}
                       for cls, recs in sorted(by_class.items())}}
    path = ROOT / "data" / report.REFERENCE_FILE
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(records)} results ({native}), classes {sorted(by_class)}, {machine['description']}")


if __name__ == "__main__":
    main()
