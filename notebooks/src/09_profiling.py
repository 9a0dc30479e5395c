# %% [markdown]
# # 09 · Profiling: finding where the time goes, eager and compiled
#
# A slow training step rarely looks slow where you expect it. Before you compile, fuse or rewrite
# anything, you need to know which operators, which stages of the model and which lines of your
# loop actually take the time. `torch.profiler` records every operator PyTorch runs, with its
# duration, its input shapes and the memory it allocates, and writes a timeline you can read.
# This notebook teaches you to read those records, to see what `torch.compile` changes in them,
# and to use them to find and fix a real bottleneck, all without leaving Jupyter.

# %% [markdown]
# ## What you will learn
#
# - how to profile a model with `torch.profiler.profile`, and read `key_averages()` tables sorted
#   by *self* and by *total* time, grouped by input shape, with your own `record_function` labels;
# - how to profile a few steps of a training loop with a `schedule`, write traces to the build
#   directory, open them in Perfetto, and draw the timeline inside the notebook;
# - how to see what one step allocates (`profile_memory=True`);
# - what a compiled model looks like in a trace: a compiled region and fewer operator events;
# - how to locate a planted bottleneck in a training loop, fix it, and measure what the fix is worth.
#
# **Prerequisites:** notebook 00 (timing with `course_utils.bench`) and notebook 01 (`torch.compile`).
#
# **Time on a laptop CPU:** <!-- stamp:time -->0.3 min the first time (every cache empty), 0.3 min after that (compile cache warm), 0.2 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time --> One small model is compiled; the rest is profiling small models.
#
# **GPU:** not needed. CUDA kernel rows, the gaps between kernel launches and memory snapshots
# are shown in guarded cells that run only on a CUDA machine.

# %% tags=["colab-setup"]
# Google Colab only: the next lines set the course up when this notebook runs in Colab (they clone the
# course's tagged release, install it beside Colab's own torch and make data/ available). Anywhere
# else this cell prints one line and does nothing. `python -m course_utils.kit.colab sync` writes it
# into every notebook, from course_utils/kit/colab_cell.py: edit it there, never in a notebook.
import sys

if "google.colab" in sys.modules:
    import importlib.metadata
    import os
    import pathlib
    import re
    import subprocess
    import tempfile

    COURSE_REPOSITORY = "https://github.com/YOUR-ORG/YOUR-REPOSITORY"
    COURSE_RELEASE = "v0.1.0"
    TORCH_FLOOR = (2, 11)
    SETUPTOOLS_FLOOR = 77  # what pyproject.toml's build needs; an older one is replaced in pip's build env

    def _version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def _release(version, parts):
        return tuple(int(p) for p in re.findall(r"\d+", version or "0.0.0")[:parts])

    home = pathlib.Path(os.environ.get("COURSE_COLAB_HOME", "/content/pytorch2-course"))
    repository = os.environ.get("COURSE_COLAB_REPOSITORY", COURSE_REPOSITORY)
    if not (home / "course_utils").is_dir():
        if "YOUR-ORG" in repository:
            raise SystemExit("This copy of the course names no repository to install from: set "
                             "[project.urls] Repository in pyproject.toml and run "
                             "`python -m course_utils.kit.colab sync`, or set COURSE_COLAB_REPOSITORY.")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", COURSE_RELEASE,
                        repository, str(home)], check=True)
    if _version("pytorch2-course") is None:
        torch_version = _version("torch")
        found = _release(torch_version, 2)
        # Keep Colab's torch (a CUDA build matched to its GPU) unless it is older than the course's floor.
        keep = [f"{d}=={_version(d)}" for d in ("torch", "torchvision", "torchaudio")
                if _version(d) is not None and found >= TORCH_FLOOR]
        if found < TORCH_FLOOR:
            print(f"Colab's torch {torch_version} is older than the course's floor "
                  f"{'.'.join(map(str, TORCH_FLOOR))}: pip installs a newer one (several minutes).")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
            pins.write("\n".join(keep) + "\n")
        # Build with the runtime's setuptools when it is new enough (nothing to download); else pip fetches one.
        isolation = [] if _release(_version("setuptools"), 1) < (SETUPTOOLS_FLOOR,) else ["--no-build-isolation"]
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *isolation,
                        "-c", pins.name, "-e", str(home)], check=True)
    if str(home) not in sys.path:
        sys.path.insert(0, str(home))  # the editable install is seen by new processes; this one needs the path
    os.chdir(home / "notebooks")
    print(f"Colab: the course {COURSE_RELEASE} is installed from {home} (torch {_version('torch')}); "
          f"its data/ is {home / 'data'}.")
else:
    print("Not running in Google Colab: this cell has nothing to do here.")

# %%
import os

# The CUDA build of torch logs Kineto (the profiler's tracing library) messages to stderr every
# time a profiler starts; on a CPU-only machine they include a harmless "gpuGetDeviceCount
# failed" error. Level 6 silences them; it must be set before the first profiler starts.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import json
import warnings
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from course_utils import bench, config, exercises, session, threads
from course_utils.data import load_digits_split
from course_utils.device import requires_cuda
from course_utils.models import MLP, SmallResNet
from course_utils.text import counted

print(session.start(seed=0))

# %% [markdown]
# ## The idea: record every operator, then aggregate
#
# Inside a `with profile(...)` block, PyTorch records an *event* for every operator it dispatches
# (`aten::conv2d`, `aten::addmm`, ...), with a start time, a duration and the thread it ran on.
# Operators call other operators: `aten::conv2d` calls `aten::convolution`, which calls
# `aten::_convolution`, which calls a backend routine (on x86 builds oneDNN's `aten::mkldnn_convolution`;
# the cell under "Grouping by input shape" finds which one ran on your machine). So every event
# has two times:
#
# - **total** (`CPU total`): from the operator's start to its end, children included;
# - **self** (`Self CPU`): total minus the time spent in its children, i.e. the work done in the
#   operator itself.
#
# Sort by *self* time to find the operators that do the work; sort by *total* time to find the
# expensive *stages* (a wrapper, a layer, your own labelled region). `activities` says what to
# record: `ProfilerActivity.CPU` for operators on the host, `ProfilerActivity.CUDA` for GPU
# kernels (on a GPU).
#
# `record_function("name")` adds your own labelled event, so a table or a timeline shows the
# stages of *your* code. Below we run `SmallResNet` (notebook 01's CNN) stage by stage with a label
# on each stage.

