"""What is one block of the tiny GPT? A pre-norm transformer block (self-attention + GELU MLP)
whose attention can take the keys and values of earlier positions (a KV cache) and returns the keys
and values its own positions add to it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: One layer's keys and values, each ``(batch, heads, positions, head_dim)``.
KV = tuple[torch.Tensor, torch.Tensor]


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None,
           is_causal: bool = False, dropout_p: float = 0.0) -> torch.Tensor:
    """Return scaled dot-product attention, ``(..., queries, head_dim)``: the one place the course's models
    do attention maths (``F.scaled_dot_product_attention``). ``mask`` is True where a query may look."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p)


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

    def attention(self, x: torch.Tensor, past: KV | None = None,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """Return multi-head self-attention of ``x`` (already normalised) and ``x``'s keys and values.

        ``x`` is ``(b, t, d_model)``. ``past``, when given, holds the keys and values of ``p``
        earlier positions, ``(b, heads, p, head_dim)`` each; ``x``'s positions attend to them and
        to each other. The keys and values returned are ``x``'s own, ``(b, heads, t, head_dim)``:
        what the cache gains, so the next call's ``past`` is ``past`` with them appended along
        positions (dim 2). ``mask`` (broadcastable to ``(b, heads, t, p + t)``, True where a query
        may look) replaces the causal rule; a batch whose rows have different amounts of real past
        needs one. Without it a causal block lets position ``i`` of ``x`` see all of ``past`` and
        ``x``'s positions up to ``i``.

        (Only the new keys and values are returned, not the concatenation: a caller that keeps its
        cache in a preallocated buffer writes them in place, and a compiled decoding step that had
        to read them back out of the concatenated tensor ran measurably slower.)
        """
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, c // heads)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        is_causal = False
        if mask is None and self.causal:
            if past is None:
                is_causal = True
            else:  # causal with an offset: query i sees keys 0 .. p + i
                n_keys = keys.shape[2]
                mask = torch.ones(t, n_keys, dtype=torch.bool, device=x.device).tril(n_keys - t)
        y = attend(q, keys, values, mask, is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c)), (k, v)

    def forward_packed(self, x: torch.Tensor, attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                       ) -> torch.Tensor:
        """Return the block's output ``(N, d_model)`` for ``N`` tokens of several sequences packed together.

        The block's own layers run on all of them at once; ``attention(q, k, v)`` gets their queries,
        keys and values, ``(N, heads, head_dim)`` each, and returns the attention output in the same
        shape: the caller decides which keys each token sees (a serving step keeps them in a KV cache
        and calls ``attend`` per group of sequences).
        """
        n, c = x.shape
        q, k, v = (z.view(n, self.n_heads, c // self.n_heads) for z in self.qkv(self.ln1(x)).split(c, dim=1))
        x = x + self.proj(attention(q, k, v).reshape(n, c))
        return x + self.mlp(self.ln2(x))

    def forward_cached(self, x: torch.Tensor, past: KV | None = None,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """Return the block's output for ``x`` and ``x``'s keys and values; ``past`` and ``mask`` as in
        ``attention``."""
        a, kv = self.attention(self.ln1(x), past, mask)
        x = x + a
        return x + self.mlp(self.ln2(x)), kv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the block's output, same shape as ``x``."""
        return self.forward_cached(x)[0]
