"""A tiny character-level GPT: token and position embeddings, causal blocks, a tied head."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import TransformerBlock


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a ``TinyGPT``; the defaults train on a laptop CPU in minutes."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def to_dict(self) -> dict[str, int | float]:
        """Return the config as a plain dict (for checkpoints)."""
        return asdict(self)


class TinyGPT(nn.Module):
    """A decoder-only transformer over characters; ``forward`` maps ids ``(B, T)`` to logits ``(B, T, V)``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.n_embd, config.n_head, dropout=config.dropout, causal=True)
            for _ in range(config.n_layer)
        )
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return next-token logits for every position of ``idx``."""
        _, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy of predicting ``targets`` from ``idx``."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def next_token(self, idx: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Return one sampled next token per row of ``idx`` as ``(B, 1)``; ``temperature=0`` is greedy."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        logits = self(idx[:, -self.config.block_size:])[:, -1, :]
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            k = min(int(top_k), logits.size(-1))
            kth = torch.topk(logits, k).values[:, [-1]]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)

    def stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
               top_k: int | None = None, generator: torch.Generator | None = None) -> Iterator[int]:
        """Yield ``max_new_tokens`` token ids one at a time, continuing the single sequence ``idx``.

        ``idx`` is ``(T,)`` or ``(1, T)``. Stopping the iteration early stops generation.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        idx = idx.view(1, -1) if idx.dim() == 1 else idx
        if idx.size(0) != 1:
            raise ValueError(f"stream() continues one sequence; got a batch of {idx.size(0)}")
        for _ in range(max_new_tokens):
            nxt = self.next_token(idx, temperature, top_k, generator)
            idx = torch.cat([idx, nxt], dim=1)
            yield int(nxt)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return ``idx`` ``(B, T)`` extended by ``max_new_tokens`` sampled tokens, ``(B, T + new)``."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        for _ in range(max_new_tokens):
            idx = torch.cat([idx, self.next_token(idx, temperature, top_k, generator)], dim=1)
        return idx
