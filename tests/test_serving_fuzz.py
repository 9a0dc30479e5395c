"""Fuzzing /generate and /embed over real HTTP: every malformed request gets a 4xx with a JSON body,
and the server still serves afterwards.

Each body is a valid request broken in exactly one way (a wrong value for one field, an unknown
field, a missing field, a body that is not an object, bytes that are not JSON or not UTF-8, deep
nesting, a wrong content type, too many bytes), so none of them may succeed. The random choices
are seeded: a failure reproduces.
"""

import json
import random
import time

import httpx
import torch

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.runner import ThreadedServer

N_BODIES = 300
TIME_BUDGET_S = 120.0
NAN, INF = float("nan"), float("inf")

VALID = {"/generate": {"prompt": "The ", "max_new_tokens": 4, "temperature": 0.5, "seed": 1},
         "/embed": {"texts": ["hello", "world"]}}
# Values each field must refuse (JSON can carry all of them; NaN and Infinity as bare words).
INVALID = {
    "prompt": [None, 1, 1.5, True, [], {}, "", "x" * 257, "\ud800", "a\udfffb", "caf\u00e9", 10**400, NAN,
               ["The "], {"text": "The "}],
    "max_new_tokens": [None, 0, -1, 257, 2**64, 10**400, 1.5, "8", True, NAN, INF, [], {}, [4]],
    "temperature": [None, -1, 2.5, 1e-40, 1e-3, 1e308, NAN, INF, -INF, "hot", [], {}, [0.5]],
    "seed": [-1, 2**63, 2**64, -(10**400), 1.5, "7", True, NAN, INF, [], {}, [1]],
    "texts": [None, [], "hello", [""], ["x" * 1001], ["a"] * 65, [1], [None], ["\ud800"], [["a"]],
              {"a": 1}, NAN, [NAN], [{"text": "a"}]],
}


def junk(rng: random.Random, depth: int = 0) -> object:
    """Return a random JSON value (NaN, huge numbers and lone surrogates included)."""
    kinds = ["null", "bool", "int", "huge", "float", "nan", "str", "surrogate"]
    if depth < 3:
        kinds += ["list", "dict"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "dict":
        return {rng.choice(["a", "prompt", "texts", "\ud800", "x" * 300]): junk(rng, depth + 1)
                for _ in range(rng.randint(0, 4))}
    return {"null": None, "bool": rng.random() < 0.5, "int": rng.randint(-(2**70), 2**70),
            "huge": 10 ** rng.randint(20, 500), "float": rng.uniform(-1e308, 1e308),
            "nan": rng.choice([NAN, INF, -INF]), "str": "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(8)),
            "surrogate": "ok\udc80" + chr(rng.randint(0xD800, 0xDFFF))}[kind]


def encode(value: object) -> bytes:
    """JSON text of ``value``, NaN/Infinity as bare words and lone surrogates as \\u escapes."""
    return json.dumps(value, allow_nan=True).encode()


def malformed(rng: random.Random, path: str) -> tuple[bytes, str]:
    """Return (body, content type) of one request to ``path`` that is invalid in exactly one way."""
    valid = dict(VALID[path])
    kind = rng.choice(["bad value", "bad value", "bad value", "extra field", "missing field", "not an object",
                       "broken JSON", "invalid UTF-8", "deep nesting", "wrong content type", "empty"])
    ctype = "application/json"
    if kind == "bad value":
        field = rng.choice(list(valid))
        valid[field] = rng.choice(INVALID[field])
        body = encode(valid)
    elif kind == "extra field":
        valid[rng.choice(["extra", "stream", "\ud800", "x" * 500, "Prompt"])] = junk(rng)
        body = encode(valid)
    elif kind == "missing field":
        body = encode({k: v for k, v in valid.items() if k not in ("prompt", "texts")})
    elif kind == "not an object":
        body = encode(rng.choice([junk(rng), [valid], json.dumps(valid), None, 42, NAN]))
    elif kind == "broken JSON":
        text = encode(valid)
        body = rng.choice([text[:rng.randint(1, len(text) - 1)], text + b"}", text.replace(b":", b"=", 1),
                           b"{'prompt': 'The '}", b"NaN", b"\x00" * 8])
    elif kind == "invalid UTF-8":
        text = encode(valid)
        cut = rng.randint(1, len(text) - 1)
        body = text[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]) + text[cut:]
    elif kind == "deep nesting":
        depth = rng.choice([2_000, 20_000, 200_000])
        nested = b"[" * depth + b"]" * depth
        body = rng.choice([nested, b'{"prompt": ' + nested + b"}", b'{"texts": ' + nested + b"}", b"[" * depth])
    elif kind == "wrong content type":
        body = encode(valid)
        ctype = rng.choice(["text/plain", "application/xml", "application/x-www-form-urlencoded",
                            "multipart/form-data; boundary=x"])
    else:
        body = b""
    return body, ctype


class Encoder:
    """A fast stand-in for MiniLM (384 zeros per text): this test is about the HTTP front."""

    def tokenize(self, texts: list[str]) -> tuple[list[str], None]:
        return list(texts), None

    def model(self, texts: list[str], mask: None) -> torch.Tensor:
        return torch.zeros(len(texts), 384)


def test_malformed_requests_get_a_json_4xx_and_the_server_keeps_serving():
    model, tok = load_tiny_gpt()
    rng = random.Random(15)
    bad: list[str] = []
    with ThreadedServer(ServeSettings(embed=True, threads=1), model=model, tokenizer=tok, mini=Encoder()) as srv, \
            httpx.Client(base_url=srv.url, timeout=10, trust_env=False) as client:
        start = time.monotonic()
        cases = [(path, *malformed(rng, path)) for path in ["/generate", "/embed"] * (N_BODIES // 2)]
        cases.append(("/generate", b'{"prompt": "' + b"a" * 2_000_000 + b'"}', "application/json"))  # 413
        for path, body, ctype in cases:
            assert time.monotonic() - start < TIME_BUDGET_S, f"fuzzing took too long ({len(bad)} bad so far)"
            case = f"{path} {body[:80]!r} ({ctype})"
            try:
                resp = client.post(path, content=body, headers={"content-type": ctype})
            except httpx.TransportError as err:  # e.g. the server reset the connection
                bad.append(f"{case} -> {type(err).__name__}: {err}")
                continue
            try:
                ok = 400 <= resp.status_code < 500 and "detail" in resp.json()
            except ValueError:  # not JSON
                ok = False
            if not ok:
                bad.append(f"{case} -> {resp.status_code} {resp.text[:120]!r}")
        assert not bad, f"{len(bad)} of {len(cases)} malformed requests got no JSON 4xx:\n" + "\n".join(bad[:10])

        assert client.get("/health").status_code == 200
        resp = client.post("/generate", json=VALID["/generate"])
        assert resp.status_code == 200 and resp.text.count("data: {\"token\"") == 4 and "event: end" in resp.text
        resp = client.post("/embed", json=VALID["/embed"])
        assert resp.status_code == 200 and len(resp.json()["embeddings"]) == 2
