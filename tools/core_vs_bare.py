"""How close does the serving core come to the bare model, with no server around it?

    .venv/bin/python tools/core_vs_bare.py [ROUNDS]

Times, interleaved in rounds on one torch thread, the same greedy work two ways: the bare model
loop of ``serving.extras.bare.bare_decode`` (one prefill of 32 prompts of 8 tokens, then 31 decoding steps) and
``EngineCore.generate`` on the same prompts (one forward pass per step: the first computes all the
prompts, the rest decode). Prints both rates and their ratio: what the core's scheduling costs
before any HTTP, threads or event loop. The figures in issue notes about the core come from here.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from course_utils.models import load_tiny_gpt
from course_utils.models.gpt import KVCache, pad_prompts
from course_utils.serving.core import EngineCore
from course_utils.serving.extras.bare import bare_decode

BATCH, PROMPT, NEW = 32, 8, 32


def main(rounds: int = 15) -> None:
    model, _ = load_tiny_gpt()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (PROMPT,), generator=gen).tolist() for _ in range(BATCH)]
    core = EngineCore(model, BATCH, max_len=512)
    cache = KVCache(model.config, BATCH, max_len=512)
    idx, lengths = pad_prompts(prompts)

    def bare() -> None:
        bare_decode(model, idx, lengths, cache, NEW)

    def served_by_core() -> None:
        core.generate(prompts, NEW)

    times: dict[str, list[float]] = {"bare model": [], "EngineCore": []}
    with torch.inference_mode():
        bare(), served_by_core()  # warm-up
        for _ in range(rounds):
            for name, fn in (("bare model", bare), ("EngineCore", served_by_core)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    rate = {name: BATCH * NEW / statistics.median(t) for name, t in times.items()}
    for name, r in rate.items():
        print(f"{name:>11}: {r:9,.0f} tokens/s (median of {rounds})")
    print(f"EngineCore / bare model: {rate['EngineCore'] / rate['bare model']:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
