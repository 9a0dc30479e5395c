"""The server's front door over real HTTP: Host header check, body size cap, uvicorn limits, warnings."""

import argparse
import contextlib
import json
import socket
import time

import httpx
import pytest

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.guards import host_name
from course_utils.serving.server.runner import ThreadedServer, exposure_warning
from raw_socket import recv_until
from course_utils.serving.server.settings import add_cli_arguments, settings_from_args

TIMEOUT = httpx.Timeout(30.0)
LIMIT = 2000


@pytest.fixture(scope="module")
def server():
    model, tok = load_tiny_gpt()
    settings = ServeSettings(embed=False, threads=1, max_body_bytes=LIMIT, allow_hosts=("MyHost.lan",),
                             limit_concurrency=100, keep_alive_s=2.5, max_header_bytes=8192)
    with ThreadedServer(settings, model=model, tokenizer=tok) as srv:
        yield srv


def raw_exchange(url: str, data: bytes) -> tuple[bytes, bytes]:
    """Send raw bytes to the server; return (status line, body) of its answer."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        reply = recv_until(sock, lambda data: b"\r\n\r\n" in data and data.rstrip().endswith(b"}"))
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost", "LocalHost:1", "[::1]:8000",
                                  "127.0.0.2", "myhost.lan", "myhost.lan:8000"])
def test_loopback_and_allowed_host_names_are_served(server, host):
    resp = httpx.get(server.url + "/health", headers={"host": host}, timeout=TIMEOUT, trust_env=False)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "localhost.evil.example:80", "myhost.lan.evil.example", "0.0.0.0:8000",
                                  "192.168.1.7", "[::2]:8000", ""])
def test_other_host_names_get_400(server, host):
    for method, path in (("GET", "/health"), ("POST", "/generate")):
        resp = httpx.request(method, server.url + path, headers={"host": host}, json={"prompt": "a"},
                             timeout=TIMEOUT, trust_env=False)
        assert resp.status_code == 400 and "--allow-host" in resp.json()["detail"], (host, resp.text)


def test_host_name_parsing():
    assert host_name("[::1]:8000") == "::1" and host_name("LOCALHOST:80") == "localhost"
    assert host_name("example.com.") == "example.com" and host_name("::1") == "::1"


def test_a_body_over_the_limit_is_413_whether_announced_or_chunked(server):
    head = b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    status, body = raw_exchange(server.url, head + b"Content-Length: 50000000\r\n\r\n" + b"x" * 10_000)
    assert status.startswith(b"HTTP/1.1 413") and b"larger than 2000 bytes" in body
    chunks = b"".join(b"%x\r\n%s\r\n" % (500, b" " * 500) for _ in range(6)) + b"0\r\n\r\n"
    status, body = raw_exchange(server.url, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    assert status.startswith(b"HTTP/1.1 413") and b"larger than 2000 bytes" in body
    resp = httpx.post(server.url + "/generate", content=b" " * (LIMIT + 1), timeout=TIMEOUT, trust_env=False)
    assert resp.status_code == 413 and "larger than" in resp.json()["detail"]


def test_guard_answers_on_v1_paths_have_the_openai_error_shape(server):
    resp = httpx.post(server.url + "/v1/completions", content=b" " * (LIMIT + 1), timeout=TIMEOUT, trust_env=False)
    error = resp.json()["error"]
    assert resp.status_code == 413 and "larger than" in error["message"] and error["code"] == "body_too_large"
    assert error["type"] == "invalid_request_error" and "param" in error
    resp = httpx.get(server.url + "/v1/models", headers={"host": "evil.example"}, timeout=TIMEOUT, trust_env=False)
    assert resp.status_code == 400 and "--allow-host" in resp.json()["error"]["message"]
    resp = httpx.get(server.url + "/v1x", headers={"host": "evil.example"}, timeout=TIMEOUT, trust_env=False)
    assert resp.status_code == 400 and "--allow-host" in resp.json()["detail"]  # only /v1 itself and below


def test_a_body_under_the_limit_reaches_the_app_whole(server):
    padded = b'{"prompt": "The ", ' + b" " * (LIMIT - 60) + b'"max_new_tokens": 3}'
    resp = httpx.post(server.url + "/generate", content=padded, headers={"content-type": "application/json"},
                      timeout=TIMEOUT, trust_env=False)
    assert len(padded) <= LIMIT and resp.status_code == 200 and "event: end" in resp.text


def test_uvicorn_limits_come_from_the_settings(server):
    config = server.server.config
    assert config.limit_concurrency == 100 and config.timeout_keep_alive == 2.5
    assert config.h11_max_incomplete_event_size == 8192
    defaults = ServeSettings()
    assert defaults.limit_concurrency >= 64 and defaults.max_body_bytes == 1_048_576
    # one address's shares leave room for notebook 10's load generator (64 at once) plus a /health poller,
    # and stay below limit_concurrency, so one address can never take every slot
    for share in (defaults.max_requests_per_client, defaults.max_connections_per_client):
        assert 64 < share < defaults.limit_concurrency


def test_a_non_loopback_bind_address_is_warned_about():
    for host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        assert exposure_warning(ServeSettings(host=host)) is None
    warning = exposure_warning(ServeSettings(host="0.0.0.0"))
    assert warning and "no authentication" in warning and "--allow-host" in warning
    assert "lab.example" in exposure_warning(ServeSettings(host="0.0.0.0", allow_hosts=("lab.example",)))


def test_the_new_settings_round_trip_through_the_cli():
    settings = ServeSettings(allow_hosts=("a.lan", "b.lan"), max_body_bytes=5000, embed_queue_texts=128,
                             limit_concurrency=64, keep_alive_s=1.5, max_header_bytes=4096)
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    assert settings_from_args(parser.parse_args(settings.to_cli_args())) == settings
    assert settings_from_args(parser.parse_args([])).allow_hosts == ()
    with pytest.raises(ValueError, match="embed_queue_texts"):
        ServeSettings(embed_queue_texts=10)  # less than one full /embed request


def test_the_command_line_is_derived_from_every_setting():
    """Each field is an option with help text; changing every field at once survives the round trip."""
    from dataclasses import fields

    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    help_text = parser.format_help()
    for f in fields(ServeSettings):
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert (f.metadata.get("flag") or "--" + f.name.replace("_", "-")) in help_text
    changed = ServeSettings(host="0.0.0.0", port=8123, batching="static", max_batch_size=4, max_wait_ms=1.0,
                            queue_size=8, queue_timeout_s=2.0, max_prompt_chars=64, max_new_tokens_limit=32,
                            compile=True, embed=False, threads=2, model="m.pt", log_level="info",
                            graceful_timeout_s=1.0, stream_interval_ms=0.0, max_body_bytes=2048,
                            embed_queue_texts=64, limit_concurrency=16, keep_alive_s=2.0,
                            max_header_bytes=2048, head_timeout_s=3.0, allow_hosts=("x.lan",),
                            prefix_cache_mb=2.5, engine_process=True, token_budget=64, body_timeout_s=4.0,
                            max_connections_per_client=12, max_requests_per_client=6, max_stop_chars=16)
    unchanged = [f.name for f in fields(ServeSettings) if getattr(changed, f.name) == getattr(ServeSettings(), f.name)]
    assert not unchanged, f"this test no longer changes {unchanged}: add them"
    assert settings_from_args(parser.parse_args(changed.to_cli_args())) == changed
    with pytest.raises(SystemExit):
        parser.parse_args(["--batching", "sometimes"])


# ---- one client cannot hold the server: body deadline, per-client shares ---------------------

BODY_TIMEOUT = 1.5
HOSTILE = "127.0.0.66"  # another loopback address: the server sees it as another client


@pytest.fixture(scope="module")
def small_server():
    model, tok = load_tiny_gpt()
    settings = ServeSettings(embed=False, threads=1, limit_concurrency=24, max_connections_per_client=8,
                             max_requests_per_client=4, body_timeout_s=BODY_TIMEOUT, keep_alive_s=30.0,
                             head_timeout_s=2.0)
    with ThreadedServer(settings, model=model, tokenizer=tok) as srv:
        yield srv


def open_socket(url: str, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    """Return a socket connected to the server from the loopback address ``source``."""
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    return sock


def read_reply(sock: socket.socket) -> tuple[int, dict, bytes]:
    """Read one whole answer (the server closes the connection after it); return (status, headers, body).
    Status 0: the connection was reset before any answer could be read (a server closing a socket
    with unread bytes resets it, which may discard its answer)."""
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except ConnectionResetError:
        if not reply:
            return 0, {}, b""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
    return int(lines[0].split()[1]), headers, body


STALLED_HEAD = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n")


@pytest.mark.parametrize("path", [b"/generate", b"/v1/completions"])
def test_a_body_that_never_arrives_is_408_after_the_body_timeout(small_server, path):
    with open_socket(small_server.url) as sock:
        start = time.monotonic()
        sock.sendall(STALLED_HEAD % path + b'{"prompt": ')  # a head, then part of the body, then nothing
        status, headers, body = read_reply(sock)  # before the fix: no answer, the connection stayed open
        waited = time.monotonic() - start
    assert status == 408 and headers[b"connection"] == b"close", body
    message = json.loads(body)["error"]["message"] if path.startswith(b"/v1") else json.loads(body)["detail"]
    assert "did not arrive within 1.5 s" in message
    assert BODY_TIMEOUT * 0.9 <= waited < BODY_TIMEOUT + 5


def test_one_client_holding_many_sockets_leaves_the_others_served(small_server):
    """A client on another loopback address opens more sockets than limit_concurrency (half with a
    complete head and a body that never comes, half silent): it gets its share, the rest are
    refused, and a client on 127.0.0.1 keeps getting answers; /health answers within 1 s throughout."""
    url = small_server.url
    hostile = []
    try:
        for i in range(40):
            sock = open_socket(url, HOSTILE)
            if i % 2 == 0:
                sock.sendall(STALLED_HEAD % b"/generate")
            hostile.append(sock)
        slowest = 0.0
        deadline = time.monotonic() + 2 * BODY_TIMEOUT
        with httpx.Client(timeout=TIMEOUT, trust_env=False) as client:
            while time.monotonic() < deadline:
                start = time.monotonic()
                health = client.get(url + "/health")
                slowest = max(slowest, time.monotonic() - start)
                assert health.status_code == 200, health.text  # before the fix: 503, every slot was taken
                resp = client.post(url + "/generate", json={"prompt": "The ", "max_new_tokens": 4})
                assert resp.status_code == 200 and "event: end" in resp.text, resp.text
        assert slowest < 1.0, slowest
        statuses = []
        for sock in hostile:
            sock.settimeout(BODY_TIMEOUT + 5)
            statuses.append(read_reply(sock)[0])
        # its share: 8 connections (the rest 503 as they opened), 4 of them stalled bodies, 4 silent heads
        refused = statuses.count(503) + statuses.count(0)
        assert refused == 40 - 8 and statuses.count(408) == 8 and statuses.count(503), statuses
    finally:
        for sock in hostile:
            sock.close()


def test_over_the_request_share_is_429_with_retry_after_in_both_shapes(small_server):
    with contextlib.ExitStack() as stack:
        stalled = [stack.enter_context(open_socket(small_server.url)) for _ in range(4)]
        for sock in stalled:
            sock.sendall(STALLED_HEAD % b"/generate")
        time.sleep(0.3)
        for path, shape in ((b"/generate", "detail"), (b"/v1/completions", "error")):
            with open_socket(small_server.url) as sock:
                sock.sendall(STALLED_HEAD % path)
                status, headers, body = read_reply(sock)
            assert status == 429 and headers[b"retry-after"] == b"1" and shape in json.loads(body), body
