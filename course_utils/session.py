"""Start a notebook: one call for the setup cell."""

from __future__ import annotations

import os
import platform
import random
import sys

import torch

from . import threads
from .config import mode_name
from .cpu import cpu_class
from .device import cuda_description


def start(seed: int = 0) -> str:
    """Return the one-line environment summary after seeding, resetting compiler state and
    applying the course's thread policy.

    Seeds Python's ``random``, NumPy and torch with ``seed``; calls ``torch._dynamo.reset()``
    so a notebook never inherits compiled code from cells run earlier in the same kernel;
    applies ``COURSE_THREADS`` and says whether idle threads sleep and whether the machine
    is busy (see ``course_utils.threads`` for the policy and why).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is a course dependency; keep start() usable without it
        pass
    torch.manual_seed(seed)
    torch._dynamo.reset()
    policy = threads.apply().line()
    line = summary()
    note = python_note()
    if note and hasattr(torch._dynamo.config, "issue_3_13_0_warning"):
        torch._dynamo.config.issue_3_13_0_warning = False  # said once here, not in whichever cell compiles first
    return " | ".join(part for part in (line, policy, note) if part)


def python_note(version: tuple[int, ...] | None = None) -> str:
    """Return what this Python release costs the course, or ``""``: on Python 3.13.0, a CPython bug
    (fixed in 3.13.1) keeps torch's guards from a shortcut, so every call of a compiled function checks
    its guards more slowly, and torch says so in a ``RuntimeWarning`` at its first compile."""
    version = tuple(sys.version_info[:3] if version is None else version[:3])
    if version != (3, 13, 0):
        return ""
    return ("python 3.13.0: torch's guards run slower on this release (a CPython bug fixed in 3.13.1); "
            "rebuild with 3.13.1 or newer (`make doctor` says how)")


def summary() -> str:
    """Return a one-line environment summary for a notebook's setup cell (CPU class included)."""
    cuda = cuda_description()
    return (
        f"torch {torch.__version__} | python {platform.python_version()} | "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads | "
        f"cpu class: {cpu_class()} | cuda: {cuda} | mode: {mode_name()}"
    )