# %%
BATCH = config.pick(quick=64, full=256)
resnet = SmallResNet(width=32).eval()
images = torch.randn(BATCH, 1, 8, 8)

STAGES = ["stem", "block1", "pool", "block2", "head"]


def labelled_forward(model: SmallResNet, x: torch.Tensor) -> torch.Tensor:
    """Run SmallResNet's forward with a profiler label on each stage."""
    f = model.features
    with record_function("stem"):
        x = f[2](f[1](f[0](x)))      # conv, batch norm, ReLU
    with record_function("block1"):
        x = f[3](x)
    with record_function("pool"):
        x = f[4](x)
    with record_function("block2"):
        x = f[6](f[5](x))            # residual block, then global average pooling
    with record_function("head"):
        return model.classifier(torch.flatten(x, 1))


with torch.no_grad():
    torch.testing.assert_close(labelled_forward(resnet, images), resnet(images))
    labelled_forward(resnet, images)  # warm-up: the first call pays one-off set-up costs
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        labelled_forward(resnet, images)

averages = prof.key_averages()
print(averages.table(sort_by="self_cpu_time_total", row_limit=8))

# %% [markdown]
# The *Self CPU* column adds up to the whole profiled time (the last line of the table), so its
# top rows are where the CPU really went (the next cell prints which operator led here). Now the
# same events sorted by *total* time: the labelled stages and the wrapper operators (`aten::conv2d`
# and friends) come up, because their total includes their children.

# %%
print(averages.table(sort_by="cpu_time_total", row_limit=10))

by_key = {e.key: e for e in averages}
assert all(stage in by_key for stage in STAGES), "every record_function label appears in the table"
top_self = max(averages, key=lambda e: e.self_cpu_time_total)
top_stage = max(STAGES, key=lambda s: by_key[s].cpu_time_total)
print(f"most self CPU time: {top_self.key} "
      f"({top_self.self_cpu_time_total / 1e3:.2f} ms in {top_self.count} calls)")
print(f"most expensive stage: {top_stage} ({by_key[top_stage].cpu_time_total / 1e3:.2f} ms total)")

# %% [markdown]
# ### Grouping by input shape
#
# With `record_shapes=True` the profiler also keeps every operator's input shapes.
# `key_averages(group_by_input_shape=True)` splits each row by shape, which tells you *which*
# convolution is expensive: the ones before the pooling work on 8×8 maps, the ones after on 4×4.

# %%
ROW_LIMIT = 8
print(prof.key_averages(group_by_input_shape=True).table(
    sort_by="self_cpu_time_total", row_limit=ROW_LIMIT, max_name_column_width=28, max_shapes_column_width=60))

# The backend routine under aten::_convolution depends on the build: oneDNN on x86 (and most Arm) builds,
# a plain or NNPACK kernel elsewhere.
CONV_BACKENDS = ("aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::_nnpack_spatial_convolution",
                 "aten::thnn_conv2d")
by_shape = prof.key_averages(group_by_input_shape=True)
conv_leaf = next((name for name in CONV_BACKENDS if any(e.key == name for e in by_shape)), None)
assert conv_leaf is not None, (f"none of {CONV_BACKENDS} ran; look in the table above for the routine under "
                               "aten::_convolution on this build")
conv_shapes = {str(e.input_shapes[0]) for e in by_shape if e.key == conv_leaf}
print(f"{conv_leaf} (the convolution routine here) appears with {len(conv_shapes)} different input shapes "
      f"(the table above shows only the {ROW_LIMIT} largest rows): {sorted(conv_shapes)}")

# %% [markdown]
# ### Where in *my* code? `with_stack=True`
#
# `with_stack=True` also records the Python functions that were running (it makes profiling
# slower, so switch it on when you need it). In the installed torch these frames go into the
# trace as events of category `python_function`, nested around the operators they called. The
# table's own route, the `stack` attribute of each `key_averages()` row that `group_by_stack_n`
# groups by, may stay empty: the cell below counts the rows that carry one. To find which of your
# functions and layers launched the slowest convolution, export the trace and list the Python frames
# whose time span encloses it, innermost first. Each frame is named `file(line): function`, where the
# line is the one the function is *defined* on (its `def`), not the line that made the call; the
# `nn.Module: Conv2d_1` entries name the layer, by class and a running index per class in the order
# the modules are first called (`Conv2d_0` is the stem's convolution, `Conv2d_1` the first
# convolution of the first residual block; `ResBlock_0` is that block, `block1` in our code).

# %%
with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_stack=True) as stack_prof:
    labelled_forward(resnet, images)
stack_path = config.build_dir() / "profiles" / "09" / "forward_with_stack.json"
stack_path.parent.mkdir(parents=True, exist_ok=True)
stack_prof.export_chrome_trace(str(stack_path))
stack_rows = stack_prof.key_averages()
with_a_stack = sum(bool(e.stack) for e in stack_rows)
print(f"key_averages() rows with a stack: {with_a_stack} of {len(stack_rows)}"
      + (" (group_by_stack_n has nothing to group by here; the trace's python_function events do)"
         if with_a_stack == 0 else ""))

stack_events = [e for e in json.loads(stack_path.read_text())["traceEvents"] if e.get("ph") == "X"]
slowest = max((e for e in stack_events if e["name"] == "aten::conv2d"), key=lambda e: e["dur"])


def encloses(outer: dict, inner: dict) -> bool:
    """Whether event `outer` spans event `inner` on the same thread."""
    return (outer is not inner and outer.get("tid") == inner.get("tid") and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])


# Only frames of the thread that ran the convolution: the kernel's other threads (its event loop,
# its I/O) have Python frames that span the same moment but did not call it.
frames = [e for e in stack_events if e.get("cat") == "python_function" and encloses(e, slowest)]
frames.sort(key=lambda e: e["dur"])  # the innermost frame is the shortest one
print(f"slowest aten::conv2d ({slowest['dur'] / 1e3:.2f} ms) was called from (innermost first; each function "
      "with the line of its def):")
ours = [i for i, f in enumerate(frames) if "labelled_forward" in f["name"]]
assert ours, "our own function is on the stack"
for frame in frames[:ours[0] + 1]:  # innermost first, up to our own function
    print("   ", frame["name"])
