"""Exercises of notebook 10: latency percentiles, reading a token stream, choosing a batch size."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..serving.server.percentile import nearest_rank
from ..serving.server.sse import END, TOKEN, SSEParser, format_event
from .framework import Mistake, case, function_exercise

# --- 10.p99: the 99th percentile of request latencies (nearest-rank definition).
# The checker compares with the course's one definition (``serving.percentile.nearest_rank``,
# which the load generator reports); ``p99`` below is the reference a learner may ask to see.


def p99(latencies_ms: Sequence[float]) -> float:
    """Return the 99th percentile of the latencies by the nearest-rank rule."""
    ordered = sorted(latencies_ms)
    rank = math.ceil(0.99 * len(ordered))  # 1-based rank of the nearest-rank percentile
    return ordered[max(rank, 1) - 1]


def _p99_mistakes() -> list[Mistake]:
    return [(lambda lat: list(lat)[math.ceil(0.99 * len(lat)) - 1], "Sort the latencies first."),
            (lambda lat: sorted(lat)[int(0.99 * len(lat))], "As an index, int(0.99 * n) is one past the rank: "
                                                             "index with ceil(0.99 * n) - 1."),
            (max, "That is the maximum: the p99 is the value at rank ceil(0.99 * n) of the sorted latencies, "
                  "below the maximum once there are more than 100.")]


function_exercise(
    "10.p99",
    solution=p99,
    reference=lambda latencies_ms: nearest_rank(latencies_ms, 99),
    cases=lambda: [([float(i) for i in range(200, 0, -1)],),      # descending 200..1: rank 198
                   ([float(i) for i in range(1, 101)],),          # 1..100: the 99th value
                   ([5.0] * 98 + [40.0, 900.0],),                 # one slow outlier is not the p99
                   ([3.0, 1.0, 2.0],), ([12.5],)],                # tiny samples: the maximum
    mistakes=_p99_mistakes,
    wrong=lambda: [(lambda lat: sum(lat) / len(lat), "use the nearest rank")],
    errors=[(IndexError, "Sort a copy, then index with rank - 1 where rank = ceil(0.99 * n).")],
    otherwise="Sort, then use the nearest rank ceil(0.99 * n), 1-based.",
    success="your p99 matches the nearest-rank definition on every case.",
)

# --- 10.parse_sse: turn a server-sent-event stream into (text, end info).


# The streams are written, and the checker's expected answers read, by the course's own SSE code
# (``serving.sse``, what the servers and the load generator use); ``parse_sse`` below is the
# self-contained reference a learner may ask to see.


def _stream(tokens: Sequence[str], end: dict[str, Any] | None = None, error: bool = False) -> str:
    body = "".join(format_event({"token": t, "index": i}) for i, t in enumerate(tokens))
    failure = format_event({"detail": "server is stopping", "status": 503}, "error") if error else ""
    return body + failure + (format_event(end, END) if end is not None else "")


def _sse_cases() -> list[tuple[str]]:
    end = {"reason": "length", "tokens": 3}
    return [(_stream(["He", "l", "lo"], end),), (_stream([" ", "\n", "data: x"], end),),  # tokens that look like syntax
            (_stream(["a", "b"]),), (_stream([], {"reason": "length", "tokens": 0}),),    # cut off; empty
            (_stream(["a", "b"], error=True),)]                                             # failed mid-stream


def parse_sse(stream: str) -> tuple[str, dict[str, Any] | None]:
    """Return (text, end): the joined tokens, and the data of the end event or None."""
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


def course_parse_sse(stream: str) -> tuple[str, dict[str, Any] | None]:
    """Return what ``parse_sse`` must return, read by the course's parser (``sse.SSEParser``):
    the joined tokens, and the data of the end event or None; error events are neither."""
    parser = SSEParser()
    events = parser.feed_bytes(stream.encode("utf-8")) + parser.finish()
    text = "".join(value for kind, value in events if kind == TOKEN)
    return text, next((value for kind, value in events if kind == END), None)


def _parse_sse_mistakes() -> list[Mistake]:
    def data_lines(stream: str) -> list[dict[str, Any]]:
        return [json.loads(line[5:]) for line in stream.splitlines() if line.startswith("data:")]

    def ignores_events(stream: str) -> tuple[str, dict[str, Any] | None]:  # data without a token = the end
        datas = data_lines(stream)
        return "".join(d["token"] for d in datas if "token" in d), ([None] + [d for d in datas if "token" not in d])[-1]

    def strips_tokens(stream: str) -> tuple[str, dict[str, Any] | None]:
        text, end = parse_sse(stream)
        return text.strip(), end

    return [(lambda s: ("".join(ln[6:] for ln in s.splitlines() if ln.startswith("data: ")), None),
             "Decode each data line with json.loads and join the 'token' fields."),
            (lambda s: ("".join(d.get("token", "") for d in data_lines(s)), None),
             "An event whose 'event:' line says 'end' carries the summary; with no such event return None."),
            (strips_tokens, "Keep spaces and newlines in the tokens as they are."),
            (ignores_events, "Read each block's 'event:' line: only 'event: end' carries the summary; an 'event: "
                             "error' (the server failed mid-stream) is neither text nor the end.")]


function_exercise(
    "10.parse_sse",
    solution=parse_sse,
    reference=course_parse_sse,
    cases=_sse_cases,
    mistakes=_parse_sse_mistakes,
    wrong=lambda: [(("Hello", None), "expected a function")],
    errors=[((ValueError, KeyError, TypeError, IndexError, AttributeError),
             "Events are separated by a blank line; each data line holds JSON after 'data:', and the 'event:' "
             "line before it says what kind of event it is.")],
    otherwise="Join the 'token' fields of the message events; the data of 'event: end' is the end, else None.",
    success="your parser rebuilds every stream, and tells a finished stream from a cut-off one.",
)

# --- 10.batch_size: the largest batch whose per-token latency fits a budget.


def choose_batch_size(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
    """Return the largest batch size whose decoding step is under budget_ms, or None."""
    # With b rows, one decoding step makes b tokens and takes b / tokens_per_s[b] seconds;
    # every client waits that long for its next token.
    fits = [b for b, rate in tokens_per_s.items() if 1e3 * b / rate < budget_ms]
    return max(fits) if fits else None


def _batch_mistakes() -> list[Mistake]:
    def per_token_of_batch(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        fits = [b for b, rate in tokens_per_s.items() if 1e3 / rate < budget_ms]  # forgets b
        return max(fits) if fits else None

    def smallest(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
        fits = [b for b, rate in tokens_per_s.items() if 1e3 * b / rate < budget_ms]
        return min(fits) if fits else None

    return [(lambda tokens_per_s, budget_ms: max(tokens_per_s, key=tokens_per_s.get),
             "The highest throughput ignores the budget: each client waits a whole step for its next token."),
            (per_token_of_batch, "One step of a batch of b makes b tokens, so it takes 1000 * b / tokens_per_s[b] "
                                 "ms, not 1000 / tokens_per_s[b]."),
            (smallest, "Return the LARGEST batch size that fits: it gives the most tokens per second."),
            (lambda tokens_per_s, budget_ms: None,
             "None is the answer only when no batch size fits the budget, and here one does: one step of a batch of "
             "b makes b tokens, so it takes 1000 * b / tokens_per_s[b] ms.")]


function_exercise(
    "10.batch_size",
    solution=choose_batch_size,
    # Steps: 1 row 2 ms, 2 rows 3.3 ms, 4 rows 10 ms (unsorted keys); then 1: 3.3, 8: 5, 16: 6.7, 32: 10 ms.
    cases=lambda: [case({4: 400.0, 1: 500.0, 2: 600.0}, 5.0, gives=2)]
    + [case({1: 300.0, 8: 1600.0, 16: 2400.0, 32: 3200.0}, budget, gives=largest)
       for budget, largest in ((10.0, 16), (10.0001, 32), (2.0, None))],   # 10 ms is not under 10 ms
    mistakes=_batch_mistakes,
    errors=[((ValueError, TypeError, ZeroDivisionError, KeyError), "Loop over tokens_per_s.items().")],
    otherwise="One step of a batch of b makes b tokens, so it takes 1000 * b / tokens_per_s[b] ms; keep the "
              "sizes under the budget and return the largest (None if none fits).",
    success="you pick the largest batch that keeps every client's next token within the budget.",
)
