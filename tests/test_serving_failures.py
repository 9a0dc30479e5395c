"""Failures inside the generation worker over real HTTP: one bad request or step never stops the
server for everyone, and /health tells the truth when the worker cannot serve."""

import threading
import time

import httpx
import pytest
import torch

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving import core
from course_utils.serving.core import sample_token
from course_utils.serving.server.loadgen import SSEParser
from course_utils.serving.server.runner import ThreadedServer

TIMEOUT = httpx.Timeout(30.0)


class Fatal(BaseException):
    """Not an Exception: nothing in the worker may swallow it, so the worker thread dies."""


@pytest.fixture(scope="module")
def gpt():
    return load_tiny_gpt()


class Saboteur:
    """Wraps the core's forward pass (``core.mixed_step``) to raise on demand.

    ``poison``: a token id whose presence in a prompt chunk makes the pass that computes it raise;
    ``next_decode``: an exception to raise at the next forward pass (then cleared).
    A short sleep per forward pass keeps a long stream running while a test acts.
    """

    def __init__(self, poison: int) -> None:
        self.poison = poison
        self.next_decode: BaseException | None = None
        self._real = core.mixed_step

    def __call__(self, model, cache, rows, chunks, starts):
        time.sleep(0.002)
        if any(len(c) > 1 and self.poison in c for c in chunks):
            raise RuntimeError("poisoned prompt")
        if self.next_decode is not None:
            err, self.next_decode = self.next_decode, None
            raise err
        return self._real(model, cache, rows, chunks, starts)


@pytest.fixture
def sabotaged(gpt, monkeypatch):
    """A server whose forward pass fails on demand; yields (server, saboteur, poison character)."""
    model, tok = gpt
    poison = tok.chars.index("~") if "~" in tok.chars else len(tok.chars) - 1
    saboteur = Saboteur(poison)
    monkeypatch.setattr(core, "mixed_step", saboteur)
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        yield srv, saboteur, tok.chars[poison]


def stream(url: str, body: dict) -> tuple[int, list]:
    """POST /generate; return (status, events), events as (kind, value) or ("json", body)."""
    parser, events = SSEParser(), []
    with httpx.Client(timeout=TIMEOUT, trust_env=False) as client, \
            client.stream("POST", url + "/generate", json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, [("json", resp.json())]
        for line in resp.iter_lines():
            events += parser.feed(line)
    return 200, events


class Background:
    """``stream`` in a thread; ``started`` is set at the first event."""

    def __init__(self, url: str, body: dict) -> None:
        self.result: tuple[int, list] | None = None
        self.started = threading.Event()
        self._url, self._body = url, body
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        parser, events = SSEParser(), []
        try:
            with httpx.Client(timeout=TIMEOUT, trust_env=False) as client, \
                    client.stream("POST", self._url + "/generate", json=self._body) as resp:
                for line in resp.iter_lines():
                    events += parser.feed(line)
                    if events:
                        self.started.set()
            self.result = (resp.status_code, events)
        finally:
            self.started.set()

    def join(self) -> tuple[int, list]:
        self._thread.join(60)
        assert self.result is not None, "the client hung or failed"
        return self.result


def health(url: str) -> httpx.Response:
    return httpx.get(url + "/health", timeout=TIMEOUT, trust_env=False)


def test_sample_token_falls_back_to_greedy_when_the_scaled_logits_overflow():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    assert sample_token(logits, 1e-40) == 1  # was: multinomial raised on inf/nan probabilities
    assert sample_token(logits.half(), 1e-30) == 1
    assert 0 <= sample_token(torch.tensor([float("nan")] * 4), 1.0) < 4
    gen = torch.Generator().manual_seed(0)
    draws = {sample_token(logits, 1.0, gen) for _ in range(200)}
    assert draws >= {1, 3}  # an ordinary temperature still samples


def test_a_tiny_or_non_finite_temperature_is_422_and_the_server_keeps_serving(gpt):
    model, tok = gpt
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        for value in ("1e-40", "0.001", "Infinity", "NaN"):  # 1e-40 used to kill the worker
            resp = httpx.post(srv.url + "/generate", content=f'{{"prompt": "The ", "temperature": {value}}}',
                              headers={"content-type": "application/json"}, timeout=TIMEOUT, trust_env=False)
            assert resp.status_code == 422, (value, resp.text)
            error = resp.json()["detail"][0]
            assert error["loc"] == ["body", "temperature"]
            if value == "0.001":
                assert "0 (greedy) or between 0.01 and 2.0" in error["msg"]
        assert health(srv.url).status_code == 200
        status, events = stream(srv.url, {"prompt": "The ", "max_new_tokens": 5, "temperature": 0.01, "seed": 1})
        assert status == 200 and [k for k, _ in events] == ["token"] * 5 + ["end"]


def test_a_failing_prefill_ends_only_its_request(sabotaged):
    srv, saboteur, poison = sabotaged
    running = Background(srv.url, {"prompt": "The ", "max_new_tokens": 120})
    assert running.started.wait(20)
    status, events = stream(srv.url, {"prompt": f"a{poison}", "max_new_tokens": 5})
    assert status == 500 and "generation failed" in events[0][1]["detail"]
    status, events = running.join()
    assert status == 200 and [k for k, _ in events] == ["token"] * 120 + ["end"]
    assert health(srv.url).status_code == 200
    assert stream(srv.url, {"prompt": "A ", "max_new_tokens": 4})[1][-1][0] == "end"


def test_a_failing_decoding_step_ends_the_batch_with_an_error_event_and_the_worker_goes_on(sabotaged):
    srv, saboteur, _ = sabotaged
    running = Background(srv.url, {"prompt": "The ", "max_new_tokens": 200})
    assert running.started.wait(20)
    saboteur.next_decode = RuntimeError("a bad step")
    status, events = running.join()
    assert status == 200 and events[-1][0] == "error", events[-3:]
    assert "generation failed" in events[-1][1]["detail"]
    assert health(srv.url).json()["status"] == "ok"
    status, events = stream(srv.url, {"prompt": "A ", "max_new_tokens": 6, "temperature": 1.0})
    assert status == 200 and [k for k, _ in events] == ["token"] * 6 + ["end"]
    assert srv.app.state.engine.errors == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_is_503_with_the_reason_when_the_worker_died(sabotaged):
    srv, saboteur, _ = sabotaged
    running = Background(srv.url, {"prompt": "The ", "max_new_tokens": 200})
    assert running.started.wait(20)
    saboteur.next_decode = Fatal("the worker thread is gone")
    status, events = running.join()
    assert events[-1][0] == "error" and "Fatal" in events[-1][1]["detail"]
    resp = health(srv.url)
    assert resp.status_code == 503
    assert resp.json()["status"] == "error" and "Fatal" in resp.json()["reason"]
    status, events = stream(srv.url, {"prompt": "A ", "max_new_tokens": 4})
    assert status == 503 and "Fatal" in events[0][1]["detail"]