assert not any("select" in f["name"] or "asyncio" in f["name"] for f in frames[:ours[0] + 1]), \
    "frames of other threads crept in"

# %% [markdown]
# ## Profiling a training loop with a schedule
#
# Profiling a whole training run produces huge traces, and the first steps are not typical (caches
# are cold, memory is being allocated for the first time). A `schedule` profiles only a window of
# steps. You call `prof.step()` at the end of each training step, and the profiler cycles through:
#
# - `wait`: steps it ignores;
# - `warmup`: steps it traces but throws away (the tracer itself warms up);
# - `active`: steps it records;
# - `repeat`: how many such cycles (0 means: until the loop ends).
#
# Each time an active window closes, the profiler calls `on_trace_ready(prof)`. Here the handler
# writes a Chrome-format trace into the course's build directory (git-ignored), and we check that
# one file appears per cycle. (`torch.profiler.tensorboard_trace_handler(dir)` is a ready-made
# handler that does the same with generated file names.)

# %%
split = load_digits_split()
MEAN, STD = split.x_train.mean().item(), split.x_train.std().item()
TRACE_DIR = config.build_dir() / "profiles" / "09"
TRACE_DIR.mkdir(parents=True, exist_ok=True)
for old in TRACE_DIR.glob("train_step*.json"):  # an earlier run's cycles (the with-stack trace above stays)
    old.unlink()

LOOP_BATCH = 128
mlp = MLP(64, 256, 10)
optimizer = torch.optim.SGD(mlp.parameters(), lr=0.05)


def train_step(model, optimizer, xb, yb) -> torch.Tensor:
    """One labelled SGD step on a flattened batch; returns the loss (still a tensor)."""
    with record_function("forward"):
        loss = nn.functional.cross_entropy(model(xb.flatten(1)), yb)
    with record_function("backward"):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
    return loss.detach()


saved = []


def save_trace(p) -> None:
    path = TRACE_DIR / f"train_step{p.step_num}.json"
    p.export_chrome_trace(str(path))
    saved.append(path)


WAIT, WARMUP, ACTIVE, REPEAT = 1, 1, 2, 2
n_steps = (WAIT + WARMUP + ACTIVE) * REPEAT
# With repeat > 1 the profiler warns that each cycle starts from an empty record (pass
# acc_events=True to keep them all); our handler saves every cycle, so we silence that notice.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT),
                 on_trace_ready=save_trace) as loop_prof:
        for step in range(n_steps):
            idx = torch.randint(len(split.y_train), (LOOP_BATCH,))
            with record_function("data"):
                xb, yb = (split.x_train[idx] - MEAN) / STD, split.y_train[idx]
            train_step(mlp, optimizer, xb, yb)
            loop_prof.step()

assert len(saved) == REPEAT, f"expected one trace per cycle, got {len(saved)}"
for path in saved:
    print(f"{path.relative_to(config.build_dir())}: {path.stat().st_size / 1e3:.0f} kB")


# %% [markdown]
# ### Opening a trace in Perfetto
#
# A Chrome-format trace is plain JSON. To explore it interactively, open
# [ui.perfetto.dev](https://ui.perfetto.dev) in a browser, click **Open trace file** and pick one of
# the files above (from the `build/` folder of the course). Perfetto runs entirely in your browser:
# the file is not uploaded anywhere. `chrome://tracing` in Chrome or Chromium also opens these files.
# You can write a trace from any finished profile with `prof.export_chrome_trace(path)`.
#
# ### The timeline, inside the notebook
#
# You do not need a browser to look at a timeline. Each entry of the trace's `traceEvents` list with
# `"ph": "X"` is a complete event with a name, a start `ts` and a duration `dur`, both in
# microseconds. The next cell draws our labelled stages and the `ProfilerStep#N` events of the last
# trace as horizontal bars on a time axis, and then the operators inside one step.

