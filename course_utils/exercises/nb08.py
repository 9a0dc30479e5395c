"""Exercises of notebook 08: symmetric int8 weights per output channel, and an integer matmul."""

from __future__ import annotations


import torch

from .framework import Mistake, case, function_exercise


def _weights(seed: int, rows: int = 24, cols: int = 40) -> torch.Tensor:
    """A weight matrix whose rows differ in scale by 100x (what makes per-channel matter)."""
    gen = torch.Generator().manual_seed(seed)
    row_scale = torch.logspace(-2, 0, rows).unsqueeze(1)
    return torch.randn(rows, cols, generator=gen) * row_scale


def _quantize(w: torch.Tensor, amax: torch.Tensor, top: int = 127, clamp: bool = True,
              dtype: torch.dtype | None = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q, scale) for symmetric quantization with scale = amax / top (variants make the mistakes)."""
    scale = amax.clamp(min=1e-12) / top
    q = torch.round(w / scale)
    q = q.clamp(-127, 127) if clamp else q
    return (q.to(dtype) if dtype else q), scale


# --- 08.per_channel: symmetric int8 quantization with one scale per output channel (row).


def _per_channel_in_float64(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the checker compares with: each row on its own, in float64 (the solution works in float32)."""
    rows = []
    for row in w.double():
        scale = max(row.abs().max().item(), 1e-12) / 127
        rows.append((torch.round(row / scale).clamp(-127, 127), scale))
    return torch.stack([q for q, _ in rows]).to(torch.int8), torch.tensor([[s] for _, s in rows])


#: Worked by hand: the row maxima 127, 63.5 and 2.54 give scales 1, 0.5 and 0.02, and w / scale is
#: [127, -50, 20.25, 0], [-127, 62, 20, 1.6] and [127, -50, 15, 0] (no ties), rounded below.
_HAND_W = torch.tensor([[127.0, -50.0, 20.25, 0.0], [-63.5, 31.0, 10.0, 0.8], [2.54, -1.0, 0.3, 0.0]])
_HAND_Q = torch.tensor([[127, -50, 20, 0], [-127, 62, 20, 2], [127, -50, 15, 0]], dtype=torch.int8)
_HAND_SCALE = torch.tensor([[1.0], [0.5], [0.02]])


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q, scale): int8 weights and one float scale per output channel (row)."""
    # One scale per row, so that row's largest |w| lands on 127.
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


def _per_channel_mistakes() -> list[Mistake]:
    def in_place(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        return w.div_(scale).round_().to(torch.int8), scale

    return [(lambda w: _quantize(w, w.abs().amax()), "You used one scale for the whole tensor (per tensor). Take "
             "the maximum of |w| over each row instead: w.abs().amax(dim=1, keepdim=True)."),
            (lambda w: _quantize(w, w.abs().amax(dim=0, keepdim=True)), "Use one scale per output channel, i.e. per "
             "ROW of the (out, in) weight: w.abs().amax(dim=1, keepdim=True), shape (rows, 1)."),
            (lambda w: _quantize(w, w.abs().amax(dim=1, keepdim=True), top=128, clamp=False), "Symmetric int8 "
             "uses 127 as the largest magnitude: divide by 127 and clamp to [-127, 127] (128 wraps around)."),
            (lambda w: _quantize(w, w.abs().amax(dim=1, keepdim=True), dtype=None), "Store q as torch.int8 "
             "(that is where the 4x saving comes from): .to(torch.int8) after rounding and clamping."),
            (in_place, "changed its input in place")]


function_exercise(
    "08.per_channel",
    solution=quantize_per_channel,
    reference=_per_channel_in_float64,
    cases=lambda: [case(_HAND_W.clone(), gives=(_HAND_Q, _HAND_SCALE)), (_weights(0),)],
    mistakes=_per_channel_mistakes,
    otherwise="Each row's scale is max(|row|) / 127, shape (rows, 1); q = round(w / scale) clamped to "
              "[-127, 127], stored as torch.int8.",
    success="one scale per output channel; every weight is within half a step of its int8 value.",
)

# --- 08.int8_linear: what a real int8 kernel computes (integer products, then one rescale).


def int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Return x @ w.T computed with int8 operands, int32 accumulation and one float rescale."""
    # 1. Quantize the activations on the fly, one scale per row (per token).
    x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    x_q = torch.round(x / x_scale).clamp(-127, 127).to(torch.int8)
    # 2. Multiply integers, accumulating in int32 (what VNNI/AMX instructions do).
    acc = x_q.to(torch.int32) @ w_q.to(torch.int32).T
    # 3. One float rescale per output element: (x_scale of the row) * (w_scale of the column).
    return acc.float() * x_scale * w_scale.reshape(1, -1)


