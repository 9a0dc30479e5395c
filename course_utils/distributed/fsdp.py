"""An FSDP2 job (``fully_shard``) with ``torch.compile``: bytes each rank holds, DTensor parameters, a loss curve.

``torchrun --nproc-per-node 2 -m course_utils.distributed.fsdp``: every block and then the whole
model are sharded with ``fully_shard``; the result holds the parameter bytes one rank keeps
against the whole model's, each parameter's type and placement, and the losses of ``--steps``
SGD steps on the same data as the DDP job (same model, same learning rate).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from . import runtime


def shard_model(model: runtime.MLP) -> runtime.MLP:
    """Return ``model`` with each block, then the whole model, sharded by FSDP2 over the default group."""
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def local_bytes(model: torch.nn.Module) -> int:
    """Return the bytes of parameters this rank stores (the local shard of each DTensor)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def main(argv: list[str] | None = None) -> None:
    """Shard, compile and train the MLP; emit bytes per rank, parameter placements and losses."""
    args = runtime.parser("FSDP2 with torch.compile").parse_args(argv)
    rank, world = runtime.init()
    full_bytes = sum(p.numel() * p.element_size() for p in runtime.make_model(args.width, args.depth).parameters())
    model = shard_model(runtime.make_model(args.width, args.depth))
    mine = local_bytes(model)
    everyone = [torch.zeros((), dtype=torch.int64) for _ in range(world)]
    dist.all_gather(everyone, torch.tensor(mine))
    params = {name: {"type": type(p).__name__, "placements": str(getattr(p, "placements", "")),
                     "global_shape": list(p.shape),
                     "local_shape": list((p.to_local() if isinstance(p, DTensor) else p).shape)}
              for name, p in model.named_parameters()}
    runtime.log(f"holds {mine:,} of the model's {full_bytes:,} parameter bytes ({mine / full_bytes:.3f})")
    compiled = runtime.maybe_compile(model, args.backend)
    losses = runtime.train(compiled, range(args.steps), args.batch, args.width, args.lr, rank, world)
    runtime.log(f"losses: {[round(v, 4) for v in losses]}")
    result: dict[str, Any] = {"world": world, "backend": args.backend, "full_bytes": full_bytes,
                              "bytes_per_rank": [int(b) for b in everyone],
                              "param_bytes_per_rank_ratio": max(int(b) for b in everyone) / full_bytes,
                              "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
                              "params": params, "losses": losses}
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()
