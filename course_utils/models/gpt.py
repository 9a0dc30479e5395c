"""What is the tiny GPT, and how does it decode with a key-value cache? A character-level GPT
(token and position embeddings, causal blocks, a tied head) and the cache procedure a server runs.

The model's one attention (``TransformerBlock.attention``) takes the keys and values of earlier
positions and returns the ones its tokens add; ``TinyGPT.forward_cached`` runs every block that way, and
``forward``, ``prefill`` and ``decode_core`` all go through it. ``KVCache`` stores the keys and
values of many sequences: ``prefill`` runs a right-padded batch of prompts once and stores every
layer's keys and values; ``decode_step`` then feeds one new token per sequence and attends to the
stored keys, so a step costs one token instead of the whole sequence. Rows of the cache are
independent sequences of different lengths, which is what a server batching requests at every
decoding step needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import KV, TransformerBlock, attend


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

    def forward(self, idx: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Return next-token logits for every position of ``idx``.

        ``start_pos`` places the sequence at positions ``start_pos .. start_pos + T - 1``
        (training on random offsets teaches every position embedding).
        """
        _, t = idx.shape
        if t + start_pos > self.config.block_size:
            raise ValueError(f"sequence length {t + start_pos} exceeds block_size {self.config.block_size}")
        pos = torch.arange(start_pos, start_pos + t, device=idx.device)
        return self.logits(self.forward_cached(idx, pos)[0])

    def forward_cached(self, idx: torch.Tensor, pos: torch.Tensor, past: Sequence[KV] | None = None,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[KV]]:
        """Return the last block's hidden states ``(B, T, n_embd)`` for tokens ``idx`` ``(B, T)`` at
        positions ``pos`` (``(T,)`` or ``(B, T)``), and each layer's keys and values.

        ``past`` gives each layer's keys and values of earlier positions and ``mask`` which of them
        each query may see (see ``TransformerBlock.attention``); the keys and values returned are
        ``idx``'s own, ``(B, n_head, T, head_dim)`` per layer, what a cache gains. No position check
        here: callers check ``block_size``.
        """
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        present: list[KV] = []
        for layer, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if past is None else past[layer], mask)
            present.append(kv)
        return x, present

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return next-token logits ``(..., vocab)`` from hidden states ``(..., n_embd)`` (final norm, tied head)."""
        return self.head(self.ln_f(hidden))

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


class KVCache:
    """Keys and values of up to ``capacity`` sequences, each up to ``max_len`` positions.

    ``k`` and ``v`` are ``(n_layer, capacity, n_head, max_len, head_dim)``; ``lengths[r]`` is
    how many positions of row ``r`` are filled. Rows are independent sequences: a server
    keeps its live sequences in rows ``0 .. n-1`` and moves rows with ``move_row``.
    """

    def __init__(self, config: GPTConfig, capacity: int, max_len: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        max_len = config.block_size if max_len is None else max_len
        if not 1 <= max_len <= config.block_size:
            raise ValueError(f"max_len must be in 1..{config.block_size}, got {max_len}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        head_dim = config.n_embd // config.n_head
        shape = (config.n_layer, capacity, config.n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(capacity, dtype=torch.long, device=device)
        self.capacity = capacity
        self.max_len = max_len

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src`` (keys, values, length) into row ``dst``."""
        if src != dst:
            n = int(self.lengths[src])
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
            self.v[:, dst, :, :n] = self.v[:, src, :, :n]
            self.lengths[dst] = n

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` (keys, values, lengths); only their filled positions move."""
        if a != b:
            n = int(self.lengths[[a, b]].max())
            for t in (self.k, self.v):
                t[:, [a, b], :, :n] = t[:, [b, a], :, :n]
            self.lengths[[a, b]] = self.lengths[[b, a]]

    def clear(self) -> None:
        """Mark every row empty (the tensors are reused, not freed)."""
        self.lengths.zero_()


@torch.no_grad()
def prefill(model: TinyGPT, idx: torch.Tensor, lengths: torch.Tensor, cache: KVCache,
            first_row: int = 0, start: torch.Tensor | None = None) -> torch.Tensor:
    """Return the logits after each prompt's last real token, ``(m, vocab)``, having run prompts
    ``idx`` ``(m, T)`` (right-padded; row ``i`` has ``lengths[i]`` real tokens) and stored their
    keys/values in cache rows ``first_row .. first_row + m - 1``.

    ``start`` (``(m,)``, optional) says how many positions of each row are already in the cache
    (a shared prefix copied in by a prefix cache): row ``i``'s tokens then sit at positions
    ``start[i] ..``, attend to the row's first ``start[i]`` cached positions and causally to each
    other, and only they are computed. Without it (or with all zeros) every row starts at 0.
    Right padding is exact either way: a real position never attends to a padded one.
    """
    m, t = idx.shape
    if first_row + m > cache.capacity:
        raise ValueError(f"rows {first_row}..{first_row + m - 1} exceed capacity {cache.capacity}")
    lengths = lengths.to(device=idx.device, dtype=torch.long)
    if int(lengths.min()) < 1 or int(lengths.max()) > t:
        raise ValueError("every prompt needs between 1 and T real tokens")
    rows = slice(first_row, first_row + m)
    if start is not None:
        start = start.to(device=idx.device, dtype=torch.long)
        if start.shape != (m,) or int(start.min()) < 0:
            raise ValueError(f"start must hold {m} cached lengths >= 0, got {tuple(start.shape)}")
        if int(start.max()) > 0:
            return _prefill_after(model, idx, lengths, cache, first_row, start)
    if t > cache.max_len:
        raise ValueError(f"prompt length {t} exceeds the cache's max_len {cache.max_len}")
    hidden, present = model.forward_cached(idx, torch.arange(t, device=idx.device))
    for layer, (k, v) in enumerate(present):
        cache.k[layer, rows, :, :t] = k
        cache.v[layer, rows, :, :t] = v
    cache.lengths[rows] = lengths
    return model.logits(hidden[torch.arange(m, device=idx.device), lengths - 1])


def _prefill_after(model: TinyGPT, idx: torch.Tensor, lengths: torch.Tensor, cache: KVCache,
                   first_row: int, start: torch.Tensor) -> torch.Tensor:
    """``prefill`` for rows whose first ``start[i]`` positions are cached: returns the same logits."""
    m, t = idx.shape
    if int((start + lengths).max()) > cache.max_len:
        raise ValueError(f"a cached prefix plus its prompt exceeds the cache's max_len {cache.max_len}")
    rows = slice(first_row, first_row + m)
    past_len = int(start.max())
    j = torch.arange(t, device=idx.device)
    # padded tokens may run past the last position; clamp them (nobody sees their results)
    pos = (start[:, None] + j).clamp(max=model.config.block_size - 1)
    # (m, 1, t, past_len + t): cached key p is visible when p < start[i]; new keys causally
    visible = (torch.arange(past_len, device=idx.device) < start[:, None])[:, None, :].expand(m, t, past_len)
    causal = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril().expand(m, t, t)
    mask = torch.cat([visible, causal], dim=2)[:, None]
    past = [(cache.k[layer, rows, :, :past_len], cache.v[layer, rows, :, :past_len])
            for layer in range(model.config.n_layer)]
    hidden, present = model.forward_cached(idx, pos, past, mask)
    # write only the real tokens, at each row's own positions
    r, c = (j < lengths[:, None]).nonzero(as_tuple=True)
    dest_rows, dest_pos = r + first_row, start[r] + c
    # two index tensors split by slices: the indexed dim comes first, (tokens, n_layer, n_head, head_dim)
    cache.k[:, dest_rows, :, dest_pos] = torch.stack([k for k, _ in present])[:, r, :, c]
    cache.v[:, dest_rows, :, dest_pos] = torch.stack([v for _, v in present])[:, r, :, c]
    cache.lengths[rows] = start + lengths
    return model.logits(hidden[torch.arange(m, device=idx.device), lengths - 1])


@torch.no_grad()
def decode_step(model: TinyGPT, tokens: torch.Tensor, cache: KVCache,
                core: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
                ) -> torch.Tensor:
    """Feed one token per live sequence (``tokens`` ``(n,)`` for cache rows ``0 .. n-1``).

    Each token is placed at its row's next position, its keys/values are appended, and it
    attends to everything stored for its row. Returns next-token logits ``(n, vocab)``.
    The bookkeeping that needs Python numbers (how far to attend, the length check) stays
    here; the tensor work is ``decode_core``, which ``core`` may replace with a compiled copy
    (``torch.compile(decode_core, dynamic=True)``): it then compiles once, without graph breaks.
    """
    n = tokens.shape[0]
    pos = cache.lengths[:n]
    longest = int(pos.max()) + 1
    if longest > cache.max_len:
        raise ValueError(f"a sequence would exceed the cache's max_len {cache.max_len}")
    # Read at least 2 cached positions (the extra ones are masked out): torch.compile
    # specialises sizes 0 and 1, so this keeps one compiled graph for every length.
    past = min(max(longest - 1, 2), cache.max_len)
    logits, new_k, new_v = (core or decode_core)(model, tokens, pos, cache.k, cache.v, past)
    rows = torch.arange(n, device=tokens.device)
    # two index tensors split by a slice: the indexed dims come first, (n, n_layer, ...)
    cache.k[:, rows, :, pos] = new_k.transpose(0, 1)
    cache.v[:, rows, :, pos] = new_v.transpose(0, 1)
    cache.lengths[:n] += 1
    return logits


def decode_core(model: TinyGPT, tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tensor work of one decoding step, free of side effects (so a compiled copy never
    copies the cache): each row's new token attends to its first ``pos[r]`` cached positions
    (of the ``past`` read) and to itself. Returns the logits ``(n, vocab)`` and the new keys and
    values ``(n_layer, n, n_head, head_dim)``, which ``decode_step`` writes into the cache."""
    n = tokens.shape[0]
    # (n, 1, 1, past + 1): cached key j is visible to row r when j < pos[r]; the new key always
    visible = torch.arange(past, device=tokens.device) < pos[:, None]
    mask = torch.cat([visible, visible.new_ones(n, 1)], dim=1)[:, None, None, :]
    cached = [(k_cache[layer, :n, :, :past], v_cache[layer, :n, :, :past]) for layer in range(model.config.n_layer)]
    hidden, present = model.forward_cached(tokens[:, None], pos[:, None], cached, mask)
    new_k = torch.stack([k[:, :, 0] for k, _ in present])  # each layer's (n, n_head, 1, head_dim)
    new_v = torch.stack([v[:, :, 0] for _, v in present])
    return model.logits(hidden[:, 0]), new_k, new_v


@torch.no_grad()
def mixed_step(model: TinyGPT, cache: KVCache, rows: Sequence[int], chunks: Sequence[Sequence[int]],
               starts: Sequence[int]) -> torch.Tensor:
    """Return the logits after the last token of each chunk, ``(m, vocab)``, having computed in one
    forward pass ``chunks[i]`` (token ids) of the sequence in cache row ``rows[i]`` at positions
    ``starts[i] ..`` (its first ``starts[i]`` positions are cached) and stored their keys and values.

    A decoding sequence brings one token, a prompt (or a chunk of one) several. Every token goes
    through the embeddings, the linear layers and the MLPs together, packed into one ``(N, C)``
    batch with no padding. Each layer writes its new keys and values into the cache, then attends
    in two groups: the one-token entries, which must come first and sit in rows ``0 .. d-1`` in
    order, read their rows in place (one batched attention); the longer chunks, right-padded into
    one batch, read their rows' cached positions and their own, causally.
    """
    m, lens = len(rows), [len(c) for c in chunks]
    if m == 0 or len(chunks) != m or len(starts) != m or min(lens) < 1:
        raise ValueError("need at least one sequence, and one chunk of at least one token per row")
    d = next((i for i, n in enumerate(lens) if n > 1), m)           # the leading one-token entries
    if list(rows[:d]) != list(range(d)) or 1 in lens[d:]:
        raise ValueError("one-token entries must come first, in cache rows 0 .. d-1")
    if max(s + n for s, n in zip(starts, lens)) > cache.max_len:
        raise ValueError(f"a sequence would exceed the cache's max_len {cache.max_len}")
    dev, mc = cache.k.device, m - d
    tokens = torch.tensor([t for c in chunks for t in c], device=dev)                          # (N,)
    row_t, start_t = torch.tensor(list(rows), device=dev), torch.tensor(list(starts), device=dev)  # (m,)
    if d == m:  # only one-token entries (the usual decoding step): no per-token expansion
        pos, tok_row = start_t, row_t                                                          # (N,) = (m,)
    else:
        len_t = torch.tensor(lens, device=dev)
        offset = torch.arange(len(tokens), device=dev) - (len_t.cumsum(0) - len_t).repeat_interleave(len_t)
        pos = start_t.repeat_interleave(len_t) + offset                                        # (N,)
        tok_row = row_t.repeat_interleave(len_t)                                               # (N,)
    # one-token rows: query r sees keys 0 .. pos[r] of its own row (its new key included)
    seen = max(max(starts[:d], default=0) + 1, 3)   # at least 3 keys: one shape for torch.compile
    one_mask = (torch.arange(seen, device=dev) <= pos[:d, None])[:, None, None, :]             # (d, 1, 1, seen)
    if mc:  # chunks, right-padded to (mc, t): `grab` picks each slot's token out of the packed N
        c_lens = torch.tensor(lens[d:], device=dev)[:, None]                                   # (mc, 1)
        first = torch.tensor([sum(lens[:i]) for i in range(d, m)], device=dev)[:, None]        # (mc, 1)
        j = torch.arange(max(lens[d:]), device=dev)                                            # (t,)
        grab = first + torch.minimum(j, c_lens - 1)          # a padded slot repeats its last token
        real = (j < c_lens).flatten().nonzero()[:, 0]        # the real slots, in packed order
        c_idx = torch.tensor(list(rows[d:]), device=dev)
        c_seen = max(s + n for s, n in zip(starts[d:], lens[d:]))
        c_pos = torch.tensor(list(starts[d:]), device=dev)[:, None] + j                        # (mc, t)
        c_mask = (torch.arange(c_seen, device=dev) <= c_pos[:, :, None])[:, None]              # (mc, 1, t, c_seen)

    def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this layer's new keys and values, then attend per group; returns ``(N, H, hd)``."""
        # two index tensors split by a slice: the indexed dim comes first, (N, H, hd)
        cache.k[layer, tok_row, :, pos] = k
        cache.v[layer, tok_row, :, pos] = v
        parts = []
        if d:
            keys, vals = cache.k[layer, :d, :, :seen], cache.v[layer, :d, :, :seen]            # (d, H, seen, hd)
            parts.append(attend(q[:d, :, None], keys, vals, one_mask)[:, :, 0])                # (d, H, hd)
        if mc:
            keys, vals = cache.k[layer, c_idx, :, :c_seen], cache.v[layer, c_idx, :, :c_seen]  # (mc, H, c_seen, hd)
            out = attend(q[grab].transpose(1, 2), keys, vals, c_mask)                          # (mc, H, t, hd)
            parts.append(out.transpose(1, 2).flatten(0, 1)[real])                               # (N - d, H, hd)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    x = model.tok_emb(tokens) + model.pos_emb(pos)                                             # (N, C)
    for layer, block in enumerate(model.blocks):
        x = block.forward_packed(x, lambda q, k, v, layer=layer: attention(layer, q, k, v))   # (N, C)
    cache.lengths[row_t] = start_t + (1 if d == m else len_t)
    last = x if d == m else x[len_t.cumsum(0) - 1]                                             # (m, C)
    return model.logits(last)                                                                  # (m, vocab)


def pad_prompts(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token-id lists into ``idx`` ``(B, longest)`` and return it with their ``lengths``."""
    if not prompts or not all(prompts):
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    idx = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.long)
    for row, ids in enumerate(prompts):
        idx[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return idx, lengths


@torch.no_grad()
def greedy_steps(model: TinyGPT, idx: torch.Tensor, lengths: torch.Tensor,
                 steps: int) -> Iterator[torch.Tensor]:
    """Yield ``steps`` greedy next tokens for every row, ``(B,)`` each: the batch is prefilled
    once into a fresh KV cache, then decoded one token per step (a static batch)."""
    cache = KVCache(model.config, idx.shape[0],
                    max_len=min(model.config.block_size, max(int(lengths.max()) + steps, idx.shape[1])),
                    device=idx.device, dtype=model.tok_emb.weight.dtype)
    if steps <= 0:
        return
    nxt = prefill(model, idx, lengths, cache).argmax(dim=-1)
    for step in range(steps):
        yield nxt
        if step + 1 < steps:
            nxt = decode_step(model, nxt, cache).argmax(dim=-1)


@torch.no_grad()
def generate_cached(model: TinyGPT, idx: torch.Tensor, max_new_tokens: int,
                    lengths: torch.Tensor | None = None) -> list[list[int]]:
    """Greedy continuation of each prompt row with the KV cache; returns the new ids per row.

    ``idx`` is ``(B, T)``, right-padded when ``lengths`` is given. Equals ``generate`` with
    ``temperature=0`` token for token (as long as the sequence fits in ``block_size``).
    """
    lengths = torch.full((idx.shape[0],), idx.shape[1], dtype=torch.long) if lengths is None else lengths
    out: list[list[int]] = [[] for _ in range(idx.shape[0])]
    for nxt in greedy_steps(model, idx, lengths, max_new_tokens):
        for row, tok in enumerate(nxt.tolist()):
            out[row].append(tok)
    return out
