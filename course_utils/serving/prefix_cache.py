"""Which keys and values of a new prompt has the engine computed before? A prefix cache of full blocks.

A prompt is cut into full blocks of ``block`` tokens. Each block gets a hash that covers its own
tokens and every token before it (a chain: block ``i``'s hash is computed from block ``i - 1``'s),
so two prompts share a block's hash only when they share everything up to its end, which is
exactly when that block's keys and values are the same. ``PrefixCache`` keeps computed blocks'
keys and values (every layer) under those hashes, least recently used first out once the stored
bytes pass ``capacity_bytes``; a capacity of 0 stores nothing.

The engine calls ``load`` when it admits a prompt (copy the longest run of known blocks into the
prompt's cache row, and prefill only the rest) and ``store`` after a prefill (file the prompt's
full blocks). ``load`` always leaves at least the prompt's last token to compute: its logits give
the first answer token.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ..models.gpt import KVCache

#: Tokens per block: small enough that most of a shared prompt is whole blocks.
BLOCK = 16


def block_hashes(ids: Sequence[int], block: int = BLOCK) -> list[bytes]:
    """Return one hash per full block of ``ids``; each covers its block and every token before it."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    hashes: list[bytes] = []
    h = b""
    for i in range(len(ids) // block):
        h = hashlib.blake2b(h + array("q", ids[i * block:(i + 1) * block]).tobytes(), digest_size=16).digest()
        hashes.append(h)
    return hashes


class PrefixCache:
    """An LRU store of full blocks' keys and values, found by chained block hashes."""

    def __init__(self, capacity_bytes: int, block: int = BLOCK) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.capacity_bytes = capacity_bytes
        self.block = block
        self.bytes = 0
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # hash -> (2, n_layer, heads, block, hd)

    def __len__(self) -> int:
        """Return the number of blocks stored."""
        return len(self._blocks)

    def __contains__(self, h: object) -> bool:
        return h in self._blocks

    def match(self, ids: Sequence[int]) -> list[bytes]:
        """Return the hashes of the longest stored run of ``ids``'s leading blocks, stopping before the
        block that holds its last token would be the whole prompt (one token is always left)."""
        usable = (len(ids) - 1) // self.block
        run: list[bytes] = []
        for h in block_hashes(ids[:usable * self.block], self.block):
            if h not in self._blocks:
                break
            run.append(h)
        return run

    def load(self, ids: Sequence[int], cache: KVCache, row: int) -> int:
        """Return how many leading tokens of ``ids`` were found, having copied their keys and values
        into positions ``0 ..`` of ``cache`` row ``row`` (0 when none were, and the row is untouched)."""
        run = self.match(ids)
        if not run:
            return 0
        kv = torch.cat([self._blocks[h] for h in run], dim=3)  # (2, n_layer, heads, n * block, hd)
        n = kv.shape[3]
        if n > cache.max_len:
            raise ValueError(f"{n} cached tokens exceed the cache's max_len {cache.max_len}")
        cache.k[:, row, :, :n] = kv[0]
        cache.v[:, row, :, :n] = kv[1]
        self._touch(run)
        return n

    def store(self, ids: Sequence[int], cache: KVCache, row: int) -> int:
        """Return how many new blocks were filed: the full blocks of ``ids``, whose keys and values
        are in positions ``0 ..`` of ``cache`` row ``row``, each copied out under its hash."""
        if self.capacity_bytes == 0:
            return 0
        hashes = block_hashes(ids, self.block)
        added = 0
        for i, h in enumerate(hashes):
            if h in self._blocks:
                continue
            span = slice(i * self.block, (i + 1) * self.block)
            kv = torch.stack([cache.k[:, row, :, span], cache.v[:, row, :, span]])  # a copy
            if kv.nbytes > self.capacity_bytes:
                break
            self._blocks[h] = kv
            self.bytes += kv.nbytes
            added += 1
        self._touch(hashes)
        self._evict()
        return added

    def clear(self) -> None:
        """Forget every stored block."""
        self._blocks.clear()
        self.bytes = 0

    def _touch(self, run: list[bytes]) -> None:
        # most recent last; a run's first block is the most recent of all, so eviction takes the
        # tails of chains first and never strands a later block behind a missing earlier one
        for h in reversed(run):
            if h in self._blocks:
                self._blocks.move_to_end(h)

    def _evict(self) -> None:
        while self.bytes > self.capacity_bytes and self._blocks:
            _, kv = self._blocks.popitem(last=False)
            self.bytes -= kv.nbytes
