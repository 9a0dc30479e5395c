# %% [markdown]
# # 06 · `torch.export` and AOTInductor: a model without Python, from C++ to a phone
#
# `torch.compile` speeds a model up *inside* a Python process: it compiles on the first call and
# quietly falls back to Python wherever it cannot follow the code. Deployment asks for something
# else: the whole model captured **ahead of time**, as one graph you can save, inspect, compile once
# and run where there is no Python at all, in a C++ server, or in an app on a phone. `torch.export`
# produces that graph (an `ExportedProgram`); AOTInductor compiles it into a `.pt2` package that
# Python or C++ loads; ExecuTorch turns it into a `.pte` file for mobile and embedded runtimes.
# This notebook walks that path end to end on this machine, including a real C++ program, and shows
# where capture fails and how to fix it.

# %% [markdown]
# ## What you will learn
#
# - what `torch.export.export` returns: the graph, the graph signature, the state dict, the range
#   constraints, and `.module()` to run it;
# - dynamic shapes with `Dim`: bounds, derived dimensions, `Dim.AUTO` / `Dim.DYNAMIC`, and the error
#   an out-of-range input gets;
# - strict (TorchDynamo) and non-strict (Python) tracing: which is the default, and code where they
#   disagree;
# - the usual failures (a branch on a tensor's value, code that cannot run on fake tensors) and their
#   fixes, with `draft_export` to list every problem at once;
# - `run_decompositions` to core ATen, and a save/load round trip;
# - how TorchScript (`torch.jit.trace` / `torch.jit.script`) compares, row by row, by experiment;
# - AOTInductor: compile a package, load it from Python, time it against eager, and feed it a shape
#   it was not compiled for;
# - a C++ program that loads the same package, built with CMake against your torch wheel;
# - LibTorch, PyTorch without Python: a C++ program that trains the digits MLP with `torch::nn`,
#   `torch::optim` and autograd, saves weights Python loads with `weights_only=True`, and runs
#   them under `torch::InferenceMode`; its epoch time beside Python's, and what each C++ program
#   needs at run time;
# - ExecuTorch (an optional environment, `make executorch`): lower to the Edge dialect and a `.pte`
#   file, see which operators XNNPACK takes, run it, and time it beside eager and AOTInductor.
#
# **Prerequisites:** notebook 00 (timing with `course_utils.bench`), notebook 02 (graph breaks) and
# notebook 04 (`torch.cond`).
#
# **Time on a laptop CPU:** <!-- stamp:time -->1.0 min the first time (every cache empty), 0.5 min after that (caches warm; AOTInductor compiles again, as it has no cache), 0.4 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time --> The first run also builds the two C++ programs once (included in its figure).
#
# **GPU:** not needed. One guarded cell compiles the package for CUDA when a GPU is present.

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
import contextlib
import inspect
import io
import logging
import os
import random
import re
import sys
import warnings
import zipfile

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from course_utils import bench, compat, config, exercises, session
from course_utils.data import load_retrieval_set
from course_utils.deploy import aoti_cpp
from course_utils.expect import expect_error
from course_utils.device import requires_cuda, skip_cell
from course_utils.models import MLP, load_minilm
from course_utils.text import about, counted

print(session.start(seed=0))


# %% [markdown]
# Several cells below *expect* an error, because the error is the lesson. `expect_error` (from
# `course_utils.expect`) runs a call, checks that it fails with the message we predict (so the
# notebook stops if a future torch behaves differently) and returns the exception. While an export
# fails, torch prints the half-built graph to stderr and logs a warning; `expect_error` keeps both
# out of the way, `quiet_export` does the same around an export that is allowed to succeed, and
# `quiet_native_stderr` does the same for messages that compiled C++ code prints directly (they
# repeat what the exception already says). Export artefacts go
# to `OUT`, inside the git-ignored build folder.

# %%
@contextlib.contextmanager
def quiet_export():
    """Silence what a failing export prints: its partial graph (stderr) and shape-env warnings."""
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        shapes_log.setLevel(level)


