"""Write data/reference_results.json from a real full-mode run's results file.

    python tools/make_reference.py build/report/results.jsonl build/workshop/results.jsonl
    python tools/make_reference.py --update build/results-08.jsonl     # re-ran one notebook
    python tools/make_reference.py --class-only build/report/results.jsonl  # a machine of another class

Reads one or more results files; keeps the latest full-mode record of each headline name (a
quick-mode one only where no full-mode run recorded it), plus a description of this machine
(CPU model, cores, memory, CPU class), the versions and the date. Records made under a CPU
profile (``python -m course_utils cpu --profile avx2 -- ...``) carry that class and are kept
apart under ``classes``, so the report can compare a learner with the figures of their class. The expected ranges live
apart, in data/expected_ranges.json, set by hand.

The verdict records (``bench.record_verdict``) go under ``verdicts``, the same way: the latest
full-mode one of each name, with the cores, threads, mode and spread flag that can flip it.

Every figure carries the date it was measured. ``--update`` keeps what the file holds and
replaces only the names the given files record (after re-running some notebooks); the machine's
``date`` then spans the figures' dates.

``--class-only`` files a run made natively on a machine of another CPU class (a real AVX2 laptop,
say) under ``classes`` alone, described as that machine, and leaves the reference machine's own
figures as they are. A class section measured another way (under a profile before, natively now)
is replaced whole, so one section never mixes the two.
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
    return {n: {"value": r["value"], "unit": r["unit"], "mode": r["mode"], "date": _date(r)}
            for n, r in sorted(records.items())}


def _date(rec: dict) -> str | None:
    stamp = rec.get("time")
    return stamp[:10] if isinstance(stamp, str) else None


def verdict_table(records: list[dict]) -> dict[str, dict]:
    """Return the latest verdict of each name (a full-mode one winning over a quick-mode one)."""
    kept = report.latest_verdicts([r for r in records if r.get("mode") == "quick"]
                                  + [r for r in records if r.get("mode") != "quick"])
    return {n: {**{k: r.get(k) for k in ("verdict", "mode", "cores", "threads", "noisy", "torch", "cpu_class")},
                "date": _date(r)} for n, r in sorted(kept.items())}


def merge(old: dict, new: dict) -> dict:
    """Return ``old`` with the results and verdicts ``new`` holds put in (names ``new`` lacks keep
    their old figure and date); the machine's date spans every figure's."""
    out = json.loads(json.dumps(old))
    for key in ("results", "verdicts"):
        out.setdefault(key, {}).update(new.get(key, {}))
    for cls, section in new.get("classes", {}).items():
        classes = out.setdefault("classes", {})
        if classes.get(cls, {}).get("how") != section["how"]:  # measured another way: replace it whole
            classes[cls] = {"how": section["how"]}
        mine = classes[cls]
        for key in ("results", "verdicts"):
            mine.setdefault(key, {}).update(section.get(key, {}))
    if "machine" not in new:  # --class-only: the reference machine's own figures stay as they were
        return out
    dates = sorted({e["date"] for key in ("results", "verdicts") for e in out[key].values() if e.get("date")}
                   | set(old["machine"].get("date", "").split(" to ")) - {""})  # the old span's two ends
    modes = "/".join(sorted({e["mode"] for e in out["results"].values() if e.get("mode")}))
    out["machine"] = {**new["machine"], "date": dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}",
                      "mode": modes or new["machine"].get("mode")}
    return out


def main() -> None:
    args = sys.argv[1:]
    update = "--update" in args
    class_only = "--class-only" in args
    args = [a for a in args if a not in ("--update", "--class-only")]
    if not args:
        sys.exit(__doc__)
    every = [rec for path in args for rec in bench.read_results(path)]
    if not every:
        sys.exit(f"no results in {', '.join(args)}")
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
    verdicts = verdict_table(by_class.get(native) or every)
    out = {"machine": machine, "results": table(records), "verdicts": verdicts,
           "classes": {cls: {"how": "native" if cls == native else "this machine under a CPU profile",
                             "results": table(pick(recs)), "verdicts": verdict_table(recs)}
                       for cls, recs in sorted(by_class.items())}}
    path = ROOT / "data" / report.REFERENCE_FILE
    if class_only:
        if not path.exists():
            sys.exit(f"--class-only adds a class to {path}, which does not exist yet")
        native_recs = by_class.get(native) or every
        out = {"classes": {native: {"how": f"native: {machine['description']}, torch {machine['torch']}",
                                    "results": table(pick(native_recs)), "verdicts": verdict_table(native_recs)}}}
        path.write_text(json.dumps(merge(json.loads(path.read_text(encoding="utf-8")), out), indent=1) + "\n",
                        encoding="utf-8")
        print(f"wrote {path}: class {native} only ({len(out['classes'][native]['results'])} results, "
              f"{len(out['classes'][native]['verdicts'])} verdicts), {machine['description']}")
        return
    if update and path.exists():
        out = merge(json.loads(path.read_text(encoding="utf-8")), out)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(records)} results and {len(verdicts)} verdicts ({native}), "
          f"classes {sorted(by_class)}, {machine['description']}")


if __name__ == "__main__":
    main()
