"""Exercises of notebook 06: dynamic shapes for torch.export, and exporting a data-dependent branch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from .framework import Mistake, Wrong, case, exercise, function_exercise, run
from .nb04 import CONTROL_FLOW_ERRORS, exports_right

# --- 06.dynamic_batch: a dynamic_shapes spec that makes the batch dimension dynamic in [1, 256].

IN_FEATURES = 8
BATCH_MIN, BATCH_MAX = 1, 256


class _Head(nn.Module):
    """A tiny classifier head: forward(x) with x of shape (batch, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(IN_FEATURES, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.lin(x), dim=-1)


def _accepts(program: Callable[..., Any], batch: int) -> bool:
    """Return whether the exported ``program`` runs on a batch of ``batch`` rows."""
    try:
        program(torch.zeros(batch, IN_FEATURES))
    except (AssertionError, RuntimeError, ValueError):  # the program's shape guards refuse it
        return False
    return True


def _dynamic_batch_solution() -> Any:
    from torch.export import Dim

    return {"x": {0: Dim("batch", min=1, max=256)}}


def _dynamic_batch_wrong() -> list[Mistake]:
    return [
        ({"x": {1: Dim("features", min=1, max=256)}}, "Which dimension does the Linear layer's weight fix?"),
        ({"x": {0: Dim("batch", min=1, max=64)}}, "refuses batch sizes [100, 256]"),
        ({"x": {0: Dim("batch", min=8, max=256)}}, "The example input (batch 4) falls outside your range"),
        ({"x": {0: Dim.AUTO}}, "give the batch dimension max=256"),
        ({"x": {0: Dim.DYNAMIC}}, "give the batch dimension max=256"),
        (None, "None leaves every dimension static"),
        (Dim("batch", min=1, max=256), "you passed Dim"),
        ("batch", "you passed str"),
    ]


@exercise(
    "06.dynamic_batch",
    solution=_dynamic_batch_solution,
    wrong_answers=_dynamic_batch_wrong,
)
def check_dynamic_batch(answer: Any) -> str:
    """Return the success message for a dynamic_shapes spec with batch dynamic in [1, 256] and features static."""
    if answer is None:
        raise Wrong("None leaves every dimension static: the exported program would accept batch 4 only. "
                    "Map the argument name to {dimension index: Dim(...)}.")
    if not isinstance(answer, (dict, tuple, list)):
        raise Wrong(f"dynamic_shapes is a dict keyed by forward's argument names (here 'x'), or a tuple "
                    f"with one entry per argument; you passed {type(answer).__name__}.")
    program = run(lambda spec: torch.export.export(_Head().eval(), (torch.randn(4, IN_FEATURES),), dynamic_shapes=spec),
                  answer, call="torch.export.export with this spec", errors=[
                      ("not in range", "The example input (batch 4) falls outside your range, and the range "
                                       f"must include every batch size from {BATCH_MIN} to {BATCH_MAX}."),
                      (Exception, "Which dimension does the Linear layer's weight fix? Only the other one can vary.")])
    shape = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == "x").meta["val"].shape
    if isinstance(shape[1], torch.SymInt):
        raise Wrong("the feature dimension came out dynamic; only the batch dimension (index 0) should be.")
    if not isinstance(shape[0], torch.SymInt):
        raise Wrong("the batch dimension is still static: mark dimension 0 of x with a Dim.")
    module = program.module()
    refused = [b for b in (BATCH_MIN, 2, 100, BATCH_MAX) if not _accepts(module, b)]
    if refused:
        raise Wrong(f"the exported program refuses batch sizes {refused}: it must accept every batch size from "
                    f"{BATCH_MIN} to {BATCH_MAX}.")
    if _accepts(module, BATCH_MAX + 1):
        raise Wrong(f"the exported program also runs a batch of {BATCH_MAX + 1}: give the batch dimension "
                    f"max={BATCH_MAX}, so a larger batch is refused with a clear error instead of being run.")
    return f"batch is dynamic in [{BATCH_MIN}, {BATCH_MAX}] and the features stay static at {IN_FEATURES}."


# --- 06.cond_export: rewrite a Python branch on tensor values so torch.export can capture it.


