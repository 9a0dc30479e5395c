"""Exercises of notebook 09: reading profiler tables and Chrome traces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 09.top_self_op: name the operator with the largest self CPU time.
# ---------------------------------------------------------------------------


def _workloads() -> list[tuple[str, Callable[[], Any]]]:
    """Return (expected top self operator, workload) pairs; each workload runs under a label."""
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

    return [("aten::mm", matmul_heavy), ("aten::sort", sort_heavy)]


def _profile(work: Callable[[], Any]) -> Any:
    work()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    return prof


def _top_self_solution() -> Callable[[Any], str]:
    def top_self_op(prof: Any) -> str:
        return max(prof.key_averages(), key=lambda e: e.self_cpu_time_total).key

    return top_self_op


def _top_self_wrong() -> list[Any]:
    def by_total(prof: Any) -> str:  # total time: finds the label, not the operator
        return max(prof.key_averages(), key=lambda e: e.cpu_time_total).key

    def first_row(prof: Any) -> str:  # the table is not sorted by time
        return next(iter(prof.key_averages())).key

    def most_called(prof: Any) -> str:  # the most frequent is not the most expensive
        return max(prof.key_averages(), key=lambda e: e.count).key

    def the_event(prof: Any) -> Any:  # returns the event object, not its name
        return max(prof.key_averages(), key=lambda e: e.self_cpu_time_total)

    return [by_total, first_row, most_called, the_event, "aten::mm", None]


@exercise(
    "09.top_self_op",
    prompt="write top_self_op(prof) returning the name of the operator with the largest self CPU "
           "time in a finished torch.profiler.profile.",
    solution=_top_self_solution,
    wrong_answers=_top_self_wrong,
)
def check_top_self_op(answer: Any) -> str:
    """Accept a function that names the operator with the largest self CPU time."""
    if isinstance(answer, str):
        raise Wrong("you passed a string; pass the function top_self_op itself (the checker calls it "
                    "on profiles of its own).")
    expect_function(answer, "top_self_op(prof)")
    for expected, work in _workloads():
        prof = _profile(work)
        got = answer(prof)
        if not isinstance(got, str):
            raise Wrong(f"your function returned {type(got).__name__}; return the operator's name, "
                        "a string such as 'aten::mm' (each row of key_averages() has a .key).")
        if got == "":
            raise Wrong("your function returned an empty string: look at prof.key_averages().")
        if got == expected:
            continue
        if got == "exercise_work":
            raise Wrong("you found the record_function label: its *total* time includes its children. "
                        "Use self_cpu_time_total, the time spent in the event itself.")
        raise Wrong(f"for a workload whose heaviest operator is {expected} you returned {got!r}. "
                    "Take the row of prof.key_averages() with the largest self_cpu_time_total.")
    return "your function names the operator that does the most work by itself."


# ---------------------------------------------------------------------------
# 09.count_aten_events: count the aten:: operator events in a Chrome trace.
# ---------------------------------------------------------------------------


def _trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": 1, "traceEvents": events}


def _event(name: str, ph: str = "X", cat: str = "cpu_op", ts: float = 0.0) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts}
    if ph == "X":
        event["dur"] = 1.0
    return event


#: (trace, expected count)
TRACE_CASES: tuple[tuple[dict[str, Any], int], ...] = (
    (_trace([_event("aten::conv2d"), _event("aten::convolution", ts=1), _event("aten::relu", ts=2),
             _event("forward", cat="user_annotation"), _event("thread_name", ph="M", cat="")]), 3),
    (_trace([_event("Torch-Compiled Region: 0/0", cat="cpu_op"), _event("aten::addmm", ts=3),
             _event("aten::empty", ph="i", ts=4), _event("aten::mm", ts=5),
             {"name": "process_name", "ph": "M", "args": {"name": "python"}}]), 2),
    (_trace([_event("ProfilerStep#3", cat="user_annotation"),
             _event("Memcpy HtoD", cat="gpu_memcpy"), {"ph": "f", "id": 1, "ts": 2}]), 0),
)


def _count_solution() -> Callable[[dict[str, Any]], int]:
    def count_aten_events(trace: dict[str, Any]) -> int:
        return sum(1 for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("name", "").startswith("aten::"))

    return count_aten_events


def _count_wrong() -> list[Any]:
    def all_complete(trace: dict[str, Any]) -> int:  # counts every complete event
        return sum(1 for e in trace["traceEvents"] if e.get("ph") == "X")

    def any_phase(trace: dict[str, Any]) -> int:  # counts instant events too
        return sum(1 for e in trace["traceEvents"] if e.get("name", "").startswith("aten::"))

    def by_category(trace: dict[str, Any]) -> int:  # 'cpu_op' includes compiled regions
        return sum(1 for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e.get("ph") == "X")

    def crashes(trace: dict[str, Any]) -> int:  # some events have no name
        return sum(1 for e in trace["traceEvents"] if e["name"].startswith("aten::") and e["ph"] == "X")

    return [all_complete, any_phase, by_category, crashes, 3, None]


@exercise(
    "09.count_aten_events",
    prompt="write count_aten_events(trace) returning how many complete ('ph': 'X') events of a "
           "loaded Chrome trace are aten:: operators.",
    solution=_count_solution,
    wrong_answers=_count_wrong,
)
def check_count_aten_events(answer: Any) -> str:
    """Accept a function that counts the complete aten:: events of a loaded trace."""
    expect_function(answer, "count_aten_events(trace)")
    for i, (trace, expected) in enumerate(TRACE_CASES, start=1):
        try:
            got = answer(trace)
        except KeyError as err:
            raise Wrong(f"trace {i} made your function raise KeyError({err}): some events (metadata, "
                        "flow arrows) lack that key; use event.get(...).") from None
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"your function returned {got!r} for trace {i}; return a whole number (int).")
        if got != expected:
            raise Wrong(f"trace {i}: you counted {got}, expected {expected}. Count only events whose "
                        "'ph' is 'X' (complete events) and whose 'name' starts with 'aten::'; labels, "
                        "compiled regions and instant events do not count.")
    return "your count matches on every trace."
