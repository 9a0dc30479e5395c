"""Exercises of notebook 07: ONNX export and ONNX Runtime."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .framework import Wrong, exercise, expect_function

# ---------------------------------------------------------------------------
# 07.median_rewrite: a lower median along dim 1 that the ONNX exporter can translate.
# ---------------------------------------------------------------------------


def _median_cases() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(3, 7, 4, generator=gen),   # odd length
            torch.randn(2, 6, 5, generator=gen),   # even length: torch takes the LOWER middle
            torch.randn(1, 1, 3, generator=gen)]   # a single element


def _uses_median(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Return True when tracing ``fn`` records aten.median (which the exporter cannot translate)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(fn)(torch.randn(2, 5, 3)).graph
    return any("median" in str(node.target) for node in graph.nodes)


def _median_solution() -> Callable[[torch.Tensor], torch.Tensor]:
    def median_dim1(x: torch.Tensor) -> torch.Tensor:
        # Sort along dim 1 and take the element of rank (n - 1) // 2: torch.median's lower median.
        n = x.shape[1]
        return x.sort(dim=1).values[:, (n - 1) // 2]

    return median_dim1


def _median_wrong() -> list[Any]:
    def uses_median(x: torch.Tensor) -> torch.Tensor:  # right values, still not exportable
        return x.median(dim=1).values

    def upper_middle(x: torch.Tensor) -> torch.Tensor:  # n // 2: wrong for even lengths
        return x.sort(dim=1).values[:, x.shape[1] // 2]

    def mean_instead(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)

    def with_quantile(x: torch.Tensor) -> torch.Tensor:  # interpolates between the two middles
        return x.quantile(0.5, dim=1)

    return [uses_median, upper_middle, mean_instead, with_quantile, torch.ones(2), "median"]


@exercise(
    "07.median_rewrite",
    prompt="write median_dim1(x) returning the same values as x.median(dim=1).values without "
           "calling torch.median, so that torch.onnx.export can translate it.",
    solution=_median_solution,
    wrong_answers=_median_wrong,
)
def check_median_rewrite(answer: Any) -> str:
    """Accept a function equal to ``x.median(dim=1).values`` that does not use aten.median."""
    expect_function(answer, "median_dim1(x)")
    for x in _median_cases():
        expected = x.median(dim=1).values
        out = answer(x.clone())
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"your function returned {type(out).__name__}; return a tensor.")
        if out.shape != expected.shape:
            raise Wrong(f"for x of shape {tuple(x.shape)} the result has shape {tuple(out.shape)}, "
                        f"expected {tuple(expected.shape)}: dimension 1 should disappear.")
        if not torch.equal(out, expected):
            n = x.shape[1]
            upper = x.sort(dim=1).values[:, n // 2]
            if n % 2 == 0 and torch.equal(out, upper):
                raise Wrong(f"with an even length ({n}) you took the upper middle element; "
                            "torch.median returns the lower one, rank (n - 1) // 2.")
            raise Wrong(f"values differ from x.median(dim=1).values for a length-{n} dimension. "
                        "torch.median returns an element of x (no averaging): sort along dim 1 "
                        "and pick rank (n - 1) // 2.")
    try:
        traced_median = _uses_median(answer)
    except Exception as err:  # the answer cannot even be traced
        raise Wrong(f"the values are right, but tracing your function failed "
                    f"({type(err).__name__}); use tensor operations only.") from None
    if traced_median:
        raise Wrong("the values are right, but your function still calls torch.median "
                    "(aten.median), which the ONNX exporter has no translation for. "
                    "Rewrite it with operations that export, such as sort or topk.")
    return "same values as torch.median, built from operations the exporter can translate."


# ---------------------------------------------------------------------------
# 07.dynamic_shapes: the dynamic_shapes argument for a (input_ids, attention_mask) encoder.
# ---------------------------------------------------------------------------


class _TwoInputs(torch.nn.Module):
    """Stands in for the encoder: same argument names, cheap to export."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (input_ids * attention_mask).sum(dim=-1)


