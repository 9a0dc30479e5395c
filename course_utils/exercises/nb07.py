"""Exercises of notebook 07: ONNX export and ONNX Runtime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


from .framework import Mistake, Wrong, exercise, expect_function, function_exercise, run, usage_of

_NO_TRANSLATION = ("The ONNX exporter has no translation for that operator: rewrite it with operations that "
                   "export, such as sort or topk.")


_ELEMENT = "torch.median returns an element of x (no averaging): sort along dim 1 and pick rank (n - 1) // 2."


class _OneInput(torch.nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


# --- 07.median_rewrite: a lower median along dim 1 that the ONNX exporter can translate.


def median_dim1(x: torch.Tensor) -> torch.Tensor:
    """Return the lower median of x along dim 1, like x.median(dim=1).values."""
    # Sort along dim 1 and take the element of rank (n - 1) // 2: torch.median's lower median.
    n = x.shape[1]
    return x.sort(dim=1).values[:, (n - 1) // 2]


def _median_mistakes() -> list[Mistake]:
    return [(lambda x: x.median(dim=1).values, "aten.median"),
            (lambda x: x.kthvalue((x.shape[1] + 1) // 2, dim=1).values, "aten.kthvalue"),
            (lambda x: x.sort(dim=1).values[:, x.shape[1] // 2],
             "With an even length you took the upper middle element; torch.median returns the lower one, "
             "rank (n - 1) // 2."),
            (lambda x: x.mean(dim=1), _ELEMENT), (lambda x: x.quantile(0.5, dim=1), _ELEMENT)]


def _exports_to_onnx(answer: Any) -> None:
    run(lambda: torch.onnx.export(_OneInput(answer), (torch.randn(2, 5, 3),), dynamo=True),
        call="torch.onnx.export of your function",
        errors=[("No ONNX function found", _NO_TRANSLATION)])


function_exercise(
    "07.median_rewrite",
    solution=median_dim1,
    reference=lambda x: x.median(dim=1).values,
    cases=lambda: [(torch.randn(*shape, generator=torch.Generator().manual_seed(7)),)
                   for shape in ((3, 7, 4), (2, 6, 5), (1, 1, 3))],   # odd length, even length, one element
    mistakes=_median_mistakes,
    otherwise=_ELEMENT,
    after=_exports_to_onnx,
    tol=(0.0, 0.0),
    success="same values as torch.median, and torch.onnx.export translates every operation.",
)

# --- 07.dynamic_shapes: the dynamic_shapes argument for a (input_ids, attention_mask) encoder.


class _TwoInputs(torch.nn.Module):
    """Stands in for the encoder: same argument names, cheap to export."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (input_ids * attention_mask).sum(dim=-1)


