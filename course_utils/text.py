"""How do I write a count in a sentence? ``counted(3, "loop")`` gives ``"3 loops"``.

Printed lines read better as "1 graph" and "2 graphs" than as "1 graph(s)"; the notebooks
use :func:`counted` wherever a cell prints a number it measured beside a noun.
"""

from __future__ import annotations

import numbers


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