def _dynamic_solution() -> dict[str, dict[int, Any]]:
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def _dynamic_wrong() -> list[Any]:
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    return [
        {"input_ids": {0: batch}, "attention_mask": {0: batch}},           # length fixed
        {"input_ids": {1: seq}, "attention_mask": {1: seq}},               # batch fixed
        {"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}},           # wrong names
        {"input_ids": {0: batch, 1: seq}},                                  # mask forgotten
        None,
        "dynamic",
    ]


@exercise(
    "07.dynamic_shapes",
    prompt="build the dynamic_shapes dict for torch.onnx.export of the encoder "
           "forward(input_ids, attention_mask) so that both batch and sequence length may vary.",
    solution=_dynamic_solution,
    wrong_answers=_dynamic_wrong,
)
def check_dynamic_shapes(answer: Any) -> str:
    """Accept a dynamic_shapes dict that makes dims 0 and 1 of both inputs symbolic."""
    if not isinstance(answer, dict):
        raise Wrong(f"expected a dict keyed by the forward's argument names, got "
                    f"{type(answer).__name__}.")
    expected_keys = {"input_ids", "attention_mask"}
    if set(answer) != expected_keys:
        missing, extra = expected_keys - set(answer), set(answer) - expected_keys
        raise Wrong(f"the keys must be the forward's argument names {sorted(expected_keys)}; "
                    f"missing {sorted(missing)}, unexpected {sorted(extra)}.")
    ids = torch.ones(3, 5, dtype=torch.int64)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(_TwoInputs(), (ids, ids.clone()), dynamic_shapes=answer)
    except Exception as err:
        raise Wrong(f"torch.export refused this spec ({type(err).__name__}: "
                    f"{str(err).splitlines()[0][:200]}).") from None
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in expected_keys:
            shape = node.meta["val"].shape
            fixed = [d for d, size in enumerate(shape) if isinstance(size, int)]
            if fixed:
                raise Wrong(f"{node.name} still has a fixed size in dim(s) {fixed}: make both "
                            "dim 0 (batch) and dim 1 (sequence length) dynamic.")
    return "batch and sequence length are both dynamic for both inputs."


# ---------------------------------------------------------------------------
# 07.ort_feeds: the input dict ONNX Runtime's session.run expects.
# ---------------------------------------------------------------------------


def _feeds_solution() -> Callable[[torch.Tensor, torch.Tensor], dict[str, Any]]:
    def to_feeds(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        # ONNX Runtime takes NumPy arrays keyed by the graph's input names, in the exported dtype.
        return {"input_ids": ids.to(torch.int64).numpy(),
                "attention_mask": mask.to(torch.int64).numpy()}

    return to_feeds


def _feeds_wrong() -> list[Any]:
    def tensors(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": ids, "attention_mask": mask}

    def int32(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": ids.int().numpy(), "attention_mask": mask.int().numpy()}

    def as_list(ids: torch.Tensor, mask: torch.Tensor) -> Any:
        return [ids.numpy(), mask.numpy()]

    def swapped(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": mask.numpy(), "attention_mask": ids.numpy()}

    return [tensors, int32, as_list, swapped, {"input_ids": None}]


@exercise(
    "07.ort_feeds",
    prompt="write to_feeds(ids, mask) returning the dict session.run needs for the exported "
           "encoder: NumPy int64 arrays keyed 'input_ids' and 'attention_mask'.",
    solution=_feeds_solution,
    wrong_answers=_feeds_wrong,
)
def check_ort_feeds(answer: Any) -> str:
    """Accept a function mapping (ids, mask) tensors to ONNX Runtime's input dict."""
    import numpy as np

    expect_function(answer, "to_feeds(ids, mask)")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 30000, (2, 6), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    feeds = answer(ids.clone(), mask.clone())
    if not isinstance(feeds, dict):
        raise Wrong(f"session.run takes a dict from input name to array; you returned "
                    f"{type(feeds).__name__}.")
    if set(feeds) != {"input_ids", "attention_mask"}:
        raise Wrong(f"the keys must be the graph's input names 'input_ids' and 'attention_mask' "
                    f"(see session.get_inputs()); you used {sorted(map(str, feeds))}.")
    for name, expected in (("input_ids", ids), ("attention_mask", mask)):
        value = feeds[name]
        if isinstance(value, torch.Tensor):
            raise Wrong(f"{name} is a torch tensor; ONNX Runtime's Python API wants NumPy arrays "
                        "(tensor.numpy()).")
        if not isinstance(value, np.ndarray):
            raise Wrong(f"{name} is a {type(value).__name__}; give a NumPy array.")
        if value.dtype != np.int64:
            raise Wrong(f"{name} has dtype {value.dtype}; the exported graph declares int64 "
                        "inputs and ONNX Runtime does not convert types for you.")
        if value.shape != tuple(expected.shape) or not np.array_equal(value, expected.numpy()):
            raise Wrong(f"{name} does not hold the values of the matching argument: "
                        "ids go to 'input_ids', mask to 'attention_mask'.")
    return "these feeds match the exported graph's input names and dtypes."
