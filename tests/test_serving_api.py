"""The model server over real HTTP (uvicorn on loopback in a thread): streaming, limits, metrics."""

import contextlib
import socket
import time

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.loadgen import SSEParser, run_load
from course_utils.serving.server.runner import ThreadedServer
from raw_socket import recv_until

TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def gpt():
    return load_tiny_gpt()


@pytest.fixture(scope="module")
def server(gpt):
    model, tok = gpt
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        yield srv


def metrics(url: str) -> dict[str, float]:
    """Return {sample name with labels: value} from /metrics."""
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def stream_events(url: str, body: dict) -> tuple[int, list]:
    """POST /generate and return (status, events) with events as (kind, value)."""
    parser, events = SSEParser(), []
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("POST", url + "/generate", json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, [("json", resp.json())]
        for line in resp.iter_lines():
            events += parser.feed(line)
    return 200, events


@contextlib.contextmanager
def one_thread():
    """Small single-sequence forwards: one thread (two fight each other on a busy 2-core box)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def greedy_agrees(model, tok, prompt: str, served: str) -> bool:
    """Served text equals the model's offline greedy continuation, except after an exact near-tie."""
    ids = torch.tensor([tok.encode(prompt)])
    with one_thread(), torch.inference_mode():
        offline = model.generate(ids, len(served), temperature=0)[0, ids.shape[1]:].tolist()
        got = tok.encode(served)
        for i, (a, b) in enumerate(zip(offline, got)):
            if a != b:
                logits = model(torch.tensor([tok.encode(prompt) + got[:i]]))[0, -1]
                top = torch.topk(logits, 2).values
                return float(top[0] - top[1]) < 1e-4 and float(logits[a] - logits[b]) < 1e-4
    return True


def test_health_and_metrics_format(server):
    body = httpx.get(server.url + "/health", timeout=TIMEOUT).json()
    assert body["status"] == "ok" and body["batching"] == "iteration" and body["embed"] is False
    m = metrics(server.url)
    for name in ("serve_queue_depth", "serve_active_sequences", "serve_batch_size_count",
                 "serve_request_latency_seconds_count", "serve_tokens_generated_total",
                 "serve_tokens_per_second"):
        assert name in m, name
    assert server.url.startswith("http://127.0.0.1:")


def test_stream_format_and_end_event(server):
    status, events = stream_events(server.url, {"prompt": "The ", "max_new_tokens": 7})
    assert status == 200
    kinds = [k for k, _ in events]
    assert kinds == ["token"] * 7 + ["end"]
    end = events[-1][1]
    assert end["reason"] == "length" and end["tokens"] == 7 and end["latency_ms"] >= end["ttft_ms"] > 0


@pytest.mark.parametrize("body, fragment", [
    ({"prompt": ""}, "at least 1 character"),
    ({"prompt": "x" * 257}, "at most 256 characters"),
    ({"prompt": "caf\u00e9"}, "not in the vocabulary"),
    ({"prompt": "a", "max_new_tokens": 2.5}, "valid integer"),
    ({"prompt": "a", "max_new_tokens": "8"}, "valid integer"),
    ({"prompt": "a", "max_new_tokens": 0}, "greater than or equal to 1"),
    ({"prompt": "a", "max_new_tokens": 257}, "less than or equal to 256"),
    ({"prompt": "a", "temperature": 2.5}, "less than or equal to 2"),
    ({"prompt": "a", "temperature": -1}, "greater than or equal to 0"),
    ({"prompt": "a", "temperature": 1e-40}, "0 (greedy) or between 0.01 and 2.0"),
    ({"prompt": "a", "seed": 2**64}, "less than or equal to 9223372036854775807"),
    ({"prompt": "a", "seed": -1}, "greater than or equal to 0"),
    ({"max_new_tokens": 4}, "Field required"),
    ({"prompt": "a", "unknown": 1}, "Extra inputs are not permitted"),
])
def test_bad_input_is_422_with_a_message(server, body, fragment):
    resp = httpx.post(server.url + "/generate", json=body, timeout=TIMEOUT)
    assert resp.status_code == 422
    assert fragment in str(resp.json()["detail"])


@pytest.mark.parametrize("raw, loc", [
    (b'{"prompt": "a", "temperature": NaN}', ["body", "temperature"]),
    (b'{"prompt": "a", "temperature": -Infinity}', ["body", "temperature"]),
    (b'{"prompt": "a", "max_new_tokens": Infinity}', ["body", "max_new_tokens"]),
    (b'{"prompt": "a", "seed": NaN}', ["body", "seed"]),
    (b'{"prompt": "\\ud800"}', ["body", "prompt"]),
    (b'{"prompt": "a", "\\ud800": NaN}', ["body"]),  # (pydantic cannot read the key)
    (b'{"prompt": "a", "n": [NaN, "\\udfff"]}', ["body", "n"]),
])
def test_non_finite_numbers_and_lone_surrogates_are_422_not_500(server, raw, loc):
    resp = httpx.post(server.url + "/generate", content=raw, headers={"content-type": "application/json"},
                      timeout=TIMEOUT)
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert detail[0]["loc"] == loc
    assert all(set(error) == {"loc", "msg", "type"} for error in detail)


@pytest.mark.parametrize("body", [
    {"prompt": "ECHO" * 2000}, {"prompt": "a", "max_new_tokens": "ECHO" * 2000},
    {"prompt": "a", "unknown": "ECHO" * 2000}, ["ECHO" * 2000], "ECHO" * 2000,
])
def test_validation_errors_do_not_echo_the_input(server, body):
    resp = httpx.post(server.url + "/generate", json=body, timeout=TIMEOUT)
    assert resp.status_code == 422 and "ECHO" not in resp.text and len(resp.content) < 2000


def test_a_50_mb_body_is_refused_with_413_before_it_is_read(server):
    port = int(server.url.rsplit(":", 1)[1])
    head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b'{"prompt": "' + b"a" * 60_000)
        reply = recv_until(sock, lambda data: b"}" in data)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"larger than 1048576 bytes" in body


