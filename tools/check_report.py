"""Fail when a headline result of `make report` is outside its expected range (the weekly CI job).

Usage: python tools/check_report.py [RESULTS]   (default: COURSE_RESULTS, or build/report/results.jsonl)

Reads the results `make report` recorded, judges each against data/expected_ranges.json exactly
as the report does (course_utils.kit.report.build_rows), prints the rows whose verdict is "below ...",
"above ..." or "invalid value ..." (a record whose value is not a finite number), and exits 1 when
there is any (or when there are no results at all).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from course_utils import bench, config
from course_utils.kit import report


def out_of_range(records: Sequence[dict]) -> list[report.Row]:
    """Return the report rows whose result is below or above its expected range, or invalid."""
    rows = report.build_rows(records, report.load_reference())
    return [r for r in rows if r.verdict.startswith(("below", "above", report.INVALID))]


def main(argv: Sequence[str] | None = None) -> int:
    """Return 0 when every recorded headline result is in range, 1 otherwise (printing why)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    path = Path(argv[0]) if argv else config.results_path() or config.build_dir() / "report" / "results.jsonl"
    records = bench.read_results(path)
    if not records:
        print(f"no results in {path}: run `make report` first")
        return 1
    bad = out_of_range(records)
    for row in bad:
        if row.value is None:
            print(f"{row.name}: {row.verdict}")
            continue
        low, high = row.expected or (float("nan"), float("nan"))
        print(f"{row.name}: {row.value:g} {row.unit} is {row.verdict} [{low:g}, {high:g}]")
    if bad:
        print(f"{len(bad)} headline result(s) outside the expected range or invalid ({path})")
        return 1
    print(f"every recorded headline result is in its expected range ({len(records)} records, {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
