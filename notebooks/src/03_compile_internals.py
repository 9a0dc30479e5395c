# %% [markdown]
# # 03 · Inside `torch.compile`: Dynamo, AOTAutograd and Inductor
#
# `torch.compile` is one call, but three programs run behind it. When compiling is slow, gives a
# different answer, or does not make your model faster, the useful question is *which* of the three
# to look at, and the useful skill is reading what each one produced. This notebook follows one small
# function through the whole stack and prints every intermediate result: the graph TorchDynamo
# captures, the forward and backward graphs AOTAutograd derives, the smaller operators the graph is
# decomposed into, and the C++ that TorchInductor writes, compiles and runs. Then it counts what
# fusion saved.

# %% [markdown]
# ## What you will learn
#
# - how to write a **custom backend** and read the FX graph TorchDynamo hands it (`gm.code`,
#   `gm.graph`, `gm.graph.print_tabular()`), and when the backend is called again;
# - what **AOTAutograd** adds: ATen-level forward and backward graphs, the tensors saved for the
#   backward, in-place operations removed, and the boxed calling convention its compilers must follow;
# - what **decompositions** are: ATen, the Core ATen operator set, Inductor's own decomposition table
#   and PrimTorch's prims, shown on `gelu`, `layer_norm` and `softmax`;
# - how to read the **C++ Inductor generates**, find the fused loop, and open the debug trace folder;
# - how many kernels eager PyTorch runs against how many Inductor generates, the bytes each moves,
#   and where fusion stops (matrix multiplies).
#
# **Prerequisites:** notebooks 00 and 01 (`torch.compile` basics); 02 (graph breaks) helps.
#
# **Time on a laptop CPU:** <!-- stamp:time -->0.3 min the first time (every cache empty), 0.4 min after that (compile cache warm, yet no faster in these two runs), 0.2 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time -->
#
# **GPU:** not needed. One cell shows the Triton kernel Inductor writes for a GPU and says it
# skipped otherwise.

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
import collections
import contextlib
import io
import logging
from collections.abc import Callable
from pathlib import Path
import re
import shutil
import warnings

import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.decomposition import select_decomp_table
from torch._prims.context import TorchRefsMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils import bench, config, exercises, session
from course_utils.device import accelerator, requires_accelerator
from course_utils.inductor_code import fused_kernels, generated_code, kernel_source, library_calls, scalar_note, wrapper_call
from course_utils.text import counted

print(session.start(seed=0))


# %% [markdown]
# ## The stack, and the function we follow through it
#
# When you call a function compiled with `torch.compile(fn)`:
#
# 1. **TorchDynamo** reads `fn`'s Python bytecode as it runs, records the tensor operations into an
#    **FX graph** (a list of operations, one node each), and installs *guards*: checks on the inputs
#    that decide whether the graph can be reused next time. Anything it cannot record becomes a graph
#    break (notebook 02).
# 2. Dynamo hands each graph to a **backend**: any callable `backend(gm, example_inputs)` that returns
#    a function to run instead. `"inductor"` is the default backend; `"eager"` and `"aot_eager"` are
#    others, and you can write your own.
# 3. Inside the Inductor backend, **AOTAutograd** re-traces the graph down to ATen, PyTorch's C++
#    operator library: it derives the backward graph ahead of time, removes in-place operations and
#    applies decompositions. It calls a compiler on the forward graph and on the backward graph.
# 4. **TorchInductor** is that compiler: it lowers ATen operations to loops, fuses loops that can share
#    a pass over memory, writes C++/OpenMP for the CPU (Triton for GPUs) and compiles it.
#
# Many descriptions draw AOTAutograd as a branch *beside*
# Inductor. It is a step *inside* the backend, run on every graph Dynamo produces; the cells below show
# each handoff. The function we follow is the core of a transformer's pre-norm residual branch:
# a LayerNorm, then GELU, scaled and added back to the input.

# %%
def norm_gelu_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    h = F.layer_norm(x, x.shape[-1:], weight, bias)
    return x + 0.5 * F.gelu(h)


ROWS, DIM = config.pick(quick=(256, 256), full=(4096, 1024))
x = torch.randn(ROWS, DIM)
weight = torch.randn(DIM)
bias = torch.randn(DIM)
expected = norm_gelu_residual(x, weight, bias)
print(f"mode: {config.mode_name()}; x is {ROWS} x {DIM} float32 ({x.numel() * 4 / 2**20:.1f} MiB)")

# %% [markdown]
# ## Stage 1 · TorchDynamo: from bytecode to an FX graph
#
# A backend receives a `torch.fx.GraphModule` (`gm`) and example inputs, and must return something
# callable with the same inputs. The one below prints the graph three ways and then returns
# `gm.forward`, which runs the captured graph as it is: that is all the built-in `"eager"` backend does.
#
# - `gm.code` is the graph as Python source;
# - `gm.graph` is the graph itself: you iterate over `gm.graph.nodes`;
# - `gm.graph.print_tabular()` lists each node's kind (`op`), name, target and arguments.

# %%
dynamo_graphs: list[torch.fx.GraphModule] = []


def show_graph_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    dynamo_graphs.append(gm)
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    print(f"backend call #{len(dynamo_graphs)}: example input shapes {shapes}")
    print(gm.code.strip())
    print()
    gm.graph.print_tabular()
    return gm.forward  # run the captured graph unchanged


torch._dynamo.reset()
shown = torch.compile(norm_gelu_residual, backend=show_graph_backend)
out = shown(x, weight, bias)
# The graph runs exactly the operations eager runs, in the same order: identical results.
torch.testing.assert_close(out, expected, rtol=0, atol=0)
print("\nresult identical to eager (rtol=0, atol=0)")

# %% [markdown]
# What to notice:
#
# - The graph's **inputs** (`placeholder` nodes) are the three tensors; the **operations**
#   (`call_function` nodes) are the four *torch-level* calls of the source: `layer_norm`, `gelu`,
#   the multiply and the add. Dynamo records Python-level calls; it does not yet know how they
#   run in C++.
# - The normalised shape `x.shape[-1:]` became the constant `(DIM,)`: Dynamo ran the Python that
#   computed it and baked the value in. A guard now checks the input shape on every call.
#
# The backend runs at **compile time**, not on every call. Call the compiled function a few more
# times, then with a different number of rows:

# %%
for _ in range(3):
    shown(x, weight, bias)
print(f"after 3 more calls with the same shapes: backend called {counted(len(dynamo_graphs), 'time')} in all")
assert len(dynamo_graphs) == 1

