"""Latency percentiles, the course's one definition: the nearest-rank rule.

The p-th percentile of n values is the value at 1-based rank ``ceil(p / 100 * n)`` of the
sorted values (rank 1 when that is 0). It is always one of the measured values, so "p99 = 812 ms"
means a request really took 812 ms, and 99 % of the requests took at most that. The load
generator reports it (``LoadReport.ttft_ms``, ``latency_ms``) and exercise ``10.p99`` teaches it.
"""

from __future__ import annotations

import math
from fractions import Fraction
from collections.abc import Iterable, Sequence


def nearest_rank(values: Iterable[float], p: float) -> float:
    """Return the ``p``-th percentile (0 < p <= 100) of ``values`` by the nearest-rank rule."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the percentile of no values is undefined")
    if not 0 < p <= 100:
        raise ValueError(f"a percentile is above 0 and at most 100, got {p!r}")
    # Exact arithmetic: p = 99.9 of 1000 values is rank 999, where floats could round up to 1000.
    rank = math.ceil(Fraction(p).limit_denominator(10**9) * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]


def percentiles(values: Sequence[float], ps: Iterable[float]) -> dict[str, float]:
    """Return ``{"p50": ..., "p99": ...}``: ``nearest_rank`` of ``values`` for each ``p`` in ``ps``;
    NaN for each when there are no values (a run where no request succeeded)."""
    return {f"p{p:g}": nearest_rank(values, p) if values else math.nan for p in ps}