# %%
def load_events(path: Path) -> list[dict]:
    """Return the complete ("X") events of a Chrome trace, sorted by start time."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    return sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])


def draw_timeline(events: list[dict], rows: list[str], title: str, ax=None):
    """Draw one row of bars per name in `rows`, time in ms from the first event."""
    ax = ax or plt.subplots(figsize=(10, 0.45 * len(rows) + 1))[1]
    t0 = min(e["ts"] for e in events)
    colors = plt.cm.tab10.colors
    for i, name in enumerate(rows):
        spans = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in events if e["name"] == name]
        ax.broken_barh(spans, (i - 0.4, 0.8), color=colors[i % len(colors)])
    ax.set_yticks(range(len(rows)), [r if len(r) <= 40 else r[:37] + "..." for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    return ax


events = load_events(saved[-1])
# sorted by step number (as strings, "ProfilerStep#10" would come before "ProfilerStep#9")
steps = sorted({e["name"] for e in events if e["name"].startswith("ProfilerStep#")}, key=lambda n: int(n.split("#")[1]))
stage_rows = steps + ["data", "forward", "backward", "optimizer"]
assert len(steps) == ACTIVE, f"the active window holds {ACTIVE} steps"
draw_timeline(events, stage_rows, f"the last trace: {ACTIVE} active training steps");

# %%
first_step = next(e for e in events if e["name"] == steps[0])
inside = [e for e in events if e.get("cat") == "cpu_op"
          and first_step["ts"] <= e["ts"] <= first_step["ts"] + first_step["dur"]]
op_rows = list(dict.fromkeys(e["name"] for e in inside))[:14]  # first 14 operator names, in order
draw_timeline(inside, op_rows, f"operators inside {steps[0]} (first 14 names)");
print(f"{steps[0]}: {len(inside)} operator events in {first_step['dur'] / 1e3:.2f} ms")

# %% [markdown]
# ## Memory: what one step allocates
#
# With `profile_memory=True` the profiler also records every allocation and free. The table gains
# *CPU Mem* (bytes allocated by the operator and its children, minus what they freed) and
# *Self CPU Mem*. Sorting by self memory shows which operators allocate the step's tensors: the
# activations of the forward pass, the gradients of the backward pass.

# %%
idx = torch.randint(len(split.y_train), (LOOP_BATCH,))
xb, yb = (split.x_train[idx] - MEAN) / STD, split.y_train[idx]
optimizer.zero_grad(set_to_none=True)  # free the last step's gradients before we start recording
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as mem_prof:
    train_step(mlp, optimizer, xb, yb)

mem_table = mem_prof.key_averages()
print(mem_table.table(sort_by="self_cpu_memory_usage", row_limit=6))
allocated = sum(e.self_cpu_memory_usage for e in mem_table if e.self_cpu_memory_usage > 0)
top_alloc = max(mem_table, key=lambda e: e.self_cpu_memory_usage)
assert top_alloc.self_cpu_memory_usage > 0
# Negative rows are frees: the backward pass releases the activations the forward pass kept for it.
held = sum(e.self_cpu_memory_usage for e in mem_table)
grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in mlp.parameters() if p.grad is not None)
print(f"during the step, operators allocated at least {allocated / 1024:.0f} KiB that outlived the operator that made "
      "it (the sum of the positive Self CPU Mem: activations kept for backward, then gradients; a tensor allocated and "
      "freed inside one operator counts zero, and a row's Self CPU Mem is its allocations minus its frees, so an "
      f"operator that also freed more than it kept adds nothing); the biggest allocator is {top_alloc.key} "
      f"({top_alloc.self_cpu_memory_usage / 1024:.0f} KiB; the table's KB are KiB, 1024 bytes)")
print(f"allocations minus frees over the whole step: {held / 1024:.0f} KiB still held at its end; the parameters' "
      f"gradients take {grad_bytes / 1024:.0f} KiB, "
      + ("so what the step keeps is its gradients: the backward pass freed the activations"
         if abs(held - grad_bytes) <= 0.02 * grad_bytes else
         "so the step keeps more than its gradients in this run" if held > grad_bytes else
         "so the step also freed memory allocated before the profiled window in this run"))

# %% [markdown]
# On a GPU you can go further with a **memory snapshot**: `torch.cuda.memory._record_memory_history()`
# records every allocation with its stack trace, and `_dump_snapshot(path)` writes a file you can
# drop onto [pytorch.org/memory_viz](https://pytorch.org/memory_viz) (which, like Perfetto, runs in
# your browser). Snapshots track the CUDA caching allocator only: on a CPU-only machine the call
# raises. (`prof.export_memory_timeline(path)` draws a memory timeline from a profile made with
# `profile_memory=True, record_shapes=True, with_stack=True`; the installed torch marks it
# deprecated with a `FutureWarning`.)

# %%
try:
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    torch.cuda.memory._record_memory_history(enabled=None)
    snapshot_error = None
except (RuntimeError, AssertionError) as err:
    snapshot_error = err
print("memory history available" if snapshot_error is None
      else f"memory history needs CUDA here: {type(snapshot_error).__name__}: {str(snapshot_error)[:60]}...")

if requires_cuda("a CUDA memory snapshot of one training step, for pytorch.org/memory_viz"):
    gpu_mlp = MLP(64, 256, 10).cuda()
    gpu_opt = torch.optim.SGD(gpu_mlp.parameters(), lr=0.05)
    # stacks="python": memory_viz shows where in your Python each block was allocated. The default, "all",
    # adds C++ frames, which torch turns into names with addr2line when the snapshot is written: that can
    # take minutes on some systems.
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    train_step(gpu_mlp, gpu_opt, xb.cuda(), yb.cuda())
    snapshot_path = TRACE_DIR / "memory_snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(snapshot_path))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"snapshot written to {snapshot_path} ({snapshot_path.stat().st_size / 1e3:.0f} kB)")
    import pickle

    snapshot = pickle.loads(snapshot_path.read_bytes())  # our own file: the dict memory_viz reads
    allocs = [e for trace in snapshot["device_traces"] for e in trace if e.get("action") == "alloc"]
    print(f"{counted(len(snapshot['segments']), 'memory segment')}; {len(allocs)} allocations recorded during the step")
    assert snapshot["segments"] and allocs, "the snapshot should hold the step's segments and allocations"


# %% [markdown]
# ## Eager against compiled
#
# What does `torch.compile` look like to the profiler? We trace one forward pass of the CNN in eager
# mode and once compiled (after a warm-up call, so the compilation itself is not in the trace), and
# count the `aten::` operator events in each trace.

# %%
def trace_forward(fn, x: torch.Tensor, path: Path) -> list[dict]:
    """Return the events of a trace of one call of fn(x), written to path."""
    fn(x)  # warm-up (and, for a compiled fn, the compilation)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn(x)
    p.export_chrome_trace(str(path))
    return load_events(path)


def aten_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["name"].startswith("aten::")]


torch._dynamo.reset()
cnn = SmallResNet(width=32).eval()
compiled_cnn = torch.compile(cnn)
with torch.no_grad():
    torch.testing.assert_close(compiled_cnn(images), cnn(images), rtol=1e-4, atol=1e-4)
    eager_events = trace_forward(cnn, images, TRACE_DIR / "forward_eager.json")
    compiled_events = trace_forward(compiled_cnn, images, TRACE_DIR / "forward_compiled.json")

n_eager, n_compiled = len(aten_events(eager_events)), len(aten_events(compiled_events))
event_ratio = n_eager / n_compiled
print(f"aten:: events in one forward: eager {n_eager}, compiled {n_compiled} ({event_ratio:.1f}x fewer)")
assert n_compiled < n_eager, "the compiled forward dispatches fewer operators"
bench.record("profile.compiled.event_ratio", event_ratio, "x", batch=BATCH, model="SmallResNet")

regions = sorted({e["name"] for e in compiled_events
                  if e["name"].startswith(("TorchDynamo Cache Lookup", "Torch-Compiled Region",
                                           "## Call CompiledFxGraph"))})
print("compiled-code events in the trace:", regions)
region = next(e for e in compiled_events if e["name"].startswith("Torch-Compiled Region"))
lookup = next(e for e in compiled_events if e["name"] == "TorchDynamo Cache Lookup")
assert lookup["ts"] + lookup["dur"] <= region["ts"], "the guard checks run before the compiled region"
print(f"guard checks (TorchDynamo Cache Lookup): {lookup['dur']:.0f} us, ending "
      f"{region['ts'] - lookup['ts'] - lookup['dur']:.0f} us before the {region['dur'] / 1e3:.2f} ms region starts")

# %% [markdown]
# Where did the operators go? Inductor fused the batch norms, ReLUs, additions and pooling into a
# few generated C++ loops, which run inside the `## Call CompiledFxGraph ... ##` event and are
# invisible to the operator-level profiler. What remains as `aten::` events are the *extern* calls
# the generated code makes into PyTorch's own libraries (the convolutions and the final matrix
# multiply), and the operators nested inside those calls: each convolution's own chain down to the
# backend routine that does the arithmetic (the one found above), plus allocations, views and copies. The
# cell below splits the outermost calls from the ones nested in them. The guard checks Dynamo
# runs first are an event of their own, `TorchDynamo Cache Lookup`, which ends before the
# `Torch-Compiled Region` starts (the cell above timed both); the region spans the compiled code
# that runs once the guards pass. (With gradients on, outside `torch.no_grad()`, in train or eval
# mode alike, you would also see a `CompiledFunction` event: the autograd node that will run the
# compiled backward.) Both plots share one time axis.

# %%
print("eager   :", Counter(e["name"] for e in aten_events(eager_events)).most_common(5))
print("compiled:", Counter(e["name"] for e in aten_events(compiled_events)).most_common(5))

compiled_aten = aten_events(compiled_events)  # encloses(): defined where the Python frames were found
outermost = [e for e in compiled_aten if not any(encloses(o, e) for o in compiled_aten)]
print(f"compiled, outermost aten:: calls (what the generated code calls): "
      f"{dict(Counter(e['name'] for e in outermost))}")
nested = Counter(e["name"] for e in compiled_aten if e not in outermost)
print(f"compiled, aten:: events nested inside those: {sum(nested.values())} of {len(compiled_aten)}: {dict(nested)}")

fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
for ax, evs, label in [(axes[0], eager_events, "eager"), (axes[1], compiled_events, "compiled")]:
    top_level = [e for e in evs if e["name"].startswith(("aten::", "TorchDynamo Cache Lookup", "Torch-Compiled",
                                                          "## Call"))]
    names = list(dict.fromkeys(e["name"] for e in top_level))[:12]
    draw_timeline(top_level, names, f"{label}: one forward (first 12 event names)", ax=ax)
fig.tight_layout()


# %% [markdown]
# Fewer events is not the same as less time: the convolutions do the same arithmetic either way.
# Notebook 01 measured when compiling pays on a CPU; the profiler tells you *why* it did or did not
# (how much of the time was in operators a fusion could remove).
#
# ## A planted bottleneck: find it, fix it, measure it
#
# Here is a training loop that a lot of code looks like. The dataset normalises each image in
# `__getitem__`, one sample at a time, and the `DataLoader` collates 128 single samples into a
# batch. Nothing looks wrong. Let us profile a few steps with labels on the
# four stages of each step.

# %%
class PerSampleDigits(Dataset):
    """Normalises one image per __getitem__ call: the DataLoader collates single samples."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return (self.x[i] - MEAN) / STD, self.y[i]


