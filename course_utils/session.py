"""Start a notebook: one call for the setup cell."""

from __future__ import annotations

import logging
import random

import torch

from .env import summary


def start(seed: int = 0) -> str:
    """Return the one-line environment summary after seeding and resetting compiler state.

    Seeds Python's ``random``, NumPy and torch with ``seed``, and calls
    ``torch._dynamo.reset()`` so a notebook never inherits compiled code from
    cells run earlier in the same kernel. On a machine without CUDA it also
    quiets the CUDA build's harmless "No CUDA runtime is found" warning.
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
    if not torch.cuda.is_available():
        # torch's CUDA build warns "No CUDA runtime is found" at the first compile on a
        # CPU-only machine. It is harmless there; keep it out of the learner's way.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    return summary()