@contextlib.contextmanager
def quiet_native_stderr():
    """Hide what C++ code writes straight to the process's stderr (file descriptor 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"


def short(path) -> str:
    """Return path relative to the repository when it is inside it."""
    return str(path.relative_to(config.REPO_ROOT)) if path.is_relative_to(config.REPO_ROOT) else str(path)


OUT = config.build_dir() / "nb06"
OUT.mkdir(parents=True, exist_ok=True)
print(f"export artefacts go to {short(OUT)}/ (git-ignored)")


# %% [markdown]
# ## The idea: capture everything, ahead of time
#
# `torch.compile` is a *just-in-time* compiler: it watches the first call, and where it meets code
# it cannot put in a graph it breaks the graph and lets Python run that part. That is fine inside a
# Python process and useless for shipping a model, because the Python part would have to ship too.
#
# `torch.export.export(model, example_args)` is the *ahead-of-time* counterpart: it traces the model
# once on example inputs and returns **one** graph of ATen operators (PyTorch's C++ operator set)
# with the weights alongside, or an error. There is no fallback: anything it cannot capture must be
# fixed in the model. In exchange you get an `ExportedProgram` that is a complete, Python-free
# description of the computation, which several back ends consume:
#
# | consumer | output | runs in |
# |---|---|---|
# | `torch.export.save` | `.pt2` archive of the program | Python (`torch.export.load`) |
# | AOTInductor | `.pt2` package with compiled C++ (or CUDA) code | Python or C++, no Python needed |
# | ExecuTorch | `.pte` flatbuffer | a small C++ runtime on phones and microcontrollers |
# | ONNX exporter (`dynamo=True`) | `.onnx` | ONNX Runtime and others (notebook 07) |
#
# ## The smallest export
#
# A linear layer, a ReLU and a buffer (a tensor that belongs to the module but is not trained):

# %%
class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * self.scale


small = Scaled().eval()
x_small = torch.randn(2, 4)
ep = torch.export.export(small, (x_small,))
print(ep)

# %% [markdown]
# Read the printout from the top:
#
# - **The graph** is a `forward` whose arguments are the parameters (`p_...`), the buffers (`b_...`)
#   and then your input `x`, each annotated with dtype and shape (`f32[2, 4]`). Every line calls an
#   ATen operator (`torch.ops.aten.linear.default`) and keeps a comment pointing back to your source.
#   The weights are *inputs* of the graph, not attributes: the graph is a pure function.
# - **The graph signature** says which input is which: `PARAMETER`, `BUFFER` (with the state-dict
#   key it comes from) or `USER_INPUT`, and what each output is.
# - **Range constraints** list the symbolic sizes and their allowed ranges; empty here, because
#   every size was fixed by the example input.
#
# The pieces are attributes you can use in code:

# %%
print("user inputs :", ep.graph_signature.user_inputs)
print("parameters  :", ep.graph_signature.parameters)
print("buffers     :", ep.graph_signature.buffers)
print("state_dict  :", {k: tuple(v.shape) for k, v in ep.state_dict.items()})
ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
print("operators   :", ops)
print("ranges      :", ep.range_constraints)

runnable = ep.module()  # an nn.Module that runs the graph with the stored weights
print("\n.module() gives a", type(runnable).__name__)
torch.testing.assert_close(runnable(x_small), small(x_small), rtol=0, atol=0)
assert ops == ["aten.linear.default", "aten.relu.default", "aten.mul.Tensor"]
print("exported module == eager module on the example input, bit for bit")

# %% [markdown]
# ## Dynamic shapes with `Dim`
#
# The program above is *specialised*: it accepts a batch of exactly 2 rows. Every shape in the
# example input becomes a constant unless you say otherwise, and `.module()` checks that on every
# call:

# %%
err = expect_error(runnable, torch.randn(3, 4), match=r"x.size\(\)\[0\] == 2")
print(first_line(err))

# %% [markdown]
# To keep a dimension symbolic, name it with `Dim(name, min=, max=)` in `dynamic_shapes`, a dict
# from `forward`'s argument names to `{dimension index: Dim}`. Export then checks the whole model
# works for *every* size in the range (not just the example) and records the range in the program:

# %%
batch = Dim("batch", min=1, max=64)
ep_dyn = torch.export.export(small, (x_small,), dynamic_shapes={"x": {0: batch}})
print("range constraints:", ep_dyn.range_constraints)
x_node = next(n for n in ep_dyn.graph.nodes if n.name == "x")
print("x is now          :", x_node.meta["val"].shape)

dyn_module = ep_dyn.module()
for n in (1, 17, 64):
    torch.testing.assert_close(dyn_module(torch.ones(n, 4)), small(torch.ones(n, 4)))
print("batch sizes 1, 17 and 64 all run and match eager")
err = expect_error(dyn_module, torch.randn(65, 4), match=r"<= 64")
print("batch 65:", first_line(err))


# %% [markdown]
# The batch dimension became a symbol (`s…`), and the upper bound you gave is enforced: a batch
# of 65 is refused with a message naming the broken condition, instead of running code that was
# never checked for it.
#
# **Derived dimensions.** When one input's size is a function of another's, say so with arithmetic
# on the `Dim`. Below, `x` has one more element than `y`. Declaring two *independent* dims is wrong
# (the model only works when they are related), and export says so, with the fix:

# %%
class ShiftAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[1:] + y


args = (torch.randn(5), torch.randn(4))
err = expect_error(torch.export.export, ShiftAdd(), args,
                   dynamic_shapes={"x": {0: Dim("a")}, "y": {0: Dim("b")}}, match=r"must always be related")
print("\n".join(ln for ln in str(err).splitlines() if "related" in ln or "a = " in ln or "Suggested fixes" in ln))

n = Dim("n", min=2, max=32)
ep_shift = torch.export.export(ShiftAdd(), args, dynamic_shapes={"x": {0: n}, "y": {0: n - 1}})
print("\nwith x: n and y: n - 1 ->", ep_shift.range_constraints)
torch.testing.assert_close(ep_shift.module()(torch.ones(10), torch.ones(9)), torch.full((9,), 2.0))

# %% [markdown]
# **Letting export infer.** Writing every `Dim` by hand is tedious for a model with many inputs.
# Newer torch has `Dim.AUTO`: "make this dynamic if the model allows, and work out the relations
# yourself". `Dim.DYNAMIC` is the strict version: it must come out dynamic, or export fails.
# (`Dim.STATIC` pins a size.)

# %%
if compat.has("dim_auto"):
    ep_auto = torch.export.export(ShiftAdd(), args, dynamic_shapes={"x": {0: Dim.AUTO}, "y": {0: Dim.AUTO}})
    shapes = [tuple(n.meta["val"].shape) for n in ep_auto.graph.nodes if n.op == "placeholder"]
    print("Dim.AUTO inferred input shapes:", shapes)
    print("and the ranges:                ", ep_auto.range_constraints)
    # The weight of a Linear pins the feature size: DYNAMIC on it is refused, AUTO quietly keeps it static.
    err = expect_error(torch.export.export, small, (x_small,), dynamic_shapes={"x": {0: Dim.AUTO, 1: Dim.DYNAMIC}},
                       match=r"Constraints violated|specializ")
    print("\nDim.DYNAMIC on the feature dim:", first_line(err))
    ep_auto2 = torch.export.export(small, (x_small,), dynamic_shapes={"x": {0: Dim.AUTO, 1: Dim.AUTO}})
    x_auto = next(n for n in ep_auto2.graph.nodes if n.name == "x").meta["val"].shape
    print("Dim.AUTO on both dims gives x:", tuple(x_auto))
    assert isinstance(x_auto[0], torch.SymInt) and x_auto[1] == 4
else:
    print(f"torch {torch.__version__} has no Dim.AUTO; name every dynamic dimension with Dim(...)")

# %% [markdown]
# Note the bounds `Dim.AUTO` picks: no upper limit (`int_oo`) and, for a plain dynamic size, a
# lower limit of 2, not 0 or 1. Sizes 0 and 1 are special to the compiler (broadcasting, empty
# tensors), so export assumes they do not occur unless you ask for `min=1` with a named `Dim`.
# For a deployed model, name your dims and give honest bounds: they are the contract the serving
# code must respect, and AOTInductor uses them (see below).
#
# ## Strict and non-strict tracing
#
# `torch.export` has two ways to run your `forward` while recording it:
#
# - **strict** (`strict=True`): TorchDynamo, the front end of `torch.compile`, reads the Python
#   bytecode and *symbolically* interprets it. It understands a lot of Python (and some NumPy), and
#   refuses what it cannot follow.
# - **non-strict** (`strict=False`): your `forward` simply runs in the normal Python interpreter, on
#   *fake tensors* that carry shapes but no data. Any Python runs, once, at trace time; only tensor
#   operations are recorded.
#
# Which one is the default changed during the 2.x series; read it from the installed torch:

# %%
default_strict = inspect.signature(torch.export.export).parameters["strict"].default
print(f"torch {torch.__version__}: torch.export.export(..., strict={default_strict}) by default, "
      f"i.e. {'strict (TorchDynamo)' if default_strict else 'non-strict (plain Python on fake tensors)'} tracing")


# %% [markdown]
# The two modes disagree in both directions. NumPy code on a tensor works in strict mode, because
# TorchDynamo translates NumPy calls into torch operations; in non-strict mode `.numpy()` is called
# on a fake tensor that has no data. Python's `random` is the opposite: strict mode refuses it,
# while non-strict mode runs it once and **bakes the number it drew into the graph as a constant**,
# silently:

# %%
class NumpyStep(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.tanh(x.numpy())) * 2


class RandomScale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * random.random()


def try_export(model: nn.Module, strict: bool):
    """Return (ExportedProgram, None) or (None, error) for one tracing mode."""
    with quiet_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.export.export(model, (torch.ones(3),), strict=strict), None
        except Exception as err:
            return None, err


outcome = {}
for model in (NumpyStep(), RandomScale()):
    for strict in (True, False):
        prog, err = try_export(model, strict)
        outcome[type(model).__name__, strict] = prog
        verdict = "exports" if prog is not None else f"fails   ({first_line(err)[:90]})"
        print(f"{type(model).__name__:11s} strict={strict!s:5s}: {verdict}")

x3 = torch.tensor([0.5, -1.0, 2.0])
torch.testing.assert_close(outcome["NumpyStep", True].module()(x3), torch.tanh(x3) * 2)
baked = outcome["RandomScale", False].module()
print("\nnon-strict RandomScale on ones, called twice:", baked(torch.ones(3)).tolist(), baked(torch.ones(3)).tolist())
assert torch.equal(baked(torch.ones(3)), baked(torch.ones(3))), "the random draw is frozen into the graph"
assert outcome["NumpyStep", False] is None and outcome["RandomScale", True] is None


# %% [markdown]
# The frozen random number is the general lesson of non-strict mode: **Python that does not
# touch tensors runs once, at export time, and only its result is kept.** That is exactly right
# for configuration code (`if self.use_bias:`), and exactly wrong for anything meant to vary per
# call. Strict mode is more conservative and tells you: its message ("Dynamo attempts to add
# additional input") means Dynamo wanted to make the drawn number an input of the graph, which
# export does not allow. A practical habit: export non-strict (the
# default, which accepts more real-world models), and when a result looks frozen or odd, try
# `strict=True` and read its complaint.
#
# ## Failures, and how to fix them
#
# ### A branch on a tensor's value
#
# The classic failure is an `if` on data. Export traces with fake tensors, so `x.sum() > 0` has no
# value to decide on. Both modes refuse, with different messages (in the non-strict one, `u0` is the
# symbol standing for the comparison's 0/1 result, which export cannot decide while tracing):

# %%
class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


for strict in (True, False):
    err = expect_error(torch.export.export, Branchy(), (torch.ones(3),), strict=strict,
                       match=r"data-dependent|Data-dependent")
    print(f"strict={strict!s:5s} -> {first_line(err)[:150]}")


# %% [markdown]
# The fix, from notebook 04: put *both* branches in the graph with `torch.cond`, and let the
# predicate pick one at run time. The exported graph then holds a `cond` node with a subgraph per
# branch:

# %%
class CondBranchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


ep_cond = torch.export.export(CondBranchy(), (torch.ones(3),))
print(ep_cond.graph_module.code.strip())
cond_module = ep_cond.module()
for x_try in (torch.ones(3), -torch.ones(3)):
    torch.testing.assert_close(cond_module(x_try), Branchy()(x_try))
assert any(n.target is torch.ops.higher_order.cond for n in ep_cond.graph.nodes)
print("\nthe exported program takes the right branch for positive and negative inputs")


# %% [markdown]
# When the branch is cheap, `torch.where(pred, a, b)` (compute both, select) is the other fix.
#
# ### Python that cannot run on fake tensors
#
# In non-strict mode, code that needs the actual values on the Python side fails, such as
# `.numpy()` in `NumpyStep` above. The fixes are to stay in torch operations (replace `np.tanh` by
# `torch.tanh`), or strict mode, which translates the NumPy calls (as above). `.item()` and
# `.tolist()` become symbolic values, which export can often keep; where it cannot decide something
# about such a value, tell the tracer what it may assume with `torch._check(...)`. The cell below
# exports one model that sizes a tensor with `.item()` and one that rebuilds its input through
# `.tolist()`, in both modes, and runs what exported on new data:

# %%
class ItemSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.sum().to(torch.int64).item())   # the output's size comes from the data


class ToList(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor(x.tolist()) * 2                   # a float tensor through a Python list


x_new = torch.tensor([1.0, 2.0, 4.0])
symbolic = {}
for model in (ItemSize(), ToList()):
    for strict in (True, False):
        prog, err = try_export(model, strict)
        symbolic[type(model).__name__, strict] = prog
        ran = "" if prog is None else f"; on {x_new.tolist()} it gives {prog.module()(x_new).tolist()}"
        print(f"{type(model).__name__:8s} strict={strict!s:5s}: "
              + ("exports" + ran if prog is not None else f"fails   ({first_line(err)[:90]})"))
assert symbolic["ItemSize", False] is not None and symbolic["ItemSize", False].module()(x_new).shape == (7,)
assert symbolic["ToList", False] is not None and symbolic["ToList", True] is None
torch.testing.assert_close(symbolic["ToList", False].module()(x_new), x_new * 2)


# %% [markdown]
# Strict mode's error says what it refuses: Dynamo turns `.tolist()` into symbolic values only for
# an integer tensor, and this one holds floats. Non-strict mode runs the call on the tracer's fake
# tensors and keeps each element as a symbol, so it exports.
#
# A symbolic value has no number behind it while tracing, so a Python `if` on it cannot be decided:
# export stops with "Could not guard on data-dependent expression". When you know a fact the tracer
# cannot, state it with `torch._check(condition)`: the tracer then takes the condition as true (the
# `if` below is decided), and the exported program checks it on every call instead of trusting it.

# %%
class Scale(nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()                       # a count read from the data: symbolic while tracing
        if k < 0:                          # a Python branch on it
            raise ValueError("a negative count")
        return x * k


class ScaleChecked(nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 0)               # what we know: the count is never negative
        if k < 0:                          # now decided while tracing: this branch is never taken
            raise ValueError("a negative count")
        return x * k


with quiet_export(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    err = expect_error(torch.export.export, Scale(), (torch.ones(3), torch.tensor(4)),
                       match="data-dependent expression")
    checked_ep = torch.export.export(ScaleChecked(), (torch.ones(3), torch.tensor(4)))
print("Scale       :", first_line(err).split(" (unhinted")[0])
print("ScaleChecked: exports; on count 2 it gives", checked_ep.module()(torch.ones(3), torch.tensor(2)).tolist())
err = expect_error(checked_ep.module(), torch.ones(3), torch.tensor(-2), match=r"u0 >= 0|assert")
print("ScaleChecked on count -2:", first_line(err)[:95])

# %% [markdown]
# ### `draft_export`: every problem at once
#
# A real model may have several such spots, and `export` stops at the first. `draft_export` (newer
# torch) keeps going: where it meets a data-dependent decision it takes the branch the example
# input takes, records an issue, and returns a program plus a report. The program is *not* safe
# for every input; it is a to-do list:

# %%
if compat.has("draft_export"):
    with quiet_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draft = torch.export.draft_export(Branchy(), (torch.ones(3),))
    report = re.sub(r"\x1b\[[0-9;]*m", "", str(draft._report))  # drop the terminal colours
    lines = [ln for ln in report.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "Please refer"))]
    print("\n".join(lines[:14]))
    assert "Data dependent" in report
    torch.testing.assert_close(draft.module()(torch.ones(3)), torch.full((3,), 2.0))
    try:
        wrong = draft.module()(-torch.ones(3))
    except Exception as err:  # torch 2.14 inserts a run-time check on the specialised branch
        assert re.search(r"assert|Runtime|guard|Expected", str(err), flags=re.I), err
        print("\nthe draft program on the other branch fails loudly:", first_line(err)[:150])
    else:  # older torch (2.11) inserted no check: the program silently takes the example's branch
        print(f"\ntorch {torch.__version__}: no run-time check; the other branch silently returns "
              f"{wrong.tolist()}, the example's branch")
else:
    print(f"torch {torch.__version__} has no torch.export.draft_export")

# %% [markdown]
# The draft specialised the branch the example took; torch 2.14 also inserts a run-time
# assertion, so the other branch fails loudly instead of silently computing the wrong thing (torch
# 2.11 did not: the cell says which happened with yours). Fix each reported issue
# in the model (here with `torch.cond`), then export for real.
#
# ## From training IR to core ATen: `run_decompositions`
#
# `export` keeps high-level operators such as `aten.linear` and `aten.layer_norm`, which is
# convenient for back ends that have a fused kernel for them. A back end that implements only the
# small **core ATen** operator set (ExecuTorch's portable kernels, many accelerators) wants them
# decomposed; `run_decompositions()` does that and returns a new `ExportedProgram`:

# %%
torch.manual_seed(0)
mlp = MLP(64, 128, 10).eval()
x_mlp = torch.randn(8, 64)
mlp_batch = Dim("batch", min=1, max=128)
ep_mlp = torch.export.export(mlp, (x_mlp,), dynamic_shapes={"x": {0: mlp_batch}})
ep_core = ep_mlp.run_decompositions()


def op_set(prog) -> set[str]:
    return {str(n.target) for n in prog.graph.nodes if n.op == "call_function" and "aten" in str(n.target)}


print("training IR:", sorted(op_set(ep_mlp)))
print("core ATen  :", sorted(op_set(ep_core)))
assert "aten.linear.default" in op_set(ep_mlp) and "aten.linear.default" not in op_set(ep_core)
assert "aten.addmm.default" in op_set(ep_core)
torch.testing.assert_close(ep_core.module()(x_mlp), mlp(x_mlp), rtol=1e-5, atol=1e-6)
print("\nsame numbers after decomposition (within 1e-5)")

# %% [markdown]
# `linear` became a transpose (`permute`) plus `addmm`, and `layer_norm` its lower-level
# `native_layer_norm`. You can also pass a decomposition table to keep some operators whole.
#
# ## Save, load, compare
#
# `torch.export.save` writes the program, its weights and its constraints to one `.pt2` archive;
# `torch.export.load` gives back an `ExportedProgram` with no need for the model's Python class:

# %%
saved = OUT / "mlp_exported.pt2"
torch.export.save(ep_mlp, saved)
loaded = torch.export.load(saved)
x_rt = torch.randn(32, 64)
with torch.no_grad():
    roundtrip_err = (loaded.module()(x_rt) - mlp(x_rt)).abs().max().item()
print(f"{saved.name}: {saved.stat().st_size / 1024:.0f} KiB; ranges after loading: {loaded.range_constraints}")
print(f"max |loaded - original| on a batch of 32: {roundtrip_err:.3g}")
assert roundtrip_err <= 1e-6
entry = bench.record("export.roundtrip.max_abs_err", roundtrip_err, "abs", model="MLP(64,128,10)", batch=32)

# %% [markdown]
# ## A real model: all-MiniLM-L6-v2
#
# The same recipe on the course's pretrained sentence encoder (a 6-layer BERT-style network). Two inputs, token ids and attention mask, share a batch size and a sequence length,
# so both use the same two `Dim`s:

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # a noisy import-time notice
    mini = load_minilm()

data = load_retrieval_set()
ids, mask = mini.tokenize(data.passages[:4])
B, T = Dim("batch", min=1, max=64), Dim("seq", min=2, max=256)
exported = {}


def export_minilm() -> None:
    exported["ep"] = torch.export.export(mini.model, (ids, mask), dynamic_shapes={
        "input_ids": {0: B, 1: T}, "attention_mask": {0: B, 1: T}})


mini_export_s = bench.first_call(export_minilm)
ep_mini = exported["ep"]
n_params = sum(p.numel() for p in mini.model.parameters())
n_ops = sum(1 for n in ep_mini.graph.nodes if n.op == "call_function")
print(f"exported MiniLM ({n_params / 1e6:.1f}M parameters) in {mini_export_s:.1f} s: {n_ops} operator calls")
print(f"ranges: {ep_mini.range_constraints}")

# Passages and queries of the course's retrieval set (all of them in full mode), in batches of
# different sizes and sentence lengths.
texts = config.pick(quick=data.passages[:12] + data.queries[:6], full=data.passages + data.queries)
eager_emb = mini.encode(texts, batch_size=8)
export_emb = mini.encode(texts, batch_size=8, model=ep_mini.module())
torch.testing.assert_close(export_emb, eager_emb, rtol=1e-5, atol=1e-6)
print(f"{len(texts)} real sentences: max |exported - eager| = {(export_emb - eager_emb).abs().max().item():.2g}")


# %% [markdown]
# One exported program serves every batch size and sentence length in its ranges, and it gives
# the same embeddings as the eager model on the course's real passages and queries.
#
# ## TorchScript against `torch.export`
#
# Before PyTorch 2, the ways to get a model out of Python were `torch.jit.trace` (run once and
# record) and `torch.jit.script` (compile a subset of Python to TorchScript). The experiments
# below check the usual comparison table row by row, on the installed torch.

# %%
def scripted_or_error(model):
    try:
        return torch.jit.script(model), None
    except Exception as err:
        return None, err


status_msgs = set()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # Row 1: a branch on a value.
    traced_branch = torch.jit.trace(Branchy(), torch.ones(3))
    scripted_branch, _ = scripted_or_error(Branchy())
status_msgs |= {(w.category.__name__, str(w.message)) for w in caught
                if issubclass(w.category, (FutureWarning, DeprecationWarning)) and "deprecated" in str(w.message)}
tracer_warned = any("TracerWarning" in w.category.__name__ for w in caught)
neg = torch.full((3,), -2.0)  # takes the other branch: x - 1
row_branch = {
    "trace": "silently bakes the branch it saw" if not torch.equal(traced_branch(neg), Branchy()(neg)) else "keeps it",
    "script": "keeps it" if torch.equal(scripted_branch(neg), Branchy()(neg)) else "wrong",
    "export": "refuses; torch.cond captures it" if torch.equal(cond_module(neg), Branchy()(neg)) else "wrong",
}
print("data-dependent branch :", row_branch, "| TracerWarning shown:", tracer_warned)


class ShapeBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(x.shape[0] * 2, -1)       # arithmetic on a size
        return y * 2 if x.shape[0] > 4 else y   # a branch on a size


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    traced_shape = torch.jit.trace(ShapeBranch(), torch.ones(8, 6))
    scripted_shape, _ = scripted_or_error(ShapeBranch())
small_in = torch.ones(2, 6)
ep_shape = torch.export.export(ShapeBranch(), (torch.ones(8, 6),), dynamic_shapes={"x": {0: Dim("b", min=5, max=64)}})
row_shape = {
    "trace": "records size arithmetic, bakes size branches" if traced_shape(small_in).shape == (4, 3)
             and not torch.equal(traced_shape(small_in), ShapeBranch()(small_in)) else "?",
    "script": "yes" if torch.equal(scripted_shape(small_in), ShapeBranch()(small_in)) else "?",
    "export": "yes, within declared bounds (checked per call)" if torch.equal(
        ep_shape.module()(torch.ones(6, 6)), ShapeBranch()(torch.ones(6, 6))) else "?",
}
print("dynamic shapes        :", row_shape)


class PythonHeavy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = {f"p{i}": x * i for i in range(3)}   # a dict comprehension, then sum() over it
        return sum(parts.values())


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _, script_err = scripted_or_error(PythonHeavy())
    traced_py = torch.jit.trace(PythonHeavy(), torch.ones(3))
ep_py = torch.export.export(PythonHeavy(), (torch.ones(3),))
row_python = {
    "trace": "any Python runs (once, while tracing)" if torch.equal(traced_py(x3), PythonHeavy()(x3)) else "?",
    "script": f"a subset: fails ({type(script_err).__name__})" if script_err is not None else "ok",
    "export": "broad (non-strict runs plain Python)" if torch.equal(ep_py.module()(x3), PythonHeavy()(x3)) else "?",
}
print("Python features       :", row_python)
row_format = {"trace": type(traced_py).__name__ + " (TorchScript IR)",
              "script": type(scripted_branch).__name__ + " (TorchScript IR)",
              "export": type(ep_py).__name__ + " (FX graph of ATen ops)"}
print("output                :", row_format)
assert row_branch["trace"].startswith("silently") and "?" not in str(row_shape) + str(row_python)
assert script_err is not None

# %%
rows = [("how it captures", "runs the model once, records tensor ops", "compiles Python source (a subset)",
         f"traces on fake tensors ({'TorchDynamo' if default_strict else 'plain Python'} by default)"),
        ("data-dependent branch", row_branch["trace"], row_branch["script"], row_branch["export"]),
        ("dynamic shapes", row_shape["trace"], row_shape["script"], row_shape["export"]),
        ("Python features", row_python["trace"], row_python["script"], row_python["export"]),
        ("output", row_format["trace"], row_format["script"], row_format["export"]),
        ("compiler stack", "TorchScript's own (frozen)", "TorchScript's own (frozen)",
         "run_decompositions, AOTInductor, ExecuTorch, ONNX")]
width = [max(len(str(r[i])) for r in rows) + 2 for i in range(4)]
print("".join(h.ljust(w) for h, w in zip(["", "torch.jit.trace", "torch.jit.script", "torch.export"], width)))
for row in rows:
    print("".join(str(c).ljust(w) for c, w in zip(row, width)))
print("\nwhat the installed torch says when you call them (tracing a module goes through "
      "torch.jit.trace_module, whose warning names it trace_method):")
for category, msg in sorted(status_msgs):
    print(f"  {category}: {msg}")
assert status_msgs, "expected torch.jit.trace/script to warn that they are deprecated"

# %% [markdown]
# Compared with the table people usually quote, three rows change on a current torch:
#
# - **Branches on values**: `torch.export` does *not* capture a Python `if` on data; it refuses,
#   and you rewrite the branch with `torch.cond`. `torch.jit.trace` is the dangerous one: it
#   records the branch it happened to see, with only a `TracerWarning`.
# - **Dynamic shapes**: tracing is not all-or-nothing. Size arithmetic (`x.shape[0] * 2`) is
#   recorded, but a branch on a size is baked in. `torch.export` keeps sizes symbolic within the
#   bounds you declare and checks the bounds on every call.
# - **How it captures**: export is not always TorchDynamo. The default mode runs your Python on
#   fake tensors; TorchDynamo is the `strict=True` mode.
#
# **The status of TorchScript:** it is deprecated. The PyTorch documentation marks it so since 2.9,
# its issues were closed in 2026 as "deprecated in favor of torch.export as of 2.11", and the
# installed torch emits deprecation warnings for them (`FutureWarning` in 2.14, shown by default;
# `DeprecationWarning` in 2.11, hidden unless you enable warnings; the cell above records them
# either way). Existing TorchScript models still load and run, but new work should use
# `torch.export` (and `torch.compile` inside Python).
#
# ## AOTInductor: compile once, load anywhere
#
# `torch._inductor.aoti_compile_and_package` runs TorchInductor on an `ExportedProgram` ahead of
# time: it generates C++ for the whole graph, compiles it into a shared library and packs it, with
# the weights, into a `.pt2` package. `aoti_load_package` loads it back as a Python callable. The
# package keeps the export's dynamic batch dimension. Compiling is slow (it runs a C++ compiler),
# so we time it once:

# %%
package = OUT / "mlp_aoti.pt2"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    aoti_compile_s = bench.first_call(torch._inductor.aoti_compile_and_package, ep_mlp, package_path=str(package))
aoti_mlp = torch._inductor.aoti_load_package(str(package))
print(f"AOTInductor compile: {aoti_compile_s:.1f} s -> {package.name} ({package.stat().st_size / 1024:.0f} KiB)")

aoti_err = 0.0
with torch.inference_mode():
    for n in (1, 8, 128):
        xb = torch.randn(n, 64)
        torch.testing.assert_close(aoti_mlp(xb), mlp(xb), rtol=1e-4, atol=1e-5)
        aoti_err = max(aoti_err, (aoti_mlp(xb) - mlp(xb)).abs().max().item())
print(f"AOTInductor output matches eager for batch sizes 1, 8 and 128: max |AOTInductor - eager| = {aoti_err:.2g} "
      "(asserted within rtol 1e-4, atol 1e-5)")

# Look inside: the package is a zip with the generated C++ source and the compiled library, which holds the weights
# (aot_inductor.package_constants_in_so, True by default, embeds them in the .so rather than in files of their own).
with zipfile.ZipFile(package) as zf:
    names = zf.namelist()
    wrapper_src = next(zf.read(n).decode() for n in names if n.endswith("wrapper.cpp"))
print("\npackage contents:", sorted({n.rsplit("/", 1)[-1].split(".", 1)[-1] for n in names if "/model/" in n}))
called = sorted(set(re.findall(r"\b(cpp_fused_\w+|aoti_torch_cpu_\w+)\(", wrapper_src)))
print("the generated code calls:", called)
assert any("gelu" in c and "layer_norm" in c for c in called), "expected LayerNorm and GELU fused into one kernel"

# %% [markdown]
# The package holds the generated C++ (`wrapper.cpp` for the sequence of calls, `kernel.cpp` for
# the fused loops) and the compiled shared library, `wrapper.so`, with the weights embedded in it
# (torch's default, `aot_inductor.package_constants_in_so=True`). The matrix multiplies go to the
# library routine (`aoti_torch_cpu_addmm_out`); LayerNorm and GELU were fused into one generated
# kernel. Each `aoti_compile_and_package` call lowers the graph and compiles its generated C++
# again: Inductor's FX graph cache, which notebook 01 measures for `torch.compile`, is not used in
# AOT mode (only torch's precompiled headers are kept on disk and reused), so build the package
# once and ship the `.pt2`. The compile time printed above varies with the machine's load and with
# the vector instructions the generated code uses.
#
# Now the steady-state speed, on the same input, side by side. We time both on
# **one thread**: a batch of 8 rows gives the cores nothing to share, a serving host usually runs
# one single-threaded worker per core, and on a busy machine multi-threaded timings of calls this
# short can be dominated by threads waiting for each other.

# %%
with torch.inference_mode():
    aoti_table = bench.compare({"eager": mlp, "AOTInductor": aoti_mlp}, x_mlp, num_threads=1)
print(aoti_table)
aoti_speedup = aoti_table.speedup("AOTInductor")
bench.record("export.aoti.speedup", aoti_speedup, "x", model="MLP(64,128,10)", batch=x_mlp.shape[0], threads=1)
bench.bar_chart(aoti_table, title="MLP(64, 128, 10), batch 8, CPU, one thread");

# %%
saved_us = (aoti_table.row("eager").median_s - aoti_table.row("AOTInductor").median_s) * 1e6
aoti_word = aoti_table.verdict("AOTInductor")
print(f"median ratio, eager's time over AOTInductor's: {aoti_speedup:.2f}x"
      + (f", {saved_us:.1f} µs saved per call" if aoti_word == "faster" else " (see the verdict below)"))
from course_utils import cpu, inductor_code

print(f"(CPU class {cpu.cpu_class()}: "
      + (f"the generated C++ is vectorised for the instruction set torch reports, {cpu.info().torch_capability}"
         if inductor_code.vectorises_here() else "the generated C++ is not vectorised here" + inductor_code.scalar_note())
      + "; the ratio also depends on clock speed and load, so compare it only on one machine)")
print(f"verdict on this machine: AOTInductor is {aoti_table.describe('AOTInductor', name='export.aoti.vs_eager')}: " + {
    "faster": "one generated C++ function, with LayerNorm and GELU fused, replaced eager's per-operator calls "
              "(Python, dispatcher, one loop per operator); this cell does not split the saving between them",
    "no clear difference": "the saving, if any, came to less than 5% of a call here"
                           if aoti_table.within_margin("AOTInductor") else
                           "the saving, if any, stayed inside this run's timing spread (the IQR column)",
    "slower": "the package's call cost more here than eager's; this cell does not break that down"}[aoti_word])
if aoti_word == "faster":
    repaid_calls = aoti_compile_s / (saved_us * 1e-6)
    bench.record_verdict("export.aoti.compile_repaid", "pays", calls=round(repaid_calls), compile_s=aoti_compile_s)
    print(f"the {aoti_compile_s:.0f} s compile is repaid after {about(repaid_calls, 'call')}")
else:
    print("no clear saving per call here, so no number of calls repays the compile on this machine")

# %% [markdown]
# For a small model, eager pays a per-operator overhead (Python, the dispatcher, a separate loop
# per operator) that the compiled package, one generated C++ function with the LayerNorm and GELU
# fused, does not pay; the verdict above says whether that showed on this machine. Where it saved
# time, the cell printed how many calls repay the compile. It pays less for a model whose time goes
# into large matrix multiplies: such a model has little overhead left to remove, because eager
# already hands those to an optimised library
# (notebook 01 measures that case with `torch.compile`). The main point of AOTInductor is less the
# speed than *where* the code can run: anywhere the package can be loaded, with no Python.
#
# ### A shape it was not compiled for
#
# The package was compiled for a batch in `[1, 128]` and exactly 64 features. What happens
# outside that?

# %%
with torch.inference_mode(), quiet_native_stderr():
    err = expect_error(aoti_mlp, torch.randn(4, 32), match=r"cannot be multiplied|size|shape")
    print("32 features instead of 64:", first_line(err)[:120])
    out_big = aoti_mlp(torch.randn(129, 64))
print(f"batch 129 (above max=128): ran without complaint, output {tuple(out_big.shape)}")

os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"  # read once, when a package's code first runs
try:
    checked = torch._inductor.aoti_load_package(str(package))
    with torch.inference_mode(), quiet_native_stderr():
        # torch 2.14 names the bound; 2.11 only reports that the run failed
        err = expect_error(checked, torch.randn(129, 64), match=r"<= 128|API call failed")
finally:
    del os.environ["AOTI_RUNTIME_CHECK_INPUTS"]
print("with AOTI_RUNTIME_CHECK_INPUTS=1:", first_line(err))

# %% [markdown]
# Unlike `ExportedProgram.module()`, a compiled package does **not** check its input shapes
# unless you ask. A wrong feature size still fails (inside the matrix
# multiply), but a batch above the declared maximum runs code that was never verified for it.
# Set `AOTI_RUNTIME_CHECK_INPUTS=1` while developing and testing, and validate shapes in your
# serving code in production.
#
# On a GPU, the same two calls produce a package with CUDA kernels. Its C++ wrapper is compiled
# against the CUDA toolkit's `cuda.h` and linked with `-lcuda`, neither of which the pip wheel ships.
# torch guesses the toolkit's folder once, from `CUDA_HOME` or from the `nvcc` on `PATH`, and the
# guess misses where `nvcc` is a wrapper script in `/usr/local/bin`; the cell looks in the usual
# places too (`course_utils.deploy.cuda_toolkit`) and skips with the reason when none holds the
# toolkit. Set `CUDA_HOME` to your toolkit's folder if it names the wrong one.

# %%
if requires_cuda("an AOTInductor package compiled for CUDA, compared with eager on the GPU"):
    from torch.utils import cpp_extension

    from course_utils.deploy import cuda_toolkit

    # The wrapper is C++ built against the CUDA toolkit's cuda.h and linked with -lcuda; the wheel has neither.
    # prepare() finds them (torch's own guess, from nvcc on PATH, can miss) or says why it cannot.
    problem = cuda_toolkit.prepare()
    if problem:
        skip_cell(f"AOTInductor for CUDA cannot build here: {problem}")
    else:
        print(f"CUDA toolkit for the C++ wrapper: {cpp_extension.CUDA_HOME}")
        mlp_gpu = MLP(64, 128, 10).cuda().eval()
        xg = torch.randn(8, 64, device="cuda")
        ep_gpu = torch.export.export(mlp_gpu, (xg,), dynamic_shapes={"x": {0: Dim("batch", min=1, max=128)}})
        gpu_pkg = torch._inductor.aoti_compile_and_package(ep_gpu, package_path=str(OUT / "mlp_aoti_cuda.pt2"))
        gpu_runner = torch._inductor.aoti_load_package(gpu_pkg)
        with torch.inference_mode():
            torch.testing.assert_close(gpu_runner(xg), mlp_gpu(xg), rtol=1e-3, atol=1e-4)
            gpu_table = bench.compare({"eager": mlp_gpu, "AOTInductor": gpu_runner}, xg)
        print(gpu_table)
        gpu_word = gpu_table.verdict("AOTInductor")
        print(f"verdict on this GPU: AOTInductor is {gpu_table.describe('AOTInductor', name='export.aoti.gpu_vs_eager')}: "
              + {"faster": "at batch 8 a GPU often waits on kernel launches (notebook 09's GPU cell shows how to see "
                           "such gaps), and the package launches its fused kernels from C++ where eager launches one "
                           "kernel per operator from Python; this cell does not split the saving between them",
                 "no clear difference": "the saving, if any, came to less than 5% of a call here"
                                        if gpu_table.within_margin("AOTInductor") else
                                        "the saving, if any, stayed inside this run's timing spread (the IQR column)",
                 "slower": "the package's call cost more here than eager's; this cell does not break that down"}[gpu_word])

# %% [markdown]
# ## The C++ path
#
# The package does not need Python. `cpp/aoti_loader/main.cpp` in this repository is a complete
# program: it opens the package with `torch::inductor::AOTIModelPackageLoader`, reads an input
# tensor from a file, runs the model and writes the output to a file. Its core is four lines:

# %%
source = (config.REPO_ROOT / "cpp" / "aoti_loader" / "main.cpp").read_text()
core = [ln for ln in source.splitlines() if any(k in ln for k in ("AOTIModelPackageLoader loader",
        "inputs = {read_tensor", "loader.run(inputs)", "write_tensor(argv[3]"))]
print("\n".join(core))

# %% [markdown]
# The tensors travel through a deliberately plain file format, so the C++ side needs no pickle
# reader: 8 bytes of magic, the number of dimensions, the sizes, then raw little-endian float32
# values (`aoti_cpp.write_tensor` / `read_tensor` on the Python side). Three facts about building
# it against the pip wheel, all handled by `course_utils.deploy.aoti_cpp` and `CMakeLists.txt`:
#
# - the wheel ships headers and `libtorch_cpu.so`; CMake finds them from
#   `torch.utils.cmake_prefix_path`. The program links them directly instead of calling
#   `find_package(Torch)`, which on a CUDA build of the wheel insists on a CUDA toolkit;
# - torch 2.14's headers need C++20 (`CMAKE_CXX_STANDARD 20`);
# - the package's own shared library is opened at run time and needs `libtorch.so`, so the binary
#   runs with the wheel's `lib` folder on `LD_LIBRARY_PATH`.
#
# The build goes to `build/aoti_loader` and is skipped when the binary is newer than its sources.

# %%
problem = aoti_cpp.toolchain_problem()
build = None
if problem:
    print("skipped: the C++ loader cannot be built here:", problem)
    print("everything else in this notebook runs without it")
else:
    try:
        build = aoti_cpp.build_loader()
    except RuntimeError as err:  # e.g. a compiler too old for C++20; tests/test_aoti_cpp.py checks the build
        print("skipped: building the C++ loader failed; the rest of the notebook does not need it.")
        print(str(err)[-1500:])
if build is not None:
    print(f"built {short(build.binary)} in {build.seconds:.0f} s" if build.rebuilt
          else f"reusing {short(build.binary)} (newer than its sources)")
    x_cpp = torch.randn(16, 64)
    cpp_out = aoti_cpp.run_loader(build.binary, package, x_cpp, work_dir=OUT)
    with torch.inference_mode():
        py_out = aoti_mlp(x_cpp)
    cpp_err = (cpp_out - py_out).abs().max().item()
    print(f"C++ output {tuple(cpp_out.shape)}; max |C++ - Python| = {cpp_err:.3g}")
    assert cpp_err <= 1e-5, "the C++ program and Python ran the same package: they must agree"
    bench.record("export.cpp.max_abs_err", cpp_err, "abs", model="MLP(64,128,10)", batch=16)

# %% [markdown]
# The C++ program and Python load the same compiled code and weights, so they agree to the last
# bit or close to it. In a real service the C++ side would keep the loader open and call `run` per
# request rather than start a process per tensor.

# %% [markdown]
# ## C++ without Python: LibTorch
#
# The loader above only *runs* a model that Python compiled. LibTorch, the C++ library underneath
# `torch`, does more: the same tensors, autograd, `torch::nn` modules and `torch::optim` optimizers
# are there in C++, so a program that cannot ship Python can define, train, save and run a model
# itself. The pip wheel already holds LibTorch (headers in `torch/include`, libraries in
# `torch/lib`), so no separate download is needed.
#
# `cpp/libtorch_mlp/main.cpp` is such a program. It trains the digits classifier of notebooks 01
# and 05, `MLP(64, 128, 10, depth=2)` from `course_utils/models/mlp.py`, written again with
# `torch::nn`: two hidden layers of Linear, LayerNorm and GELU inside a `Sequential` registered as
# `net`, so its parameters get the names Python's `state_dict` uses. The model and one training step:

# %%
lt_source = (config.REPO_ROOT / "cpp" / "libtorch_mlp" / "main.cpp").read_text()
lines = lt_source.splitlines()
start = next(i for i, ln in enumerate(lines) if ln.startswith("struct MLPImpl"))
print("\n".join(lines[start:start + 18]))
print("    ...")
step = next(i for i, ln in enumerate(lines) if "cross_entropy(" in ln)
print("\n".join(lines[step - 1:step + 5]))

# %% [markdown]
# Read it next to the Python class: `torch::nn::Linear(width, hidden)` for `nn.Linear`,
# `push_back` for the list of layers, `register_module` where Python assigns an attribute, and
# `TORCH_MODULE(MLP)` to make `MLP` a shared pointer to the module, as `torch::nn`'s own modules
# are. The training step is Python's, spelled in C++: forward, `zero_grad`, `backward`, `step`.
#
# The notebook hands the program the same train/test split as in notebook 05, as four files in the
# tensor format of the loader above (labels as float32), and the shared build helper
# (`course_utils.deploy.cmake_build`, behind both `aoti_cpp` and `libtorch_cpp`) builds it into
# `build/libtorch_mlp`, once per torch installation, and again when its sources change. The program prints one line per epoch (mean
# training loss, seconds) and the test accuracy, then saves the weights:

# %%
from course_utils import threads
from course_utils.data import load_digits_split
from course_utils.deploy import cmake_build, libtorch_cpp

digits = load_digits_split()
LT = {"epochs": config.pick(4, 20), "lr": 1e-3, "batch": 64, "seed": 0, "hidden": 128, "depth": 2}
# One torch thread on each side: this model's operators are small, and on a machine with few cores a second thread
# can add more waiting (woken for every operator) than work, which would blur the comparison of the two languages.
lt_threads = 1
lt_dir = OUT / "libtorch"
trainer = cpp_run = None
problem = cmake_build.toolchain_problem()
if problem:
    print("skipped: the LibTorch program cannot be built here:", problem)
else:
    try:
        trainer = libtorch_cpp.build_trainer()
    except RuntimeError as err:  # e.g. a compiler too old for C++20; tests/test_libtorch_cpp.py checks the build
        print("skipped: building the LibTorch program failed; the rest of the notebook does not need it.")
        print(str(err)[-1500:])
if trainer is not None:
    print(f"built {short(trainer.binary)} in {trainer.seconds:.0f} s" if trainer.rebuilt
          else f"reusing {short(trainer.binary)} (newer than its sources)")
    lt_data = libtorch_cpp.write_dataset(lt_dir / "data", digits.x_train, digits.y_train, digits.x_test, digits.y_test)
    cpp_run = libtorch_cpp.train(trainer.binary, lt_data, lt_dir / "weights.pt", threads=lt_threads, **LT)
    for epoch, (loss, secs) in enumerate(zip(cpp_run.losses, cpp_run.epoch_seconds), 1):
        print(f"C++ epoch {epoch:2d}: loss {loss:.4f}  ({secs * 1e3:.1f} ms)")
    print(f"C++ test accuracy: {cpp_run.correct}/{cpp_run.total} = {cpp_run.accuracy:.4f}")
    assert cpp_run.losses[-1] < cpp_run.losses[0] / 2, "training in C++ must lower the loss"
    assert cpp_run.accuracy > 0.8, "ten classes: a trained MLP is far above chance (0.1)"

# %% [markdown]
# ### Weights that Python loads safely
#
# The program saves with `torch::pickle_save`, which writes the same zip archive as Python's
# `torch.save`. *What* it saves matters: a `c10::Dict` of tensors would be the obvious choice, but
# the C++ pickler wraps every dict and list in a call to `torch.jit._pickle.restore_type_tag` (to
# remember its element types), and `torch.load(..., weights_only=True)`, the only way this course
# loads files, refuses that global. Tuples, strings and tensors need no such call, so the program
# saves a tuple of `(name, tensor)` pairs. The cell shows both sides: the refusal, reproduced in
# Python with a file that names that global, and the C++ file loading into `MLP(64, 128, 10, depth=2)` with
# `load_state_dict`, strictly (every name and shape must match):

# %%
from torch.jit._pickle import restore_type_tag

if cpp_run is not None:
    tagged = io.BytesIO()
    torch.save(restore_type_tag, tagged)  # a file naming the global that wraps every C++-pickled dict
    tagged.seek(0)
    err = expect_error(torch.load, tagged, weights_only=True, match=r"Unsupported global.*restore_type_tag")
    print("weights_only=True on a file that names it:",
          next(ln.strip() for ln in str(err).splitlines() if "Unsupported global" in ln)[:95], "...")

    state = libtorch_cpp.load_weights(cpp_run.weights)  # torch.load(path, weights_only=True), then dict(...)
    print(f"\n{short(cpp_run.weights)}: {len(state)} tensors, {cpp_run.weights.stat().st_size / 1024:.0f} KiB;",
          "first names:", list(state)[:3])
    py_model = MLP(64, 128, 10, depth=2).eval()
    py_model.load_state_dict(state)
    with torch.no_grad():
        py_correct = (py_model(digits.x_test.flatten(1)).argmax(1) == digits.y_test).sum().item()
    acc_gap = abs(py_correct / cpp_run.total - cpp_run.accuracy)
    print(f"test accuracy of the C++-trained weights: {cpp_run.accuracy:.4f} in C++, "
          f"{py_correct / cpp_run.total:.4f} in Python (difference {acc_gap})")
    assert acc_gap == 0, "the same weights on the same test set must classify the same digits"
    bench.record("cpp.train.acc_python_vs_cpp", acc_gap, "abs", epochs=LT["epochs"], test=cpp_run.total)

# %% [markdown]
# ### Inference in C++
#
# `libtorch_mlp infer WEIGHTS INPUT OUTPUT` is the deployment path: it loads the saved pairs with
# `torch::pickle_load`, rebuilds the MLP from the tensors' shapes, and runs it under
# `torch::InferenceMode`, the C++ twin of `torch.inference_mode()`: no autograd history is
# recorded, and the tensors made inside cannot be used for training later. `torch::NoGradGuard`,
# the twin of `torch.no_grad()`, only stops recording gradients: its tensors can be used with
# autograd later, at a little more cost per operator. The same digits through the C++ program and
# through Python:

# %%
if cpp_run is not None:
    x_lt = digits.x_test[:64]
    cpp_logits = libtorch_cpp.infer(trainer.binary, cpp_run.weights, x_lt, work_dir=lt_dir)
    with torch.inference_mode():
        py_logits = py_model(x_lt.flatten(1))
    lt_err = (cpp_logits - py_logits).abs().max().item()
    print(f"C++ logits {tuple(cpp_logits.shape)}; max |C++ - Python| = {lt_err:.3g}")
    assert lt_err <= 1e-5, "the same weights and the same operators: C++ and Python agree within 1e-5"
    assert torch.equal(cpp_logits.argmax(1), py_logits.argmax(1))
    bench.record("cpp.forward.max_abs_err", lt_err, "abs", model="MLP(64,128,10,depth=2)", batch=len(x_lt))

# %% [markdown]
# ### The same training in Python, side by side
#
# Now the same model, data, seed and hyper-parameters in Python. The loop below is the C++ one
# step for step: seed, build the model, Adam, a fresh `randperm` shuffle per epoch, mean loss per
# epoch. `torch::manual_seed` and `torch.manual_seed` seed the same generator, so the two runs start
# from the same weights and see the batches in the same order (`tests/test_libtorch_cpp.py` checks
# the first part). Whether the loss curves then stay together, and which epoch is faster, is
# measured, not assumed; both sides run on one torch thread (this model's operators are small, and
# on a laptop with few cores a second thread can add more waiting than work, which would blur the
# comparison of the two languages; a larger model would use the cores), and the first epoch of
# each run is left out of the timing as warm-up. The two sides take turns, each training twice (C++,
# Python, C++, Python), and their epochs are pooled, so a slow spell of the machine falls on both;
# the cell samples other programs' load after each run, and rerunning it re-times both sides:

# %%
import dataclasses
import math
import time

import torch.nn.functional as F


def train_python(x, y, *, epochs, lr, batch, seed, hidden, depth):
    """Return (model, mean loss per epoch, seconds per epoch): the C++ program's loop, in Python."""
    torch.manual_seed(seed)
    model = MLP(x.shape[1], hidden, int(y.max()) + 1, depth=depth)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, seconds = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(x))
        total = 0.0
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        seconds.append(time.perf_counter() - start)
        losses.append(total / len(x))
    return model.eval(), losses, seconds


