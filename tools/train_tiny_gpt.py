"""Train the tiny character GPT served by ``python -m course_utils serve`` and save ``data/tiny_gpt.pt``.

Usage: ``python tools/train_tiny_gpt.py [--steps N] [--out PATH]`` (seeded; about 4 minutes on
a laptop CPU). The model has ``block_size`` 512 so a 256-character prompt plus 256 new tokens
fits; it trains on 128-character windows placed at random offsets (``start_pos``), so every
position embedding up to 512 is trained. The checkpoint holds only tensors, strings and
numbers, so ``torch.load(..., weights_only=True)`` reads it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: import this checkout's course_utils

from course_utils.config import data_dir  # noqa: E402
from course_utils.data import char_lm_split, random_batch  # noqa: E402
from course_utils.models import GPTConfig, TinyGPT  # noqa: E402
from course_utils.models.checkpoint import CHECKPOINT_FILE, FORMAT  # noqa: E402

CONFIG = dict(block_size=512, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
WINDOW = 128


def main(argv: list[str] | None = None) -> int:
    """Train, report the validation loss, and write the checkpoint."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=data_dir() / CHECKPOINT_FILE,
                        help=f"default: {CHECKPOINT_FILE} in the course's data folder (where the server reads it)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    tok, train_ids, val_ids = char_lm_split(0.1)
    config = GPTConfig(vocab_size=tok.vocab_size, **CONFIG)
    model = TinyGPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    def batch_loss(ids: torch.Tensor) -> torch.Tensor:
        x, y = random_batch(ids, args.batch_size, WINDOW, generator=gen)
        start = int(torch.randint(0, config.block_size - WINDOW + 1, (1,), generator=gen))
        logits = model(x, start_pos=start)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    t0 = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = batch_loss(train_ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - t0:.0f} s", flush=True)
    model.eval()
    with torch.no_grad():
        val = sum(float(batch_loss(val_ids)) for _ in range(20)) / 20
    print(f"validation loss {val:.3f}")
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "head.weight"}
    ckpt = {
        "format": FORMAT,  # the loader (models.checkpoint) refuses any other
        "config": config.to_dict(),
        "tokenizer": tok.to_dict(),
        "state_dict": state,
        "train": {"steps": args.steps, "batch_size": args.batch_size, "window": WINDOW,
                  "lr": args.lr, "seed": 0, "val_loss": round(val, 4)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
