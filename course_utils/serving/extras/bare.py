"""Tokens per second of the model alone (KV cache, no HTTP): the ceiling a server can approach."""

from __future__ import annotations

import torch

from ... import bench
from ...models.gpt import KVCache, TinyGPT, decode_step, prefill


def bare_decode(model: TinyGPT, idx: torch.Tensor, lengths: torch.Tensor, cache: KVCache, new_tokens: int) -> None:
    """Greedy-decode ``new_tokens`` for every row of ``idx`` ``(B, T)`` the bare way: one prefill into an
    emptied ``cache``, then one decoding step per token, no scheduler and no server."""
    cache.clear()
    nxt = prefill(model, idx, lengths, cache).argmax(-1)
    for _ in range(new_tokens - 1):
        nxt = decode_step(model, nxt, cache).argmax(-1)
    nxt.tolist()


def bare_decode_tokens_per_s(model: TinyGPT, batch_size: int, prompt_len: int = 8,
                             new_tokens: int = 32, repeats: int = 3, threads: int | None = None,
                             seed: int = 0) -> float:
    """Return generated tokens per second for ``batch_size`` greedy sequences.

    Each repeat prefills ``batch_size`` random prompts of ``prompt_len`` tokens and decodes
    ``new_tokens`` tokens per sequence (the prefill counts, as in a server). One warm-up,
    then ``repeats`` runs, each timed as one call by ``bench.first_call``; the median run (the
    upper one of an even count) gives the rate. ``threads`` sets torch's threads for the run.
    """
    if batch_size < 1 or prompt_len < 1 or new_tokens < 1 or repeats < 1:
        raise ValueError("batch_size, prompt_len, new_tokens and repeats must be >= 1")
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(model.config, batch_size, max_len=min(model.config.block_size, prompt_len + new_tokens))
    idx = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len), generator=gen)
    lengths = torch.full((batch_size,), prompt_len, dtype=torch.long)

    def run() -> None:
        bare_decode(model, idx, lengths, cache, new_tokens)

    try:
        with torch.inference_mode():
            run()  # warm-up
            times = sorted(bench.first_call(run) for _ in range(repeats))
    finally:
        torch.set_num_threads(old_threads)
    return batch_size * new_tokens / times[len(times) // 2]