# The two sides take turns, C++ then Python, ROUNDS times each, and their epochs are pooled, so a slow spell of the
# machine falls on both; other programs' load is sampled after each run. (Every run starts from the same seed, so
# the losses of every round are the same; the C++ run of the cell above gives the curve compared below.)
ROUNDS = 2
py_seconds, cpp_seconds, loads = [], [], []
for _ in range(ROUNDS):
    if cpp_run is not None:
        timed = libtorch_cpp.train(trainer.binary, lt_data, lt_dir / "weights-timed.pt", threads=lt_threads, **LT)
        cpp_seconds += timed.epoch_seconds[1:]  # every epoch but each run's first (its warm-up)
        loads.append(threads.other_load())
    process_threads = torch.get_num_threads()
    torch.set_num_threads(lt_threads)  # the same threads as the C++ side
    try:
        py_trained, py_losses, seconds = train_python(digits.x_train.flatten(1), digits.y_train, **LT)
    finally:
        torch.set_num_threads(process_threads)
    py_seconds += seconds[1:]
    loads.append(threads.other_load())
with torch.no_grad():
    py_acc = (py_trained(digits.x_test.flatten(1)).argmax(1) == digits.y_test).float().mean().item()
print(f"Python: final loss {py_losses[-1]:.4f}, test accuracy {py_acc:.4f}")
assert py_losses[-1] < py_losses[0] / 2
if cpp_run is not None:
    curve_gap = max(abs(a - b) for a, b in zip(py_losses, cpp_run.losses))
    bench.record_verdict("export.cpp.train.loss_curves", "same curve" if curve_gap < 1e-5 else "drift apart", gap=curve_gap)
    print(f"C++:    final loss {cpp_run.losses[-1]:.4f}, test accuracy {cpp_run.accuracy:.4f}")
    cpp_loss_resolution = 5e-13  # main.cpp prints each epoch's loss with twelve decimals
    # the largest gap relative to the loss, in float32 rounding steps (torch.finfo(float32).eps)
    f32_steps = max(abs(a - b) / b for a, b in zip(py_losses, cpp_run.losses)) / torch.finfo(torch.float32).eps
    if curve_gap <= cpp_loss_resolution:
        parity = "no difference visible at the 5e-13 resolution of the C++ program's printed losses"
    elif curve_gap < 1e-5:
        parity = (f"above the 5e-13 resolution of the C++ program's printed losses, so the two runs differ, "
                  f"by at most {f32_steps:.2g} float32 rounding steps of the loss: the same curve to 1e-5 (the "
                  "likely source: the two optimizer steps are not the same code, Python's Adam updates its first "
                  "moment with lerp_, LibTorch's C++ Adam with mul_ and add_, which round differently; this cell "
                  "does not test it)")
    else:
        parity = f"the curves drift apart (more than 1e-5, {f32_steps:.2g} float32 rounding steps of the loss)"
    print(f"largest per-epoch loss difference, Python vs C++: {curve_gap:.2g} ({parity}; "
          "both start from the same weights and see the same shuffles)")
    # every epoch after the first, as timed samples: a verdict that allows for their spread
    epoch_table = bench.Comparison.from_samples({"Python": py_seconds, "C++": cpp_seconds})
    sampled = [x for x in loads if x is not None]
    if sampled:  # the busiest sample after a run: a spread note names it (bench.Comparison.other_load)
        epoch_table = dataclasses.replace(epoch_table, other_load=max(sampled))
    cpp_epoch_s = epoch_table.row("C++").median_s
    py_epoch_s = epoch_table.row("Python").median_s
    loads_said = ("other programs' load could not be sampled" if not sampled else
                  f"other programs used at most about {max(sampled):.1f} cores just after a run")
    print(f"\ntime per epoch: {ROUNDS} runs on each side, taking turns (C++, Python, C++, ...), {LT['epochs'] - 1} "
          f"epochs after a warm-up one in each run, {counted(lt_threads, 'thread')}; medians and IQRs over the pooled "
          "epochs:")
    print(epoch_table.format())
    print("verdict on this machine: C++ is "
          + epoch_table.describe("C++", "Python", name="export.cpp.train.epoch_time") + " per epoch")
    verdict = epoch_table.verdict("C++", "Python")
    steps = math.ceil(len(digits.x_train) / LT["batch"])
    # The machine's own speed is not sampled; how much each side's epochs varied says how far it can move.
    extremes = {"Python": (max(py_seconds), min(py_seconds)), "C++": (max(cpp_seconds), min(cpp_seconds))}
    wide = max(extremes, key=lambda side: extremes[side][0] / extremes[side][1])
    slowest, fastest = extremes[wide]
    swing = slowest / fastest
    gap = max(py_epoch_s, cpp_epoch_s) / min(py_epoch_s, cpp_epoch_s)
    swing_said = (f"{wide}'s slowest epoch took {swing:.2f}x its fastest ({slowest * 1e3:.1f} against "
                  f"{fastest * 1e3:.1f} ms), {'under' if swing < gap else 'more than'} the {gap:.2f}x gap")
    if swing < gap:
        tail = f" ({loads_said}; {swing_said})"
    else:
        tail = (f". Each side's own epochs varied more than the gap between the sides ({swing_said}), so this "
                f"ranking is rough, though the turns spread a slow spell of the machine over both ({loads_said})")
    print(f"epochs after each run's first: Python {min(py_seconds) * 1e3:.1f}-{max(py_seconds) * 1e3:.1f} ms, "
          f"C++ {min(cpp_seconds) * 1e3:.1f}-{max(cpp_seconds) * 1e3:.1f} ms")
    print(f"per training step ({steps} per epoch): Python {py_epoch_s / steps * 1e6:.0f} µs, "
          f"C++ {cpp_epoch_s / steps * 1e6:.0f} µs; the model's forward and backward run the same libtorch kernels "
          "(the optimizer steps differ slightly), so " + {
              "faster": f"the difference {'likely lies' if swing < gap else 'may lie'} in the work around those "
                        "kernels: Python's interpreter and module calls, and each program's optimizer implementation, "
                        f"threads and memory allocation; this cell does not break it down{tail}",
              "no clear difference": "the work around those kernels (Python's interpreter and module calls, and "
                                     "each program's optimizer, threads and memory allocation) came to about the "
                                     "same in both programs here"
                                     if epoch_table.within_margin("C++", "Python") else
                                     "whatever the work around them costs was lost in the epochs' spread here "
                                     "(the IQRs above)",
              "slower": "the gap is not Python's overhead (C++ has none): it is "
                        f"{'likely' if swing < gap else 'possibly'} how each program uses those kernels (the "
                        "optimizer's implementation, threads, memory allocation), which this cell does not break "
                        f"down{tail}"}[verdict])
    bench.record("cpp.train.epoch_s", cpp_epoch_s, "s", python_epoch_s=py_epoch_s, epochs=LT["epochs"],
                 threads=lt_threads, train_size=len(digits.x_train), batch=LT["batch"])

