"""A DTensor job: a device mesh, ``Shard`` and ``Replicate``, ``redistribute``, and a sharded matmul's traffic.

``torchrun --nproc-per-node 2 -m course_utils.distributed.dtensor``: a (rows x cols) matrix is
distributed over a 1-D mesh of the ranks in several placements; the result holds each rank's
local shape per placement, the collectives each ``redistribute`` ran, and for ``A @ B`` with A
split by columns and B by rows (and A by rows, B replicated): the output's placement, the
collectives counted by ``CommDebugMode`` in the product and when the result is made whole, and its
error against the plain product.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from . import runtime


def comms(mode: CommDebugMode) -> dict[str, int]:
    """Return {collective name: count} that ``mode`` recorded."""
    return {str(op).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items() if n}


def main(argv: list[str] | None = None) -> None:
    """Distribute, redistribute and multiply DTensors; emit shapes, placements and collectives."""
    p = runtime.parser("DTensor on a 1-D mesh")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--cols", type=int, default=6)
    args = p.parse_args(argv)
    rank, world = runtime.init()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)  # the same full matrices on every rank
    a = torch.randn(args.rows, args.cols)
    b = torch.randn(args.cols, args.rows)
    result: dict[str, Any] = {"world": world, "mesh": str(mesh), "rows": args.rows, "cols": args.cols, "local": {}}
    for name, placement in (("Shard(0)", Shard(0)), ("Shard(1)", Shard(1)), ("Replicate()", Replicate())):
        d = distribute_tensor(a, mesh, [placement])
        result["local"][name] = list(d.to_local().shape)
    rows = distribute_tensor(a, mesh, [Shard(0)])
    moves = {}
    for name, target in (("Shard(0)->Replicate()", Replicate()), ("Shard(0)->Shard(1)", Shard(1))):
        with CommDebugMode() as mode:
            moved = rows.redistribute(mesh, [target])
            full = moved.full_tensor() if target == Replicate() else None
        moves[name] = {"comms": comms(mode), "local_shape": list(moved.to_local().shape),
                       "exact": bool(torch.equal(full, a)) if full is not None else None}
    result["redistribute"] = moves
    a_cols = distribute_tensor(a, mesh, [Shard(1)])   # A split by columns ...
    b_rows = distribute_tensor(b, mesh, [Shard(0)])   # ... B by rows: each rank multiplies its pair
    with CommDebugMode() as mode:
        c = a_cols @ b_rows
    with CommDebugMode() as to_full:
        whole = c.redistribute(mesh, [Replicate()])
    result["matmul"] = {"out_placement": str(c.placements[0]), "comms_in_matmul": comms(mode),
                        "comms_to_replicate": comms(to_full),
                        "max_abs_err": float((whole.to_local() - a @ b).abs().max())}
    a_rows = distribute_tensor(a, mesh, [Shard(0)])   # A split by rows, B whole on every rank
    b_full = distribute_tensor(b, mesh, [Replicate()])
    with CommDebugMode() as by_rows:
        c_rows = a_rows @ b_full
    result["matmul_rows"] = {"out_placement": str(c_rows.placements[0]), "comms_in_matmul": comms(by_rows),
                             "local_shape": list(c_rows.to_local().shape),
                             "max_abs_err": float((c_rows.full_tensor() - a @ b).abs().max())}
    runtime.log(f"A(Shard(1)) @ B(Shard(0)) -> {c.placements[0]}; to Replicate: {comms(to_full)}")
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()