def _int8_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w_q, w_scale = quantize_per_channel(_weights(1, rows=16, cols=48))
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(2)) * torch.logspace(-1, 1, 6).unsqueeze(1)
    return x, w_q, w_scale


def _int8_linear_in_float64(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """What the checker compares with: quantize x, dequantize both operands, and multiply in float64."""
    x = x.double()
    x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    x_deq = torch.round(x / x_scale).clamp(-127, 127) * x_scale
    return x_deq @ (w_q.double() * w_scale.double().reshape(-1, 1)).T


#: Worked by hand: x's rows have maxima 254 and 63.5 (scales 2 and 0.5), so x_q = [127, -50, 3] and
#: [-127, 62, 20]; the int32 products with w_q's rows are 36, 254 and 57, 2667, times x_scale * w_scale.
_HAND_X = torch.tensor([[254.0, -100.0, 6.0], [-63.5, 31.0, 10.0]])
_HAND_WQ = torch.tensor([[1, 2, 3], [-1, 0, 127]], dtype=torch.int8)
_HAND_WS = torch.tensor([[0.5], [0.25]])
_HAND_OUT = torch.tensor([[36.0 * 2 * 0.5, 254.0 * 2 * 0.25], [57.0 * 0.5 * 0.5, 2667.0 * 0.5 * 0.25]])


def _int8_linear_mistakes() -> list[Mistake]:
    def accumulate(x: torch.Tensor, w_q: torch.Tensor, x_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = _quantize(x, x_amax, dtype=torch.int32)
        return x_q @ w_q.to(torch.int32).T, x_scale

    def per_tensor_x(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        acc, x_scale = accumulate(x, w_q, x.abs().amax())
        return acc.float() * x_scale * w_scale.reshape(1, -1)

    def forgets_w_scale(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        acc, x_scale = accumulate(x, w_q, x.abs().amax(dim=1, keepdim=True))
        return acc.float() * x_scale

    def stays_int(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        return accumulate(x, w_q, x.abs().amax(dim=1, keepdim=True))[0]

    def dequant_weight(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        return x @ (w_q.float() * w_scale.reshape(-1, 1)).T

    return [(dequant_weight, "You dequantized the weight and multiplied in float (what a first attempt often "
                             "does). Quantize x too, per row, and multiply the int8 values as int32."),
            (stays_int, "Rescale the int32 accumulator to float: acc.float() * x_scale * w_scale."),
            (forgets_w_scale, "You forgot the weight scale: multiply the accumulator by w_scale too (one value "
                              "per output column)."),
            (per_tensor_x, "Use one scale per ROW of x (amax over dim=1), not one for the whole tensor.")]


function_exercise(
    "08.int8_linear",
    solution=int8_linear,
    reference=_int8_linear_in_float64,
    cases=lambda: [case(_HAND_X.clone(), _HAND_WQ.clone(), _HAND_WS.clone(), gives=_HAND_OUT), _int8_case()],
    mistakes=_int8_linear_mistakes,
    otherwise="Use one scale per ROW of x (amax over dim=1), round and clamp to [-127, 127], accumulate in "
              "int32, and rescale by x_scale (rows) * w_scale (columns).",
    tol=(1e-4, 1e-5),
    success="integer products with one float rescale per output: that is an int8 kernel.",
)
