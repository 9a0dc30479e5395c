# %% [markdown]
# # 12 · Distributed training with torch.compile: DDP, FSDP2 and DTensor on real processes
#
# When a model or its training data outgrows one device, PyTorch trains it on many processes at
# once: each process (a *rank*) holds a copy or a shard of the model, and they exchange gradients or
# parameters through *collectives*. `torch.compile` works with both of PyTorch's data-parallel
# methods, `DistributedDataParallel` (DDP) and fully sharded data parallel (FSDP2), and with
# DTensor, the sharded tensor they are increasingly built on. Everything in this notebook runs for
# real on your laptop: two processes started by `torchrun`, talking over the gloo backend on
# 127.0.0.1. Every job's program is written by a cell of this notebook (`%%writefile`, into
# `build/nb12/`), so what you read is what runs: change a line, run its cell again, and the next
# launch runs your version. The same files run on a cluster of CPU machines (section 8 says what a
# GPU cluster needs besides).

# %% [markdown]
# ## What you will learn
#
# - what ranks, the world size, process groups and the three collectives (all-reduce, all-gather,
#   reduce-scatter) do, checked value by value on two processes; what NCCL changes on GPUs; who can
#   reach a torchrun job, and how to keep it on this machine;
# - DDP with `torch.compile`: gradients equal to one-process training on the same global batch, how
#   DDP's gradient buckets split the compiled graph (graphs counted against buckets, `bucket_cap_mb`
#   moved), and where the all-reduces start in a profiler trace;
# - FSDP2 (`fully_shard`) with `torch.compile`: the parameter bytes each rank holds, parameters that
#   are DTensors, and the same loss curve as DDP;
# - DTensor: a device mesh, `Shard` and `Replicate`, `redistribute`, and what a sharded matrix
#   multiply communicates;
# - activation checkpointing with `torch.compile`: memory against time, with the profiler's memory view;
# - distributed checkpoints (`torch.distributed.checkpoint`): saved by two ranks, loaded into one
#   process and into two, exactly;
# - faults: `torchrun --max-restarts`, a rank killed mid-training, and a restart from the last
#   checkpoint that ends with the same weights;
# - scaling out: the `torchrun` command for several machines, and what two processes on a laptop can
#   and cannot tell you about speed.
#
# **Prerequisites:** notebook 01 (`torch.compile`) and notebook 09 (the profiler). Knowing what a
# training step does (forward, backward, optimizer step) is enough for the rest.
#
# **Time on a laptop CPU:** <!-- stamp:time -->1.2 min the first time (every cache empty), 1.1 min after that (compile cache warm), 0.9 min in quick mode; measured by `make stamp` on the reference machine (2 cores, x86-avx512-vnni, torch 2.14.1, 2026-11-30). A slower or busy laptop takes longer.<!-- /stamp:time --> Each job starts two fresh Python processes (a few seconds each); quick mode uses a smaller model and fewer steps.
# **GPU:** not needed. One guarded cell runs the collectives on NCCL, one process per GPU.

# %%
import json
import os
import warnings

os.environ.setdefault("KINETO_LOG_LEVEL", "6")   # keep the profiler's start/stop lines out of the output

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

from course_utils import bench, config, cpu, exercises, session
from course_utils.device import requires_cuda
from course_utils.distributed import launch

print(session.start(seed=0))
BUILD = config.build_dir() / "nb12"
BUILD.mkdir(parents=True, exist_ok=True)
JOBS = os.path.relpath(BUILD)   # the job scripts' folder: the %%writefile cells below write into it

# Sizes: a smaller model and fewer steps in quick mode (COURSE_QUICK=1).
WIDTH, DEPTH = config.pick((384, 6), (512, 8))
STEPS = config.pick(4, 12)
MODEL = ["--width", WIDTH, "--depth", DEPTH]


def echo(line: str) -> None:
    """Print a job's output line, leaving out the frames of the tracebacks torchrun repeats per rank."""
    if line.startswith(("[rank0]:  ", "[rank1]:  ", "  File ", "    ")) or launch.RESULT_MARKER in line:
        return  # traceback frames, and the JSON result line that run_job returns parsed
    if "Profiler record function" in line:
        return  # Dynamo noting that it skips DDP's profiler labels inside the compiled forward
    print(line)


# %% [markdown]
# ## 1 · Processes, ranks and collectives
#
# A distributed job is a group of processes that run the same script. `torchrun` starts them and
# tells each one, through environment variables, its *rank* (0, 1, ...), the *world size* (how many
# there are) and where to meet (an address and port on which the launcher hosts a small
# key-value store). `dist.init_process_group("gloo")` reads those variables and connects every rank
# to every other: that group is the *process group*. gloo is PyTorch's CPU backend; NCCL is the one
# for NVIDIA GPUs.
#
# Communication happens in *collectives*, calls that every rank makes together:
#
# - **all-reduce**: every rank contributes a tensor and every rank receives their elementwise sum;
# - **all-gather**: every rank receives everyone's tensor, concatenated;
# - **reduce-scatter**: the sum is computed, and rank r receives only its r-th slice of it.
#
# DDP is built on all-reduce; FSDP on all-gather (parameters, before they are used) and
# reduce-scatter (gradients, after the backward pass). The next cell writes the job: a script that
# gives rank r the tensor `[r·n+1, ..., r·n+n]` and runs all three. From the course it imports only
# `runtime`: `init()` joins the process group, `log(...)` prints a line tagged with the rank, and
# `emit(result)` has rank 0 write its result as one line of JSON (each in a single write, so the
# ranks' lines never cut into each other). The cell after it launches the file: `launch.run_job` builds the
# `torchrun` command, streams the output here, stops every process when it ends (also after an
# error, the timeout or an interrupt) and returns the JSON result.

# %%
# %%writefile {JOBS}/collectives.py
"""All-reduce, all-gather and reduce-scatter on every rank; rank 0 reports what each rank got."""
import argparse
import os
import time

import torch
import torch.distributed as dist

from course_utils.distributed import runtime

p = argparse.ArgumentParser(description="collectives")
p.add_argument("--per-rank", type=int, default=4, help="elements per rank (a multiple of the world size)")
p.add_argument("--dist-backend", default="gloo", choices=["gloo", "nccl"], help="nccl: one GPU per rank")
p.add_argument("--hold", type=float, default=0.0, help="seconds to stay up at the end (to look at the job)")
args = p.parse_args()

rank, world = runtime.init(args.dist_backend)      # join the group torchrun described in the environment
device = torch.device("cpu")
if args.dist_backend == "nccl":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
n = args.per_rank
mine = (torch.arange(1, n + 1, dtype=torch.float32) + rank * n).to(device)   # rank r: [r*n+1, ..., r*n+n]
runtime.log(f"starts with {mine.cpu().tolist()} (backend {dist.get_backend()}, world size {world})")