def slow_loader() -> DataLoader:
    return DataLoader(PerSampleDigits(split.x_train, split.y_train),
                      batch_size=LOOP_BATCH, shuffle=True, drop_last=True)


def endless(make_loader):
    """Yield batches forever, starting a new epoch (new shuffle) when one ends."""
    while True:
        yield from make_loader()


def make_step(batches, model, optimizer):
    """Return a function running one training step on the next batch."""
    def step() -> torch.Tensor:
        with record_function("data"):
            xb, yb = next(batches)
        return train_step(model, optimizer, xb, yb)
    return step


def fresh_model():
    torch.manual_seed(0)
    model = MLP(64, 256, 10)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


# One torch thread from here on: this model's kernels are tiny, and with two OpenMP threads on a
# busy 2-core machine each kernel can also wait for a thread that is not running, which would add
# noise to the lesson: the cost of per-sample work. The side-by-side timing below uses the same setting.
torch.set_num_threads(1)
slow_step = make_step(endless(slow_loader), *fresh_model())
PROFILED_STEPS = config.pick(quick=3, full=5)
with profile(activities=[ProfilerActivity.CPU],
             schedule=schedule(wait=0, warmup=1, active=PROFILED_STEPS, repeat=1)) as slow_prof:
    for _ in range(1 + PROFILED_STEPS):
        slow_step()
        slow_prof.step()

slow_table = slow_prof.key_averages()
print(slow_table.table(sort_by="cpu_time_total", row_limit=8, max_name_column_width=60))

# %% [markdown]
# Sorted by total time, under `ProfilerStep*` (the whole step), look for our `data` label
# and compare it with the `forward` and `backward` labels: the cell below prints each stage's time
# per step and which one was largest in this run. The DataLoader labels its own work too (the
# `enumerate(DataLoader)#...__next__` row).
# What the data stage spends its time on shows in the same table's *# of Calls* column, for the normalisation's `aten::sub` and
# `aten::div` (the eight rows printed may not reach them; the cell below reads them out): they run once
# per **sample**, not once per batch, and `aten::stack` glues the results back together (twice per
# step: once for the images, once for the labels). Each of those calls does very little arithmetic,
# so much of what we pay may be the fixed cost of a call (the Python around it, which the DataLoader's
# row shows as its self time, and inside the operator the dispatcher and a new output tensor), over
# and over: after the fix, the cell further down compares 128 small divisions with one division of
# the whole batch and prints how much of the division time that fixed cost is.

# %%
slow_by_key = {e.key: e for e in slow_table}
LABELS = ["data", "forward", "backward", "optimizer"]
for label in LABELS:
    print(f"{label:9s} {slow_by_key[label].cpu_time_total / 1e3 / PROFILED_STEPS:7.2f} ms per step")
step_ms = slow_by_key["ProfilerStep*"].cpu_time_total / 1e3 / PROFILED_STEPS
data_share = slow_by_key["data"].cpu_time_total / slow_by_key["ProfilerStep*"].cpu_time_total
print(f"the data stage is {100 * data_share:.0f}% of a {step_ms:.2f} ms step")
# Times move with the machine's load, so which stage is largest is a verdict for this run; the
# per-sample calls counted below are the structural fact that does not move.
stage_ms = {k: slow_by_key[k].cpu_time_total / 1e3 / PROFILED_STEPS for k in LABELS}
largest, runner_up = sorted(LABELS, key=stage_ms.get, reverse=True)[:2]
if bench.band_verdict(stage_ms[largest], stage_ms[runner_up], band=0.1) == "no clear difference":
    print(f"largest stages in this run: {largest} and {runner_up}, within 10% of each other "
          f"({stage_ms[largest]:.2f} and {stage_ms[runner_up]:.2f} ms per step)")
