"""Notebook 10's LitServe app (its ``litserve_app.py`` cell): real HTTP over loopback, streams parsed by the
course's load generator."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

pytest.importorskip("litserve")

from course_utils.models.gpt import generate_cached  # noqa: E402
from course_utils.serving.server.app import generate_request_model  # noqa: E402
from course_utils.serving.server.loadgen import SSEParser, run_load  # noqa: E402
from course_utils.serving.server.settings import ServeSettings  # noqa: E402
from notebook_files import written_module  # noqa: E402

LITSERVE = written_module("10_serving.ipynb", "APPS", "litserve_app")

ROUTE, build_server, decode_rows, litserve_process, load_model, parse_args, request_model, row_generator = (
    getattr(LITSERVE, name) for name in ("ROUTE", "build_server", "decode_rows", "litserve_process", "load_model",
                                         "parse_args", "request_model", "row_generator"))

PROMPTS = ["The ", "A class ", "def main(", "import os\n"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model()


@pytest.fixture(scope="module")
def server():
    with litserve_process(max_batch_size=8, batch_timeout=0.05, startup_timeout_s=120) as srv:
        yield srv


def greedy_text(model, tok, prompt: str, n: int) -> str:
    return tok.decode(generate_cached(model, torch.tensor([tok.encode(prompt)]), n)[0])


def test_greedy_decode_rows_match_uncached_generate(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = [tok.encode(p) for p in PROMPTS]  # different lengths in one batch
    limits = [NEW_TOKENS, 5, NEW_TOKENS, 1]
    steps = list(decode_rows(model, ids, limits))
    assert len(steps) == max(limits)
    for row, prompt in enumerate(PROMPTS):
        got = [s[row] for s in steps if s[row] is not None]
        full = model.generate(torch.tensor([tok.encode(prompt)]), limits[row], temperature=0.0)
        assert got == full[0, len(ids[row]):].tolist(), prompt
        assert all(s[row] is None for s in steps[limits[row]:])


def test_streamed_response_is_parsed_and_matches_greedy(server, model_and_tokenizer):
    model, tok = model_and_tokenizer
    parser = SSEParser()
    tokens, ends = [], []
    body = {"prompt": PROMPTS[0], "max_new_tokens": NEW_TOKENS, "temperature": 0.0}
    with httpx.Client(timeout=60, trust_env=False) as client:
        with client.stream("POST", server.url + ROUTE, json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                for kind, value in parser.feed(line):
                    (tokens if kind == "token" else ends).append(value)
    assert ends == [{"reason": "length", "tokens": NEW_TOKENS}]
    assert "".join(tokens) == greedy_text(model, tok, PROMPTS[0], NEW_TOKENS)


def test_concurrent_clients_are_batched_without_mixing(server, model_and_tokenizer):
    model, tok = model_and_tokenizer
    report = run_load(server.url, concurrency=8, n_requests=16, prompts=PROMPTS,
                      max_new_tokens=NEW_TOKENS, path=ROUTE, keep_texts=True, timeout_s=60)
    assert report.n_lost == 0, report.errors
    expected = {p: greedy_text(model, tok, p, NEW_TOKENS) for p in PROMPTS}
    for i, text in enumerate(report.texts):
        assert text == expected[PROMPTS[i % len(PROMPTS)]], i


@pytest.mark.parametrize("body", [
    {"prompt": "", "max_new_tokens": 4},
    {"prompt": "x" * 300, "max_new_tokens": 4},
    {"prompt": "ok", "max_new_tokens": 0},
    {"prompt": "ok", "max_new_tokens": "many"},
    {"prompt": "ok", "max_new_tokens": 4, "temperature": 0.001},
    {"prompt": "ok", "max_new_tokens": 4, "seed": -1},
    {"prompt": "caf\u00e9", "max_new_tokens": 4},
    {"prompt": "ok", "max_new_tokens": 4, "top_k": 5},
])
def test_bad_requests_get_422(server, body):
    resp = httpx.post(server.url + ROUTE, json=body, timeout=30, trust_env=False)
    assert resp.status_code == 422, resp.text
    # and the server still answers good requests afterwards
    ok = httpx.post(server.url + ROUTE, json={"prompt": "ok", "max_new_tokens": 2}, timeout=30, trust_env=False)
    assert ok.status_code == 200 and "event: end" in ok.text


def test_the_request_model_is_our_servers_with_the_same_limits(model_and_tokenizer):
    from pydantic import ValidationError

    _, tok = model_and_tokenizer
    ours = generate_request_model(ServeSettings(), tok).model_json_schema()
    theirs = request_model(tokenizer=tok).model_json_schema()
    assert theirs["properties"] == ours["properties"] and theirs.get("required") == ours.get("required")
    small = request_model(ServeSettings(max_prompt_chars=5, max_new_tokens_limit=3), tok)
    assert small(prompt="abcde", max_new_tokens=3).max_new_tokens == 3
    for bad in ({"prompt": "abcdef"}, {"prompt": "a", "max_new_tokens": 4}, {"prompt": "a", "stream": False}):
        with pytest.raises(ValidationError):
            small.model_validate(bad)


def test_the_request_pickles_as_a_plain_dict_for_the_worker(model_and_tokenizer):
    import pickle

    _, tok = model_and_tokenizer
    body = request_model(tokenizer=tok)(prompt="The ", max_new_tokens=3, temperature=0.5, seed=7)
    assert pickle.loads(pickle.dumps(body)) == {"prompt": "The ", "max_new_tokens": 3, "temperature": 0.5,
                                                "seed": 7}


def sampled(model, prompts: list[list[int]], n: int, temperature: float, seeds: list[int]) -> list[tuple]:
    """Return each row's ``n`` tokens from ``decode_rows`` with one seeded generator per row."""
    steps = decode_rows(model, prompts, [n] * len(prompts), [temperature] * len(prompts),
                        [row_generator(temperature, seed) for seed in seeds])
    return list(zip(*steps))


