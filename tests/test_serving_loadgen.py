"""The load generator says what went wrong with a failed request: the error under httpx's, and when.

A server that resets the connection (RST, as a crashed or overloaded server's socket does) makes
httpx raise ``ReadError`` with no message of its own; the report's error line must still name the
socket error under it, whether the reset came before the response or in the middle of its stream.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from course_utils.serving.server.loadgen import describe_error, run_load
from raw_socket import recv_until


def test_describe_error_names_the_causes_under_a_message_less_error():
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as inner:
            raise httpx.ReadError("") from inner
    except httpx.ReadError as err:
        line = describe_error(err)
    assert line == "ReadError: (no message), caused by ConnectionResetError: [Errno 104] Connection reset by peer"
    assert line.split(":")[0] == "ReadError"  # notebook 13 counts failures by this first word


def test_describe_error_without_a_cause_is_type_and_message():
    assert describe_error(ValueError("bad")) == "ValueError: bad"
    assert describe_error(RuntimeError()) == "RuntimeError: (no message)"


def test_describe_error_stops_on_a_cycle_of_causes():
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert describe_error(a) == "ValueError: a, caused by ValueError: b"


@contextmanager
def resetting_server(head: bytes) -> Iterator[str]:
    """A TCP server on loopback that reads a request, writes ``head`` and resets the connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                recv_until(conn, lambda data: b"\r\n\r\n" in data)  # the request head
                if head:
                    conn.sendall(head)
                    # a reset discards what the client has not read yet: give it time to read the head
                    time.sleep(1.0)
                # linger 0: close() sends RST instead of FIN, as a socket closed with unread data does
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize("head, phase", [
    (b"", "before the response"),
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
     "during the 200 response"),
])
def test_a_reset_connection_is_reported_with_its_socket_error_and_phase(head, phase):
    with resetting_server(head) as url:
        report = run_load(url, concurrency=2, n_requests=2, max_new_tokens=2, timeout_s=10)
    assert report.n_ok == 0 and report.n_failed == 2 and len(report.errors) == 2
    for line in report.errors:
        assert "ConnectionResetError" in line, line
        assert f"; {phase}, " in line and line.endswith("s after the request"), line