reduced = mine.clone()
dist.all_reduce(reduced, op=dist.ReduceOp.SUM)     # every rank: the elementwise sum

gathered = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(gathered, mine)                    # every rank: everyone's tensor

scattered = torch.empty(n // world, device=device)  # rank r: slice r of the sum
if dist.get_backend() == "gloo":
    dist.reduce_scatter(scattered, list(mine.chunk(world)))   # gloo has the list form only
else:
    dist.reduce_scatter_tensor(scattered, mine)

per_rank = {}
for name, t in {"input": mine, "all_reduce": reduced, "all_gather": torch.cat(gathered),
                "reduce_scatter": scattered}.items():
    everyone = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(everyone, t)                   # every rank's answer, for the report
    per_rank[name] = [x.cpu().tolist() for x in everyone]
runtime.emit({"world": world, "backend": dist.get_backend(), "n": n, "per_rank": per_rank})
time.sleep(args.hold)
runtime.finish()

# %%
print("the kind of command the launcher runs (it picks a fresh port and rendezvous id each time):")
print(" ".join(launch.torchrun_command(f"{JOBS}/collectives.py", ["--per-rank", 4], port=29500, python="python")))
coll = launch.run_job(f"{JOBS}/collectives.py", ["--per-rank", 4], timeout_s=120, echo=echo)
per_rank = coll.result["per_rank"]
for name, values in per_rank.items():
    print(f"{name:>15}: " + "   ".join(f"rank {r}: {v}" for r, v in enumerate(values)))
print(f"job took {coll.seconds:.1f} s, starting torchrun and two Python processes included")

assert per_rank["all_reduce"] == [[6.0, 8.0, 10.0, 12.0]] * 2
assert per_rank["all_gather"] == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]] * 2
assert per_rank["reduce_scatter"] == [[6.0, 8.0], [10.0, 12.0]]

# %% [markdown]
# Each collective ran on both ranks and left exactly what its definition says. The same script runs
# on NCCL with one GPU per rank: collectives then move GPU memory directly (NVLink, PCIe or
# InfiniBand), run asynchronously on CUDA streams, and are what `torch.compile` can overlap with
# GPU kernels. NCCL needs one GPU per rank; on a machine with one GPU the cell runs a single rank.

# %%
if requires_cuda("the collectives on NCCL, one process per GPU"):
    n_gpu = torch.cuda.device_count()
    nccl = launch.run_job(f"{JOBS}/collectives.py", ["--per-rank", 4, "--dist-backend", "nccl"], nproc=min(n_gpu, 2),
                          timeout_s=180, echo=echo)
    world = nccl.result["world"]
    expected = [sum(r * 4 + i + 1 for r in range(world)) for i in range(4)]
    assert nccl.result["backend"] == "nccl" and nccl.result["per_rank"]["all_reduce"][0] == expected
    print(f"NCCL all-reduce over {world} GPU(s): {nccl.result['per_rank']['all_reduce'][0]}")

# %% [markdown]
# Who can reach this job? torchrun's ranks meet at a key-value store that has no password.
# Plain `torchrun` lets that store listen on every network interface of the machine (`*`), even
# when told to meet on 127.0.0.1, because torch's store server never binds to the address it is
# given. The course's launcher, `python -m course_utils.distributed.loopback`, is torchrun with one
# change: each store it hosts listens on a socket already bound to 127.0.0.1. It also points gloo at
# the loopback interface and gives every job a free port and a rendezvous id of its own, so two
# learners on one machine never join each other's job by accident (its docstring lists what listens
# where). Loopback keeps other machines out, not other processes on this one: the store still has no
# password, so on a machine shared by several users only a network namespace of one's own keeps
# them out.
# The next cell runs the job again, holding it open for a moment, and lists every socket its
# processes listen on.

# %%
import ipaddress

seen = []


def look(line: str) -> None:
    """When the ranks have reported, note every socket the job's processes listen on."""
    if line.startswith("[rank") and not seen:
        seen.extend(launch.listening_sockets())   # every process this notebook started: torchrun and its ranks


launch.run_job(f"{JOBS}/collectives.py", ["--per-rank", 4, "--hold", 2], timeout_s=120, echo=look)
for pid, address, port in seen:
    print(f"process {pid} listens on {address}:{port}")
print(f"{len(seen)} listening sockets in {len({pid for pid, _, _ in seen})} processes")
assert seen and all(ipaddress.ip_address(address).is_loopback for _, address, _ in seen)

# %% [markdown]
# ## 2 · DDP with torch.compile
#
# `DistributedDataParallel` keeps a full copy of the model on every rank. Each rank runs forward and
# backward on its own slice of the global batch; during the backward pass DDP all-reduces the
# gradients (and divides by the world size), so every rank ends with the gradient of the *whole*
# batch and takes the same optimizer step. To overlap communication with computation, DDP groups
# parameters into *buckets* and all-reduces a bucket as soon as all its gradients are ready, while
# the backward pass continues. Left at its default, `bucket_cap_mb` is 25 MiB with a smaller first
# bucket of 1 MiB; passing any value, even 25, sets every bucket to that cap.
#
# A single compiled graph would produce all gradients at its very end, too late to overlap. So when
# `torch.compile` sees a DDP model, Dynamo's *DDP optimizer* cuts the graph at bucket boundaries and
# compiles each piece separately. The training jobs share a model, a data set and a training loop,
# written once into `common.py` (each job script imports it: torchrun puts the script's folder on
# the import path). The DDP job, `ddp.py`, measures three things:
#
# 1. the gradients of one compiled DDP step on 2 ranks against the plain model on the whole batch in
#    one process;
# 2. with `bucket_cap_mb` left at its default and set to 1: the number of graphs the compiler received
#    (a backend that counts them) and the number of buckets DDP all-reduced (a communication hook that
#    counts them);
# 3. a short loss curve, and a profiler trace of one step (written to `build/nb12/`).

# %%
# %%writefile {JOBS}/common.py
"""What the training jobs share: the model, the data, each rank's slice of a batch, the training loop."""
import argparse

import torch
import torch.distributed as dist
from torch import nn


class MLP(nn.Module):
    """`depth` residual Linear+GELU blocks of width `width`, then a 10-class head."""

    def __init__(self, width=256, depth=4, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):                  # x: (batch, width)
        for block in self.blocks:
            x = x + block(x)               # (batch, width)
        return self.head(x)                # (batch, classes)


def make_model(width, depth, seed=0):
    torch.manual_seed(seed)                # the same start on every rank, and in a single process
    return MLP(width, depth)


