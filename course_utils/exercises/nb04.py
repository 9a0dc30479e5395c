"""Exercises of notebook 04: data-dependent control flow with torch.cond and torch.while_loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


from .framework import ErrorHint, Mistake, Wrong, capture, case, function_exercise, nodes, run, short

_DECIDE_IN_GRAPH = ("Python needs True or False from a tensor's value here (an `if`, a `while`, bool() or a "
                    "comparison of .item()), which torch.compile(fullgraph=True) and torch.export cannot know "
                    "while tracing: give the decision to torch.cond (a loop: torch.while_loop), with the "
                    "tensor itself as predicate.")
_SAME_KIND = "Both branches must return the same structure, dtype and number of dimensions."

#: What torch.cond, torch.while_loop and torch.export raise when a control-flow rewrite goes wrong.
CONTROL_FLOW_ERRORS: list[ErrorHint] = [
    ("aliasing", "torch.cond branches must not return an input tensor as-is, or a view of it (an output "
                 "may not alias an input): return a new tensor, e.g. x.clone()."),
    ("input mutation", "A branch or loop body changes a tensor in place (add_, div_, ...); compute a new "
                       "tensor instead."),
    ("SymFloat", "A branch uses a Python number taken out of a tensor with .item(): keep it a tensor and "
                 "pass it to the branches as an operand, e.g. torch.cond(peak > 1, lambda x, p: x / p, "
                 "lambda x, p: x.clone(), (x, peak))."),
    ("Unmatched output spec", "The branches return different structures. A common cause: x.max(dim=...) "
                              "returns a (values, indices) pair; x.amax(dim=...) returns just the values."),
    ("same dim", _SAME_KIND), ("same dtype", _SAME_KIND),
    ("Data-dependent", _DECIDE_IN_GRAPH), ("data-dependent", _DECIDE_IN_GRAPH), ("generic_jump", _DECIDE_IN_GRAPH),
]


def one_graph_with(op: Any, name: str, why: str = "") -> Callable[[Any], None]:
    """Return a check that the answer is captured as one graph (fullgraph=True) containing ``op``."""
    def check(answer: Any) -> None:
        x = torch.tensor([[3.0, -0.5], [0.25, 1.5]])
        graphs = run(capture, answer, x, call="your function under torch.compile(fullgraph=True)",
                     errors=CONTROL_FLOW_ERRORS)
        if not any(node.target is op for node in nodes(graphs)):
            raise Wrong(f"right values and no graph break, but there is no {name} in the graph{why}. This "
                        f"exercise asks for {name}.")

    return check


def exports_right(answer: Any, reference: Callable[[torch.Tensor], torch.Tensor],
                  inputs: list[torch.Tensor]) -> None:
    """Return None when torch.export captures ``answer`` and the program matches ``reference`` on ``inputs``."""
    class Wrapper(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return answer(x)

    program = run(torch.export.export, Wrapper(), (inputs[0],), call="torch.export.export of your function",
                  errors=CONTROL_FLOW_ERRORS).module()
    for x in inputs:
        got = run(program, x, call=f"the exported program on {short(x)}")
        if not torch.allclose(got, reference(x), rtol=1e-5, atol=1e-6):
            raise Wrong(f"the exported program gives {short(got)} on {short(x)} instead of {short(reference(x))}: "
                        "check which branch runs when the predicate is True.")


# --- 04.cond_export: rewrite a Python if on a tensor value with torch.cond.

def _normalize_reference(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    return x / peak if peak > 1.0 else x


def _normalize_cases() -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(4)
    quiet = torch.rand(6, generator=gen) * 0.8 - 0.4   # peak below 1: returned unchanged
    loud = torch.randn(6, generator=gen) * 5           # peak above 1: divided by its peak
    return [(quiet,), (loud,)]


def normalize_if_loud(x: torch.Tensor) -> torch.Tensor:
    """Return x divided by its peak when the peak is above 1, else a copy of x."""
    peak = x.abs().max()
    return torch.cond(peak > 1.0,
                      lambda x, peak: x / peak,
                      lambda x, peak: x.clone(),  # a branch may not return its operand itself
                      (x, peak))


def _cond_export_mistakes() -> list[Mistake]:
    def item_in_closure(x: torch.Tensor) -> torch.Tensor:  # the branches close over a Python float
        peak = x.abs().max().item()
        return torch.cond(peak > 1.0, lambda x: x / peak, lambda x: x.clone(), (x,))

    divide, keep, alias = (lambda x, p: x / p), (lambda x, p: x.clone()), (lambda x, p: x)
    return [(_normalize_reference, "give the decision to torch.cond"),
            (lambda x: torch.cond(x.abs().max() > 1.0, divide, alias, (x, x.abs().max())),
             "must not return an input tensor as-is"),
            (lambda x: torch.cond(x.abs().max() > 1.0, keep, divide, (x, x.abs().max())),
             "The branches are swapped: true_fn runs when the predicate is True, false_fn otherwise."),
            (lambda x: torch.where(x.abs().max() > 1.0, x / x.abs().max(), x), "no torch.cond in the graph"),
            (item_in_closure, "taken out of a tensor with .item()"),
            (lambda x: torch.cond(bool(x.abs().max() > 1.0), divide, keep, (x, x.abs().max())),
             "with the tensor itself as predicate")]


def _cond_exports(answer: Any) -> None:
    one_graph_with(torch.ops.higher_order.cond, "torch.cond",
                   " (torch.where, for instance, computes both branches every time)")(answer)
    exports_right(answer, _normalize_reference, [x for x, in _normalize_cases()])


function_exercise(
    "04.cond_export",
    solution=normalize_if_loud,
    reference=_normalize_reference,
    cases=_normalize_cases,
    mistakes=_cond_export_mistakes,
    errors=CONTROL_FLOW_ERRORS,
    otherwise="Either the branches are swapped (true_fn runs when the predicate is True) or a branch "
              "computes the wrong values.",
    after=_cond_exports,
    success="it exports with a cond in the graph, and the exported program takes both branches correctly.",
)

# --- 04.fix_shapes: make both branches of a cond return the same kind of output.


def _row_summary_reference(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=-1) if x.mean() > 0 else x.amax(dim=-1)


def row_summary(x: torch.Tensor) -> torch.Tensor:
    """Return the row means of x when x.mean() > 0, else the row maxima; shape (batch,)."""
    return torch.cond(x.mean() > 0,
                      lambda x: x.mean(dim=-1),   # (batch,)
                      lambda x: x.amax(dim=-1),   # (batch,)
                      (x,))


def _row_summary(true_fn: Callable[..., Any], false_fn: Callable[..., Any]) -> Callable[[torch.Tensor], Any]:
    return lambda x: torch.cond(x.mean() > 0, true_fn, false_fn, (x,))


def _fix_shapes_mistakes() -> list[Mistake]:
    mean, amax = (lambda x: x.mean(dim=-1)), (lambda x: x.amax(dim=-1))
    return [(_row_summary(lambda x: x.mean(dim=-1, keepdim=True), amax),   # the notebook's broken version
             "same structure, dtype and number of dimensions"),
            (_row_summary(mean, lambda x: x.max(dim=-1)), "x.amax(dim=...)"),
            (_row_summary(amax, mean), "The branches are swapped: row means when x.mean() > 0, otherwise row maxima."),
            (_row_summary_reference, "give the decision to torch.cond")]


def _fix_shapes_wrong() -> list[Mistake]:  # both return (batch, 1): the hint depends on how
    return [(_row_summary(lambda x: x.mean(dim=-1, keepdim=True), lambda x: x.amax(dim=-1, keepdim=True)),
             "drop keepdim=True"),
            (_row_summary(lambda x: x.mean(dim=-1)[:, None], lambda x: x.amax(dim=-1)[:, None]),
             "without the extra dimension of size 1")]


def _fix_shapes_hint(answer: Any) -> str:
    try:
        keeps_dim = any(node.kwargs.get("keepdim") for node in nodes(capture(answer, torch.ones(2, 3))))
    except Exception:  # noqa: BLE001 - only chooses the wording of the hint
        keeps_dim = False
    if keeps_dim:
        return "Each branch must return one value per row, shape (batch,): drop keepdim=True."
    return ("Each branch must return one value per row, shape (batch,), without the extra dimension of size 1: "
            "the row means when x.mean() > 0, otherwise the row maxima.")


function_exercise(
    "04.fix_shapes",
    solution=row_summary,
    reference=_row_summary_reference,
    cases=lambda: [(torch.randn(5, 7, generator=torch.Generator().manual_seed(40)) + shift,) for shift in (2.0, -2.0)],
    mistakes=_fix_shapes_mistakes,
    wrong=_fix_shapes_wrong,
    errors=CONTROL_FLOW_ERRORS,
    otherwise=_fix_shapes_hint,
    after=one_graph_with(torch.ops.higher_order.cond, "torch.cond", ": keep the cond and fix what its branches return"),
    success="both branches now return (batch,) and the whole function is one graph.",
)

# --- 04.halvings: a data-dependent loop with torch.while_loop.


def halvings(x: torch.Tensor) -> torch.Tensor:
    """Return how many halvings bring x.abs().max() down to at most 1, as a 0-d int64 tensor."""
    def keep_going(n, y):
        return y.abs().max() > 1

    def halve(n, y):
        return n + 1, y / 2

    n, _ = torch.while_loop(keep_going, halve, (torch.zeros((), dtype=torch.int64), x))
    return n


def _as_count(result: Any) -> Any:
    """Return a count as a float (an int, a float or a one-element tensor); anything else unchanged."""
    if isinstance(result, torch.Tensor) and result.numel() == 1 and result.dtype != torch.bool:
        return float(result.item())
    return float(result) if isinstance(result, (int, float)) and not isinstance(result, bool) else result


def _halvings_mistakes() -> list[Mistake]:
    def python_while(x: torch.Tensor) -> torch.Tensor:  # right counts, graph break
        n = torch.zeros((), dtype=torch.int64)
        while x.abs().max() > 1:
            x, n = x / 2, n + 1
        return n

    def loop(x: torch.Tensor, keep_going: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.while_loop(keep_going, lambda n, y: (n + 1, y / 2), (torch.zeros((), dtype=torch.int64), x))

    return [(python_while, "torch.while_loop"),
            (lambda x: loop(x, lambda n, y: y.abs().max() >= 1)[0],
             "Stop as soon as the peak is <= 1: a peak of exactly 1 needs no halving."),
            (lambda x: loop(x, lambda n, y: y.abs().max() > 1)[1],
             "Return the count (the loop counter), not the halved tensor.")]


function_exercise(
    "04.halvings",
    solution=halvings,
    cases=lambda: [case(torch.tensor(values), gives=count) for values, count in (
        ([0.5, -0.25], 0),      # already at most 1
        ([1.0, -1.0], 0),       # exactly 1 needs no halving
        ([3.0, 0.1], 2),        # 3 -> 1.5 -> 0.75
        ([-1000.0, 7.0], 10),   # 1000 / 2**9 > 1 >= 1000 / 2**10
        ([4.0], 2))],           # 4 -> 2 -> 1: stops at exactly 1
    mistakes=_halvings_mistakes,
    errors=CONTROL_FLOW_ERRORS,
    normalise=_as_count,
    otherwise="Count the halvings with torch.while_loop(cond_fn, body_fn, (counter, x)) and return the counter; "
              "stop as soon as the peak is <= 1.",
    after=one_graph_with(torch.ops.higher_order.while_loop, "torch.while_loop"),
    success="right on every case, and the loop is captured as one while_loop in one graph.",
)
