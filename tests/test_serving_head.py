"""The request head's limits over real sockets: a slow head gets 408, a huge one 431 (course_utils.serving.server.http_head)."""

import json
import socket
import time

import httpx
import pytest

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.runner import ThreadedServer, http_protocol

HEAD_TIMEOUT = 1.0
MAX_HEAD = 4096


@pytest.fixture(scope="module")
def server():
    model, tok = load_tiny_gpt()
    settings = ServeSettings(embed=False, threads=1, head_timeout_s=HEAD_TIMEOUT, max_header_bytes=MAX_HEAD,
                             keep_alive_s=30.0)
    with ThreadedServer(settings, model=model, tokenizer=tok) as srv:
        yield srv


def _connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10 * HEAD_TIMEOUT + 5)


def _read_all(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (a socket timeout fails the test)."""
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def _status_and_detail(reply: bytes) -> tuple[int, str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["detail"]


def test_half_a_head_is_answered_408_and_closed(server):
    with _connect(server.url) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        reply = _read_all(sock)  # before the limit, uvicorn kept this connection open for good
        waited = time.monotonic() - start
    status, detail = _status_and_detail(reply)
    assert status == 408 and "did not arrive within" in detail
    assert waited >= HEAD_TIMEOUT * 0.9


def test_a_silent_connection_is_closed_too(server):
    with _connect(server.url) as sock:
        status, _ = _status_and_detail(_read_all(sock))
    assert status == 408


def test_a_head_over_the_limit_gets_431(server):
    with _connect(server.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (2 * MAX_HEAD))
        status, detail = _status_and_detail(_read_all(sock))
    assert status == 431 and str(MAX_HEAD) in detail


def test_normal_requests_and_keep_alive_are_untouched(server):
    with httpx.Client(timeout=30, trust_env=False) as client:
        for _ in range(3):  # one connection, several requests, idle gaps longer than the head timeout
            assert client.get(server.url + "/health", headers={"X-Fine": "b" * 1000}).status_code == 200
            time.sleep(HEAD_TIMEOUT * 1.5)
        resp = client.post(server.url + "/generate", json={"prompt": "to be", "max_new_tokens": 3})
        assert resp.status_code == 200, resp.text


def test_without_httptools_the_server_falls_back_to_h11(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_httptools(name, *args, **kwargs):
        if name.endswith("http_head") or name == "httptools":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_httptools)
    assert http_protocol(ServeSettings()) == "h11"


def test_plain_uvicorn_keeps_half_a_head_open_which_is_why_http_head_exists():
    """The attack uvicorn's own limits miss (the reason ``http_head`` subclasses its protocol): with
    httptools, a half-sent head outlives ``timeout_keep_alive`` and is never answered."""
    import threading

    import uvicorn

    async def app(scope, receive, send):  # never reached: the head is never complete
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, http="httptools", timeout_keep_alive=1,
                            log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (server.started and server.servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3 * HEAD_TIMEOUT) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            with pytest.raises(TimeoutError):  # nothing comes back, and the connection stays open
                sock.recv(1)
    finally:
        server.should_exit = True
        thread.join(10)
