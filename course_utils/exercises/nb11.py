"""Exercises of notebook 11: attention by hand, a sliding-window mask_mod, and block sparsity.

The checkers compare with torch's own implementations where one exists: SDPA for attention and
the indices grid that ``create_block_mask`` evaluates a ``mask_mod`` on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .framework import Mistake, Wrong, case, function_exercise, run, short

# --- 11.attention: softmax(q k^T / sqrt(d)) v with a boolean mask (True = may attend).


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return softmax(q k^T / sqrt(d)) v, with scores where ``mask`` is False removed before the softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def _attention_cases() -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 3, 8, 16, generator=gen) for _ in range(3))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    banded = causal & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)       # a window of three
    q2, k2, v2 = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    k3, v3 = torch.randn(1, 2, 7, 8, generator=gen), torch.randn(1, 2, 7, 8, generator=gen)
    return [(q, k, v, causal), (q, k, v, banded), (q2, k2, v2, torch.ones(5, 5, dtype=torch.bool)),
            (q2, k3, v3, (torch.rand(5, 7, generator=gen) > 0.3) | torch.eye(5, 7, dtype=torch.bool))]


def _attention_mistakes() -> list[Mistake]:
    def no_scale(q, k, v, mask):
        return (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def scale_by_d(q, k, v, mask):
        return (q @ k.transpose(-2, -1) / q.shape[-1]).masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def wrong_dim(q, k, v, mask):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf")).softmax(-2) @ v

    def inverted(q, k, v, mask):
        return attention(q, k, v, ~mask | torch.eye(*mask.shape[-2:], dtype=torch.bool))

    def zero_fill(q, k, v, mask):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, 0.0).softmax(-1) @ v

    def mask_after(q, k, v, mask):
        return ((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) * mask) @ v

    return [(no_scale, "Divide the scores by sqrt(d) before the softmax: unscaled scores grow with the head "
                       "dimension and make the softmax too sharp."),
            (scale_by_d, "Divide the scores by sqrt(d), not by d (q.shape[-1] ** 0.5)."),
            (wrong_dim, "Take the softmax over the last dimension (the keys): each query's weights sum to 1."),
            (inverted, "True means 'may attend': fill the scores where the mask is False (use ~mask)."),
            (zero_fill, "Fill masked scores with float('-inf'), not 0: a score of 0 still gets weight after the "
                        "softmax."),
            (mask_after, "Apply the mask before the softmax (scores set to -inf), so the allowed weights still sum "
                         "to 1.")]


function_exercise(
    "11.attention",
    solution=attention,
    reference=lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    cases=_attention_cases,
    mistakes=_attention_mistakes,
    errors=[("must match the size", "q @ k.transpose(-2, -1) multiplies each query with each key: transpose the "
                                    "last two dimensions of k.")],
    otherwise="Compare with F.scaled_dot_product_attention(q, k, v, attn_mask=mask): divide the scores by sqrt(d), fill "
              "the masked scores with -inf, softmax over the keys, then multiply by v.",
    success="equal to F.scaled_dot_product_attention with the same mask, on every case.",
    tol=(1e-4, 1e-5),
)

# --- 11.sliding_window: a mask_mod factory for a causal sliding window.


def make_sliding_window(window: int) -> Callable[..., torch.Tensor]:
    """Return a mask_mod allowing q_idx to attend to kv_idx when 0 <= q_idx - kv_idx < window."""
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def dense_mask(mask_mod: Callable[..., Any], size: int) -> Any:
    """Return ``mask_mod`` evaluated on the full (size x size) grid of query and key indices."""
    zero = torch.tensor(0)
    return mask_mod(zero, zero, torch.arange(size).view(-1, 1), torch.arange(size).view(1, -1))


def _as_mask(result: Any) -> Any:
    """A dense mask as a bool tensor of the grid's shape (what create_block_mask needs), else as it is."""
    if isinstance(result, torch.Tensor) and result.dtype == torch.bool:
        return result.expand(result.shape[-2:]) if result.dim() >= 2 else result
    return result


#: The cases of 11.sliding_window: each window, and the size of the grid of indices its mask_mod is
#: evaluated on (the learner's function takes the window alone, so the size is looked up, not passed).
GRID = {1: 6, 3: 10, 4: 16, 20: 12}


