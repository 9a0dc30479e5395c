"""Does this call fail the way the lesson says?

Several notebooks show an error on purpose, because the error is the lesson. ``expect_error``
runs the call, checks that it fails with the message the notebook predicts (so the notebook stops
if a future torch behaves differently) and returns the exception for the notebook to print.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

#: Loggers whose warnings a failing trace or export repeats from its exception; quiet while the call runs.
_QUIET_LOGGERS = ("torch.fx.experimental.symbolic_shapes",)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def expect_error(fn: Callable[..., Any], *args: Any, match: str, **kwargs: Any) -> Exception:
    """Call ``fn(*args, **kwargs)`` and return the exception it raises.

    ``match`` is a regular expression searched (case-insensitively) in the exception's message.
    Raise ``AssertionError`` with a clear message when the call succeeds, or when it raises an
    exception whose message does not match. While the call runs, what it prints to ``sys.stderr``
    (a failing trace prints its half-built graph there) and torch's shape-environment warnings are
    hidden: the exception says the same.
    """
    with _quiet():
        try:
            fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any exception is a candidate; the message decides
            if not re.search(match, str(err), flags=re.I):
                raise AssertionError(
                    f"expected an error matching {match!r}, got {type(err).__name__}: {err}") from err
            return err
    raise AssertionError(f"expected an error matching {match!r}, but the call succeeded")
