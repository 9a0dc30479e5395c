"""An async load generator (httpx): many concurrent streaming clients, every stream validated.

``run_load(url, concurrency=32, n_requests=256)`` returns a ``LoadReport``. Each request is a
``POST {url}{path}``; its streamed response is read line by line and handed to a parser
(``parse``, a factory of objects with ``feed(line) -> list[event]``) that turns lines into
``("token", text)``, ``("end", info)`` or ``("error", detail)`` events. The default parser
reads the course's SSE (``sse.SSEParser``, re-exported here); pass another for a server with a
different stream format. Percentiles follow the course's nearest-rank rule (``percentile``).

A request counts as ok when it got 200, well-formed events, exactly ``max_new_tokens``
tokens with indices 0..n-1 in order, and a final ``end`` event.

Two options serve a fleet of replicas (both off by default, which changes nothing):
``retries=k`` sends a request again, up to ``k`` more times, when an attempt failed in a way a
retry can fix (a dropped connection, a cut-off or error-ended stream, HTTP 408, 429 or 5xx; never
another 4xx); a request is idempotent given its prompt and seed, so a retried request that then
succeeds is ok, not lost. ``count_header="x-served-by"`` counts the successful answers by the
value of that response header (``LoadReport.served_by``), to see which replicas served them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .percentile import percentiles
from .sse import MalformedStream, SSEParser

__all__ = ["DEFAULT_PROMPTS", "LoadReport", "MalformedStream", "SSEParser", "StreamParser", "describe_error",
           "run_load", "run_load_async", "sse_body"]

#: HTTP statuses worth another attempt (besides every 5xx): request timeout, too many requests.
RETRY_STATUSES = frozenset({408, 429})

DEFAULT_PROMPTS = (
    "The ", "A class ", "def ", "import ", "If the ", "for x in ", "The object ", "print(",
    "Return ", "When a ", "This is ", "An exception ",
)


class StreamParser(Protocol):
    """Turns response lines into events; ``feed`` may return several or none.

    A parser may also offer ``feed_bytes(chunk)``; the load generator then hands it raw body
    bytes instead of lines (cheaper). At the end of the body it calls ``finish()`` when the
    parser has one (it returns the last events, or raises for a half-written one), else ``feed("")``.
    """

    def feed(self, line: str) -> list[tuple[str, Any]]: ...


@dataclass
class LoadReport:
    """What a load run measured. Times in milliseconds, rates per second of wall time.

    ``n_ok``, ``n_failed`` and ``n_malformed`` count requests by their final outcome; with
    retries, ``retries`` counts the extra attempts, ``statuses`` and ``errors`` cover every
    attempt, and a retried request's times run from its first attempt.
    """

    n_requests: int
    n_ok: int
    n_failed: int
    n_malformed: int
    wall_s: float
    tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_ms: dict[str, float]
    latency_ms: dict[str, float]
    concurrency: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    retries: int = 0
    served_by: dict[str, int] = field(default_factory=dict)

    @property
    def n_lost(self) -> int:
        """Requests that never got a complete, valid answer (failed or malformed, after any retries)."""
        return self.n_requests - self.n_ok

    def as_dict(self) -> dict[str, Any]:
        """Return the report as a plain dict (without the generated texts)."""
        out = asdict(self)
        out.pop("texts")
        out["errors"] = out["errors"][:10]
        return out


#: How long an idle connection stays in the load generator's pool (seconds). It must be clearly shorter than the
#: server's own idle timeout (the course's server: 15 s; uvicorn's default, which many servers keep: 5 s). With
#: equal timeouts, a client that reads a response a little late (a busy machine) can send its next request on a
#: connection whose server side is closing at that moment; the server closes without answering, and the
#: client gets "Connection reset by peer". httpx's pool reuses the first free connection in its list, so the
#: last ones can sit idle that long even under steady load.
KEEPALIVE_EXPIRY_S = 1.0


def describe_error(err: BaseException) -> str:
    """Return ``err`` as "Type: message", followed by the error at the root of its chain of causes.

    httpx's transport errors often carry no message, and the layers under them (httpcore, anyio)
    neither; the socket error at the bottom does: "ReadError: (no message), caused by
    ConnectionResetError: [Errno 104] Connection reset by peer".
    """
    def one(e: BaseException) -> str:
        return f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__}: (no message)"

    root, seen = err, {id(err)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        root = inner
    return one(err) if root is err else f"{one(err)}, caused by {one(root)}"


def sse_body(prompt: str, max_new_tokens: int) -> dict[str, Any]:
    """The JSON body of one ``/generate`` request (greedy)."""
    return {"prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0.0}


async def run_load_async(url: str, *, concurrency: int, n_requests: int,
                         prompts: Sequence[str] | None = None, max_new_tokens: int = 32,
                         timeout_s: float = 60.0, path: str = "/generate",
                         body: Callable[[str, int], dict[str, Any]] = sse_body,
                         parse: Callable[[], StreamParser] = SSEParser,
                         keep_texts: bool = False, retries: int = 0, retry_backoff_s: float = 0.05,
                         count_header: str | None = None,
                         keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> LoadReport:
    """Send ``n_requests`` requests from ``concurrency`` concurrent clients; see ``run_load``."""
    import httpx

    if concurrency < 1 or n_requests < 1:
        raise ValueError("concurrency and n_requests must be >= 1")
    if keepalive_expiry_s <= 0:
        raise ValueError(f"keepalive_expiry_s must be > 0, got {keepalive_expiry_s}")
    if retries < 0 or retry_backoff_s < 0:
        raise ValueError(f"retries and retry_backoff_s must be >= 0, got {retries} and {retry_backoff_s}")
    prompts = list(prompts or DEFAULT_PROMPTS)
    next_index = 0
    ttft: list[float] = []
    latency: list[float] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    texts: list[str] = [""] * n_requests
    counts = {"ok": 0, "failed": 0, "malformed": 0, "tokens": 0, "retries": 0}
    served_by: dict[str, int] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        start = time.perf_counter()
        for n in range(retries + 1):
            if n:
                counts["retries"] += 1
                await asyncio.sleep(retry_backoff_s * n)
            outcome, retriable = await attempt(client, i, start)
            if outcome == "ok" or not retriable:
                break
        counts[outcome] += 1

    async def attempt(client: httpx.AsyncClient, i: int, start: float) -> tuple[str, bool]:
        """One attempt at request ``i``; return its outcome and whether a retry could help."""
        parser = parse()
        status: int | None = None
        first: float | None = None
        pieces: list[str] = []
        ended = False

        def take(events: list[tuple[str, Any]]) -> None:
            nonlocal first, ended
            for kind, value in events:
                if ended:
                    raise MalformedStream("event after the end event")
                if kind == "token":
                    if first is None:
                        first = time.perf_counter()
                    pieces.append(value)
                elif kind == "end":
                    ended = True
                else:
                    raise RuntimeError(f"error event: {value}")

        try:
            async with client.stream("POST", url.rstrip("/") + path,
                                     json=body(prompts[i % len(prompts)], max_new_tokens)) as resp:
                status = resp.status_code
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if resp.status_code != 200:
                    await resp.aread()
                    errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                    return "failed", resp.status_code in RETRY_STATUSES or resp.status_code >= 500
                served = resp.headers.get(count_header, "(none)") if count_header else None
                if hasattr(parser, "feed_bytes"):
                    chunks = resp.aiter_raw()
                    feed = parser.feed_bytes  # type: ignore[attr-defined]
                else:
                    chunks = resp.aiter_lines()
                    feed = parser.feed
                async for chunk in chunks:
                    take(feed(chunk))
                finish = getattr(parser, "finish", None)
                take(finish() if finish is not None else parser.feed(""))
        except (MalformedStream, json.JSONDecodeError) as err:
            errors.append(f"malformed: {err}")
            return "malformed", True
        except Exception as err:  # transport errors, error events, timeouts
            phase = "before the response" if status is None else f"during the {status} response"
            errors.append(f"{describe_error(err)}; {phase}, {time.perf_counter() - start:.1f} s after the request")
            return "failed", True
        if not ended or len(pieces) != max_new_tokens:
            errors.append(f"stream ended={ended} with {len(pieces)} of {max_new_tokens} tokens")
            return "malformed", True
        done = time.perf_counter()
        counts["tokens"] += len(pieces)
        if served is not None:
            served_by[served] = served_by.get(served, 0) + 1
        ttft.append(1e3 * ((first or done) - start))
        latency.append(1e3 * (done - start))
        if keep_texts:
            texts[i] = "".join(pieces)
        return "ok", False

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < n_requests:
            i = next_index
            next_index += 1
            await one(client, i)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                          keepalive_expiry=keepalive_expiry_s)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(min(concurrency, n_requests))))
        wall = time.perf_counter() - start
    return LoadReport(
        n_requests=n_requests, n_ok=counts["ok"], n_failed=counts["failed"],
        n_malformed=counts["malformed"], wall_s=wall, tokens=counts["tokens"],
        tokens_per_s=counts["tokens"] / wall, requests_per_s=counts["ok"] / wall,
        ttft_ms=percentiles(ttft, (50, 95)), latency_ms=percentiles(latency, (50, 95, 99)),
        concurrency=concurrency, statuses=statuses, errors=errors, texts=texts,
        retries=counts["retries"], served_by=served_by)


def run_load(url: str, **kwargs: Any) -> LoadReport:
    """Run ``run_load_async`` to completion from synchronous code, notebooks included.

    Notebooks already run an event loop, so the coroutine runs in a fresh thread with its own
    loop. Keyword arguments: ``concurrency``, ``n_requests``, ``prompts``, ``max_new_tokens``
    (32), ``timeout_s`` (60, per request), ``path``, ``body``, ``parse``, ``keep_texts``,
    ``retries`` (0), ``retry_backoff_s`` (0.05, times the attempt number), ``count_header`` (None),
    ``keepalive_expiry_s`` (``KEEPALIVE_EXPIRY_S``: keep it below the server's idle timeout).
    """
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["report"] = asyncio.run(run_load_async(url, **kwargs))
        except BaseException as err:  # re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=target, name="course-loadgen", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["report"]