N_BATCHES = 4                              # the data set: four global batches, taken in turn


def global_batch(step, batch, width):
    """(inputs, labels) of global batch number `step`: a function of the arguments only, so every rank agrees."""
    gen = torch.Generator().manual_seed(100_003 + step % N_BATCHES)
    return torch.randn(batch, width, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


def shard(t, rank, world):
    """This rank's contiguous slice of the batch dimension of `t`."""
    n = t.shape[0] // world
    if n * world != t.shape[0]:
        raise ValueError(f"a batch of {t.shape[0]} does not split evenly over {world} ranks")
    return t[rank * n:(rank + 1) * n]


def train(model, steps, batch, width, lr, rank, world):
    """SGD on this rank's slice of each global batch; returns the whole batch's loss at each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in steps:
        x, y = global_batch(step, batch, width)
        loss = nn.functional.cross_entropy(model(shard(x, rank, world)), shard(y, rank, world))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)             # gloo has no AVG: sum, then divide
        losses.append(float(total) / world)
    return losses


def parser(description):
    """The options every training job takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="global batch (all ranks together)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--backend", default="inductor", help="torch.compile backend, or 'none' for eager")
    return p


def maybe_compile(model, backend):
    return model if backend == "none" else torch.compile(model, backend=backend)


# %%
# %%writefile {JOBS}/ddp.py
"""DDP with torch.compile: gradients against one process, graphs against buckets, a loss curve, a trace.

1. gradients: the compiled DDP model takes one step on the global batch split over the ranks; rank 0's
   plain model takes it on the whole batch in one process; the result is their largest difference;
2. graphs: for each bucket_cap_mb in --caps, the graphs the compiler received and DDP's buckets;
3. the loss curve of --steps SGD steps, and (--trace PATH) rank 0's profiler trace of one step.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from common import global_batch, make_model, maybe_compile, parser, shard, train
from course_utils.distributed import runtime


def step_loss(model, step, args, rank, world):
    x, y = global_batch(step, args.batch, args.width)
    return nn.functional.cross_entropy(model(shard(x, rank, world)), shard(y, rank, world))


def counting_backend(backend, graphs):
    """A compile backend that notes each graph's node count, then compiles it with `backend`."""
    inner = lookup_backend(backend)

    def compile_graph(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return inner(gm, example_inputs)

    return compile_graph


def count_buckets(model):
    """A list that gains one entry (its bytes) per gradient bucket DDP all-reduces."""
    seen = []

    def hook(state, bucket):               # DDP's public communication hook: count, then all-reduce as usual
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(None, bucket)

    model.register_comm_hook(None, hook)
    return seen


def grad_check(args, rank, world):
    """Largest |gradient difference|, compiled DDP on the ranks against one process on the whole batch."""
    torch._dynamo.reset()
    model = DDP(make_model(args.width, args.depth))
    step_loss(maybe_compile(model, args.backend), 0, args, rank, world).backward()
    reference = make_model(args.width, args.depth)     # the same start, one process, the whole batch
    x, y = global_batch(0, args.batch, args.width)
    nn.functional.cross_entropy(reference(x), y).backward()
    diff = max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.module.parameters(), reference.parameters(), strict=True))
    worst = torch.tensor(diff)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def graphs_for_cap(args, cap_mb, rank, world):
    """The graphs the compiler got and DDP's buckets, for one bucket_cap_mb (None: left at DDP's default)."""
    torch._dynamo.reset()
    graphs = []
    caps = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    model = DDP(make_model(args.width, args.depth), **caps)
    buckets = count_buckets(model)
    compiled = torch.compile(model, backend=counting_backend(args.graph_backend, graphs))
    for step in range(2):                  # DDP rebuilds its buckets after the first step: count the second's
        buckets.clear()
        step_loss(compiled, step, args, rank, world).backward()
    return {"bucket_cap_mb": "default" if cap_mb is None else cap_mb, "graphs": len(graphs), "graph_nodes": graphs,
            "buckets": len(buckets),
            "bucket_bytes": list(buckets)}


def trace_step(args, rank, world):
    """When the all-reduces of one eager DDP step started, relative to its backward pass."""
    model = DDP(make_model(args.width, args.depth), bucket_cap_mb=args.trace_cap)
    for _ in range(2):                     # warm up, and let DDP rebuild its buckets
        step_loss(model, 0, args, rank, world).backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = step_loss(model, 0, args, rank, world)
        with record_function("backward"):
            loss.backward()
    if rank == 0 and args.trace:
        prof.export_chrome_trace(args.trace)
    events = prof.events()
    backward = [e for e in events if e.name == "backward"][0].time_range
    comms = [e for e in events if e.name.startswith("gloo") and "all_reduce" in e.name]
    inside = sum(1 for e in comms if backward.start <= e.time_range.start < backward.end)
    # overlap: an all-reduce that starts before the last gradient is computed runs beside the backward pass
    grads = [e for e in events if e.name.startswith("autograd::engine::evaluate_function")
             and backward.start <= e.time_range.start < backward.end]
    last_grad = max(e.time_range.end for e in grads)
    return {"allreduce_calls": len(comms), "started_inside_backward": inside,
            "started_before_last_gradient": sum(1 for e in comms if e.time_range.start < last_grad),
            "comm_names": sorted({e.name for e in comms})}


def main():
    p = parser("DDP with torch.compile")
    p.add_argument("--caps", default="default,1", help="bucket_cap_mb values to compare, comma-separated "
                   "('default': left unset)")
    p.add_argument("--graph-backend", default="aot_eager", help="the backend the graph count compiles with")
    p.add_argument("--trace", default="", help="write rank 0's profiler trace of one step here")
    p.add_argument("--trace-cap", type=float, default=1.0)
    args = p.parse_args()
    rank, world = runtime.init()
    result = {"world": world, "backend": args.backend, "width": args.width, "depth": args.depth,
              "param_bytes": sum(q.numel() * q.element_size() for q in make_model(args.width, args.depth).parameters())}
    result["grad_max_abs_diff"] = grad_check(args, rank, world)
    runtime.log(f"largest gradient difference, DDP vs one process: {result['grad_max_abs_diff']:.2e}")
    result["caps"] = []
    for cap in (None if c == "default" else float(c) for c in args.caps.split(",")):
        row = graphs_for_cap(args, cap, rank, world)
        runtime.log(f"bucket_cap_mb={row['bucket_cap_mb']}: {row['graphs']} graph(s) compiled, {row['buckets']} DDP bucket(s)")
        result["caps"].append(row)
    torch._dynamo.reset()
    model = maybe_compile(DDP(make_model(args.width, args.depth)), args.backend)
    result["losses"] = train(model, range(args.steps), args.batch, args.width, args.lr, rank, world)
    runtime.log(f"losses: {[round(v, 4) for v in result['losses']]}")
    result["trace"] = trace_step(args, rank, world)
    runtime.emit(result)
    runtime.finish()