# %% [markdown]
# ### What each C++ program needs at run time
#
# Two ways to get a model into a C++ program now sit side by side: the LibTorch program (model
# code compiled into the program, weights in a file) and the AOTInductor loader (model code
# compiled by Inductor into the `.pt2` package's shared object, opened at run time). What each
# needs on the target machine, measured from the files on this one (`ldd` lists the shared
# libraries a binary loads; Linux only):

# %%
import zipfile
from pathlib import Path


def runtime_needs(label, binary, extra_files=(), opened=()):
    """One row: the binary, the files beside it, and the shared libraries they load, grouped by origin."""
    libs = {}
    for path in (binary, *opened):
        for lib in cmake_build.shared_libraries(path):
            libs.setdefault(lib.name, lib)
    by_origin = {}
    for lib in libs.values():
        by_origin.setdefault(lib.origin, []).append(lib)
    files_mb = sum(p.stat().st_size for p in (binary, *extra_files)) / 1e6
    torch_mb = sum(lib.size_bytes for lib in by_origin.get("torch", [])) / 1e6
    wheels_mb = sum(lib.size_bytes for lib in by_origin.get("python package", [])) / 1e6
    return {"label": label, "files_mb": files_mb, "torch_mb": torch_mb, "wheels_mb": wheels_mb, "by_origin": by_origin,
            "names": set(libs)}


