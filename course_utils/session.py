"""Start a notebook: one call for the setup cell."""

from __future__ import annotations

import random

import torch

from .env import summary


def start(seed: int = 0) -> str:
    """Return the one-line environment summary after seeding and resetting compiler state.

    Seeds Python's ``random``, NumPy and torch with ``seed``, and calls
    ``torch._dynamo.reset()`` so a notebook never inherits compiled code from
    cells run earlier in the same kernel.
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
    return summary()
