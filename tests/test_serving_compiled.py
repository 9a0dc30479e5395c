"""The real thing once: `python -m course_utils serve` with compile=True and Inductor, not the eager backend.

The batching tests swap ``torch.compile`` for its eager backend to stay fast; this test runs the
server exactly as a learner would (Inductor generating and building C++ during start-up), sends
concurrent requests so both compiled graphs (batch 1, and any other batch) serve, and checks the
text against the model's own greedy continuation.
"""

from __future__ import annotations

import torch

from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.serving.server.loadgen import run_load
from course_utils.serving.server.process import serve_in_subprocess


def offline_greedy(model, tok, prompt: str, n: int) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([tok.encode(prompt)])
    with torch.inference_mode():
        return model.generate(ids, n, temperature=0)[0, ids.shape[1]:].tolist(), ids


def agrees(model, tok, prompt: str, served: str) -> bool:
    """Served equals offline greedy, except after an exact near-tie (compiled maths rounds differently)."""
    offline, _ = offline_greedy(model, tok, prompt, len(served))
    got = tok.encode(served)
    for i, (a, b) in enumerate(zip(offline, got)):
        if a != b:
            with torch.inference_mode():
                logits = model(torch.tensor([tok.encode(prompt) + got[:i]]))[0, -1]
            return abs(float(logits[a] - logits[b])) < 1e-3
    return len(got) == len(offline)


def test_the_inductor_compiled_server_serves_the_greedy_text():
    model, tok = load_tiny_gpt()
    prompts = ["The object", "A class", "If the value", "Return the"]
    with serve_in_subprocess({"embed": False, "batching": "iteration", "compile": True},
                             startup_timeout_s=600) as server:
        single = run_load(server.url, concurrency=1, n_requests=1, prompts=prompts[:1], max_new_tokens=12,
                          timeout_s=120, keep_texts=True)
        batch = run_load(server.url, concurrency=4, n_requests=8, prompts=prompts, max_new_tokens=12,
                         timeout_s=120, keep_texts=True)
    assert single.n_ok == 1 and batch.n_ok == 8, (single.errors, batch.errors)
    assert agrees(model, tok, prompts[0], single.texts[0])
    mismatched = [(p, t) for p, t in zip(prompts * 2, batch.texts) if not agrees(model, tok, p, t)]
    assert not mismatched, mismatched
