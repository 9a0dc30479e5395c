"""Prefix caching: the block store, prefill after a cached prefix, and the engine with the cache on and off."""

import asyncio

import pytest
import torch

from course_utils.data.text import load_corpus
from course_utils.models import GPTConfig, TinyGPT
from course_utils.models.checkpoint import load_tiny_gpt
from course_utils.models.gpt import KVCache, pad_prompts, prefill
from course_utils.serving.server.engine import GenerationEngine
from course_utils.serving.server.metrics import ServingMetrics
from course_utils.serving.prefix_cache import BLOCK, PrefixCache, block_hashes
from course_utils.serving.server.settings import ServeSettings


def small_gpt(block_size: int = 96) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=23, block_size=block_size, n_layer=2, n_head=2, n_embd=32)).eval()


def filled_row(gpt: TinyGPT, ids: list[int], max_len: int = 96) -> KVCache:
    """A one-row cache holding ``ids``'s keys and values, computed from scratch."""
    cache = KVCache(gpt.config, 1, max_len=max_len)
    prefill(gpt, torch.tensor([ids]), torch.tensor([len(ids)]), cache)
    return cache


def block_bytes(gpt: TinyGPT) -> int:
    cfg = gpt.config
    return 2 * cfg.n_layer * cfg.n_embd * BLOCK * 4


# ---- the hash chain ---------------------------------------------------------------
def test_block_hashes_cover_full_blocks_and_everything_before_them():
    a = list(range(20)) + list(range(20))  # 40 tokens: 2 full blocks and 8 left over
    assert len(block_hashes(a)) == 2
    assert block_hashes(a[:15]) == []
    assert block_hashes(a[:16]) == block_hashes(a)[:1]
    # the same 16 tokens after a different first block hash differently (the chain)
    b = [5] * 16 + a[16:32]
    assert block_hashes(b)[1] != block_hashes(a)[1]
    assert block_hashes(a[:32] + [1, 2]) == block_hashes(a[:32])
    with pytest.raises(ValueError, match="block"):
        block_hashes(a, block=0)


# ---- the store ----------------------------------------------------------------------
def test_store_then_load_copies_the_keys_and_values_and_leaves_the_last_token():
    gpt = small_gpt()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (3 * BLOCK,), generator=gen).tolist()  # exactly 3 blocks
    src = filled_row(gpt, ids)
    store = PrefixCache(capacity_bytes=10 * block_bytes(gpt))
    assert store.store(ids, src, 0) == 3 and len(store) == 3
    assert store.bytes == 3 * block_bytes(gpt)
    assert store.store(ids, src, 0) == 0  # already there

    dst = KVCache(gpt.config, 2, max_len=96)
    # a prompt of exactly 3 blocks gets 2 (its last token must be computed)
    assert store.load(ids, dst, 1) == 2 * BLOCK
    assert torch.equal(dst.k[:, 1, :, :2 * BLOCK], src.k[:, 0, :, :2 * BLOCK])
    assert torch.equal(dst.v[:, 1, :, :2 * BLOCK], src.v[:, 0, :, :2 * BLOCK])
    assert not dst.k[:, 0].any(), "another row was written"
    # one more token: all 3 blocks
    assert store.load(ids + [0], dst, 0) == 3 * BLOCK
    # exactly one block, and shorter than a block: nothing to reuse
    assert store.load(ids[:BLOCK], dst, 0) == 0
    assert store.load(ids[:5], dst, 0) == 0
    # a different first token: no match at all, the chain breaks at block 0
    assert store.load([(ids[0] + 1) % 23] + ids[1:], dst, 0) == 0
    # the same first block, then different: one block
    assert store.load(ids[:BLOCK] + [(t + 1) % 23 for t in ids[BLOCK:]], dst, 0) == BLOCK


