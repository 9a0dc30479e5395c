"""The load generator says what went wrong with a failed request: the error under httpx's, and when.

A server that resets the connection (RST, as a crashed or overloaded server's socket does) makes
httpx raise ``ReadError`` with no message of its own; the report's error line must still name the
socket error under it, whether the reset came before the response or in the middle of its stream. And the
load generator must not cause such resets itself by keeping idle connections as long as the server does.
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


def test_the_load_generator_drops_idle_connections_well_before_servers_close_them():
    """Equal idle timeouts race: on a busy machine the client reads a response late and reuses a connection
    the server is closing that moment, and the request gets "Connection reset by peer" instead of an answer
    (seen once in 1,000 requests at 64 clients in notebook 10 with a core busy). The pool's expiry stays below
    the course server's idle timeout and uvicorn's default (what a plain uvicorn server uses) by a clear
    margin."""
    import uvicorn

    from course_utils.serving.server.loadgen import KEEPALIVE_EXPIRY_S
    from course_utils.serving.server.settings import ServeSettings

    server_idle_s = min(ServeSettings().keep_alive_s, uvicorn.Config(app=None).timeout_keep_alive)
    assert 0 < KEEPALIVE_EXPIRY_S <= server_idle_s / 2


def test_the_course_server_keeps_idle_connections_longer_than_httpx_clients_do():
    """A learner's own httpx client (the OpenAI SDK's too) keeps idle connections 5 s by default: the server
    keeps them longer, so such a client closes them first and does not meet the race above (a client that
    keeps idle connections with no limit, as requests/urllib3 do, still can)."""
    from course_utils.serving.server.settings import ServeSettings

    assert ServeSettings().keep_alive_s >= 2 * httpx.Limits().keepalive_expiry


@pytest.mark.parametrize("expiry", [0, -1.0])
def test_run_load_rejects_a_pool_expiry_that_is_not_positive(expiry):
    with pytest.raises(ValueError, match="keepalive_expiry_s"):
        run_load("http://127.0.0.1:9", concurrency=1, n_requests=1, keepalive_expiry_s=expiry)


def test_run_load_hands_its_pool_expiry_to_httpx(monkeypatch):
    """The constant above only helps if the pool gets it: spy on the limits ``run_load`` builds."""
    from course_utils.serving.server.loadgen import KEEPALIVE_EXPIRY_S

    built: list[httpx.Limits] = []
    real_limits = httpx.Limits

    def spy(*args, **kwargs):
        built.append(real_limits(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(httpx, "Limits", spy)
    with resetting_server(b"") as url:
        run_load(url, concurrency=1, n_requests=1, max_new_tokens=2, timeout_s=10)
        run_load(url, concurrency=1, n_requests=1, max_new_tokens=2, timeout_s=10, keepalive_expiry_s=0.25)
    assert [limits.keepalive_expiry for limits in built] == [KEEPALIVE_EXPIRY_S, 0.25]
