"""Exercises of notebook 00: a first compiled function, and when compiling pays off."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..compat import is_compiled
from .framework import Mistake, Wrong, case, function_exercise

# --- 00.rms_norm: write a row-wise RMS normalisation and pass it through torch.compile.


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Return x divided by the root mean square of its last dimension (plus 1e-6)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


_KEEPDIM = ("The mean lost the dimension it reduced, so it no longer lines up with x: keep it with "
            "mean(dim=-1, keepdim=True).")


def _rms_mistakes() -> list[Mistake]:
    def over_rows(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + 1e-6)

    def std_norm(x: torch.Tensor) -> torch.Tensor:
        return x / (x.std(dim=-1, keepdim=True) + 1e-6)

    def without_keepdim(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1) + 1e-6)

    return [(over_rows, "You normalised over dim 0 (down the columns); use the last dimension, dim=-1."),
            (std_norm, "That divides by the standard deviation; RMS norm divides by the root of the mean "
                       "of the squares, without subtracting the mean."),
            (torch.compile(without_keepdim, backend="eager"), "keepdim=True"),
            (rms_norm, "plain Python function")]


def _rms_compiled(answer: Any) -> None:
    if not is_compiled(answer):
        raise Wrong("the values are right, but this is a plain Python function: wrap it as "
                    "torch.compile(rms_norm) so the compiler handles it.")


function_exercise(
    "00.rms_norm",
    solution=rms_norm,
    reference=lambda x: torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6),   # torch's own RMS norm
    passed_as=torch.compile,
    cases=lambda: [(torch.randn(8, 32, generator=torch.Generator().manual_seed(0)) * 3 + 1,)],
    mistakes=_rms_mistakes,
    errors=[("broadcast", _KEEPDIM), ("must match the size", _KEEPDIM)],
    otherwise="Check: square, mean over the last dim (keepdim=True), add 1e-6, square root, divide.",
    after=_rms_compiled,
    tol=(1e-4, 1e-5),
    success="your compiled RMS norm matches the reference.",
)

# --- 00.break_even: after how many calls has compiling paid for itself?


def break_even(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
    """Return the smallest number of calls after which compiling has paid off, or None if never."""
    # n eager calls cost n * eager_s; n compiled calls cost
    # first_call_s + (n - 1) * compiled_s. Find the smallest n where compiled <= eager.
    if compiled_s >= eager_s:
        return None
    return max(1, math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s)))


def _break_even_mistakes() -> list[Mistake]:
    def no_guard(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
        return math.ceil((first_call_s - compiled_s) / (eager_s - compiled_s))

    def forgets_first_call(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
        return None if compiled_s >= eager_s else math.ceil(first_call_s / (eager_s - compiled_s))

    def no_rounding(first_call_s: float, eager_s: float, compiled_s: float) -> float | None:
        return None if compiled_s >= eager_s else max(1.0, (first_call_s - compiled_s) / (eager_s - compiled_s))

    return [(no_guard, "The count starts at 1 call: if the first compiled call is already cheaper, return 1."),
            (forgets_first_call, "The first compiled call also does one call's work: n compiled calls cost "
                                 "first_call_s + (n - 1) * compiled_s, against n * eager_s."),
            (no_rounding, "Round up to a whole number of calls with math.ceil.")]


function_exercise(
    "00.break_even",
    solution=break_even,
    cases=lambda: [case(2.0, 0.5, 0.3, gives=9),             # (2.0 - 0.3) / (0.5 - 0.3) = 8.5 -> 9 calls
                   case(10.0, 0.013, 0.004, gives=1111),      # 9.996 / 0.009 = 1110.7 -> 1111
                   case(0.001, 0.01, 0.005, gives=1),         # the first call is already cheaper than eager
                   case(3.0, 0.2, 0.2, gives=None),           # never faster: never pays
                   case(3.0, 0.1, 0.2, gives=None)],          # slower: never pays
    mistakes=_break_even_mistakes,
    errors=[(ZeroDivisionError, "When compiled_s >= eager_s compiling never pays: return None before dividing.")],
    otherwise="The count starts at 1 call: n compiled calls cost first_call_s + (n - 1) * compiled_s, against "
              "n * eager_s; when compiled_s >= eager_s it never pays, so return None.",
    success="your break-even formula gives the right call count in every case.",
)
