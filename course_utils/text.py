"""How do I write a count in a sentence? ``counted(3, "loop")`` gives ``"3 loops"``.

Printed lines read better as "1 graph" and "2 graphs" than as "1 graph(s)"; the notebooks
use :func:`counted` wherever a cell prints a number it measured beside a noun,
:func:`about` where a count is an estimate whose last digits mean nothing ("about 190,000 calls"),
and :func:`whole_percents` where a column of percents must add up.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """Return ``n`` and ``noun`` in the form English needs: ``"1 loop"``, ``"0 loops"``, ``"3 loops"``.

    The plural is ``noun + "s"`` unless ``plural`` is given (``counted(2, "body", "bodies")``).
    Thousands get separators (``"1,024 calls"``). ``n`` must be a whole number of zero or more.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"counted() needs a whole number, got {n!r} ({type(n).__name__})")
    if n < 0:
        raise ValueError(f"counted() needs a count of zero or more, got {n}")
    if not isinstance(noun, str) or not noun.strip():
        raise ValueError(f"counted() needs a noun, got {noun!r}")
    word = noun if n == 1 else (plural if plural is not None else noun + "s")
    return f"{int(n):,} {word}"


def about(n: float, noun: str, plural: str | None = None, digits: int = 2) -> str:
    """Return an estimated count rounded to ``digits`` significant figures, with its noun:
    ``about(185_942, "call")`` gives ``"about 190,000 calls"``, ``about(13.2, "call")`` ``"about 14 calls"``.

    For counts worked out from measured times (a break-even point, say), whose precision is that of
    the times: printing 185,942 claims six digits the measurement does not have. A fraction rounds
    up first (a break-even point falls in the next whole call), so any count above 0 gives at least
    1; counts below ``10 ** digits`` then keep every digit. ``n`` must be finite and zero or more.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not math.isfinite(n) or n < 0:
        raise ValueError(f"about() needs a finite count of zero or more, got {n!r}")
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"about() needs digits >= 1, got {digits!r}")
    whole = max(1, math.ceil(n)) if n > 0 else 0
    if whole >= 10 ** digits:
        step = 10 ** (len(str(whole)) - digits)
        whole = round(whole / step) * step
    return "about " + counted(whole, noun, plural)


def whole_percents(shares: Sequence[float]) -> list[int]:
    """Return ``shares`` (fractions such as 0.874) as whole percents that add up, as a table needs.

    Each is rounded down, then the points left over go to the largest remainders, so the percents
    sum to the rounded percent of the shares' sum: ``whole_percents([0.874, 0.003, 0.052, 0.071])``
    is ``[88, 0, 5, 7]`` (rounding each gives 87 + 0 + 5 + 7 = 99). Shares must be finite and zero or more.
    """
    values = [float(s) for s in shares]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"whole_percents() needs finite shares of zero or more, got {list(shares)!r}")
    raw = [100 * v for v in values]
    out = [math.floor(r) for r in raw]
    left = round(sum(raw)) - sum(out)
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[:max(0, left)]:
        out[i] += 1
    return out
