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
- a request head larger than ``max_header_bytes`` gets 431 and the connection is closed;
- one client address may hold at most ``max_connections_per_client`` connections: a connection
  beyond that gets 503 (``Retry-After``) as it opens and is closed. uvicorn counts every open
  connection against ``limit_concurrency``, idle or not, so without this one client opening
  enough sockets would make every request of everybody, ``/health`` included, a 503.

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

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a time and a size limit on each request head."""

    head_timeout_s: float = 10.0
    max_header_bytes: int = 16_384
    max_connections_per_client: int | None = None
    #: Open connections per client address; ``protocol_class`` gives each server class its own.
    connections_by_client: dict[str, int] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._in_head = True
        self._client: str | None = None  # the address counted in connections_by_client

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
        retry = b"retry-after: 1\r\n" if status == 503 else b""
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s"
                b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body), retry))
        self.transport.write(head + body)
        self.transport.close()

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(408, f"the request head did not arrive within {self.head_timeout_s:g} s")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection against its client's share (503 beyond it); start the head timer."""
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        if self.max_connections_per_client is not None and isinstance(peer, tuple) and peer:
            self._client = str(peer[0])
            held = self.connections_by_client.get(self._client, 0) + 1
            self.connections_by_client[self._client] = held
            if held > self.max_connections_per_client:
                self._refuse(503, f"this client address already has {held - 1} connections open (at most "
                                  f"{self.max_connections_per_client}); close some or wait")
                return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the head timer; give the connection's place in its client's share back."""
        self._disarm()
        if self._client is not None:
            left = self.connections_by_client.get(self._client, 1) - 1
            if left > 0:
                self.connections_by_client[self._client] = left
            else:
                self.connections_by_client.pop(self._client, None)
            self._client = None
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


def protocol_class(head_timeout_s: float, max_header_bytes: int,
                   max_connections_per_client: int | None = None) -> type[HeadLimitedProtocol]:
    """Return a ``HeadLimitedProtocol`` subclass with these limits (uvicorn builds protocols from a
    class); it counts connections per client address in a table of its own."""
    return type("CourseHttpProtocol", (HeadLimitedProtocol,),
                {"head_timeout_s": head_timeout_s, "max_header_bytes": max_header_bytes,
                 "max_connections_per_client": max_connections_per_client, "connections_by_client": {}})