class _OnGrid:
    """A mask_mod's dense mask on a case's grid, compared as a whole; in feedback it names the first
    (q_idx, kv_idx) pair where it differs from the sliding window."""

    def __init__(self, mask: torch.Tensor, window: int, size: int) -> None:
        self.mask, self.window, self.size = mask, window, size

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _OnGrid) and self.mask.shape == other.mask.shape
                and bool(torch.equal(self.mask, other.mask)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        band = _band(self.window, self.size)
        where = f"a mask_mod that, on a {self.size}x{self.size} grid of indices,"
        if self.mask.shape != band.shape:
            return f"{where} gives a mask of shape {tuple(self.mask.shape)}"
        wrong = (self.mask != band).nonzero()
        if not len(wrong):
            keys = "kv_idx == q_idx" if self.window == 1 else f"q_idx - {self.window - 1} <= kv_idx <= q_idx"
            return f"a window of {self.window} ({keys})"
        i, j = wrong[0].tolist()
        allowed = bool(self.mask[i, j])
        return f"{where} {'lets' if allowed else 'keeps'} q_idx={i} {'attend to' if allowed else 'from'} kv_idx={j}"


def _window_mask(make: Callable[[int], Any], window: int) -> _OnGrid:
    size = GRID[window]
    mask_mod = run(make, window, call=f"make_sliding_window({window})")
    if not callable(mask_mod):
        raise Wrong(f"make_sliding_window({window}) returned {short(mask_mod)}; return the inner function "
                    "mask_mod(b, h, q_idx, kv_idx) itself.")
    got = run(dense_mask, mask_mod, size, call=f"make_sliding_window({window})(b, h, q_idx, kv_idx)",
              errors=[("Boolean value of Tensor", "q_idx and kv_idx are tensors: combine conditions with &, "
                                                   "not `and`.")])
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
        raise Wrong(f"the mask_mod returned {short(got)}; it must return a boolean tensor, such as q_idx >= kv_idx.")
    return _OnGrid(_as_mask(got), window, size)


def _band(window: int, size: int) -> torch.Tensor:
    """What the checker compares with: the lower triangle minus everything ``window`` or more below the diagonal."""
    ones = torch.ones(size, size, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def _window_mistakes() -> list[Mistake]:
    def no_causal(window):
        return lambda b, h, q, kv: (q - kv).abs() < window

    def inclusive(window):
        return lambda b, h, q, kv: (q >= kv) & (q - kv <= window)

    def future(window):
        return lambda b, h, q, kv: (kv >= q) & (kv - q < window)

    def python_and(window):
        return lambda b, h, q, kv: (q >= kv) and (q - kv < window)

    return [(no_causal, "Your window reaches into the future too: also require q_idx >= kv_idx (not in the "
                        "future)."),
            (inclusive, "One key too many: allow keys fewer than `window` positions back (q_idx - kv_idx < window), "
                        "so a window of 1 is the token itself."),
            (future, "Your mask looks ahead: kv_idx must not be after q_idx, and q_idx - kv_idx < window."),
            (python_and, "q_idx and kv_idx are tensors: combine conditions with &, not `and`.")]


function_exercise(
    "11.sliding_window",
    solution=make_sliding_window,
    reference=lambda window: _OnGrid(_band(window, GRID[window]), window, GRID[window]),
    cases=lambda: [(window,) for window in GRID],
    prepare=lambda make: (lambda window: _window_mask(make, window)),
    mistakes=_window_mistakes,
    otherwise="Allow kv_idx when q_idx >= kv_idx and q_idx - kv_idx < window; print the dense mask with "
              "exercises.nb11.dense_mask(make_sliding_window(3), 8) to see yours.",
    success="your mask_mod gives the causal sliding window for every window size, and works on index "
            "tensors as create_block_mask calls it.",
)

# --- 11.block_sparsity: the fraction of (block x block) tiles that hold no True entry.


def block_sparsity(mask: torch.Tensor, block: int) -> float:
    """Return the fraction of the (block x block) tiles of a square boolean mask with no True entry."""
    n = mask.shape[-1] // block
    tiles = mask.reshape(n, block, n, block).any(dim=3).any(dim=1)
    return 1.0 - tiles.float().mean().item()


def _sparsity_cases() -> list[tuple[torch.Tensor, int]]:
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    window = causal & ~torch.ones(16, 16, dtype=torch.bool).tril(-3)
    docs = torch.tensor([0] * 6 + [1] * 10)
    doc_mask = (docs.view(-1, 1) == docs.view(1, -1)) & torch.ones(16, 16, dtype=torch.bool).tril()
    # Counted by hand on the (n x n) grid of tiles: which tiles hold a True entry.
    return [case(window, 2, gives=49 / 64),   # 8 x 8 tiles: the diagonal and the one below it (15) are needed
            case(causal, 4, gives=6 / 16),    # 4 x 4 tiles: the 6 above the diagonal are empty
            case(window, 4, gives=9 / 16),    # the 4 diagonal tiles and the 3 below them are needed
            case(doc_mask, 4, gives=8 / 16),  # above the diagonal (6), and tiles (2, 0), (3, 0) across documents
            case(torch.ones(8, 8, dtype=torch.bool), 4, gives=0.0)]


def _sparsity_mistakes() -> list[Mistake]:
    def element_fraction(mask, block):
        return 1.0 - mask.float().mean().item()

    def partial_counts(mask, block):   # a tile with any False counted as skipped
        n = mask.shape[-1] // block
        return 1.0 - mask.reshape(n, block, n, block).all(dim=3).all(dim=1).float().mean().item()

    def kept_fraction(mask, block):
        return 1.0 - block_sparsity(mask, block)

    return [(element_fraction, "That is the fraction of masked-out entries; count whole (block x block) tiles "
                               "with no True entry instead."),
            (partial_counts, "A partly allowed tile cannot be skipped: the kernel must visit any tile with at "
                             "least one True entry."),
            (kept_fraction, "That is the fraction of tiles that are kept; return the share that can be skipped.")]


function_exercise(
    "11.block_sparsity",
    solution=block_sparsity,
    cases=_sparsity_cases,
    normalise=lambda result: float(result) if isinstance(result, torch.Tensor) and result.numel() == 1 else result,
    mistakes=_sparsity_mistakes,
    otherwise="Cut the mask into (block x block) tiles (reshape to (n, block, n, block)), mark a tile as needed "
              "when any entry is True, and return the share of tiles that are not needed. If the call above used "
              "tiles of 2, it is the first case: a causal sliding window of 3 on 16 positions, causal & "
              "~torch.ones(16, 16, dtype=torch.bool).tril(-3) with causal = torch.ones(16, 16, "
              "dtype=torch.bool).tril(); 15 of its 64 tiles hold a True entry.",
    success="your count agrees with the tiles a BlockMask would skip.",
)

