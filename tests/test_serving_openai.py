"""The OpenAI-compatible /v1 API over real HTTP, called with the official ``openai`` client (and raw
httpx for the wire format): models, completions, chat, streaming, stop strings, errors."""

import copy
import json
import random
import threading
import time

import httpx
import openai
import pytest
import torch
from openai import OpenAI

from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving import ServeSettings
from course_utils.serving.server.loadgen import SSEParser
from course_utils.serving.extras.openai_api import MODEL_ID, ChatMessage, StopScanner, chat_prompt
from course_utils.serving.server.runner import ThreadedServer

TIMEOUT = httpx.Timeout(30.0)
PROMPT = "The "  # the tiny GPT continues it with English-like words (spaces and " the" come early)


@pytest.fixture(scope="module")
def gpt():
    return load_tiny_gpt()


@pytest.fixture(scope="module")
def server(gpt):
    model, tok = gpt
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30.0) as c:
        yield c


def generate_text(url: str, prompt: str, n: int, **extra) -> str:
    """Return the text /generate streams for ``prompt``."""
    parser, events = SSEParser(), []
    body = {"prompt": prompt, "max_new_tokens": n, **extra}
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", url + "/generate", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            events += parser.feed(line)
    assert events[-1][0] == "end"
    return "".join(v for k, v in events if k == "token")


def sse_data(url: str, path: str, body: dict) -> tuple[httpx.Response, list[str]]:
    """POST a streaming request; return the response and the ``data:`` payloads in order."""
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", url + path, json=body) as resp:
        lines = list(resp.iter_lines())
    assert all(not ln or ln.startswith("data: ") for ln in lines), lines[:5]
    return resp, [ln[6:] for ln in lines if ln]


def active(url: str) -> int:
    return httpx.get(url + "/health", timeout=TIMEOUT).json()["active"]


