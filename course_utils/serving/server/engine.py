"""The server's generation worker: a thread that drives ``core.EngineCore`` and hands its tokens to asyncio.

The scheduling, the KV cache, prefix caching and sampling are the core's (``core.py``, read that
first). This module adds what a server needs around it:

- a bounded ``queue.Queue`` of requests (full → the route answers 503) and a queue timeout;
- the batching policy: "iteration" (newcomers join the running batch at the next step), "static"
  (collect up to ``max_batch_size`` within ``max_wait_ms``, run that batch to the end) or "none"
  (one request at a time);
- delivery: each step's events go to the asyncio loop in one ``loop.call_soon_threadsafe``, at most
  every ``stream_interval_ms`` (a request's first and last events go at once), into each request's
  ``asyncio.Queue`` as ``("token", id)``, then ``("end", info)`` or ``("error", info)``
  (``info["status"]``: 503 for a shutdown, 500 for a failure);
- Prometheus counters (``ServingMetrics``).

A failure ends only the requests it touches: sampling one row fails that row, a failed forward pass
the running batch; the worker logs it and goes on serving. Only if the worker thread itself dies
does the engine stop: ``failure`` then says why (``/health`` reports it) and later requests get 503.
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

from ...models.gpt import TinyGPT, decode_core
from ..core import EngineCore, Sequence, StepResult, sample_token, sampling_generator
from .metrics import ServingMetrics
from .settings import ServeSettings

Event = tuple[str, Any]
log = logging.getLogger(__name__)

__all__ = ["GenerationEngine", "GenRequest", "QueueFull", "ShuttingDown", "check_limits",
           "sample_token", "sampling_generator", "MIN_TEMPERATURE", "MAX_TEMPERATURE"]

#: Sampling temperatures: 0 is greedy; otherwise between these (the request schema enforces it).
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0
#: What a cancelled request counts as in ``serve_requests_total`` (see ``GenRequest.cancel``).
CANCEL_OUTCOMES = ("cancelled", "ok")


class QueueFull(RuntimeError):
    """The request queue is full; retry later (HTTP 503)."""


class ShuttingDown(RuntimeError):
    """The server is stopping and accepts no new work (HTTP 503)."""


@dataclass(eq=False, kw_only=True)
class GenRequest(Sequence):
    """A ``Sequence`` plus what the route (event loop) needs: its event queue and its timings."""

    seed: int | None = None
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    end_outcome: str = "cancelled"
    answered: bool = False          # its last event (end or error) was queued

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
    """Owns the core and the worker thread; ``submit`` is called from the event loop."""

    def __init__(self, model: TinyGPT, settings: ServeSettings, metrics: ServingMetrics) -> None:
        check_limits(settings, model)
        self.model = model.eval()
        self.settings = settings
        self.metrics = metrics
        self.capacity = settings.batch_capacity
        self.max_len = settings.max_prompt_chars + settings.max_new_tokens_limit
        # Compile only the tensor work of a decoding step (decode_core); steps with prompt tokens run eager.
        self._compiled: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = (
            torch.compile(decode_core, dynamic=True) if settings.compile else None)
        self.core = EngineCore(model, self.capacity, self.max_len, token_budget=settings.token_budget,
                               prefix_cache_bytes=int(settings.prefix_cache_mb * 2**20),
                               join_running=settings.batching == "iteration", decode_core=self._compiled)
        self.queue: queue.Queue[GenRequest] = queue.Queue(maxsize=settings.queue_size)
        self._stopping = threading.Event()
        self._urgent: set[GenRequest] = set()  # requests whose events should not wait for the interval
        self._handed_state = (0, 0)  # (rows, queued) at the last hand-over to the loop
        self._stop_detail = "server shutting down"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: str | None = None
        self.errors = 0  # failures that ended some requests while the worker went on
        metrics.queue_depth.set_function(lambda: self.queued)
        metrics.active.set_function(lambda: len(self.core.running))
        metrics.prefix_bytes.set_function(lambda: self.core.prefix.bytes if self.core.prefix is not None else 0)

    @property
    def rows(self) -> list[Sequence]:
        """Return the sequences in the running batch (row order)."""
        return self.core.running

    @property
    def queued(self) -> int:
        """Return how many requests wait for a row (in the queue or admitted to the core, not yet running)."""
        return self.queue.qsize() + len(self.core.waiting)

    def warm_up(self) -> float:
        """Compile the decoding step before traffic arrives (when ``compile`` is on), so no
        client waits for it; returns the seconds spent. Batch sizes 1 and 3 cover both graphs
        ``torch.compile(dynamic=True)`` makes (it specialises size 1)."""
        if self._compiled is None:
            return 0.0
        start = time.perf_counter()
        torch.set_num_threads(self.settings.torch_threads)
        # A scratch core built like the real one, so every guard sees the same kind of tensors:
        # batch 1, then 3 (none below 2 after the first, so sizes that merely match are not tied).
        scratch = EngineCore(self.model, self.capacity, self.max_len, decode_core=self._compiled)
        with torch.inference_mode():
            for n in (1, 3):
                scratch.generate([[0] * 6] * n, max_new_tokens=3)
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
        req = GenRequest(ids=ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         loop=self._loop, generator=sampling_generator(temperature, seed))
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
                        self._fail(self.core.abort(), out, err)  # type: ignore[arg-type]
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
        """Take requests, step the core and hand out events until shutdown begins."""
        interval = self.settings.stream_interval_ms / 1000
        last_flush = time.perf_counter()
        phase = self.metrics.engine_seconds
        t_forward, t_prefix, t_idle, t_other = (phase.labels(p) for p in ("forward", "prefix", "idle", "other"))
        while not self._stopping.is_set():
            t0 = time.perf_counter()
            busy = self.core.has_work()
            self._intake()
            if not self.core.has_work():
                t_idle.inc(time.perf_counter() - t0)
                self._flush(out)
                continue
            res = self.core.step()
            self._account(res, out)
            t1 = time.perf_counter()
            if not self.core.running or t1 - last_flush >= interval:
                self._flush(out)
                last_flush = t1
            elif self._urgent:
                self._flush_urgent(out)
            t_forward.inc(res.forward_s)
            t_prefix.inc(res.prefix_s)
            spent = time.perf_counter() - t0 - res.forward_s - res.prefix_s
            (t_other if busy else t_idle).inc(max(spent, 0.0))

    def _intake(self) -> None:
        """Move queued requests into the core: as many as it has free rows for; when it is idle, wait
        briefly for a first one (and, batching statically, up to ``max_wait_ms`` for company)."""
        core = self.core
        if core.running and not core.join_running:
            return
        free = self.capacity - len(core.running) - len(core.waiting)
        idle = not core.has_work()
        wait_s = self.settings.max_wait_ms / 1000 if self.settings.batching == "static" else 0.0
        deadline = 0.0
        while free > 0:
            if idle and not core.waiting:
                req = self._take(timeout=0.05)
                deadline = time.perf_counter() + wait_s  # company may join until then
            else:
                req = self._take(timeout=deadline - time.perf_counter() if idle else 0.0)
            if req is None:
                return
            core.add(req)
            free -= 1

    def _take(self, timeout: float) -> GenRequest | None:
        """Return the next live queued request, or None (dropping cancelled/expired ones)."""
        deadline = time.perf_counter() + timeout
        while True:
            try:
                remaining = deadline - time.perf_counter()
                req = self.queue.get(timeout=remaining) if remaining > 0 else self.queue.get_nowait()
            except queue.Empty:
                return None
            if req.cancelled:
                self._finish(req, [], None, req.end_outcome)
            elif time.perf_counter() - req.arrived > self.settings.queue_timeout_s:
                self._finish(req, [], None, "timeout")
            else:
                return req

    def _account(self, res: StepResult, out: list[tuple[GenRequest, Event]]) -> None:
        """Turn one step's result into events and metrics."""
        m = self.metrics
        now = time.perf_counter()
        if res.rows:
            m.batch_size.observe(res.rows)
        if res.chunks:
            m.prefill_size.observe(res.chunks)
        m.prefix_lookup_tokens.inc(res.prefix_lookup)
        m.prefix_hit_tokens.inc(res.prefix_hit)
        for req, tok in res.emitted:
            if req.first_token_at is None:  # type: ignore[attr-defined]
                req.first_token_at = now  # type: ignore[attr-defined]
                self._urgent.add(req)  # type: ignore[arg-type]
                m.ttft.observe(now - req.arrived)  # type: ignore[attr-defined]
            out.append((req, ("token", tok)))  # type: ignore[arg-type]
        m.tokens.inc(len(res.emitted))
        m.token_rate.add(len(res.emitted))
        for req in res.finished:
            if req.error is not None:
                self.errors += 1
                self._finish(req, out, ("error", {"detail": req.error, "status": 500}), "error")  # type: ignore[arg-type]
                continue
            info = {"reason": "length", "tokens": req.generated,
                    "ttft_ms": round(1e3 * ((req.first_token_at or now) - req.arrived), 3),  # type: ignore[attr-defined]
                    "latency_ms": round(1e3 * (now - req.arrived), 3)}  # type: ignore[attr-defined]
            m.latency.observe(now - req.arrived)  # type: ignore[attr-defined]
            self._finish(req, out, ("end", info), "ok")  # type: ignore[arg-type]
        for req in res.dropped:
            if req.end_outcome == "ok" and not req.answered:  # type: ignore[attr-defined]
                m.latency.observe(now - req.arrived)  # type: ignore[attr-defined]
            self._finish(req, out, None, req.end_outcome)  # type: ignore[arg-type,attr-defined]

    def _fail(self, reqs: list[GenRequest], out: list[tuple[GenRequest, Event]], err: Exception) -> None:
        """End ``reqs`` with an error event after ``err`` (logged)."""
        self.errors += 1
        log.error("generation failed for %d request(s)", len(reqs), exc_info=err)
        detail = f"generation failed ({type(err).__name__}); see the server log"
        for req in reqs:
            self._finish(req, out, ("error", {"detail": detail, "status": 500}), "error")
            req.cancelled = True

    def _finish(self, req: GenRequest, out: list[tuple[GenRequest, Event]], event: Event | None,
                outcome: str) -> None:
        if req.answered:
            return
        req.answered = True
        self.metrics.requests.labels(outcome).inc()
        if event is not None:
            out.append((req, event))
            self._urgent.add(req)

    def _fail_everything(self, out: list[tuple[GenRequest, Event]], detail: str) -> None:
        pending = self.core.abort() + list(self.core.waiting)
        self.core.waiting.clear()
        while True:
            try:
                pending.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for req in pending:
            self._finish(req, out, ("error", {"detail": detail, "status": 503}), "shutdown")  # type: ignore[arg-type]

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
        state = (len(self.core.running), self.queued)
        if not out and state == self._handed_state:
            return
        self._handed_state = state
        batch = out[:]
        out.clear()
        try:
            self._loop.call_soon_threadsafe(_deliver, batch)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass
