"""The tiny GPT's key-value cache: cached greedy decoding equals the plain model, row by row."""

from types import SimpleNamespace

import pytest
import torch

from course_utils.models import GPTConfig, TinyGPT
from course_utils.models.gpt import KVCache, decode_step, generate_cached, prefill
from course_utils.serving.extras.bare import bare_decode_tokens_per_s


def small_gpt(block_size: int = 48) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=23, block_size=block_size, n_layer=2, n_head=2, n_embd=32)).eval()


def test_forward_default_unchanged_and_start_pos():
    gpt = small_gpt()
    idx = torch.randint(0, 23, (2, 10))
    torch.testing.assert_close(gpt(idx), gpt(idx, start_pos=0))
    assert not torch.allclose(gpt(idx), gpt(idx, start_pos=5))
    with pytest.raises(ValueError, match="exceeds block_size"):
        gpt(idx, start_pos=40)


def test_cached_greedy_equals_uncached_for_rows_of_different_lengths():
    gpt = small_gpt()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 23, (4, 9), generator=gen)
    lengths = torch.tensor([9, 1, 5, 3])
    cached = generate_cached(gpt, idx, 20, lengths)
    for row in range(4):
        n = int(lengths[row])
        plain = gpt.generate(idx[row:row + 1, :n], 20, temperature=0)[0, n:].tolist()
        assert cached[row] == plain, f"row {row} differs"


def test_prefill_and_decode_logits_match_full_forward():
    gpt = small_gpt()
    idx = torch.randint(0, 23, (3, 12))
    cache = KVCache(gpt.config, capacity=3, max_len=16)
    logits = prefill(gpt, idx[:, :8], torch.full((3,), 8), cache)
    torch.testing.assert_close(logits, gpt(idx[:, :8])[:, -1], atol=1e-5, rtol=1e-5)
    for t in range(8, 12):
        logits = decode_step(gpt, idx[:, t], cache)
        torch.testing.assert_close(logits, gpt(idx[:, :t + 1])[:, -1], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [12, 12, 12]



def test_prefill_and_decode_logits_match_each_rows_own_forward_at_mixed_lengths():
    """Right-padded prompts of different lengths, prefilled together and decoded for 6 steps: every
    row's logits at every step equal the plain forward of that row's own sequence (atol/rtol 1e-5:
    the cache only changes the order of the sums), and the cache holds what a forward computes."""
    gpt = small_gpt()
    gen = torch.Generator().manual_seed(4)
    lengths = torch.tensor([7, 1, 4, 7])
    idx = torch.randint(0, 23, (4, 7), generator=gen)
    cache = KVCache(gpt.config, capacity=5, max_len=20)
    seqs = [idx[r, :int(lengths[r])].tolist() for r in range(4)]
    logits = prefill(gpt, idx, lengths, cache)
    for step in range(7):
        for r, seq in enumerate(seqs):
            torch.testing.assert_close(logits[r], gpt(torch.tensor([seq]))[0, -1], atol=1e-5, rtol=1e-5)
        if step == 6:
            break
        tokens = torch.randint(0, 23, (4,), generator=gen)  # any next token, not only the argmax
        for r, seq in enumerate(seqs):
            seq.append(int(tokens[r]))
        logits = decode_step(gpt, tokens, cache)
    assert cache.lengths[:4].tolist() == [len(s) for s in seqs]
    _, present = gpt.forward_cached(torch.tensor([seqs[2]]), torch.arange(len(seqs[2])))
    for layer, (k, v) in enumerate(present):
        torch.testing.assert_close(cache.k[layer, 2, :, :len(seqs[2])], k[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[layer, 2, :, :len(seqs[2])], v[0], atol=1e-5, rtol=1e-5)

def test_rows_join_late_and_move():
    """A row prefilled later (iteration-level batching) and a row moved into a hole stay exact."""
    gpt = small_gpt()
    a, b = torch.randint(0, 23, (1, 6)), torch.randint(0, 23, (1, 4))
    cache = KVCache(gpt.config, capacity=3, max_len=32)
    nxt_a = prefill(gpt, a, torch.tensor([6]), cache, first_row=0).argmax(-1)
    seq_a = torch.cat([a, nxt_a[:, None]], 1)
    nxt_a = decode_step(gpt, nxt_a, cache).argmax(-1)  # a alone for one step
    seq_a = torch.cat([seq_a, nxt_a[:, None]], 1)
    nxt_b = prefill(gpt, b, torch.tensor([4]), cache, first_row=1).argmax(-1)  # b joins in row 1
    seq_b = torch.cat([b, nxt_b[:, None]], 1)
    tokens = torch.cat([nxt_a, nxt_b])
    for _ in range(3):
        tokens = decode_step(gpt, tokens, cache).argmax(-1)
        seq_a = torch.cat([seq_a, tokens[:1, None]], 1)
        seq_b = torch.cat([seq_b, tokens[1:, None]], 1)
    cache.move_row(1, 0)  # a leaves; b moves into row 0
    nxt = decode_step(gpt, tokens[1:], cache).argmax(-1)
    assert seq_a[0, 6:].tolist() == gpt.generate(a, 5, temperature=0)[0, 6:].tolist()
    assert torch.cat([seq_b, nxt[:, None]], 1)[0, 4:].tolist() == gpt.generate(b, 5, temperature=0)[0, 4:].tolist()


def test_swap_rows_exchanges_keys_values_and_lengths():
    gpt = small_gpt()
    cache = KVCache(gpt.config, 3, max_len=8)
    cache.k.normal_(), cache.v.normal_()
    cache.lengths[:] = torch.tensor([5, 2, 7])
    k0, k2, v0 = cache.k[:, 0, :, :5].clone(), cache.k[:, 2, :, :7].clone(), cache.v[:, 0, :, :5].clone()
    untouched = cache.k[:, 1].clone()
    cache.swap_rows(0, 2)
    assert cache.lengths.tolist() == [7, 2, 5]
    assert torch.equal(cache.k[:, 0, :, :7], k2) and torch.equal(cache.k[:, 2, :, :5], k0)
    assert torch.equal(cache.v[:, 2, :, :5], v0) and torch.equal(cache.k[:, 1], untouched)
    cache.swap_rows(1, 1)
    assert cache.lengths.tolist() == [7, 2, 5]


def test_cache_limits_are_enforced():
    gpt = small_gpt(block_size=16)
    with pytest.raises(ValueError, match="max_len"):
        KVCache(gpt.config, 2, max_len=17)
    cache = KVCache(gpt.config, 1, max_len=4)
    prefill(gpt, torch.zeros(1, 4, dtype=torch.long), torch.tensor([4]), cache)
    with pytest.raises(ValueError, match="exceed"):
        decode_step(gpt, torch.zeros(1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="capacity"):
        prefill(gpt, torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 2]), cache)


def test_a_cached_step_does_the_same_work_at_every_length_and_far_less_than_recomputing():
    """The point of the cache, counted (not timed): one decode step's matmul FLOPs do not grow
    with the context, while the uncached step (the whole prefix again) grows with it."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(fn, *args) -> int:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            fn(*args)
        return counter.get_total_flops()

    gpt = small_gpt()
    cached, uncached = {}, {}
    for length in (8, 16, 32):
        idx = torch.randint(0, 23, (1, length + 1))
        cache = KVCache(gpt.config, capacity=1)
        prefill(gpt, idx[:, :length], torch.tensor([length]), cache)
        cached[length] = flops(decode_step, gpt, idx[:, length], cache)
        uncached[length] = flops(gpt, idx)
    assert max(cached.values()) < 1.25 * min(cached.values()), cached
    assert uncached[32] > 3 * uncached[8], uncached
    assert all(uncached[n] > n / 2 * cached[n] for n in cached), (cached, uncached)


def test_bare_decode_counts_every_generated_token_once(monkeypatch):
    """tokens/s = batch x new tokens / the median run: one prefill and new_tokens - 1 decode steps a
    run (the prefill yields the first token), one warm-up run, threads restored (a fake clock)."""
    import course_utils.serving.extras.bare as bare
    from course_utils import bench

    calls = {"prefill": 0, "decode": 0}
    real_prefill, real_decode = bare.prefill, bare.decode_step

    def counting_prefill(*args, **kwargs):
        calls["prefill"] += 1
        return real_prefill(*args, **kwargs)

    def counting_decode(*args, **kwargs):
        calls["decode"] += 1
        return real_decode(*args, **kwargs)

    ticks = iter(range(0, 1000, 2))  # every run takes 2 fake seconds
    monkeypatch.setattr(bare, "prefill", counting_prefill)
    monkeypatch.setattr(bare, "decode_step", counting_decode)
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))  # bare times with bench
    threads = torch.get_num_threads()
    rate = bare_decode_tokens_per_s(small_gpt(), batch_size=4, prompt_len=4, new_tokens=8, repeats=3,
                                    threads=1)
    assert rate == 4 * 8 / 2
    assert calls == {"prefill": 4, "decode": 4 * 7}
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match=">= 1"):
        bare_decode_tokens_per_s(small_gpt(), batch_size=0)


def test_compiled_decode_core_is_one_graph_without_breaks_and_matches_eager():
    """The server compiles decode_core: batch 1 gets its own graph (sizes 0 and 1 are
    specialised), every other batch size and length reuses a second one (fullgraph=True makes a
    graph break an error), and compiled decoding agrees with eager."""
    from torch._dynamo.utils import counters

    from course_utils.models.gpt import decode_core

    gpt = small_gpt()
    torch._dynamo.reset()
    counters.clear()
    core = torch.compile(decode_core, dynamic=True, fullgraph=True, backend="eager")
    gen = torch.Generator().manual_seed(3)
    capacity = 8  # like the server: one cache, a varying number of live rows
    with torch.inference_mode():
        # the server's warm-up order: batch 1 (its own graph), then batch 3; nothing after recompiles
        for n, prompt in ((1, 4), (3, 5), (5, 1), (7, 9), (2, 20), (2, 2)):
            idx = torch.randint(0, 23, (n, prompt), generator=gen)
            lengths = torch.randint(1, prompt + 1, (n,), generator=gen)
            eager_cache, comp_cache = KVCache(gpt.config, capacity), KVCache(gpt.config, capacity)
            prefill(gpt, idx, lengths, eager_cache)
            prefill(gpt, idx, lengths, comp_cache)
            tokens = torch.randint(0, 23, (n,), generator=gen)
            for _ in range(4):
                expected = decode_step(gpt, tokens, eager_cache)
                got = decode_step(gpt, tokens, comp_cache, core=core)
                torch.testing.assert_close(got, expected)
                tokens = expected.argmax(-1)
            torch.testing.assert_close(comp_cache.k, eager_cache.k)
    assert counters["stats"]["unique_graphs"] == 2


def test_pad_prompts_right_pads_and_refuses_empty_prompts():
    from course_utils.models.gpt import pad_prompts

    idx, lengths = pad_prompts([[5, 6, 7], [9]])
    assert idx.tolist() == [[5, 6, 7], [9, 0, 0]] and lengths.tolist() == [3, 1]
    for bad in ([], [[1], []]):
        with pytest.raises(ValueError, match="at least one"):
            pad_prompts(bad)
