"""The embedding worker: batches ``/embed`` requests across clients for all-MiniLM-L6-v2.

At most ``settings.embed_queue_texts`` texts wait at a time (``submit`` raises ``queue.Full``
beyond, HTTP 503). Work nobody waits for any more (the route timed out or the client went
away) is dropped before it is computed and counted as "abandoned", not "ok".

A failing forward pass fails only its batch (``EmbedError``, HTTP 500). Only if the worker thread
itself dies (an error that is not an ``Exception``) does the worker stop, as the generation
worker does: ``failure`` then says why (``/health`` reports it), the batch it was computing and
every queued request fail with ``EmbedUnavailable`` (HTTP 503) and ``submit`` refuses new ones.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from .metrics import ServingMetrics
from .settings import ServeSettings

MODEL_NAME = "all-MiniLM-L6-v2"
log = logging.getLogger(__name__)


class EmbedError(RuntimeError):
    """Computing the embeddings failed (HTTP 500); the server log has the details."""


class EmbedUnavailable(RuntimeError):
    """The worker is stopping or has died and takes no work (HTTP 503); the message says which."""


@dataclass(eq=False)
class EmbedJob:
    """Texts of one request and the future its route awaits."""

    texts: list[str]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    def cancel(self) -> None:
        """Tell the worker nobody waits for these texts any more (timeout, client gone)."""
        self.cancelled = True


class EmbedWorker:
    """Collects texts from concurrent requests (up to ``max_batch_size`` texts, or ``max_wait_ms``)
    and embeds them in one forward pass; each request gets back its own rows."""

    def __init__(self, mini: object, settings: ServeSettings, metrics: ServingMetrics) -> None:
        self.mini = mini
        self.settings = settings
        self.metrics = metrics
        self.queue: queue.Queue[EmbedJob] = queue.Queue(maxsize=settings.queue_size)
        self.queued_texts = 0  # texts in ``queue``, at most settings.embed_queue_texts
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._failure: str | None = None
        self._batch: list[EmbedJob] = []  # the jobs being collected or computed (failed if the thread dies)
        self._thread = threading.Thread(target=self._run, name="course-serving-embed", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    @property
    def failure(self) -> str | None:
        """Return why the worker cannot serve (its thread died), or None while it can."""
        if self._failure is None and self._thread.ident is not None and not self._thread.is_alive() \
                and not self._stopping.is_set():
            return "the embedding worker is not running"
        return self._failure

    def submit(self, texts: list[str]) -> EmbedJob:
        """Queue texts and return their job (``job.future`` gives the embeddings); raises ``queue.Full``
        when ``queue_size`` requests or ``embed_queue_texts`` texts already wait, ``EmbedUnavailable``
        when the worker is stopping or died."""
        loop = asyncio.get_running_loop()
        job = EmbedJob(list(texts), loop.create_future(), loop)
        with self._lock:  # (the worker sets _stopping under this lock: no job slips in after its last drain)
            if self._stopping.is_set():
                raise EmbedUnavailable(self._failure or "server shutting down")
            if self.queued_texts + len(job.texts) > self.settings.embed_queue_texts:
                raise queue.Full
            self.queue.put_nowait(job)
            self.queued_texts += len(job.texts)
        return job

    def _get(self, wait_s: float) -> EmbedJob:
        """Return the next queued job, waiting up to ``wait_s`` seconds (0: not at all); raises ``queue.Empty``."""
        job = self.queue.get(timeout=wait_s) if wait_s > 0 else self.queue.get_nowait()
        with self._lock:
            self.queued_texts -= len(job.texts)
        return job

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker; pending requests fail with a shutdown error."""
        with self._lock:
            self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as err:  # the worker dies: say so loudly, keep clients informed
            detail = f"embedding worker stopped: {type(err).__name__}: {err}"
            log.critical("%s", detail, exc_info=err)
            with self._lock:
                self._failure = detail
                self._stopping.set()
            for job in self._batch:
                self._call(job, None, EmbedUnavailable(detail))
            self._fail_queued(detail)
            raise
        self._fail_queued("server shutting down")

    def _serve(self) -> None:
        """Collect and embed batches until ``stop``."""
        torch.set_num_threads(self.settings.torch_threads)
        with torch.inference_mode():
            while not self._stopping.is_set():
                try:
                    first = self._get(0.05)
                except queue.Empty:
                    continue
                self._batch = jobs = [first]
                count = len(first.texts)
                deadline = time.perf_counter() + self.settings.max_wait_ms / 1000
                while count < self.settings.max_batch_size:
                    remaining = deadline - time.perf_counter()
                    try:
                        job = self._get(remaining)
                    except queue.Empty:
                        break
                    jobs.append(job)
                    count += len(job.texts)
                self._embed(jobs)
                self._batch = []

    def _fail_queued(self, detail: str) -> None:
        """Answer every queued job with ``EmbedUnavailable(detail)`` (HTTP 503)."""
        while True:
            try:
                job = self._get(0)
            except queue.Empty:
                break
            self._call(job, None, EmbedUnavailable(detail))

    def _call(self, job: EmbedJob, result: list[list[float]] | None, error: BaseException | None) -> None:
        try:
            job.loop.call_soon_threadsafe(self._resolve, job, result, error)
        except RuntimeError:
            pass

    def _resolve(self, job: EmbedJob, result: list[list[float]] | None, error: BaseException | None) -> None:
        """On the event loop: hand the result to the waiting route, counting the outcome."""
        if job.future.done():  # the route gave up (504) while this was being computed
            if error is None:
                self.metrics.embed_requests.labels("abandoned").inc()
        elif error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)
            self.metrics.embed_requests.labels("ok").inc()

    def _embed(self, jobs: list[EmbedJob]) -> None:
        now = time.perf_counter()
        live = [job for job in jobs if not job.cancelled and now - job.arrived <= self.settings.queue_timeout_s]
        if len(live) < len(jobs):  # the others' routes already answered (504) or their clients left
            self.metrics.embed_requests.labels("abandoned").inc(len(jobs) - len(live))
        jobs = live
        if not jobs:
            return
        texts = [t for job in jobs for t in job.texts]
        try:
            ids, mask = self.mini.tokenize(texts)  # type: ignore[attr-defined]
            emb = self.mini.model(ids, mask).tolist()  # type: ignore[attr-defined]
        except Exception as err:  # report to every waiting client
            log.error("embedding %d texts failed", len(texts), exc_info=err)
            self.metrics.embed_requests.labels("error").inc(len(jobs))
            for job in jobs:
                self._call(job, None, EmbedError(f"embedding failed ({type(err).__name__}); see the server log"))
            return
        self.metrics.embed_batch.observe(len(texts))
        start = 0
        for job in jobs:
            self._call(job, emb[start:start + len(job.texts)], None)
            start += len(job.texts)
