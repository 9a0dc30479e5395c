"""The LitServe comparison app: real HTTP over loopback, streams parsed by the course's load generator."""

from __future__ import annotations

import httpx
import pytest
import torch

pytest.importorskip("litserve")

from course_utils.models.gpt import generate_cached  # noqa: E402
from course_utils.serving.litserve_app import (  # noqa: E402
    ROUTE, GenerateRequest, greedy_rows, litserve_process, load_model)
from course_utils.serving.loadgen import SSEParser, run_load  # noqa: E402

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


def test_greedy_rows_match_uncached_generate(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = [tok.encode(p) for p in PROMPTS]  # different lengths in one batch
    limits = [NEW_TOKENS, 5, NEW_TOKENS, 1]
    steps = list(greedy_rows(model, ids, limits))
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
    {"prompt": "ok", "max_new_tokens": 4, "temperature": 0.7},
    {"prompt": "caf\u00e9", "max_new_tokens": 4},
    {"prompt": "ok", "max_new_tokens": 4, "top_k": 5},
])
def test_bad_requests_get_422(server, body):
    resp = httpx.post(server.url + ROUTE, json=body, timeout=30, trust_env=False)
    assert resp.status_code == 422, resp.text
    # and the server still answers good requests afterwards
    ok = httpx.post(server.url + ROUTE, json={"prompt": "ok", "max_new_tokens": 2}, timeout=30, trust_env=False)
    assert ok.status_code == 200 and "event: end" in ok.text


def test_the_request_model_forbids_unknown_fields():
    from pydantic import ValidationError

    assert GenerateRequest(prompt="ok", max_new_tokens=4).max_new_tokens == 4
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        GenerateRequest.model_validate({"prompt": "ok", "max_new_tokens": 4, "stream": False})