def outcomes(url: str) -> dict[str, float]:
    """Return ``serve_requests_total`` by outcome, read from /metrics."""
    counts = {}
    for line in httpx.get(url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith('serve_requests_total{outcome="'):
            label, value = line.split('"')[1], line.rsplit(" ", 1)[1]
            counts[label] = float(value)
    return counts


def wait_idle(url: str) -> None:
    deadline = time.monotonic() + 10
    while active(url) and time.monotonic() < deadline:
        time.sleep(0.05)


# ---- pure parts -------------------------------------------------------------------------------

def test_chat_prompt_is_a_plain_transcript_ending_with_the_assistant_turn():
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi"),
            ChatMessage(role="assistant", content=[{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]),
            ChatMessage(role="developer", content="x")]
    assert chat_prompt(msgs) == "System: Be brief.\nUser: Hi\nAssistant: Hello\nSystem: x\nAssistant:"


@pytest.mark.parametrize("stops, text, expected, matched", [
    ([], "abc def", "abc def", None),
    (["de"], "abc def", "abc ", "de"),
    (["zz", " d"], "abc def", "abc", " d"),
    (["cd", "bc"], "abcd", "a", "bc"),  # the earliest occurrence wins
    (["xyz"], "abxy", "abxy", None),  # held back, then flushed at the end
])
def test_stop_scanner_cuts_before_the_first_stop_whatever_the_split(stops, text, expected, matched):
    rng = random.Random(0)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        scanner = StopScanner(stops)
        out = [scanner.feed(p) for p in pieces]
        if scanner.matched is None:
            out.append(scanner.flush())
        assert "".join(out) == expected and scanner.matched == matched
        assert scanner.generated == len(expected) + len(matched or "")
        for s in stops:  # no piece ever showed a stop string's start that turned out to be one
            assert s not in "".join(out)


def test_stop_scanner_holds_back_only_a_possible_stop_start():
    scanner = StopScanner(["\nUser:"])
    assert scanner.feed("hello\nUs") == "hello"
    assert scanner.feed("e") == ""
    assert scanner.feed("d it") == "\nUsed it"


def _reference_cut(stops: list[str], text: str) -> tuple[str, str | None]:
    """The text before the stop string complete earliest (the longer one on a tie), by brute force."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), -len(s)) < (best[0] + len(best[1]), -len(best[1]))):
            best = (i, s)
    return (text, None) if best is None else (text[:best[0]], best[1])


def test_stop_scanner_agrees_with_brute_force_on_random_texts_and_splits():
    rng = random.Random(1)
    for _ in range(400):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(1, 30)))
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
        scanner = StopScanner(stops)
        out = [scanner.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])]
        if scanner.matched is None:
            out.append(scanner.flush())
        assert ("".join(out), scanner.matched) == _reference_cut(stops, text), (stops, text, cuts)


class CountingStr(str):
    """A string that counts how often its characters are read (indexing and slicing)."""

    reads = 0

    def __getitem__(self, key):
        CountingStr.reads += 1
        return str.__getitem__(self, key)


def test_stop_scanner_work_per_piece_does_not_grow_with_the_stop_length():
    """A long stop string whose start keeps matching: each one-character piece used to rescan every
    prefix of the stop string (O(L) slices of up to L characters per piece, O(L^2) in all)."""
    length, pieces = 4096, 400
    stop = CountingStr("a" * (length - 1) + "b")
    CountingStr.reads = 0
    scanner = StopScanner([stop])
    assert CountingStr.reads <= 8 * length  # building the automaton: linear in the stop's length
    CountingStr.reads = 0
    assert "".join(scanner.feed("a") for _ in range(pieces)) == ""  # all of it could still become the stop
    assert CountingStr.reads <= 4 * pieces, CountingStr.reads  # a few reads per new character
    assert len(scanner.pending) == pieces and scanner.flush() == "a" * pieces


def test_a_stop_string_longer_than_the_setting_is_400_naming_stop(server, gpt):
    longest = ServeSettings().max_stop_chars
    for path, extra in (("/v1/completions", {"prompt": PROMPT}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        for stop in ("x" * (longest + 1), ["\n", "y" * 1_000_000]):
            resp = httpx.post(server.url + path, json={"model": MODEL_ID, "max_tokens": 4, "stop": stop, **extra},
                              timeout=TIMEOUT)
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == "stop", resp.text[:300]
            assert f"at most {longest}" in error["message"] and error["type"] == "invalid_request_error"
        ok = httpx.post(server.url + path, json={"model": MODEL_ID, "max_tokens": 4, "stop": "z" * longest, **extra},
                        timeout=TIMEOUT)
        assert ok.status_code == 200, ok.text


# ---- the official client ----------------------------------------------------------------------

def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).owned_by == "course_utils"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")


def test_greedy_completion_equals_generate(server, client):
    reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24, temperature=0)
    (choice,) = reply.choices
    assert choice.text == generate_text(server.url, PROMPT, 24)
    assert choice.finish_reason == "length" and len(choice.text) == 24
    assert reply.object == "text_completion" and reply.model == MODEL_ID and reply.id.startswith("cmpl-")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (4, 24, 28)
    listed = client.completions.create(model=MODEL_ID, prompt=[PROMPT], max_tokens=24, temperature=0)
    assert listed.choices[0].text == choice.text


def test_streamed_completion_joins_to_the_non_streamed_text(client):
    whole = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=40, temperature=0)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert len({c.id for c in chunks}) == 1


def test_chat_completion_continues_the_templated_transcript(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the "}]
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_completion_tokens=16,
                                           temperature=0)
    (choice,) = reply.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    prompt = chat_prompt([ChatMessage(**m) for m in messages])
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
    assert choice.message.content == plain.choices[0].text and len(choice.message.content) == 16
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == 16

    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].object == "chat.completion.chunk"


def test_a_stop_string_ends_the_text_before_it(server, client):
    full = generate_text(server.url, PROMPT, 48)
    stop = " the"
    assert stop in full[1:], full  # the greedy continuation of PROMPT has one a few words in
    cut = full.index(stop)
    reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=48, temperature=0,
                                      stop=["~~~", stop])
    assert reply.choices[0].text == full[:cut] and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == cut + len(stop)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=48, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=30, temperature=0, stop="\n")
    assert "\n" not in chat.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    kwargs = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 20, "temperature": 1.0, "seed": 7}
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert a == b == streamed and len(a) == 20


BAD = [  # (endpoint, kwargs, exception, param, fragment of the message)
    ("c", {"n": 2}, openai.BadRequestError, "n", "only n=1"),
    ("c", {"best_of": 3}, openai.BadRequestError, "best_of", "best_of=1"),
    ("c", {"echo": True}, openai.BadRequestError, "echo", "echo is not supported"),
    ("c", {"logprobs": 2}, openai.BadRequestError, "logprobs", "logprobs are not supported"),
    ("c", {"suffix": "x"}, openai.BadRequestError, "suffix", "not supported"),
    ("c", {"top_p": 0.5}, openai.BadRequestError, "top_p", "top_p=1"),
    ("c", {"presence_penalty": 1.0}, openai.BadRequestError, "presence_penalty", "penalties"),
    ("c", {"model": "gpt-4o"}, openai.NotFoundError, "model", "does not exist"),
    ("c", {"prompt": "caf\u00e9"}, openai.BadRequestError, "prompt", "not in the vocabulary"),
    ("c", {"prompt": "x" * 257}, openai.BadRequestError, "prompt", "at most 256"),
    ("c", {"prompt": ""}, openai.BadRequestError, "prompt", "must not be empty"),
    ("c", {"prompt": ["a", "b"]}, openai.BadRequestError, "prompt", "one prompt per request"),
    ("c", {"prompt": [1, 2, 3]}, openai.BadRequestError, "prompt", "token-id prompts"),
    ("c", {"max_tokens": 257}, openai.BadRequestError, "max_tokens", "at most 256"),
    ("c", {"max_tokens": 0}, openai.BadRequestError, "max_tokens", "greater than or equal to 1"),
    ("c", {"temperature": 1e-5}, openai.BadRequestError, "temperature", "0 (greedy) or between"),
    ("c", {"temperature": 2.5}, openai.BadRequestError, "temperature", "less than or equal to 2"),
    ("c", {"seed": -1}, openai.BadRequestError, "seed", "greater than or equal to 0"),
    ("c", {"stop": ["a", "b", "c", "d", "e"]}, openai.BadRequestError, "stop", "at most 4"),
    ("c", {"extra_body": {"frobnicate": 1}}, openai.BadRequestError, "frobnicate", "Unrecognized request argument"),
    ("m", {"messages": []}, openai.BadRequestError, "messages", "at least 1"),
    ("m", {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, openai.BadRequestError,
     "messages[0].role", "Input should be"),
    ("m", {"messages": [{"role": "user", "content": "\u00fcber"}]}, openai.BadRequestError, "messages",
     "not in the vocabulary"),
    ("m", {"messages": [{"role": "user", "content": "x" * 300}]}, openai.BadRequestError, "messages", "at most 256"),
    ("m", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     openai.BadRequestError, "messages[0].content", "a string or a list of text parts"),
    ("c", {"stop": [1]}, openai.BadRequestError, "stop", "a string or a list of strings"),
    ("m", {"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError, "tools",
     "cannot call tools"),
    ("m", {"response_format": {"type": "json_object"}}, openai.BadRequestError, "response_format", "JSON"),
    ("m", {"max_completion_tokens": 1000}, openai.BadRequestError, "max_completion_tokens", "at most 256"),
    ("m", {"logprobs": True}, openai.BadRequestError, "logprobs", "not supported"),
]


@pytest.mark.parametrize("endpoint, kwargs, exc, param, fragment", BAD,
                         ids=[f"{e}-{next(iter(k))}-{i}" for i, (e, k, *_) in enumerate(BAD)])
def test_bad_input_raises_the_clients_error_with_a_helpful_message(client, endpoint, kwargs, exc, param, fragment):
    base = ({"model": MODEL_ID, "prompt": "a", "max_tokens": 4} if endpoint == "c" else
            {"model": MODEL_ID, "messages": [{"role": "user", "content": "a"}], "max_tokens": 4})
    create = client.completions.create if endpoint == "c" else client.chat.completions.create
    with pytest.raises(exc) as info:
        create(**{**base, **kwargs})
    body = info.value.body
    assert fragment in body["message"] and body["param"] == param, body
    assert body["type"] == "invalid_request_error"


def test_a_body_over_the_servers_limit_is_the_clients_413_with_a_message(server, client):
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model=MODEL_ID, prompt="a" * (server.settings.max_body_bytes + 1), max_tokens=4)
    assert info.value.status_code == 413 and info.value.code == "body_too_large"
    assert "larger than" in info.value.body["message"], info.value.body


def test_the_server_still_serves_after_bad_input(client):
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL_ID, prompt="caf\u00e9", max_tokens=4)
    assert len(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=5).choices[0].text) == 5


# ---- the wire format --------------------------------------------------------------------------

@pytest.mark.parametrize("raw, param", [
    (b'{"model": "tiny-gpt", "prompt": "a"', None),  # malformed JSON
    (b'{"model": "tiny-gpt", "prompt": "a", "temperature": NaN}', "temperature"),
    (b'{"model": "tiny-gpt", "prompt": "\\ud800"}', "prompt"),  # a lone surrogate
    (b'{"prompt": "a"}', "model"),
    (b'[1, 2]', None),
])
def test_raw_errors_have_the_openai_shape(server, raw, param):
    resp = httpx.post(server.url + "/v1/completions", content=raw, timeout=TIMEOUT,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param
    assert body["error"]["message"]


INVALID = {  # values each field of /v1/completions must refuse (JSON carries all of them)
    "model": [None, 1, [], {}],
    "prompt": [None, 1, True, [], {}, "", "x" * 257, "\ud800", "caf\u00e9", [[1, 2]], ["a", None], 10**400],
    "max_tokens": [0, -1, 257, 2**64, 10**400, 1.5, "8", True, float("nan"), [], {}],
    "temperature": [-1, 2.5, 1e-3, 1e308, float("nan"), float("inf"), "hot", [], {}],
    "seed": [-1, 2**63, 1.5, "7", True, float("nan"), []],
    "stop": [1, [1], [""], "", ["a"] * 5, {}, [None]],
    "stream": ["yes", 2, [], {}],
    "n": [0, 2, 1.5, "1"],
    "logit_bias": [{"1": 5}, "x", []],
}


def test_every_malformed_completion_field_is_400_in_the_openai_shape(server):
    valid = {"model": MODEL_ID, "prompt": "The ", "max_tokens": 2, "temperature": 0.5, "seed": 1}
    with httpx.Client(timeout=TIMEOUT) as c:
        for field, values in INVALID.items():
            for value in values:
                raw = json.dumps({**valid, field: value}).encode()  # NaN/Infinity as bare words
                resp = c.post(server.url + "/v1/completions", content=raw,
                              headers={"content-type": "application/json"})
                assert resp.status_code == 400, (field, value, resp.text[:300])
                err = resp.json()["error"]
                assert err["param"] == field and err["type"] == "invalid_request_error", (field, value, err)
        assert c.post(server.url + "/v1/completions", json=valid).status_code == 200


def test_generate_keeps_its_422_format(server):
    resp = httpx.post(server.url + "/generate", json={"prompt": "a", "n": 2}, timeout=TIMEOUT)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "n"]


def test_raw_stream_is_data_chunks_then_done(server):
    body = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True}
    resp, data = sse_data(server.url, "/v1/completions", body)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == generate_text(server.url, PROMPT, 12)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    resp, data = sse_data(server.url, "/v1/chat/completions",
                          {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                           "stream": True})
    assert data[-1] == "[DONE]" and json.loads(data[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_disconnect_mid_stream_frees_the_batch_row(server):
    before = outcomes(server.url)
    body = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 256, "stream": True}
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", server.url + "/v1/completions", json=body) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i >= 4:
                break  # leaving the block closes the connection mid-stream
    wait_idle(server.url)
    assert active(server.url) == 0
    after = outcomes(server.url)
    assert after.get("cancelled", 0) == before.get("cancelled", 0) + 1, (before, after)


def test_a_request_is_cancelled_as_ok_or_cancelled_and_the_first_call_decides():
    import asyncio

    from course_utils.serving.server.engine import GenRequest

    loop = asyncio.new_event_loop()
    try:
        req = GenRequest([1, 2], 4, 0.0, None, loop)
        req.cancel("ok")
        req.cancel()  # a handler's clean-up afterwards
        assert req.cancelled and req.end_outcome == "ok"
        with pytest.raises(ValueError, match="outcome must be one of"):
            GenRequest([1], 4, 0.0, None, loop).cancel("done")
    finally:
        loop.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_by_a_stop_string_counts_as_ok_not_cancelled(server, client, stream):
    wait_idle(server.url)
    before = outcomes(server.url)
    reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=200, temperature=0,
                                      stop=" the", stream=stream)
    finish = [c.choices[0].finish_reason for c in reply][-1] if stream else reply.choices[0].finish_reason
    assert finish == "stop"
    wait_idle(server.url)  # the row was freed early, not run to max_tokens
    after = outcomes(server.url)
    assert after.get("ok", 0) == before.get("ok", 0) + 1, (before, after)
    assert after.get("cancelled", 0) == before.get("cancelled", 0), (before, after)


# ---- overload and failures --------------------------------------------------------------------

class SlowAndFragile:
    """A forward pre-hook on the token embedding: every forward sleeps a little (streams last long
    enough to act on), and ``fail_next_decode`` makes the next decoding step raise."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.fail_next_decode = False
        model.tok_emb.register_forward_pre_hook(self)

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        time.sleep(0.005)
        if args[0].shape[-1] == 1 and self.fail_next_decode:
            self.fail_next_decode = False
            raise RuntimeError("injected failure")


@pytest.fixture(scope="module")
def fragile(gpt):
    """One request at a time, a short queue timeout and a model that fails on demand."""
    model, tok = gpt
    model = copy.deepcopy(model)
    hook = SlowAndFragile(model)
    settings = ServeSettings(embed=False, threads=1, batching="none", queue_timeout_s=0.3)
    with ThreadedServer(settings, model=model, tokenizer=tok) as srv, \
            OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30.0) as c:
        yield srv, hook, c


