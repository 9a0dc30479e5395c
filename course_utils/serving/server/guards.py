"""Guards in front of the application: a per-client share, the ``Host`` header check, the body's size and time.

All are plain ASGI middleware, so they answer before FastAPI reads or parses anything:

- ``ClientShare`` (outermost): one client address may have at most ``max_requests`` requests in
  flight (streams count until they end); beyond that 429 + ``Retry-After`` before any of the body
  is read, so a client holding many sockets cannot take every slot of ``limit_concurrency``
  (``http_head`` caps its open connections the same way, before any request).

- ``HostCheck``: a request whose ``Host`` header does not name loopback (``localhost``,
  ``127.0.0.1``, ``[::1]``, any port) or an allowed name gets 400. A web page can point a
  name it controls at 127.0.0.1 (DNS rebinding) and so reach a server meant for this machine
  only; its requests still carry that name in ``Host``, which is how they are told apart.
- ``BodyLimit``: a body over ``max_bytes`` gets 413, judged by ``Content-Length`` before
  anything is read and by counting while reading (chunked uploads), never buffering more; a body
  that has not arrived whole within ``timeout_s`` of its head gets 408 (each ``receive()`` waits
  only for the time left), so a stalled upload cannot hold its connection for ever.

Their answers use ``{"detail": ...}`` like FastAPI, and the OpenAI error shape on ``/v1`` paths.
Starlette's ``TrustedHostMiddleware`` would stop the same rebinding pages (a name list with
``localhost``, ``127.0.0.1`` and ``::1``); it is not used because it answers a plain-text 400 where
the OpenAI clients of ``/v1`` read the error shape, and it takes names only, not every loopback
address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def host_name(header: str) -> str:
    """Return the host part of a ``Host`` header value, lower-cased, without port or brackets."""
    value = header.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        value = value.split(":")[0]
    return value.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """Return whether ``name`` (from ``host_name``) is ``localhost`` or a loopback IP address."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def error_body(scope: Scope, message: str, code: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """Return the error body a client of this path expects: the OpenAI shape under ``/v1``
    (``{"error": {"message", "type", "param", "code"}}``, which OpenAI clients read), else FastAPI's
    ``{"detail": message}`` like the rest of the server."""
    path = scope.get("path", "")
    if path == "/v1" or path.startswith("/v1/"):
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return {"detail": message}


async def send_json(send: Send, status: int, body: dict[str, Any], close: bool = False,
                    retry_after: str | None = None) -> None:
    """Send a whole JSON response through a raw ASGI ``send``."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class HostCheck:
    """ASGI middleware: 400 unless the ``Host`` header names loopback or one of ``allowed``."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = {host_name(name) for name in allowed}

    def accepts(self, header: str) -> bool:
        """Return whether a request with this ``Host`` header value is served."""
        name = host_name(header)
        return bool(name) and (is_loopback_name(name) or name in self.allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not self.accepts(host):
                await send_json(send, 400, error_body(
                    scope, "the Host header must name this machine's loopback (localhost, 127.0.0.1, [::1]); "
                           "start the server with --allow-host NAME to accept another name", "host_not_allowed"))
                return
        await self.app(scope, receive, send)


def client_address(scope: Scope) -> str:
    """Return the address a request came from (``scope["client"]``'s host; "" when unknown)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


class ClientShare:
    """ASGI middleware: 429 for a request whose client address already has ``max_requests`` in flight."""

    def __init__(self, app: ASGIApp, max_requests: int, retry_after: str = "1") -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {max_requests}")
        self.app = app
        self.max_requests = max_requests
        self.retry_after = retry_after
        self.in_flight: dict[str, int] = {}  # client address -> requests running (only the event loop touches it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = client_address(scope)
        held = self.in_flight.get(client, 0)
        if held >= self.max_requests:
            await send_json(send, 429, error_body(
                scope, f"this client already has {held} requests in flight (at most {self.max_requests} "
                       "per client address); wait for one to finish", "too_many_requests", "rate_limit_error"),
                close=True, retry_after=self.retry_after)
            return
        self.in_flight[client] = held + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]


class BodyLimit:
    """ASGI middleware: 413 for request bodies over ``max_bytes``, 408 for one not whole within
    ``timeout_s`` (None: no deadline); the app gets the body in one piece."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = error_body(scope, f"the request body is larger than {self.max_bytes} bytes", "body_too_large")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_json(send, 413, too_large, close=True)  # (uvicorn rejects a malformed length)
            return
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout_s is None else loop.time() + self.timeout_s
        while True:  # read the body (at most max_bytes of it, within timeout_s) before the app runs
            try:
                message = await asyncio.wait_for(receive(), None if deadline is None else deadline - loop.time())
            except TimeoutError:  # two classes on Python 3.10, one from 3.11
                await send_json(send, 408, error_body(
                    scope, f"the request body did not arrive within {self.timeout_s:g} s", "body_timeout"), close=True)
                return
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_json(send, 413, too_large, close=True)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # later calls: wait for a disconnect, as usual

        await self.app(scope, replay, send)
