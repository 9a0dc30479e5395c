"""Limits on the request head (request line + headers) that uvicorn's httptools protocol lacks.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``, between requests only) and, with
its h11 protocol only, the size of a request head (``h11_max_incomplete_event_size``). With
httptools, which it prefers when installed, neither covers a head that is still arriving: a client
can send half a header and keep the connection, and its buffer, open for ever (a slow-loris
attack: enough of them fill ``limit_concurrency`` and every request gets 503), or send headers of
any size. ``tests/test_serving_head.py`` shows plain uvicorn keeping such a connection open.
``HeadLimitedProtocol`` adds both limits:

- a request head must arrive within ``head_timeout_s`` of the connection opening or of the
  request's first byte; otherwise the server answers 408 and closes the connection;
- a request head larger than ``max_header_bytes`` gets 431 and the connection is closed.

Both answers are JSON (``{"detail": ...}``), like every other error of the course's server. The
class extends the protocol uvicorn itself names for ``http="httptools"`` (its public
``uvicorn.config.HTTP_PROTOCOLS`` table) through httptools' parser callbacks
(``on_message_begin``, ``on_headers_complete``); a uvicorn release that renames those breaks the
tests of this module, not silently the server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

#: uvicorn's httptools protocol class (ImportError where httptools is not installed).
HttpToolsProtocol = import_from_string(HTTP_PROTOCOLS["httptools"])

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a time and a size limit on each request head."""

    head_timeout_s: float = 10.0
    max_header_bytes: int = 16_384

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._in_head = True

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, detail: str) -> None:
        """Answer ``status`` with a JSON body and close the connection."""
        if self.transport.is_closing():
            return
        body = json.dumps({"detail": detail}).encode()
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body)))
        self.transport.write(head + body)
        self.transport.close()

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(408, f"the request head did not arrive within {self.head_timeout_s:g} s")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the head timer as the connection opens."""
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the head timer."""
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Count the bytes of an unfinished head; refuse it once it is too large."""
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse(431, f"the request head is larger than {self.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        """A new request: its head gets a fresh clock and byte count."""
        super().on_message_begin()
        if not self._in_head:
            self._in_head, self._head_bytes = True, 0
        self._arm()

    def on_headers_complete(self) -> None:
        """The head is complete: stop counting and timing it."""
        self._in_head = False
        self._disarm()
        super().on_headers_complete()


def protocol_class(head_timeout_s: float, max_header_bytes: int) -> type[HeadLimitedProtocol]:
    """Return a ``HeadLimitedProtocol`` subclass with these limits (uvicorn builds protocols from a class)."""
    return type("CourseHttpProtocol", (HeadLimitedProtocol,),
                {"head_timeout_s": head_timeout_s, "max_header_bytes": max_header_bytes})
