"""When did each streamed token arrive? Time to first token and inter-token gaps per request,
summarised with the course's one percentile rule (``serving.server.percentile``).

A serving loop calls ``TokenClock.arrive(rid)`` when a request arrives and ``token(rid)`` for each
of its tokens; ``ttft_s``, ``gaps_s`` and ``summary_ms`` read the figures (clock: ``time.perf_counter``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable

from ..server.percentile import percentiles

__all__ = ["TokenClock"]


class TokenClock:
    """Arrival and token times of many requests (seconds on one clock)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.arrived: dict[Hashable, float] = {}
        self.tokens: dict[Hashable, list[float]] = {}

    def arrive(self, rid: Hashable, at: float | None = None) -> None:
        """Return None; note that request ``rid`` arrived now (or at ``at``). A second arrival is an error."""
        if rid in self.arrived:
            raise ValueError(f"request {rid!r} already arrived")
        self.arrived[rid] = self._clock() if at is None else float(at)
        self.tokens[rid] = []

    def token(self, rid: Hashable, count: int = 1) -> None:
        """Return None; note that request ``rid`` received ``count`` tokens now (a speculative step may
        deliver several at once: they share one time, so the gaps between them are zero)."""
        if rid not in self.arrived:
            raise KeyError(f"request {rid!r} never arrived; call arrive({rid!r}) first")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive int, got {count!r}")
        now = self._clock()
        self.tokens[rid].extend([now] * count)

    def ttft_s(self, rids: Iterable[Hashable] | None = None) -> list[float]:
        """Return the time to first token of each request (of ``rids``, default all) that got one."""
        chosen = self.arrived if rids is None else list(rids)
        return [self.tokens[r][0] - self.arrived[r] for r in chosen if self.tokens.get(r)]

    def gaps_s(self, rids: Iterable[Hashable] | None = None) -> list[float]:
        """Return every inter-token gap (seconds between consecutive tokens of one request) of ``rids``
        (default all requests), pooled."""
        chosen = self.arrived if rids is None else list(rids)
        out: list[float] = []
        for r in chosen:
            times = self.tokens.get(r, [])
            out += [b - a for a, b in zip(times, times[1:])]
        return out

    def summary_ms(self, rids: Iterable[Hashable] | None = None,
                   ps: Iterable[float] = (50, 99)) -> dict[str, dict[str, float]]:
        """Return ``{"ttft": {"p50": ...}, "itl": {"p50": ...}}`` in milliseconds (nearest rank; NaN
        where there are no values)."""
        chosen = None if rids is None else list(rids)
        ps = list(ps)
        return {"ttft": {k: 1e3 * v for k, v in percentiles(self.ttft_s(chosen), ps).items()},
                "itl": {k: 1e3 * v for k, v in percentiles(self.gaps_s(chosen), ps).items()}}
