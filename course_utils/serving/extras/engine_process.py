"""The generation engine in its own process, so the model never waits for the HTTP side's GIL.

In the server process, the worker thread needs the GIL for the Python between a step's operators,
and so does the event loop that parses requests and writes tokens; on a small machine the worker
waits for the loop a large part of each step (``extras.breakdown`` measures it). Production engines
split the two (vLLM runs its engine core apart from its API server); ``ServeSettings(engine_process=True)``
(``serve --engine-process``) does it here: ``EngineProcess`` has the interface the routes use
(``warm_up``, ``start``, ``submit`` returning a request with ``events`` and ``cancel()``,
``begin_shutdown``, ``stop``, ``failure``, ``rows``, ``queue``) and runs an ordinary
``GenerationEngine`` in a ``spawn``ed child, over one ``multiprocessing`` pipe:

- parent → child: ``("submit", rid, ids, max_new_tokens, temperature, seed)``, ``("cancel", rid, outcome)``,
  ``("metrics", ticket)``, ``("shutdown", detail)``, ``("stop",)``;
- child → parent: ``("ready", warm_up_s)``, ``("events", [(rid, event), ...], active, queued,
  failure)`` once per flush of the worker, ``("metrics", ticket, text)``, ``("stopped",)``; or
  ``("failed", message)`` when the child could not start.

Events are the engine's own; a full queue or a stopping engine answers a submit with a 503
``error`` event. If the child dies, every open request gets a 503 error event, ``failure`` says why
(``/health`` reports it; logged as critical) and later requests get 503: the engine is not restarted
(a child that died once, say of memory, would likely die again on the same requests).

The event loop never blocks on the pipe: messages go through a sender thread. A child that stops
reading (stopped, hung) costs only queued messages: past ``OUTBOX_LIMIT`` ``submit`` raises
``QueueFull`` (503), and once a write has been blocked for ``STALL_S``, ``failure`` says so.
The engine's metrics live in the child; ``metrics_text()`` fetches them for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ...models.gpt import TinyGPT
from ..server.engine import GenerationEngine, QueueFull, ShuttingDown, check_limits
from ..server.metrics import ServingMetrics
from ..server.settings import ServeSettings

Event = tuple[str, Any]
log = logging.getLogger(__name__)

#: Messages waiting for the sender thread at most before ``submit`` answers 503 (the child is not reading).
OUTBOX_LIMIT = 256
#: A send to the child blocked this long means it is stopped or hung: ``failure`` says so meanwhile.
STALL_S = 3.0


@dataclass(eq=False)
class RemoteRequest:
    """A request as the routes see it: events arrive in ``events``; ``cancel()`` frees its row."""

    rid: int
    engine: EngineProcess
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    finished: bool = False

    def cancel(self, outcome: str = "cancelled") -> None:
        """Ask the engine to drop this request at its next step (``GenRequest.cancel``'s outcomes).
        It leaves the table of open requests now: the route that cancels waits for no more events."""
        if not self.cancelled and not self.finished:
            self.cancelled = True
            self.engine._open.pop(self.rid, None)
            self.engine._send(("cancel", self.rid, outcome))


class EngineProcess:
    """A ``GenerationEngine`` in a child process, driven from the server's event loop."""

    def __init__(self, model: TinyGPT, settings: ServeSettings, metrics: ServingMetrics,
                 startup_timeout_s: float = 300.0) -> None:
        check_limits(settings, model)  # refuse bad limits here, before any process starts
        self.settings = settings
        self.metrics = metrics  # the HTTP side's own (embeddings); the engine's are in the child
        self.startup_timeout_s = startup_timeout_s
        ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or locks copied by fork
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=_child_main, args=(child_conn, model.eval(), settings),
                                    name="course-serving-engine", daemon=True)
        self._child_conn = child_conn
        # The event loop never writes to the pipe itself (a child that stops reading would block it):
        # it queues messages, which a sender thread writes.
        self._outbox: queue.Queue[tuple | None] = queue.Queue()
        self._sender: threading.Thread | None = None
        self._sending_since: float | None = None  # when the send in progress began
        self._ids = itertools.count()
        self._open: dict[int, RemoteRequest] = {}
        self._tickets: dict[int, Future[str]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stop_detail = "server shutting down"
        self._failure: str | None = None
        self._active = 0
        self.queued = 0  # the child's waiting requests at its last flush

    # ---- what the routes and /health read -------------------------------------------
    @property
    def rows(self) -> range:
        """The running sequences (only their number is known here)."""
        return range(self._active)

    @property
    def accepting(self) -> bool:
        """Whether new requests are taken (false once shutdown began or the child died)."""
        return not self._stopping.is_set() and self._failure is None

    @property
    def failure(self) -> str | None:
        """Return why the engine cannot serve (its process or worker died, or it has not read its pipe
        for ``STALL_S``: stopped or hung), or None while it can."""
        if self._failure is None and self._sending_since is not None:
            stalled = time.monotonic() - self._sending_since
            if stalled > STALL_S:
                return (f"the engine process has not read its requests for {stalled:.0f} s (stopped or hung?); "
                        f"{self._outbox.qsize()} messages wait")
        return self._failure

    # ---- life cycle ----------------------------------------------------------------------
    def warm_up(self) -> float:
        """Start the child and wait until its engine is ready (model loaded, compiled if asked);
        return the seconds that took. Raises ``RuntimeError`` when it fails or times out."""
        start = time.perf_counter()
        self._process.start()
        self._child_conn.close()  # the child holds its end; EOF here then means it died
        if not self._conn.poll(self.startup_timeout_s):
            self._process.kill()
            raise RuntimeError(f"the engine process did not start within {self.startup_timeout_s} s")
        try:
            msg = self._conn.recv()
        except EOFError:
            self._process.join(5)
            raise RuntimeError(f"the engine process exited during start-up (code {self._process.exitcode})") from None
        if msg[0] != "ready":
            raise RuntimeError(f"the engine process could not start: {msg[1]}")
        return time.perf_counter() - start

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand events to ``loop`` from now on (a reader thread waits on the pipe)."""
        self._loop = loop
        self._reader = threading.Thread(target=self._read, name="course-serving-engine-reader", daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._write, name="course-serving-engine-sender", daemon=True)
        self._sender.start()

    def submit(self, ids: list[int], max_new_tokens: int, temperature: float = 0.0,
               seed: int | None = None) -> RemoteRequest:
        """Send a request to the engine; raises ``ShuttingDown`` once it stopped taking any.
        (A full queue answers with a 503 ``error`` event, like ``QueueFull`` would.)"""
        if not self.accepting:
            raise ShuttingDown(self._failure or self._stop_detail)
        if self._outbox.qsize() >= OUTBOX_LIMIT:
            raise QueueFull(f"the engine process is not taking requests ({self._outbox.qsize()} messages wait)")
        req = RemoteRequest(next(self._ids), self)
        self._open[req.rid] = req
        if not self._send(("submit", req.rid, list(ids), max_new_tokens, temperature, seed)):
            self._open.pop(req.rid, None)
            raise ShuttingDown(self._failure or "the engine process is not running")
        return req

    def begin_shutdown(self, detail: str = "server shutting down") -> None:
        """Stop taking requests; the engine ends every queued and running one with an error."""
        if not self._stopping.is_set():
            self._stop_detail = detail
            self._stopping.set()
            self._send(("shutdown", detail))

    def stop(self, timeout: float = 10.0) -> None:
        """Begin shutdown, stop the child and wait for it (killed if it does not stop in time)."""
        self.begin_shutdown(self._stop_detail)
        self._send(("stop",))
        if self._process.pid is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        if self._reader is not None:
            self._reader.join(timeout)
        self._outbox.put(None)  # the sender ends (a send to the dead child failed or gets there)
        if self._sender is not None:
            self._sender.join(timeout)
        self._fail_open("server shutting down")

    async def metrics_text(self, timeout: float = 5.0) -> str:
        """Return the engine's metrics (Prometheus text) from the child, or "" if it cannot answer."""
        ticket = next(self._ids)
        future: Future[str] = Future()
        self._tickets[ticket] = future
        try:
            if not self._send(("metrics", ticket)):
                return ""
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            return ""
        finally:
            self._tickets.pop(ticket, None)

    # ---- plumbing ------------------------------------------------------------------------
    def _send(self, msg: tuple) -> bool:
        """Queue ``msg`` for the child without blocking; False when it can no longer get there."""
        if self._conn.closed or (self._sender is not None and not self._sender.is_alive()):
            return False
        if self._sender is None:  # before start(): warm_up's thread, nothing else writes yet
            try:
                self._conn.send(msg)
            except (OSError, ValueError):
                return False
            return True
        self._outbox.put(msg)
        return True

    def _write(self) -> None:
        """Sender thread: write queued messages to the child, one at a time, until told to end."""
        while (msg := self._outbox.get()) is not None:
            self._sending_since = time.monotonic()
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the child is gone or the pipe is closed
                break
            finally:
                self._sending_since = None

    def _read(self) -> None:
        """Reader thread: hand each message of the child to the event loop, until it stops."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "events":
                _, batch, self._active, self.queued, failure = msg
                if failure and self._failure is None:
                    self._failure = failure
                self._call(self._deliver, batch)
            elif kind == "metrics":
                future = self._tickets.get(msg[1])
                if future is not None and not future.done():
                    future.set_result(msg[2])
            elif kind == "stopped":
                break
        if not self._stopping.is_set() and self._failure is None:
            self._process.join(1)
            self._failure = (f"the engine process exited (code {self._process.exitcode}); this server cannot "
                             "generate until it is restarted")
            log.critical("%s", self._failure)
        self._active = 0
        self._fail_open(self._failure or self._stop_detail)

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _deliver(self, batch: list[tuple[int, Event]]) -> None:
        for rid, event in batch:
            req = self._open.get(rid)
            if req is None:
                continue
            if event[0] != "token":
                req.finished = True
                self._open.pop(rid, None)
            req.events.put_nowait(event)

    def _fail_open(self, detail: str) -> None:
        """End every request still open with a 503 error event (the engine is gone); any thread."""
        self._call(self._fail_open_now, detail)

    def _fail_open_now(self, detail: str) -> None:
        """In the event loop (which alone changes the table): end every open request."""
        self._deliver([(rid, ("error", {"detail": detail, "status": 503})) for rid in list(self._open)])


class _PipeLoop:
    """Stands in, in the child, for the event loop ``GenerationEngine`` hands tokens to: each
    flush of the worker becomes one ``events`` message on the pipe."""

    def __init__(self, send: Any, engine_ref: list[GenerationEngine]) -> None:
        self._send, self._engine = send, engine_ref

    def call_soon_threadsafe(self, _fn: Any, batch: list[tuple[Any, Event]]) -> None:
        engine = self._engine[0]
        self._send(("events", [(req.rid, event) for req, event in batch], len(engine.rows),
                    engine.queued, engine.failure))


def _child_main(conn: Connection, model: TinyGPT, settings: ServeSettings) -> None:
    """The child process: run a ``GenerationEngine`` and serve the parent's messages."""
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            try:
                conn.send(msg)
            except (OSError, ValueError):
                pass  # the parent is gone; the receive loop below sees it and ends

    try:
        metrics = ServingMetrics()
        engine = GenerationEngine(model, settings, metrics)
        warm = engine.warm_up()
        engine.start(_PipeLoop(send, [engine]))  # type: ignore[arg-type]
    except Exception as err:  # tell the parent why, instead of a bare exit code
        send(("failed", f"{type(err).__name__}: {err}"))
        return
    send(("ready", warm))
    requests: dict[int, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent died: stop serving
            msg = ("stop",)
        kind = msg[0]
        if kind == "submit":
            rid, ids, max_new, temperature, seed = msg[1:]
            try:
                req = engine.submit(ids, max_new, temperature, seed)
            except (QueueFull, ShuttingDown) as err:
                send(("events", [(rid, ("error", {"detail": str(err), "status": 503}))], len(engine.rows),
                      engine.queued, engine.failure))
                continue
            req.rid = rid  # type: ignore[attr-defined]
            requests[rid] = req
            if len(requests) > 4 * (settings.queue_size + settings.batch_capacity):
                for old in [r for r, q in requests.items() if q.answered]:
                    del requests[old]
        elif kind == "cancel":
            req = requests.pop(msg[1], None)
            if req is not None:
                req.cancel(msg[2])
        elif kind == "metrics":
            send(("metrics", msg[1], metrics.render().decode()))
        elif kind == "shutdown":
            engine.begin_shutdown(msg[1])
        elif kind == "stop":
            try:
                engine.stop()
            finally:
                send(("stopped",))
            return


def merged_metrics(engine_text: str, local: ServingMetrics) -> bytes:
    """Return one Prometheus exposition: the engine's metrics (``engine_text``, from the child) and
    the families only the HTTP side keeps (``serve_embed_*``) from ``local``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(engine_text)) if engine_text else []
    have = {f.name for f in families}
    families += [f for f in local.registry.collect() if f.name.startswith("serve_embed") and f.name not in have]

    class _Fixed:
        def collect(self) -> list:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed())  # type: ignore[arg-type]
    return generate_latest(registry)