if __name__ == "__main__":
    main()

# %%
ddp = launch.run_job(f"{JOBS}/ddp.py", [*MODEL, "--caps", "default,1", "--steps", STEPS,
                                        "--trace", BUILD / "ddp_step_trace.json"], timeout_s=420, echo=echo)
res = ddp.result
print(f"\nmodel: {res['param_bytes'] / 2**20:.2f} MiB of parameters in {DEPTH} blocks")
print(f"largest gradient difference, compiled DDP on 2 ranks vs one process: {res['grad_max_abs_diff']:.2e}")
for row in res["caps"]:
    sizes = ", ".join(f"{b / 2**20:.2f} MiB" if b >= 2**17 else f"{b / 2**10:.1f} KiB" for b in row["bucket_bytes"])
    print(f"bucket_cap_mb={row['bucket_cap_mb']!s:>7}: {row['graphs']} compiled graph(s), {row['buckets']} DDP bucket(s) "
          f"of {sizes}")

assert res["grad_max_abs_diff"] <= 1e-5
big, small = res["caps"]
assert small["buckets"] > big["buckets"] and small["graphs"] > big["graphs"]
bench.record("dist.ddp.grad_max_abs_diff", res["grad_max_abs_diff"], "abs", world=res["world"], width=WIDTH, depth=DEPTH)
bench.record("dist.ddp.compiled_graphs", small["graphs"], "graphs", buckets=small["buckets"],
             bucket_cap_mb=small["bucket_cap_mb"], graphs_at_default_cap=big["graphs"], buckets_at_default_cap=big["buckets"]);

# %% [markdown]
# The gradients agree to float32 rounding: splitting a batch over ranks and averaging their
# gradients is the same mathematics as one process on the whole batch, only summed in another order.
# A smaller `bucket_cap_mb` gives more buckets, and Dynamo follows with more graphs: its DDP
# optimizer cuts the graph by the same cap, in the order of the graph's parameters, while DDP builds
# its final buckets from the order gradients arrived in the first step, so the two counts are close
# rather than always equal (the cell prints both). More, smaller buckets start
# communication earlier but pay a per-call overhead and give Inductor smaller graphs to fuse: the
# default is a compromise tuned on GPUs.
#
# Where did the all-reduces start? The trace of one step (open `build/nb12/ddp_step_trace.json` in
# Perfetto) shows when each `gloo:all_reduce` was launched (this step runs DDP without compile, with
# `bucket_cap_mb=1`, so its buckets need not match the compiled run's). Every all-reduce is launched
# from inside the backward pass, by a gradient hook; the question that matters is how many start
# before the *last* gradient is computed, since only those can run beside the computation:

# %%
trace = res["trace"]
print(f"{trace['allreduce_calls']} all-reduce call(s) in one step, all launched inside the backward pass: "
      f"{trace['started_inside_backward'] == trace['allreduce_calls']}; {trace['started_before_last_gradient']} of them "
      f"started before the last gradient was computed ({', '.join(trace['comm_names'])})")
assert trace["allreduce_calls"] >= 1 and trace["started_inside_backward"] == trace["allreduce_calls"]


# %% [markdown]
# On a GPU that overlap is the point: the network works while the GPU computes the remaining
# gradients. On two CPU processes sharing two cores the all-reduce is a memory copy through loopback
# that competes with the computation for the same cores, so the trace shows *where* communication
# starts, not a speed-up.
#
# ## 3 · FSDP2: every rank holds a shard
#
# DDP keeps a full copy of the parameters, gradients and optimizer state on every rank. Fully sharded
# data parallel keeps only 1/world of each: before a layer runs, its parameters are all-gathered;
# after the backward pass its gradients are reduce-scattered, so each rank updates only its shard.
# FSDP2's `fully_shard(module)` (in `torch.distributed.fsdp` since torch 2.6) turns each parameter
# into a DTensor sharded on its first dimension. The job `fsdp.py` applies it to every block and then to the
# whole model, compiles the result, and trains on the same data with the same learning rate as the
# DDP job above.

# %%
# %%writefile {JOBS}/fsdp.py
"""FSDP2 (fully_shard) with torch.compile: the bytes each rank holds, DTensor parameters, a loss curve."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from common import make_model, maybe_compile, parser, train
from course_utils.distributed import runtime


def shard_model(model):
    """Shard each block, then the whole model (what is left: the head), over all ranks' CPUs.

    The mesh names the device: without one, fully_shard picks the machine's accelerator if it has one."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def local_bytes(model):
    """The parameter bytes this rank stores: the local shard of each DTensor."""
    return sum(local(p).numel() * p.element_size() for p in model.parameters())


def local(p):
    return p.to_local() if isinstance(p, DTensor) else p


def main():
    args = parser("FSDP2 with torch.compile").parse_args()
    rank, world = runtime.init()
    full_bytes = sum(p.numel() * p.element_size() for p in make_model(args.width, args.depth).parameters())
    model = shard_model(make_model(args.width, args.depth))
    mine = local_bytes(model)
    everyone = [torch.zeros((), dtype=torch.int64) for _ in range(world)]
    dist.all_gather(everyone, torch.tensor(mine))
    params = {name: {"type": type(p).__name__, "placements": str(getattr(p, "placements", "")),
                     "global_shape": list(p.shape), "local_shape": list(local(p).shape)}
              for name, p in model.named_parameters()}
    runtime.log(f"holds {mine:,} of the model's {full_bytes:,} parameter bytes ({mine / full_bytes:.3f})")
    losses = train(maybe_compile(model, args.backend), range(args.steps), args.batch, args.width, args.lr,
                   rank, world)
    runtime.log(f"losses: {[round(v, 4) for v in losses]}")
    runtime.emit({"world": world, "backend": args.backend, "full_bytes": full_bytes,
                  "bytes_per_rank": [int(b) for b in everyone],
                  "param_bytes_per_rank_ratio": max(int(b) for b in everyone) / full_bytes,
                  "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
                  "params": params, "losses": losses})
    runtime.finish()


if __name__ == "__main__":
    main()

# %%
fsdp = launch.run_job(f"{JOBS}/fsdp.py", [*MODEL, "--steps", STEPS], timeout_s=420, echo=echo)
fr = fsdp.result
ratio = fr["param_bytes_per_rank_ratio"]
print(f"\nparameter bytes per rank: {fr['bytes_per_rank']} of {fr['full_bytes']} -> {ratio:.3f} of the model each")
for name in ("blocks.0.0.weight", "head.bias"):
    p = fr["params"][name]
    print(f"{name:>18}: {p['type']} {p['placements']}, global shape {p['global_shape']}, this rank's {p['local_shape']}")