if not sys.platform.startswith("linux"):
    print(f"skipped: this measurement uses ldd, which is Linux-only (this is {sys.platform})")
elif trainer is None or build is None:
    print("skipped: needs both C++ programs built (see the cells above)")
else:
    so_dir = OUT / "aoti_package_so"
    with zipfile.ZipFile(package) as zf:  # the shared object inside the package, as the loader unpacks it
        so_name = next(n for n in zf.namelist() if n.endswith(".so"))
        package_so = Path(zf.extract(so_name, so_dir))
    rows = [runtime_needs("LibTorch program + weights", trainer.binary, [cpp_run.weights]),
            runtime_needs("AOTI loader + .pt2 package", build.binary, [package], opened=[package_so])]
    for row in rows:
        print(f"{row['label']}: program and model files {row['files_mb']:.2f} MB; "
              f"torch libraries {row['torch_mb']:.0f} MB; other wheels' libraries {row['wheels_mb']:.0f} MB")
        for origin, libs in sorted(row["by_origin"].items()):
            print(f"   {origin:15s} " + ", ".join(sorted(lib.name for lib in libs)))
    for row in rows:
        assert "libtorch_cpu.so" in row["names"], "both programs run on libtorch"
        assert not any(name.startswith("libpython") for name in row["names"]), "neither needs Python"
        assert row["by_origin"].get("missing") is None, "every library resolved"
        assert row["files_mb"] < row["torch_mb"], "the program and model are small next to libtorch"
    only_aoti = sorted(rows[1]["names"] - rows[0]["names"])
    print("\nloaded only on the AOTI side:", only_aoti or "nothing")
    total_mb = [row["torch_mb"] + row["wheels_mb"] for row in rows]
    print(f"libraries in all: {total_mb[0]:.0f} MB for the LibTorch program, {total_mb[1]:.0f} MB for the AOTI loader "
          f"({total_mb[1] / total_mb[0]:.1f}x)" + (": the package's library links libtorch.so, which on this CUDA build "
                                                    "of torch pulls in libtorch_cuda.so and NVIDIA's libraries"
                                                    if "libtorch_cuda.so" in only_aoti else ""))

