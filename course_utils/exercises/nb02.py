"""Exercises of notebook 02: counting graph breaks, removing them, predicting recompiles, and size 1.

Every checker measures the truth on the installed torch instead of trusting a stored
answer, so the exercises stay right when a torch release learns to trace something new.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from .framework import Mistake, Wrong, capture, exercise, function_exercise, nodes, run, uncompiled

# --- 02.count_breaks: how many graph breaks does `mystery` have?


def mystery(x: torch.Tensor) -> torch.Tensor:
    """The function whose graph breaks the learner counts (the notebook prints this source)."""
    y = torch.nn.functional.gelu(x)
    clipped = np.clip(y.numpy(), -1.0, 1.0)   # NumPy on the tensor's data
    z = torch.from_numpy(clipped) * 2
    settings = {"shift": 0.5}
    z = z - settings["shift"]                 # a plain dict lookup
    peak = z.abs().max().item()               # a Python float out of a tensor
    z = z / peak
    if z.mean() > 0:                          # a branch on the values in a tensor
        z = z - z.mean()
    return torch.tanh(z)


@functools.lru_cache(maxsize=1)
def _mystery_breaks() -> int:
    """Return the number of graph breaks Dynamo reports for ``mystery`` (measured once)."""
    from ..breaks import break_report  # imports Dynamo (about a second): only when an answer is checked

    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    return break_report(mystery, x).breaks


@exercise(
    "02.count_breaks",
    solution=_mystery_breaks,
    wrong_answers=lambda: [(_mystery_breaks() + 1, "one too many"), (_mystery_breaks() + 2, "too many"),
                           (_mystery_breaks() - 1, "too few"), (0, "too few"),
                           (str(_mystery_breaks()), "expected a whole number"), (None, "expected a whole number"),
                           (_mystery_breaks() + 0.5, "not a whole number")],
)
def check_count_breaks(answer: Any) -> str:
    """Return the success message for the number of graph breaks torch._dynamo.explain measures here."""
    truth = _mystery_breaks()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise Wrong(f"expected a whole number such as 5, got {type(answer).__name__} {answer!r}.")
    if not float(answer).is_integer():
        raise Wrong(f"{answer} is not a whole number: a break either happens or it does not.")
    if answer == truth:
        return (f"{truth} breaks: the .item() call and the `if` on tensor data. NumPy calls and "
                "dict lookups are traced into the graph.")
    if answer == truth + 1:
        raise Wrong("one too many. Which line did you count that Dynamo can trace? Current torch "
                    "translates NumPy calls on a tensor's data into torch operations.")
    if answer > truth:
        raise Wrong("too many. A dict lookup and NumPy calls are traced; only code Dynamo cannot "
                    "put in a graph breaks it. Check with torch._dynamo.explain(mystery)(x).")
    raise Wrong("too few. Look for places where a tensor's *value* has to become a Python "
                "value: a Python number, or a Python `if` decision.")


# --- 02.fullgraph: rewrite a function so that torch.compile(fn, fullgraph=True) accepts it.


def soft_clip(x: torch.Tensor) -> torch.Tensor:
    """The function to fix: divide by the peak when it exceeds 1, then a scaled tanh."""
    peak = x.abs().max().item()
    if peak > 1.0:
        x = x / peak
    return torch.tanh(x) * 2


def soft_clip_fixed(x: torch.Tensor) -> torch.Tensor:
    """Return soft_clip(x), computed without leaving tensors (no .item(), no Python if)."""
    # Stay with tensors: never ask for a Python number, never branch in Python.
    peak = x.abs().max()
    x = torch.where(peak > 1.0, x / peak, x)
    return torch.tanh(x) * 2


_STAY_IN_TENSORS = "Keep the peak as a tensor (no .item()) and replace the Python `if` with torch.where."


def _soft_clip_mistakes() -> list[Mistake]:
    def keeps_item(x: torch.Tensor) -> torch.Tensor:  # compiles on current torch, but still a Python float
        peak = x.abs().max().item()
        return torch.tanh(x / max(peak, 1.0)) * 2

    return [(soft_clip, "fullgraph=True still refuses it"),
            (lambda x: torch.tanh(x / x.abs().max()) * 2, "Divide only when the peak is above 1: a quieter input stays "
                                                          "as it is."),
            (lambda x: torch.tanh(torch.where(x.abs().max() > 1.0, x / x.abs().max(), x)), "Keep the * 2 after the tanh."),
            (keeps_item, "still calls .item()")]


def _no_python_numbers(answer: Any) -> None:
    plain = uncompiled(answer)
    graphs = run(capture, plain, torch.full((4, 3), 3.0), call="torch.compile(soft_clip_fixed, fullgraph=True)")
    if any(n.op == "call_method" and n.target in ("item", "tolist") for n in nodes(graphs)):
        raise Wrong("it compiles and the values are right, but your function still calls .item(): the peak "
                    "becomes a Python number, which costs a device-to-host copy and a guard on its value. "
                    + _STAY_IN_TENSORS)


function_exercise(
    "02.fullgraph",
    solution=soft_clip_fixed,
    reference=soft_clip,
    cases=lambda: [(torch.randn(32, 8, generator=torch.Generator().manual_seed(0)) * 3,),     # peak above 1
                   (torch.rand(32, 8, generator=torch.Generator().manual_seed(1)) * 0.8 - 0.4,)],  # below 1
    mistakes=_soft_clip_mistakes,
    prepare=lambda answer: torch.compile(uncompiled(answer),
                                         fullgraph=True, backend="eager"),
    errors=[(kind, "fullgraph=True still refuses it. " + _STAY_IN_TENSORS) for kind in ("Unsupported: ", "UserError: ")],
    otherwise="It compiles, but the values differ from soft_clip: divide only when the peak is above 1, "
              "and keep the * 2.",
    after=_no_python_numbers,
    success="compiles as one graph with fullgraph=True and matches soft_clip on both branches.",
)

# --- 02.recompile: which second call recompiles?

STEP_SOURCE = '''\
def step(x, lr):
    return x - lr * torch.tanh(x)
'''

#: The second calls to choose from; each follows one first call step(torch.randn(32, 10), 0.1).
RECOMPILE_OPTIONS: dict[str, str] = {
    "A": "step(torch.randn(32, 10), 0.1)",
    "B": "step(torch.randn(64, 10), 0.1)",
    "C": "step(torch.randn(32, 10, dtype=torch.float64), 0.1)",
    "D": "step(torch.randn(32, 10), 0.01)",
    "E": "step(100 * torch.randn(32, 10), 0.1)",
    "F": "step(torch.randn(10, 32).t(), 0.1)",
}

_WHY = {
    "A": "the same kind of input again: every guard passes",
    "B": "a new batch size fails the shape guard",
    "C": "float64 fails the dtype guard",
    "D": "a Python float is a constant in the graph, guarded by value",
    "E": "guards check a tensor's metadata, never the numbers in it",
    "F": "same shape, but transposed: the strides differ, and strides are guarded",
}


def _recompiles(option: str) -> bool:
    """Return whether the second call ``option`` recompiles a freshly compiled ``step``."""
    # Start from a clean compiler: Dynamo remembers what it learned about a function (sizes that
    # changed, for automatic dynamic) by code location, and earlier options would otherwise leak
    # into later ones (seen on torch 2.11). The learner's compiled functions recompile on their
    # next call; the truth is measured once per process.
    torch._dynamo.reset()
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(STEP_SOURCE, f"<exercise 02.recompile, option {option}>", "exec"), namespace)
    compiles = 0

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        nonlocal compiles
        compiles += 1
        return gm.forward

    namespace["step"] = torch.compile(namespace["step"], backend=counting_backend)
    eval("step(torch.randn(32, 10), 0.1)", namespace)
    eval(RECOMPILE_OPTIONS[option], namespace)
    return compiles > 1


@functools.lru_cache(maxsize=1)
def _recompile_truth() -> frozenset[str]:
    """Return the letters whose second call recompiles, measured on this torch."""
    return frozenset(k for k in RECOMPILE_OPTIONS if _recompiles(k))


def _as_letters(answer: Any) -> set[str]:
    if isinstance(answer, str):
        items: Iterable[Any] = [c for c in answer if c.isalpha()]
    elif isinstance(answer, (set, frozenset, list, tuple)):
        items = answer
    else:
        raise Wrong(f"expected letters such as {{'A', 'B'}} or 'AB', got {type(answer).__name__}.")
    letters = set()
    for item in items:
        if not isinstance(item, str) or item.strip().upper() not in RECOMPILE_OPTIONS:
            raise Wrong(f"{item!r} is not one of the options {', '.join(RECOMPILE_OPTIONS)}.")
        letters.add(item.strip().upper())
    return letters


def _recompile_solution() -> set[str]:
    # B: a new batch size fails the shape guard.   C: float64 fails the dtype guard.
    # D: a new Python float fails the value guard.  F: a transposed view fails the stride guard.
    # A and E pass every guard: guards check a tensor's metadata, not the numbers in it.
    # (The checker measures this on your torch; see _recompiles above.)
    return set(_recompile_truth())


@exercise(
    "02.recompile",
    solution=_recompile_solution,
    wrong_answers=lambda: [({"B", "C"}, "you missed"), (set(RECOMPILE_OPTIONS), "do not recompile"),
                           (set(_recompile_truth()) - {"F"}, "you missed 1 that does "),
                           (set(_recompile_truth()) | {"E"}, "E does not recompile"),
                           (set(), f"you missed {len(_recompile_truth())} that do "), (3, "expected letters"),
                           ("BZ", "'Z' is not one of")],
)
def check_recompile(answer: Any) -> str:
    """Return the success message for exactly the set of options that recompile on this torch (measured)."""
    letters = _as_letters(answer)
    truth = _recompile_truth()
    extra, missing = sorted(letters - truth), sorted(truth - letters)
    if not extra and not missing:
        return "right: " + "; ".join(f"{k}: {_WHY[k]}" for k in sorted(truth)) + "."
    hints = []
    if extra:
        verb = "does" if len(extra) == 1 else "do"
        hints.append(f"{', '.join(extra)} {verb} not recompile (think about what guards check)")
    if missing:
        verb = "does" if len(missing) == 1 else "do"
        hints.append(f"you missed {len(missing)} that {verb} (shape, dtype, strides and Python "
                     "constants are all guarded)")
    raise Wrong("not quite: " + "; ".join(hints) + ". Try each one with a counting backend.")


# --- 02.size_one: one score per row at every batch size, in eager mode and compiled with an unbacked batch.

#: The weights of ``row_scores``: six features in, one score out.
SCORE_WEIGHTS = torch.linspace(-1.0, 1.0, 6).reshape(6, 1)


def row_scores(x: torch.Tensor) -> torch.Tensor:
    """One score per row of ``x`` (batch, 6), meant to be a (batch,) tensor. Buggy at batch 1."""
    scores = x @ SCORE_WEIGHTS    # (batch, 1)
    return scores.squeeze()       # removes *every* dimension of size 1


def row_scores_fixed(x: torch.Tensor) -> torch.Tensor:
    """Return one score per row, shape (batch,), for every batch size: remove only the score dimension."""
    scores = x @ SCORE_WEIGHTS
    return scores.squeeze(-1)     # the last dimension, whatever the batch


def _scores_by_hand(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The expected result, computed another way (a weighted sum per row), for both runs."""
    expected = (x * SCORE_WEIGHTS[:, 0]).sum(dim=-1)
    return {"eager": expected, "compiled": expected}