else:
    print(f"largest stage in this run: {largest} ({stage_ms[largest]:.2f} ms per step)")
profile_load = threads.other_load()  # other programs' CPU use, sampled just after the profile
if profile_load is not None and profile_load >= threads.BUSY_CORES:
    print(f"other programs used about {profile_load:.1f} of {threads.usable_cores()} cores just after this profile: "
          "load stretches each stage by a different amount, so the ranking may differ on a quiet machine")
div_per_step = slow_by_key["aten::div"].count / PROFILED_STEPS
assert div_per_step >= LOOP_BATCH, "one division per sample"
print(f"aten::div runs {div_per_step:.0f} times per step, once per sample of a {LOOP_BATCH}-sample batch")
for key in ("aten::sub", "aten::div", "aten::stack"):
    print(f"  {key:<12} # of calls: {slow_by_key[key].count:>5}  ({slow_by_key[key].count / PROFILED_STEPS:.0f} per step)")


# %% [markdown]
# **The fix:** normalise a whole batch in one operation. The dataset below accepts a batch of
# indices at once: a `BatchSampler` hands it a *list* of 128 indices (the check below indexes with
# a tensor of indices, which works too), and `batch_size=None` tells the
# `DataLoader` not to collate (the dataset already returns a batch). Same data, same shuffling
# scheme, one `sub` and one `div` per batch.

# %%
class BatchedDigits(PerSampleDigits):
    """Same data, but __getitem__ takes a list (or tensor) of indices and normalises the batch at once."""

    def __getitem__(self, idx):
        return (self.x[idx] - MEAN) / STD, self.y[idx]


def fast_loader() -> DataLoader:
    ds = BatchedDigits(split.x_train, split.y_train)
    return DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), LOOP_BATCH, drop_last=True),
                      batch_size=None)


# Same samples, same values: the fix changes the speed, not the data.
some = torch.arange(LOOP_BATCH)
per_sample = torch.stack([PerSampleDigits(split.x_train, split.y_train)[int(i)][0] for i in some])
torch.testing.assert_close(BatchedDigits(split.x_train, split.y_train)[some][0], per_sample)

fast_step = make_step(endless(fast_loader), *fresh_model())
with profile(activities=[ProfilerActivity.CPU],
             schedule=schedule(wait=0, warmup=1, active=PROFILED_STEPS, repeat=1)) as fast_prof:
    for _ in range(1 + PROFILED_STEPS):  # the same warm-up step and window as the slow profile
        fast_step()
        fast_prof.step()
fast_profile_load = threads.other_load()  # other programs' CPU use, sampled just after this profile
fast_by_key = {e.key: e for e in fast_prof.key_averages()}
for label in LABELS:
    print(f"{label:9s} {fast_by_key[label].cpu_time_total / 1e3 / PROFILED_STEPS:7.2f} ms per step")
assert fast_by_key["aten::div"].count == PROFILED_STEPS, "one division per batch"
print(f"aten::div now runs {fast_by_key['aten::div'].count // PROFILED_STEPS} time per step")
# The fixed cost of a call: 128 divisions of one sample each against one division of 128 samples.
slow_div, fast_div = slow_by_key["aten::div"], fast_by_key["aten::div"]
per_call_us = {"per sample": slow_div.cpu_time_total / slow_div.count,
               "whole batch": fast_div.cpu_time_total / fast_div.count}
print(f"aten::div per call: {per_call_us['per sample']:.1f} us for one sample, "
      f"{per_call_us['whole batch']:.1f} us for {LOOP_BATCH} samples; per step: "
      f"{slow_div.cpu_time_total / PROFILED_STEPS / 1e3:.2f} ms before, "
      f"{fast_div.cpu_time_total / PROFILED_STEPS / 1e3:.2f} ms after")
calls_worth = per_call_us["whole batch"] / per_call_us["per sample"]
# A mean over a handful of profiled calls: one interruption can stretch it, so this is a reading, not a law.
if calls_worth < LOOP_BATCH:
    print(f"one call on {LOOP_BATCH} samples costs what {calls_worth:.1f} one-sample calls cost, so at least about "
          f"{1 - calls_worth / LOOP_BATCH:.0%} of the per-sample path's division time went into the fixed cost of "
          "each call (dispatch, a new output tensor, and the profiler's own record of it), not into arithmetic")
else:
    print(f"in this profile one call on {LOOP_BATCH} samples took as long as {calls_worth:.0f} one-sample calls: "
          f"its mean rests on {fast_div.count} calls, and something else slowed them; rerun the cell")
fast_step_ms = fast_by_key["ProfilerStep*"].cpu_time_total / 1e3 / PROFILED_STEPS

# %% [markdown]
# The profile gives the data stage's time per step after the fix; `bench.compare` measures what
# the fix is worth for a whole training step (fetch, forward, backward, update), timed side by side.

# %%
step_table = bench.compare({"per-sample data": slow_step, "batched data": fast_step})
print(step_table)
speedup = step_table.speedup("batched data")
bench.record("profile.bottleneck.speedup", speedup, "x", batch=LOOP_BATCH, model="MLP(64,256,10)")
data_said = step_table.describe("batched data", "per-sample data", name="profile.data_path.batched_vs_per_sample")
data_ms = {name: by_key["data"].cpu_time_total / 1e3 / PROFILED_STEPS
           for name, by_key in (("per-sample", slow_by_key), ("batched", fast_by_key))}
profiled_data = (f"the profiles put the data stage at {data_ms['per-sample']:.2f} ms per step before the fix and "
                 f"{data_ms['batched']:.2f} ms after, with aten::div down from {div_per_step:.0f} calls per step to 1")
print(f"verdict: the batched data path is {data_said} "
      f"({step_table.row('per-sample data').median_s * 1e3:.2f} ms -> {step_table.row('batched data').median_s * 1e3:.2f} "
      "ms per step): " + {
          "faster": profiled_data + ", the calls removed above",
          "no clear difference": profiled_data + ", yet that saving did not show outside the two steps' timing spread "
                                 "in this run",
          "slower": profiled_data + ", yet the whole step was slower; this cell does not measure why"}[
          step_table.verdict("batched data", "per-sample data")])