# %% [markdown]
# Neither program needs Python, and both need libtorch: the program and model files are small
# next to the torch libraries they load (asserted), so shipping either means shipping
# `libtorch_cpu` with it (LibTorch's own download, or the wheel's `lib` folder as here). The
# LibTorch program carries its model *code* inside the binary, so a change of architecture means
# recompiling C++; the AOTI loader is generic, and any package built for this torch version runs
# in it. The package's shared object is opened at run time, which is why the loader runs with the
# wheel's `lib` folder on `LD_LIBRARY_PATH`; the last line lists what it loads that the LibTorch
# program does not. If that names `libtorch_cuda.so`, the package's library links the whole
# `libtorch.so`, CUDA half included, although the package was compiled for the CPU (the line
# under the list gives both totals). If the lists name `libcudart`, the wheel is a CUDA build, and
# NVIDIA's runtime comes along even for a run on the CPU. Training is only possible on the
# LibTorch side: a `.pt2` package holds a forward pass and nothing else.

# %% [markdown]
# ## ExecuTorch: the mobile path
#
# For phones and microcontrollers, ExecuTorch takes the same `ExportedProgram` further:
#
# 1. `to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])` converts it to the
#    **Edge dialect** (core ATen with dtype rules fixed, except operators the partitioner asks to
#    keep whole, such as `linear` in the table below, printed where ExecuTorch is installed) and hands every subgraph that the XNNPACK
#    back end supports (optimised CPU kernels for Arm and x86) to that back end, as a *delegate*;
#    whatever XNNPACK does not take stays on ExecuTorch's portable kernels;
# 2. `.to_executorch()` plans memory and serialises a `.pte` flatbuffer;
# 3. the ExecuTorch runtime (a small C++ library; the Python binding used here exists for testing)
#    loads the `.pte` and runs it.
#
# ExecuTorch is an optional extra of the course, and `make setup` does not install it: each
# ExecuTorch release is built for one torch release, its Python binding links libtorch, and its
# package metadata names no torch version, so pip cannot refuse a wrong pair. The course tests one
# pair, pinned in `constraints-executorch.txt` on top of `constraints.txt`: `make executorch` builds a
# separate environment, `.venv-et`, with it and installs a kernel for that environment
# ("PyTorch 2 course + ExecuTorch"), and `make test-executorch` (a CI job of its own) runs this
# notebook and `tests/test_executorch.py` there. Choose that kernel in JupyterLab to run this part.
#
# The cell below detects ExecuTorch and, where it is installed, lowers `ep_mlp`: the exported MLP,
# with its batch dimension in `[1, 128]`, that AOTInductor compiled above.