def test_sampled_rows_follow_their_own_seed_whatever_the_batch(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:3]]
    alone = sampled(model, [ids[1]], 8, 0.8, [5])[0]
    assert sampled(model, ids, 8, 0.8, [9, 5, 11])[1] == alone  # its neighbours change nothing
    assert sampled(model, [ids[1]], 8, 0.8, [5])[0] == alone
    others = {sampled(model, [ids[1]], 8, 0.8, [seed])[0] for seed in (6, 7, 8)}
    assert others - {alone}  # the seed matters
    assert row_generator(0.0, 5) is None


def test_a_sampled_request_streams_the_tokens_its_seed_gives(server, model_and_tokenizer):
    model, tok = model_and_tokenizer
    body = {"prompt": "The ", "max_new_tokens": 10, "temperature": 0.9, "seed": 1234}
    expected = tok.decode(list(sampled(model, [tok.encode("The ")], 10, 0.9, [1234])[0]))
    texts = []
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
        for _ in range(2):
            parser, tokens = SSEParser(), []
            resp = client.post(ROUTE, json=body)
            assert resp.status_code == 200, resp.text
            for line in resp.text.splitlines():
                tokens += [value for kind, value in parser.feed(line) if kind == "token"]
            texts.append("".join(tokens))
    assert texts == [expected, expected]


# ---- the HTTP front: the same guards as our server's /generate --------------------------------
NAN, INF = float("nan"), float("inf")
VALID = {"prompt": "The ", "max_new_tokens": 4, "temperature": 0.0, "seed": 1}
# Values each field must refuse (JSON carries all of them; NaN and Infinity as bare words).
BAD_VALUES = {
    "prompt": [None, 1, True, [], {}, "", "x" * 257, "x" * 100_000, "\ud800", "a\udfffb", "caf\u00e9", NAN,
               ["The "]],
    "max_new_tokens": [None, 0, -1, 257, 2**64, 10**400, 1.5, "8", True, NAN, INF, [4]],
    "temperature": [None, -1, 2.5, 1e-40, 1e-3, 1e308, NAN, INF, -INF, "hot", [0.5]],
    "seed": [-1, 2**63, 2**64, 1.5, "7", True, NAN, INF, [1]],
}
JSON = "application/json"


def encode(value: object) -> bytes:
    """JSON text of ``value``: NaN/Infinity as bare words, lone surrogates as \\u escapes."""
    return json.dumps(value, allow_nan=True).encode()


def bad_value_cases() -> list[tuple[str, str, bytes]]:
    """(field, description, body): a valid body with exactly one field's value wrong."""
    cases = []
    for field, values in BAD_VALUES.items():
        for value in values:
            body = encode({**VALID, field: value})
            cases.append((field, f"{field}={body[:60]!r}", body))
    return cases


# Bodies broken in their shape, not in one field's value (each must get a 4xx with a JSON detail).
SHAPE_CASES = [
    ("extra field", encode({**VALID, "top_k": 5}), JSON),
    ("extra field with a surrogate name", encode({**VALID, "\ud800": NAN}), JSON),
    ("missing prompt", encode({"max_new_tokens": 4}), JSON),
    ("a list", encode([VALID]), JSON),
    ("a string", encode(json.dumps(VALID)), JSON),
    ("null", b"null", JSON),
    ("bare NaN", b"NaN", JSON),
    ("truncated JSON", encode(VALID)[:10], JSON),
    ("single quotes", b"{'prompt': 'The '}", JSON),
    ("invalid UTF-8", b'{"prompt": "T\xff\xfe"}', JSON),
    ("deep nesting", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON),
    ("empty body", b"", JSON),
    ("plain text", encode(VALID), "text/plain"),
    ("a form", b"prompt=The+", "application/x-www-form-urlencoded"),
]


