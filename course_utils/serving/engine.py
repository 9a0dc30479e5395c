"""The generation worker: one thread owns the model and decodes batches of requests.

Requests arrive on a bounded ``queue.Queue`` (full → the route answers 503). The worker:

- "iteration" batching: at every decoding step, admits waiting requests into free rows of
  the KV cache (one right-padded prefill for all newcomers), decodes one token for every
  live row, and drops rows that finished or whose client went away;
- "static": collects up to ``max_batch_size`` requests within ``max_wait_ms`` and decodes
  that batch until every row is done before admitting anyone (the simple design);
- "none": one request at a time (the unbatched baseline).

Tokens go back to the asyncio loop in one ``loop.call_soon_threadsafe`` per step, into each
request's ``asyncio.Queue`` as ``("token", id)``, then ``("end", info)`` or ``("error", info)``
(``info["status"]``: 503 for a shutdown, 500 for a failure).

A failure ends only the requests it touches: sampling one row fails that row, a prefill its
newcomers, a decoding step the running batch; the worker logs it and goes on serving. Only
if the worker thread itself dies does the engine stop: ``failure`` then says why (``/health``
reports it) and every later request gets 503.

Prefix caching (``prefix_cache_mb``, on by default, 0 turns it off): the full 16-token blocks of
every prompt prefilled are kept (keys and values, every layer) in a ``PrefixCache`` under chained
hashes; a newcomer whose prompt starts with known blocks gets them copied into its row and
prefills only the rest (always at least its last token); a prompt's blocks are filed at the next step,
after its first token went out, so filing never delays it. Greedy outputs are the same with and
without it; ``serve_prefix_cache_hit_tokens`` / ``serve_prefix_cache_lookup_tokens`` on /metrics
say how much prompt work it saved.

No paged KV cache: each sequence keeps one row of ``max_prompt_chars + max_new_tokens_limit``
positions. At the defaults that is 32 rows x 512 positions x 4 KiB = 64 MiB, small for a CPU
machine, while a paged cache must gather each row's blocks before attention (torch has no CPU
kernel that reads them in place): measured on a 2-core machine (1 torch thread), one
decoding step took 5-7.5x as long with the gather (8 rows of 128 tokens: 4.6 ms against 0.93 ms;
32 rows of 384: 40 ms against 5.8 ms), for a memory saving this server does not need.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models.gpt import KVCache, TinyGPT, decode_core, decode_step, pad_prompts, prefill
from .metrics import ServingMetrics
from .prefix_cache import PrefixCache
from .settings import ServeSettings

Event = tuple[str, Any]
log = logging.getLogger(__name__)

#: Sampling temperatures: 0 is greedy; otherwise between these (the request schema enforces it).
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0


class QueueFull(RuntimeError):
    """The request queue is full; retry later (HTTP 503)."""


class ShuttingDown(RuntimeError):
    """The server is stopping and accepts no new work (HTTP 503)."""


#: What a cancelled request counts as in ``serve_requests_total`` (see ``GenRequest.cancel``).
CANCEL_OUTCOMES = ("cancelled", "ok")


@dataclass(eq=False)
class GenRequest:
    """One generation request, shared by the route (event loop) and the worker thread."""

    ids: list[int]
    max_new_tokens: int
    temperature: float
    seed: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    generated: int = 0
    cancelled: bool = False
    finished: bool = False
    generator: torch.Generator | None = None
    end_outcome: str = "cancelled"

    def cancel(self, outcome: str = "cancelled") -> None:
        """Ask the worker to drop this request at its next step.

        ``outcome`` is what ``serve_requests_total`` counts it as: ``"cancelled"`` (client gone,
        timeout) or ``"ok"`` when the caller already has its whole answer (a stop string matched).
        The first call decides; later calls (a handler's clean-up) change nothing.
        """
        if outcome not in CANCEL_OUTCOMES:
            raise ValueError(f"outcome must be one of {CANCEL_OUTCOMES}, got {outcome!r}")
        if not self.cancelled:
            self.end_outcome = outcome
        self.cancelled = True


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
    """Return a request's sampling generator: None when greedy (temperature 0), else one seeded
    with ``seed``, or at random when there is none. Both servers (this engine, LitServe) seed so."""
    if temperature <= 0:
        return None
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
    return generator


def check_limits(settings: ServeSettings, model: TinyGPT) -> None:
    """Raise ``ValueError`` when the longest allowed prompt plus its new tokens does not fit the
    model's ``block_size``; both servers (this engine, LitServe) refuse to start then."""
    longest = settings.max_prompt_chars + settings.max_new_tokens_limit
    if longest > model.config.block_size:
        raise ValueError(f"max_prompt_chars + max_new_tokens_limit = {longest} exceeds the model's "
                         f"block_size {model.config.block_size}")


def _deliver(batch: list[tuple[GenRequest, Event]]) -> None:
    for req, event in batch:
        req.events.put_nowait(event)


class GenerationEngine:
    """Owns the model, the KV cache and the worker thread; ``submit`` is called from the loop."""

    def __init__(self, model: TinyGPT, settings: ServeSettings, metrics: ServingMetrics) -> None:
        self.model = model.eval()
        self.settings = settings
        self.metrics = metrics
        self.capacity = settings.batch_capacity
        check_limits(settings, model)
        self.max_len = settings.max_prompt_chars + settings.max_new_tokens_limit
        self.queue: queue.Queue[GenRequest] = queue.Queue(maxsize=settings.queue_size)
        self.rows: list[GenRequest] = []
        self.cache = KVCache(model.config, self.capacity, max_len=self.max_len)
        self.last = torch.zeros(self.capacity, dtype=torch.long)
        mib = settings.prefix_cache_mb
        self.prefix: PrefixCache | None = PrefixCache(int(mib * 2**20)) if mib > 0 else None
        self._to_store: list[GenRequest] = []  # prefilled at the last step, blocks not filed yet
        # Compile only the tensor work of a step (decode_core); decode_step keeps the
        # bookkeeping that reads Python numbers out of tensors, which would break the graph.
        self._core: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = (
            torch.compile(decode_core, dynamic=True) if settings.compile else None)
        self._stopping = threading.Event()
        self._urgent: set[GenRequest] = set()  # requests whose events should not wait for the interval
        self._handed_state = (0, 0)  # (rows, queued) at the last hand-over to the loop
        self._stop_detail = "server shutting down"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: str | None = None
        self.steps = 0
        self.errors = 0  # failures that ended some requests while the worker went on
        metrics.queue_depth.set_function(self.queue.qsize)
        metrics.active.set_function(lambda: len(self.rows))
        metrics.prefix_bytes.set_function(lambda: self.prefix.bytes if self.prefix is not None else 0)

    def warm_up(self) -> float:
        """Compile the decoding step before traffic arrives (when ``compile`` is on), so no
        client waits for it; returns the seconds spent. Batch sizes 1 and 3 cover both graphs
        ``torch.compile(dynamic=True)`` makes (it specialises size 1)."""
        if self._core is None:
            return 0.0
        start = time.perf_counter()
        torch.set_num_threads(self.settings.torch_threads)
        # Mirror the worker exactly: a cache and a token buffer made outside inference mode
        # (like self.cache and self.last), sliced to the live rows; guards check all of that.
        scratch = KVCache(self.model.config, self.capacity, max_len=self.max_len)
        last = torch.zeros(self.capacity, dtype=torch.long)
        # batch 1, then batch 3 with 6-token prompts: no two sizes equal and none below 2, so
        # the dynamic graph does not tie sizes that merely happen to match
        for n, prompt in ((1, 6), (3, 6)):
            with torch.inference_mode():
                prefill(self.model, torch.zeros(n, prompt, dtype=torch.long), torch.full((n,), prompt), scratch)
                decode_step(self.model, last[:n], scratch, core=self._core)
        return time.perf_counter() - start

    # ---- called from the event loop -------------------------------------------------
    @property
    def accepting(self) -> bool:
        """Whether new requests are taken (false once shutdown began)."""
        return not self._stopping.is_set()

    @property
    def failure(self) -> str | None:
        """Return why the worker cannot serve (its thread died), or None while it can."""
        if self._failure is None and self._thread is not None and not self._thread.is_alive() \
                and not self._stopping.is_set():
            return "the generation worker is not running"
        return self._failure

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker thread; tokens are handed to ``loop``."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="course-serving-generate", daemon=True)
        self._thread.start()

    def submit(self, ids: list[int], max_new_tokens: int, temperature: float = 0.0,
               seed: int | None = None) -> GenRequest:
        """Queue a request; raises ``QueueFull`` or ``ShuttingDown``."""
        if not self.accepting:
            raise ShuttingDown(self._stop_detail)
        assert self._loop is not None, "engine not started"
        req = GenRequest(ids, max_new_tokens, temperature, seed, self._loop,
                         generator=sampling_generator(temperature, seed))
        try:
            self.queue.put_nowait(req)
        except queue.Full:
            self.metrics.requests.labels("rejected").inc()
            raise QueueFull(f"the request queue is full ({self.settings.queue_size} waiting)") from None
        return req

    def begin_shutdown(self, detail: str = "server shutting down") -> None:
        """Stop taking requests; the worker ends every queued and running one with an error."""
        self._stop_detail = detail
        self._stopping.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Begin shutdown and wait for the worker thread to finish."""
        self.begin_shutdown(self._stop_detail)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the generation worker did not stop within {timeout} s")

    # ---- the worker thread ------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.settings.torch_threads)
        out: list[tuple[GenRequest, Event]] = []
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    try:
                        self._serve(out)
                    except Exception as err:  # a whole step failed: end the batch's requests, go on
                        self._fail(self.rows, out, err)
                        self.rows.clear()
                        self._to_store.clear()
                        self.cache.clear()
                        self._flush(out)
        except BaseException as err:  # the worker dies: say so loudly, keep clients informed
            self._failure = f"generation worker stopped: {type(err).__name__}: {err}"
            log.critical("%s", self._failure, exc_info=err)
            self._stop_detail = self._failure
            self._stopping.set()
            raise
        finally:
            self._fail_everything(out, self._stop_detail)
            self._flush(out)

    def _serve(self, out: list[tuple[GenRequest, Event]]) -> None:
        """Admit, decode and hand out tokens until shutdown begins."""
        interval = self.settings.stream_interval_ms / 1000
        last_flush = time.perf_counter()
        phase = self.metrics.engine_seconds
        t_prefill, t_decode, t_idle, t_other = (phase.labels(p) for p in ("prefill", "decode", "idle", "other"))
        while not self._stopping.is_set():
            t0 = time.perf_counter()
            busy = bool(self.rows)
            prefill_s = self._admit(out)
            t1 = time.perf_counter()
            (t_other if busy else t_idle).inc(t1 - t0 - prefill_s)
            t_prefill.inc(prefill_s)
            if self.rows:
                decode_s = self._decode(out)
                t_decode.inc(decode_s)
                t2 = time.perf_counter()
                if not self.rows or t2 - last_flush >= interval:
                    self._flush(out)
                    last_flush = t2
                elif self._urgent:
                    self._flush_urgent(out)
                t_other.inc(time.perf_counter() - t2 + (t2 - t1 - decode_s))
            else:
                self._flush(out)

    def _fail(self, reqs: list[GenRequest], out: list[tuple[GenRequest, Event]], err: Exception) -> None:
        """End ``reqs`` with an error event after ``err`` (logged); their rows leave at the next retire."""
        self.errors += 1
        log.error("generation failed for %d request(s)", len(reqs), exc_info=err)
        detail = f"generation failed ({type(err).__name__}); see the server log"
        for req in list(reqs):
            self._finish(req, out, ("error", {"detail": detail, "status": 500}), "error")
            req.cancelled = True

    def _flush_urgent(self, out: list[tuple[GenRequest, Event]]) -> None:
        """Send now everything of requests that just started or ended (TTFT, free slots sooner)."""
        urgent = self._urgent
        now = [item for item in out if item[0] in urgent]
        out[:] = [item for item in out if item[0] not in urgent]
        urgent.clear()
        self._flush(now)

    def _flush(self, out: list[tuple[GenRequest, Event]]) -> None:
        """Hand ``out``'s events to the loop. An empty hand-over still goes when the rows or the queue
        changed without an event (a cancelled request leaves silently), so a loop that reports them
        (the engine process's pipe) is never left with a stale count."""
        self._urgent.clear()
        state = (len(self.rows), self.queue.qsize())
        if not out and state == self._handed_state:
            return
        self._handed_state = state
        batch = out[:]
        out.clear()
        try:
            self._loop.call_soon_threadsafe(_deliver, batch)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _fail_everything(self, out: list[tuple[GenRequest, Event]], detail: str) -> None:
        for req in self.rows:
            self._finish(req, out, ("error", {"detail": detail, "status": 503}), "shutdown")
        self.rows.clear()
        self._to_store.clear()
        self.cache.clear()
        while True:
            try:
                req = self.queue.get_nowait()
            except queue.Empty:
                break
            self._finish(req, out, ("error", {"detail": detail, "status": 503}), "shutdown")

    def _take(self, block: bool, timeout: float) -> GenRequest | None:
        """Return the next live queued request, or None (dropping cancelled/expired ones)."""
        deadline = time.perf_counter() + timeout
        while True:
            try:
                remaining = deadline - time.perf_counter()
                if block and remaining > 0:
                    req = self.queue.get(timeout=remaining)
                else:
                    req = self.queue.get_nowait()
            except queue.Empty:
                return None
            if req.cancelled:
                self.metrics.requests.labels(req.end_outcome).inc()
                continue
            if time.perf_counter() - req.arrived > self.settings.queue_timeout_s:
                self.metrics.requests.labels("timeout").inc()
                continue
            return req

    def _admit(self, out: list[tuple[GenRequest, Event]]) -> float:
        """Admit waiting requests (per the batching policy); return seconds spent in prefill (and
        in filing the last step's prompts in the prefix cache)."""
        stored_s = 0.0
        if self._to_store:
            start = time.perf_counter()
            self._store_prefixes(out)
            stored_s = time.perf_counter() - start
        free = self.capacity - len(self.rows)
        if free <= 0 or (self.settings.batching != "iteration" and self.rows):
            return stored_s
        newcomers: list[GenRequest] = []
        if not self.rows:  # idle: wait for a first request, then up to max_wait for company
            first = self._take(block=True, timeout=0.05)
            if first is None:
                return stored_s
            newcomers.append(first)
            # static batching waits up to max_wait_ms for company; iteration-level batching
            # does not need to, since latecomers join at the next step anyway
            wait_ms = self.settings.max_wait_ms if self.settings.batching == "static" else 0.0
            deadline = time.perf_counter() + wait_ms / 1000
            while len(newcomers) < free:
                nxt = self._take(block=True, timeout=deadline - time.perf_counter())
                if nxt is None:
                    break
                newcomers.append(nxt)
        else:  # iteration-level: whoever is waiting joins at this step
            while len(newcomers) < free:
                nxt = self._take(block=False, timeout=0)
                if nxt is None:
                    break
                newcomers.append(nxt)
        if not newcomers:
            return stored_s
        start = time.perf_counter()
        self._prefill(newcomers, out)
        return stored_s + time.perf_counter() - start

    def _prefill(self, reqs: list[GenRequest], out: list[tuple[GenRequest, Event]]) -> None:
        first_row = len(self.rows)
        try:
            starts = self._load_prefixes(reqs, first_row)
            idx, lengths = pad_prompts([r.ids[s:] for r, s in zip(reqs, starts)])
            logits = prefill(self.model, idx, lengths, self.cache, first_row=first_row,
                             start=torch.tensor(starts) if any(starts) else None)
        except Exception as err:  # only the newcomers are affected; the running rows go on
            self.cache.lengths[first_row:first_row + len(reqs)] = 0
            self._fail(reqs, out, err)
            return
        self.metrics.prefill_size.observe(len(reqs))
        self.rows.extend(reqs)
        if self.prefix is not None:  # filed at the next step, once their first tokens are out
            self._to_store.extend(reqs)
        self._emit(logits, first_row, out)

    def _store_prefixes(self, out: list[tuple[GenRequest, Event]]) -> None:
        """File the prompt blocks of the rows prefilled at the last step in the prefix cache (after
        their first tokens went out, so filing does not delay them)."""
        reqs, self._to_store = self._to_store, []
        assert self.prefix is not None
        live = [req for req in reqs if req in self.rows]
        try:
            for req in live:
                self.prefix.store(req.ids, self.cache, self.rows.index(req))
        except Exception as err:  # only these requests are affected
            self._fail(live, out, err)

    def _load_prefixes(self, reqs: list[GenRequest], first_row: int) -> list[int]:
        """Copy each newcomer's longest cached prefix into its row; return how many tokens each got."""
        if self.prefix is None:
            return [0] * len(reqs)
        starts = [self.prefix.load(req.ids, self.cache, first_row + i) for i, req in enumerate(reqs)]
        self.metrics.prefix_lookup_tokens.inc(sum(len(req.ids) for req in reqs))
        self.metrics.prefix_hit_tokens.inc(sum(starts))
        return starts

    def _decode(self, out: list[tuple[GenRequest, Event]]) -> float:
        """One decoding step for every live row; return the seconds the model took."""
        n = len(self.rows)
        start = time.perf_counter()
        logits = decode_step(self.model, self.last[:n], self.cache, core=self._core)
        took = time.perf_counter() - start
        self.metrics.batch_size.observe(n)
        self.steps += 1
        self._emit(logits, 0, out)
        return took

    def _emit(self, logits: torch.Tensor, first_row: int, out: list[tuple[GenRequest, Event]]) -> None:
        """Pick the next token of rows ``first_row ..``, queue them, retire finished rows."""
        nxt = logits.argmax(dim=-1)
        rows = self.rows[first_row:first_row + logits.shape[0]]
        for i, req in enumerate(rows):
            if req.temperature > 0 and not req.cancelled:
                try:
                    nxt[i] = sample_token(logits[i], req.temperature, req.generator)
                except Exception as err:  # only this row is affected
                    self._fail([req], out, err)
        self.last[first_row:first_row + len(rows)] = nxt
        now = time.perf_counter()
        for req, tok in zip(rows, nxt.tolist()):
            if req.cancelled:
                continue
            if req.first_token_at is None:
                req.first_token_at = now
                self._urgent.add(req)
                self.metrics.ttft.observe(now - req.arrived)
            req.generated += 1
            out.append((req, ("token", tok)))
        self.metrics.tokens.inc(len(rows))
        self.metrics.token_rate.add(len(rows))
        self._retire(out)

    def _retire(self, out: list[tuple[GenRequest, Event]]) -> None:
        """Drop finished and cancelled rows, moving the last live row into each hole."""
        for r in range(len(self.rows) - 1, -1, -1):
            req = self.rows[r]
            if req.cancelled:
                if req.end_outcome == "ok" and not req.finished:
                    self.metrics.latency.observe(time.perf_counter() - req.arrived)
                self._finish(req, out, None, req.end_outcome)
            elif req.generated >= req.max_new_tokens:
                now = time.perf_counter()
                info = {"reason": "length", "tokens": req.generated,
                        "ttft_ms": round(1e3 * ((req.first_token_at or now) - req.arrived), 3),
                        "latency_ms": round(1e3 * (now - req.arrived), 3)}
                self.metrics.latency.observe(now - req.arrived)
                self._finish(req, out, ("end", info), "ok")
            else:
                continue
            if req in self._to_store:  # it ends before its blocks were filed: file them now
                self._to_store.remove(req)
                if not req.cancelled:
                    try:
                        self.prefix.store(req.ids, self.cache, r)  # type: ignore[union-attr]
                    except Exception as err:  # its answer is complete; the cache just misses it
                        log.warning("could not file a prompt in the prefix cache", exc_info=err)
            last = len(self.rows) - 1
            if r != last:
                self.cache.move_row(last, r)
                self.last[r] = self.last[last]
                self.rows[r] = self.rows[last]
            self.rows.pop()
            self.cache.lengths[last] = 0

    def _finish(self, req: GenRequest, out: list[tuple[GenRequest, Event]], event: Event | None,
                outcome: str) -> None:
        if req.finished:
            return
        req.finished = True
        self.metrics.requests.labels(outcome).inc()
        if event is not None:
            out.append((req, event))
            self._urgent.add(req)
