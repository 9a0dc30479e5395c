"""Exercises of notebook 03: a backend of your own, and predicting Inductor's kernels."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from .framework import Wrong, exercise

# ---------------------------------------------------------------------------
# 03.count_ops: a custom backend that counts the operator nodes of every graph.
# ---------------------------------------------------------------------------

#: The node kinds that are operations (the others are placeholder, get_attr and output).
OPERATOR_NODE_KINDS = ("call_function", "call_method", "call_module")

# The test functions are built from source on every check, so each check compiles fresh
# code objects: nothing Dynamo cached for an earlier attempt (or another backend) is reused,
# and repeated checks never run into the recompile limit.
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

#: (function name, what it shows, Dynamo operator nodes summed over all its graphs)
COUNT_CASES: tuple[tuple[str, str, int], ...] = (
    ("three_ops", "torch.sin(x) * 2 + 1", 3),
    ("with_a_break", "a function with a graph break (two graphs)", 4),
    ("python_loop", "a Python loop of three tanh-and-scale steps", 6),
    ("composite", "F.linear(x, w).relu()", 2),
)


def _fresh_cases() -> dict[str, Callable[..., torch.Tensor]]:
    namespace: dict[str, Any] = {}
    exec(compile(_CASES_SOURCE, "<03.count_ops cases>", "exec"), namespace)  # noqa: S102
    return namespace


def _case_args(name: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, generator=gen)
    if name == "composite":
        return x, torch.randn(6, 8, generator=gen)
    return (x,)


def _count_ops_solution() -> Callable[..., int]:
    def count_ops(fn: Callable[..., Any], *args: Any) -> int:
        counts: list[int] = []

        def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            # Dynamo calls the backend once per graph; a graph break means several graphs.
            counts.append(sum(node.op in ("call_function", "call_method", "call_module")
                              for node in gm.graph.nodes))
            return gm.forward  # run the graph unchanged

        torch.compile(fn, backend=counting_backend)(*args)
        return sum(counts)

    return count_ops


def _count_ops_wrong() -> list[Any]:
    def counts_every_node(fn: Callable[..., Any], *args: Any) -> int:
        counts: list[int] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            counts.append(len(gm.graph.nodes))  # includes placeholders and the output node
            return gm.forward

        torch.compile(fn, backend=backend)(*args)
        return sum(counts)

    def keeps_last_graph(fn: Callable[..., Any], *args: Any) -> int:
        count = 0

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            nonlocal count
            count = sum(n.op in OPERATOR_NODE_KINDS for n in gm.graph.nodes)  # overwrites
            return gm.forward

        torch.compile(fn, backend=backend)(*args)
        return count

    def counts_eager_aten_ops(fn: Callable[..., Any], *args: Any) -> int:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Counter(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                Counter.n += 1
                return func(*args, **(kwargs or {}))

        with Counter():
            fn(*args)
        return Counter.n

    return [counts_every_node, keeps_last_graph, counts_eager_aten_ops, 3, None]


@exercise(
    "03.count_ops",
    prompt="write count_ops(fn, *args) that compiles fn with a backend of your own, calls it once "
           "with args, and returns the number of operator nodes (op is call_function, call_method "
           "or call_module) summed over every graph Dynamo hands to the backend.",
    solution=_count_ops_solution,
    wrong_answers=_count_ops_wrong,
)
def check_count_ops(answer: Any) -> str:
    """Accept a function that counts Dynamo's operator nodes over all graphs."""
    if not callable(answer):
        raise Wrong(f"expected a function count_ops(fn, *args), got {type(answer).__name__}: "
                    "write a function that compiles fn with your backend and returns a count.")
    cases = _fresh_cases()
    for name, what, expected in COUNT_CASES:
        got = answer(cases[name], *_case_args(name))
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"for {what} your function returned {got!r}; return the count as an int.")
        if got == expected:
            continue
        if got == 0:
            raise Wrong(f"for {what} you counted 0 operator nodes. Did your backend run? Compile with "
                        "torch.compile(fn, backend=your_backend), call the result once, and count the "
                        "nodes of gm.graph inside the backend.")
        if name == "with_a_break" and got == 2:
            raise Wrong("a graph break splits the function into two graphs and Dynamo calls your backend "
                        "once for each: add the counts up instead of keeping only one.")
        if name == "composite" and got == 3:
            raise Wrong("for F.linear(x, w).relu() you counted 3: that is what eager dispatches to ATen "
                        "(t, mm, relu). Count the nodes of the graph Dynamo captures, where linear is "
                        "one torch-level call.")
        raise Wrong(f"for {what} you counted {got}, expected {expected}. Count only nodes whose op is "
                    "call_function, call_method or call_module: placeholders (inputs) and the output "
                    "node are not operations.")
    return "your backend counts the operations in every graph Dynamo captures."


# ---------------------------------------------------------------------------
# 03.fused_kernels: predict how many C++ kernels Inductor writes for a function.
# ---------------------------------------------------------------------------

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


_FUSED_HINTS = collections.OrderedDict([
    (0, "Inductor does generate code for this function: only the matrix multiply goes to a library."),
    (1, "the matrix multiply is a call into a library (oneDNN/MKL, shown as extern_kernels.mm), not "
        "generated code, so nothing fuses across it: what runs before it and what runs after it "
        "end up in separate kernels."),
    (3, "close: the matrix multiply is not a generated kernel, and relu and cos both work element by "
        "element on its result, so they share one loop."),
    (4, "that is how many operations eager PyTorch runs (sin, mm, relu, cos). Inductor fuses the "
        "element-wise ones where it can and hands the matrix multiply to a library."),
])


@exercise(
    "03.fused_kernels",
    prompt="how many generated C++ kernels (cpp_fused_... definitions) does Inductor write for "
           "torch.relu(torch.sin(x) @ w).cos() on CPU tensors? Answer with an int.",
    solution=_fused_solution,
    wrong_answers=lambda: [1, 3, 4, 0, "2", 2.5, None],
)
def check_fused_kernels(answer: Any) -> str:
    """Accept the number of C++ kernels Inductor generates for sin -> mm -> relu -> cos."""
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise Wrong(f"answer with a whole number (an int such as 3), not {type(answer).__name__} "
                    f"{answer!r}.")
    if answer != FUSED_KERNELS:
        hint = _FUSED_HINTS.get(answer, "think about which operations can share one loop over the "
                                        "elements, and which one Inductor hands to a library.")
        raise Wrong(f"{answer} is not it. Hint: {hint}")
    return ("two kernels: sin before the matrix multiply, relu and cos fused after it; the "
            "matrix multiply itself is a library call.")
