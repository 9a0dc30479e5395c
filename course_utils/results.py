"""Which headline results did a run record? The results ledger that ``make report`` reads.

``record`` appends one result (a dotted name, a finite value, its unit and context, plus the
mode, torch version, the device it was computed on, CPU class and time) as a JSON line to the ``COURSE_RESULTS`` file
when that is set; ``read_results`` reads such a file back. The names are a contract: the report's
expected ranges (``kit/report.py``) look results up by name. Notebooks call ``bench.record``,
which is this function.

``record_verdict`` does the same for a *verdict* a cell prints (faster, slower, no clear
difference, higher, lower, pays, ...): a record with ``"kind": "verdict"``, the verdict in place
of a value, and what can flip it (CPU class, cores, torch threads, mode, a noisy measurement).
Verdict names are their own namespace, so two runs (yours and the reference machine's, see
``python -m course_utils report``) can be compared verdict by verdict. ``bench.Comparison.verdict``
and ``bench.band_verdict`` call it when given ``name=``.

A record's ``device`` is where its number was computed, not what the machine has: the lessons
measure on the CPU on every machine (so a GPU laptop's figures still compare with the CPU
ranges), and only the GPU cells pass ``device="cuda"`` (their ``bench.compare`` does it for
them). A record computed on CUDA also names the GPU's class.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from . import config

_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
#: A verdict is a short lower-case phrase: "faster", "no clear difference", "does not pay".
_VERDICT_RE = re.compile(r"^[a-z][a-z0-9 /_-]{0,59}$")
#: ``"kind"`` of a verdict record; a record without ``"kind"`` is a headline result.
VERDICT = "verdict"


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{what} name {name!r} must be dotted lower-case words, e.g. 'setup.first_call_s'")


def _context(context: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in context.items()}


def _where(device: Any) -> torch.device:
    """Return ``device`` (a torch.device, a string such as ``"cuda"``, or None for the CPU) as a torch.device."""
    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device torch understands (try 'cpu' or 'cuda')") from err


def _stamp(device: Any = None) -> dict[str, Any]:
    """The facts every record carries: mode, torch, the device it was computed on (default: the
    CPU), CPU class and time; on CUDA the GPU's class too."""
    from .cpu import cpu_class
    from .device import cuda_description

    where = _where(device)
    stamp = {"mode": config.mode_name(), "torch": torch.__version__, "device": where.type,
             "cpu_class": cpu_class(), "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    if where.type == "cuda":  # the GPU's class: its name and architecture ("NVIDIA H200 (sm_90)")
        stamp["gpu_class"] = cuda_description()
    return stamp


def _append(entry: dict[str, Any]) -> None:
    path = config.results_path()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def record(name: str, value: float, unit: str, *, device: Any = None, **context: Any) -> dict[str, Any]:
    """Return the headline result as a dict, appending it as a JSON line to ``COURSE_RESULTS`` if set.

    ``name`` is dotted lower-case (``compile.speedup.fusion``); ``value`` a finite
    number; ``device`` where it was computed (default: the CPU; pass ``"cuda"`` from a GPU
    cell); ``context`` any extra facts (sizes, settings). Each record also notes
    the mode (quick/full), torch version, CPU class and time.
    """
    _check_name(name, "result")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"result {name!r} needs a finite number, got {value!r}")
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a string such as 's' or 'x', got {type(unit).__name__}")
    entry = {"name": name, "value": float(value), "unit": unit, **_stamp(device), "context": _context(context)}
    _append(entry)
    return entry


def record_verdict(name: str, verdict: str, *, noisy: bool = False, device: Any = None, **context: Any) -> str:
    """Record the verdict a cell prints under a stable ``name``; return ``verdict`` (lower-cased).

    ``verdict`` is a short phrase ("faster", "no clear difference", "lower", "pays"); ``noisy``
    says the measurement behind it had a large spread (a busy machine); ``device`` where it was
    measured (default: the CPU; ``Comparison`` passes its own); ``context`` holds what
    it compared (labels, ratio, band). The record also notes the cores and torch threads, so a
    report can say why the same verdict came out differently on another machine. Use it as
    ``print(f"compiled: {bench.record_verdict('compile.chain', word)}")``, or pass ``name=`` to
    ``Comparison.verdict`` / ``describe`` / ``band_verdict``, which call it.
    """
    _check_name(name, "verdict")
    if not isinstance(verdict, str) or not _VERDICT_RE.match(verdict.strip().lower()):
        raise ValueError(f"verdict {verdict!r} for {name!r} must be a short lower-case phrase such as "
                         "'faster', 'no clear difference' or 'does not pay'")
    verdict = verdict.strip().lower()
    entry = {"kind": VERDICT, "name": name, "verdict": verdict, **_stamp(device),
             "cores": os.cpu_count(), "threads": torch.get_num_threads(), "noisy": bool(noisy),
             "context": _context(context)}
    _append(entry)
    return verdict


def is_verdict(rec: Any) -> bool:
    """Return whether ``rec`` (a record read back) is a verdict record rather than a headline result."""
    return isinstance(rec, dict) and rec.get("kind") == VERDICT


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
