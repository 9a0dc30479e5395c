"""Batching policies over real HTTP: iteration-level joins, static batches, overflow, timeouts, shutdown."""

import copy
import threading
import time

import httpx
import pytest

from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.loadgen import SSEParser, run_load
from course_utils.serving.server.runner import ThreadedServer

TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def gpt():
    return load_tiny_gpt()


def start(gpt, step_delay_s: float = 0.0, **kw) -> ThreadedServer:
    """A real server; ``step_delay_s`` makes the model slower per forward pass, so timing
    relations these tests rely on hold on any machine, however fast."""
    model, tok = gpt
    if step_delay_s:
        model = copy.deepcopy(model)
        model.ln_f.register_forward_pre_hook(lambda *_: time.sleep(step_delay_s))
    return ThreadedServer(ServeSettings(embed=False, threads=1, **kw), model=model, tokenizer=tok)


def batch_histogram(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    for family in text_string_to_metric_families(text):
        if family.name == "serve_batch_size":
            return {s.labels.get("le", s.name): s.value for s in family.samples}
    raise AssertionError("no serve_batch_size histogram")


class Stream:
    """A streaming client in a thread: records events and when they arrived."""

    def __init__(self, url: str, body: dict) -> None:
        self.url, self.body = url, body
        self.events: list = []
        self.status: int | None = None
        self.first = threading.Event()
        self.done_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        parser = SSEParser()
        try:
            with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", self.url + "/generate", json=self.body) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    r.read()
                    self.events.append(("json", r.json()))
                    return
                for line in r.iter_lines():
                    self.events += parser.feed(line)
                    if self.events:
                        self.first.set()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            self.done_at = time.monotonic()
            self.first.set()

    def join(self, timeout: float = 30.0) -> "Stream":
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "client hung"
        return self

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


def test_iteration_batching_lets_a_request_join_a_running_batch(gpt):
    with start(gpt, step_delay_s=0.002, batching="iteration") as srv:
        long = Stream(srv.url, {"prompt": "The ", "max_new_tokens": 200})
        assert long.first.wait(20)
        short = Stream(srv.url, {"prompt": "A ", "max_new_tokens": 5}).join()
        assert short.kinds == ["token"] * 5 + ["end"]
        assert long.thread.is_alive(), "the short request should finish while the long one still runs"
        long.join()
        assert long.kinds[-1] == "end" and long.kinds.count("token") == 200
        hist = batch_histogram(srv.url)
        assert hist["serve_batch_size_count"] > hist["1.0"], "no decoding step ever held two sequences"


def test_static_batching_makes_a_late_request_wait(gpt):
    with start(gpt, step_delay_s=0.002, batching="static") as srv:
        long = Stream(srv.url, {"prompt": "The ", "max_new_tokens": 120})
        assert long.first.wait(20)
        short = Stream(srv.url, {"prompt": "A ", "max_new_tokens": 5})
        long.join(), short.join()
        assert short.kinds == ["token"] * 5 + ["end"] and long.kinds[-1] == "end"
        assert short.done_at >= long.done_at - 0.05  # it only started after the batch ended
        hist = batch_histogram(srv.url)
        assert hist["serve_batch_size_count"] == hist["1.0"]


@pytest.mark.parametrize("batching", ["static", "none"])
def test_other_policies_serve_concurrent_clients_correctly(gpt, batching):
    with start(gpt, batching=batching, max_batch_size=8) as srv:
        prompts = [f"Case {i}: " for i in range(16)]
        report = run_load(srv.url, concurrency=16, n_requests=16, prompts=prompts, max_new_tokens=12,
                          keep_texts=True, timeout_s=60)
        assert report.n_ok == 16, report.errors
        with start(gpt, batching="iteration") as ref:
            again = run_load(ref.url, concurrency=1, n_requests=16, prompts=prompts, max_new_tokens=12,
                             keep_texts=True, timeout_s=60)
        assert report.texts == again.texts


def test_full_queue_is_503_with_retry_after(gpt):
    with start(gpt, step_delay_s=0.002, batching="none", queue_size=2) as srv:
        running = Stream(srv.url, {"prompt": "The ", "max_new_tokens": 256})
        assert running.first.wait(20)
        queued = [Stream(srv.url, {"prompt": "A ", "max_new_tokens": 4}) for _ in range(2)]
        deadline = time.monotonic() + 10
        while srv.app.state.engine.queue.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        resp = httpx.post(srv.url + "/generate", json={"prompt": "B", "max_new_tokens": 4}, timeout=TIMEOUT)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert "queue is full" in resp.json()["detail"]
        for s in [running, *queued]:
            s.join()
            assert s.kinds[-1] == "end"


def test_waiting_too_long_is_504_and_leaves_the_queue(gpt):
    with start(gpt, step_delay_s=0.002, batching="none", queue_timeout_s=0.3) as srv:
        ahead = [Stream(srv.url, {"prompt": "The ", "max_new_tokens": 256})]
        assert ahead[0].first.wait(20)
        ahead += [Stream(srv.url, {"prompt": "An ", "max_new_tokens": 256}) for _ in range(2)]
        time.sleep(0.05)
        t0 = time.monotonic()
        resp = httpx.post(srv.url + "/generate", json={"prompt": "B", "max_new_tokens": 4}, timeout=TIMEOUT)
        assert resp.status_code == 504 and "timed out" in resp.json()["detail"]
        assert time.monotonic() - t0 < 5
        for s in ahead:
            s.join(60)
        # the first stream finished; the ones that queued behind it may also have timed out
        assert ahead[0].kinds[-1] == "end"
        assert all(s.kinds[-1] == "end" or s.status == 504 for s in ahead)
        assert srv.app.state.engine.queue.qsize() == 0 and not srv.app.state.engine.rows


def test_shutdown_with_requests_in_flight_ends_every_client(gpt):
    srv = start(gpt, step_delay_s=0.002, batching="iteration", max_batch_size=4).__enter__()
    streams = [Stream(srv.url, {"prompt": f"Item {i} ", "max_new_tokens": 256}) for i in range(8)]
    for s in streams[:4]:
        assert s.first.wait(20)
    time.sleep(0.05)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 15
    for s in streams:
        s.join(15)
        ended_cleanly = (s.status == 200 and s.kinds and s.kinds[-1] in ("end", "error")) or \
            (s.status == 503 and "shutting down" in str(s.events)) or s.error is not None and s.status is None
        assert ended_cleanly, (s.status, s.kinds[-3:], s.error)
    assert any(s.kinds and s.kinds[-1] == "error" for s in streams), "no stream saw the error event"


def test_stopping_a_server_leaves_no_threads_behind(gpt):
    def ours() -> set[str]:
        return {f"{t.name}:{t.ident}" for t in threading.enumerate() if t.name.startswith("course-serving")}

    before = ours()
    with start(gpt) as srv:
        Stream(srv.url, {"prompt": "The ", "max_new_tokens": 3}).join()
        assert len(ours() - before) >= 2  # uvicorn + the generation worker
    assert ours() == before


def test_compiled_server_compiles_at_start_up_and_never_recompiles_under_load(gpt, monkeypatch):
    """compile=True: both graphs are made before /health is ok; traffic at several batch sizes
    and prompt lengths adds none (Dynamo's eager backend stands in for Inductor: the graphs and
    guards are the same, without the C++ build)."""
    import functools

    import torch
    from torch._dynamo.utils import counters

    from course_utils.serving.server import engine

    monkeypatch.setattr(engine.torch, "compile",
                        functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    with start(gpt, batching="iteration", compile=True) as server:
        graphs_at_start = counters["stats"]["unique_graphs"]
        prompts = ["a", "The cat", "for x in range(10):", "def f(x): return x"]
        for concurrency in (1, 3, 8):
            report = run_load(server.url, concurrency=concurrency, n_requests=concurrency * 2,
                              prompts=prompts, max_new_tokens=6)
            assert report.n_lost == 0, report.errors[:3]
    assert graphs_at_start == 2
    assert counters["stats"]["unique_graphs"] == 2
