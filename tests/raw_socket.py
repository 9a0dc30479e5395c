"""Reading raw HTTP bytes in tests that speak to a server (or play one) below httpx."""

from __future__ import annotations

import socket
from collections.abc import Callable


def recv_until(sock: socket.socket, done: Callable[[bytes], bool]) -> bytes:
    """Read from ``sock`` until ``done(everything read so far)`` or the peer closes; return what was read."""
    data = b""
    while not done(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
