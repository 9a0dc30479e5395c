"""Helpers for the PyTorch 2 course.

Each module answers one question:

- ``config``: which mode am I in (quick or full), where do files go?
- ``env``: what machine and versions am I on?
- ``doctor``: can this machine run the course, and if not, what do I fix?
- ``device``: which device should I use, and should this GPU-only cell run?
- ``bench``: how long does this take, and how do variants compare?
- ``data``: give me the course's offline data sets.
- ``models``: give me the small models the notebooks share.
- ``size``: how big is this model?
- ``compat``: call an API that moved between the torch versions we support.
- ``exercises``: is my answer right?
- ``session``: start a notebook (seed, fresh compiler state, thread policy, summary line).
- ``threads``: how many threads does torch use, and will they hold up on a busy laptop?
- ``cpu``: which CPU class is this, and which kernels do the libraries pick on it?

Submodules are imported on demand so that ``import course_utils`` stays cheap.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = {
    "bench",
    "compat",
    "config",
    "data",
    "device",
    "doctor",
    "env",
    "exercises",
    "models",
    "session",
    "size",
    "threads",
    "cpu",
}

__all__ = ["__version__", "bench", "compat", "config", "data", "device", "doctor", "env",
           "exercises", "models", "session", "size", "threads", "cpu"]


class _NoCudaRuntimeFilter(logging.Filter):
    """Drop torch's "No CUDA runtime is found" warning, which its CUDA build prints on
    CPU-only machines when ``torch.utils.cpp_extension`` is imported. It is harmless
    there and would otherwise appear in every notebook's first cell."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaRuntimeFilter())


def __getattr__(name: str) -> Any:
    """Return the submodule ``name``, importing it on first use."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