def post_raw(client: httpx.Client, body: bytes, ctype: str = JSON) -> httpx.Response:
    return client.post(ROUTE, content=body, headers={"content-type": ctype})


def answer(client: httpx.Client, body: bytes, ctype: str = JSON) -> tuple[int, str, object]:
    """POST ``body``; return (status, text, parsed JSON or None); status 0 when the connection failed."""
    try:
        resp = post_raw(client, body, ctype)
    except httpx.TransportError as err:  # e.g. the server reset the connection
        return 0, f"{type(err).__name__}: {err}", None
    try:
        return resp.status_code, resp.text, resp.json()
    except ValueError:  # not JSON
        return resp.status_code, resp.text, None


def assert_works(client: httpx.Client) -> None:
    """A valid request still streams its tokens."""
    resp = client.post(ROUTE, json={"prompt": "The ", "max_new_tokens": 3})
    assert resp.status_code == 200 and resp.text.count('data: {"token"') == 3 and "event: end" in resp.text


def test_fuzz_malformed_bodies_get_a_json_4xx_that_names_the_field_and_the_server_keeps_serving(server):
    bad = []
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
        for field, case, body in bad_value_cases():
            status, text, parsed = answer(client, body)
            detail = parsed.get("detail") if isinstance(parsed, dict) else None
            ok = (status == 422 and isinstance(detail, list)
                  and any(e.get("loc") == ["body", field] for e in detail)  # names the field
                  and all("input" not in e for e in detail) and "xxxxxxxxxx" not in text)  # not the value
            if not ok:
                bad.append(f"{case} -> {status} {text[:150]!r}")
        for case, body, ctype in SHAPE_CASES:
            status, text, parsed = answer(client, body, ctype)
            if not (400 <= status < 500 and isinstance(parsed, dict) and "detail" in parsed):
                bad.append(f"{case} -> {status} {text[:150]!r}")
        n = len(bad_value_cases()) + len(SHAPE_CASES)
        assert not bad, f"{len(bad)} of {n} malformed bodies got no proper 4xx:\n" + "\n".join(bad)
        assert_works(client)


def test_a_body_over_the_limit_gets_413_before_it_is_read(server):
    limit = ServeSettings().max_body_bytes
    big = b'{"prompt": "' + b"a" * (limit + 10) + b'"}'
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
        resp = post_raw(client, big)
        assert resp.status_code == 413 and f"larger than {limit} bytes" in resp.json()["detail"]

        def chunks():  # no Content-Length: the cap counts while reading
            for i in range(0, len(big), 65536):
                yield big[i:i + 65536]

        resp = client.post(ROUTE, content=chunks(), headers={"content-type": JSON})
        assert resp.status_code == 413, resp.text
        assert_works(client)


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.evil.example:8001", "192.168.1.7"])
def test_a_host_header_that_is_not_loopback_gets_400(server, host):
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
        for method, path in (("GET", "/health"), ("POST", ROUTE)):
            resp = client.request(method, path, json=VALID, headers={"host": host})
            assert resp.status_code == 400 and "--allow-host" in resp.json()["detail"], (host, resp.text)
        assert client.get("/health").status_code == 200


def test_the_command_line_sets_the_body_cap_and_allowed_hosts(capsys):
    args, settings = parse_args(["--max-body-bytes", "5000", "--allow-host", "box.lan", "--allow-host", "b"])
    assert settings.max_body_bytes == 5000 and settings.allow_hosts == ("box.lan", "b")
    assert parse_args([])[1] == ServeSettings()
    with pytest.raises(SystemExit):
        parse_args(["--max-body-bytes", "0"])
    assert "max_body_bytes=0" in capsys.readouterr().err


def test_a_model_too_short_for_the_limits_is_refused_at_build_time():
    with pytest.raises(ValueError, match="exceeds the model's block_size 512"):
        build_server(settings=ServeSettings(max_prompt_chars=300, max_new_tokens_limit=300))


def test_a_request_head_over_the_limit_gets_431(server):
    """The LitServe front has our server's request-head limits too (course_utils.serving.server.http_head)."""
    import socket

    limit = ServeSettings().max_header_bytes
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (2 * limit))
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert str(limit).encode() in reply


def test_a_taken_port_is_one_clear_line_and_the_running_app_keeps_serving(server):
    """The app binds its port before loading the model: someone else's server there is an error, never a shared port."""
    import subprocess

    port = int(server.url.rsplit(":", 1)[1])
    cmd = LITSERVE.command(port)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=server.env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr and "--port 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert httpx.get(server.url + "/health", timeout=10, trust_env=False).status_code == 200