def test_lru_eviction_keeps_the_cap_and_drops_chain_tails_first():
    gpt = small_gpt()
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, 23, (3 * BLOCK,), generator=gen).tolist()
    b = torch.randint(0, 23, (2 * BLOCK,), generator=gen).tolist()
    store = PrefixCache(capacity_bytes=4 * block_bytes(gpt))
    store.store(a, filled_row(gpt, a), 0)
    store.store(b, filled_row(gpt, b), 0)  # 5 blocks > 4: one of a's goes, its last one
    assert len(store) == 4 and store.bytes == 4 * block_bytes(gpt) <= store.capacity_bytes
    ha, hb = block_hashes(a), block_hashes(b)
    assert ha[0] in store and ha[1] in store and ha[2] not in store
    assert all(h in store for h in hb)
    dst = KVCache(gpt.config, 1, max_len=96)
    assert store.load(a + [0], dst, 0) == 2 * BLOCK  # a's first two blocks are still usable
    # a was used last: storing a new prompt now evicts b's tail, not a's blocks
    c = torch.randint(0, 23, (BLOCK,), generator=gen).tolist()
    store.store(c, filled_row(gpt, c), 0)
    assert hb[1] not in store and ha[0] in store and ha[1] in store
    store.clear()
    assert len(store) == 0 and store.bytes == 0


def test_capacity_zero_stores_nothing_and_bad_capacity_is_refused():
    gpt = small_gpt()
    ids = list(range(20)) * 2
    store = PrefixCache(capacity_bytes=0)
    assert store.store(ids, filled_row(gpt, ids), 0) == 0
    assert len(store) == 0 and store.load(ids, KVCache(gpt.config, 1, max_len=96), 0) == 0
    # a cap smaller than one block keeps nothing either
    tiny = PrefixCache(capacity_bytes=block_bytes(gpt) - 1)
    assert tiny.store(ids, filled_row(gpt, ids), 0) == 0 and tiny.bytes == 0
    with pytest.raises(ValueError, match="capacity_bytes"):
        PrefixCache(capacity_bytes=-1)