def test_malformed_json_is_422(server):
    resp = httpx.post(server.url + "/generate", content=b'{"prompt": "a",', timeout=TIMEOUT,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "JSON decode error" in resp.text


def test_64_concurrent_streams_are_complete_ordered_and_unmixed(server, gpt):
    model, tok = gpt
    prompts = [f"{w} {i}" for i, w in enumerate(["The object", "A class", "If the value", "Return the"] * 16)]
    report = run_load(server.url, concurrency=64, n_requests=64, prompts=prompts, max_new_tokens=24,
                      timeout_s=60, keep_texts=True)
    assert report.n_ok == 64, report.errors
    assert report.tokens == 64 * 24
    mismatched = [p for p, text in zip(prompts, report.texts) if not greedy_agrees(model, tok, p, text)]
    assert not mismatched, mismatched
    assert len(set(report.texts)) > 16  # distinct prompts, distinct continuations


def test_sampling_with_a_seed_is_reproducible(server):
    body = {"prompt": "The ", "max_new_tokens": 20, "temperature": 1.0, "seed": 7}
    a = "".join(v for k, v in stream_events(server.url, body)[1] if k == "token")
    b = "".join(v for k, v in stream_events(server.url, body)[1] if k == "token")
    assert a == b and len(a) == 20


def test_disconnect_mid_stream_frees_the_batch_row(server):
    before = metrics(server.url).get("serve_requests_total{outcome=cancelled}", 0.0)
    with httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("POST", server.url + "/generate", json={"prompt": "The ", "max_new_tokens": 256}) as resp:
            for i, _ in enumerate(resp.iter_lines()):
                if i >= 6:
                    break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = metrics(server.url)
        if m["serve_active_sequences"] == 0 and m.get("serve_requests_total{outcome=cancelled}", 0) > before:
            break
        time.sleep(0.05)
    assert m["serve_active_sequences"] == 0
    assert m["serve_requests_total{outcome=cancelled}"] == before + 1
    assert m["serve_tokens_generated_total"] > 0


def test_loadgen_parser_rejects_malformed_streams():
    p = SSEParser()
    assert p.feed('data: {"token": "a", "index": 0}') == [] and p.feed("") == [("token", "a")]
    with pytest.raises(ValueError, match="out of order"):
        p.feed('data: {"token": "b", "index": 5}')
        p.feed("")
    with pytest.raises(ValueError, match="unexpected line"):
        SSEParser().feed("garbage")
