"""Exercises of notebook 04: data-dependent control flow with torch.cond and torch.while_loop."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from typing import Any

import torch

from ..compat import export
from .framework import Wrong, exercise, expect_function


def _first_line(err: BaseException) -> str:
    """Return the most telling line of an error raised while capturing control flow."""
    text = str(err)
    quoted = re.search(r"got \w+\((['\"])(.*?)\1\)", text)  # Dynamo quotes the original error
    if quoted:
        return " ".join(quoted.group(2).replace("\\n", " ").split())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].startswith("This higher order operator doesn't work") and len(lines) > 1:
        return lines[1]  # the wrapper's first line is generic; the second names the problem
    return lines[0] if lines else type(err).__name__


def _capture(fn: Callable[..., Any], *args: Any) -> tuple[list[torch.fx.GraphModule], Any]:
    """Return (graphs, output) of ``fn(*args)`` compiled with fullgraph=True and no code generation.

    Raises what Dynamo raises when ``fn`` cannot be captured as one graph. Torch's own
    log lines about the failure are kept out of the learner's output.
    """
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    with contextlib.redirect_stderr(io.StringIO()):
        out = torch.compile(fn, backend=keep, fullgraph=True)(*args)
    return graphs, out


def _uses(graphs: list[torch.fx.GraphModule], op: Any) -> bool:
    return any(node.target is op for gm in graphs for node in gm.graph.nodes)


def _explain_failure(err: BaseException, what: str, operator: str = "torch.cond") -> Wrong:
    text = str(err)
    if "Data-dependent branching" in text or "generic_jump" in text:
        return Wrong(f"{what} still branches in Python on a tensor's value, so torch.compile(fullgraph=True) "
                     f"and torch.export cannot capture it ({_first_line(err)}). Move the decision "
                     f"into {operator}.")
    if "aliasing" in text:
        return Wrong("a branch returns one of its operands (or a view of it) unchanged; control-flow "
                     "operators forbid outputs that alias inputs. Return a copy, e.g. x.clone().")
    if "input mutation" in text:
        return Wrong("a branch or loop body changes a tensor in place (add_, mul_, ...); compute a new "
                     "tensor instead.")
    if "Unmatched output spec" in text:
        return Wrong(f"the two branches return different structures ({_first_line(err)}). A common "
                     "cause: x.max(dim=...) returns a (values, indices) pair; x.amax(dim=...) returns "
                     "just the values.")
    if "same dim" in text or "same dtype" in text:
        return Wrong(f"the two branches return different kinds of output ({_first_line(err)}). Both "
                     "must return the same structure, dtype and number of dimensions.")
    return Wrong(f"{what} could not be captured as one graph: {type(err).__name__}: {_first_line(err)}")


# ---------------------------------------------------------------------------
# 04.cond_export: rewrite a Python if on a tensor value with torch.cond.
# ---------------------------------------------------------------------------

def _normalize_reference(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    return x / peak if peak > 1.0 else x


#: (description, input) pairs: one input per branch of the reference.
def _normalize_cases() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(4)
    quiet = torch.rand(6, generator=gen) * 0.8 - 0.4   # peak below 1: returned unchanged
    loud = torch.randn(6, generator=gen) * 5           # peak above 1: divided by its peak
    return [("a quiet input (peak <= 1)", quiet), ("a loud input (peak > 1)", loud)]


def _cond_export_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def normalize_if_loud(x: torch.Tensor) -> torch.Tensor:
        peak = x.abs().max()
        return torch.cond(peak > 1.0,
                          lambda x, peak: x / peak,
                          lambda x, peak: x.clone(),  # a branch may not return its operand itself
                          (x, peak))

    return normalize_if_loud


def _cond_export_wrong() -> list[Any]:
    def python_if(x: torch.Tensor) -> torch.Tensor:  # right values, but a graph break
        return _normalize_reference(x)

    def returns_operand(x: torch.Tensor) -> torch.Tensor:  # aliasing: the false branch returns x
        peak = x.abs().max()
        return torch.cond(peak > 1.0, lambda x, p: x / p, lambda x, p: x, (x, peak))

    def swapped(x: torch.Tensor) -> torch.Tensor:  # branches the wrong way round
        peak = x.abs().max()
        return torch.cond(peak > 1.0, lambda x, p: x.clone(), lambda x, p: x / p, (x, peak))

    def branchless(x: torch.Tensor) -> torch.Tensor:  # correct and capturable, but no torch.cond
        peak = x.abs().max()
        return torch.where(peak > 1.0, x / peak, x)

    return [python_if, returns_operand, swapped, branchless, torch.ones(3), None]


@exercise(
    "04.cond_export",
    prompt="rewrite normalize_if_loud(x) (divide x by its peak x.abs().max() when the peak is above 1, "
           "otherwise return x unchanged) with torch.cond so that torch.export can capture it.",
    solution=_cond_export_solution,
    wrong_answers=_cond_export_wrong,
)
def check_cond_export(answer: Any) -> str:
    """Accept a function that matches the reference on both branches and exports with a cond in it."""
    expect_function(answer, "normalize_if_loud(x)")
    cases = _normalize_cases()
    for label, x in cases:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                out = answer(x.clone())
        except Exception as err:  # noqa: BLE001 - turned into a hint
            raise _explain_failure(err, "your function") from None
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            raise Wrong(f"on {label} your function returned {type(out).__name__} "
                        f"{tuple(getattr(out, 'shape', ()))}; it should return a tensor shaped like x.")
        if not torch.allclose(out, _normalize_reference(x), rtol=1e-5, atol=1e-6):
            raise Wrong(f"wrong values on {label}. Check which function is true_fn (taken when the "
                        "predicate is True) and which is false_fn.")
    try:
        graphs, _ = _capture(answer, cases[1][1])
    except Exception as err:  # noqa: BLE001 - turned into a hint
        raise _explain_failure(err, "your function") from None
    if not _uses(graphs, torch.ops.higher_order.cond):
        raise Wrong("right values and no graph break, but there is no torch.cond in the graph "
                    "(torch.where, for instance, computes both branches every time). This exercise "
                    "asks for torch.cond.")

    class Wrapper(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return answer(x)

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            program = export(Wrapper(), (cases[0][1],), strict=False)
    except Exception as err:  # noqa: BLE001 - turned into a hint
        raise _explain_failure(err, "torch.export of your function") from None
    for label, x in cases:
        if not torch.allclose(program.module()(x), _normalize_reference(x), rtol=1e-5, atol=1e-6):
            raise Wrong(f"the exported program gives wrong values on {label}.")
    return "it exports with a cond in the graph, and the exported program takes both branches correctly."


# ---------------------------------------------------------------------------
# 04.fix_shapes: make both branches of a cond return the same kind of output.
# ---------------------------------------------------------------------------

def _row_summary_reference(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=-1) if x.mean() > 0 else x.amax(dim=-1)


def _row_cases() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(40)
    base = torch.randn(5, 7, generator=gen)
    return [("an input with a positive mean", base + 2.0), ("an input with a negative mean", base - 2.0)]


def _fix_shapes_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def row_summary(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.mean() > 0,
                          lambda x: x.mean(dim=-1),   # (batch,)
                          lambda x: x.amax(dim=-1),   # (batch,)
                          (x,))

    return row_summary


def _fix_shapes_wrong() -> list[Any]:
    def broken(x: torch.Tensor) -> torch.Tensor:  # the notebook's broken version: (batch, 1) vs (batch,)
        return torch.cond(x.mean() > 0, lambda x: x.mean(dim=-1, keepdim=True),
                          lambda x: x.amax(dim=-1), (x,))

    def both_keepdim(x: torch.Tensor) -> torch.Tensor:  # captures, but returns (batch, 1)
        return torch.cond(x.mean() > 0, lambda x: x.mean(dim=-1, keepdim=True),
                          lambda x: x.amax(dim=-1, keepdim=True), (x,))

    def max_tuple(x: torch.Tensor) -> torch.Tensor:  # x.max(dim) returns (values, indices)
        return torch.cond(x.mean() > 0, lambda x: x.mean(dim=-1), lambda x: x.max(dim=-1), (x,))

    def python_if(x: torch.Tensor) -> torch.Tensor:  # right values, graph break
        return _row_summary_reference(x)

    return [broken, both_keepdim, max_tuple, python_if, "row_summary"]


@exercise(
    "04.fix_shapes",
    prompt="fix row_summary(x) so that both branches of its torch.cond return one value per row, "
           "shape (batch,): the row means when x.mean() > 0, otherwise the row maxima.",
    solution=_fix_shapes_solution,
    wrong_answers=_fix_shapes_wrong,
)
def check_fix_shapes(answer: Any) -> str:
    """Accept a cond-based row_summary that returns (batch,) values on both branches."""
    expect_function(answer, "row_summary(x)")
    for label, x in _row_cases():
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                out = answer(x.clone())
        except Exception as err:  # noqa: BLE001 - turned into a hint
            raise _explain_failure(err, "row_summary") from None
        if isinstance(out, (tuple, list)):
            raise Wrong("row_summary returned a tuple: x.max(dim=...) returns (values, indices). "
                        "Use x.amax(dim=-1) or x.max(dim=-1).values.")
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"row_summary returned {type(out).__name__}; it should return a tensor.")
        if out.shape != (x.shape[0],):
            raise Wrong(f"on {label} the result has shape {tuple(out.shape)}; one value per row means "
                        f"shape {(x.shape[0],)}. Drop keepdim=True.")
        if not torch.allclose(out, _row_summary_reference(x), rtol=1e-5, atol=1e-6):
            raise Wrong(f"wrong values on {label}: row means when x.mean() > 0, row maxima otherwise.")
    try:
        graphs, _ = _capture(answer, _row_cases()[0][1])
    except Exception as err:  # noqa: BLE001 - turned into a hint
        raise _explain_failure(err, "row_summary") from None
    if not _uses(graphs, torch.ops.higher_order.cond):
        raise Wrong("right values and no graph break, but no torch.cond in the graph; keep the cond "
                    "and fix what its branches return.")
    return "both branches now return (batch,) and the whole function is one graph."


# ---------------------------------------------------------------------------
# 04.halvings: a data-dependent loop with torch.while_loop.
# ---------------------------------------------------------------------------

#: (input values, expected number of halvings until max |x| <= 1)
HALVING_CASES: tuple[tuple[tuple[float, ...], int], ...] = (
    ((0.5, -0.25), 0),
    ((1.0, -1.0), 0),
    ((3.0, 0.1), 2),        # 3 -> 1.5 -> 0.75
    ((-1000.0, 7.0), 10),   # 1000 / 2**10 < 1 <= 1000 / 2**9
    ((4.0,), 2),            # 4 -> 2 -> 1: stops at exactly 1
)


def _halvings_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def halvings(x: torch.Tensor) -> torch.Tensor:
        def keep_going(n, y):
            return y.abs().max() > 1

        def halve(n, y):
            return n + 1, y / 2

        n, _ = torch.while_loop(keep_going, halve, (torch.zeros((), dtype=torch.int64), x))
        return n

    return halvings


def _halvings_wrong() -> list[Any]:
    def python_while(x: torch.Tensor) -> torch.Tensor:  # right counts, graph break
        n = torch.zeros((), dtype=torch.int64)
        while x.abs().max() > 1:
            x, n = x / 2, n + 1
        return n

    def off_by_one(x: torch.Tensor) -> torch.Tensor:  # also halves when the peak is exactly 1
        return torch.while_loop(lambda n, y: y.abs().max() >= 1, lambda n, y: (n + 1, y / 2),
                                (torch.zeros((), dtype=torch.int64), x))[0]

    def returns_values(x: torch.Tensor) -> torch.Tensor:  # returns the halved tensor, not the count
        return torch.while_loop(lambda n, y: y.abs().max() > 1, lambda n, y: (n + 1, y / 2),
                                (torch.zeros((), dtype=torch.int64), x))[1]

    return [python_while, off_by_one, returns_values, None]


@exercise(
    "04.halvings",
    prompt="write halvings(x) with torch.while_loop: how many times x must be halved until "
           "x.abs().max() <= 1, returned as an integer (a 0-d tensor or an int).",
    solution=_halvings_solution,
    wrong_answers=_halvings_wrong,
)
def check_halvings(answer: Any) -> str:
    """Accept a while_loop-based halving counter that is right on every case and captures as one graph."""
    expect_function(answer, "halvings(x)")
    for values, expected in HALVING_CASES:
        x = torch.tensor(values)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                got = answer(x.clone())
        except Exception as err:  # noqa: BLE001 - turned into a hint
            raise _explain_failure(err, "halvings", "torch.while_loop") from None
        if got is None:
            raise Wrong(f"halvings({list(values)}) returned None; run torch.while_loop and return its "
                        "counter.")
        if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_floating_point():
            got = int(got.item())
        if isinstance(got, bool) or not isinstance(got, int):
            shape = f" of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else ""
            raise Wrong(f"halvings({list(values)}) returned a {type(got).__name__}{shape}; return the "
                        "count (the integer loop counter), not the halved tensor.")
        if got != expected:
            hint = (" Stop as soon as the peak is <= 1: a peak of exactly 1 needs no halving."
                    if got == expected + 1 else "")
            raise Wrong(f"halvings({list(values)}) returned {got}, expected {expected}.{hint}")
    try:
        graphs, _ = _capture(answer, torch.tensor([3.0, -0.5]))
    except Exception as err:  # noqa: BLE001 - turned into a hint
        raise _explain_failure(err, "halvings", "torch.while_loop") from None
    if not _uses(graphs, torch.ops.higher_order.while_loop):
        raise Wrong("right counts and no graph break, but no while_loop in the graph; this exercise "
                    "asks for torch.while_loop.")
    return "right on every case, and the loop is captured as one while_loop in one graph."
