"""Start a notebook: one call for the setup cell."""

from __future__ import annotations

import os
import platform
import random

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
    return f"{line} | {policy}" if policy else line


def summary() -> str:
    """Return a one-line environment summary for a notebook's setup cell (CPU class included)."""
    cuda = cuda_description()
    return (
        f"torch {torch.__version__} | python {platform.python_version()} | "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads | "
        f"cpu class: {cpu_class()} | cuda: {cuda} | mode: {mode_name()}"
    )