# ---- prefill after a cached prefix --------------------------------------------------
@pytest.mark.parametrize("starts", [[16, 0, 8, 24], [32, 16, 16, 0], [0, 0, 0, 1], [39, 16, 24, 32]])
def test_prefill_with_offsets_equals_prefill_from_scratch(starts):
    """Rows with different cached lengths (0 among them), right-padded: logits and keys/values as
    from scratch (allclose: the masked attention sums in another order than the causal one)."""
    gpt = small_gpt()
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([40, 17, 25, 33])
    full = torch.randint(0, 23, (4, 40), generator=gen)
    ref = KVCache(gpt.config, 5, max_len=60)
    ref_logits = prefill(gpt, full, lengths, ref, first_row=1)
    start = torch.tensor(starts)
    cache = KVCache(gpt.config, 5, max_len=60)
    for i, s in enumerate(starts):  # what a prefix cache copies in
        cache.k[:, 1 + i, :, :s] = ref.k[:, 1 + i, :, :s]
        cache.v[:, 1 + i, :, :s] = ref.v[:, 1 + i, :, :s]
    idx, new = pad_prompts([full[i, s:int(lengths[i])].tolist() for i, s in enumerate(starts)])
    logits = prefill(gpt, idx, new, cache, first_row=1, start=start)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [0] + lengths.tolist()
    for i in range(4):
        n = int(lengths[i])
        torch.testing.assert_close(cache.k[:, 1 + i, :, :n], ref.k[:, 1 + i, :, :n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(cache.v[:, 1 + i, :, :n], ref.v[:, 1 + i, :, :n], atol=1e-6, rtol=1e-5)
    assert not cache.k[:, 0].any(), "a row outside the batch was written"


def test_prefill_offsets_are_checked_and_zero_offsets_take_the_plain_path():
    gpt = small_gpt()
    idx = torch.randint(0, 23, (2, 8))
    plain = KVCache(gpt.config, 2, max_len=20)
    zero = KVCache(gpt.config, 2, max_len=20)
    a = prefill(gpt, idx, torch.tensor([8, 5]), plain)
    b = prefill(gpt, idx, torch.tensor([8, 5]), zero, start=torch.zeros(2, dtype=torch.long))
    assert torch.equal(a, b) and torch.equal(plain.k, zero.k)
    with pytest.raises(ValueError, match="max_len"):
        prefill(gpt, idx, torch.tensor([8, 5]), zero, start=torch.tensor([13, 0]))
    with pytest.raises(ValueError, match="start"):
        prefill(gpt, idx, torch.tensor([8, 5]), zero, start=torch.tensor([1]))
    with pytest.raises(ValueError, match="start"):
        prefill(gpt, idx, torch.tensor([8, 5]), zero, start=torch.tensor([-1, 2]))


# ---- the engine ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt():
    return load_tiny_gpt()


Batches = list[list[tuple[list[int], int]]]


def run_engine(model: TinyGPT, batches: Batches, **kw) -> tuple[list[list[int]], ServingMetrics, GenerationEngine]:
    """Greedy outputs of a real engine for ``batches`` of (prompt ids, max_new_tokens), each batch
    submitted after the previous one ended; returns them, the metrics and the engine."""
    metrics = ServingMetrics()
    settings = ServeSettings(embed=False, threads=1, stream_interval_ms=0, **kw)

    async def main() -> tuple[list[list[int]], GenerationEngine]:
        engine = GenerationEngine(model, settings, metrics)
        engine.start(asyncio.get_running_loop())
        outs = []
        try:
            for batch in batches:
                reqs = [engine.submit(ids, n) for ids, n in batch]
                for req in reqs:
                    toks = []
                    while (event := await req.events.get())[0] == "token":
                        toks.append(event[1])
                    assert event[0] == "end", event
                    outs.append(toks)
        finally:
            engine.stop()
        return outs, engine

    outs, engine = asyncio.run(main())
    return outs, metrics, engine


def sample(metrics: ServingMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_engine_outputs_are_identical_with_and_without_the_prefix_cache(gpt):
    """A static batch of newcomers whose cached lengths differ (2 blocks, 1, 0 for a prompt of exactly
    one block, 0 for one shorter than a block, 2 for one that diverges inside block 3), after a first
    batch that filled the cache; the hit counter says exactly which tokens were not computed."""
    model, tok = gpt
    text = load_corpus()
    a = tok.encode(text[1000:1000 + 3 * BLOCK])  # exactly 3 blocks
    other = tok.encode(text[5000:5000 + 40])
    first = [(a, 6)] * 5  # fills the static batch at once: no waiting for company
    second = [(a, 6),                                       # exactly 3 blocks: 2 reused
              (a[:BLOCK] + other[:4], 6),                   # 1 block reused
              (a[:BLOCK], 6),                               # exactly one block: nothing reused
              (a[:5], 6),                                   # shorter than a block
              (a[:40] + other[:10], 6)]                     # diverges in block 3: 2 reused
    batches = [first, second]
    kw = dict(batching="static", max_batch_size=5, max_wait_ms=5000)
    on, m_on, e_on = run_engine(model, batches, **kw)
    off, m_off, e_off = run_engine(model, batches, prefix_cache_mb=0, **kw)
    assert on == off
    assert e_off.core.prefix is None and e_on.core.prefix is not None
    assert sample(m_on, "serve_prefix_cache_hit_tokens_total") == 2 * BLOCK + BLOCK + 0 + 0 + 2 * BLOCK
    looked_up = sum(len(ids) for batch in batches for ids, _ in batch)
    assert sample(m_on, "serve_prefix_cache_lookup_tokens_total") == looked_up
    assert sample(m_on, "serve_prefix_cache_bytes") == e_on.core.prefix.bytes > 0
    assert sample(m_off, "serve_prefix_cache_hit_tokens_total") == 0
    assert sample(m_off, "serve_prefix_cache_lookup_tokens_total") == 0
    assert b"serve_prefix_cache_hit_tokens_total" in m_on.render()


def test_engine_iteration_batching_with_shared_system_prompts(gpt):
    """Requests sharing system prompts of several lengths (block boundaries included) join while
    others decode; greedy outputs equal those of the engine without the cache."""
    model, tok = gpt
    text = load_corpus()
    system = tok.encode(text[20_000:20_000 + 200])
    prompts = [system[:n] + tok.encode(text[30_000 + 97 * i:30_000 + 97 * i + 8 + i % 5])
               for i, n in enumerate([200, 200, 15, 16, 17, 32, 200, 48, 1, 199])]
    batches = [[(p, 12)] for p in prompts[:1]] + [[(p, 12 + i % 3) for i, p in enumerate(prompts[1:])]]
    on, m_on, _ = run_engine(model, batches, batching="iteration", max_batch_size=4)
    off, _, _ = run_engine(model, batches, batching="iteration", max_batch_size=4, prefix_cache_mb=0)
    assert on == off
    assert sample(m_on, "serve_prefix_cache_hit_tokens_total") >= 3 * (200 // BLOCK) * BLOCK


def test_prompts_of_one_token_answers_are_filed_too(gpt):
    """Blocks are filed after the first token went out (at the next step); a request that ends
    within its first step (max_new_tokens 1 or 2) still gets its prompt filed."""
    model, tok = gpt
    a = tok.encode(load_corpus()[7000:7000 + 2 * BLOCK + 3])
    for new in (1, 2):
        outs, metrics, engine = run_engine(model, [[(a, new)], [(a, 4)]])
        assert sample(metrics, "serve_prefix_cache_hit_tokens_total") == 2 * BLOCK
        assert len(engine.core.prefix) == 2 and not engine.core._to_file
        assert outs[1][:new] == outs[0]


def test_a_failing_lookup_is_a_miss_and_the_request_is_still_answered(gpt, caplog):
    """The core treats a prefix lookup that raises as a miss: the prompt is computed in full, the
    answer is the same, the running request is untouched, and the failure is logged."""
    model, tok = gpt
    ids = tok.encode(load_corpus()[3000:3100])
    settings = ServeSettings(embed=False, threads=1, stream_interval_ms=0)

    async def answer(req) -> tuple[list[int], tuple]:
        toks = []
        while (event := await req.events.get())[0] == "token":
            toks.append(event[1])
        return toks, event

    async def main() -> tuple[list, list, list, int]:
        engine = GenerationEngine(model, settings, ServingMetrics())
        engine.start(asyncio.get_running_loop())
        real_load = engine.core.prefix.load
        try:
            running = engine.submit(ids, 40)
            first = await running.events.get()
            assert first[0] == "token"  # it is decoding now

            def broken(*args, **kwargs):
                raise RuntimeError("lookup broke")

            engine.core.prefix.load = broken
            bad = await answer(engine.submit(ids, 5))
            engine.core.prefix.load = real_load
            good = await answer(engine.submit(ids, 5))
            rest = await answer(running)
            return [first[1]] + rest[0], bad, good, engine.errors
        finally:
            engine.stop()

    running_toks, bad, good, errors = asyncio.run(main())
    assert bad[1][0] == "end" and bad[0] == good[0] and len(bad[0]) == 5
    assert running_toks[:5] == good[0] and len(running_toks) == 40
    assert errors == 0
    assert "prefix cache lookup failed" in caplog.text


def test_prefix_cache_setting_is_validated_and_on_the_command_line():
    import argparse

    from course_utils.serving.server.settings import add_cli_arguments, settings_from_args

    assert ServeSettings().prefix_cache_mb > 0
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        ServeSettings(prefix_cache_mb=-1)
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    assert settings_from_args(parser.parse_args(["--prefix-cache-mb", "0"])).prefix_cache_mb == 0
    assert "--prefix-cache-mb" in parser.format_help()
    off = ServeSettings(prefix_cache_mb=0)
    assert settings_from_args(parser.parse_args(off.to_cli_args())) == off