assert fr["all_dtensor"] and ratio <= 0.55 and sum(fr["bytes_per_rank"]) == fr["full_bytes"]
bench.record("dist.fsdp.param_bytes_per_rank_ratio", ratio, "ratio", world=fr["world"], width=WIDTH, depth=DEPTH);

# %% [markdown]
# Each rank holds half of the parameter bytes: every weight matrix is split by rows, and the
# 10-row head splits into 5 and 5. Is FSDP training the same as DDP training? Both see the same
# global batches and average the same gradients, so their loss curves must agree up to float32
# rounding. The tolerance is stated, not hidden: 1e-4, against losses that run from about 1 to 6 in
# these curves (printed above).

# %%
LOSS_TOL = 1e-4
gap = max(abs(a - b) for a, b in zip(res["losses"], fr["losses"], strict=True))
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(res["losses"], "o-", label="DDP + compile")
ax.plot(fr["losses"], "x--", label="FSDP2 + compile")
ax.set_xlabel("step"); ax.set_ylabel("loss (global batch)"); ax.legend(); ax.set_title("same data, same start")
plt.show()
print(f"largest loss difference between DDP and FSDP2 over {len(fr['losses'])} steps: {gap:.1e} (tolerance {LOSS_TOL})")
assert gap <= LOSS_TOL

# %% [markdown]
# The memory saved grows with the world size: at 8 ranks each holds an eighth, which is what lets a
# model whose parameters, gradients and optimizer state do not fit on one GPU train at all. The
# price is communication: every forward and backward pass all-gathers each layer's parameters.
#
# ## 4 · DTensor: placements and what they cost
#
# A DTensor is a tensor spread over a *device mesh* (here a 1-D mesh of the two ranks) with a
# *placement* per mesh dimension: `Shard(d)` (split along dimension d, like `torch.chunk`),
# `Replicate()` (a full copy on every rank) or `Partial()` (every rank holds a summand; the real
# value is their sum). `redistribute` changes the placement and runs the collective that needs.
# `CommDebugMode` counts the collectives inside a block. The job distributes an 8x6 matrix `A`
# several ways, and multiplies `A` split by columns with `B` split by rows.

# %%
# %%writefile {JOBS}/dtensor.py
"""DTensor on a 1-D mesh: placements, redistribute, and what two sharded matmuls communicate."""
import argparse

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from course_utils.distributed import runtime


def comms(mode):
    """{collective: count} that a CommDebugMode block recorded."""
    return {str(op).split(".")[-1]: int(n) for op, n in mode.get_comm_counts().items() if n}


p = argparse.ArgumentParser(description="DTensor on a 1-D mesh")
p.add_argument("--rows", type=int, default=8)
p.add_argument("--cols", type=int, default=6)
args = p.parse_args()
rank, world = runtime.init()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
torch.manual_seed(0)                               # the same full matrices on every rank
a = torch.randn(args.rows, args.cols)
b = torch.randn(args.cols, args.rows)
result = {"world": world, "mesh": str(mesh), "local": {}, "redistribute": {}}

for name, placement in (("Shard(0)", Shard(0)), ("Shard(1)", Shard(1)), ("Replicate()", Replicate())):
    result["local"][name] = list(distribute_tensor(a, mesh, [placement]).to_local().shape)

rows = distribute_tensor(a, mesh, [Shard(0)])
for name, target in (("Shard(0)->Replicate()", Replicate()), ("Shard(0)->Shard(1)", Shard(1))):
    with CommDebugMode() as mode:
        moved = rows.redistribute(mesh, [target])
    result["redistribute"][name] = {"comms": comms(mode), "local_shape": list(moved.to_local().shape),
                                    "exact": bool(torch.equal(moved.full_tensor(), a))}

a_cols = distribute_tensor(a, mesh, [Shard(1)])    # A split by columns ...
b_rows = distribute_tensor(b, mesh, [Shard(0)])    # ... B by rows: each rank multiplies its pair
with CommDebugMode() as mode:
    c = a_cols @ b_rows
with CommDebugMode() as to_full:
    whole = c.redistribute(mesh, [Replicate()])
result["matmul"] = {"out_placement": str(c.placements[0]), "comms_in_matmul": comms(mode),
                    "comms_to_replicate": comms(to_full), "max_abs_err": float((whole.to_local() - a @ b).abs().max())}

a_rows = distribute_tensor(a, mesh, [Shard(0)])    # A split by rows, B whole on every rank
b_full = distribute_tensor(b, mesh, [Replicate()])
with CommDebugMode() as by_rows:
    c_rows = a_rows @ b_full
result["matmul_rows"] = {"out_placement": str(c_rows.placements[0]), "comms_in_matmul": comms(by_rows),
                         "local_shape": list(c_rows.to_local().shape),
                         "max_abs_err": float((c_rows.full_tensor() - a @ b).abs().max())}
runtime.log(f"A(Shard(1)) @ B(Shard(0)) -> {c.placements[0]}; to Replicate: {comms(to_full)}")
runtime.emit(result)
runtime.finish()

# %%
dt = launch.run_job(f"{JOBS}/dtensor.py", ["--rows", 8, "--cols", 6], timeout_s=120, echo=echo).result
print(dt["mesh"])
for name, shape in dt["local"].items():
    print(f"A as {name:<12} -> each rank holds {shape}")
for name, move in dt["redistribute"].items():
    print(f"redistribute {name:<22}: collectives {move['comms']}, local shape after {move['local_shape']}")
mm = dt["matmul"]
print(f"A[Shard(1)] @ B[Shard(0)]: collectives {mm['comms_in_matmul'] or 'none'}, result placement {mm['out_placement']}; "
      f"made whole with {mm['comms_to_replicate']}; error against A @ B: {mm['max_abs_err']:.1e}")
mr = dt["matmul_rows"]
print(f"A[Shard(0)] @ B[Replicate()]: collectives {mr['comms_in_matmul'] or 'none'}, result placement {mr['out_placement']}, "
      f"each rank holds {mr['local_shape']}; error against A @ B: {mr['max_abs_err']:.1e}")

assert dt["local"] == {"Shard(0)": [4, 6], "Shard(1)": [8, 3], "Replicate()": [8, 6]}
assert dt["redistribute"]["Shard(0)->Replicate()"]["comms"] == {"all_gather_into_tensor": 1}
assert mm["comms_in_matmul"] == {} and mm["comms_to_replicate"] == {"all_reduce": 1} and mm["max_abs_err"] < 1e-5
assert mr["comms_in_matmul"] == {} and mr["out_placement"] == "S(0)" and mr["max_abs_err"] < 1e-5

