"""The serving core (``serving/core.py``): one forward pass per step, chunked prefill, the same greedy
answers as the engine it replaced, and the limits a reader relies on (no asyncio, one sitting)."""

import asyncio
import json
import re
from pathlib import Path

import pytest
import torch

from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.models.gpt import KVCache, mixed_step, pad_prompts, prefill
from course_utils.serving import core
from course_utils.serving.core import EngineCore, Sequence
from course_utils.serving.server.engine import GenerationEngine
from course_utils.serving.server.metrics import ServingMetrics
from course_utils.serving.server.settings import ServeSettings

GOLDEN = json.loads((Path(__file__).parent / "engine_greedy_golden.json").read_text())


@pytest.fixture(scope="module")
def gpt():
    torch.set_num_threads(1)
    return load_tiny_gpt()


def golden_sets(tok):
    for name, s in GOLDEN["sets"].items():
        yield name, [tok.encode(p) for p in s["prompts"]], s["max_new_tokens"], s["answers"]


def run_core(model, prompts, max_new, **kw) -> list[list[int]]:
    eng = EngineCore(model, capacity=kw.pop("capacity", 32), max_len=512, **kw)
    seqs = [eng.add(Sequence(p, n)) for p, n in zip(prompts, max_new)]
    with torch.inference_mode():
        while eng.has_work():
            eng.step()
    return [s.out for s in seqs]


@pytest.mark.parametrize("kw", [dict(), dict(token_budget=16), dict(capacity=4, prefix_cache_bytes=2**22),
                                dict(token_budget=40, prefix_cache_bytes=2**22)],
                         ids=["one-pass", "chunks-of-16", "4-rows-prefix-cache", "budget-40-prefix-cache"])
def test_core_answers_equal_the_old_engine_token_for_token(gpt, kw):
    model, tok = gpt
    for name, prompts, max_new, answers in golden_sets(tok):
        got = [tok.decode(o) for o in run_core(model, prompts, max_new, **dict(kw))]
        assert got == answers, name


def test_the_server_engine_gives_the_golden_answers_through_its_event_queues(gpt):
    model, tok = gpt
    _, prompts, max_new, answers = next(golden_sets(tok))

    async def main() -> list[str]:
        engine = GenerationEngine(model, ServeSettings(embed=False, threads=1, stream_interval_ms=0), ServingMetrics())
        engine.start(asyncio.get_running_loop())
        try:
            reqs = [engine.submit(p, n) for p, n in zip(prompts, max_new)]
            outs = []
            for req in reqs:
                toks = []
                while (event := await req.events.get())[0] == "token":
                    toks.append(event[1])
                assert event[0] == "end", event
                outs.append(tok.decode(toks))
            return outs
        finally:
            engine.stop()

    assert asyncio.run(main()) == answers


def test_generate_is_plain_and_a_newcomer_shares_the_running_rows_forward_pass(gpt, monkeypatch):
    model, tok = gpt
    calls = []
    real = core.mixed_step
    monkeypatch.setattr(core, "mixed_step", lambda *a: calls.append([len(c) for c in a[3]]) or real(*a))
    eng = EngineCore(model, capacity=4, max_len=128)
    with torch.inference_mode():
        first = eng.add(Sequence(tok.encode("The "), 5))
        assert eng.step().emitted == [(first, first.out[0])]        # the prompt's pass gives token 1
        second = eng.add(Sequence(tok.encode("import os"), 3))
        res = eng.step()
    assert calls == [[4], [1, 9]]  # one pass: first's next token and second's whole prompt together
    assert (res.rows, res.chunks, res.tokens) == (2, 1, 10)
    assert [s for s, _ in res.emitted] == [first, second]
    out = EngineCore(model, capacity=2, max_len=128).generate([tok.encode("The "), tok.encode("def ")], 6)
    assert [len(o) for o in out] == [6, 6]


def test_a_long_prompt_is_computed_in_chunks_under_the_token_budget(gpt):
    model, tok = gpt
    eng = EngineCore(model, capacity=4, max_len=256, token_budget=32)
    with torch.inference_mode():
        running = eng.add(Sequence(tok.encode("for x in "), 40))
        eng.step()
        long = eng.add(Sequence(tok.encode("a" * 100), 2))
        sizes = []
        while not long.out:
            res = eng.step()
            sizes.append(res.tokens)
            assert res.rows == 2 and len(running.out) >= 2   # the running row decodes at every step
    assert max(sizes) <= 32 and sum(sizes) == 100 + len(sizes)  # 31 + 31 + 31 + 7 prompt tokens, one decode each
    assert len(sizes) == 4


def test_cancelled_sequences_leave_and_bad_sequences_are_refused(gpt):
    model, tok = gpt
    eng = EngineCore(model, capacity=2, max_len=64)
    with pytest.raises(ValueError, match="exceeds"):
        eng.add(Sequence([1] * 60, 10))
    with pytest.raises(ValueError, match="at least one prompt token"):
        eng.add(Sequence([], 3))
    with torch.inference_mode():
        a, b = eng.add(Sequence(tok.encode("The "), 20)), eng.add(Sequence(tok.encode("A "), 20))
        eng.step()
        a.cancelled = True
        res = eng.step()
    assert res.dropped == [a] and a.finished and eng.running == [b] and not b.finished
    assert res.rows == 1  # the cancelled row was not computed


def test_mixed_step_equals_prefill_and_refuses_a_bad_layout(gpt):
    model, _ = gpt
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    with torch.inference_mode():
        a = KVCache(model.config, 2, max_len=32)
        idx, lengths = pad_prompts(prompts)
        want = prefill(model, idx, lengths, a)
        b = KVCache(model.config, 2, max_len=32)
        got = mixed_step(model, b, [0, 1], prompts, [0, 0])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert b.lengths.tolist() == [3, 5]
        for row, n in enumerate((3, 5)):  # the real positions (prefill also writes its padding)
            torch.testing.assert_close(b.k[:, row, :, :n], a.k[:, row, :, :n], rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="come first"):
            mixed_step(model, b, [1, 0], [[4, 5], [6]], [3, 5])
        with pytest.raises(ValueError, match="max_len"):
            mixed_step(model, b, [0], [[1] * 40], [0])


def test_the_core_reads_in_one_sitting():
    src = Path(core.__file__).read_text()
    assert len(src.splitlines()) <= 500
    assert not re.search(r"^\s*(import|from)\s+(asyncio|prometheus_client|threading)\b", src, re.M)


def test_prompts_that_fit_the_budget_are_computed_whole_in_one_pass(gpt):
    """32 prompts of 8 tokens under the default budget of 256: one pass computes all 256 prompt
    tokens and every sequence gets its first token (none is handed a single prompt token)."""
    model, _ = gpt
    eng = EngineCore(model, capacity=32, max_len=64)
    seqs = [eng.add(Sequence([3 + i % 50] * 8, 4)) for i in range(32)]
    with torch.inference_mode():
        res = eng.step()
    assert (res.rows, res.chunks, res.tokens) == (32, 32, 256)
    assert all(len(s.out) == 1 for s in seqs)
