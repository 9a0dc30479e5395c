"""Exercises of notebook 10: latency percentiles, reading a token stream, choosing a batch size."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 10.p99: the 99th percentile of request latencies (nearest-rank definition).
# ---------------------------------------------------------------------------

P99_CASES: tuple[tuple[list[float], float], ...] = (
    ([float(i) for i in range(1, 101)], 99.0),           # 1..100 ms: the 99th value
    ([5.0] * 98 + [40.0, 900.0], 40.0),                   # one slow outlier is not the p99
    ([3.0, 1.0, 2.0], 3.0),                               # unsorted, tiny sample: the maximum
    ([12.5], 12.5),
    ([float(i) for i in range(200, 0, -1)], 198.0),       # descending 200..1: rank ceil(0.99*200) = 198
)


def _nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def _p99_solution() -> Callable[[Sequence[float]], float]:
    def p99(latencies_ms: Sequence[float]) -> float:
        ordered = sorted(latencies_ms)
        rank = math.ceil(0.99 * len(ordered))  # 1-based rank of the nearest-rank percentile
        return ordered[max(rank, 1) - 1]

    return p99


def _p99_wrong() -> list[Any]:
    def unsorted(latencies_ms: Sequence[float]) -> float:
        return list(latencies_ms)[math.ceil(0.99 * len(latencies_ms)) - 1]

    def maximum(latencies_ms: Sequence[float]) -> float:
        return max(latencies_ms)

    def mean(latencies_ms: Sequence[float]) -> float:
        return sum(latencies_ms) / len(latencies_ms)

    def floor_rank(latencies_ms: Sequence[float]) -> float:
        ordered = sorted(latencies_ms)
        return ordered[int(0.99 * len(ordered))]  # off by one: the value above the rank

    return [unsorted, maximum, mean, floor_rank, 99.0, None]


@exercise(
    "10.p99",
    prompt="write p99(latencies_ms) returning the 99th percentile by the nearest-rank rule: sort, "
           "then take the value at 1-based rank ceil(0.99 * n).",
    solution=_p99_solution,
    wrong_answers=_p99_wrong,
)
def check_p99(answer: Any) -> str:
    """Accept a nearest-rank 99th percentile function."""
    expect_function(answer, "p99(latencies_ms)")
    for values, expected in P99_CASES:
        shown = f"p99(<{len(values)} latencies>)" if len(values) > 4 else f"p99({values})"
        try:
            got = answer(list(values))
        except (IndexError, ValueError, TypeError, ZeroDivisionError) as err:
            raise Wrong(f"{shown} raised {type(err).__name__}: {err}. Sort a copy, then index "
                        "with rank - 1 where rank = ceil(0.99 * n).") from None
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Wrong(f"{shown} returned {got!r}; return one latency (a number).")
        if got != expected:
            hint = "sort the latencies first" if values != sorted(values) and got == values[
                max(1, math.ceil(0.99 * len(values))) - 1] else (
                "that is the maximum: with 100 values the p99 is the 99th smallest, not the 100th"
                if got == max(values) else "use the nearest rank ceil(0.99 * n), 1-based")
            raise Wrong(f"{shown} returned {got}, expected {expected}: {hint}.")
    return "your p99 matches the nearest-rank definition on every case."


# ---------------------------------------------------------------------------
# 10.parse_sse: turn a server-sent-event stream into (text, end info).
# ---------------------------------------------------------------------------

def _sse(data: dict[str, Any], event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"


def _stream(tokens: Sequence[str], end: dict[str, Any] | None = None) -> str:
    body = "".join(_sse({"token": t, "index": i}) for i, t in enumerate(tokens))
    return body + (_sse(end, "end") if end is not None else "")


SSE_CASES: tuple[tuple[str, tuple[str, dict[str, Any] | None]], ...] = (
    (_stream(["He", "l", "lo"], {"reason": "length", "tokens": 3}),
     ("Hello", {"reason": "length", "tokens": 3})),
    (_stream([" ", "\n", "data: x"], {"reason": "length", "tokens": 3}),  # tokens that look like syntax
     (" \ndata: x", {"reason": "length", "tokens": 3})),
    (_stream(["a", "b"]), ("ab", None)),                                  # cut off: no end event
    (_stream([], {"reason": "length", "tokens": 0}), ("", {"reason": "length", "tokens": 0})),
)


def _parse_sse_solution() -> Callable[[str], tuple[str, dict[str, Any] | None]]:
    def parse_sse(stream: str) -> tuple[str, dict[str, Any] | None]:
        text, end = [], None
        for block in stream.split("\n\n"):
            event, data = "message", None
            for line in block.split("\n"):
                if line.startswith("event:"):
                    event = line[len("event:"):].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[len("data:"):].strip())
            if data is None:
                continue
            if event == "end":
                end = data
            elif event == "message":
                text.append(data["token"])
        return "".join(text), end

    return parse_sse


def _parse_sse_wrong() -> list[Any]:
    def raw_lines(stream: str) -> tuple[str, dict[str, Any] | None]:
        text = "".join(line[6:] for line in stream.splitlines() if line.startswith("data: "))
        return text, None  # keeps the JSON and the end event's data in the text

    def ignores_end(stream: str) -> tuple[str, dict[str, Any] | None]:
        tokens = [json.loads(line[5:]) for line in stream.splitlines() if line.startswith("data:")]
        return "".join(t.get("token", "") for t in tokens), None

    def strips_tokens(stream: str) -> tuple[str, dict[str, Any] | None]:
        text, end = _parse_sse_solution()(stream)
        return text.strip(), end

    return [raw_lines, ignores_end, strips_tokens, ("Hello", None), None]


@exercise(
    "10.parse_sse",
    prompt="write parse_sse(stream) -> (text, end): join the 'token' of every data event, and return "
           "the data of the 'event: end' event as a dict (None if the stream has no end event).",
    solution=_parse_sse_solution,
    wrong_answers=_parse_sse_wrong,
)
def check_parse_sse(answer: Any) -> str:
    """Accept a parser that rebuilds the text and finds the end event."""
    expect_function(answer, "parse_sse(stream)")
    for stream, (text, end) in SSE_CASES:
        try:
            got = answer(stream)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            raise Wrong(f"parsing {stream[:60]!r}... raised {type(err).__name__}: {err}. Events are "
                        "separated by a blank line; each data line holds JSON after 'data:'.") from None
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Wrong(f"return a pair (text, end), got {got!r}.")
        if got[0] != text:
            raise Wrong(f"the text should be {text!r}, got {got[0]!r}: decode each data line with "
                        "json.loads and join the 'token' fields, keeping spaces and newlines as they are.")
        if got[1] != end:
            raise Wrong(f"the end event should give {end!r}, got {got[1]!r}: an event whose 'event:' "
                        "line says 'end' carries the summary; with no such event return None.")
    return "your parser rebuilds every stream, and tells a finished stream from a cut-off one."


# ---------------------------------------------------------------------------
# 10.batch_size: the largest batch whose per-token latency fits a budget.
# ---------------------------------------------------------------------------

#: (tokens/s of the bare model at each batch size, per-token budget in ms) -> expected batch size
BATCH_CASES: tuple[tuple[dict[int, float], float, int | None], ...] = (
    ({1: 300.0, 8: 1600.0, 16: 2400.0, 32: 3200.0}, 10.0, 16),   # 32 rows: 10 ms/step
    ({1: 300.0, 8: 1600.0, 16: 2400.0, 32: 3200.0}, 10.0001, 32),
    ({1: 300.0, 8: 1600.0, 16: 2400.0, 32: 3200.0}, 2.0, None),  # even one row is too slow
    ({4: 400.0, 1: 500.0, 2: 600.0}, 5.0, 2),                   # unsorted keys; 4 rows: 10 ms
)


def _batch_solution() -> Callable[[dict[int, float], float], int | None]:
    def choose_batch_size(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        # With b rows, one decoding step makes b tokens and takes b / tokens_per_s[b] seconds;
        # every client waits that long for its next token.
        fits = [b for b, rate in tokens_per_s.items() if 1e3 * b / rate < budget_ms]
        return max(fits) if fits else None

    return choose_batch_size


def _batch_wrong() -> list[Any]:
    def fastest(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        return max(tokens_per_s, key=tokens_per_s.get)  # ignores the latency budget

    def per_token_of_batch(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        fits = [b for b, rate in tokens_per_s.items() if 1e3 / rate < budget_ms]  # forgets b
        return max(fits) if fits else None

    def smallest(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        fits = [b for b, rate in tokens_per_s.items() if 1e3 * b / rate < budget_ms]
        return min(fits) if fits else None

    return [fastest, per_token_of_batch, smallest, 16, None]


@exercise(
    "10.batch_size",
    prompt="write choose_batch_size(tokens_per_s, budget_ms): tokens_per_s maps a batch size b to the "
           "bare model's tokens/s at that size; return the largest b whose decoding step (the time "
           "each client waits for its next token) is under budget_ms, or None.",
    solution=_batch_solution,
    wrong_answers=_batch_wrong,
)
def check_batch_size(answer: Any) -> str:
    """Accept a function choosing the largest batch within a per-token latency budget."""
    expect_function(answer, "choose_batch_size(tokens_per_s, budget_ms)")
    for rates, budget, expected in BATCH_CASES:
        call = f"choose_batch_size({rates}, {budget})"
        try:
            got = answer(dict(rates), budget)
        except (ValueError, TypeError, ZeroDivisionError, KeyError) as err:
            raise Wrong(f"{call} raised {type(err).__name__}: {err}") from None
        if got != expected:
            hint = ("one step of a batch of b makes b tokens, so it takes 1000 * b / tokens_per_s[b] ms; "
                    "keep the sizes under the budget and return the largest (None if none fits)")
            raise Wrong(f"{call} returned {got!r}, expected {expected!r}. Hint: {hint}.")
    return "you pick the largest batch that keeps every client's next token within the budget."
