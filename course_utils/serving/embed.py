"""The embedding worker: batches ``/embed`` requests across clients for all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from .metrics import ServingMetrics
from .settings import ServeSettings

MODEL_NAME = "all-MiniLM-L6-v2"


@dataclass(eq=False)
class EmbedJob:
    """Texts of one request and the future its route awaits."""

    texts: list[str]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.perf_counter)


def _resolve(job: EmbedJob, result: list[list[float]] | None, error: BaseException | None) -> None:
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)


class EmbedWorker:
    """Collects texts from concurrent requests (up to ``max_batch_size`` texts, or ``max_wait_ms``)
    and embeds them in one forward pass; each request gets back its own rows."""

    def __init__(self, mini: object, settings: ServeSettings, metrics: ServingMetrics) -> None:
        self.mini = mini
        self.settings = settings
        self.metrics = metrics
        self.queue: queue.Queue[EmbedJob] = queue.Queue(maxsize=settings.queue_size)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="course-serving-embed", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, texts: list[str]) -> asyncio.Future:
        """Queue texts and return a future of their embeddings; raises ``queue.Full``."""
        loop = asyncio.get_running_loop()
        job = EmbedJob(list(texts), loop.create_future(), loop)
        self.queue.put_nowait(job)
        return job.future

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker; pending requests fail with a shutdown error."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        torch.set_num_threads(self.settings.torch_threads)
        with torch.inference_mode():
            while not self._stopping.is_set():
                try:
                    first = self.queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                jobs = [first]
                count = len(first.texts)
                deadline = time.perf_counter() + self.settings.max_wait_ms / 1000
                while count < self.settings.max_batch_size:
                    remaining = deadline - time.perf_counter()
                    try:
                        job = self.queue.get(timeout=remaining) if remaining > 0 else self.queue.get_nowait()
                    except queue.Empty:
                        break
                    jobs.append(job)
                    count += len(job.texts)
                self._embed(jobs)
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            self._call(job, None, RuntimeError("server shutting down"))

    def _call(self, job: EmbedJob, result: list[list[float]] | None, error: BaseException | None) -> None:
        try:
            job.loop.call_soon_threadsafe(_resolve, job, result, error)
        except RuntimeError:
            pass

    def _embed(self, jobs: list[EmbedJob]) -> None:
        texts = [t for job in jobs for t in job.texts]
        try:
            ids, mask = self.mini.tokenize(texts)  # type: ignore[attr-defined]
            emb = self.mini.model(ids, mask).tolist()  # type: ignore[attr-defined]
        except Exception as err:  # report to every waiting client
            self.metrics.embed_requests.labels("error").inc(len(jobs))
            for job in jobs:
                self._call(job, None, err)
            return
        self.metrics.embed_batch.observe(len(texts))
        start = 0
        for job in jobs:
            self._call(job, emb[start:start + len(job.texts)], None)
            start += len(job.texts)
        self.metrics.embed_requests.labels("ok").inc(len(jobs))