print()
half = x[: ROWS // 2]
torch.testing.assert_close(shown(half, weight, bias), norm_gelu_residual(half, weight, bias), rtol=0, atol=0)
assert len(dynamo_graphs) == 2, "a new shape fails a guard: Dynamo recompiles"
assert "SymInt" in dynamo_graphs[1].code, "the second graph should take the row count as a symbol"
print("\nthe new shape failed a guard, so Dynamo captured the function again: this time the row count "
      "is a symbol (a SymInt input), so any other number of rows (except 0 and 1, which Dynamo "
      "specialises) reuses this graph")

quarter = x[: ROWS // 4]
torch.testing.assert_close(shown(quarter, weight, bias), norm_gelu_residual(quarter, weight, bias), rtol=0, atol=0)
assert len(dynamo_graphs) == 2, "another row count should reuse the dynamic graph"
with contextlib.redirect_stdout(io.StringIO()):  # the backend would print the whole graph again; count it instead
    one_row = x[:1]
    torch.testing.assert_close(shown(one_row, weight, bias), norm_gelu_residual(one_row, weight, bias),
                               rtol=0, atol=0)
assert len(dynamo_graphs) == 3, "a single row should be specialised: Dynamo captures once more"
print(f"{ROWS // 4} rows: no new capture (the dynamic graph was reused); 1 row: a third capture, "
      f"specialised to one row (backend called {len(dynamo_graphs)} times in all)")


# %% [markdown]
# The second graph is *dynamic* in its first dimension: after one recompile for a changed size,
# Dynamo assumes that size varies and marks it symbolic (notebook 02 covers guards and dynamic shapes).
# The last dimension stayed a constant because it never changed.
#
# Python control flow is run by Dynamo, not recorded: a loop over a tuple is unrolled into the graph,
# and its Python values become constants.

# %%
def tanh_ladder(x: torch.Tensor) -> torch.Tensor:
    for scale in (1.0, 2.0, 3.0):
        x = torch.tanh(x) * scale
    return x


loop_graphs: list[torch.fx.GraphModule] = []


def collect_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    loop_graphs.append(gm)
    return gm.forward


torch._dynamo.reset()
small = torch.randn(4, 4)
torch.testing.assert_close(torch.compile(tanh_ladder, backend=collect_backend)(small), tanh_ladder(small),
                           rtol=0, atol=0)
print(loop_graphs[0].code.strip())
tanh_nodes = [n for n in loop_graphs[0].graph.nodes if n.target is torch.tanh]
assert len(tanh_nodes) == 3, "the loop ran three times while tracing: three tanh nodes"
print(f"\n{len(tanh_nodes)} tanh nodes: the Python loop was unrolled while tracing")

# %% [markdown]
# Modules work the same way. Dynamo inlines `forward` and lifts the parameters to graph
# inputs, so a `LayerNorm` module's weight and bias appear as placeholders next to `x`
# (older PyTorch releases kept a `call_module` node or `get_attr` nodes instead). A graph break
# (notebook 02) shows up here as **several calls** to the backend, one graph each.

# %%
torch._dynamo.reset()
loop_graphs.clear()
norm = torch.nn.LayerNorm(DIM)
torch.compile(norm, backend=collect_backend)(small @ torch.zeros(4, DIM))
placeholders = [n.target for n in loop_graphs[0].graph.nodes if n.op == "placeholder"]
print("inputs of the module's graph:", placeholders)
assert len(placeholders) == 3, "x, the weight and the bias"


def with_a_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()  # stands in for anything Dynamo cannot trace
    return torch.cos(y) * y


loop_graphs.clear()
torch.testing.assert_close(torch.compile(with_a_break, backend=collect_backend)(small), with_a_break(small),
                           rtol=0, atol=0)
assert len(loop_graphs) == 2
print(f"one graph break: the backend was called {len(loop_graphs)} times, once per graph")

# %% [markdown]
# ## Stage 2 · AOTAutograd: ATen graphs for the forward and the backward
#
# `aot_autograd(fw_compiler=..., bw_compiler=...)` turns two *graph compilers* into a Dynamo
# backend. It traces the Dynamo graph again, this time through PyTorch's dispatcher and autograd,
# and gives each compiler a graph of **ATen operators** (`torch.ops.aten.*`): one for the forward,
# one for the backward. The built-in `"aot_eager"` backend is this with compilers that run the graphs
# unchanged (a debugging aid); the Inductor backend calls `aot_autograd` with Inductor's compilers,
# its decomposition table and a partitioner of its own.
#
# AOTAutograd calls the functions its compilers return with all inputs in **one list**, which the
# function may empty as it goes so that inputs it no longer needs are freed early (the *boxed*
# calling convention; Inductor's generated `call(self, args)` below does `args.clear()`). A compiler
# therefore returns `make_boxed_func(gm.forward)`, not `gm.forward`.
#
# The weight and bias now require gradients, so AOTAutograd builds a training graph pair.

# %%
aot_graphs: dict[str, torch.fx.GraphModule] = {}


def forward_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    aot_graphs["forward"] = gm
    return make_boxed_func(gm.forward)


def backward_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    aot_graphs["backward"] = gm
    return make_boxed_func(gm.forward)


show_aot_backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)

torch._dynamo.reset()
w_train = weight.clone().requires_grad_()
b_train = bias.clone().requires_grad_()
out = torch.compile(norm_gelu_residual, backend=show_aot_backend)(x, w_train, b_train)
backward_after_forward = "backward" in aot_graphs
print("FORWARD graph:")
print(aot_graphs["forward"].code.strip())

# %%
grad_out = torch.randn_like(out)
out.backward(grad_out)
print(f"backward graph compiled during the forward call? {backward_after_forward}; "
      f"after .backward()? {'backward' in aot_graphs}")
print("\nBACKWARD graph:")
print(aot_graphs["backward"].code.strip())

# Same gradients as eager autograd (the graphs run the same ATen kernels).
w_ref = weight.clone().requires_grad_()
b_ref = bias.clone().requires_grad_()
norm_gelu_residual(x, w_ref, b_ref).backward(grad_out)
torch.testing.assert_close(w_train.grad, w_ref.grad, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(b_train.grad, b_ref.grad, rtol=1e-5, atol=1e-5)
print("\ngradients match eager autograd within rtol=1e-5, atol=1e-5")

fw_outputs = next(n for n in aot_graphs["forward"].graph.nodes if n.op == "output").args[0]
bw_inputs = [n.name for n in aot_graphs["backward"].graph.nodes if n.op == "placeholder"]
print(f"the forward returns {len(fw_outputs)} values: the result, then {len(fw_outputs) - 1} "
      "saved for the backward;")
print(f"the backward's inputs are those saved values plus the incoming gradient: {bw_inputs}")
assert bw_inputs[-1].startswith("tangents"), "the last backward input is the output's gradient"
assert len(bw_inputs) == len(fw_outputs), 'saved values + one gradient'


# %% [markdown]
# What changed from Dynamo's graph:
#
# - The operations are now ATen operators with their overload (`aten.native_layer_norm.default`,
#   `aten.gelu.default`). `F.layer_norm` became `native_layer_norm`, which also returns the mean and
#   the reciprocal standard deviation, because the backward needs them.
# - The forward graph **returns extra values**: everything the backward will need (inputs and
#   intermediate results). This is the autograd "saved tensors" made explicit, and a compiler can
#   choose to save less and recompute instead (Inductor uses a min-cut partitioner for that).
# - The backward graph (`gelu_backward`, `native_layer_norm_backward`) was derived ahead of time;
#   the cell printed when its compiler actually ran.
#
# **In-place operations disappear.** Compilers want pure functions, so AOTAutograd *functionalises*
# the graph: `y.mul_(2)` becomes `mul`, and a mutation of an *input* becomes an extra output that a
# small wrapper copies back into the input after the graph runs. With no input requiring gradients,
# AOTAutograd builds a single inference graph, and the backward compiler is never called.

# %%
def scale_and_count(x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.mul_(2)          # in-place on a temporary
    counter.add_(1)    # in-place on an input: a visible side effect
    return y


torch._dynamo.reset()
aot_graphs.clear()
counter = torch.zeros(1)
y = torch.compile(scale_and_count, backend=show_aot_backend)(small, counter)
print(aot_graphs["forward"].code.strip())

aten_targets = [n.target for n in aot_graphs["forward"].graph.nodes if n.op == "call_function"]
mutating = [str(t) for t in aten_targets if t._schema.is_mutable]
assert not mutating, f"in-place ops left in the graph: {mutating}"
assert "backward" not in aot_graphs, "inference: no backward graph"
torch.testing.assert_close(y, small * 2, rtol=0, atol=0)
assert counter.item() == 1.0, "the input was still updated, by the wrapper"
print(f"\nno in-place operator left in the graph; counter = {counter.item():.0f}, as in eager; "
      f"graphs compiled: {sorted(aot_graphs)}")


# %% [markdown]
# **Pitfall: an unboxed compiler.** A common way to write AOTAutograd compilers
# returns `gm.forward` directly. In the installed PyTorch that still gives the right results, but
# the backward then goes through an adapter, and the first `.backward()` warns about it:

# %%
def unboxed_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward  # should be make_boxed_func(gm.forward)


torch._dynamo.reset()
w_unboxed = weight.clone().requires_grad_()
unboxed_backend = aot_autograd(fw_compiler=unboxed_compiler, bw_compiler=unboxed_compiler)
with warnings.catch_warnings(record=True) as forward_caught:  # the forward call, compile included
    warnings.simplefilter("always")
    result = torch.compile(norm_gelu_residual, backend=unboxed_backend)(x, w_unboxed, bias)
with warnings.catch_warnings(record=True) as caught:  # the first .backward() alone
    warnings.simplefilter("always")
    result.backward(grad_out)
torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(w_unboxed.grad, w_ref.grad, rtol=1e-5, atol=1e-5)
assert not [w for w in forward_caught if "boxed" in str(w.message)], "the forward should not warn"
messages = [str(w.message) for w in caught if "boxed" in str(w.message)]
assert messages, "expected the warning about boxed arguments from the backward"
print("forward: no warning; first .backward():")
print("UserWarning:", messages[0].split(". See")[0] + ".")


# %% [markdown]
# ## Decompositions: ATen, Core ATen, Inductor's table and PrimTorch prims
#
# ATen has thousands of operator overloads (counted below). A compiler cannot implement them all, so PyTorch keeps
# **decompositions**: Python definitions of bigger operators in terms of smaller ones, applied while
# tracing. There are several levels, and which one a graph is at is a choice of the backend:
#
# - **ATen as dispatched**: what eager runs (`make_fx` traces it);
# - **Core ATen**: a smaller set of operators tagged `core`, the target of `torch.export` and of
#   `core_aten_decompositions()`. Common fused operators such as `gelu` are themselves *core*;
# - **Inductor's table** (`select_decomp_table()`): Inductor decomposes much further, into the
#   pointwise operations and reductions its loop generator handles;
# - **PrimTorch prims** (`torch.ops.prims`): the smallest set, where even broadcasting is an explicit
#   `broadcast_in_dim`. The Python reference implementations (`torch._refs`) trace to this level.
#
# The cell traces `gelu`, `layer_norm` and `softmax` at each level.

# %%
def gelu_fn(x):
    return F.gelu(x)


def layer_norm_fn(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def softmax_fn(x):
    return torch.softmax(x, dim=-1)


def op_names(gm: torch.fx.GraphModule) -> list[str]:
    "Return 'namespace.op' for every operator a traced graph calls (getitem unpacking left out)."
    return [n.target._schema.name.replace("::", ".") for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def trace_prims(fn, *args):
    with TorchRefsMode():  # route torch calls through torch._refs, which call prims
        return make_fx(fn)(*args)


tiny_x, tiny_w, tiny_b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
levels = {
    "ATen as dispatched": lambda fn, *a: make_fx(fn)(*a),
    "Core ATen": lambda fn, *a: make_fx(fn, decomposition_table=core_aten_decompositions())(*a),
    "Inductor's table": lambda fn, *a: make_fx(fn, decomposition_table=select_decomp_table())(*a),
    "PrimTorch prims": trace_prims,
}
cases = {"gelu": (gelu_fn, (tiny_x,)), "layer_norm": (layer_norm_fn, (tiny_x, tiny_w, tiny_b)),
         "softmax": (softmax_fn, (tiny_x,))}
traced = {}
for case, (fn, args) in cases.items():
    print(f"--- {case}")
    for level, tracer in levels.items():
        gm = tracer(fn, *args)
        torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-5, atol=1e-5)
        traced[case, level] = op_names(gm)
        print(f"  {level:<19} {counted(len(traced[case, level]), 'op'):>6}: {', '.join(traced[case, level])}")

for op in (torch.ops.aten.gelu.default, torch.ops.aten.native_layer_norm.default,
           torch.ops.aten._softmax.default):
    assert torch.Tag.core in op.tags  # why Core ATen leaves them alone
print("\nevery decomposed graph matches the original within rtol=1e-5, atol=1e-5")

# %%
registered = torch._C._dispatch_get_all_op_names()  # every operator the dispatcher knows


def overloads(namespace: str) -> list:
    "Return every registered operator overload in a namespace ('aten', 'prims', ...)."
    ops = []
    for full_name in registered:
        if full_name.startswith(namespace + "::"):
            name, _, overload = full_name[len(namespace) + 2:].partition(".")
            ops.append(getattr(getattr(getattr(torch.ops, namespace), name), overload or "default"))
    return ops


aten_overloads = overloads("aten")
counts = {
    "ATen operator overloads": len(aten_overloads),
    "  of which tagged core (Core ATen)": sum(torch.Tag.core in op.tags for op in aten_overloads),
    "prims operators": len(overloads("prims")),
    "operators core_aten_decompositions() decomposes": len(core_aten_decompositions()),
    "operators Inductor's table decomposes": len(select_decomp_table()),
}
for label, n in counts.items():
    print(f"{label:<50} {n:>5}")
print("\nLayerNorm under Inductor's table:")
print(make_fx(layer_norm_fn, decomposition_table=select_decomp_table())(tiny_x, tiny_w, tiny_b).code.strip())


# %% [markdown]
# Two things to take away. First, `gelu`, `layer_norm` and `softmax` are *core* operators, so a
# Core ATen graph (what `torch.export` gives after `run_decompositions()`) still has them whole; it is Inductor that breaks them
# into `mul`, `erf`, `var_mean`, `rsqrt`, `amax`, `exp`, `sum` and `div`, so that it can fuse those
# pieces with their neighbours. Second, the PrimTorch level exists, but Inductor does not go down to
# it: its table stops at ATen operators, as the next section checks on the graph Inductor actually
# receives. (The PyTorch 2.0 launch presented PrimTorch's prims as the small operator set that
# backends would target. In the installed PyTorch they exist, counted above, and serve the reference
# implementations, but the default compiler lowers ATen directly.)
#
# ## Stage 3 · TorchInductor: the graph it lowers and the C++ it writes
#
# One compile, three ways to look inside it:
#
# - `run_and_get_code(fn, *args)` (from `torch._inductor.utils`; a test helper, not a stable API)
#   runs `fn` and returns the Python *output code* Inductor generated, C++ kernels included. It resets
#   Dynamo first, so the compile really happens. This notebook calls it through
#   `course_utils.inductor_code.generated_code`, whose other helpers read the code it returns;
# - `torch._inductor.config.post_grad_custom_post_pass` runs a graph pass of our own on the final ATen
#   graph that Inductor is about to lower: we use it to keep a copy;
# - the **debug trace folder** (`config.trace.enabled`, or `TORCH_COMPILE_DEBUG=1` in the environment)
#   gets the graphs, Inductor's loop-level IR before and after fusion, and the output code as files.
#   Trace files are only written when Inductor really compiles, so the FX graph cache is switched off
#   for this one compile (a cache hit would skip lowering and leave the folder empty).

# %%
class KeepGraph(CustomGraphPass):
    "A post-grad pass that changes nothing and keeps a copy of the graph Inductor will lower."

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(torch.fx.GraphModule(torch.nn.Module(), graph))

    def uuid(self) -> str:  # identifies the pass in Inductor's cache key
        return "course-nb03-keep-graph-v1"


trace_dir = config.build_dir() / "nb03_inductor_trace"
shutil.rmtree(trace_dir, ignore_errors=True)
keep = KeepGraph()
inductor_log = logging.getLogger("torch._inductor.debug")
level = inductor_log.level
inductor_log.setLevel(logging.ERROR)  # silence the "debug trace: <folder>" notice
try:
    with torch._inductor.config.patch({"post_grad_custom_post_pass": keep, "fx_graph_cache": False,
                                       "trace.enabled": True, "trace.debug_dir": str(trace_dir)}):
        compiled_block = torch.compile(norm_gelu_residual)
        out, codes = generated_code(compiled_block, x, weight, bias)
finally:
    inductor_log.setLevel(level)

# LayerNorm's variance and erf are computed in a different order than eager: close, not identical.
torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
max_diff = (out - expected).abs().max().item()
print(f"compiled matches eager within rtol=1e-5, atol=1e-5 (largest difference {max_diff:.1e})")
output_code = codes[0]
print(f"output code: {len(output_code.splitlines())} lines of Python; first line: {output_code.splitlines()[0]}")

# %% [markdown]
# The first line of the output code names the graph `..._inference`: it came out of
# AOTAutograd's inference path, the Inductor backend runs AOTAutograd as stage 2 said.
# Here is the ATen graph Inductor lowered, as our pass saw it:

# %%
lowered = keep.graphs[-1]
lowered_ops = op_names(lowered)
print(lowered.code.strip())
namespaces = collections.Counter(op.split(".")[0] for op in lowered_ops)
print(f"\n{len(lowered_ops)} operators, by namespace: {dict(namespaces)}")
assert namespaces["prims"] == 0 and namespaces["aten"] == len(lowered_ops), "Inductor lowers ATen, not prims"
assert "aten.erf" in lowered_ops and "aten.var_mean" in lowered_ops, "gelu and layer_norm were decomposed"
dynamo_ops = sum(n.op == "call_function" for n in dynamo_graphs[0].graph.nodes)
print(f"Dynamo's {dynamo_ops} torch-level calls became {len(lowered_ops)} ATen operators, all in aten (no prims)")

# %% [markdown]
# Decomposition made the graph *longer*. Inductor then lowers each operator to a loop body,
# inlining pointwise operations into the loops that consume them, and its **scheduler** fuses the
# loops that can share a pass over memory. The trace folder shows both steps:

# %%
files = sorted(p for p in trace_dir.rglob("*") if p.is_file())
for p in files:
    print(f"  {p.relative_to(trace_dir)}  ({p.stat().st_size:,} bytes)")


def scheduler_nodes(ir_text: str) -> list[str]:
    "Return the top-level scheduler nodes in an ir_*_fusion.txt file (fused nodes are named op0_op1_...)."
    names = re.findall(r"^(\w+): \w*SchedulerNode", ir_text, re.M)
    members = {part for name in names if "_op" in name for part in name.split("_")}
    return [name for name in names if name not in members or "_op" in name]


pre_text = next(p for p in files if p.name == "ir_pre_fusion.txt").read_text()
pre = scheduler_nodes(pre_text)
post = scheduler_nodes(next(p for p in files if p.name == "ir_post_fusion.txt").read_text())
sections = {s.split(":")[0]: s for s in re.split(r"^(?=op\d+: )", pre_text, flags=re.M) if s.strip()}
kinds = {name: "reduction" if "ops.reduction" in sections.get(name, "") else "pointwise" for name in pre}
print(f"\nloop nests before fusion: {len(pre)}: " + ", ".join(f"{n} ({k})" for n, k in kinds.items()))
print(f"loop nests after fusion:  {len(post)}: {', '.join(post)}")
assert 1 <= len(post) < len(pre) <= len(lowered_ops)

# %% [markdown]
# Lowering already inlined most pointwise operations into the loops that consume them, leaving a
# handful of loop nests: reductions that sum over each row (for the mean and for the variance) and
# pointwise loops around them. The scheduler then fused them into fewer nodes (the cell's "after fusion"
# line lists them), because they all iterate over the same rows. On the CPU, Inductor writes
# consecutive nodes into one C++ function until a library call cuts it, so there can be fewer
# functions than nodes; the next cells list the functions written here.
# Find it in the output code: kernels are defined as `name = async_compile.cpp_pybinding(...)`,
# library calls appear as `extern_kernels.<name>(...)`, and the `call` function at the end allocates
# the buffers (reusing memory where it can) and runs the kernels in order. Its `args.clear()` is the
# boxed calling convention from stage 2. The helpers from `course_utils.inductor_code` read exactly
# these: `fused_kernels` lists the `async_compile` definitions, `library_calls` the `extern_kernels`
# calls, `wrapper_call` cuts out the `call` function and `kernel_source` one kernel's source.

# %%
kernels = fused_kernels(output_code)
print("C++ kernels:", kernels)
print("library calls:", library_calls(output_code) or "none")
print("\nthe wrapper that runs them:")
print(wrapper_call(output_code))

# %%
src = kernel_source(output_code, kernels[0])
lines = src.splitlines()
sig_start = next(i for i, ln in enumerate(lines) if 'extern "C"' in ln)
sig_end = next(i for i in range(sig_start, len(lines)) if lines[i].rstrip().endswith(")"))
signature = "\n".join(lines[sig_start:sig_end + 1])
print(signature)

# Which parameter is which buffer? Match the kernel's parameters with the arguments the wrapper passes
# (the wrapper names the graph's inputs arg0_1, arg1_1, ... and returns the result buffer).
call_args = re.search(rf"{kernels[0]}\((.*?)\)", wrapper_call(output_code)).group(1).split(", ")
params = re.findall(r"\b(\w*ptr\d+)\b", signature)
pointer = dict(zip(call_args, params))
result_ptr = pointer[re.search(r"return \((\w+),", wrapper_call(output_code)).group(1)]

# The line that writes the result (a vector .store() or a plain assignment), and the innermost loop around it.
store = next(i for i, ln in enumerate(lines)
             if re.search(rf"\.store\({result_ptr}\b|\b{result_ptr}\[[^]]*\] =", ln))
depth = len(lines[store]) - len(lines[store].lstrip())
loop = next(i for i in range(store, sig_end, -1)
            if lines[i].lstrip().startswith("for(") and len(lines[i]) - len(lines[i].lstrip()) < depth)
n_loops = sum("#pragma omp for" in ln for ln in lines)
print(f"... {len(lines)} lines; {counted(n_loops, 'loop')} over the rows split between threads by #pragma omp for"
      if n_loops else f"... {len(lines)} lines and no OpenMP loops (torch uses {torch.get_num_threads()} thread)")
print(f"the innermost loop that writes the result ({result_ptr}); x0 is the row, from the enclosing loop over rows, "
      "x1 the column:\n")
excerpt = lines[loop:store + 1]
indent = min(len(ln) - len(ln.lstrip()) for ln in excerpt if ln.strip())
print("\n".join(ln[indent:] for ln in excerpt))

# %%
# Which pointer is x? The wrapper passes the graph's first input, arg0_1.
x_ptr = pointer["arg0_1"]

loop_text = "\n".join(excerpt)
x_loads = re.findall(rf"auto (tmp\d+) = [^;]*\b{x_ptr}\b", loop_text)
x_uses = len(re.findall(rf"\b{x_loads[0]}\b", loop_text)) - 1 if x_loads else 0
stores = loop_text.count(".store(") + len(re.findall(r"ptr\d+\[[^]]*\] =", loop_text))
temporaries = len(re.findall(r"auto tmp\d+ =", loop_text))
functions = [fn for fn in ("erf", "sqrt", "exp", "tanh") if fn in loop_text]
# Buffers of one number per row that the wrapper allocates for the kernel: the rows' mean and variance.
row_buffers = len(re.findall(rf"empty_strided\w*\(\({ROWS}, 1\)", wrapper_call(output_code)))
vector = re.search(r"Vectorized<float>::loadu\([^;]*?(\d+)\)\);", loop_text)
print(f"x arrives as {x_ptr}. The loop loads it {counted(len(x_loads), 'time')}, as {x_loads[0]}, and uses that value "
      f"{counted(x_uses, 'time')} (normalisation, then the residual add).")
print(f"It stores {counted(stores, 'result')}. The {temporaries} temporaries in between (calling {', '.join(functions)}) "
      "live in local variables (registers, or the stack when there are too many; not tensors): no full-size "
      "intermediate tensor is written to memory"
      + (f" (only the per-row statistics: {counted(row_buffers, 'buffer')} of {ROWS} floats)"
         if row_buffers else "") + ".")
if vector:
    print(f"Loads and stores are SIMD vectors of {vector.group(1)} floats (at::vec::Vectorized), sized for the "
          f"instruction set Inductor targets here (torch's CPU capability: "
          f"{torch.backends.cpu.get_cpu_capability()}).")
else:
    print(f"Loads and stores are single floats: Inductor wrote no vector code here (torch's CPU capability: "
          f"{torch.backends.cpu.get_cpu_capability()}).")
from packaging.version import Version

# The loop layout depends on the instruction set Inductor targets (vector or scalar code) as well as on the torch
# version. These exact checks are kept to torch 2.14 and later; on an older torch the excerpt above can be another loop.
if Version(torch.__version__.split("+")[0]) >= Version("2.14"):
    assert len(x_loads) == 1 and stores == 1 and x_uses >= 2
else:
    assert x_loads and stores >= 1


# %% [markdown]
# That is the fused loop: LayerNorm's normalisation, GELU, the scale and the residual add,
# computed element by element with nothing written to memory in between. (Before it, the kernel
# reads x to compute each row's mean and variance, in loops of their own. How they are laid out
# depends on the instruction set Inductor targets, not only on the torch version: on the same torch
# they can be inner loops of the one row loop (with scalar code, for example) or separate loops over
# all the rows (with vector code). The counting cell below says how many loops over the rows read x
# here, the loop above included. A LayerNorm needs at least one such pass, since every element needs
# its row's statistics first.)
#
# ## Counting: eager kernels against fused kernels
#
# In eager mode every ATen operator is its own kernel: it reads its inputs from memory and writes
# its output back. A `TorchDispatchMode` sees every operator eager PyTorch dispatches; the one below
# counts them and adds up the bytes each one reads and writes. For the compiled version the floor is
# the graph's own inputs and output: a fully fused kernel reads each input once and writes the result
# once.

# %%
class CountOps(TorchDispatchMode):
    "Count the ATen operators eager PyTorch dispatches, and the bytes their tensors hold."

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:  # views (t, expand, detach) launch no kernel
            self.ops[str(func)] += 1
            tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs, out))
                       if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


with torch.no_grad(), CountOps() as eager_ops:
    norm_gelu_residual(x, weight, bias)
eager_count = sum(eager_ops.ops.values())
fused_count = len(fused_kernels(output_code))
fused_bytes = nbytes(x, weight, bias, expected)
# The kernel's loops over all the rows each start `for(int64_t x0=`: count those that load x (x_ptr, above).
row_loops = re.split(r"^\s*for\(int64_t x0\b", src, flags=re.M)[1:]
x_loops = sum(bool(re.search(rf"\b{x_ptr}\b", body)) for body in row_loops)
reread_bytes = fused_bytes + (x_loops - 1) * nbytes(x)  # each further loop reads all of x again
print("eager dispatches:", dict(eager_ops.ops))
print(f"\nkernels  eager: {eager_count}   Inductor: {fused_count}")
print(f"memory   eager ops touch {eager_ops.bytes / 2**20:.1f} MiB; the fused kernel's inputs and output "
      f"hold {fused_bytes / 2**20:.1f} MiB: {eager_ops.bytes / fused_bytes:.1f}x less traffic at best")
if x_loops > 1:
    print(f"         the kernel reads x in {x_loops} loops over all the rows: {reread_bytes / 2**20:.1f} MiB "
          f"({eager_ops.bytes / reread_bytes:.1f}x less) if none of those re-reads hit the cache")
else:
    print("         the kernel reads x in one loop over the rows (its inner loops re-read each row, small enough to "
          "stay in the L1 cache), so x streams from memory once")
assert x_loops >= 1, "no loop over the rows that loads x was found in the kernel"
assert fused_count < eager_count
assert eager_ops.bytes > 3 * fused_bytes
bench.record("internals.kernels.eager", eager_count, "kernels", example="norm_gelu_residual", rows=ROWS, dim=DIM)
bench.record("internals.kernels.fused", fused_count, "kernels", example="norm_gelu_residual", rows=ROWS, dim=DIM);

# %% [markdown]
# Most operations here do little arithmetic per byte (GELU's `erf` is the exception), so memory
# traffic is what the fused kernel saves; whether that shows as time depends on the machine's memory
# bandwidth, its caches and its load, and on how fast the generated loop does the arithmetic next to
# eager's hand-written kernels. Measure it (compiled code was built above, so only the steady state
# is timed); the cell prints the verdict for this machine, and the rate at which each version moved
# the bytes counted above (when one runs clearly below the rate the other reached, memory traffic alone
# was not what took its time; the cell states the band it calls clear):

# %%
table = bench.compare({"eager": norm_gelu_residual, "compiled": compiled_block}, x, weight, bias)
table = table.with_load()  # other programs' load, sampled whatever the spread: the reasons below name it
print(table)
speedup = table.speedup("compiled")
torch.testing.assert_close(compiled_block(x, weight, bias), expected, rtol=1e-5, atol=1e-5)
traffic_ratio = eager_ops.bytes / fused_bytes
print(f"\nfused: {speedup:.2f}x the speed of eager, for {traffic_ratio:.1f}x less memory traffic on paper "
      f"(the speed-up is {'below' if speedup < traffic_ratio else 'not below'} the traffic ratio)")
eager_s, fused_s = table.row("eager").median_s, table.row("compiled").median_s
print(f"bytes counted per second of median time: eager {eager_ops.bytes / eager_s / 1e9:.1f} GB/s; compiled "
      f"{fused_bytes / fused_s / 1e9:.1f} GB/s at the floor"
      + (f", {reread_bytes / fused_s / 1e9:.1f} GB/s with its re-reads of x" if x_loops > 1 else ""))
# Judge each end of the compiled kernel's range with its own byte count: the floor, and with its re-reads of x.
RATE_BAND = 0.5
eager_rate, fused_rate = eager_ops.bytes / eager_s, (reread_bytes if x_loops > 1 else fused_bytes) / fused_s
floor_word = bench.band_verdict(fused_bytes / fused_s, eager_rate, band=RATE_BAND)
rate_word = bench.band_verdict(fused_rate, eager_rate, band=RATE_BAND)
end_said = {"lower": "below it", "no clear difference": "about the rate eager reached", "higher": "above it"}
print(f"compiled moved bytes at {fused_bytes / fused_s / eager_rate:.2f}x"
      + (f"-{fused_rate / eager_rate:.2f}x" if x_loops > 1 else "") + f" eager's rate ({bench.band_text(RATE_BAND)}): "
      + ({"lower": "clearly below it, so memory traffic alone did not set the compiled kernel's time (this cell does "
                   "not measure what did)",
          "no clear difference": "about the rate eager reached, so these rates cannot tell memory traffic from "
                                 "arithmetic",
          "higher": "clearly above it (this cell does not measure why)"}[rate_word] if floor_word == rate_word else
         f"at the floor, {end_said[floor_word]}; with its re-reads of x counted, {end_said[rate_word]}: which holds "
         "depends on whether the re-reads hit the cache, which this cell does not measure, so these rates cannot "
         "tell memory traffic from arithmetic"))
fused_word = table.verdict("compiled", name="internals.fusion.compiled_vs_eager")
if fused_word == "faster":
    fused_reason = (f"{counted(fused_count, 'generated kernel')} instead of eager's {eager_count}, with no full-size "
                    "intermediate tensor written and read back; this cell does not split the gain into saved memory "
                    "traffic and arithmetic (the rate line above compares how fast each moved its bytes)")
    if speedup >= traffic_ratio:
        fused_reason += "; that is at or above the traffic ratio, so fewer bytes alone do not account for it"
elif fused_word == "no clear difference":
    if table.spread_note():
        fused_reason = "the saved traffic was lost in the timing spread (see the note under the table)"
    elif table.within_margin("compiled"):
        fused_reason = (f"the medians are within {bench.VERDICT_MARGIN:.0%} and no row's spread is over "
                        f"{bench.NOISY_SPREAD:.0%} of its median: on this machine the fused kernel took about "
                        f"as long as eager's {eager_count} kernels"
                        + (f" ({table.load_note()})" if table.load_note() else ""))
    else:
        fused_reason = (f"the medians differ by more than {bench.VERDICT_MARGIN:.0%}, but the two timings' spreads "
                        "overlap, so neither is clearly faster" + (f"; {table.load_note()}" if table.load_note() else ""))
    if config.is_quick():
        fused_reason += "; in quick mode the tensors are also small enough to stay in cache"
else:
    fused_reason = (f"the fused kernel, which reads x in {counted(x_loops, 'loop')} over the rows, took longer than eager's "
                    f"{eager_count} hand-written kernels; the cell does not split that time into memory traffic and "
                    "arithmetic (the rate line above compares how fast each moved its bytes)"
                    + scalar_note())
if fused_word != "no clear difference" and table.load_note():  # a tie's reasons above name it themselves
    fused_reason += f"; {table.load_note()}"
print(f"verdict on this machine: compiled is {table.describe('compiled')}: {fused_reason}")
bench.bar_chart(table, title=f"LayerNorm + GELU + residual, {ROWS}x{DIM}");


# %% [markdown]
# The cell compares the speed-up with the traffic ratio, and it can land on either side. Below it:
# both versions compute the same formulas (LayerNorm, and GELU with an `erf` per element), but with
# different code: Inductor's generated loop against eager's hand-written kernels. Where the
# arithmetic rather than memory takes most of the time (the rate line says whether the compiled
# kernel moved its bytes clearly below the rate eager reached), fewer bytes save little, and a
# generated loop that does the arithmetic more slowly than eager's kernels can leave the compiled
# version slower than eager. And when the fused kernel reads x in more than one loop
# over all the rows (the counting cell printed how many here), it moves more than the floor unless x
# stays in the CPU's last-level cache between those loops. Above it: something besides the bytes
# moved differed, and the note under the table, when there is one, says the timings were rough. On
# small tensors (quick mode) the tensors stay in the CPU's caches, so the traffic ratio says little
# about time.
#
# ## Where fusion stops: matrix multiplies
#
# A common claim is that Inductor turns `relu(x @ w + b)` into a single kernel. On the
# CPU it does not: a matrix multiply is left to an optimised library (oneDNN/MKL), which Inductor
# calls as an **extern kernel**, and only the pointwise work around it becomes generated code.
# (Fusing work into the matrix multiply itself needs Inductor's own matrix-multiply templates, which
# it only considers with `max_autotune` (or `max_autotune_gemm`) on, as `mode="max-autotune"` and
# `"max-autotune-no-cudagraphs"` set it.
# On a CPU, for a matrix multiply with a weight (`mm`, `addmm`: every `nn.Linear`), it also needs
# `torch._inductor.config.freezing` on, which lets it treat the weights as constants; torch's source
# (`use_cpp_bmm_template`) also lets a batched `bmm`, as in attention, be a candidate without freezing,
# which no cell here times.)

# %%
def linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w + b)


MM = config.pick(quick=256, full=1024)
xm, wm, bm = torch.randn(MM, MM), torch.randn(MM, MM) / MM**0.5, torch.randn(MM)
with torch.no_grad(), CountOps() as mm_ops:
    mm_expected = linear_relu(xm, wm, bm)
compiled_linear = torch.compile(linear_relu)
mm_out, (mm_code,) = generated_code(compiled_linear, xm, wm, bm)
torch.testing.assert_close(mm_out, mm_expected, rtol=1e-4, atol=1e-4)
print("eager dispatches:  ", dict(mm_ops.ops))
print("generated kernels: ", fused_kernels(mm_code))
print("library calls:     ", library_calls(mm_code))
print("\n" + wrapper_call(mm_code))
assert library_calls(mm_code), "the matrix multiply should be a library call"
assert not any("mm" in k for k in fused_kernels(mm_code)), "no generated kernel contains the matmul"

mm_table = bench.compare({"eager": linear_relu, "compiled": compiled_linear}, xm, wm, bm)
print("\n" + str(mm_table))
mm_word = mm_table.verdict("compiled", name="internals.matmul.compiled_vs_eager")
mm_calls = library_calls(mm_code)
eager_mm = ", ".join(str(op).split(".")[1] for op in mm_ops.ops if "mm" in str(op))
bias_folded = any("addmm" in call for call in mm_calls)
compiled_mm = ("the compiled addmm with the bias folded in" if bias_folded
               else "the compiled " + ", ".join(mm_calls))
tail = "the relu" if bias_folded else "the pointwise tail (bias add and relu)"
differs = "; the library call also differs (eager's separate add is folded into the compiled addmm)" if bias_folded else ""
print(f"\nverdict on this machine: compiled is {mm_table.describe('compiled')}: the matrix multiply runs in the "
      f"same library either way (eager's {eager_mm}, {compiled_mm}), and only {tail} became generated code, "
      + {"faster": "and compiled came out faster" + differs + "; this cell does not time these apart",
         "no clear difference": "which is expected to be a small share of the time next to the matrix multiply"
                                + ("; the timings were too spread to tell more (see the note under the table)"
                                   if mm_table.spread_note() else ""),
         "slower": "and the compiled call took longer" + differs + "; this cell does not time "
                   + ("these apart" if bias_folded else "the generated tail apart from the multiply")
                   + f" ({mm_table.bands_text('compiled')}): rerun the cell"
                   + (f"; {mm_table.load_note()}" if mm_table.load_note() else "")}[mm_word])


# %% [markdown]
# Where the verdict line says "the compiled addmm with the bias folded in", Inductor recognised
# `x @ w + b` and called the library's `addmm`, which adds the bias inside the matrix multiply,
# exactly as eager `nn.Linear` does. Compiling a model whose time goes into matrix multiplies
# therefore leaves that time in the same library routine on a CPU (the table above shows how the
# compiled version compared here); notebook 01 compares whole models.
#
# ## Training: the backward pass is fused too
#
# With gradients required, the Inductor backend compiles two graphs and writes code for each:

# %%
def train_step(fn, x, w, b, grad_out):
    out = fn(x, w, b)
    out.backward(grad_out)
    return out


xs = x[: config.pick(quick=ROWS, full=1024)]
grad_out = torch.randn_like(xs)
w_eager, b_eager = weight.clone().requires_grad_(), bias.clone().requires_grad_()
with CountOps() as train_ops:
    train_step(norm_gelu_residual, xs, w_eager, b_eager, grad_out)

w_comp, b_comp = weight.clone().requires_grad_(), bias.clone().requires_grad_()
_, train_codes = generated_code(train_step, torch.compile(norm_gelu_residual), xs, w_comp, b_comp, grad_out)
torch.testing.assert_close(w_comp.grad, w_eager.grad, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(b_comp.grad, b_eager.grad, rtol=1e-4, atol=1e-4)
print("gradients match eager within rtol=1e-4, atol=1e-4")
print(f"eager, forward + backward: {sum(train_ops.ops.values())} kernels {dict(train_ops.ops)}")
train_kernels = 0
for code_text in train_codes:
    graph_id = re.search(r"AOT ID: \['(\w+)'\]", code_text).group(1)
    print(f"Inductor, graph {graph_id}: {fused_kernels(code_text)}")
    train_kernels += len(fused_kernels(code_text))
assert len(train_codes) == 2 and train_kernels < sum(train_ops.ops.values())

# %% [markdown]
# The backward of the scale, GELU and LayerNorm (gradients for the weight and bias; x needs none here)
# collapsed into generated code too (the backward graph's line above lists its kernels): AOTAutograd
# gave Inductor the backward as an ATen graph, and Inductor treats it like any other.
#
# ## GPU extra: the Triton kernel
#
# On a GPU the same stack writes **Triton** instead of C++: a Python function decorated with
# `@triton.jit` that Triton compiles for the GPU. The kernel name tells its kind (`triton_poi_`
# pointwise, `triton_red_` reduction, `triton_per_` a reduction whose whole row fits in one block).
# Inductor writes Triton for NVIDIA and AMD GPUs (CUDA, ROCm) and for Intel's XPU; on Apple's MPS it
# writes Metal shaders instead (a prototype), so the cell below runs on the first three only.

# %%
if requires_accelerator("the Triton kernel Inductor writes for the same function", kinds=("cuda", "xpu")):
    torch._dynamo.reset()
    dev = accelerator()
    xg, wg, bg = x.to(dev), weight.to(dev), bias.to(dev)
    compiled_gpu = torch.compile(norm_gelu_residual)
    with torch.no_grad():
        out_gpu, gpu_codes = generated_code(compiled_gpu, xg, wg, bg)
    torch.testing.assert_close(out_gpu, norm_gelu_residual(xg, wg, bg), rtol=1e-4, atol=1e-4)
    gpu_code = gpu_codes[0]
    triton_kernels = fused_kernels(gpu_code)  # on a GPU they are Triton kernels
    print(f"eager kernels: {eager_count}; Triton kernels: {triton_kernels}")
    assert 1 <= len(triton_kernels) < eager_count
    triton_src = kernel_source(gpu_code, triton_kernels[0])
    jit = triton_src.index("@triton.jit")
    print("\n".join(triton_src[jit:].splitlines()[:45]))
    gpu_table = bench.compare({"eager": norm_gelu_residual, "compiled": compiled_gpu}, xg, wg, bg)
    print(gpu_table)
    gpu_said = gpu_table.describe("compiled", "eager", name="internals.gpu.compiled_vs_eager")
    print(f"on the {dev.type.upper()}, {counted(len(triton_kernels), 'Triton kernel')} against {eager_count} eager ones: "
          f"compiled is {gpu_said}")

# %% [markdown]
# ## Reading the output yourself, and a stale switch
#
# Three ways to see generated code in your own projects:
#
# - `TORCH_LOGS="output_code" python train.py` prints the output code of every compile
#   (inside a notebook, `torch._logging.set_logs(output_code=True)`);
# - `TORCH_COMPILE_DEBUG=1` (or `torch._inductor.config.trace.enabled = True`) writes the trace folder
#   used above: graphs, IR before and after fusion, and the output code, for each compiled graph;
# - `run_and_get_code` (here through `course_utils.inductor_code.generated_code`), when you want the
#   code as a string to search.
#
# Many guides say that `torch._inductor.config.debug = True` outputs the generated code.
# Check what it does in the installed PyTorch, with the cache off so Inductor really compiles:

# %%
stale_dir = config.build_dir() / "nb03_debug_flag"
shutil.rmtree(stale_dir, ignore_errors=True)
torch._dynamo.reset()
had_default_dir = (Path.cwd() / "torch_compile_debug").exists()
with torch._inductor.config.patch({"debug": True, "fx_graph_cache": False, "trace.debug_dir": str(stale_dir)}):
    torch.testing.assert_close(torch.compile(tanh_ladder)(small), tanh_ladder(small), rtol=1e-5, atol=1e-5)
folders = [stale_dir] + ([] if had_default_dir else [Path.cwd() / "torch_compile_debug"])  # the default folder
written = [p for d in folders if d.exists() for p in d.rglob("*") if p.is_file()]
print(f"torch {torch.__version__}: with config.debug=True, {counted(len(written), 'file')} of generated code written;")
print("the switch that writes the generated code is config.trace.enabled (TORCH_COMPILE_DEBUG=1)")


# %% [markdown]
# ## Pitfalls and their fixes
#
# | Symptom | Cause | Fix |
# |---|---|---|
# | Your backend prints once, then never again | it runs at compile time; cached graphs are reused while guards pass | expect one call per graph (and per recompile); count calls, not runs |
# | A later experiment compiles dynamic shapes, or reuses old code | Dynamo remembers sizes and compiled code per function | `torch._dynamo.reset()` between experiments |
# | `UserWarning: ... doesn't take boxed arguments` | an AOTAutograd compiler returned `gm.forward` | return `make_boxed_func(gm.forward)` |
# | The trace folder is empty | the FX graph cache hit, so Inductor did not lower anything | turn the cache off for that compile (`fx_graph_cache=False`) |
# | A kernel called `cpp_fused_relu_0` | every generated kernel is named `fused`, even with one operation inside | count operations per kernel from the name or the IR, not the word `fused` |
# | Compiled output differs from eager in the last digits | fused code reorders floating-point work (variance, `erf` approximations) | compare with `torch.testing.assert_close` and a stated tolerance, never `==` |
#
# ## Check yourself
#
# **Exercise 1.** Write `count_ops(fn, *args)`: compile `fn` with a **backend of your own** that
# counts the operator nodes (nodes whose `op` is `call_function`, `call_method` or `call_module`) of
# each graph it receives, call the compiled function once with `args`, and return the total over
# all graphs. The checker tries it on functions with a Python loop, a graph break and a composite
# operator.

# %%
def count_ops(fn, *args) -> int:
    # Your code here: define a backend(gm, example_inputs) that records a count and
    # returns gm.forward, compile fn with it, call it, return the total.
    return 0


exercises.check("03.count_ops", count_ops)

# %% [markdown]
# **Exercise 2.** Without running it first: how many generated C++ kernels (`cpp_...` definitions,
# not library calls) does Inductor write for this function on CPU tensors? Answer with an int; the
# cell after it checks the answer against what Inductor really does.
#
# ```python
# def sin_matmul_relu_cos(x, w):
#     return torch.relu(torch.sin(x) @ w).cos()
# ```

# %%
my_answer = None  # Your answer here: an int

exercises.check("03.fused_kernels", my_answer)

# %% [markdown]
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.
# Stuck? `print(exercises.solution_source("03.count_ops"))` reveals a reference solution;
# try for yourself first. The next cell compiles the function of Exercise 2 and counts, so it also
# confirms the checker's answer on your PyTorch version:

# %%
from course_utils.exercises.nb03 import sin_matmul_relu_cos

xe, we = torch.randn(64, 64), torch.randn(64, 64)
ex_out, (ex_code,) = generated_code(torch.compile(sin_matmul_relu_cos), xe, we)
torch.testing.assert_close(ex_out, sin_matmul_relu_cos(xe, we), rtol=1e-4, atol=1e-4)
assert len(fused_kernels(ex_code)) == exercises.solution("03.fused_kernels"), "checker out of date for this torch"
if exercises.check("03.fused_kernels", my_answer):
    print("generated:", fused_kernels(ex_code), "| library calls:", library_calls(ex_code))
else:
    print("answer Exercise 2 above to see the kernels Inductor wrote")

# %% [markdown]
# ## Summary
#
# - **TorchDynamo** turns Python bytecode into FX graphs of torch-level calls, runs Python control flow
#   while tracing, and calls the backend once per graph (again after a guard fails). A backend is any
#   `backend(gm, example_inputs)` returning a callable.
# - **AOTAutograd** runs inside the backend: it re-traces to ATen, derives the backward graph ahead of
#   time, makes the forward return what the backward needs, removes in-place operations, and calls a
#   compiler on each graph (boxed: `make_boxed_func`).
# - **Decompositions** are a backend's choice. Core ATen keeps `gelu`, `layer_norm` and `softmax` whole;
#   Inductor's table breaks them into pointwise operations and reductions; PrimTorch's prims go further
#   still, but Inductor lowers ATen, not prims.
# - **TorchInductor** inlines pointwise work into loops, fuses loops that share a pass over memory,
#   and writes C++/OpenMP, with SIMD vectors where the CPU allows (the excerpt's cell said which
#   here; Triton on GPUs). Here it turned the function's eager
#   kernels into fewer generated ones (the counting cell printed both numbers: `internals.kernels.eager`,
#   `internals.kernels.fused`), and left matrix multiplies to a library.
#
# **Next:** notebook 04 writes control flow that compiles and exports as one graph (`torch.cond`,
# `while_loop`); notebook 06 exports models with `torch.export`, as the Core ATen graphs you met here.
#
# ## Further reading
#
# - [`torch.compiler` documentation](https://docs.pytorch.org/docs/stable/torch.compiler.html), and its pages on
#   [custom backends](https://docs.pytorch.org/docs/stable/torch.compiler_custom_backends.html),
#   [Dynamo](https://docs.pytorch.org/docs/stable/torch.compiler_dynamo_overview.html) and
#   [troubleshooting](https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html)
# - [`torch.fx`](https://docs.pytorch.org/docs/stable/fx.html) (graphs, nodes, `GraphModule`)
# - [IRs: Core ATen and prims](https://docs.pytorch.org/docs/stable/torch.compiler_ir.html)
# - [Inductor's CPU backend tutorial](https://docs.pytorch.org/tutorials/intermediate/inductor_debug_cpu.html)
#   (reading and debugging the generated C++)
# - [`TORCH_LOGS` and `torch._logging`](https://docs.pytorch.org/docs/stable/logging.html)
