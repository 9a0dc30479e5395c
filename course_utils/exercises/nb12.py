"""Exercises of notebook 12: shard sizes per rank, what an all-reduce gives, the global batch.

The shard-size checker compares with what DTensor itself does (``torch.chunk`` along the sharded
dimension), so the reference cannot drift from the library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .framework import Mistake, case, function_exercise

# --- 12.shard_sizes: how many rows each rank holds when a dimension of n is sharded over world ranks.


def shard_sizes(n: int, world: int) -> list[int]:
    """Return the length of each rank's shard of a dimension of ``n`` split by ``Shard`` over ``world`` ranks."""
    per_rank = -(-n // world)  # ceil(n / world): every rank but the last ones gets this many
    return [max(0, min(per_rank, n - rank * per_rank)) for rank in range(world)]


def _chunk_sizes(n: int, world: int) -> list[int]:
    """What DTensor does: ``torch.chunk`` into ``world`` pieces, ranks without a piece hold nothing."""
    sizes = [len(c) for c in torch.arange(n).chunk(world)]
    return sizes + [0] * (world - len(sizes))


def _shard_mistakes() -> list[Mistake]:
    def floor_only(n, world):
        return [n // world] * world

    def spread_remainder(n, world):  # numpy.array_split's rule
        return [n // world + (1 if rank < n % world else 0) for rank in range(world)]

    def remainder_last(n, world):
        return [n // world] * (world - 1) + [n // world + n % world]

    return [(floor_only, "n // world for every rank loses the remainder: the shard sizes must add up to n."),
            (spread_remainder, "That spreads the remainder one row at a time (numpy.array_split's rule). Shard "
                               "splits like torch.chunk: ceil(n / world) rows per rank, and the last ranks get what "
                               "is left, possibly nothing."),
            (remainder_last, "Shard does not pile the remainder on the last rank: it gives every rank "
                             "ceil(n / world) rows until the rows run out, like torch.chunk.")]


function_exercise(
    "12.shard_sizes",
    solution=shard_sizes,
    reference=_chunk_sizes,
    cases=lambda: [(8, 2), (10, 4), (5, 4), (7, 3), (1, 2), (384, 2)],
    mistakes=_shard_mistakes,
    otherwise="Each rank gets ceil(n / world) rows until they run out; the sizes add up to n, one entry per rank.",
    errors=[(ZeroDivisionError, "world is at least 1 in every case; check which number you divide by.")],
    success="your shard sizes are the ones DTensor uses (torch.chunk's split).",
)

# --- 12.all_reduce: what every rank holds after dist.all_reduce(t) (the default op, SUM).


def after_all_reduce(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Return what each rank holds after ``all_reduce`` (SUM) when rank r started with ``tensors[r]``."""
    total = torch.stack(list(tensors)).sum(dim=0)
    return [total.clone() for _ in tensors]


def _all_reduce_cases() -> list[Any]:
    def every(world: int, total: list[Any]) -> list[torch.Tensor]:   # rank r's tensor after the all_reduce
        return [torch.tensor(total) for _ in range(world)]

    return [case([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])], gives=every(2, [4.0, 6.0])),
            case([torch.arange(4.0), torch.ones(4), torch.full((4,), 2.0)], gives=every(3, [3.0, 4.0, 5.0, 6.0])),
            case([torch.tensor([[1.0, -1.0], [0.5, 2.0]]), torch.tensor([[0.0, 1.0], [1.5, -2.0]])],
                 gives=every(2, [[1.0, 0.0], [2.0, 0.0]]))]


def _all_reduce_mistakes() -> list[Mistake]:
    def mean(tensors):
        avg = torch.stack(list(tensors)).mean(dim=0)
        return [avg.clone() for _ in tensors]

    def gathered(tensors):
        cat = torch.cat(list(tensors))
        return [cat.clone() for _ in tensors]

    def unchanged(tensors):
        return [t.clone() for t in tensors]

    def scattered(tensors):
        return list(torch.stack(list(tensors)).sum(dim=0).chunk(len(tensors)))

    return [(mean, "all_reduce's default operation is SUM, not the mean: DDP divides the summed gradients by the "
                   "world size itself."),
            (gathered, "Concatenating everyone's tensor is all_gather; all_reduce combines them elementwise, so the "
                       "shape stays the same."),
            (unchanged, "After all_reduce no rank keeps its own tensor: every rank holds the same combined result."),
            (scattered, "Giving each rank one slice of the sum is reduce_scatter; after all_reduce every rank holds "
                        "the whole sum.")]


function_exercise(
    "12.all_reduce",
    solution=after_all_reduce,
    cases=_all_reduce_cases,
    mistakes=_all_reduce_mistakes,
    otherwise="Every rank ends with the elementwise sum of all ranks' tensors: return one copy of it per rank.",
    success="every rank holds the elementwise sum, as dist.all_reduce leaves it.",
)

# --- 12.global_batch: the batch one optimizer step sees.


def global_batch(per_rank: int, world: int, accumulation: int = 1) -> int:
    """Return the samples one optimizer step averages over: per-rank batch x ranks x accumulation steps."""
    return per_rank * world * accumulation


def _global_mistakes() -> list[Mistake]:
    return [(lambda per_rank, world, accumulation=1: per_rank * world,
             "Gradient accumulation adds accumulation micro-batches to every step: multiply by it too."),
            (lambda per_rank, world, accumulation=1: per_rank * accumulation,
             "Every rank trains on its own per-rank batch and DDP averages them: multiply by the number of ranks."),
            (lambda per_rank, world, accumulation=1: per_rank,
             "The per-rank batch is only one rank's share of one micro-step; the step averages over all ranks and "
             "all accumulation steps."),
            (lambda per_rank, world, accumulation=1: per_rank * world // accumulation,
             "Accumulation makes the step's batch larger, not smaller: multiply by it.")]


function_exercise(
    "12.global_batch",
    solution=global_batch,
    cases=lambda: [case(16, 8, 4, gives=512),   # 16 x 8 x 4: tells every mistake apart
                   case(32, 2, 1, gives=64), case(7, 3, 2, gives=42), case(64, 1, 1, gives=64),
                   case(1, 4, 8, gives=32)],
    mistakes=_global_mistakes,
    otherwise="Multiply the per-rank batch by the number of ranks and by the accumulation steps.",
    success="that is the batch each optimizer step sees; the learning rate is tuned for it.",
)