def _eager_and_compiled(answer: Any) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    """Return a function giving the answer's result in eager mode and compiled by Inductor with the batch
    dimension unbacked (`mark_unbacked`: one graph for every batch size, built for a size that is not 1)."""
    from torch._dynamo.decorators import mark_unbacked  # imports Dynamo: only when an answer is checked

    plain = uncompiled(answer)
    compiled = torch.compile(plain)

    def both(x: torch.Tensor) -> dict[str, torch.Tensor]:
        marked = x.clone()
        mark_unbacked(marked, 0)
        return {"eager": plain(x), "compiled": compiled(marked)}

    return both


def _special_case_for_one(x: torch.Tensor) -> torch.Tensor:
    """Right values, reached by treating batch 1 apart (a Python `if` on the size)."""
    scores = x @ SCORE_WEIGHTS
    return scores.reshape(1) if x.shape[0] == 1 else scores.squeeze()


def _no_branch_on_the_batch(answer: Any) -> None:
    """Refuse a right answer that reaches batch 1 through an `if` on the size: with the batch unbacked,
    the compiler cannot decide that `if` while tracing, and the graph breaks there."""
    from torch._dynamo.decorators import mark_unbacked

    plain = uncompiled(answer)
    x = torch.randn(4, 6)
    mark_unbacked(x, 0)
    explained = torch._dynamo.explain(plain)(x)
    if explained.graph_break_count:
        raise Wrong(f"the values are right, but it branches on the batch size: with the batch unbacked that `if` "
                    f"cannot be decided while compiling, and the graph breaks there ({explained.graph_break_count} "
                    "break). Remove the score dimension (the last) instead, and batch 1 needs no case of its own.")


function_exercise(
    "02.size_one",
    solution=row_scores_fixed,
    reference=_scores_by_hand,
    cases=lambda: [(torch.randn(n, 6, generator=torch.Generator().manual_seed(n)),) for n in (4, 1, 7)],
    prepare=_eager_and_compiled,
    mistakes=lambda: [
        (row_scores, "`squeeze()` removes every dimension of size 1, so at batch 1 it takes the batch too (and a "
                     "graph compiled for an unbacked batch, built for 'not 1', keeps the batch dimension, so eager "
                     "and compiled disagree). Say which dimension to remove: squeeze(dim)."),
        (lambda x: (x @ SCORE_WEIGHTS).squeeze(0), "The result still has the score dimension, always of size 1: "
                                                   "remove that one, the last; the batch (dimension 0) varies in size."),
    ],
    wrong=lambda: [(_special_case_for_one, "branches on the batch size")],
    otherwise="Return a (batch,) tensor of x @ SCORE_WEIGHTS, the same in eager mode and compiled, at every batch size.",
    after=_no_branch_on_the_batch,
    success="one score per row at batch sizes 4, 1 and 7, the same in eager mode and compiled with an unbacked "
            "batch, in one graph: nothing in it depends on the batch being 1.",
)