def _dynamic_solution() -> dict[str, dict[int, Any]]:
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def _dynamic_wrong() -> list[Mistake]:
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    return [({"input_ids": {0: batch}, "attention_mask": {0: batch}}, "fixed size in dim(s) [1]"),
            ({"input_ids": {1: seq}, "attention_mask": {1: seq}}, "fixed size in dim(s) [0]"),
            ({"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}, "unexpected ['ids', 'mask']"),
            ({"input_ids": {0: batch, 1: seq}}, "missing ['attention_mask']"),
            ({"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch"}}, "torch.onnx.export refused"),
            (None, "expected a dict"), ("dynamic", "expected a dict")]


@exercise(
    "07.dynamic_shapes",
    solution=_dynamic_solution,
    wrong_answers=_dynamic_wrong,
)
def check_dynamic_shapes(answer: Any) -> str:
    """Return the success message for a dynamic_shapes dict that torch.onnx.export turns into symbolic dims."""
    if not isinstance(answer, dict):
        raise Wrong(f"expected a dict keyed by the forward's argument names, got {type(answer).__name__}.")
    expected_keys = {"input_ids", "attention_mask"}
    if set(answer) != expected_keys:
        missing, extra = expected_keys - set(answer), set(answer) - expected_keys
        raise Wrong(f"the keys must be the forward's argument names {sorted(expected_keys)}; "
                    f"missing {sorted(missing)}, unexpected {sorted(extra)}.")
    ids = torch.ones(3, 5, dtype=torch.int64)
    program = run(lambda: torch.onnx.export(_TwoInputs(), (ids, ids.clone()), dynamo=True, dynamic_shapes=answer),
                  call="torch.onnx.export with this spec", errors=[
                      (Exception, "torch.onnx.export refused this spec: mark the same dimensions of both inputs "
                                  "(the model multiplies them), with ranges that include the example (3, 5).")])
    for value in program.model.graph.inputs:
        fixed = [d for d, size in enumerate(value.shape) if isinstance(size, int)]
        if fixed:
            raise Wrong(f"{value.name} still has a fixed size in dim(s) {fixed}: make both dim 0 (batch) and "
                        "dim 1 (sequence length) dynamic.")
    return "batch and sequence length are both dynamic for both inputs of the ONNX model."


# --- 07.ort_feeds: the input dict ONNX Runtime's session.run expects.


def to_feeds(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Return the ONNX Runtime feeds for the encoder: NumPy int64 arrays by input name."""
    # ONNX Runtime takes NumPy arrays keyed by the graph's input names, in the exported dtype.
    return {"input_ids": ids.to(torch.int64).numpy(),
            "attention_mask": mask.to(torch.int64).numpy()}


def _feeds_wrong() -> list[Mistake]:
    return [(lambda ids, mask: {"input_ids": ids, "attention_mask": mask}, "wants NumPy arrays"),
            (lambda ids, mask: {"input_ids": ids.int().numpy(), "attention_mask": mask.int().numpy()}, "int64"),
            (lambda ids, mask: [ids.numpy(), mask.numpy()], "a dict from input name to array"),
            (lambda ids, mask: {"input_ids": mask.numpy(), "attention_mask": ids.numpy()}, "ids go to 'input_ids'"),
            (lambda ids, mask: {"ids": ids.numpy(), "mask": mask.numpy()}, "you used ['ids', 'mask']"),
            ({"input_ids": None}, "expected a function"), (None, "expected a function")]


@exercise(
    "07.ort_feeds",
    solution=lambda: to_feeds,
    wrong_answers=_feeds_wrong,
)
def check_ort_feeds(answer: Any) -> str:
    """Return the success message for a function mapping (ids, mask) tensors to ONNX Runtime's input dict."""
    expect_function(answer, usage_of(to_feeds))
    ids = torch.randint(100, 30000, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    feeds = run(answer, ids.clone(), mask.clone(), call="to_feeds(ids, mask)")
    if not isinstance(feeds, dict):
        raise Wrong(f"session.run takes a dict from input name to array; you returned {type(feeds).__name__}.")
    if set(feeds) != {"input_ids", "attention_mask"}:
        raise Wrong(f"the keys must be the graph's input names 'input_ids' and 'attention_mask' "
                    f"(see session.get_inputs()); you used {sorted(map(str, feeds))}.")
    for name, expected in (("input_ids", ids), ("attention_mask", mask)):
        value = feeds[name]
        if not isinstance(value, np.ndarray):
            raise Wrong(f"{name} is a {type(value).__name__}; ONNX Runtime's Python API wants NumPy arrays "
                        "(tensor.numpy()).")
        if value.dtype != np.int64:
            raise Wrong(f"{name} has dtype {value.dtype}; the exported graph declares int64 "
                        "inputs and ONNX Runtime does not convert types for you.")
        if value.shape != tuple(expected.shape) or not np.array_equal(value, expected.numpy()):
            raise Wrong(f"{name} does not hold the values of the matching argument: "
                        "ids go to 'input_ids', mask to 'attention_mask'.")
    return "these feeds match the exported graph's input names and dtypes."
