"""Helpers for the PyTorch 2 course.

The top level holds what the notebooks teach with; each module or sub-package answers one question:

- ``config``: which mode am I in (quick or full), where do files go?
- ``cpu``: which CPU class is this, and which kernels do the libraries pick on it?
- ``threads``: how many threads does torch use, and will they hold up on a busy laptop?
- ``device``: which device should I use, and should this GPU-only cell run?
- ``bench``: how long does this take, and how do variants compare?
- ``results``: which headline results did this run record (the ledger ``make report`` reads)?
- ``size``: how big is this model?
- ``text``: how do I write a count in a sentence ("1 loop", "3 loops")?
- ``toolchain``: which C++ compiler do Inductor and the course's C++ programs use, and does it build?
- ``compat``: what differs across the torch versions we support, and the private APIs a feature needs?
- ``inductor_code``: what did Inductor generate for this function (kernels, library calls)?
- ``breaks``: how many graph breaks does Dynamo hit in this function, and why?
- ``expect``: does this call fail the way the lesson says?
- ``fresh``: what does this script report when run in a new process with empty compile caches?
- ``trace_report``: what does tlparse's report on a ``TORCH_TRACE`` log contain?
- ``session``: start a notebook (seed, fresh compiler state, thread policy, summary line).
- ``data``: give me the course's offline data sets.
- ``models``: give me the small models the notebooks share.
- ``serving``: serve the tiny GPT (and MiniLM embeddings) over HTTP, load-test it, and time its tokens.
- ``exercises``: is my answer right?
- ``deploy``: run an exported model outside Python (ONNX Runtime, the C++ AOTInductor loader).
- ``distributed``: launch the training jobs notebook 12 writes on several processes (torchrun, loopback only).
- ``kit``: run the course itself (doctor, environment report, offline guard, notebook runner,
  workshop check, report, stamp, JupyterLab set-up, command line); infrastructure, not teaching.

Submodules are imported on demand so that ``import course_utils`` stays cheap.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = {
    "bench",
    "breaks",
    "compat",
    "config",
    "cpu",
    "data",
    "deploy",
    "device",
    "distributed",
    "exercises",
    "expect",
    "fresh",
    "inductor_code",
    "kit",
    "models",
    "serving",
    "results",
    "session",
    "size",
    "text",
    "threads",
    "toolchain",
    "trace_report",
}

__all__ = ["__version__", "bench", "breaks", "compat", "config", "cpu", "data", "deploy", "device",
           "distributed", "exercises", "expect", "fresh", "inductor_code", "kit", "models", "results", "serving", "session",
           "size", "text", "threads", "toolchain", "trace_report"]


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
