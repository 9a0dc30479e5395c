"""A pre-norm transformer block (self-attention + GELU MLP), the unit of the tiny GPT."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):
    """``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``; input and output ``(batch, seq, d_model)``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4,
                 dropout: float = 0.0, causal: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.causal = causal
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
            nn.Dropout(dropout),
        )

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Return multi-head self-attention of ``x`` (already normalised)."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, c // heads)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the block's output, same shape as ``x``."""
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))
