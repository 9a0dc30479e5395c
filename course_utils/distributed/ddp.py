"""A DDP job with ``torch.compile``: gradients against one process, graphs against buckets, a loss curve.

``torchrun --nproc-per-node 2 -m course_utils.distributed.ddp --caps 25,1``:

1. gradients: the compiled DDP model takes one step on the global batch split over the ranks;
   rank 0 also runs the plain model on the whole batch in one process; the result holds the
   largest difference between the two sets of gradients;
2. graphs: for each ``bucket_cap_mb`` in ``--caps``, the number of graphs the compiler received
   (DDP's graph splitting cuts the model's graph at bucket boundaries) and DDP's bucket count;
3. the loss curve of ``--steps`` SGD steps (compare it with the FSDP job's) and, with
   ``--trace PATH``, a profiler trace of one training step written by rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from . import runtime


def counting_backend(backend: str, graphs: list[int]) -> Callable[..., Any]:
    """Return a compile backend that appends each graph's node count to ``graphs`` and compiles it with ``backend``."""
    inner = lookup_backend(backend)

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        graphs.append(len(gm.graph.nodes))
        return inner(gm, example_inputs)

    return compile_graph


def count_buckets(model: DDP) -> list[int]:
    """Return a list that gains, at each backward pass, one entry per gradient bucket DDP all-reduces (its bytes).

    A communication hook (DDP's public ``register_comm_hook``) that counts, then all-reduces the
    bucket as DDP does by default (sum, divided by the world size).
    """
    seen: list[int] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations: leave them out
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(None, bucket)  # type: ignore[arg-type]

    model.register_comm_hook(None, hook)
    return seen


def grad_check(args: Any, rank: int, world: int) -> float:
    """Return the largest |gradient difference| between compiled DDP and one process on the global batch."""
    torch._dynamo.reset()
    model = DDP(runtime.make_model(args.width, args.depth))
    compiled = torch.compile(model, backend=args.backend) if args.backend != "none" else model
    x, y = runtime.global_batch(0, args.batch, args.width)
    nn.functional.cross_entropy(compiled(runtime.shard(x, rank, world)), runtime.shard(y, rank, world)).backward()
    reference = runtime.make_model(args.width, args.depth)  # the same start, one process, the whole batch
    nn.functional.cross_entropy(reference(x), y).backward()
    diff = max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.module.parameters(), reference.parameters(), strict=True))
    worst = torch.tensor(diff)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def graphs_for_cap(args: Any, cap_mb: float, rank: int, world: int) -> dict[str, Any]:
    """Return the graphs the compiler got and DDP's buckets for one ``bucket_cap_mb``."""
    torch._dynamo.reset()
    graphs: list[int] = []
    model = DDP(runtime.make_model(args.width, args.depth), bucket_cap_mb=cap_mb)
    buckets = count_buckets(model)
    compiled = torch.compile(model, backend=counting_backend(args.graph_backend, graphs))
    for step in range(2):  # DDP rebuilds its buckets after the first step: count the second step's
        buckets.clear()
        x, y = runtime.global_batch(step, args.batch, args.width)
        nn.functional.cross_entropy(compiled(runtime.shard(x, rank, world)), runtime.shard(y, rank, world)).backward()
    return {"bucket_cap_mb": cap_mb, "graphs": len(graphs), "graph_nodes": graphs, "buckets": len(buckets),
            "bucket_bytes": list(buckets)}


def trace_step(args: Any, rank: int, world: int) -> dict[str, Any]:
    """Return when the all-reduces of one eager DDP step ran, relative to its backward pass (a trace on disk too)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model = DDP(runtime.make_model(args.width, args.depth), bucket_cap_mb=args.trace_cap)
    x, y = runtime.global_batch(0, args.batch, args.width)
    for _ in range(2):  # warm up, and let DDP rebuild its buckets
        nn.functional.cross_entropy(model(runtime.shard(x, rank, world)), runtime.shard(y, rank, world)).backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = nn.functional.cross_entropy(model(runtime.shard(x, rank, world)), runtime.shard(y, rank, world))
        with record_function("backward"):
            loss.backward()
    if rank == 0 and args.trace:
        prof.export_chrome_trace(args.trace)
    events = prof.events()
    backward = [e for e in events if e.name == "backward"]
    comms = [e for e in events if "all_reduce" in e.name and e.name.startswith("gloo")] or \
        [e for e in events if "allreduce" in e.name.lower() or "all_reduce" in e.name]
    if not backward:
        return {"allreduce_calls": len(comms), "started_inside_backward": None}
    start, end = backward[0].time_range.start, backward[0].time_range.end
    inside = sum(1 for e in comms if start <= e.time_range.start < end)
    return {"allreduce_calls": len(comms), "started_inside_backward": inside,
            "comm_names": sorted({e.name for e in comms})}


def main(argv: list[str] | None = None) -> None:
    """Run the gradient check, the bucket sweep, the loss curve and the trace; emit their results."""
    p = runtime.parser("DDP with torch.compile")
    p.add_argument("--caps", default="25,1", help="bucket_cap_mb values to compare, comma-separated")
    p.add_argument("--graph-backend", default="aot_eager", help="backend the graph count compiles with")
    p.add_argument("--trace", default="", help="write rank 0's profiler trace of one step here")
    p.add_argument("--trace-cap", type=float, default=1.0)
    args = p.parse_args(argv)
    rank, world = runtime.init()
    result: dict[str, Any] = {"world": world, "backend": args.backend, "width": args.width, "depth": args.depth,
                              "param_bytes": sum(q.numel() * q.element_size()
                                                 for q in runtime.make_model(args.width, args.depth).parameters())}
    result["grad_max_abs_diff"] = grad_check(args, rank, world)
    runtime.log(f"largest gradient difference, DDP vs one process: {result['grad_max_abs_diff']:.2e}")
    result["caps"] = []
    for cap in (float(c) for c in args.caps.split(",")):
        row = graphs_for_cap(args, cap, rank, world)
        runtime.log(f"bucket_cap_mb={cap:g}: {row['graphs']} graph(s) compiled, {row['buckets']} DDP bucket(s)")
        result["caps"].append(row)
    torch._dynamo.reset()
    model = DDP(runtime.make_model(args.width, args.depth))
    compiled = runtime.maybe_compile(model, args.backend)
    result["losses"] = runtime.train(compiled, range(args.steps), args.batch, args.width, args.lr, rank, world)
    runtime.log(f"losses: {[round(v, 4) for v in result['losses']]}")
    result["trace"] = trace_step(args, rank, world)
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()
