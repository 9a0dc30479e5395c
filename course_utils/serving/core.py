"""The serving engine's core: a scheduler whose ``step()`` admits, plans, runs one forward pass, emits
and retires. No threads, no asyncio, no metrics: ``generate`` drives it directly, and the server's
``GenerationEngine`` (``engine.py``) is a thin adapter that feeds it requests and hands its tokens on.

One step, in order (``EngineCore.step``):

1. **file** the prompt blocks computed last step in the prefix cache (after their first token went
   out, so filing never delays it);
2. **admit** waiting sequences into free cache rows, copying in the longest cached prefix of each
   prompt (``PrefixCache.load``);
3. **plan** the step's tokens under ``token_budget``: one for every decoding sequence, then prompt
   chunks (a long prompt is computed over several steps: chunked prefill);
4. **run** one forward pass for all of them together (``models.gpt.mixed_step``);
5. **emit** the next token of every sequence whose tokens are all computed (greedy or sampled);
6. **retire** finished and cancelled sequences, freeing their rows.

Cache rows: ``running[i]`` lives in row ``i`` of one ``KVCache`` (``max_len`` positions each). The
forward pass wants its one-token entries in rows ``0 .. d-1``; ``_plan`` swaps rows when a
retirement left a prompt still being computed among them.

Why rows and not pages: at the server's defaults one row per sequence is 32 rows x 512 positions x
4 KiB = 64 MiB, small for a CPU machine, while a paged cache must gather each row's blocks before
attention (torch has no CPU kernel that reads them in place). Measured on a 2-core machine (1 torch
thread), one decoding step took 5-7.5x as long with the gather (8 rows of 128 tokens: 4.6 ms against
0.93 ms; 32 rows of 384: 40 ms against 5.8 ms), for a memory saving this server does not need.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ..models.gpt import KVCache, TinyGPT, decode_step, mixed_step
from .prefix_cache import PrefixCache

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Sequence:
    """One prompt and its answer so far, as the core sees it."""

    ids: list[int]                   # the prompt's token ids
    max_new_tokens: int
    temperature: float = 0.0         # 0: greedy
    generator: torch.Generator | None = None
    out: list[int] = field(default_factory=list)   # answer tokens so far
    cached: int = 0                  # positions whose keys and values are in the sequence's row
    cancelled: bool = False          # set by the caller: drop at the next step
    finished: bool = False           # set by the core: left the batch (done, failed or dropped)
    error: str | None = None         # why the core ended it early, if it did

    @property
    def generated(self) -> int:
        """Return how many answer tokens the sequence has."""
        return len(self.out)

    def todo(self) -> int:
        """Return how many of its tokens still need their keys and values computed."""
        return len(self.ids) + len(self.out) - self.cached

    def next_tokens(self, n: int) -> list[int]:
        """Return the next ``n`` tokens to compute (prompt tokens, then the last answer token)."""
        if self.cached < len(self.ids):
            return self.ids[self.cached:self.cached + n]
        return self.out[self.cached - len(self.ids):][:n]


@dataclass
class StepResult:
    """What one ``step`` did: tokens emitted, sequences ended, and the size of its forward pass."""

    emitted: list[tuple[Sequence, int]] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)   # reached max_new_tokens or failed
    dropped: list[Sequence] = field(default_factory=list)    # cancelled, left without an answer
    rows: int = 0            # sequences in the forward pass
    chunks: int = 0          # prompt chunks among them
    tokens: int = 0          # tokens the pass computed
    prefix_hit: int = 0      # prompt tokens admitted this step whose keys came from the prefix cache
    prefix_lookup: int = 0   # prompt tokens admitted this step
    prefix_s: float = 0.0    # seconds spent filing and loading prefix blocks
    forward_s: float = 0.0   # seconds in the forward pass


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    """Return a token id drawn from ``softmax(logits / temperature)`` (the argmax if that is no distribution).

    The division happens in float32, and probabilities that are not finite (a tiny temperature
    overflows the scaled logits to infinity) fall back to greedy decoding, which is what such a
    temperature asks for anyway, instead of making ``torch.multinomial`` raise.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def sampling_generator(temperature: float, seed: int | None) -> torch.Generator | None:
    """Return a sequence's sampling generator: None when greedy (temperature 0), else one seeded
    with ``seed``, or at random when there is none."""
    if temperature <= 0:
        return None
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
    return generator