# %% [markdown]
# Each rank multiplied its column block of `A` by its row block of `B`: a full-size product that is
# only a *partial sum* of the answer, so the matmul itself needs no communication and its result is
# `Partial`. Making it whole takes one all-reduce of the full output. Splitting `A` by rows with `B`
# on every rank gives a row-sharded result with no communication at all, at the price of a full copy
# of `B` per rank: choosing placements is the art of tensor parallelism, and DTensor makes each
# choice's traffic explicit. (The warning above is DTensor's: on a CPU mesh it does not use an
# all-to-all, so it moved `Shard(0)` to `Shard(1)` with the all-gather counted above and kept its own
# chunk.)
#
# ## 5 · Activation checkpointing with torch.compile
#
# Sharding shrinks parameters; activations (what the forward pass keeps for the backward pass) are
# the other big consumer of memory. `torch.utils.checkpoint.checkpoint(block, x)` keeps only a
# block's input and recomputes the rest during the backward pass: fewer activations kept, more compute. This
# runs in the notebook's own process. Two measurements of memory: the bytes autograd saves for the
# backward pass (counted with `saved_tensors_hooks`), and the peak of the profiler's memory timeline
# (`profile_memory=True`, `export_memory_timeline`; on GPUs the newer memory snapshots replace it,
# and torch marks it deprecated).

# %%
AC_WIDTH, AC_DEPTH, AC_BATCH = config.pick((256, 4, 256), (512, 8, 512))


class Blocks(nn.Module):
    def __init__(self, width, depth, use_checkpoint):
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.use_checkpoint else block(x))
        return x.square().mean()


def saved_bytes(fn, x, params):
    """Bytes autograd saves for the backward pass: (activations, parameters saved by reference)."""
    mine = {p.data_ptr() for p in params}
    total = {"activations": 0, "parameters": 0}

    def pack(t):
        total["parameters" if t.data_ptr() in mine else "activations"] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(x)
    loss.backward()
    return total


def timeline_peak(step, x):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step(x)
    path = BUILD / "memory_timeline.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # deprecated in favour of CUDA-only memory snapshots
        prof.export_memory_timeline(str(path), device="cpu")
    times, sizes = json.loads(path.read_text())
    return max(sum(s) for s in sizes)


x_ac = torch.randn(AC_BATCH, AC_WIDTH)
ac = {}
for label, use in (("plain", False), ("checkpointed", True)):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Blocks(AC_WIDTH, AC_DEPTH, use)
    compiled = torch.compile(model)

    def step(x, compiled=compiled, model=model):
        compiled(x).backward()
        for p in model.parameters():
            p.grad = None

    step(x_ac)                                           # compile
    ac[label] = {"saved": saved_bytes(compiled, x_ac, list(model.parameters())), "peak": timeline_peak(step, x_ac),
                 "step": step}
    for p in model.parameters():
        p.grad = None

cmp_ac = bench.compare({label: v["step"] for label, v in ac.items()}, x_ac, rounds=config.pick(2, 3))
for label, v in ac.items():
    print(f"{label:>12}: activations saved for backward {v['saved']['activations'] / 2**20:6.2f} MiB (and "
          f"{v['saved']['parameters'] / 2**20:.2f} MiB of parameters, saved by reference: no extra memory), "
          f"timeline peak {v['peak'] / 2**20:6.2f} MiB, step {cmp_ac.row(label).median_s * 1e3:.1f} ms")
print(f"verdict on this machine ({cpu.cpu_class()}): the checkpointed step is {cmp_ac.describe('checkpointed')}; "
      f"its memory peak is {bench.band_verdict(ac['checkpointed']['peak'], ac['plain']['peak'])} (10% band)")
assert ac["checkpointed"]["saved"]["activations"] < ac["plain"]["saved"]["activations"]

# %% [markdown]
# Checkpointing cut the activations the compiled graph saves for the backward pass (asserted; it is a
# count of bytes, the same on every machine; the parameters it saves are references to the weights,
# which cost nothing extra). The step's overall peak also holds parameters, gradients and
# temporaries, so it moves less (the verdict above), and the price is recomputation, whose cost is
# this machine's verdict too. Under `torch.compile` the compiler also decides on its own what to save
# and what to recompute (its min-cut partitioner), so measure rather than assume. In FSDP jobs the
# usual recipe is to checkpoint each block and shard it: `checkpoint` inside, `fully_shard` outside.
#
# ## 6 · Distributed checkpoints
#
# `torch.save` of a sharded model would save each rank's shard separately, tied to that world size.
# `torch.distributed.checkpoint` (DCP) writes one checkpoint from all ranks in parallel (each rank its
# own file, plus metadata that records which slice of which tensor is where) and can load it into a
# different number of ranks, or into a single process. The job `dcp.py` trains the FSDP model (it imports `shard_model` from `fsdp.py`), saves it from
# both ranks, loads it into a freshly initialised sharded model on two ranks, and compares with the
# full weights; then this notebook loads the same files in its own process, with no process group.

# %%
# %%writefile {JOBS}/dcp.py
"""A distributed checkpoint: two ranks save a sharded model, a fresh sharded model loads it back."""
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from common import make_model, parser, train
from course_utils.distributed import runtime
from fsdp import shard_model


