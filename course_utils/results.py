"""Which headline results did a run record? The results ledger that ``make report`` reads.

``record`` appends one result (a dotted name, a finite value, its unit and context, plus the
mode, torch version, device, CPU class and time) as a JSON line to the ``COURSE_RESULTS`` file
when that is set; ``read_results`` reads such a file back. The names are a contract: the report's
expected ranges (``kit/report.py``) look results up by name. Notebooks call ``bench.record``,
which is this function.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from . import config

_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")


def record(name: str, value: float, unit: str, **context: Any) -> dict[str, Any]:
    """Return the headline result as a dict, appending it as a JSON line to ``COURSE_RESULTS`` if set.

    ``name`` is dotted lower-case (``compile.speedup.fusion``); ``value`` a finite
    number; ``context`` any extra facts (sizes, settings). Each record also notes
    the mode (quick/full), torch version, device, CPU class and time.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"result name {name!r} must be dotted lower-case words, e.g. 'setup.first_call_s'")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"result {name!r} needs a finite number, got {value!r}")
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a string such as 's' or 'x', got {type(unit).__name__}")
    from .cpu import cpu_class
    from .device import get_device

    entry = {
        "name": name,
        "value": float(value),
        "unit": unit,
        "mode": config.mode_name(),
        "torch": torch.__version__,
        "device": str(get_device()),
        "cpu_class": cpu_class(),
        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "context": {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                    for k, v in context.items()},
    }
    path = config.results_path()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
    return entry


def read_results(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Return the records in a results file (default ``COURSE_RESULTS``); [] when there is none."""
    path = Path(path) if path is not None else config.results_path()
    if path is None or not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {n}: not a JSON record ({err.msg})") from err
    return out