unprofiled_ms = step_table.row("per-sample data").median_s * 1e3
profiled_word = bench.band_verdict(step_ms, unprofiled_ms, band=0.1)
# If the profiler's cost were a fixed amount per event it records, the time it *added* to each step (not ratios)
# would follow the events: the model stages, the same events in both profiles, test that assumption.
fast_unprofiled_ms = step_table.row("batched data").median_s * 1e3
added_ms = {"per-sample": step_ms - unprofiled_ms, "batched": fast_step_ms - fast_unprofiled_ms}
events_per_step = {name: sum(e.count for e in by_key.values()) / PROFILED_STEPS
                   for name, by_key in (("per-sample", slow_by_key), ("batched", fast_by_key))}
extra_events = events_per_step["per-sample"] - events_per_step["batched"]
# The model stages run the same model on the same batch size in both profiles, so they record the same events:
# if they took clearly different times, the profiled windows differed for another reason.
MODEL_STAGES = ("forward", "backward", "optimizer")
model_ms = {name: sum(by_key[k].cpu_time_total for k in MODEL_STAGES) / 1e3 / PROFILED_STEPS
            for name, by_key in (("per-sample", slow_by_key), ("batched", fast_by_key))}
model_word = bench.band_verdict(model_ms["per-sample"], model_ms["batched"], band=0.1)
model_ops = [k for k in ("aten::addmm", "aten::mm") if k in slow_by_key and k in fast_by_key]  # the layers' products
assert all(slow_by_key[k].count == fast_by_key[k].count for k in model_ops), "the model stages differ between the profiles"
model_text = f"({model_ms['per-sample']:.2f} against {model_ms['batched']:.2f} ms per step, per-sample profile first)"
# "gained more": by more than a tenth of the per-sample step's unprofiled time and more than the two unprofiled
# steps' timing spreads (IQRs) together; a smaller gap is read as no difference
spreads_ms = sum(step_table.row(label).iqr_s * 1e3 for label in ("per-sample data", "batched data"))
gained_more = added_ms["per-sample"] - added_ms["batched"] > max(0.1 * unprofiled_ms, spreads_ms)


def added_text(ms: float) -> str:
    """The time the profiler added to a step; below zero it is the two timings' noise, not a saving."""
    return f"{ms:+.2f} ms" if ms >= 0 else f"nothing measurable ({ms:+.2f} ms, the two timings' noise)"


if profiled_word != "higher":
    why = ("the per-sample step was not clearly slower under the profiler (10% band), so this run cannot tie the "
           f"profiler's cost to the {extra_events:,.0f} more events it records per step")
    if model_word != "no clear difference":
        slower = "batched" if model_word == "lower" else "per-sample"
        why += (f"; the model stages, which record the same events in both paths, took clearly longer in the {slower} "
                f"profile {model_text}, so the two profiled runs ran at different speeds for a reason other than the "
                "number of their events; this cell does not measure which")
elif gained_more and model_word == "higher":
    why = ("the per-sample step gained more, yet the model stages, which record the same events in both paths, also "
           f"took longer in the per-sample profile {model_text}, so part of the difference lies in stages the number "
           "of events does not explain; this cell does not measure why they differ (the per-sample profile always "
           "runs first, and a profiler holding more events may also cost more per event: either could matter)")
elif gained_more:
    gap_ms = added_ms["per-sample"] - added_ms["batched"]
    why = ("the model stages, which record the same events in both paths, "
           + ("took about the same time in both profiles" if model_word == "no clear difference" else
              "were even faster in the per-sample profile") + f" {model_text}, so the extra {gap_ms:.2f} ms lies "
           f"where the per-sample path records about {extra_events:,.0f} more events per step (about "
           f"{1e3 * gap_ms / max(extra_events, 1):.1f} us each): the profiler adds a cost to every event it records")
elif model_word != "no clear difference":
    slower = "batched" if model_word == "lower" else "per-sample"
    why = (f"the model stages, which record the same events in both paths, took clearly longer in the {slower} "
           f"profile {model_text}, so the two added times cannot be compared in this run; this cell does not measure "
           "why the model stages differ (the per-sample profile always runs first, and a profiler holding more events "
           "may also cost more per event: either could matter)")
else:
    gap_ms = added_ms["per-sample"] - added_ms["batched"]
    why = (f"the per-sample step, with about {extra_events:,.0f} more events per step, did not gain clearly more than the "
           f"batched one ({gap_ms:+.2f} ms, not more than the larger of the two unprofiled steps' spreads together, "
           f"{spreads_ms:.2f} ms, and a tenth of the per-sample step, {0.1 * unprofiled_ms:.2f} ms), and the model "
           f"stages took about the same time in both profiles {model_text}, "
           "so this run cannot tie the profiler's cost to the number of events; this cell does not measure what "
           "slowed both steps")
    profile_loads = [x for x in (profile_load, fast_profile_load) if x is not None]
    if profile_loads and max(profile_loads) >= threads.BUSY_CORES:
        why += (f" (other programs used about {max(profile_loads):.1f} of {threads.usable_cores()} cores just after "
                "the profiles, which can stretch a short profiled window)")
print(f"\nthe profiler's own cost: the per-sample step took {step_ms:.2f} ms under the profiler and {unprofiled_ms:.2f} "
      f"ms without it ({profiled_word} under the profiler, 10% band)")
print(f"it added {added_text(added_ms['per-sample'])} to the per-sample step ({events_per_step['per-sample']:,.0f} events "
      f"per step) and {added_text(added_ms['batched'])} to the batched one ({fast_step_ms:.2f} ms profiled against "
      f"{fast_unprofiled_ms:.2f} ms, {events_per_step['batched']:,.0f} events)")
print(f"so: {why}; bench.compare, not the profile, gives a step's real cost")
bench.bar_chart(step_table, title="one training step, before and after the fix");

