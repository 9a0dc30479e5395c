"""Exercises of notebook 06: dynamic shapes for torch.export, and exporting a data-dependent branch."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 06.dynamic_batch: a dynamic_shapes spec that makes the batch dimension dynamic in [1, 256].
# ---------------------------------------------------------------------------

IN_FEATURES = 8
BATCH_MIN, BATCH_MAX = 1, 256


class _Head(nn.Module):
    """A tiny classifier head: forward(x) with x of shape (batch, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(IN_FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.lin(x), dim=-1)


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Silence what a failing export prints (its partial graph on stderr, shape-env warnings)."""
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        shapes_log.setLevel(level)


def _export_head(spec: Any) -> torch.export.ExportedProgram:
    with _quiet_export():
        return torch.export.export(_Head().eval(), (torch.randn(4, IN_FEATURES),),
                                   dynamic_shapes=spec, strict=False)


def _dynamic_batch_solution() -> Any:
    from torch.export import Dim

    return {"x": {0: Dim("batch", min=1, max=256)}}


def _dynamic_batch_wrong() -> list[Any]:
    from torch.export import Dim

    return [
        {"x": {1: Dim("features", min=1, max=256)}},   # marks the feature dim, which the weight fixes
        {"x": {0: Dim("batch", min=1, max=64)}},       # bounds too tight
        {"x": {0: Dim("batch", min=8, max=256)}},      # lower bound too high
        None,                                          # everything static
        Dim("batch", min=1, max=256),                  # a bare Dim, not a spec
        "batch",
    ]


@exercise(
    "06.dynamic_batch",
    prompt="build the dynamic_shapes argument for exporting a module whose forward is forward(self, x), "
           "x of shape (batch, 8), so that any batch size from 1 to 256 is accepted and nothing else "
           "is dynamic.",
    solution=_dynamic_batch_solution,
    wrong_answers=_dynamic_batch_wrong,
)
def check_dynamic_batch(answer: Any) -> str:
    """Accept a dynamic_shapes spec with batch dynamic in [1, 256] and the features static."""
    if answer is None:
        raise Wrong("None leaves every dimension static: the exported program would accept batch 4 only. "
                    "Map the argument name to {dimension index: Dim(...)}.")
    if not isinstance(answer, (dict, tuple, list)):
        raise Wrong(f"dynamic_shapes is a dict keyed by forward's argument names (here 'x'), or a tuple "
                    f"with one entry per argument; you passed {type(answer).__name__}.")
    try:
        ep = _export_head(answer)
    except Exception as err:  # export refuses specs that contradict the model
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise Wrong(f"torch.export.export refused this spec ({type(err).__name__}: {first[:200]}). "
                    "Which dimension does the Linear layer's weight fix? Only the other one can vary.") from None
    placeholder = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x"][0]
    shape = placeholder.meta["val"].shape
    if isinstance(shape[1], torch.SymInt):
        raise Wrong("the feature dimension came out dynamic; only the batch dimension (index 0) should be.")
    if not isinstance(shape[0], torch.SymInt):
        raise Wrong("the batch dimension is still static: mark dimension 0 of x with a Dim.")
    ranges = list(ep.range_constraints.values())
    lower, upper = int(ranges[0].lower), ranges[0].upper
    upper_txt = "no upper bound" if not upper.is_integer else f"max={int(upper)}"
    if lower > BATCH_MIN or (upper.is_integer and int(upper) < BATCH_MAX):
        raise Wrong(f"the exported batch range is min={lower}, {upper_txt}: it must include every batch "
                    f"size from {BATCH_MIN} to {BATCH_MAX}.")
    if not upper.is_integer or int(upper) > BATCH_MAX:
        raise Wrong(f"the exported batch range is min={lower}, {upper_txt}: give it max={BATCH_MAX}, "
                    "so a larger batch is refused with a clear error instead of being run.")
    return f"batch is dynamic in [{lower}, {int(upper)}] and the features stay static at {IN_FEATURES}."


# ---------------------------------------------------------------------------
# 06.cond_export: rewrite a Python branch on tensor values so torch.export can capture it.
# ---------------------------------------------------------------------------


def _clip_reference(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    return x / peak if peak > 1 else x


class _Wrap(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _cond_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def rescale(x: torch.Tensor) -> torch.Tensor:
        peak = x.abs().max()
        return torch.cond(peak > 1, lambda t, p: t / p, lambda t, p: t.clone(), (x, peak))

    return rescale


def _cond_wrong() -> list[Any]:
    def python_if(x: torch.Tensor) -> torch.Tensor:  # the original: export cannot capture it
        peak = x.abs().max()
        return x / peak if peak > 1 else x

    def always_divides(x: torch.Tensor) -> torch.Tensor:  # exports, but scales small inputs up
        return x / x.abs().max()

    def swapped(x: torch.Tensor) -> torch.Tensor:  # branches the wrong way round
        peak = x.abs().max()
        return torch.cond(peak > 1, lambda t, p: t.clone(), lambda t, p: t / p, (x, peak))

    return [python_if, always_divides, swapped, torch.ones(3), "rescale"]


@exercise(
    "06.cond_export",
    prompt="write rescale(x): divide x by its largest absolute value when that value is above 1, "
           "otherwise return x unchanged, in a form torch.export.export can capture (torch.cond, "
           "or torch.where).",
    solution=_cond_solution,
    wrong_answers=_cond_wrong,
)
def check_cond_export(answer: Any) -> str:
    """Accept a function that exports and rescales only inputs whose peak exceeds 1."""
    expect_function(answer, "rescale(x)")
    example = torch.tensor([0.5, -3.0, 2.0])
    try:
        with _quiet_export():
            ep = torch.export.export(_Wrap(answer), (example,), strict=False)
    except Exception as err:
        raise Wrong(f"torch.export.export could not capture your function ({type(err).__name__}). "
                    "A Python `if` on a tensor's value cannot be traced: the exported graph must hold "
                    "both branches. Use torch.cond(pred, true_fn, false_fn, operands).") from None
    exported = ep.module()
    cases = {"a peak of 3 (should be divided by 3)": torch.tensor([0.5, -3.0, 2.0]),
             "a peak of 0.5 (should be left alone)": torch.tensor([0.25, -0.5, 0.1])}
    for what, x in cases.items():
        got = exported(x)
        expected = _clip_reference(x)
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise Wrong(f"the exported program got an input with {what} wrong: {got.tolist()} instead of "
                        f"{expected.tolist()}. Check which branch runs when the peak is above 1.")
    return "your function exports, and the exported program takes the right branch for both kinds of input."
