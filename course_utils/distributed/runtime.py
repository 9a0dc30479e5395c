"""What every training script of the package shares: joining the job, the model, the data, the result line.

A script calls ``init()`` (gloo, from the variables torchrun sets), builds ``make_model`` with the
same seed on every rank, takes its slice of each global batch from ``global_batch``, and ends with
``emit(result)`` (rank 0 prints one ``COURSE_RESULT {json}`` line) and ``finish()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: The prefix of the one line of output that carries a job's result (``launch.parse_result`` reads it).
RESULT_MARKER = "COURSE_RESULT "


def init(backend: str = "gloo") -> tuple[int, int]:
    """Return (rank, world size) after joining the process group torchrun described in the environment."""
    if "RANK" not in os.environ:
        raise RuntimeError("this script runs under torchrun: torchrun --nproc-per-node 2 -m "
                           "course_utils.distributed.<kind> (or launch.run_job from a notebook)")
    torch.set_num_threads(1)
    if dist.is_initialized():
        pass
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent hosts the store
        dist.init_process_group(backend, store=attempt_store(), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def attempt_store() -> dist.Store:
    """Return the launcher's key-value store, with keys of their own for this attempt of the job.

    After torchrun restarts a failed job, the store may still hold the addresses the dead workers
    published; prefixing every key with the restart count keeps the new workers from reading them.
    """
    from datetime import timedelta

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timedelta(seconds=120))
    return dist.PrefixStore(f"course/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def finish() -> None:
    """Leave the process group (every rank waits for the others first)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def emit(result: dict[str, Any]) -> None:
    """Print ``result`` as the job's result line, on rank 0 only (``launch.parse_result`` reads it)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(RESULT_MARKER + json.dumps(result), flush=True)


def log(message: str) -> None:
    """Print ``message`` prefixed with this process's rank."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    sys.stdout.write(f"[rank {rank}] {message}\n")  # one write per line: the ranks' lines do not interleave
    sys.stdout.flush()


class MLP(nn.Module):
    """A stack of ``depth`` Linear+GELU blocks of width ``width`` with a small head: the jobs' model."""

    def __init__(self, width: int = 256, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def make_model(width: int = 256, depth: int = 4, seed: int = 0) -> MLP:
    """Return the MLP initialised from ``seed`` (identical on every rank and in a single process)."""
    torch.manual_seed(seed)
    return MLP(width, depth)


#: How many different global batches the jobs cycle through (a small data set the model can learn).
N_BATCHES = 4


def global_batch(step: int, batch: int, width: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the (inputs, labels) of global batch number ``step``: a function of its arguments only.

    The data set is ``N_BATCHES`` batches long; step ``s`` takes batch ``s % N_BATCHES``.
    """
    gen = torch.Generator().manual_seed(seed * 100_003 + step % N_BATCHES)
    x = torch.randn(batch, width, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return x, y


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Return this rank's contiguous slice of the first dimension of ``t`` (it must divide evenly)."""
    if t.shape[0] % world:
        raise ValueError(f"a batch of {t.shape[0]} does not split evenly over {world} ranks")
    n = t.shape[0] // world
    return t[rank * n:(rank + 1) * n]


def parser(description: str) -> argparse.ArgumentParser:
    """Return an argument parser with the options every job shares (model size, steps, compile)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="global batch (all ranks together)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--backend", default="inductor", help="torch.compile backend, or 'none' for eager")
    return p


def maybe_compile(model: nn.Module, backend: str) -> nn.Module:
    """Return ``torch.compile(model, backend=backend)``, or ``model`` itself for backend 'none'."""
    return model if backend == "none" else torch.compile(model, backend=backend)


def train(model: nn.Module, steps: Sequence[int], batch: int, width: int, lr: float, rank: int,
          world: int) -> list[float]:
    """Return the global-batch losses of SGD steps ``steps`` (each rank trains on its slice)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in steps:
        x, y = global_batch(step, batch, width)
        loss = nn.functional.cross_entropy(model(shard(x, rank, world)), shard(y, rank, world))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # gloo has no AVG: sum, then divide
        losses.append(float(total) / world)
    return losses
