"""What did Inductor generate for this function?

``generated_code(fn, *args)`` runs a (compiled) function and returns its result together with the
source Inductor wrote for each graph it compiled: a Python module (the "output code") holding the
kernels, C++ on a CPU or Triton on a GPU, and a ``call`` function that runs them. The other
helpers read that source: which kernels it defines, which library calls it makes, and how often a
pattern appears. They read text, so they work on any output code, whichever device wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from course_utils import compat

# A kernel is defined as `name = async_compile.cpp_pybinding(...)` (C++), `.triton(...)` (GPU), ...
_KERNEL_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", flags=re.M)
_LIBRARY_CALL = re.compile(r"extern_kernels\.(\w+)\(")


def generated_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Return ``(fn(*args, **kwargs), sources)``: the call's result and the output code of each
    graph compiled during the call (one source per graph, in compile order; a training step gives
    a forward and a backward).

    A thin wrapper over ``torch._inductor.utils.run_and_get_code`` (through ``course_utils.compat``),
    which resets Dynamo first: anything compiled before is forgotten and compiled again.
    """
    return compat.run_and_get_code(fn, *args, **kwargs)


def fused_kernels(source: str) -> list[str]:
    """Return the names of the kernels (C++ or Triton) defined in one generated ``source``, in order.

    Each is one fused loop nest Inductor wrote, e.g. ``cpp_fused_add_cos_mul_sin_0``; library calls
    (see ``library_calls``) are not kernels Inductor wrote and are not listed.
    """
    return _KERNEL_DEFINITION.findall(source)


def library_calls(source: str) -> list[str]:
    """Return the library (extern) kernels one generated ``source`` calls, e.g. ``['addmm']``, in order."""
    return _LIBRARY_CALL.findall(source)


def kernel_calls(source: str) -> list[str]:
    """Return the generated kernels the ``call`` function of one ``source`` runs, in the order it runs
    them, a kernel called twice listed twice (Inductor defines identical loops once and reuses them).
    Library calls are not included: see ``library_calls``."""
    defined = set(fused_kernels(source))
    called = re.findall(r"\b(\w+)(?:\.run)?\(", wrapper_call(source))  # C++: name(...); Triton: name.run(...)
    return [name for name in called if name in defined]


def wrapper_call(source: str) -> str:
    """Return the ``call`` function of one generated ``source``: its allocations and kernel calls,
    in the order they run, up to and including its ``return`` line."""
    body = source[source.index("def call("):]
    end = body.index("return ")
    return body[:end + body[end:].index("\n")]


def kernel_source(source: str, name: str) -> str:
    """Return the C++ or Triton source of kernel ``name`` (one of ``fused_kernels(source)``)."""
    quotes = "'" * 3
    start = source.index(quotes, source.index(f"{name} = async_compile")) + 3
    return source[start:source.index(quotes, start)]


def count(source: str, pattern: str) -> int:
    """Return how many times the regular expression ``pattern`` occurs in ``source`` (multi-line:
    ``^`` and ``$`` match at each line). Escape a literal with ``re.escape`` if it has special characters."""
    return len(re.findall(pattern, source, flags=re.M))


def vectorises_here() -> bool:
    """Return whether Inductor writes SIMD vector code (``at::vec::Vectorized``) for this process's CPU.

    Asks Inductor's own choice, ``torch._inductor.cpu_vec_isa.pick_vec_isa()`` (a private API): no
    instruction set on a CPU without AVX2 (x86) or under ``ATEN_CPU_CAPABILITY=default``, which then
    gets plain scalar loops. Where that call is missing it answers True, the common case.
    """
    try:
        from torch._inductor import cpu_vec_isa

        return bool(cpu_vec_isa.pick_vec_isa())
    except (ImportError, AttributeError):
        return True


def scalar_note(compared: bool = True) -> str:
    """Return a clause for a printed reason where Inductor writes no vector code here, else "". It says that
    eager runs at the same capability, so a reader does not take it for the whole reason a compiled version
    was slower; ``compared=False`` leaves that out where the note follows no comparison."""
    if vectorises_here():
        return ""
    import torch

    same = ("; eager's own kernels are built for the same setting, but the libraries some of them call (oneDNN for "
            "matrix products, MKL for functions such as sin and tanh) choose their own vector code, so this can "
            "favour eager")
    return (f" (Inductor wrote no SIMD vector code here: torch's CPU capability is "
            f"{torch.backends.cpu.get_cpu_capability()}, so its loops are plain scalar C++{same if compared else ''})")
