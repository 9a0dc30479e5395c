"""A fault-tolerant training job: checkpoints as it goes, and resumes from the last one when torchrun restarts it.

``torchrun --nproc-per-node 2 --max-restarts 1 -m course_utils.distributed.elastic --dir D --kill-at 5``:
DDP training of ``--steps`` steps; after every ``--every`` steps rank 0 writes a checkpoint
(model, optimizer, step, losses so far), atomically. With ``--kill-at S``, rank 1 of the first
attempt kills itself (SIGKILL, as a crashed machine would vanish) at step S; torchrun notices,
stops the other rank and starts both again, and they resume from the last checkpoint. The result
holds the restart count (``TORCHELASTIC_RESTART_COUNT``), the step resumed from, the losses, a
fingerprint of the final weights (to compare with a run that never failed) and each step's seconds.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from . import runtime

CHECKPOINT = "latest.pt"


def fingerprint(model: nn.Module) -> str:
    """Return a SHA-256 of the model's parameters' bytes (equal only for bit-identical weights)."""
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int, losses: list[float]) -> None:
    """Write the checkpoint to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "losses": losses}, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    """Train with checkpoints, resuming from the last one; optionally crash rank 1 once; emit the outcome."""
    p = runtime.parser("training that survives a killed rank")
    p.add_argument("--dir", required=True, help="checkpoint folder (created)")
    p.add_argument("--every", type=int, default=2, help="checkpoint after every this many steps")
    p.add_argument("--kill-at", type=int, default=-1, help="rank 1 of the first attempt dies at this step")
    args = p.parse_args(argv)
    rank, world = runtime.init()
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT
    model = runtime.make_model(args.width, args.depth)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start, losses = 0, []
    if path.exists():
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start, losses = int(state["step"]), list(state["losses"])
        runtime.log(f"attempt {restarts}: resuming from the checkpoint after step {start}")
    else:
        runtime.log(f"attempt {restarts}: no checkpoint, starting from step 0")
    ddp = DDP(model)
    step_fn = runtime.maybe_compile(ddp, args.backend)
    step_s: list[float] = []
    for step in range(start, args.steps):
        began = time.perf_counter()
        if step == args.kill_at and rank == 1 and restarts == 0:
            runtime.log(f"dies at step {step} (SIGKILL)")
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = runtime.global_batch(step, args.batch, args.width)
        loss = nn.functional.cross_entropy(step_fn(runtime.shard(x, rank, world)), runtime.shard(y, rank, world))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
        step_s.append(time.perf_counter() - began)
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            if rank == 0:
                save(path, model, opt, step + 1, losses)
            dist.barrier()  # nobody runs ahead of a checkpoint being written
    result: dict[str, Any] = {"world": world, "restarts": restarts, "resumed_from": start, "steps": args.steps,
                              "losses": losses, "fingerprint": fingerprint(model),
                              "batch": args.batch, "step_s": step_s[1:]}  # the first step warms up
    runtime.log(f"finished {args.steps} steps after {restarts} restart(s); weights {result['fingerprint']}")
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()