def full_state(model):
    """The whole (unsharded) state dict of a sharded model, on every rank."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def max_abs_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


p = parser("distributed checkpoint: save and reload")
p.add_argument("--dir", required=True, help="checkpoint folder (created)")
args = p.parse_args()
rank, world = runtime.init()
folder = Path(args.dir)

model = shard_model(make_model(args.width, args.depth))
train(model, range(args.steps), args.batch, args.width, args.lr, rank, world)
reference = full_state(model)
dcp.save(get_model_state_dict(model), checkpoint_id=str(folder))   # every rank writes its own shards
if rank == 0:
    torch.save(reference, folder / "reference.pt")                 # the full weights, to compare with
dist.barrier()
files = sorted(f.name for f in folder.iterdir())

fresh = shard_model(make_model(args.width, args.depth, seed=99))   # another start: different weights
before = max_abs_diff(full_state(fresh), reference)
state = get_model_state_dict(fresh)
dcp.load(state, checkpoint_id=str(folder))                         # every rank reads the slices it holds
set_model_state_dict(fresh, state)
worst = torch.tensor(max_abs_diff(full_state(fresh), reference))
dist.all_reduce(worst, op=dist.ReduceOp.MAX)
runtime.log(f"wrote {files}; a fresh model differed by {before:.3f}, after loading by {float(worst):.1e}")
runtime.emit({"world": world, "files": files, "diff_before_load": before,
              "reload_max_abs_diff_two_ranks": float(worst)})
runtime.finish()

# %%
import torch.distributed.checkpoint as dcp

ckpt_dir = BUILD / "dcp_checkpoint"
if ckpt_dir.exists():
    for f in ckpt_dir.iterdir():
        f.unlink()
dcp_res = launch.run_job(f"{JOBS}/dcp.py", [*MODEL, "--steps", 2, "--dir", ckpt_dir], timeout_s=300, echo=echo).result
reference = torch.load(ckpt_dir / "reference.pt", weights_only=True)

# One process, no process group: a plain dict of tensors of the right shapes, filled from the shards.
one_process = {name: torch.zeros_like(t) for name, t in reference.items()}
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*single process")   # "assuming the intent is to load in a single process": it is
    dcp.load(one_process, checkpoint_id=str(ckpt_dir), no_dist=True)
diff_one = max(float((one_process[k] - reference[k]).abs().max()) for k in reference)
print(f"files written by the two ranks: {dcp_res['files']}")
print(f"a fresh model differed from the saved one by {dcp_res['diff_before_load']:.3f}; after loading: "
      f"{dcp_res['reload_max_abs_diff_two_ranks']} on two ranks, {diff_one} in one process")
reload_diff = max(dcp_res["reload_max_abs_diff_two_ranks"], diff_one)
assert dcp_res["diff_before_load"] > 0 and reload_diff == 0.0
bench.record("dist.dcp.reload_max_abs_diff", reload_diff, "abs", ranks_saved=2, loaded_into="2 ranks and 1 process");

# %% [markdown]
# ## 7 · Faults: a rank dies, the job goes on
#
# On many machines something fails sooner or later. `torchrun --max-restarts N` watches its workers;
# when one exits abnormally it stops the others and starts the whole group again, up to N times.
# The script's part is to checkpoint regularly and, on start, resume from the last checkpoint if
# there is one. The job `elastic.py` does that; with `--kill-at S`, rank 1 of
# the first attempt kills itself with SIGKILL at step S, as a crashed machine would vanish. Rank 0
# then sees its peer's connection close in the middle of an all-reduce. The same job without a fault
# gives the reference.

# %%
# %%writefile {JOBS}/elastic.py
"""Training that checkpoints as it goes and resumes from the last checkpoint when torchrun restarts it.

With --kill-at S, rank 1 of the first attempt kills itself (SIGKILL, as a crashed machine would vanish)
at step S; torchrun (--max-restarts) stops the other rank and starts both again.
"""
import hashlib
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import global_batch, make_model, maybe_compile, parser, shard
from course_utils.distributed import runtime


def fingerprint(model):
    """SHA-256 of the parameters' bytes: equal only for bit-identical weights."""
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def save(path, model, opt, step, losses):
    """Write the checkpoint atomically: a temporary file, then a rename."""
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "losses": losses}, tmp)
    os.replace(tmp, path)


p = parser("training that survives a killed rank")
p.add_argument("--dir", required=True, help="checkpoint folder (created)")
p.add_argument("--every", type=int, default=2, help="checkpoint after every this many steps")
p.add_argument("--kill-at", type=int, default=-1, help="rank 1 of the first attempt dies at this step")
args = p.parse_args()
rank, world = runtime.init()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))   # torchrun counts the restarts
path = Path(args.dir) / "latest.pt"
path.parent.mkdir(parents=True, exist_ok=True)

model = make_model(args.width, args.depth)
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
start, losses = 0, []
if path.exists():                                  # resume: weights, momentum, step and losses so far
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    start, losses = int(state["step"]), list(state["losses"])
    runtime.log(f"attempt {attempt}: resuming from the checkpoint after step {start}")
else:
    runtime.log(f"attempt {attempt}: no checkpoint, starting from step 0")
forward = maybe_compile(DDP(model), args.backend)
step_s = []
for step in range(start, args.steps):
    began = time.perf_counter()
    if step == args.kill_at and rank == 1 and attempt == 0:
        runtime.log(f"dies at step {step} (SIGKILL)")
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = global_batch(step, args.batch, args.width)
    loss = nn.functional.cross_entropy(forward(shard(x, rank, world)), shard(y, rank, world))
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
        dist.barrier()                             # nobody runs ahead of a checkpoint being written

runtime.log(f"finished {args.steps} steps after {attempt} restart(s); weights {fingerprint(model)}")
runtime.emit({"world": world, "restarts": attempt, "resumed_from": start, "steps": args.steps, "losses": losses,
              "fingerprint": fingerprint(model), "batch": args.batch,
              "step_s": step_s[1:]})               # the first step warms up
runtime.finish()

# %%
EL_STEPS, EL_EVERY, EL_KILL = config.pick((8, 2, 5), (30, 5, 17))
EL_ARGS = ["--width", 128, "--depth", 3, "--steps", EL_STEPS, "--every", EL_EVERY, "--backend", "none"]
for sub in ("faulty", "clean", "one_rank"):
    (BUILD / "elastic" / sub / "latest.pt").unlink(missing_ok=True)
faulty = launch.run_job(f"{JOBS}/elastic.py", [*EL_ARGS, "--dir", BUILD / "elastic" / "faulty", "--kill-at", EL_KILL],
                        max_restarts=1, timeout_s=300, echo=echo).result
print()
clean = launch.run_job(f"{JOBS}/elastic.py", [*EL_ARGS, "--dir", BUILD / "elastic" / "clean"], timeout_s=300, echo=echo).result
print(f"\nfaulty run: {faulty['restarts']} restart(s), resumed after step {faulty['resumed_from']}, "
      f"weights {faulty['fingerprint']}")
