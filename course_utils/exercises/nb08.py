"""Exercises of notebook 08: symmetric int8 weights per output channel, an integer matmul,
and scaling a tensor into FP8."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .framework import Wrong, exercise, expect_function


def _weights(seed: int, rows: int = 24, cols: int = 40) -> torch.Tensor:
    """A weight matrix whose rows differ in scale by 100x (what makes per-channel matter)."""
    gen = torch.Generator().manual_seed(seed)
    row_scale = torch.logspace(-2, 0, rows).unsqueeze(1)
    return torch.randn(rows, cols, generator=gen) * row_scale


def _reference_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def _as_pair(out: Any, call: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, tuple) or len(out) != 2:
        raise Wrong(f"{call} returned {type(out).__name__}; return a pair (q, scale).")
    q, scale = out
    if not isinstance(q, torch.Tensor) or not isinstance(scale, torch.Tensor):
        raise Wrong(f"{call} must return two tensors (q, scale), got "
                    f"({type(q).__name__}, {type(scale).__name__}).")
    return q, scale


# ---------------------------------------------------------------------------
# 08.per_channel: symmetric int8 quantization with one scale per output channel (row).
# ---------------------------------------------------------------------------


def _per_channel_solution() -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # One scale per row, so that row's largest |w| lands on 127.
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        return q, scale

    return quantize_per_channel


def _per_channel_wrong() -> list[Any]:
    def per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.abs().amax() / 127
        return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale

    def per_column(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.abs().amax(dim=0, keepdim=True) / 127
        return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale

    def wraps_around(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # 128 overflows int8
        scale = w.abs().amax(dim=1, keepdim=True) / 128
        return torch.round(w / scale).to(torch.int8), scale

    def stays_float(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        return torch.round(w / scale), scale

    return [per_tensor, per_column, wraps_around, stays_float, torch.ones(3), None]


@exercise(
    "08.per_channel",
    prompt="write quantize_per_channel(w) returning (q, scale): q int8 with values in [-127, 127], "
           "scale float of shape (rows, 1), one per output channel (row), such that q * scale ≈ w.",
    solution=_per_channel_solution,
    wrong_answers=_per_channel_wrong,
)
def check_per_channel(answer: Any) -> str:
    """Accept a symmetric per-row int8 quantizer."""
    expect_function(answer, "quantize_per_channel(w)")
    w = _weights(0)
    w_before = w.clone()
    q, scale = _as_pair(answer(w), "quantize_per_channel(w)")
    if not torch.equal(w, w_before):
        raise Wrong("your function changed w in place; leave the float weight untouched.")
    if q.dtype != torch.int8:
        raise Wrong(f"q has dtype {q.dtype}; store it as torch.int8 (that is where the 4x saving "
                    "comes from): .to(torch.int8) after rounding and clamping.")
    if q.shape != w.shape:
        raise Wrong(f"q has shape {tuple(q.shape)}, expected {tuple(w.shape)}.")
    if scale.numel() == 1:
        raise Wrong("you used one scale for the whole tensor (per tensor). Take the maximum "
                    "of |w| over each row instead: w.abs().amax(dim=1, keepdim=True).")
    if scale.numel() != w.shape[0]:
        raise Wrong(f"scale has {scale.numel()} values; a Linear weight (out, in) needs one per "
                    f"output channel, i.e. per row: {w.shape[0]} values, shape ({w.shape[0]}, 1).")
    scale = scale.reshape(-1, 1).float()
    if q.min().item() < -127 or q.max().item() > 127:
        raise Wrong("q goes outside [-127, 127]; symmetric int8 uses 127 as the largest "
                    "magnitude (clamp after rounding).")
    ref_q, ref_scale = _reference_per_channel(w)
    if not torch.allclose(scale, ref_scale, rtol=1e-5, atol=0):
        raise Wrong("the scales are off: each row's scale should be max(|row|) / 127, so the "
                    "largest weight of the row becomes ±127.")
    if (q.int() - ref_q.int()).abs().max().item() > 1:
        raise Wrong("q does not match round(w / scale): check that you divide by the row's "
                    "scale (broadcast a (rows, 1) scale) and round to the nearest integer.")
    err = ((q.float() * scale - w).abs() / scale).max().item()
    if err > 0.5 + 1e-3:
        raise Wrong(f"q * scale misses w by up to {err:.2f} steps; rounding should keep it "
                    "within half a step.")
    return "one scale per output channel; every weight is within half a step of its int8 value."


# ---------------------------------------------------------------------------
# 08.int8_linear: what a real int8 kernel computes (integer products, then one rescale).
# ---------------------------------------------------------------------------


def _int8_linear_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    x_q = torch.round(x / x_scale).clamp(-127, 127).to(torch.int8)
    acc = x_q.to(torch.int32) @ w_q.to(torch.int32).T
    return acc.float() * x_scale * w_scale.reshape(1, -1)


def _int8_linear_solution() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    def int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        # 1. Quantize the activations on the fly, one scale per row (per token).
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        x_q = torch.round(x / x_scale).clamp(-127, 127).to(torch.int8)
        # 2. Multiply integers, accumulating in int32 (what VNNI/AMX instructions do).
        acc = x_q.to(torch.int32) @ w_q.to(torch.int32).T
        # 3. One float rescale per output element: (x_scale of the row) * (w_scale of the column).
        return acc.float() * x_scale * w_scale.reshape(1, -1)

    return int8_linear


def _int8_linear_wrong() -> list[Any]:
    def dequant_weight(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        return x @ (w_q.float() * w_scale.reshape(-1, 1)).T

    def per_tensor_x(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax() / 127
        x_q = torch.round(x / s).clamp(-127, 127).to(torch.int32)
        return (x_q @ w_q.to(torch.int32).T).float() * s * w_scale.reshape(1, -1)

    def forgets_w_scale(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax(dim=1, keepdim=True) / 127
        x_q = torch.round(x / s).clamp(-127, 127).to(torch.int32)
        return (x_q @ w_q.to(torch.int32).T).float() * s

    return [dequant_weight, per_tensor_x, forgets_w_scale, "int8_linear", None]


@exercise(
    "08.int8_linear",
    prompt="write int8_linear(x, w_q, w_scale): quantize x per row (symmetric, scale = "
           "max|row| / 127), multiply the int8 values as int32, then rescale by x_scale * w_scale.",
    solution=_int8_linear_solution,
    wrong_answers=_int8_linear_wrong,
)
def check_int8_linear(answer: Any) -> str:
    """Accept a dynamically quantized int8 x int8 -> int32 linear with per-row/per-channel scales."""
    expect_function(answer, "int8_linear(x, w_q, w_scale)")
    w_q, w_scale = _reference_per_channel(_weights(1, rows=16, cols=48))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 48, generator=gen) * torch.logspace(-1, 1, 6).unsqueeze(1)
    out = answer(x, w_q, w_scale)
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"int8_linear returned {type(out).__name__}; return a float tensor.")
    if out.shape != (6, 16):
        raise Wrong(f"the output has shape {tuple(out.shape)}, expected (6, 16) = (batch, out "
                    "features): multiply by w_q transposed.")
    if not out.is_floating_point():
        raise Wrong(f"the output is {out.dtype}; rescale the int32 accumulator to float "
                    "(acc.float() * x_scale * w_scale).")
    expected = _int8_linear_reference(x, w_q, w_scale)
    if torch.allclose(out, expected, rtol=1e-4, atol=1e-5):
        return "integer products with one float rescale per output: that is an int8 kernel."
    weight_only = x @ (w_q.float() * w_scale.reshape(-1, 1)).T
    if torch.allclose(out, weight_only, rtol=1e-4, atol=1e-5):
        raise Wrong("you dequantized the weight and multiplied in float (what a first attempt often does). "
                    "Quantize x too, per row, and multiply the int8 values as int32.")
    if torch.allclose(out * w_scale.reshape(1, -1), expected, rtol=1e-4, atol=1e-5):
        raise Wrong("you forgot the weight scale: multiply the accumulator by w_scale too "
                    "(one value per output column).")
    raise Wrong("the values differ from the integer reference. Use one scale per ROW of x "
                "(amax over dim=1), round and clamp to [-127, 127], accumulate in int32, and "
                "rescale by x_scale (rows) * w_scale (columns).")
