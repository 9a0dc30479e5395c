"""Which torch APIs differ across the releases the course supports, and one way to call each.

Supported: torch >= 2.11, < 3 (checked on 2.11.0 with ``make test-min``, on the pinned 2.14.1, and
by hand on 2.15.0: README, "The next release").
This module covers exactly three kinds of API, each tested by ``tests/test_compat.py``:

- **Newer than the floor**: ``has(feature)`` probes them (``FEATURES``: the ``recompile_limit=`` and
  ``dynamic_shapes=`` keywords of ``torch.compile``, ``torch.compiler.nonstrict_trace``,
  ``torch.compiler.nested_compile_region``, ``torch._dynamo.error_on_graph_break``), and
  ``nonstrict_trace()`` / ``recompile_limit()`` work on every supported release.
- **Private or prototype namespaces a notebook depends on for a feature**, which may move:
  ``torch._higher_order_ops.scan`` / ``while_loop``, the mega-cache ``save_cache_artifacts``,
  ``torch.export.draft_export`` and ``Dim.AUTO`` (probed with ``has``); Inductor's test helper
  ``run_and_get_code``; the CPU capability report behind ``cpu_capabilities()``; how to tell a
  compiled object (``is_compiled``).
- Nothing else. Public APIs that are the same on every supported release (``torch.export.export``,
  ``torch.onnx.export(dynamo=True)``, ``torch.cond``) are called directly in the notebooks, and so
  are the debugging tools a lesson teaches by name (``torch._dynamo.explain``, ``torch._logging``,
  ``torch._inductor.config``, ``torch._dynamo.utils.counters``): a learner should see the real call.
  For the same reason the two spellings of the ``torch.compiler.precompile`` prototype (a function
  in 2.14, a module with ``capture()`` in 2.15) are bridged in notebook 01's own cell, not here.
  ``make test-min`` runs every notebook on the floor, which is what keeps those calls honest.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch


def torch_version() -> tuple[int, int]:
    """Return the installed torch's (major, minor)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _compile_params() -> set[str]:
    return set(inspect.signature(torch.compile).parameters)


def _probe(feature: str) -> bool:
    if feature == "compile_recompile_limit_kwarg":
        return "recompile_limit" in _compile_params()
    if feature == "compile_dynamic_shapes_kwarg":
        return "dynamic_shapes" in _compile_params()
    if feature == "nonstrict_trace":
        return hasattr(torch.compiler, "nonstrict_trace")
    if feature == "cache_artifacts":
        return hasattr(torch.compiler, "save_cache_artifacts")
    if feature == "draft_export":
        return hasattr(torch.export, "draft_export")
    if feature == "dim_auto":
        return hasattr(torch.export.Dim, "AUTO")
    if feature == "while_loop":
        return hasattr(torch._higher_order_ops, "while_loop")
    if feature == "scan":
        return hasattr(torch._higher_order_ops, "scan")
    if feature == "nested_compile_region":
        return hasattr(torch.compiler, "nested_compile_region")
    if feature == "error_on_graph_break":
        return hasattr(torch._dynamo, "error_on_graph_break")
    raise KeyError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")


#: Features the notebooks may ask about with ``has()``.
FEATURES = (
    "compile_recompile_limit_kwarg",
    "compile_dynamic_shapes_kwarg",
    "nonstrict_trace",
    "cache_artifacts",
    "draft_export",
    "dim_auto",
    "while_loop",
    "scan",
    "nested_compile_region",
    "error_on_graph_break",
)


def has(feature: str) -> bool:
    """Return whether the installed torch has ``feature`` (one of ``FEATURES``)."""
    return _probe(feature)


def features() -> dict[str, bool]:
    """Return {feature: available} for every name in ``FEATURES``."""
    return {name: _probe(name) for name in FEATURES}


def cpu_capabilities() -> dict[str, Any]:
    """Return cpuinfo's view of the CPU (instruction-set flags, cache sizes, name); {} if unavailable.

    ``torch.cpu.get_capabilities()`` is public in recent torch; older releases have only
    the private ``torch._C._cpu._get_cpu_capability()`` behind it, or neither.
    """
    getter = getattr(torch.cpu, "get_capabilities", None)
    if getter is None:
        getter = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if getter is None:
        return {}
    try:
        return dict(getter())
    except (RuntimeError, TypeError):
        return {}


def is_compiled(obj: Any) -> bool:
    """Return True when ``obj`` came out of ``torch.compile`` (a compiled function or module)."""
    if isinstance(obj, torch.nn.Module):
        return hasattr(obj, "_orig_mod")  # torch._dynamo.OptimizedModule
    return hasattr(obj, "_torchdynamo_orig_callable")


@contextlib.contextmanager
def recompile_limit(limit: int) -> Iterator[None]:
    """Temporarily cap how many times Dynamo recompiles one frame (any supported torch).

    Newer torch also accepts ``torch.compile(..., recompile_limit=n)`` per function;
    this context manager sets the global config that both versions read.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    cfg = torch._dynamo.config
    key = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    with cfg.patch(**{key: limit}):
        yield


def nonstrict_trace(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``torch.compiler.nonstrict_trace(fn)``; raise a clear error on torch without it."""
    if not has("nonstrict_trace"):
        raise NotImplementedError(
            f"torch.compiler.nonstrict_trace needs a newer torch than {torch.__version__}; "
            "use torch.compiler.allow_in_graph or torch.compiler.disable instead"
        )
    return torch.compiler.nonstrict_trace(fn)


def run_and_get_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Return ``(fn(*args, **kwargs), [source Inductor generated for each graph compiled])``.

    Wraps the private test helper ``torch._inductor.utils.run_and_get_code`` (present in every
    supported release; it resets Dynamo first, so the compile really happens).
    ``course_utils.inductor_code.generated_code`` is the form the notebooks use.
    """
    from torch._inductor import utils as inductor_utils

    getter = getattr(inductor_utils, "run_and_get_code", None)
    if getter is None:
        raise NotImplementedError(
            f"torch._inductor.utils.run_and_get_code is missing from torch {torch.__version__}; "
            "use TORCH_LOGS=output_code to see the generated code instead"
        )
    result, sources = getter(fn, *args, **kwargs)
    return result, list(sources)