def _clip_reference(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    return x / peak if peak > 1 else x


def rescale(x: torch.Tensor) -> torch.Tensor:
    """Return x divided by its peak when the peak is above 1, else a copy of x."""
    peak = x.abs().max()
    return torch.cond(peak > 1, lambda t, p: t / p, lambda t, p: t.clone(), (x, peak))


def _cond_mistakes() -> list[Mistake]:
    def swapped(x: torch.Tensor) -> torch.Tensor:
        peak = x.abs().max()
        return torch.cond(peak > 1, lambda t, p: t.clone(), lambda t, p: t / p, (x, peak))

    def returns_input(x: torch.Tensor) -> torch.Tensor:  # the false branch returns its operand itself
        peak = x.abs().max()
        return torch.cond(peak > 1, lambda t, p: t / p, lambda t, p: t, (x, peak))

    return [(_clip_reference, "give the decision to torch.cond"),
            (lambda x: x / x.abs().max(), "Divide only when the peak is above 1: a quieter input stays as it is."),
            (swapped, "The branches are swapped: true_fn runs when the predicate is True, false_fn otherwise."),
            (returns_input, "must not return an input tensor as-is")]


function_exercise(
    "06.cond_export",
    solution=rescale,
    reference=_clip_reference,
    cases=lambda: [(torch.tensor([0.5, -3.0, 2.0]),), (torch.tensor([0.25, -0.5, 0.1]),)],
    mistakes=_cond_mistakes,
    errors=CONTROL_FLOW_ERRORS,
    otherwise="Divide by the peak only when it is above 1.",
    after=lambda answer: exports_right(answer, _clip_reference, [torch.tensor([0.5, -3.0, 2.0]),
                                                                 torch.tensor([0.25, -0.5, 0.1])]),
    success="your function exports, and the exported program takes the right branch for both kinds of input.",
)


# --- 06.read_cpp_output: read what the LibTorch program printed.

_CPP_OUTPUTS = (
    ("epoch 1 loss 1.512949182311 seconds 0.0162\nepoch 2 loss 0.581447566217 seconds 0.0080\n"
     "epoch 3 loss 0.299761054102 seconds 0.0075\ntest accuracy 434/450\nsaved build/nb06/libtorch/weights.pt\n"),
    "epoch 1 loss 2.250000 seconds 0.0500\ntest accuracy 45/450\nsaved w.pt\n",
    ("epoch 1 loss 0.900000 seconds 0.0310\nepoch 2 loss 0.400000 seconds 0.0290\n"
     "epoch 3 loss 0.200000 seconds 0.0300\nepoch 4 loss 0.150000 seconds 0.0280\ntest accuracy 98/100\n"),
)


def _epoch_lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith("epoch ")]


def _accuracy_words(text: str) -> tuple[int, int]:
    fraction = next(line.split()[2] for line in text.splitlines() if line.startswith("test accuracy"))
    hits, total = fraction.split("/")
    return int(hits), int(total)


def summarise_run(text: str) -> tuple[float, float]:
    """Return (the last epoch's loss, the test accuracy as a fraction) from libtorch_mlp's printed lines."""
    last_loss = float(_epoch_lines(text)[-1][3])
    hits, total = _accuracy_words(text)
    return last_loss, hits / total


def _summary_mistakes() -> list[Mistake]:
    def first_epoch(text: str) -> tuple[float, float]:
        hits, total = _accuracy_words(text)
        return float(_epoch_lines(text)[0][3]), hits / total

    def mean_loss(text: str) -> tuple[float, float]:
        losses = [float(words[3]) for words in _epoch_lines(text)]
        hits, total = _accuracy_words(text)
        return sum(losses) / len(losses), hits / total

    def seconds_not_loss(text: str) -> tuple[float, float]:
        hits, total = _accuracy_words(text)
        return float(_epoch_lines(text)[-1][5]), hits / total

    def hit_count(text: str) -> tuple[float, float]:
        return float(_epoch_lines(text)[-1][3]), _accuracy_words(text)[0]

    def inverted(text: str) -> tuple[float, float]:
        hits, total = _accuracy_words(text)
        return float(_epoch_lines(text)[-1][3]), total / hits

    return [(first_epoch, "That is the first epoch's loss: the trained model's loss is on the last epoch line."),
            (mean_loss, "That is the mean over all epochs: report the last epoch's loss."),
            (seconds_not_loss, "That is the epoch's seconds: the loss is the number after the word 'loss'."),
            (hit_count, "That is the number of correct digits: the accuracy is correct / total, a fraction."),
            (inverted, "The accuracy is correct / total (the first number over the second), at most 1.")]


function_exercise(
    "06.read_cpp_output",
    solution=summarise_run,
    cases=lambda: [case(text, gives=result) for text, result in zip(_CPP_OUTPUTS, (
        (0.299761054102, 434 / 450),   # three epochs: the third one's loss
        (2.25, 0.1),             # one epoch; 45 of 450
        (0.15, 0.98)))],         # four epochs, no 'saved' line
    mistakes=_summary_mistakes,
    errors=[((IndexError, StopIteration), "A line you looked for is missing: match the lines by how they start "
                                          "('epoch ', 'test accuracy') and split them into words."),
            (ValueError, "A word you turned into a number is not one: count the words of the line again.")],
    otherwise="Return a tuple (last epoch's loss, correct / total).",
    success="you read the loss curve's end and the accuracy the way course_utils.deploy.libtorch_cpp does.",
)