class EngineCore:
    """Continuous batching over one KV cache; call ``add`` to queue a sequence and ``step`` to run."""

    def __init__(self, model: TinyGPT, capacity: int, max_len: int, token_budget: int = 256,
                 prefix_cache_bytes: int = 0, join_running: bool = True,
                 decode_core: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None) -> None:
        """``capacity`` rows of ``max_len`` positions; ``token_budget`` tokens per forward pass at most
        (each decoding sequence counts one, prompts get the rest, at least one token); with
        ``join_running`` False newcomers wait until the batch is empty (static batching);
        ``decode_core`` (a compiled ``models.gpt.decode_core``) runs steps that only decode."""
        if capacity < 1 or token_budget < 1:
            raise ValueError(f"capacity and token_budget must be >= 1, got {capacity}, {token_budget}")
        self.model = model.eval()
        self.capacity, self.max_len, self.token_budget = capacity, max_len, token_budget
        self.join_running = join_running
        self.cache = KVCache(model.config, capacity, max_len=max_len)
        self.prefix = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.decode_core = decode_core
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []    # running[i] lives in cache row i
        self._to_file: list[Sequence] = []   # prompts computed last step, blocks not filed yet
        self._rows: list[int] = []           # cache rows of this step's plan, in plan order
        self.steps = 0

    # ---- the public surface ---------------------------------------------------------
    def add(self, seq: Sequence) -> Sequence:
        """Queue ``seq``; raises ``ValueError`` when it is empty or cannot fit a cache row."""
        if not seq.ids or seq.max_new_tokens < 1:
            raise ValueError("a sequence needs at least one prompt token and max_new_tokens >= 1")
        if len(seq.ids) + seq.max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(seq.ids)}) + max_new_tokens ({seq.max_new_tokens}) exceeds "
                             f"the cache rows' {self.max_len} positions")
        self.waiting.append(seq)
        return seq

    def has_work(self) -> bool:
        """Return whether any sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def step(self) -> StepResult:
        """Run one scheduler step (see the module docstring); a failure of the forward pass raises,
        and the caller decides what happens to ``running`` (``abort`` ends them all)."""
        res = StepResult()
        self._file_prefixes(res)
        self._drop_cancelled(res)
        self._retire(res)               # rows whose caller cancelled since the last step
        self._admit(res)
        plan = self._plan()
        if plan:
            logits = self._run(plan, res)
            self._emit(plan, logits, res)
        self._retire(res)
        return res

    def abort(self) -> list[Sequence]:
        """End every running sequence (after a failed step) and return them; the cache starts empty."""
        ended = self.running
        for seq in ended:
            seq.finished = True
        self.running, self._to_file = [], []
        self.cache.clear()
        return ended

    def generate(self, prompts: Iterable[list[int]], max_new_tokens: int | list[int], temperature: float = 0.0,
                 seed: int | None = None) -> list[list[int]]:
        """Return each prompt's answer tokens, all decoded together (no threads, no event loop).

        ``max_new_tokens`` is one number for every prompt or one per prompt; with ``temperature`` > 0,
        prompt ``i`` samples with seed ``seed + i`` (at random without a seed)."""
        prompts = [list(p) for p in prompts]
        counts = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(counts) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(counts)} max_new_tokens")
        seqs = [self.add(Sequence(p, n, temperature, sampling_generator(temperature, None if seed is None else seed + i)))
                for i, (p, n) in enumerate(zip(prompts, counts))]
        while any(not s.finished for s in seqs):
            self.step()
        failed = [s.error for s in seqs if s.error]
        if failed:
            raise RuntimeError(f"generation failed: {failed[0]}")
        return [s.out for s in seqs]

    # ---- the phases of a step -------------------------------------------------------
    def _file_prefixes(self, res: StepResult) -> None:
        """File the blocks of prompts whose first token went out last step."""
        if self.prefix is None or not self._to_file:
            return
        t0 = time.perf_counter()
        for seq in self._to_file:
            if seq in self.running:
                self._file(seq, self.running.index(seq))
        self._to_file = []
        res.prefix_s += time.perf_counter() - t0

    def _file(self, seq: Sequence, row: int) -> None:
        try:
            self.prefix.store(seq.ids, self.cache, row)  # type: ignore[union-attr]
        except Exception as err:  # the answer is unaffected; the cache just misses this prompt
            log.warning("could not file a prompt in the prefix cache", exc_info=err)

    def _drop_cancelled(self, res: StepResult) -> None:
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            seq.finished = True
            res.dropped.append(seq)

    def _admit(self, res: StepResult) -> None:
        """Move waiting sequences into free rows (all of them at once under static batching)."""
        if not self.join_running and self.running:
            return
        while self.waiting and len(self.running) < self.capacity:
            seq = self.waiting.popleft()
            row = len(self.running)
            self.running.append(seq)
            self.cache.lengths[row] = 0
            if self.prefix is not None:
                t0 = time.perf_counter()
                try:
                    seq.cached = self.prefix.load(seq.ids, self.cache, row)
                except Exception as err:  # a miss, not a failure
                    log.warning("prefix cache lookup failed", exc_info=err)
                    seq.cached = 0
                res.prefix_s += time.perf_counter() - t0
                res.prefix_hit += seq.cached
                res.prefix_lookup += len(seq.ids)

    def _plan(self) -> list[tuple[Sequence, int]]:
        """Return (sequence, tokens to compute) for this step: every decoding sequence gets one token,
        prompts share what is left of the budget in arrival order. The one-token entries come first,
        in rows 0 .. d-1 (the forward pass reads those rows in place), then the prompt chunks."""
        counts = [int(s.todo() == 1 and not s.cancelled) for s in self.running]   # decoding: one token
        left = max(self.token_budget - sum(counts), 1)
        for row, seq in enumerate(self.running):
            todo = seq.todo()
            if todo > 1 and not seq.cancelled and left > 0:
                counts[row] = min(todo, left)
                left -= counts[row]
        d = counts.count(1)
        holes = [row for row in range(d) if counts[row] != 1]
        misplaced = [row for row in range(d, len(counts)) if counts[row] == 1]
        for a, b in zip(holes, misplaced):
            self.cache.swap_rows(a, b)
            self.running[a], self.running[b] = self.running[b], self.running[a]
            counts[a], counts[b] = counts[b], counts[a]
        self._rows = [row for row, n in enumerate(counts) if n == 1] + [row for row, n in enumerate(counts) if n > 1]
        return [(self.running[row], counts[row]) for row in self._rows]

    def _run(self, plan: list[tuple[Sequence, int]], res: StepResult) -> torch.Tensor:
        """One forward pass for the plan; return logits, one row per planned sequence."""
        t0 = time.perf_counter()
        try:
            logits = self._forward(plan, self._rows)
        except Exception as err:
            if len(plan) == 1:
                raise
            logits = self._isolate(plan, err)
        res.forward_s = time.perf_counter() - t0
        res.rows, res.chunks, res.tokens = len(plan), sum(n > 1 for _, n in plan), sum(n for _, n in plan)
        self.steps += 1
        return logits

    def _forward(self, plan: list[tuple[Sequence, int]], rows: list[int]) -> torch.Tensor:
        """Run the model once for ``plan`` (its sequences in cache ``rows``); return logits ``(len(plan), vocab)``."""
        if self.decode_core is not None and all(n == 1 for _, n in plan) and len(plan) == len(self.running):
            last = torch.tensor([s.next_tokens(1)[0] for s, _ in plan])                    # (n,)
            return decode_step(self.model, last, self.cache, core=self.decode_core)       # (n, vocab)
        return mixed_step(self.model, self.cache, rows, [s.next_tokens(n) for s, n in plan],
                          [s.cached for s, _ in plan])                                     # (m, vocab)

    def _isolate(self, plan: list[tuple[Sequence, int]], err: Exception) -> torch.Tensor:
        """After a failed pass, run its decoding rows together and each prompt chunk alone, so a
        failure ends only the sequences it belongs to (their ``error`` says so). A pass that fails
        writes no cache length, so running a group again is safe."""
        log.warning("a forward pass of %d sequences failed (%s); running them in groups", len(plan), err)
        d = sum(n == 1 for _, n in plan)
        groups = ([(plan[:d], self._rows[:d])] if d else []) + [
            ([item], [row]) for item, row in zip(plan[d:], self._rows[d:])]
        parts = []
        for group, rows in groups:
            try:
                parts.append(self._forward(group, rows))
            except Exception as group_err:
                log.error("generation failed for %d sequence(s)", len(group), exc_info=group_err)
                for seq, _ in group:
                    seq.error = f"generation failed ({type(group_err).__name__}); see the server log"
                parts.append(torch.zeros(len(group), self.model.config.vocab_size))
        return torch.cat(parts)

    def _emit(self, plan: list[tuple[Sequence, int]], logits: torch.Tensor, res: StepResult) -> None:
        """Pick the next token of every sequence whose tokens are now all computed."""
        greedy = logits.argmax(dim=-1).tolist()                                            # (m,)
        for i, (seq, n) in enumerate(plan):
            if seq.error is not None:   # its group failed: it leaves at retire
                continue
            seq.cached += n
            if seq.todo() > 0:          # a prompt chunk that is not the last: no token yet
                continue
            tok = greedy[i]
            if seq.temperature > 0:
                try:
                    tok = sample_token(logits[i], seq.temperature, seq.generator)
                except Exception as err:  # only this sequence is affected
                    log.error("sampling failed", exc_info=err)
                    seq.error = f"sampling failed ({type(err).__name__}); see the server log"
                    continue
            if not seq.out and self.prefix is not None:
                self._to_file.append(seq)
            seq.out.append(tok)
            res.emitted.append((seq, tok))

    def _retire(self, res: StepResult) -> None:
        """Drop finished, failed and cancelled rows, moving the last row into each hole."""
        for r in range(len(self.running) - 1, -1, -1):
            seq = self.running[r]
            if seq.cancelled:
                res.dropped.append(seq)
            elif seq.error is not None or seq.generated >= seq.max_new_tokens:
                res.finished.append(seq)
                if seq in self._to_file and seq.error is None:  # ends before its blocks were filed
                    self._file(seq, r)
            else:
                continue
            seq.finished = True
            if seq in self._to_file:
                self._to_file.remove(seq)
            last = len(self.running) - 1
            if r != last:
                self.cache.move_row(last, r)
                self.running[r] = self.running[last]
            self.running.pop()
            self.cache.lengths[last] = 0