def test_no_free_slot_in_time_is_504(fragile):
    srv, _, c = fragile
    started = threading.Event()

    def long_stream() -> None:
        for _ in c.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=150, stream=True):
            started.set()

    worker = threading.Thread(target=long_stream)
    worker.start()
    try:
        assert started.wait(10)
        with pytest.raises(openai.APIStatusError) as info:
            c.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4)
        assert info.value.status_code == 504 and "no batch slot" in info.value.body["message"]
    finally:
        worker.join(30)


def test_a_failure_mid_stream_sends_an_error_chunk_and_the_server_goes_on(fragile):
    srv, hook, c = fragile
    stream = c.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=100, stream=True)
    got = []
    with pytest.raises(openai.APIError, match="generation failed"):
        for chunk in stream:
            got.append(chunk.choices[0].text)
            hook.fail_next_decode = True
    assert got  # it failed after the stream started
    with pytest.raises(openai.InternalServerError, match="generation failed"):
        hook.fail_next_decode = True
        c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=50)
    hook.fail_next_decode = False
    assert len(c.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3).choices[0].text) == 3


def test_a_stopping_server_answers_503_with_retry_after(gpt):
    model, tok = gpt
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        srv.app.state.begin_shutdown()
        resp = httpx.post(srv.url + "/v1/completions", json={"model": MODEL_ID, "prompt": "a"}, timeout=TIMEOUT)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["type"] == "server_error" and "shutting down" in resp.json()["error"]["message"]