# %% [markdown]
# How much such a fix pays depends on how big the data path is next to the model: with a large
# model the same per-sample loop would be a small slice of the step (profile first, then decide).
# Moving per-sample work into `DataLoader` workers (`num_workers > 0`) hides it behind the
# training step instead of removing it, and only when a spare core can run the workers (on a busy
# 2-core laptop they compete with the step); batching removes it.
#
# ### Why `.item()` in the loop matters mostly on a GPU
#
# A classic pitfall is `running_loss += loss.item()` on every step. On a GPU, kernels are queued
# *asynchronously*: the Python loop runs ahead of the GPU, and `.item()` (like `print(loss)`,
# `.cpu()` or `if loss > x`) forces the host to wait until the queue has drained, so the next step's
# kernels are not queued in time and the GPU idles. On a CPU, every operator has already finished
# when it returns, so `.item()` only copies one number, with no queue to wait for, and the profiler
# has no wait to point at. Keep the running loss as a tensor (`running_loss += loss.detach()`) and call
# `.item()` once per epoch or per log line; the GPU cell below shows what to look for.
#
# ## GPU extras: kernels and the gaps between them
#
# On a GPU, add `ProfilerActivity.CUDA`: the table gains *Self CUDA* columns with the time of each
# kernel on the device, and the trace gains a GPU row with one event per kernel (category
# `kernel`). Gaps between consecutive kernels are time the GPU sat idle waiting for the host to
# launch the next one: the signature of launch overhead, of a `.item()` sync, or of a slow data path.

# %%
if requires_cuda("CUDA kernel rows and the idle gaps between kernel launches"):
    gpu_model = MLP(64, 256, 10).cuda()
    gpu_opt = torch.optim.SGD(gpu_model.parameters(), lr=0.05)
    gx, gy = xb.cuda(), yb.cuda()
    for _ in range(3):
        train_step(gpu_model, gpu_opt, gx, gy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as gpu_prof:
        for _ in range(5):
            loss = train_step(gpu_model, gpu_opt, gx, gy)
            loss.item()  # a host sync every step, on purpose
        torch.cuda.synchronize()
    print(gpu_prof.key_averages().table(sort_by="self_device_time_total", row_limit=8))
    gpu_trace = TRACE_DIR / "gpu_steps.json"
    gpu_prof.export_chrome_trace(str(gpu_trace))
    kernels = [e for e in load_events(gpu_trace) if e.get("cat") == "kernel"]
    assert len(kernels) >= 10, f"five training steps should launch many CUDA kernels, the trace has {len(kernels)}"
    gaps_us = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(kernels, kernels[1:])]
    busy_us = sum(k["dur"] for k in kernels)
    span_us = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    print(f"{len(kernels)} kernels; the GPU was busy {100 * busy_us / span_us:.0f}% of the span; "
          f"median gap between kernels {sorted(gaps_us)[len(gaps_us) // 2]:.1f} us, "
          f"largest {max(gaps_us):.1f} us")
    busy_share = busy_us / span_us
    print("verdict for this GPU: " + ("launch-bound: the GPU sat idle more than it computed, waiting for the host "
                                       "(fuse kernels, capture a CUDA graph, drop the .item() sync)"
                                       if busy_share < 0.5 else
                                       "mostly busy: the kernels, not their launches, set the pace here"))


# %% [markdown]
# ## Check yourself
#
# **Exercise 1.** Write `top_self_op(prof)` that takes a finished `torch.profiler.profile` object and
# returns the name (a string) of the operator with the largest **self** CPU time. The checker
# profiles two small workloads of its own, each wrapped in a `record_function` label, and compares
# your answer with the right operator for each; it also passes two small hand-made tables, which
# offer `key_averages()` and `events()` and, on each row, `.key`, `.self_cpu_time_total`,
# `.cpu_time_total` and `.count` (what a real profile's rows have too), so use only those.

# %%
def top_self_op(prof) -> str:
    # Your code here: look at prof.key_averages().
    return ""


exercises.check("09.top_self_op", top_self_op)


# %% [markdown]
# **Exercise 2.** Write `count_aten_events(trace)` that takes a Chrome trace already loaded with
# `json.load` (a dict with a `"traceEvents"` list) and returns how many complete events
# (`"ph": "X"`) are `aten::` operators. It is the count this notebook used to compare eager and
# compiled code. Once it passes, the next cell applies it to the two traces written above.
# Stuck? `print(exercises.solution_source("09.count_aten_events"))` shows a reference solution:
# try for yourself first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
def count_aten_events(trace: dict) -> int:
    # Your code here.
    return -1


exercises.check("09.count_aten_events", count_aten_events)

# %%
if exercises.check("09.count_aten_events", count_aten_events):
    for name in ["forward_eager.json", "forward_compiled.json"]:
        trace = json.loads((TRACE_DIR / name).read_text())
        print(f"{name}: {count_aten_events(trace)} aten:: events")
else:
    print("solve Exercise 2 to count the events of this notebook's traces")

# %% [markdown]
# ## Summary
#
# - `torch.profiler.profile` records every operator; `key_averages()` aggregates them. Sort by
#   **self** time to find the operators doing the work, by **total** time to find the expensive
#   stages; `record_function` labels your own stages, `record_shapes` +
#   `group_by_input_shape` tells calls apart by shape, `with_stack` names the functions (each with the
#   line of its `def`) and the modules on the stack.
# - A `schedule(wait, warmup, active, repeat)` profiles a window of a training loop; `on_trace_ready`
#   receives each finished window. Traces are JSON: open them in Perfetto, or draw them with
#   matplotlib as this notebook does.
# - `profile_memory=True` shows what each operator allocates; CUDA memory snapshots go further on a GPU.
# - A compiled model shows up as a `Torch-Compiled Region` with fewer `aten::` events: the fused
#   code runs inside one generated call, and only extern calls (convolutions, matrix multiplies)
#   remain visible, with the operators nested inside them; the guard checks are a `TorchDynamo Cache
#   Lookup` event just before the region.
# - Profile before you optimise: here the profile pointed at the data path's per-sample calls
#   (counted, once per sample), batching the preprocessing removed them, and the verdict says what
#   that was worth for a whole step on your machine. On a GPU, look for gaps between kernels and
#   for host syncs such as `.item()` in the loop.
#
# ## Further reading
#
# - [PyTorch Profiler recipe](https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html) (official tutorial)
# - [`torch.profiler` API reference](https://pytorch.org/docs/stable/profiler.html)
# - [Profiling `torch.compile`](https://pytorch.org/docs/stable/torch.compiler_profiling_torch_compile.html)
# - [Understanding CUDA memory usage](https://pytorch.org/docs/stable/torch_cuda_memory.html) (memory snapshots)
# - [Perfetto UI](https://ui.perfetto.dev) and its [documentation](https://perfetto.dev/docs/)
