"""Guards in front of the application: the ``Host`` header check and the request body size cap.

Both are plain ASGI middleware, so they answer before FastAPI reads or parses anything:

- ``HostCheck``: a request whose ``Host`` header does not name loopback (``localhost``,
  ``127.0.0.1``, ``[::1]``, any port) or an allowed name gets 400. A web page can point a
  name it controls at 127.0.0.1 (DNS rebinding) and so reach a server meant for this machine
  only; its requests still carry that name in ``Host``, which is how they are told apart.
- ``BodyLimit``: a body over ``max_bytes`` gets 413, judged by ``Content-Length`` before
  anything is read and by counting while reading (chunked uploads), never buffering more.

Their answers use ``{"detail": ...}`` like FastAPI, and the OpenAI error shape on ``/v1`` paths.
"""

from __future__ import annotations

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


def error_body(scope: Scope, message: str, code: str) -> dict[str, Any]:
    """Return the error body a client of this path expects: the OpenAI shape under ``/v1``
    (``{"error": {"message", "type", "param", "code"}}``, which OpenAI clients read), else FastAPI's
    ``{"detail": message}`` like the rest of the server."""
    path = scope.get("path", "")
    if path == "/v1" or path.startswith("/v1/"):
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return {"detail": message}


async def send_json(send: Send, status: int, body: dict[str, Any], close: bool = False) -> None:
    """Send a whole JSON response through a raw ASGI ``send``."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
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


class BodyLimit:
    """ASGI middleware: 413 for request bodies over ``max_bytes``; the app gets the body in one piece."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
        while True:  # read the body (at most max_bytes of it) before the app runs
            message = await receive()
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