class Slow:
    """A forward pre-hook that makes every forward pass sleep ``seconds``."""

    def __init__(self, model: torch.nn.Module, seconds: float) -> None:
        self.seconds = seconds
        model.tok_emb.register_forward_pre_hook(self)

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        time.sleep(self.seconds)


def test_a_non_streamed_request_whose_client_hung_up_is_cancelled(gpt):
    """Send-and-hang-up: the answers used to be computed to the end (256 steps here) and counted ok."""
    import socket

    model, tok = gpt
    model = copy.deepcopy(model)
    Slow(model, 0.01)  # 256 tokens take over 2.5 s
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        before = outcomes(srv.url)
        port = int(srv.url.rsplit(":", 1)[1])
        socks = []
        for path, body in (("/v1/completions", {"prompt": PROMPT}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            for _ in range(2):
                data = json.dumps({"model": MODEL_ID, "max_tokens": 256, "temperature": 0, **body}).encode()
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
                socks.append(sock)
        deadline = time.monotonic() + 5
        while active(srv.url) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert active(srv.url) == 4  # all four are being computed
        for sock in socks:
            sock.close()  # hang up without reading
        start = time.monotonic()
        while active(srv.url) and time.monotonic() - start < 2:
            time.sleep(0.02)
        assert active(srv.url) == 0 and time.monotonic() - start < 1.0, "rows were not freed"
        after = outcomes(srv.url)
        assert after.get("cancelled", 0) == before.get("cancelled", 0) + 4, (before, after)
        assert after.get("ok", 0) == before.get("ok", 0), (before, after)
        reply = httpx.post(srv.url + "/v1/completions", json={"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 3},
                           timeout=TIMEOUT)
        assert reply.status_code == 200  # the server goes on
