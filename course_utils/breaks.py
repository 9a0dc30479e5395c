"""How many graph breaks does Dynamo hit in this function, and why?

``break_report(fn, *args)`` runs ``torch._dynamo.explain`` on one call and returns the numbers the
notebooks talk about: the compiled graphs, the breaks (``len(break_reasons)``: every time Dynamo
had to stop, including a break with nothing after it, which adds no graph) and each reason's
first line. Like ``explain`` it resets Dynamo before and after: use it to diagnose, never between
a compile and a benchmark.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo


@dataclass(frozen=True)
class BreakReport:
    """What ``torch._dynamo.explain`` found for one call."""

    graphs: int
    """Graphs Dynamo compiled (``graph_count``)."""
    breaks: int
    """Times Dynamo had to stop (``len(break_reasons)``; ``graph_break_count`` counts graphs - 1)."""
    reasons: list[str] = field(default_factory=list)
    """The first line of each break reason, in order."""
    lines: list[str] = field(default_factory=list)
    """For each break, the line of user code Dynamo stopped at (the innermost frame it was tracing), or ""."""

    @property
    def first_reason(self) -> str:
        """The first line of the first break reason, or "" when there was no break."""
        return self.reasons[0] if self.reasons else ""


def break_report(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BreakReport:
    """Return the graphs, breaks and break reasons Dynamo finds when it traces ``fn(*args, **kwargs)``.

    What ``fn`` prints, and the warnings Dynamo emits about the breaks it reports (through
    ``warnings`` or its loggers), are kept out of the way: the reasons say the same.
    """
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Dynamo does not know how to trace")
        logging.disable(logging.WARNING)
        try:
            result = torch._dynamo.explain(fn)(*args, **kwargs)
        finally:
            logging.disable(logging.NOTSET)
    reasons = [r.reason.strip().splitlines()[0] if r.reason.strip() else "" for r in result.break_reasons]
    lines = [(r.user_stack[-1].line or "").strip() if r.user_stack else "" for r in result.break_reasons]
    return BreakReport(graphs=result.graph_count, breaks=len(result.break_reasons), reasons=reasons, lines=lines)
