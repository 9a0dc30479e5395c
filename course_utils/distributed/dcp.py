"""A distributed-checkpoint job: two ranks save a sharded model, then load it back into two ranks.

``torchrun --nproc-per-node 2 -m course_utils.distributed.dcp --dir build/nb12/ckpt``: an FSDP2
model trains ``--steps`` steps and is saved with ``torch.distributed.checkpoint`` (each rank writes
its own shards, plus one metadata file); rank 0 also writes the full state dict to
``reference.pt``. A second, differently initialised model is sharded, loaded from the checkpoint
and compared with the reference. ``load_into_one_process`` reads the same checkpoint without
any process group.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from . import runtime
from .fsdp import shard_model


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return the whole (unsharded) state dict of a sharded model on every rank."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Return the largest |a - b| over two state dicts with the same keys and shapes; KeyError if keys differ."""
    if set(a) != set(b):
        raise KeyError(f"the state dicts differ in keys: {sorted(set(a) ^ set(b))}")
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def load_into_one_process(directory: str | Path, width: int, depth: int) -> dict[str, torch.Tensor]:
    """Return the state dict of a plain (unsharded) MLP loaded from the checkpoint in ``directory``, no process group."""
    model = runtime.make_model(width, depth, seed=123)
    state = model.state_dict()
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process")
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    model.load_state_dict(state)
    return model.state_dict()


def main(argv: list[str] | None = None) -> None:
    """Train, save from every rank, reload into a fresh sharded model, and emit the difference."""
    p = runtime.parser("distributed checkpoint: save and reload")
    p.add_argument("--dir", required=True, help="checkpoint folder (created)")
    args = p.parse_args(argv)
    rank, world = runtime.init()
    folder = Path(args.dir)
    model = shard_model(runtime.make_model(args.width, args.depth))
    runtime.train(model, range(args.steps), args.batch, args.width, args.lr, rank, world)
    reference = full_state(model)
    dcp.save(get_model_state_dict(model), checkpoint_id=str(folder))
    if rank == 0:
        torch.save(reference, folder / "reference.pt")
    dist.barrier()
    files = sorted(f.name for f in folder.iterdir())
    fresh = shard_model(runtime.make_model(args.width, args.depth, seed=99))
    before = max_abs_diff(full_state(fresh), reference)
    state = get_model_state_dict(fresh)
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(fresh, state)
    after = max_abs_diff(full_state(fresh), reference)
    worst = torch.tensor(after)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    runtime.log(f"wrote {files}; a fresh model differed by {before:.3f}, after loading by {after:.1e}")
    result: dict[str, Any] = {"world": world, "files": files, "diff_before_load": before,
                              "reload_max_abs_diff_two_ranks": float(worst)}
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()