print(f"clean run:  {clean['restarts']} restart(s), weights {clean['fingerprint']}")
assert faulty["restarts"] == 1 and faulty["resumed_from"] == (EL_KILL // EL_EVERY) * EL_EVERY
assert faulty["fingerprint"] == clean["fingerprint"] and faulty["losses"] == clean["losses"]
bench.record("dist.elastic.restarts_survived", faulty["restarts"], "restarts", killed_at_step=EL_KILL,
             resumed_from=faulty["resumed_from"], same_weights=True);

# %% [markdown]
# The restarted job resumed from the last checkpoint and finished with bit-identical weights and the
# same losses as the run that never failed: the data order is a function of the step, and the
# checkpoint holds the optimizer's momentum too. The steps between the checkpoint and the crash were
# simply done twice. Two things make this work on a real cluster as well: `--max-restarts`, and the
# c10d rendezvous (`--rdzv-backend c10d`), which also lets a replacement machine join; the course's
# launcher uses it on 127.0.0.1 too.
#
# ## 8 · Scaling out: the same script on many machines
#
# On CPU machines only the launch changes. A GPU cluster needs three more lines in a job: NCCL
# (`runtime.init("nccl")`), `torch.cuda.set_device(LOCAL_RANK)`, and the model and its batches on
# that GPU (and `fully_shard`'s mesh on `"cuda"`). On each of, say, 4 machines with 8 GPUs, run the same command; the
# rendezvous endpoint is a host:port on one of them (any free port, reachable from the others).
# There the store has to listen on the network, so the command is plain `torchrun`; the store has no
# password, so that port belongs on the cluster's private network, behind its firewall:

# %%
for rank in range(2):
    print(f"machine {rank}: " + " ".join(launch.multinode_command("fsdp.py", ["--steps", 1000], nnodes=4, nproc_per_node=8,
                                                                   endpoint="node0.example:29400", job_id="fsdp-run-1",
                                                                   node_rank=rank)))
print("... and the same on machines 2 and 3 (with --node-rank 2, 3; or leave --node-rank out and let torchrun assign it)")

# %% [markdown]
# On a cluster scheduler the scheduler provides the machine list: with Slurm, one `srun` task per node
# runs that `torchrun` line with the first node's hostname as the endpoint and `$SLURM_JOB_ID` as the
# `--rdzv-id`; on Kubernetes, the Kubeflow training operator sets the same variables for each pod. The
# training script, its checkpoints and its restart logic stay as they ran here (with the GPU lines
# of section 8 on a GPU cluster).
#
# What can two processes on a laptop say about speed? Below, the same training (same global batch)
# runs on one process and on two, and the step times are compared side by side.

# %%
(BUILD / "elastic" / "one_rank" / "latest.pt").unlink(missing_ok=True)
one = launch.run_job(f"{JOBS}/elastic.py", [*EL_ARGS, "--dir", BUILD / "elastic" / "one_rank"], nproc=1,
                     timeout_s=300, echo=None).result
speed = bench.Comparison.from_samples({"1 process": one["step_s"], "2 processes": clean["step_s"]})
print(speed)
print(f"verdict on this machine ({os.cpu_count()} cores): a step on 2 processes is {speed.describe('2 processes')}")
print("Why this verdict says little either way: the two ranks share this machine's cores with each other (and\n"
      "the notebook), their all-reduce is a memory copy through loopback rather than a network, and the model is\n"
      "tiny, so communication and the ranks' competition for the cores weigh as much as the compute that is split.\n"
      "What it does show: the same numbers, the same checkpoints and the same recovery as on a cluster, where each\n"
      "rank has its own GPU and the speed-up depends on the interconnect.")
assert one["losses"] == clean["losses"] or max(abs(a - b) for a, b in zip(one["losses"], clean["losses"])) < 1e-4


# %% [markdown]
# The losses of one process and two agree (asserted), as DDP promises; the speed verdict is only this
# machine's.
#
# ## Check yourself
#
# **Exercise 1.** Write `shard_sizes(n, world)`: how many rows each rank holds when a dimension of
# `n` rows is sharded with `Shard(0)` over `world` ranks. Section 3's 10-row head split 5 and 5; what
# about 10 rows over 4 ranks?

# %%
def shard_sizes(n: int, world: int) -> list[int]:
    # Your code here.
    return [n // world] * world


exercises.check("12.shard_sizes", shard_sizes)


# %% [markdown]
# **Exercise 2.** Rank r starts with `tensors[r]` and calls `dist.all_reduce(t)` with the default
# operation. Write `after_all_reduce(tensors)` returning the list of what each rank holds afterwards.

# %%
def after_all_reduce(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # Your code here.
    return [t.clone() for t in tensors]


exercises.check("12.all_reduce", after_all_reduce)


# %% [markdown]
# **Exercise 3.** A DDP job runs `world` ranks with a per-rank batch of `per_rank` samples and
# accumulates gradients over `accumulation` micro-steps before each optimizer step. Write
# `global_batch(per_rank, world, accumulation=1)`: over how many samples does one optimizer step
# average? Stuck? `print(exercises.solution_source("12.global_batch"))`.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
def global_batch(per_rank: int, world: int, accumulation: int = 1) -> int:
    # Your code here.
    return per_rank


exercises.check("12.global_batch", global_batch)

# %% [markdown]
# ## Summary
#
# - A distributed job is a group of ranks started by `torchrun`; collectives (all-reduce, all-gather,
#   reduce-scatter) are their only way to talk, and each left exactly what its definition says.
#   Every job here was a file a cell wrote; every socket the collectives job listened on was on
#   127.0.0.1 (no other machine could reach it; other processes on this one could).
# - DDP + `torch.compile` gave the one-process gradients to float32 rounding; Dynamo's DDP optimizer
#   splits the graph at bucket boundaries, so a smaller `bucket_cap_mb` meant more buckets and more
#   graphs; the trace counted how many all-reduces started before the last gradient was computed.
# - FSDP2's `fully_shard` left each rank half the parameter bytes, as DTensors sharded by rows, and
#   trained with DDP's loss curve.
# - DTensor placements make communication explicit: `Shard -> Replicate` is an all-gather, a
#   column-by-row sharded matmul gives a `Partial` result that one all-reduce makes whole.
# - Activation checkpointing saved fewer activation bytes for the backward pass under `torch.compile`;
#   its time cost was this machine's verdict.
# - A DCP checkpoint saved by two ranks loaded exactly into two ranks and into one process.
# - `torchrun --max-restarts` plus regular checkpoints survived a killed rank and finished with the
#   same weights; on a cluster of CPU machines only the launch command changes (a GPU cluster
#   needs the few lines of section 8 too).
# - Results recorded: `dist.ddp.grad_max_abs_diff`, `dist.ddp.compiled_graphs`,
#   `dist.fsdp.param_bytes_per_rank_ratio`, `dist.dcp.reload_max_abs_diff`,
#   `dist.elastic.restarts_survived`.
#
# ## Further reading
#
# - [`torch.distributed` overview](https://docs.pytorch.org/docs/stable/distributed.html)
#   and [`torchrun`](https://docs.pytorch.org/docs/stable/elastic/run.html)
# - [DistributedDataParallel](https://docs.pytorch.org/docs/stable/notes/ddp.html) and
#   [DDP with `torch.compile`](https://docs.pytorch.org/docs/stable/torch.compiler_ddp.html)
# - [FSDP2 `fully_shard`](https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html)
# - [DTensor](https://docs.pytorch.org/docs/stable/distributed.tensor.html)
# - [Distributed checkpoint](https://docs.pytorch.org/docs/stable/distributed.checkpoint.html)
# - [Activation checkpointing](https://docs.pytorch.org/docs/stable/checkpoint.html)
