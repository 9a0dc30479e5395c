"""Exercises of notebook 00: a first compiled function, and when compiling pays off."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..compat import is_compiled
from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 00.rms_norm: write a row-wise RMS normalisation and pass it through torch.compile.
# ---------------------------------------------------------------------------

RMS_EPS = 1e-6


def _rms_reference(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def _rms_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def rms_norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)

    return torch.compile(rms_norm)


def _rms_wrong() -> list[Any]:
    def over_rows(x: torch.Tensor) -> torch.Tensor:  # normalises the wrong dimension
        return x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + 1e-6)

    def plain(x: torch.Tensor) -> torch.Tensor:  # right values, never compiled
        return _rms_reference(x)

    def std_norm(x: torch.Tensor) -> torch.Tensor:  # divides by the standard deviation
        return x / (x.std(dim=-1, keepdim=True) + 1e-6)

    return [
        torch.compile(over_rows, backend="eager"),
        plain,
        torch.compile(std_norm, backend="eager"),
        torch.ones(3),
        None,
        "rms_norm",
    ]


@exercise(
    "00.rms_norm",
    prompt="write rms_norm(x) = x / sqrt(mean(x**2 over the last dim) + 1e-6) and pass "
           "torch.compile(rms_norm) to the checker.",
    solution=_rms_solution,
    wrong_answers=_rms_wrong,
)
def check_rms_norm(answer: Any) -> str:
    """Accept a compiled function that RMS-normalises the last dimension."""
    expect_function(answer, "torch.compile(rms_norm)")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 32, generator=gen) * 3 + 1
    x_before = x.clone()
    out = answer(x)
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"your function returned {type(out).__name__}; it should return a tensor.")
    if not torch.equal(x, x_before):
        raise Wrong("your function changed its input in place; return a new tensor instead.")
    if out.shape != x.shape:
        raise Wrong(f"the output has shape {tuple(out.shape)}, expected {tuple(x.shape)}: "
                    "keep the dimension you reduce with keepdim=True.")
    expected = _rms_reference(x)
    if not torch.allclose(out, expected, rtol=1e-4, atol=1e-5):
        err = (out - expected).abs().max().item()
        over_rows = x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + RMS_EPS)
        if torch.allclose(out, over_rows, rtol=1e-4, atol=1e-5):
            raise Wrong("you normalised over dim 0 (down the columns); use the last dimension, dim=-1.")
        raise Wrong(f"values differ from x / sqrt(mean(x**2, dim=-1) + 1e-6) by up to {err:.3g}. "
                    "Check: square, mean over the last dim, add eps, square root, divide.")
    if not is_compiled(answer):
        raise Wrong("the values are right, but this is a plain Python function: "
                    "wrap it as torch.compile(rms_norm) so the compiler handles it.")
    return "your compiled RMS norm matches the reference."


# ---------------------------------------------------------------------------
# 00.break_even: after how many calls has compiling paid for itself?
# ---------------------------------------------------------------------------

#: (first_call_s, eager_s, compiled_s) -> expected break-even call count, or None.
BREAK_EVEN_CASES: tuple[tuple[tuple[float, float, float], int | None], ...] = (
    ((2.0, 0.5, 0.3), 9),          # (2.0 - 0.3) / (0.5 - 0.3) = 8.5 -> 9 calls
    ((10.0, 0.013, 0.004), 1111),  # a typical compile: thousands of calls to pay back
    ((0.001, 0.01, 0.005), 1),     # first call already cheaper than eager
    ((3.0, 0.2, 0.2), None),       # never faster: never pays
    ((3.0, 0.1, 0.2), None),       # slower when compiled: never pays
)


def _break_even_solution() -> Callable[[float, float, float], int | None]:
    def break_even(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
        # n eager calls cost n * eager_s; n compiled calls cost
        # first_call_s + (n - 1) * compiled_s. Find the smallest n where compiled <= eager.
        if compiled_s >= eager_s:
            return None
        return max(1, math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s)))

    return break_even


def _break_even_wrong() -> list[Any]:
    def no_guard(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
        return math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s))

    def forgets_first_call(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
        if compiled_s >= eager_s:
            return None
        return math.ceil(first_call_s / (eager_s - compiled_s))

    return [no_guard, forgets_first_call, 9, None]


@exercise(
    "00.break_even",
    prompt="write break_even(first_call_s, eager_s, compiled_s) returning the smallest number of "
           "calls after which the compiled function has cost no more time in total than eager, "
           "or None if it never pays.",
    solution=_break_even_solution,
    wrong_answers=_break_even_wrong,
)
def check_break_even(answer: Any) -> str:
    """Accept a function that returns the break-even call count (None when never)."""
    expect_function(answer, "break_even(first_call_s, eager_s, compiled_s)")
    for (first, eager, compiled), expected in BREAK_EVEN_CASES:
        call = f"break_even({first}, {eager}, {compiled})"
        try:
            got = answer(first, eager, compiled)
        except ZeroDivisionError:
            raise Wrong(f"{call} divided by zero: when compiled_s >= eager_s, compiling never "
                        "pays, so return None before dividing.") from None
        if expected is None:
            if got is not None:
                raise Wrong(f"{call} returned {got!r}, but the compiled call is not faster, so it "
                            "never pays: return None.")
            continue
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"{call} returned {got!r}; return a whole number of calls (an int, "
                        "e.g. via math.ceil).")
        if got != expected:
            hint = ("remember the first compiled call also does one call's work: n compiled calls "
                    "cost first_call_s + (n - 1) * compiled_s, against n * eager_s.")
            if got < 1:
                hint = "the count starts at 1 call. " + hint
            raise Wrong(f"{call} returned {got}, expected {expected}. Hint: {hint}")
    return "your break-even formula gives the right call count in every case."
