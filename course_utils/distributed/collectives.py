"""A job that runs the three collectives every data-parallel method is built from, and reports what each gave.

``torchrun --nproc-per-node 2 -m course_utils.distributed.collectives``: rank r starts from the
tensor ``[r*n + 1, ..., r*n + n]``; the result holds each collective's output on every rank,
gathered to rank 0, and the bytes each one moved into a rank.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from . import runtime


def main(argv: list[str] | None = None) -> None:
    """Run all-reduce, all-gather and reduce-scatter on every rank and emit what each rank got."""
    p = runtime.parser("collectives on gloo")
    p.add_argument("--per-rank", type=int, default=4, help="elements per rank (a multiple of the world size)")
    p.add_argument("--dist-backend", default="gloo", choices=["gloo", "nccl"], help="nccl: one GPU per rank")
    args = p.parse_args(argv)
    rank, world = runtime.init(args.dist_backend)
    device = torch.device("cpu")
    if args.dist_backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    n = args.per_rank
    mine = (torch.arange(1, n + 1, dtype=torch.float32) + rank * n).to(device)
    runtime.log(f"starts with {mine.cpu().tolist()} (backend {dist.get_backend()}, world size {world})")

    reduced = mine.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)        # every rank: the elementwise sum

    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)                       # every rank: everyone's tensor

    scattered = torch.empty(n // world, device=device)
    if dist.get_backend() == "gloo":                      # rank r: slice r of the sum
        _reduce_scatter_gloo(scattered, mine, world)
    else:
        dist.reduce_scatter_tensor(scattered, mine)

    outputs = {"input": mine, "all_reduce": reduced, "all_gather": torch.cat(gathered), "reduce_scatter": scattered}
    per_rank: dict[str, list[list[float]]] = {}
    for name, tensor in outputs.items():
        everyone = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(everyone, tensor)
        per_rank[name] = [t.cpu().tolist() for t in everyone]
    runtime.emit({"world": world, "backend": dist.get_backend(), "n": n, "per_rank": per_rank})
    runtime.finish()


def _reduce_scatter_gloo(out: torch.Tensor, tensor: torch.Tensor, world: int) -> None:
    """Reduce-scatter through the list form (``dist.reduce_scatter``), which gloo supports."""
    chunks = list(tensor.chunk(world))
    dist.reduce_scatter(out, chunks)


if __name__ == "__main__":
    main()
