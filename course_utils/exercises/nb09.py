"""Exercises of notebook 09: reading profiler tables and Chrome traces."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .framework import Mistake, case, function_exercise

# --- 09.top_self_op: name the operator with the largest self CPU time.


def _profiles() -> list[tuple[Any]]:
    """Return profiles of two labelled workloads, one dominated by aten::mm and one by aten::sort."""
    gen = torch.Generator().manual_seed(0)
    square = torch.randn(384, 384, generator=gen)
    long = torch.randn(400_000, generator=gen)

    def matmul_heavy() -> None:
        with record_function("exercise_work"):
            (square @ square).relu_()
            long[:16] + 1

    def sort_heavy() -> None:
        with record_function("exercise_work"):
            torch.sort(long)
            square[:8] @ square[:, :8]

    profiles = []
    for work in (matmul_heavy, sort_heavy):
        work()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            work()
        profiles.append((prof,))
    return profiles


def _top_by_events(prof: Any) -> str:
    """What the checker compares with on a real profile: self times summed per name over the raw events."""
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        totals[event.key] += event.self_cpu_time_total
    return max(totals, key=totals.__getitem__)


class _Table:
    """A finished profile reduced to its table: ``key_averages()`` rows with hand-chosen times (in us).

    ``events()`` gives the same rows, one event per name, so an answer that reads the raw events (as the
    reference does) works on it as on a real profile; the exercise's text names what these tables offer.
    """

    def __init__(self, *rows: tuple[str, float, float, int]) -> None:
        self.rows = [SimpleNamespace(key=key, name=key, self_cpu_time_total=own, cpu_time_total=total, count=count)
                     for key, own, total, count in rows]

    def key_averages(self) -> list[SimpleNamespace]:
        return list(self.rows)

    def events(self) -> list[SimpleNamespace]:
        return list(self.rows)

    def __repr__(self) -> str:
        return "<profile>"


def _top_self_cases() -> list[Any]:
    # Rows: (key, self time, total time, calls). The label comes first and has the largest total; the most
    # frequent operator is not the most expensive: only the largest self time answers.
    return [case(_Table(("exercise_work", 40.0, 900.0, 1), ("aten::mm", 650.0, 650.0, 1),
                        ("aten::add", 30.0, 30.0, 6), ("aten::relu_", 60.0, 60.0, 1)), gives="aten::mm"),
            case(_Table(("ProfilerStep#1", 5.0, 3000.0, 1), ("aten::copy_", 120.0, 120.0, 9),
                        ("aten::sort", 2500.0, 2600.0, 1), ("aten::empty", 2.0, 2.0, 20)), gives="aten::sort"),
            *_profiles()]   # real profiles: compared with _top_by_events


def top_self_op(prof: Any) -> str:
    """Return the name of the operator with the largest self CPU time in prof."""
    return max(prof.key_averages(), key=lambda e: e.self_cpu_time_total).key


_HOW = ("Take the row of prof.key_averages() with the largest self_cpu_time_total and return its .key, a string "
        "such as 'aten::mm'.")


def _top_self_mistakes() -> list[Mistake]:
    return [(lambda prof: max(prof.key_averages(), key=lambda e: e.cpu_time_total).key,
             "That is the record_function label: the first row, and the largest *total* time, which includes its "
             "children. " + _HOW),
            (lambda prof: max(prof.key_averages(), key=lambda e: e.count).key,
             "The most frequent operator is not the most expensive. " + _HOW),
            (lambda prof: "", "Still the stub? " + _HOW)]


function_exercise(
    "09.top_self_op",
    solution=top_self_op,
    reference=_top_by_events,
    cases=_top_self_cases,
    mistakes=_top_self_mistakes,
    wrong=lambda: [(lambda prof: next(iter(prof.key_averages())).key, "self_cpu_time_total"),
                   (lambda prof: max(prof.key_averages(), key=lambda e: e.self_cpu_time_total), "its .key, a string"),
                   ("aten::mm", "expected a function")],
    otherwise=_HOW,
    success="your function names the operator that does the most work by itself.",
)

# --- 09.count_aten_events: count the aten:: operator events in a Chrome trace.


def _event(name: str, ph: str = "X", cat: str = "cpu_op", ts: float = 0.0) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts}
    if ph == "X":
        event["dur"] = 1.0
    return event


def _traces() -> list[Any]:
    """Return three small traces: 3, 2 and 0 complete aten:: events among labels, regions and metadata."""
    return [case({"schemaVersion": 1, "traceEvents": events}, gives=count) for count, events in zip((3, 2, 0), (
        [_event("aten::conv2d"), _event("aten::convolution", ts=1), _event("aten::relu", ts=2),
         _event("forward", cat="user_annotation"), _event("thread_name", ph="M", cat="")],
        [_event("Torch-Compiled Region: 0/0", cat="cpu_op"), _event("aten::addmm", ts=3),
         _event("aten::empty", ph="i", ts=4), _event("aten::mm", ts=5),
         {"name": "process_name", "ph": "M", "args": {"name": "python"}}],
        [_event("ProfilerStep#3", cat="user_annotation"), _event("Memcpy HtoD", cat="gpu_memcpy"),
         {"ph": "f", "id": 1, "ts": 2}]))]


def count_aten_events(trace: dict[str, Any]) -> int:
    """Return how many complete ("ph": "X") events of trace are aten:: operators."""
    return sum(1 for e in trace["traceEvents"]
               if e.get("ph") == "X" and e.get("name", "").startswith("aten::"))


def _count_mistakes() -> list[Mistake]:
    rule = ("Count only events whose 'ph' is 'X' (complete events) and whose 'name' starts with 'aten::'; "
            "labels, compiled regions and instant events do not count.")
    return [(lambda trace: sum(e.get("ph") == "X" for e in trace["traceEvents"]), rule),
            (lambda trace: sum(e.get("name", "").startswith("aten::") for e in trace["traceEvents"]), rule),
            (lambda trace: sum(e.get("cat") == "cpu_op" and e.get("ph") == "X" for e in trace["traceEvents"]), rule),
            (lambda trace: sum(e["name"].startswith("aten::") and e["ph"] == "X" for e in trace["traceEvents"]),
             "use event.get(...)")]


function_exercise(
    "09.count_aten_events",
    solution=count_aten_events,
    cases=_traces,
    mistakes=_count_mistakes,
    errors=[(KeyError, "Some events (metadata, flow arrows) lack that key; use event.get(...).")],
    otherwise="Count only events whose 'ph' is 'X' (complete events) and whose 'name' starts with 'aten::'.",
    success="your count matches on every trace.",
)
