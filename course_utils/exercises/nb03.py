"""Exercises of notebook 03: a backend of your own, and predicting Inductor's kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .framework import Mistake, OpCounter, Wrong, clean_dynamo, exercise, function_exercise

# --- 03.count_ops: a custom backend that counts the operator nodes of every graph.

#: The node kinds that are operations (the others are placeholder, get_attr and output).
OPERATOR_NODE_KINDS = ("call_function", "call_method", "call_module")

# The test functions are built from source on every check, so each check compiles fresh
# code objects: nothing Dynamo cached for an earlier attempt (or another backend) is reused.
_CASES_SOURCE = '''
import torch
import torch.nn.functional as F

def three_ops(x):
    return torch.sin(x) * 2 + 1

def with_a_break(x):
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return torch.cos(y) * y

def python_loop(x):
    for scale in (1.0, 2.0, 3.0):
        x = torch.tanh(x) * scale
    return x

def composite(x, w):
    return F.linear(x, w).relu()
'''

#: Dynamo operator nodes summed over all graphs of each case function.
OP_COUNTS = {"three_ops": 3, "with_a_break": 4, "python_loop": 6, "composite": 2}


def _count_cases() -> list[tuple[Any, ...]]:
    namespace: dict[str, Any] = {}
    exec(compile(_CASES_SOURCE, "<03.count_ops cases>", "exec"), namespace)  # noqa: S102
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 8, generator=gen), torch.randn(6, 8, generator=gen)
    return [(namespace[name], x, w) if name == "composite" else (namespace[name], x) for name in OP_COUNTS]


def count_ops(fn: Callable[..., Any], *args: Any) -> int:
    """Return the number of operator nodes in all graphs Dynamo captures from fn(*args)."""
    counts: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Dynamo calls the backend once per graph; a graph break means several graphs.
        counts.append(sum(node.op in ("call_function", "call_method", "call_module")
                          for node in gm.graph.nodes))
        return gm.forward  # run the graph unchanged

    torch.compile(fn, backend=counting_backend)(*args)
    return sum(counts)


def _counting(count_graph: Callable[[torch.fx.GraphModule], int], combine: Callable[[list[int]], int] = sum,
              call: bool = True) -> Callable[..., int]:
    """Return a count_ops that counts each graph with ``count_graph`` and combines the counts."""
    def count_ops(fn: Callable[..., Any], *args: Any) -> int:
        counts: list[int] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            counts.append(count_graph(gm))
            return gm.forward

        compiled = torch.compile(fn, backend=backend)
        if call:
            compiled(*args)
        return combine(counts) if counts else 0

    return count_ops


def _count_ops_mistakes() -> list[Mistake]:
    def operators(gm: torch.fx.GraphModule) -> int:
        return sum(n.op in OPERATOR_NODE_KINDS for n in gm.graph.nodes)

    def counts_eager_aten_ops(fn: Callable[..., Any], *args: Any) -> int:
        with OpCounter() as counter:
            fn(*args)
        return counter.ops

    return [(_counting(lambda gm: len(gm.graph.nodes)), "Count only nodes whose op is call_function, call_method "
             "or call_module: placeholders (inputs) and the output node are not operations."),
            (_counting(operators, combine=lambda counts: counts[-1]), "A graph break splits the function into "
             "graphs and Dynamo calls your backend once for each: add the counts up instead of keeping the last."),
            (counts_eager_aten_ops, "That is what eager dispatches to ATen (t, mm, relu). Count the nodes of the "
             "graphs Dynamo captures, where linear is one torch-level call."),
            (_counting(operators, call=False), "Did your backend run? Call the compiled function once with args: "
             "Dynamo hands the graphs to your backend on that first call.")]


function_exercise(
    "03.count_ops",
    solution=count_ops,
    reference=lambda fn, *args: OP_COUNTS[fn.__name__],
    cases=_count_cases,
    mistakes=_count_ops_mistakes,
    prepare=clean_dynamo,
    otherwise="Count only nodes whose op is call_function, call_method or call_module, in every graph "
              "Dynamo hands to your backend (a graph break makes several).",
    success="your backend counts the operations in every graph Dynamo captures.",
)

# --- 03.fused_kernels: predict how many C++ kernels Inductor writes for a function.


def sin_matmul_relu_cos(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The function of exercise 03.fused_kernels."""
    return torch.relu(torch.sin(x) @ w).cos()


#: The answer the notebook also verifies against the installed torch on every run.
FUSED_KERNELS = 2


def _fused_solution() -> int:
    # sin runs before the matrix multiply and cannot join it: one generated C++ kernel.
    # The matrix multiply itself is a library call (extern_kernels.mm), not generated code.
    # relu and cos both read the product element by element: they fuse into a second kernel.
    kernels_before_mm, kernels_after_mm = 1, 1
    return kernels_before_mm + kernels_after_mm


_FUSED_HINTS = {
    0: "Inductor does generate code for this function: only the matrix multiply goes to a library.",
    1: "the matrix multiply is a call into a library (oneDNN/MKL, shown as extern_kernels.mm), not "
       "generated code, so nothing fuses across it: what runs before it and what runs after it "
       "end up in separate kernels.",
    3: "close: the matrix multiply is not a generated kernel, and relu and cos both work element by "
       "element on its result, so they share one loop.",
    4: "that is how many operations eager PyTorch runs (sin, mm, relu, cos). Inductor fuses the "
       "element-wise ones where it can and hands the matrix multiply to a library.",
}


@exercise(
    "03.fused_kernels",
    solution=_fused_solution,
    wrong_answers=lambda: [*((n, hint[:40]) for n, hint in _FUSED_HINTS.items()), (7, "share one loop"),
                           ("2", "whole number"), (2.5, "whole number"), (None, "whole number")],
)
def check_fused_kernels(answer: Any) -> str:
    """Return the success message for the number of C++ kernels Inductor generates for sin -> mm -> relu -> cos."""
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise Wrong(f"answer with a whole number (an int such as 3), not {type(answer).__name__} {answer!r}.")
    if answer != FUSED_KERNELS:
        hint = _FUSED_HINTS.get(answer, "think about which operations can share one loop over the "
                                        "elements, and which one Inductor hands to a library.")
        raise Wrong(f"{answer} is not it. Hint: {hint}")
    return ("two kernels: sin before the matrix multiply, relu and cos fused after it; the "
            "matrix multiply itself is a library call.")