# %%
import importlib.metadata


def read_pins(path) -> dict[str, str]:
    """Return {package: version} for the name==version lines of a constraints file ({} if it is missing)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(ln.split("#")[0].strip().lower().split("==", 1) for ln in lines if "==" in ln.split("#")[0])


tested = {**read_pins(config.REPO_ROOT / "constraints.txt"), **read_pins(config.REPO_ROOT / "constraints-executorch.txt")}


@contextlib.contextmanager
def runtime_log(lines: list):
    """Collect ExecuTorch's log lines into ``lines`` instead of showing them. Its Python binding sends
    them to ``sys.stderr`` inside Jupyter and to file descriptor 2 in a plain script: catch both."""
    sys.stderr.flush()
    saved, text = os.dup(2), io.StringIO()
    with open(OUT / "runtime_log.txt", "w+") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stderr(text):
                yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += [ln.strip() for ln in (text.getvalue() + sink.read()).splitlines() if ln.strip()]


try:
    with runtime_log([]):  # ExecuTorch's native libraries log their CPU probing when loaded
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import to_edge_transform_and_lower
        from executorch.runtime import Runtime
    has_executorch = True
except ImportError as err:
    has_executorch = False
    missing = f"no module named {err.name}" if err.name else str(err)
    print(f"skipped: ExecuTorch is not installed here ({missing}); the rest of the notebook does not need it.")
    print(f"The course tests executorch {tested.get('executorch')} with torch {tested.get('torch')}. To run this part:")
    print("  make executorch        # builds .venv-et with that pair, and its kernel")
    print('then reopen this notebook with the kernel "PyTorch 2 course + ExecuTorch".')
    print("make test-executorch runs this notebook and tests/test_executorch.py in that environment (CI does too).")
    print("In an environment of your own, install the ExecuTorch release whose release notes name your torch:")
    print("pip does not check the pair.")

if has_executorch:
    et_version, torch_version = importlib.metadata.version("executorch"), torch.__version__.split("+")[0]
    pair_ok = (et_version, torch_version) == (tested.get("executorch"), tested.get("torch"))
    print(f"executorch {et_version} beside torch {torch_version}: " + (
        "the pair the course tests" if pair_ok else
        f"NOT the tested pair (executorch {tested.get('executorch')} with torch {tested.get('torch')}); expect surprises"))
    # XNNPACK's own thread pool, which torch.set_num_threads does not reach: one thread, like the timings
    # of this notebook, set before any program is loaded (the binding's helper for it is marked unsafe
    # once delegates exist, so a re-run of this cell after loading leaves it alone).
    from executorch.extension.pybindings import portable_lib

    count_pool = getattr(portable_lib, "_threadpool_get_thread_count", lambda: None)
    reset_pool = getattr(portable_lib, "_unsafe_reset_threadpool", None)
    with runtime_log([]):  # the first look at the pool probes the CPU, and logs it
        pool_size = count_pool()
        if reset_pool is not None and pool_size != 1 and "method" not in globals():
            reset_pool(1)
        et_threads = count_pool()
    print(f"XNNPACK thread pool: {counted(pool_size, 'thread')} by default, {et_threads} now")
    lowered = {}

    def lower_to_xnnpack() -> None:
        lowered["edge"] = to_edge_transform_and_lower(ep_mlp, partitioner=[XnnpackPartitioner()])

    with runtime_log([]), quiet_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lower_s = bench.first_call(lower_to_xnnpack)
    edge = lowered["edge"]
    # Read the split now: to_executorch() rewrites the graph (out-variants and memory allocations).
    split = get_delegation_info(edge.exported_program().graph_module)
    aten_rows = sorted((b for b in split.delegation_by_operator.values() if b.op_type.startswith("aten")),
                       key=lambda b: b.op_type)
    print(f"\nlowered in {lower_s:.1f} s: {split.num_delegated_subgraphs} subgraphs handed to XNNPACK")
    print(f"{'operator':32s} {'in XNNPACK':>10s} {'outside':>8s}")
    for b in aten_rows:
        print(f"{b.op_type:32s} {b.delegated:>10d} {b.non_delegated:>8d}")
    portable_ops = sum(b.non_delegated for b in aten_rows)
    left_out = [b.op_type for b in aten_rows if b.non_delegated]
    print("left to the portable kernels:", left_out or "nothing")
    assert any(b.op_type == "aten_linear_default" and b.delegated and not b.non_delegated for b in aten_rows), \
        "XNNPACK takes every linear layer"

    with runtime_log([]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        et_program = edge.to_executorch()
    pte = OUT / "mlp_xnnpack.pte"
    pte.write_bytes(et_program.buffer)
    weights_kib = sum(p.numel() * p.element_size() for p in mlp.parameters()) / 1024
    pte_kib = pte.stat().st_size / 1024
    print(f"\n{short(pte)}: {pte_kib:.0f} KiB, of which the float32 weights are {weights_kib:.0f} KiB")
    assert weights_kib < pte_kib < 2 * weights_kib, "the weights are most of the file"

# %% [markdown]
# Where ExecuTorch is installed, the table counts each operator inside and outside the delegated
# subgraphs. Every operator left
# outside runs on ExecuTorch's portable kernels, plain C++ written for any CPU, and every boundary
# between a delegate and a portable kernel splits the graph into one more XNNPACK call: check that
# split for any model you ship. The `.pte` itself is mostly the weights; the program around them
# is small.
#
# Now load it with the runtime and run it. The memory plan was made for the largest input the
# export allows, so the method's metadata shows the planned input size; batches of every size in
# the range must give eager's numbers. Compare a batch above the range with the AOTInductor
# package earlier, which ran one without complaint:

# %%
if has_executorch:
    with runtime_log([]):  # the runtime logs its CPU probing at start-up
        method = Runtime.get().load_program(str(pte)).load_method("forward")
    planned = method.metadata.input_tensor_meta(0)
    print("planned input:", planned)
    assert tuple(planned.sizes()) == (128, 64), "memory is planned for the largest batch the export allows"
    et_errs = {}
    with torch.inference_mode():
        for n in (1, 8, 128):
            xb = torch.randn(n, 64)
            et_errs[n] = (method.execute([xb])[0] - mlp(xb)).abs().max().item()
    et_err = max(et_errs.values())
    print("max |ExecuTorch - eager| by batch size:", {n: f"{e:.2g}" for n, e in et_errs.items()})
    assert et_err <= 1e-5, "the .pte and eager run the same float32 model"
    bench.record("executorch.max_abs_err", et_err, "abs", model="MLP(64,128,10)", batches="1,8,128",
                 delegated_subgraphs=split.num_delegated_subgraphs, portable_ops=portable_ops,
                 pte_kib=round(pte_kib, 1), executorch=et_version)

    refusal_log = []

    def execute_logged(x: torch.Tensor):
        with runtime_log(refusal_log):
            return method.execute([x])

    err = expect_error(execute_logged, torch.randn(129, 64), match=r"set_inputs|resiz")
    print("\nbatch 129 (above max=128):", first_line(err))
    print("the runtime's log says why:", *(f"\n  {ln}" for ln in refusal_log))
    assert any("resize" in ln for ln in refusal_log), refusal_log
else:
    print("skipped: ExecuTorch is not installed here (the cell that looked for it says how to add it)")

# %% [markdown]
# Given a batch above its range, the AOTInductor package runs code that was never checked for it
# (unless `AOTI_RUNTIME_CHECK_INPUTS=1`); where ExecuTorch is installed, its runtime refuses it: the
# input does not fit the memory it planned, and it says so. Export without a `Dim` and the plan is
# for exactly the example's shape: the runtime then has no room to resize the input (try another
# batch size on such a `.pte` to see its message).
#
# ### How fast, here
#
# The same batch of 8 through eager, the AOTInductor package and the `.pte`, side by side on one
# thread, as for AOTInductor above. XNNPACK runs on a thread pool of its own, which torch's
# thread setting does not reach: where ExecuTorch is installed, the first ExecuTorch cell set that
# pool to one thread, before any program was loaded, with a private helper of the Python binding
# (`_unsafe_reset_threadpool`; an app sizes the pool in C++), and printed both sizes. On a desktop CPU this says little about a
# phone: what it shows is what the runtime's call path costs next to the other two.

# %%
if has_executorch:
    def run_pte(x: torch.Tensor) -> torch.Tensor:
        return method.execute([x])[0]

    eager_ops = sum(1 for n in ep_mlp.graph.nodes if n.op == "call_function")
    with torch.inference_mode():
        et_table = bench.compare({"eager": mlp, "AOTInductor": aoti_mlp, "ExecuTorch": run_pte}, x_mlp, num_threads=1)
    print(et_table)
    print(f"(torch on 1 thread; XNNPACK's pool on {counted(et_threads, 'thread')})")
    et_word = et_table.verdict("ExecuTorch")
    print(f"verdict on this machine: ExecuTorch is {et_table.describe('ExecuTorch', name='export.executorch.vs_eager')}: " + {
        "faster": f"eager dispatches the graph's {eager_ops} operators one by one from Python; the .pte makes "
                  f"{split.num_delegated_subgraphs} XNNPACK calls and {portable_ops} portable kernel calls from C++",
        "no clear difference": "the saving, if any, came to less than 5% of a call here"
                               if et_table.within_margin("ExecuTorch") else
                               "the saving, if any, stayed inside this run's timing spread (the IQR column)",
        "slower": "the binding's call path cost more here than the per-operator overhead it removes "
                  "(this cell does not break that down)"}[et_word])
    vs_aoti = et_table.verdict("ExecuTorch", "AOTInductor")
    print(f"verdict on this machine: against AOTInductor, ExecuTorch is "
          f"{et_table.describe('ExecuTorch', 'AOTInductor', name='export.executorch.vs_aoti')}: " + {
              "faster": "both run the whole graph from C++; what differs is the kernels (XNNPACK's against Inductor's "
                        "generated loop and the library GEMM), which this cell does not break down",
              "no clear difference": "both run the whole graph from C++, and their kernels came to within 5% of each "
                                     "other at this size" if et_table.within_margin("ExecuTorch", "AOTInductor") else
                                     "both run the whole graph from C++; any difference between their kernels stayed "
                                     "inside this run's timing spread (the IQR column)",
              "slower": f"Inductor fused LayerNorm and GELU into one generated loop (asserted above), while the .pte "
                        f"runs {counted(portable_ops, 'portable kernel call')} outside XNNPACK and crosses into it "
                        f"{split.num_delegated_subgraphs} times; this cell does not measure which of these costs the "
                        "time"}[vs_aoti])
    bench.bar_chart(et_table, title="MLP(64, 128, 10), batch 8, CPU, one thread");
else:
    print("skipped: ExecuTorch is not installed here (the cell that looked for it says how to add it)")


# %% [markdown]
# All three run the same weights, and where ExecuTorch is installed the cells above check that they
# agree on the numbers; they differ in where they can run.
# Eager needs Python; the AOTInductor package needs libtorch and a loader built for the same torch;
# the `.pte` needs only the ExecuTorch runtime and the kernels compiled into it, which is what makes
# it fit a phone app or a microcontroller's firmware. ExecuTorch's speed on a phone depends on that
# phone's CPU and on which back end takes the graph (XNNPACK here; Core ML, Vulkan, Qualcomm's QNN
# and others elsewhere), so measure it there; the verdicts above (with ExecuTorch installed) only rank
# the three on this machine.
#
# ## Check yourself
#
# **Exercise 1.** A module's `forward(self, x)` takes `x` of shape `(batch, 8)` and starts with a
# `Linear(8, 3)`. Build the `dynamic_shapes` argument for `torch.export.export` so that any batch
# size from 1 to 256 is accepted and the feature dimension stays static. (The checker exports such a
# module with an example input of batch 4.)

# %%
def my_dynamic_shapes():
    # Your code here: return the dynamic_shapes argument (a dict keyed by argument name).
    return None


exercises.check("06.dynamic_batch", my_dynamic_shapes())


# %% [markdown]
# **Exercise 2.** This function cannot be exported (why not?):
#
# ```python
# def rescale(x):
#     peak = x.abs().max()
#     return x / peak if peak > 1 else x
# ```
#
# Rewrite it so that `torch.export.export` captures it and the exported program still divides by
# the peak only when the peak is above 1. The checker exports your function and runs the program
# on inputs that need each branch.

# %%
def rescale(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    # Your code here: replace the Python `if` with something export can capture.
    return x / peak if peak > 1 else x


exercises.check("06.cond_export", rescale)


# %% [markdown]
# **Exercise 3.** The LibTorch program prints one line per epoch and then the test accuracy, in
# this format (the times and the accuracy are an example; your numbers will differ):
#
# ```
# epoch 1 loss 1.512949182311 seconds 0.0162
# epoch 2 loss 0.581447566217 seconds 0.0080
# epoch 3 loss 0.299761054102 seconds 0.0075
# test accuracy 434/450
# saved build/nb06/libtorch/weights.pt
# ```
#
# Write `summarise_run(text)` that returns `(the last epoch's loss, the test accuracy as a fraction)`
# from such text. (`course_utils.deploy.libtorch_cpp.parse_train_output` does this for the notebook;
# write your own without it.)

# %%
def summarise_run(text: str) -> tuple[float, float]:
    # Your code here: find the last "epoch ..." line and the "test accuracy C/T" line.
    return 0.0, 0.0


exercises.check("06.read_cpp_output", summarise_run)

# %% [markdown]
# Stuck? `print(exercises.solution_source("06.cond_export"))` shows a reference solution
# (likewise for `"06.dynamic_batch"` and `"06.read_cpp_output"`); try for yourself first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.
#
# ## Summary
#
# - `torch.export.export` captures a whole model ahead of time as an `ExportedProgram`: an ATen
#   graph with the weights as inputs, a signature, and range constraints; `.module()` runs it and
#   checks shapes on every call. It never falls back to Python: what it cannot capture is an error.
# - Sizes are fixed unless you name them with `Dim(min=, max=)`; derived dims express relations,
#   `Dim.AUTO` lets export infer them. Out-of-range inputs are refused by the exported module.
# - The installed torch traces non-strict by default (your Python runs once on fake tensors);
#   strict mode uses TorchDynamo. Non-strict freezes Python values such as a random draw; strict
#   refuses them. Branches on data need `torch.cond` (or `torch.where`); `draft_export` lists
#   every problem at once.
# - `run_decompositions` lowers to core ATen; `torch.export.save` / `load` round-trips the program
#   and its weights (the save cell prints the largest difference from the original model).
# - A Python `if` on a value read from the data cannot be traced; `torch._check` states a fact the
#   tracer may assume, and the exported program checks it on every call.
# - TorchScript is deprecated; where the old table says export "supports data-dependent control
#   flow", it means: once you rewrite the branch with `torch.cond`.
# - AOTInductor compiles the program into a `.pt2` package that Python and C++ load. On a small MLP
#   it removes eager's per-operator overhead (the verdict says whether that showed on your machine),
#   costs a long compile, and does not check input shapes unless
#   `AOTI_RUNTIME_CHECK_INPUTS=1`. A short CMake project runs it from C++ with the same results.
# - LibTorch is PyTorch in C++: `torch::nn`, `torch::optim` and autograd trained the digits MLP in
#   a C++ program; `torch::pickle_save` of (name, tensor) pairs gave a file Python loads with
#   `weights_only=True` (a C++ dict would not load), with the same accuracy in both languages and
#   the same outputs within 1e-5. Both C++ programs need libtorch at run time and no Python.
# - ExecuTorch lowers the same program to a `.pte` for mobile, delegating what XNNPACK supports and
#   leaving the rest to portable kernels; where it is installed, its runtime refuses an input that
#   does not fit the memory it planned. The course tests it in an environment of its own
#   (`make executorch`, `make test-executorch`).
#
# **Next:** notebook 07 exports to ONNX and runs the model in ONNX Runtime.
#
# ## Further reading
#
# - [`torch.export` documentation](https://docs.pytorch.org/docs/stable/export.html) and its
#   [programming model](https://docs.pytorch.org/docs/stable/export/programming_model.html)
#   (strict and non-strict tracing)
# - [`torch.export` tutorial](https://docs.pytorch.org/tutorials/intermediate/torch_export_tutorial.html)
# - [AOTInductor](https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html) (including the C++ loader)
# - [`draft_export`](https://docs.pytorch.org/docs/stable/export/draft_export.html)
# - [TorchScript (deprecated)](https://docs.pytorch.org/docs/stable/jit.html)
# - [ExecuTorch documentation](https://docs.pytorch.org/executorch/stable/index.html) and its
#   [XNNPACK back end](https://docs.pytorch.org/executorch/stable/backends-xnnpack.html)
