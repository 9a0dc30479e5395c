"""Server-sent events, the course's one home for the stream format: writing it and reading it.

Every server of the course (``app``, notebook 10's LitServe app) writes its token stream with
``format_event`` / ``token_event``, and every client (``loadgen``, notebook 10's demo page) reads it with
``SSEParser``. The format, a small subset of the WHATWG ``text/event-stream`` one:

- a token: ``data: {"token": "<text>", "index": i}`` and a blank line (no ``event:`` line, so
  the default event type, "message"); indices count from 0 without gaps;
- the end: ``event: end`` then ``data: {"reason": "length", "tokens": n, ...}``;
- a failure after the stream started: ``event: error`` then ``data: {"detail", "status"}``.

The parser turns them into ``("token", text)``, ``("end", data)`` and ``("error", data)``.

The OpenAI-compatible routes (``openai_api``) write that API's stream with the same
``format_event``: ``data: {chunk}`` events with no type, then ``DONE``, a data line that is not JSON.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

#: What the parser calls a token event (the wire format leaves its type out: "message").
TOKEN = "token"
#: The event type of the last event of a finished stream.
END = "end"
#: The event type of a stream that failed after it started.
ERROR = "error"
#: Event types that carry a token: none given, or the SSE default it stands for.
_TOKEN_TYPES = (None, "message")

Event = tuple[str, Any]

#: The last event of an OpenAI-style stream.
DONE = "data: [DONE]\n\n"


class MalformedStream(ValueError):
    """A streamed response broke the expected format."""


def format_event(data: Mapping[str, Any], event: str | None = None) -> str:
    """Return one event as text: an ``event:`` line when ``event`` is given, one ``data:`` line
    holding ``data`` as JSON, and the blank line that ends the event."""
    if event is not None and (not event or any(c in event for c in "\r\n")):
        raise ValueError(f"an event type is a non-empty single line, got {event!r}")
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _load(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise MalformedStream(f"an event's data is not JSON ({err}): {data[:80]!r}") from None


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> str:
    return json.dumps(text)


def token_event(token: str, index: int) -> str:
    """Return the event of the ``index``-th token: exactly ``format_event({"token": token, "index": index})``,
    cheaper (a server writes one per token; the JSON of each token text is cached)."""
    return f'data: {{"token": {_json_string(token)}, "index": {int(index)}}}\n\n'


class SSEParser:
    """Incremental parser of the course's event stream; raises ``MalformedStream`` when it breaks the format.

    ``feed(line)`` takes decoded lines (a blank one ends an event); ``feed_bytes(chunk)`` takes raw
    body bytes as they arrive, split anywhere (the fast path the load generator uses: the client
    must not be the bottleneck it measures). Lines may end in LF or CRLF. Both return the events
    they completed. ``finish()`` says the body ended: it raises when an event was left half-written.
    """

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []
        self._index = 0
        self._buffer = b""

    def _token(self, payload: Any) -> Event:
        if (not isinstance(payload, dict) or type(payload.get("index")) is not int
                or payload["index"] != self._index or not isinstance(payload.get("token"), str)):
            raise MalformedStream(f"token event out of order or malformed: {str(payload)[:200]}")
        self._index += 1
        return (TOKEN, payload["token"])

    def feed_bytes(self, chunk: bytes) -> list[Event]:
        """Accumulate raw bytes; return the events completed by them."""
        self._buffer += chunk
        if b"\r" in self._buffer:  # CRLF line ends (a "\r" left at the end pairs with the next chunk's "\n")
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        *blocks, self._buffer = self._buffer.split(b"\n\n")
        events: list[Event] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # one token line: the common case
                events.append(self._token(_load(block[6:])))
                continue
            try:
                lines = block.decode("utf-8").split("\n")
            except UnicodeDecodeError as err:
                raise MalformedStream(f"the stream is not UTF-8: {err}") from None
            for line in [*lines, ""]:
                events += self.feed(line)
        return events

    def feed(self, line: str) -> list[Event]:
        """Accumulate one line; a blank line completes an event."""
        line = line.rstrip("\r")
        if line.startswith("event:"):
            self._event = line[6:].strip()
            return []
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip())
            return []
        if line.startswith(":"):  # a comment
            return []
        if line.strip():
            raise MalformedStream(f"unexpected line {line[:80]!r}")
        if not self._data:  # a blank line that completes nothing (it forgets a lone "event:" line)
            self._event = None
            return []
        kind, payload = self._event, _load("\n".join(self._data))
        self._event, self._data = None, []
        if kind in _TOKEN_TYPES:
            return [self._token(payload)]
        if kind in (END, ERROR):
            return [(kind, payload)]
        raise MalformedStream(f"unknown event type {kind!r}")

    def finish(self) -> list[Event]:
        """Say the body ended; return the event a last blank line would complete (line input
        without a final blank line), or raise ``MalformedStream`` if bytes of an event are left over."""
        if self._buffer.strip():
            raise MalformedStream(f"stream ended inside an event: {self._buffer[:80]!r}")
        self._buffer = b""
        return self.feed("")
