# %% [markdown]
# # 02 · Graph breaks, guards and recompilation
#
# By default, `torch.compile` never refuses your code. When TorchDynamo meets a line it cannot put into a graph,
# it quietly splits your function into several compiled pieces glued together by ordinary Python,
# and when a call arrives with inputs unlike the ones it compiled for, it quietly compiles again.
# Both keep your program correct, and both can eat the speed-up you compiled for without a single
# error message. This notebook makes them visible: it finds every graph break and its reason,
# fixes each kind of break, shows the *guards* that decide when code is recompiled, and measures
# what the breaks cost.

# %% [markdown]
# ## What you will learn
#
# - what a graph break is, how to list every break and its reason with `torch._dynamo.explain`,
#   and which common patterns break on the torch you have installed (some that used to, no longer do);
# - the fix for each kind of break: moving work out, `torch.where` and `torch.cond`,
#   `capture_scalar_outputs`, custom operators, `torch.compiler.disable`, `allow_in_graph` and
#   `nonstrict_trace`, and `fullgraph=True` to turn any remaining break into an error;
# - how to watch the compiler with `TORCH_LOGS` (`graph_breaks`, `recompiles`, `guards`);
# - guards and recompilation: which changes (shape, dtype, strides, a Python number) recompile,
#   dynamic shapes (`dynamic=True`, `mark_dynamic`, automatic dynamic), one graph that includes
#   sizes 0 and 1 (`mark_unbacked`, `backed_size_oblivious`) and what it can get wrong, the recompile
#   limit, and `torch.compiler.set_stance`;
# - what graph breaks cost, measured on a function with three breaks against its fixed version.
#
# **Prerequisites:** notebook 00 (a first `torch.compile`, timing with `course_utils.bench`);
# notebook 01 (compile modes and backends) helps but is not required.
#
# **Time on a laptop CPU:** <!-- stamp:time -->0.8 min the first time (every cache empty), 0.8 min after that (compile cache warm, yet no faster in these two runs), 0.5 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time -->
#
# **GPU:** not needed. One guarded cell repeats the cost measurement on a GPU, where `.item()`
# also makes the CPU wait for the GPU.

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
import re
import subprocess
import sys
import textwrap
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import scipy.special
import torch
import torch._dynamo
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils import bench, compat, config, exercises, session
from course_utils.breaks import break_report
from course_utils.inductor_code import fused_kernels, generated_code, scalar_note
from course_utils.device import accelerator, requires_accelerator
from course_utils.text import counted

print(session.start(seed=0))


# %% [markdown]
# ## The idea: one function, several graphs
#
# When you call a compiled function, TorchDynamo runs its Python bytecode *symbolically*: it
# computes nothing, it records every tensor operation into an FX graph. Python it can simulate
# (arithmetic on numbers, lists, dicts, calls into other Python functions, many NumPy calls) it
# follows, recording only the tensor work that comes out of it. When it meets something it
# cannot follow, typically code whose behaviour depends on the *values* inside a tensor, or a
# call into code it cannot see inside, it does not give up. It makes a **graph break**:
#
# 1. it ends the graph recorded so far and hands it to the backend to compile;
# 2. it emits bytecode that runs the troublesome line as ordinary Python;
# 3. it continues with the rest of the function as a new *resume function*, traced and compiled
#    on its own, so the rest of the function becomes another graph.
#
# The program stays correct; it now runs as several compiled pieces with Python in between.
# `torch._dynamo.explain(fn)(*args)` runs `fn` once under a recording backend and reports how many
# graphs it got, what is in each, and why it had to break.

# %%
def relu_then_report(x: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x)
    print(f"  (printed inside the function) relu done on {y.shape[0]} rows")
    return y @ y.t()


x = torch.randn(4, 4)
explanation = torch._dynamo.explain(relu_then_report)(x)

print(f"graphs: {explanation.graph_count}, graph breaks: {explanation.graph_break_count}")
for reason in explanation.break_reasons:
    print(f"break: {reason.reason.strip().splitlines()[0]!r} at `{reason.user_stack[-1].line.strip()}`")
for i, ops in enumerate(explanation.ops_per_graph, 1):
    print(f"graph {i} ops: {[getattr(op, '__name__', str(op)) for op in ops]}")
print("\ngraph 2 as code (its input is y, handed over from the Python in between):")
print("\n".join(line for line in explanation.graphs[1].code.strip().splitlines() if line.strip()))

assert explanation.graph_count == 2 and explanation.graph_break_count == 1


# %% [markdown]
# The `print` split the function in two: graph 1 holds the ReLU, the `print` ran as plain
# Python, and graph 2 takes `y` as an input and does the matrix product. Each graph is compiled
# and optimised on its own. A break has three costs (the end of the notebook times a function
# with and without its breaks: on a tiny input these costs are all there is; on a large tensor the
# one fused loop is different code from the separate ones, and the comparison can go either way):
#
# - **no fusion across the break**: a value that crosses it is written to memory in full and read
#   back, instead of staying in registers inside one fused loop;
# - **Python between the graphs** on every call: leave compiled code, run the line, enter the next
#   graph;
# - **more guards**: each graph checks its own inputs on every call, and each can recompile on its own.
#
# Two things about `explain` itself. It calls `torch._dynamo.reset()` before and after, which throws
# away *every* compiled function in the process: use it to diagnose, never between a compile and a
# benchmark. And `graph_break_count` is simply `graph_count - 1`: it counts graphs, not breaks. A
# break with nothing to compile on one side of it adds no graph:

# %%
def report_at_the_end(x: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x) * 2
    print("  (printed inside the function) done")
    return y


late = torch._dynamo.explain(report_at_the_end)(x)
print(f"graph_count={late.graph_count}, graph_break_count={late.graph_break_count}, "
      f"len(break_reasons)={len(late.break_reasons)}")
assert (late.graph_count, late.graph_break_count, len(late.break_reasons)) == (1, 0, 1)

# %% [markdown]
# Dynamo did break at the `print` (one reason), but there was nothing after it to compile, so
# the graph count stays at 1. In this notebook "the number of graph breaks" is therefore
# `len(break_reasons)`, the number of times Dynamo had to stop. From here on `break_report(fn, *args)`
# (from `course_utils.breaks`, a wrapper around `explain`) returns it as `.breaks`, together with the
# number of graphs (`.graphs`) and the first line of each reason (`.reasons`, and `.first_reason`).
#
# ## A catalogue of graph breaks, checked on your torch
#
# Lists of "things that break the graph" go out of date: Dynamo learns to trace more with each
# release. So instead of trusting a list, each pattern below goes through `explain` on the torch
# you have installed. Every function does tensor work before and after the pattern, so a break
# shows up as a second graph.

# %%
logger = logging.getLogger("course.nb02")  # a library-style logger; DEBUG messages are filtered out


def with_print(x):
    y = torch.relu(x)
    print("checkpoint")
    return y * 2


def with_data_dependent_if(x):
    y = torch.relu(x)
    if y.sum() > 10:                 # Python needs a real bool, i.e. the tensor's value
        return y * 2
    return y * 3


def with_item(x):
    y = torch.relu(x)
    total = y.sum().item()           # a Python float out of a tensor
    return y / total


def with_tolist(x):
    y = torch.relu(x)
    first_row = y[0].tolist()        # Python floats out of a tensor
    return y * first_row[0]


def with_numpy(x):
    y = torch.relu(x)
    a = np.tanh(y.numpy())           # NumPy on the tensor's data
    return torch.from_numpy(a) * 2


def with_scipy(x):
    y = torch.relu(x)
    a = scipy.special.expit(y.numpy())   # compiled library code Dynamo cannot look into
    return torch.from_numpy(a) * 2


def with_timer(x):
    y = torch.relu(x)
    started = time.perf_counter()    # noqa: F841 (a C builtin Dynamo has no model of)
    return y * 2


def with_logging(x):
    y = torch.relu(x)
    logger.debug("relu done")        # breaks even though the message is never printed
    return y * 2


def with_try_except(x, table):
    try:
        scale = table["scale"]
    except KeyError:
        scale = 1.0
    return torch.relu(x) * scale


def with_getattr(x, layer):
    weight = getattr(layer, "weight")
    return torch.relu(x @ weight.T)


def with_dict(x, extras):
    return torch.relu(x) + extras["bias"]


def with_explicit_break(x):
    y = torch.relu(x)
    torch._dynamo.graph_break()      # asks for a break on purpose
    return y * 2


x = torch.randn(8, 8)
layer = torch.nn.Linear(8, 8)
CATALOGUE = [  # (pattern, function, arguments, graph breaks we expect on torch 2.11-2.14)
    ("print(...)", with_print, (x,), 1),
    ("if tensor.sum() > 10:", with_data_dependent_if, (x,), 1),
    ("tensor.item()", with_item, (x,), 1),
    ("tensor.tolist()", with_tolist, (x,), 1),
    ("np.tanh(tensor.numpy())", with_numpy, (x,), 0),
    ("scipy.special.expit(...)", with_scipy, (x,), 1),
    ("time.perf_counter()", with_timer, (x,), 1),
    ("logger.debug(...)", with_logging, (x,), 1),
    ("try/except KeyError", with_try_except, (x, {}), 0),
    ("getattr(layer, 'weight')", with_getattr, (x, layer), 0),
    ("dict lookup", with_dict, (x, {"bias": torch.ones(8)}), 0),
    ("torch._dynamo.graph_break()", with_explicit_break, (x,), 1),
]

print(f"{'pattern':<28} {'graphs':>6} {'breaks':>6}  first line of the reason")
measured = {}
for pattern, fn, args, expected in CATALOGUE:
    report = break_report(fn, *args)
    measured[pattern] = report.breaks
    print(f"{pattern:<28} {report.graphs:>6} {report.breaks:>6}  {report.first_reason[:60]}")
mismatch = {p: (measured[p], e) for p, _, _, e in CATALOGUE if measured[p] != e}
assert not mismatch, f"(measured, expected) differ on this torch: {mismatch}"
print("\nevery count matches what the notebook expects for this torch")

# %% [markdown]
# What the table says (the counts are asserted; the wording of reasons changes between releases):
#
# - **`print`, logging, `time.perf_counter()`**: calls Dynamo cannot record. They are side effects
#   or C functions it has no model of, so they run as Python between two graphs. A logging call
#   breaks even when its level filters the message out.
# - **`if` on a tensor, `.item()`, `.tolist()`**: the next Python line needs the *value* in a tensor,
#   which does not exist while tracing (Dynamo traces with "fake" tensors that carry only shape,
#   dtype and device).
# - **A library Dynamo cannot look into** (SciPy here, one of the course's dependencies): compiled
#   code outside torch.
# - **NumPy does not break** any more. Many older tutorials say that
#   `x.numpy()` breaks the graph; on this torch (and on 2.11) Dynamo translates NumPy calls on a
#   tensor's data into torch operations and keeps them in the graph. `try`/`except`, `getattr` and
#   dict lookups, also listed as possible breaks in older texts, are traced too.
# - **`torch._dynamo.graph_break()`** makes a break on purpose (handy to test how a break changes
#   things); it makes exactly one.
#
# Here is the NumPy version's single graph: `np.tanh` became a call that runs on tensors.

# %%
numpy_graph = torch._dynamo.explain(with_numpy)(x).graphs[0]
print("\n".join(line for line in numpy_graph.code.strip().splitlines() if line.strip()))
assert "tanh" in numpy_graph.code


# %% [markdown]
# ## Fixing each break
#
# In order of preference:
#
# 1. **Do not do it inside the compiled region.** Move printing, logging and timing outside the
#    compiled function, and write value-dependent logic as tensor operations.
# 2. **Tell the compiler what it needs to know**: `capture_scalar_outputs` for `.item()`, a custom
#    operator for a library call.
# 3. **Contain what must stay Python**: `torch.compiler.disable` keeps one function out of the
#    compiler; `allow_in_graph` and `nonstrict_trace` put one into the graph without Dynamo reading it.
# 4. **Check with `fullgraph=True`**, which turns any break that is left into an error.
#
# Every fix below that removes the break is checked three ways: `break_report` finds no break,
# `torch.compile(..., fullgraph=True)` (default Inductor backend) accepts it, and its result matches
# the original (or the same computation written in plain torch) in eager mode within a tolerance
# (`check_fix`'s rtol=1e-5, atol=1e-6 unless the cell states another). `check_fix` does the last two.
# A fix that keeps its break on purpose (`torch.compiler.disable`) is checked by its break count and
# its result.

# %%
def check_fix(fixed, original, *args, rtol=1e-5, atol=1e-6):
    # Compile `fixed` as one graph (fullgraph=True raises on any break) and compare with eager `original`.
    compiled = torch.compile(fixed, fullgraph=True)
    with contextlib.redirect_stdout(io.StringIO()):  # the originals may print
        expected = original(*args)
    torch.testing.assert_close(compiled(*args), expected, rtol=rtol, atol=atol)
    return compiled


positive = torch.rand(8, 8) + 0.5      # y.sum() > 10: the `if` takes its first branch
small = torch.rand(8, 8) * 0.01        # y.sum() < 10: the other branch
print(f"sum of relu(positive) = {torch.relu(positive).sum():.1f}, "
      f"sum of relu(small) = {torch.relu(small).sum():.2f}")


# %% [markdown]
# ### `print` and logging: move them out, or let Dynamo reorder `print`
#
# The simplest fix is to return what you want to report and print it outside the compiled
# function. If the print must stay, `torch._dynamo.config.reorderable_logging_functions` lets
# Dynamo move the calls of the functions you list to after the graph runs, so the graph does not
# break; the print still happens on every call. `config.patch` sets a config value only inside the
# `with` block; it has to cover the first call, which is when Dynamo compiles.

# %%
def relu_matmul(x):
    y = torch.relu(x)
    return y @ y.t()


compiled = check_fix(relu_matmul, relu_then_report, x, rtol=1e-5, atol=1e-5)
print(f"relu done on {x.shape[0]} rows (printed by the caller, outside the compiled code)")
assert break_report(relu_matmul, x).breaks == 0

with torch._dynamo.config.patch(reorderable_logging_functions={print}):
    report = break_report(relu_then_report, x)
    graphs, breaks = report.graphs, report.breaks
    reordered = torch.compile(relu_then_report, fullgraph=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for _ in range(3):
            out = reordered(x)
torch.testing.assert_close(out, relu_matmul(x), rtol=1e-5, atol=1e-5)
n_printed = len(printed.getvalue().splitlines())
print(f"with print reorderable: {graphs} graph, {breaks} breaks; 3 calls printed {n_printed} lines")
assert (graphs, breaks, n_printed) == (1, 0, 3)


# %% [markdown]
# ### A branch on tensor data: `torch.where` or `torch.cond`
#
# `torch.where(condition, a, b)` computes both sides and picks element by element: for cheap
# element-wise branches this is the best fix, because Inductor fuses it into one kernel (the cell
# below counts them), inside which the sum is finished before `where` uses it.
# `torch.cond(predicate, true_fn, false_fn, operands)` runs only the chosen branch, which can pay
# when the branches are expensive. Both branches are traced, so they must return the same structure,
# dtype and number of dimensions (notebook 04 shows that sizes may differ), and the predicate is a
# one-element boolean tensor (or a Python bool, also covered there). (`torch.cond` is also how you
# express data-dependent branching for `torch.export`, covered later in the course.)

# %%
def branch_with_where(x):
    y = torch.relu(x)
    return torch.where(y.sum() > 10, y * 2, y * 3)


def branch_with_cond(x):
    y = torch.relu(x)
    return torch.cond(y.sum() > 10, lambda t: t * 2, lambda t: t * 3, (y,))


for fixed in (branch_with_where, branch_with_cond):
    assert break_report(fixed, x).breaks == 0
    for inputs in (positive, small):  # one input for each branch
        check_fix(fixed, with_data_dependent_if, inputs, rtol=1e-6, atol=1e-6)
    print(f"{fixed.__name__}: no graph break, matches the Python `if` on both branches (rtol=atol=1e-6)")

# What Inductor wrote for the torch.where version (generated_code resets Dynamo first).
where_kernels = [name for src in generated_code(torch.compile(branch_with_where), positive)[1]
                 for name in fused_kernels(src)]
print(f"branch_with_where compiles to {len(where_kernels)} generated kernel: {', '.join(where_kernels)}")
assert len(where_kernels) == 1


# %% [markdown]
# ### `.item()` and `.tolist()`: stay in tensors, or capture the scalar
#
# The best fix keeps the value as a tensor: divide by the 0-d tensor `y.sum()` instead of the
# Python float, index `y[0, 0]` instead of going through a list. When you really need a Python
# number, `torch._dynamo.config.capture_scalar_outputs = True` lets Dynamo put `.item()` into the
# graph as a symbolic number. Its limits are measured below: a Python `if` on that number still
# breaks (Dynamo cannot know which way it goes), and `.tolist()` of a float tensor still breaks.
# (`fullgraph=True` alone also captures `.item()`, as a later section shows, so for this setting
# it is the break count under `break_report` that shows it at work.)

# %%
def item_as_tensor(x):
    y = torch.relu(x)
    return y / y.sum()


def tolist_as_indexing(x):
    y = torch.relu(x)
    return y * y[0, 0]


def item_then_if(x):
    y = torch.relu(x)
    total = y.sum().item()
    if total > 10:                   # a Python decision on a value only known at run time
        return y * 2
    return y * 3


check_fix(item_as_tensor, with_item, positive)
check_fix(tolist_as_indexing, with_tolist, positive)
assert break_report(item_as_tensor, positive).breaks == break_report(tolist_as_indexing, positive).breaks == 0
print("item_as_tensor and tolist_as_indexing: no graph break, equal to the originals (rtol=1e-5)")

with torch._dynamo.config.patch(capture_scalar_outputs=True):
    captured = {name: break_report(fn, positive) for name, fn in
                [("with_item", with_item), ("item_then_if", item_then_if), ("with_tolist", with_tolist)]}
    torch._dynamo.reset()
    compiled_item = torch.compile(with_item, fullgraph=True)  # one graph, or it raises
    torch.testing.assert_close(compiled_item(positive), with_item(positive), rtol=1e-5, atol=1e-6)
for name, report in captured.items():
    print(f"capture_scalar_outputs=True, {name:<12}: {counted(report.breaks, 'break'):<8} "
          f"{report.first_reason[:55]}".rstrip())
assert [report.breaks for report in captured.values()] == [0, 1, 1]


# %% [markdown]
# ### A library Dynamo cannot trace: use torch's version, or make it a custom operator
#
# If torch has the same function, use it: `scipy.special.expit` is `torch.sigmoid`. If it does not,
# wrap the library call as a **custom operator** with `torch.library.custom_op`. The compiler then
# treats it as one opaque operation: Dynamo puts a single node in the graph, Inductor calls your
# Python function at run time (so SciPy really runs on every call), and the *fake* implementation
# registered with `register_fake` tells the compiler the output's shape and dtype without running
# SciPy. (A custom operator has no gradient unless you also register one with
# `register_autograd`.)

# %%
def expit_with_torch(x):
    y = torch.relu(x)
    return torch.sigmoid(y) * 2


scipy_calls = {"n": 0}


@torch.library.custom_op("course02::scipy_expit", mutates_args=())
def scipy_expit(t: torch.Tensor) -> torch.Tensor:
    scipy_calls["n"] += 1
    result = scipy.special.expit(t.detach().cpu().numpy())
    return torch.from_numpy(result).to(t.device)


@scipy_expit.register_fake
def _(t):
    return torch.empty_like(t)  # same shape, dtype and device: all the compiler needs


def expit_as_custom_op(x):
    y = torch.relu(x)
    return scipy_expit(y) * 2


for fixed in (expit_with_torch, expit_as_custom_op):
    assert break_report(fixed, x).breaks == 0
    compiled_expit = check_fix(fixed, with_scipy, x, rtol=1e-6, atol=1e-6)
    print(f"{fixed.__name__}: no graph break, equal to the SciPy version (rtol=atol=1e-6)")

calls_before = scipy_calls["n"]
for _ in range(3):
    compiled_expit(x)  # the custom-op version, already compiled
print(f"3 calls of the compiled custom-op version ran SciPy {scipy_calls['n'] - calls_before} times")
assert scipy_calls["n"] - calls_before == 3


# %% [markdown]
# ### Code that must stay Python: `torch.compiler.disable`
#
# Timing belongs outside the compiled function (around the call, measured with `course_utils.bench`),
# so the fix for `with_timer` is to delete the line. Other Python you may want to keep on purpose: a
# debugging hook, logging of statistics, code with side effects. `torch.compiler.disable` marks a
# function that Dynamo must never trace: it is called as plain Python every time.
#
# One correction to a common claim: disabling a function does **not**
# remove the graph break. The call still splits the graph, with its own reason. What `disable` buys
# is that Dynamo does not go *inside* the function, so the function's own Python cannot add more
# breaks or guards. Compare the same hook inlined and disabled:

# %%
def log_stats(t):
    logger.debug("mean %.3f, max %.3f", t.mean().item(), t.max().item())


def with_hook(x):
    y = torch.relu(x)
    log_stats(y)
    return y * 2


log_stats_outside = torch.compiler.disable(log_stats)


def with_disabled_hook(x):
    y = torch.relu(x)
    log_stats_outside(y)
    return y * 2


inlined, disabled = break_report(with_hook, x), break_report(with_disabled_hook, x)
print(f"hook traced by Dynamo : {counted(inlined.breaks, 'break')}, {counted(inlined.graphs, 'graph')}")
print(f"hook disabled         : {counted(disabled.breaks, 'break')}, {counted(disabled.graphs, 'graph')} "
      f"({disabled.first_reason})")
compiled_hook = torch.compile(with_disabled_hook)
torch.testing.assert_close(compiled_hook(x), with_hook(x), rtol=1e-6, atol=1e-6)
assert disabled.breaks == 1 and inlined.breaks > disabled.breaks


# %% [markdown]
# ### `allow_in_graph` and `nonstrict_trace`: into the graph without Dynamo reading it
#
# `torch.compiler.allow_in_graph(fn)` tells Dynamo not to trace `fn` but to put the call into the
# graph as one node; the backend (AOTAutograd, then Inductor) still traces through it. It is often
# recommended for "known safe" functions. The current documentation is more careful, and
# the cell below shows why: Dynamo runs `fn` once on fake tensors to learn its output, and
# AOTAutograd runs it again while it traces (it may trace more than once: to collect metadata about
# the outputs, then to record the graph; the cell counts the runs, not which pass made each). The graph Inductor compiles
# no longer calls `fn`, so any Python side effect inside it (here a deprecation warning) happens
# **while compiling, not on each call**. A backend without AOTAutograd, such as `"eager"`, would
# still call it every time. For pure tensor code
# that Dynamo chokes on, it works; for everything else the documentation recommends a custom
# operator (above) instead.

# %%
def legacy_swish(t):
    warnings.warn("legacy_swish is deprecated, use torch.nn.functional.silu", UserWarning)
    return t * torch.sigmoid(t)


def with_legacy(x):
    return legacy_swish(torch.relu(x)) + 1


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    before = break_report(with_legacy, x)
print(f"legacy_swish traced by Dynamo: {counted(before.breaks, 'break')} ({before.first_reason}: the call Dynamo "
      f"skips is `{before.lines[0]}`, inside legacy_swish; Dynamo does not trace into the warnings module)")

torch.compiler.allow_in_graph(legacy_swish)  # registers the function itself
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    after = break_report(with_legacy, x)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compiled_legacy = check_fix(with_legacy, lambda t: torch.nn.functional.silu(torch.relu(t)) + 1, x)
    while_compiling = sum("legacy_swish" in str(w.message) for w in caught)  # only our warning, not the compiler's
    for _ in range(5):
        compiled_legacy(x)
    during_calls = sum("legacy_swish" in str(w.message) for w in caught) - while_compiling
print(f"with allow_in_graph: {after.breaks} breaks; the warning fired {counted(while_compiling, 'time')} while "
      f"compiling and {during_calls} times in 5 later calls")
assert before.breaks == 1 and after.breaks == 0 and during_calls == 0 and while_compiling >= 1
# The same function under the "eager" backend, which runs Dynamo's graph as it is (no AOTAutograd, no Inductor).
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    eager_legacy = torch.compile(with_legacy, backend="eager")
    eager_legacy(x)
    first_eager = len(caught)
    for _ in range(5):
        eager_legacy(x)
    eager_calls = len(caught) - first_eager
print(f"with backend='eager': the warning fired {eager_calls} times in 5 later calls (the graph still calls legacy_swish)")
assert eager_calls == 5

# %% [markdown]
# `torch.compiler.nonstrict_trace` (newer than torch 2.11, so the course reaches it through
# `course_utils.compat`) is the safer cousin: Dynamo still handles the call's inputs and outputs,
# which may include non-tensor values such as a dict of settings, and the body is traced
# non-strictly, the way `torch.export` does by default. It has the same caveat about side effects,
# measured again below.

# %%
if compat.has("nonstrict_trace"):
    def legacy_scaled(t, settings):
        warnings.warn("legacy_scaled is deprecated", UserWarning)
        return t * torch.sigmoid(t * settings["beta"])

    traced_loosely = compat.nonstrict_trace(legacy_scaled)

    def with_settings(x):
        return traced_loosely(torch.relu(x), {"beta": 1.5}) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = break_report(with_settings, x)
        graphs, breaks = report.graphs, report.breaks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the eager reference spells out legacy_scaled's maths, so every warning counted comes from compiling
        compiled_settings = check_fix(with_settings, lambda t: torch.relu(t) * torch.sigmoid(torch.relu(t) * 1.5) + 1, x)
        loose_compiling = sum("legacy_scaled" in str(w.message) for w in caught)
        for _ in range(5):
            compiled_settings(x)
        loose_calls = sum("legacy_scaled" in str(w.message) for w in caught) - loose_compiling
    print(f"nonstrict_trace with a dict argument: {graphs} graph, {breaks} breaks, equal to eager "
          f"(rtol=1e-5); the warning fired {counted(loose_compiling, 'time')} while compiling and {loose_calls} times "
          "in 5 compiled calls")
    assert breaks == 0 and loose_calls == 0 and loose_compiling >= 1
else:
    print(f"skipped: torch.compiler.nonstrict_trace needs a newer torch than {torch.__version__}")

# %% [markdown]
# ### `fullgraph=True`: make any break an error
#
# With `fullgraph=True` a graph break raises instead of splitting the graph: the way to be sure
# that a function compiles as one graph (`torch.export` always works this way). Note *when* it
# raises. `torch.compile` traces nothing when you call it; the error comes from the first call. A common
# mistake wraps `torch.compile(model, fullgraph=True)` itself in `try`/`except`, which never
# catches anything.

# %%
strict = torch.compile(with_data_dependent_if, fullgraph=True)
print("torch.compile(..., fullgraph=True) returned without complaint: nothing is traced yet")
try:
    strict(x)
except torch._dynamo.exc.Unsupported as err:
    error = err
else:
    raise AssertionError("fullgraph=True should have refused the data-dependent `if`")

lines = [line for line in str(error).strip().splitlines() if line.strip()]
print(f"first call raised {type(error).__module__}.{type(error).__name__} "
      f"(a subclass of RuntimeError: {isinstance(error, RuntimeError)}):")
print(textwrap.indent("\n".join(line[:110] for line in lines[:3]), "    "))
assert isinstance(error, RuntimeError) and "Data-dependent branching" in str(error)

# %% [markdown]
# One more thing measured here: under `fullgraph=True`, `.item()` on its own does not fail. Since
# breaking is not allowed, Dynamo captures the scalar as if `capture_scalar_outputs` were on. A
# Python `if` on that scalar still cannot be traced, as Exercise 2 will show you.

# %%
strict_item = torch.compile(with_item, fullgraph=True)
torch.testing.assert_close(strict_item(positive), with_item(positive), rtol=1e-5, atol=1e-6)
print("with_item compiled as one graph under fullgraph=True; equal to eager (rtol=1e-5)")

# %% [markdown]
# ## Watching the compiler: `TORCH_LOGS`
#
# `TORCH_LOGS` switches on the compiler's logs by topic. It is read once, when `import torch` runs,
# so in a script you set it on the command line:
#
# ```bash
# TORCH_LOGS="graph_breaks,recompiles,guards" python train.py
# ```
#
# The cell below does the same with `graph_breaks,recompiles` (guards come later) in a subprocess
# and prints the lines it captured, trimmed: every break with its location, every recompile with the
# guard that failed.

# %%
script = textwrap.dedent('''
    import torch

    def scaled_relu(x, scale):
        y = torch.relu(x) * scale
        print("  printed by the script")
        return y.sum()

    compiled = torch.compile(scaled_relu, backend="eager")
    compiled(torch.randn(8), 2.0)
    compiled(torch.randn(8, 2), 2.0)   # another rank: a recompile
''')
env = dict(os.environ, TORCH_LOGS="graph_breaks,recompiles")
run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
assert run.returncode == 0, run.stderr[-3000:]


def log_message(line: str) -> str:
    # Drop the 'V1129 21:08:43.113000 8231 torch/_dynamo/...py:123] ' prefix of a TORCH_LOGS line.
    return line.split("] ", 1)[1] if "] " in line else line


tagged = [log_message(line) for line in run.stderr.splitlines()
          if "[__graph_breaks]" in line or "[__recompiles]" in line]
# "in user code at" is each break's location line, also the one a repeated break writes as
# "Graph break (user stack suppressed due to duplicate graph break) in user code at ...".
keep = [line for line in tagged if any(key in line for key in
        ("in user code at", "Explanation:", "Recompiling function", "mismatch"))]
print(f"{len(tagged)} log lines captured; the informative ones:")
print("\n".join(line[:120] for line in keep[:8]))
assert any("Graph break in user code" in line for line in tagged)
located = sum("in user code at" in line for line in keep)
assert located >= 2 and located == sum("Explanation:" in line for line in keep)  # a location for every break
assert any("Recompiling function" in line for line in tagged)


# %% [markdown]
# Inside a notebook, where torch is already imported, `torch._logging.set_logs(graph_breaks=True,
# recompiles=True, guards=True)` does the same, and `torch._logging.set_logs()` switches everything
# back off. (If `TORCH_LOGS` was already set when Python started, the variable wins and `set_logs`
# does nothing but log a warning.) The logs go to standard error, which is hard to filter, so the helper below also hands
# them to a list while it is active. (Its workings are plumbing: it mutes the console handlers that
# `set_logs` installs on the `torch._dynamo` logger and attaches its own.)

# %%
@contextlib.contextmanager
def torch_logs(**topics):
    # Switch on TORCH_LOGS topics (e.g. recompiles=True) and collect the messages in a list.
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.extend(record.getMessage().splitlines())

    collector = Collect()
    torch._logging.set_logs(**topics)
    dynamo_logger = logging.getLogger("torch._dynamo")
    muted = [(handler, handler.level) for handler in dynamo_logger.handlers]
    for handler, _ in muted:
        handler.setLevel(logging.CRITICAL + 1)
    dynamo_logger.addHandler(collector)
    try:
        yield messages
    finally:
        dynamo_logger.removeHandler(collector)
        for handler, level in muted:
            handler.setLevel(level)
        torch._logging.set_logs()  # back to the defaults


def shorten(line: str, width: int = 110) -> str:
    # Drop the source-location comment Dynamo appends after '#', and cut to `width` characters.
    text = line.split("  #")[0].rstrip()
    return text if len(text) <= width else text[: width - 3] + "..."


with torch_logs(graph_breaks=True) as messages:
    with contextlib.redirect_stdout(io.StringIO()):
        torch.testing.assert_close(torch.compile(with_print, backend="eager")(x), with_print(x))
print("\n".join(shorten(m) for m in messages[:6]))
assert any("Graph break in user code" in m for m in messages)


# %% [markdown]
# ## Guards and recompilation
#
# Compiled code is *specialised*: it is valid only for inputs like the ones it was compiled for.
# Dynamo records what it assumed as **guards**, checks them on every call (a tree of checks that
# runs in C++), and when one fails it compiles again and keeps both versions, up to a limit. The
# `guards` log shows them; below are the two interesting ones for a function of a tensor and a
# Python float.

# %%
def scaled_sin(x, scale):
    return torch.sin(x) * scale + 1


x8 = torch.randn(8)
with torch_logs(guards=True) as messages:
    torch.testing.assert_close(torch.compile(scaled_sin, backend="eager")(x8, 2.0), scaled_sin(x8, 2.0))
interesting = [m.split("+- ", 1)[-1] for m in messages if "TENSOR_MATCH" in m or "EQUALS_MATCH" in m]
interesting = [re.sub(r"DispatchKeySet\([^)]*\), ", "", m) for m in interesting]  # internal detail
print(f"{len(messages)} lines of guards; the two on the inputs:")
print("\n".join(shorten(m, 140) for m in interesting))
assert any("TENSOR_MATCH" in m for m in interesting) and any("== 2.0" in m for m in interesting)


# %% [markdown]
# The tensor guard (`TENSOR_MATCH`) checks dtype, device, `requires_grad`, size and stride; the
# float is guarded by its value (`scale == 2.0`), because Dynamo baked `2.0` into the graph as a
# constant. The numbers *inside* the tensor are never guarded.
#
# To count compiles we use a custom backend. A backend is just a function that receives each FX
# graph and returns something to run; this one runs the graph as it is (like `backend="eager"`),
# keeps it, and counts calls. Dynamo decides the guards while it traces (a backend such as Inductor
# can add a few shape guards of its own), so a cheap backend shows Dynamo's recompiles without the
# wait of compiling each graph.

# %%
class CountingBackend:
    # A torch.compile backend that keeps every graph it is given and counts calls into them.

    def __init__(self):
        self.graphs = []
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            self.calls += 1
            return gm.forward(*args)

        return run

    @property
    def compiles(self) -> int:
        return len(self.graphs)


torch._dynamo.reset()
torch._dynamo.utils.counters.clear()  # Dynamo's own global tallies; reset() leaves them alone
counter = CountingBackend()
compiled_sin = torch.compile(scaled_sin, backend=counter)
STEPS = [  # (what changes, x, scale, total compiles expected after the call)
    ("first call: float32, length 8, scale 2.0", torch.randn(8), 2.0, 1),
    ("new values, nothing else", torch.randn(8), 2.0, 1),
    ("length 16", torch.randn(16), 2.0, 2),
    ("length 32", torch.randn(32), 2.0, 2),
    ("float64", torch.randn(32, dtype=torch.float64), 2.0, 3),
    ("requires_grad=True", torch.randn(32, requires_grad=True), 2.0, 4),
    ("scale 3.0", torch.randn(32), 3.0, 5),
    ("scale 4.0", torch.randn(32), 4.0, 5),
]
def failed_guard(message: str) -> str:
    # '- 0/2: tensor 'x' dtype mismatch. expected ...' -> 'v3 dtype' (version 3 of the function)
    entry, text = message.strip()[2:].split(": ", 1)
    version = int(entry.split("/")[1]) + 1
    for kind in ("size", "dtype", "requires_grad", "rank", "stride"):
        if f"{kind} mismatch" in text:
            return f"v{version} {kind}"
    return f"v{version} {text.split('#')[0].strip()}"


print(f"{'what changed':<42} {'compiles':>8}  guard that failed, per cached version tried")
with torch_logs(recompiles=True) as messages:
    for step, (change, t, scale, expected) in enumerate(STEPS):
        seen = len(messages)
        torch.testing.assert_close(compiled_sin(t, scale), scaled_sin(t, scale), rtol=1e-6, atol=1e-6)
        failed = [failed_guard(m) for m in messages[seen:] if re.match(r"\s*- \d+/\d+: ", m)]
        note = ", ".join(failed) if failed else "(first compile)" if step == 0 else "(none: reused)"
        print(f"{change:<42} {counter.compiles:>8}  {note}")
        assert counter.compiles == expected, (change, counter.compiles, expected)

unique_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
print(f"\nDynamo's own counter agrees: counters['stats']['unique_graphs'] = {unique_graphs}")
assert unique_graphs == counter.compiles
print("the signature of each compiled graph:")
for i, gm in enumerate(counter.graphs, 1):
    print(f"  {i}: {gm.code.strip().splitlines()[0]}")
# What the last graph is given for `scale`: the example value Dynamo stored on that input's node.
scale_node = next(n for n in counter.graphs[-1].graph.nodes if n.op == "placeholder" and "scale" in n.name)
scale_in = scale_node.meta["example_value"]
print(f"graph {counter.compiles} receives scale as a {scale_in.dim()}-d tensor of dtype {scale_in.dtype}"
      + (" (a Python float is a double)" if scale_in.dtype == torch.float64 else ""))
assert isinstance(scale_in, torch.Tensor) and scale_in.dim() == 0
back = [line.strip() for line in counter.graphs[-1].code.splitlines() if ".item()" in line]
print("and turns it back into a number inside the graph:", back[0].split(";")[0] if back else "(no .item() line here)")

torch._dynamo.reset()
int_counter = CountingBackend()
int_sin = torch.compile(scaled_sin, backend=int_counter)
for k in (2, 3):  # an int scale: a second value makes it an input too
    torch.testing.assert_close(int_sin(x8, k), scaled_sin(x8, k))
int_signature = int_counter.graphs[-1].code.strip().splitlines()[0]
print(f"with an int scale (2, then 3), graph {int_counter.compiles}: {int_signature}")
assert int_counter.compiles == 2 and "L_scale_ : torch.SymInt" in int_signature

# %% [markdown]
# Read the table from the top. On a call, Dynamo tries the versions it has compiled, newest first,
# and the last column lists the guard each one failed (v1 is the first version):
#
# - New values never recompile: guards look at metadata, not data.
# - The first new length recompiles, and the second graph's signature gains an integer input (a
#   `SymInt`): Dynamo saw the size change and made that dimension symbolic. This is **automatic
#   dynamic**: start with static shapes (the most specialised code), switch a dimension to dynamic after
#   it changed once. So length 32 runs the dynamic graph without a compile.
# - A new dtype or `requires_grad` always recompiles (so do a new device, rank or memory layout).
# - A Python float is baked in as a constant at first, so a new value recompiles, and that
#   recompile makes it an input of the graph (`L_scale_` in the signature). From then on it is
#   guarded on being a float (and not NaN), so the next new value is free. Dynamo passes it in as
#   a 0-d float64 tensor, a tensor holding one number (the `graph 5 receives scale` line above),
#   and turns it back into a number inside the graph (the `.item()` line). A Python int arrives as
#   a `SymInt`, like a size (the last line above).
#
# ### Dynamic shapes on purpose
#
# Whether a dimension may change can also be decided up front. `dynamic=True` compiles dynamic
# shapes from the first call; `torch._dynamo.mark_dynamic(tensor, dim)` marks one dimension of one
# input (typically the batch dimension) before the first call; `dynamic=False` turns automatic
# dynamic off, so every new shape is a new compile:

# %%
LENGTHS = [8, 16, 32, 64]


def compiles_over_lengths(mark_batch_dim=False, **compile_kwargs) -> int:
    torch._dynamo.reset()
    counter = CountingBackend()
    fn = torch.compile(scaled_sin, backend=counter, **compile_kwargs)
    for n in LENGTHS:
        t = torch.randn(n)
        if mark_batch_dim:
            torch._dynamo.mark_dynamic(t, 0)
        torch.testing.assert_close(fn(t, 2.0), scaled_sin(t, 2.0), rtol=1e-6, atol=1e-6)
    return counter.compiles


dynamic_table = {
    "default (automatic dynamic)": compiles_over_lengths(),
    "dynamic=True": compiles_over_lengths(dynamic=True),
    "mark_dynamic(x, 0)": compiles_over_lengths(mark_batch_dim=True),
    "dynamic=False": compiles_over_lengths(dynamic=False),
}
print(f"compiles for lengths {LENGTHS}:")
for setting, compiles in dynamic_table.items():
    print(f"  {setting:<28} {compiles}")
assert list(dynamic_table.values()) == [2, 1, 1, len(LENGTHS)]

torch._dynamo.reset()
counter = CountingBackend()
always_dynamic = torch.compile(scaled_sin, backend=counter, dynamic=True)
for n in (1, 2, 3, 0):
    t = torch.randn(n)
    torch.testing.assert_close(always_dynamic(t, 2.0), scaled_sin(t, 2.0), rtol=1e-6, atol=1e-6)
print(f"dynamic=True over lengths 1, 2, 3, 0: {counter.compiles} compiles (1 and 0 are special)")
assert counter.compiles == 3

torch._dynamo.reset()
dynamic_sin = torch.compile(scaled_sin, dynamic=True)  # Inductor, one kernel for every length
for n in LENGTHS:
    t = torch.randn(n)
    torch.testing.assert_close(dynamic_sin(t, 2.0), scaled_sin(t, 2.0), rtol=1e-5, atol=1e-5)
print("Inductor with dynamic=True matches eager at every length (rtol=atol=1e-5)")

# %% [markdown]
# Even `dynamic=True` compiled three versions for lengths 1, 2, 3 and 0: sizes 0 and 1 are always
# specialised, because broadcasting and empty tensors behave differently for them. Why not make
# everything dynamic anyway? Code that must work for any length cannot treat the length as a
# constant, which gives the compiler less to optimise with; that is why the default starts static
# and only turns a dimension dynamic once it has changed. `mark_dynamic` is for when you know in
# advance which dimension will vary (typically the batch).
#
# ### One graph that includes sizes 0 and 1, and what it costs
#
# A server whose batch is 1 whenever traffic is quiet meets exactly those extra compiles, at the
# moment the first lone request arrives. Two switches give one graph that covers 0 and 1 too:
#
# - `mark_unbacked(tensor, dim)` (imported from `torch._dynamo.decorators`, where it lives on every
#   torch the course supports) makes that size *unbacked*: the compiler never looks at its value, as if the
#   size had been read out of a tensor's data. It does not guard on it: a check it needs becomes an
#   assertion at run time, and a Python `if` on the size becomes a graph break.
# - the setting `torch.fx.experimental._config.backed_size_oblivious = True`, together with a
#   dimension that is dynamic already (`mark_dynamic` in the cell, or `dynamic=True`), keeps that
#   size *backed* (the compiler sees its value and guards on it) but reasons about it as if it
#   could not be 0 or 1.
#
# Both live in private or experimental modules (torch's own comment calls the setting experimental),
# so they may change between releases: check them again when you upgrade torch.
#
# Either way the graph is the one for "a size that is neither 0 nor 1", and an input of size 1 runs
# it. That is right wherever size 1 means nothing special, and can be wrong where it does:
# `squeeze(0)` removes a dimension only when its size is 1, broadcasting stretches only a size of 1.
# For each switch the cell counts the graphs compiled over lengths that include 1 and 0 for two
# functions, `scaled_sin` and one with an `if` on the size (every result checked against eager), asks
# `explain` whether that `if` breaks the graph, and runs a `squeeze(0)` through Inductor at size 1
# to compare the shape with eager's:

# %%
import torch.fx.experimental._config as fx_config  # noqa: E402  (the backed_size_oblivious switch)
from torch._dynamo.decorators import mark_unbacked  # noqa: E402

SIZES_WITH_ONE = [8, 1, 16, 0, 3]


def squeeze_first(x):
    return x.squeeze(0) * 2  # removes dimension 0 only where its size is 1


def branch_on_size(x):
    y = x * 2
    if x.shape[0] > 2:  # a Python `if` on the size itself
        return y.sin()
    return y.cos()


SWITCHES = {  # how each switch marks dimension 0, and whether it turns the setting on
    "mark_dynamic": (torch._dynamo.mark_dynamic, False),
    "mark_unbacked": (mark_unbacked, False),
    "backed_size_oblivious": (torch._dynamo.mark_dynamic, True),  # the setting acts on dynamic sizes
}


def marked(mark, shape):
    t = torch.randn(*shape)
    mark(t, 0)
    return t


def input_shapes(gm: torch.fx.GraphModule) -> str:
    """The shapes of a graph's tensor inputs as traced: a number is a fixed size, s.. a dynamic one,
    u.. an unbacked one."""
    return " ".join(str(tuple(node.meta["example_value"].shape)).replace(" ", "") for node in gm.graph.nodes
                    if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.Tensor))


def compiles_over_sizes(fn, mark, *args) -> dict[int, list[str]]:
    """For each length in SIZES_WITH_ONE, the input shapes of the graphs compiled at that call (each
    result checked against eager)."""
    torch._dynamo.reset()
    counter = CountingBackend()
    compiled = torch.compile(fn, backend=counter)
    new_graphs = {}
    for n in SIZES_WITH_ONE:
        t = marked(mark, (n,))
        before = counter.compiles
        torch.testing.assert_close(compiled(t, *args), fn(t, *args), rtol=1e-6, atol=1e-6)
        new_graphs[n] = [input_shapes(gm) for gm in counter.graphs[before:]]
    return new_graphs


def total(new_graphs: dict[int, list[str]]) -> int:
    return sum(len(shapes) for shapes in new_graphs.values())


def squeeze_at_one(mark) -> tuple:
    """What Inductor's squeeze_first gives at size 1 after compiling at size 4 (a shape, or the error it
    raised), and how many warnings that call gave."""
    torch._dynamo.reset()
    squeezed = torch.compile(squeeze_first)  # Inductor: the shape is decided in generated code
    squeezed(marked(mark, (4, 3)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = tuple(squeezed(marked(mark, (1, 3))).shape)
        except Exception as err:  # a torch that refuses rather than answers
            got = f"{type(err).__name__}: {shorten(str(err).splitlines()[0], 60)}"
    return got, len(caught)


def break_words(explained) -> str:
    """The part of the first break's reason that names what could not be decided (else its first line)."""
    if not explained.break_reasons:
        return ""
    text = " ".join(str(explained.break_reasons[0].reason).split())
    found = re.search(r"Could not guard on data-dependent expression [^(]*", text)
    return shorten(found.group(0).strip() if found else text)


def try_switch(mark, oblivious: bool) -> dict:
    with fx_config.patch(backed_size_oblivious=oblivious):
        sin_graphs = compiles_over_sizes(scaled_sin, mark, 2.0)
        branch_graphs = compiles_over_sizes(branch_on_size, mark)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(branch_on_size)(marked(mark, (4,)))
        at_one, warned = squeeze_at_one(mark)
    return {"sin": total(sin_graphs), "branch": total(branch_graphs), "branch_graphs": branch_graphs,
            "breaks": explained.graph_break_count,
            "reason": break_words(explained), "at_one": at_one, "warned": warned}


eager_at_one = tuple(squeeze_first(torch.randn(1, 3)).shape)
switch_table = {name: try_switch(mark, oblivious) for name, (mark, oblivious) in SWITCHES.items()}
torch._dynamo.reset()
print(f"lengths {SIZES_WITH_ONE}, each call's result checked against eager (those graphs run without Inductor; "
      f"the squeeze column is Inductor's); squeeze(0) of a (1, 3) tensor in eager mode: {eager_at_one}")
print(f"{'switch':<22} {'scaled_sin':>10}  {'branch_on_size':<24} squeeze(0) at size 1, Inductor")
print(f"{'':<22} {'':>10}  {'(breaks: explain() at length 4)':<24}")
for name, r in switch_table.items():
    shown = (f"{r['at_one']} " + ("as eager" if r["at_one"] == eager_at_one else "NOT as eager")
             if isinstance(r["at_one"], tuple) else f"refused: {r['at_one']}")
    print(f"{name:<22} {counted(r['sin'], 'graph'):>10}  "
          f"{counted(r['branch'], 'graph') + ', ' + counted(r['breaks'], 'break'):<24} {shown}")
for name, r in switch_table.items():
    if r["reason"]:
        print(f"  {name}'s break in branch_on_size: {r['reason']}")
print("branch_on_size's graphs by the call that compiled them (their input's shape as traced: a number is a fixed "
      "size, s.. a dynamic size, u.. an unbacked one; -: no new graph, an earlier one was reused):")
for name, r in switch_table.items():
    print(f"  {name:<22}" + "   ".join(f"{n}: {' '.join(shapes) or '-'}" for n, shapes in r["branch_graphs"].items()))
assert switch_table["mark_dynamic"]["sin"] == 3                # 8 (then dynamic), 1 and 0 apart
assert switch_table["mark_unbacked"]["sin"] == switch_table["backed_size_oblivious"]["sin"] == 1
assert switch_table["mark_dynamic"]["at_one"] == eager_at_one  # recompiled for 1: eager's answer
assert switch_table["mark_dynamic"]["breaks"] == switch_table["backed_size_oblivious"]["breaks"] == 0
assert switch_table["mark_unbacked"]["breaks"] == 1            # no value to guard on: the `if` splits the graph
assert all(r["branch"] > 1 for r in switch_table.values())     # an `if` on the size: never one graph
after_break = switch_table["mark_unbacked"]["branch_graphs"]   # the code after the break has ordinary sizes
assert "(1,)" in after_break[1] and "(0,)" in after_break[0]  # ... which are fixed at 1 and 0 again
assert after_break[8][0].startswith("(u") and "(8,)" in after_break[8]   # unbacked up to the break, then fixed
assert after_break[16] and after_break[16][0].startswith("(s")              # ... and dynamic from 16
assert switch_table["mark_dynamic"]["branch"] == switch_table["mark_dynamic"]["sin"]   # the `if` adds no graph
at_one_oblivious = switch_table["backed_size_oblivious"]["branch_graphs"][1]
assert len(at_one_oblivious) == 1 and "(1,)" not in at_one_oblivious   # one new graph at 1, for the other side
assert switch_table["backed_size_oblivious"]["branch_graphs"][0] == []   # ... which 0 reuses
differs = [name for name, r in switch_table.items() if isinstance(r["at_one"], tuple) and r["at_one"] != eager_at_one]
refused = [name for name, r in switch_table.items() if not isinstance(r["at_one"], tuple)]
if differs:
    warned = sum(switch_table[name]["warned"] for name in differs)
    print(f"on this torch, {' and '.join(differs)} gave a different squeeze(0) result from eager's at size 1, "
          f"and {'those calls' if len(differs) > 1 else 'that call'} raised no error "
          f"({counted(warned, 'Python warning')} while {'they' if len(differs) > 1 else 'it'} ran)")
if refused:
    print(f"on this torch, {' and '.join(refused)} refused squeeze(0) at size 1: an error, not a silent difference")
if not differs and not refused:
    print("on this torch, every switch matched eager's squeeze(0) at size 1")

# %% [markdown]
# Read the table row by row. Every switch gave eager's results for both functions at all five
# lengths (the cell checks each call, with the graphs run as traced, without Inductor). For
# `scaled_sin`, where size 1 means nothing special, `mark_dynamic` pays the compiles for 1 and 0,
# and the one-graph switches compile once. The squeeze column says whether Inductor's code for
# "not 1" gave eager's answer at size 1 on your torch, and the last line whether those calls
# raised anything or gave a Python warning.
#
# The `branch_on_size` column is the other cost: with neither switch does code that branches on the
# size compile to one graph (compare its `mark_unbacked` row with `mark_dynamic`'s to see which compiled more), and
# the lines under the table show where each graph came from. An unbacked size has no value the
# compiler could guard on, so the `if` cannot be decided while tracing and splits the graph (the
# reason printed names the comparison it could not decide). The first graph, up to the break, keeps
# the unbacked size; the code after the break is compiled on its own, with ordinary sizes: fixed at
# the first length (8), fixed again at 1 and at 0 (an ordinary size of 0 or 1 always gets a graph of
# its own), and dynamic from 16, the first length that is neither 8 nor 0 or 1 (all asserted). A
# backed size is guarded on (here on which side of the comparison it lies). Under `mark_dynamic` the
# lengths on the other side are 1 and 0, which get fixed graphs of their own anyway, so the `if`
# adds none: as many graphs as for `scaled_sin` (asserted). Under `backed_size_oblivious` a size of
# 1 is nothing special, so the first length on the other side (1) compiles one more graph with the
# size still dynamic, and 0 reuses it (both asserted).
#
# So `mark_dynamic` (or automatic dynamic) is the safe choice. A one-graph switch is worth it where
# a compile at the first lone request is too slow for you (notebook 01 times compiles), the code
# does not branch on the size, and you have run the model at sizes 1 (and 0, if it can happen)
# through the compiled code and compared it with eager, as the cell does for `squeeze(0)`. Code that
# never gives size 1 a meaning of its own (indexing `x[0]` where a dimension is known to hold one
# item, rather than `squeeze`, which looks at the size) has no such step to get wrong; broadcasting
# the marked dimension against another tensor is the other place to check.
#
# ### The recompile limit
#
# Each function keeps at most `torch._dynamo.config.recompile_limit` compiled versions. When a call
# would need one more, Dynamo logs a warning and **runs that function in eager mode from then on**
# for inputs that match none of the versions it has. Nothing fails: those calls run without the
# compiled code.
# `course_utils.compat.recompile_limit(n)` sets the limit temporarily on any supported torch; here
# it is 3, with `dynamic=False` so that each new length recompiles:

# %%
default_limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
print(f"default recompile limit on this torch: {default_limit}")

torch._dynamo.reset()
counter = CountingBackend()
static_sin = torch.compile(scaled_sin, backend=counter, dynamic=False)
with compat.recompile_limit(3), torch_logs() as messages:  # no topics: only warnings are collected
    for n in range(1, 7):
        t = torch.randn(n)
        torch.testing.assert_close(static_sin(t, 2.0), scaled_sin(t, 2.0), rtol=1e-6, atol=1e-6)
print(f"6 lengths, {counter.compiles} compiles; the warning Dynamo logged:")
print("\n".join("    " + shorten(m) for m in messages[:3]))
assert counter.compiles == 3 and any("recompile_limit" in m for m in messages)
print("lengths 4-6 ran in eager mode, and their results are still right")

# %% [markdown]
# Newer torch also takes the limit per function, `torch.compile(fn, recompile_limit=n)`; on
# torch 2.11 that keyword does not exist, hence the guard:

# %%
if compat.has("compile_recompile_limit_kwarg"):
    torch._dynamo.reset()
    counter = CountingBackend()
    limited = torch.compile(scaled_sin, backend=counter, dynamic=False, recompile_limit=2)
    with torch_logs():  # collect (and so hide) the limit warning
        for n in range(1, 6):
            t = torch.randn(n)
            torch.testing.assert_close(limited(t, 2.0), scaled_sin(t, 2.0), rtol=1e-6, atol=1e-6)
    print(f"recompile_limit=2 on this one function: {counter.compiles} compiles for 5 lengths")
    assert counter.compiles == 2
else:
    print(f"skipped: torch.compile(..., recompile_limit=) needs a newer torch than {torch.__version__}")

# %% [markdown]
# ### `torch.compiler.set_stance`: choose what happens on a recompile
#
# `torch.compiler.set_stance` (a function, a context manager or a decorator) changes how compiled
# functions behave without touching them:
#
# - `"fail_on_recompile"` raises instead of recompiling. Wrap your steady-state loop (a serving loop,
#   a training loop after the first steps) in it, and a surprise recompile becomes an error you see.
# - `"eager_on_recompile"` runs in eager mode when a recompile would be needed, and keeps using the
#   compiled versions it already has.
# - `"force_eager"` ignores `torch.compile` entirely: the quickest way to ask "is the compiler the
#   cause of this bug?" without editing code.

# %%
torch._dynamo.reset()
counter = CountingBackend()
served = torch.compile(scaled_sin, backend=counter)
x32 = torch.randn(32)
torch.testing.assert_close(served(x32, 2.0), scaled_sin(x32, 2.0))  # warm-up: the one compile we expect

with torch.compiler.set_stance("fail_on_recompile"):
    served(torch.randn(32), 2.0)  # same kind of input: fine
    try:
        served(x32.double(), 2.0)
    except RuntimeError as err:
        stance_error = err
    else:
        raise AssertionError("fail_on_recompile should have raised")
print(f"fail_on_recompile raised {type(stance_error).__name__}:")
print(textwrap.indent("\n".join(shorten(line) for line in str(stance_error).strip().splitlines()[:3]), "    "))
assert "Detected recompile" in str(stance_error)

calls_before = counter.calls
with torch.compiler.set_stance("eager_on_recompile"):
    torch.testing.assert_close(served(x32.double(), 2.0), scaled_sin(x32.double(), 2.0))
    served(x32, 2.0)  # still has a compiled version for this input
with torch.compiler.set_stance("force_eager"):
    torch.testing.assert_close(served(x32, 2.0), scaled_sin(x32, 2.0))
print(f"eager_on_recompile and force_eager: {counter.compiles} compile in total; "
      f"compiled code ran {counted(counter.calls - calls_before, 'time')} in those 3 calls")
assert counter.compiles == 1 and counter.calls - calls_before == 1


# %% [markdown]
# ## What graph breaks cost, measured
#
# Now the cost. `broken_block` is an activation block with three typical breaks: a forgotten debug
# log line, a temperature pulled out of a tensor with `.item()`, and a Python `if` on tensor data.
# `fixed_block` computes the same values with no break: the log line is gone, the temperature stays
# a 0-d tensor, and the branch is a `torch.where` on a scalar.

# %%
def broken_block(x, temperature):
    y = torch.sin(x) * torch.cos(x) + x
    logger.debug("first stage done")       # break 1: a logging call
    y = y * torch.sigmoid(y)
    t = temperature.item()                  # break 2: a tensor value into Python
    y = torch.tanh(y / t)
    if temperature > 1:                     # break 3: a Python branch on tensor data
        y = y * 0.5
    else:
        y = y * 2.0
    return y + torch.sigmoid(x)


def fixed_block(x, temperature):
    y = torch.sin(x) * torch.cos(x) + x
    y = y * torch.sigmoid(y)
    y = torch.tanh(y / temperature)
    y = y * torch.where(temperature > 1, 0.5, 2.0)
    return y + torch.sigmoid(x)


SIZE = config.pick(quick=256, full=2048)
big = torch.randn(SIZE, SIZE)
hot, cold = torch.tensor(1.5), torch.tensor(0.5)   # one temperature for each branch

report_before, report_after = break_report(broken_block, big, hot), break_report(fixed_block, big, hot)
graphs_before, breaks_before = report_before.graphs, report_before.breaks
graphs_after, breaks_after = report_after.graphs, report_after.breaks
print(f"broken_block: {breaks_before} graph breaks, {graphs_before} graphs")
print(f"fixed_block : {breaks_after} graph breaks, {graphs_after} graph")
assert (breaks_before, graphs_before, breaks_after, graphs_after) == (3, 4, 0, 1)
bench.record("breaks.count.before", breaks_before, "breaks", function="broken_block")
bench.record("breaks.count.after", breaks_after, "breaks", function="fixed_block");

# %%
torch._dynamo.reset()
compiled_broken = torch.compile(broken_block)
compiled_fixed = torch.compile(fixed_block)
generated = {}  # label -> the Python/C++ source of each compiled graph (run_and_get_code, wrapped)


def first_call_keeping_code(label, compiled):
    generated[label] = generated_code(compiled, big, hot)[1]


# each first call's time, and what Inductor's on-disk graph cache did with the graphs it compiled
compile_broken_s, broken_cache = bench.first_call_and_cache(first_call_keeping_code, "broken", compiled_broken)
compile_fixed_s, fixed_cache = bench.first_call_and_cache(first_call_keeping_code, "fixed", compiled_fixed)
hits, misses = (broken_cache[e] + fixed_cache[e] for e in ("hit", "miss"))
loops = {label: sum(len(fused_kernels(src)) for src in sources)
         for label, sources in generated.items()}
print(f"first call (tracing, plus compiling or loading from the cache): broken {compile_broken_s:.1f} s, "
      f"fixed {compile_fixed_s:.1f} s")
print(f"Inductor's on-disk graph cache in those calls: hits {hits}, misses {misses}; " + (
    "it was not consulted (switched off?), so the times include compiling every kernel"
    if hits + misses == 0 else
    f"it held all {hits} graphs from an earlier run, so the times are mostly tracing and loading the "
    "stored kernels, not compiling them" if misses == 0 else
    f"it held none of the {misses} graphs, so the times include compiling every kernel" if hits == 0 else
    f"it held {hits} of the {hits + misses} graphs, so the times include compiling only the other {misses}"))
print(f"compiled graphs: broken {len(generated['broken'])}, fixed {len(generated['fixed'])}; "
      f"generated kernels in them: broken {loops['broken']}, fixed {loops['fixed']}")
assert len(generated["fixed"]) == 1 and loops["fixed"] == 1 and loops["broken"] > loops["fixed"]

for temperature in (hot, cold):
    expected = broken_block(big, temperature)
    torch.testing.assert_close(compiled_broken(big, temperature), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_fixed(big, temperature), expected, rtol=1e-5, atol=1e-5)
print("both compiled versions match eager for both temperatures (rtol=atol=1e-5)")

# %% [markdown]
# Each graph was compiled on its own: the broken version compiles four graphs where the fixed one
# compiles one (the first-call times above show what that cost here; the cache line under them says
# whether Inductor compiled the kernels or found them in its on-disk cache from an earlier run).
# Now the steady state, at two sizes: a large tensor, where the work is in the generated loops
# (their arithmetic and their passes over memory), and a tiny one (8 numbers),
# where the work is almost all per-call overhead. The first tiny call recompiles each piece for the
# new shape (guards at work); the warm-up inside `bench.compare` absorbs that.

# %%
variants = {"eager": broken_block, "compiled, 3 breaks": compiled_broken, "compiled, fixed": compiled_fixed}
large = bench.compare(variants, big, hot)
large = large.with_load()  # other programs' load, sampled whatever the spread: the reasons below name it
tiny_x = torch.randn(8)
tiny = bench.compare(variants, tiny_x, hot)
torch.testing.assert_close(compiled_fixed(tiny_x, hot), broken_block(tiny_x, hot), rtol=1e-5, atol=1e-5)

print(f"{SIZE}x{SIZE} tensor:\n{large}\n\n8 numbers:\n{tiny}")
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
bench.bar_chart(large, title=f"{SIZE}x{SIZE} tensor", ax=axes[0])
bench.bar_chart(tiny, title="8 numbers (overhead only)", ax=axes[1])
fig.tight_layout();

# %%
speedup_large = large.ratio("compiled, 3 breaks", "compiled, fixed")
speedup_tiny = tiny.ratio("compiled, 3 breaks", "compiled, fixed")
# The headline is the per-call effect on small inputs, where the breaks' fixed costs are all there is.
bench.record("breaks.speedup.fixed", speedup_tiny, "x", input="8 numbers", breaks_before=breaks_before,
             large_tensor_ratio=round(speedup_large, 2), large_size=SIZE)
for label, table, role in ((f"{SIZE}x{SIZE} tensor", large, "large"), ("8 numbers", tiny, "tiny")):
    said = table.describe("compiled, fixed", "compiled, 3 breaks", name=f"breaks.fixed_vs_broken.{role}")
    print(f"{label:>16}: the fixed block is {said}")


def busy_said(table):
    """Other programs' load in brackets, only where it was sampled busy (Comparison.load_note)."""
    return f" ({table.load_note()})" if table.load_note() else ""


def tie_said(table, label, against):
    """Say which rule made a "no clear difference" verdict: the 5% margin, or overlapping timing spreads."""
    return (f"the medians were within {bench.VERDICT_MARGIN:.0%}" if table.within_margin(label, against)
            else "the difference was lost in the timing spread")


# Why the large tensor goes either way: what the extra trips through memory can cost here, measured.
copy_ms = bench.time_fn(torch.clone, big).median_ms  # one read and one write of the tensor
broken_ms = large.row("compiled, 3 breaks").median_s * 1e3
broken_iqr_ms = large.row("compiled, 3 breaks").iqr_s * 1e3
large_word = large.verdict("compiled, fixed", "compiled, 3 breaks")
# Each break writes a tensor out and the next graph reads it back; the last graph also reads x again.
extra_copies = breaks_before + 0.5  # copies' worth of extra memory traffic in the broken version
# Round the times as printed (finer on a small tensor), so that the comparisons below hold for the numbers shown.
digits = 1 if broken_ms >= 10 else 2 if broken_ms >= 1 else 3
trips_ms = round(extra_copies * copy_ms, digits)  # the most the extra trips can cost
saved_ms = round(broken_ms - large.row("compiled, fixed").median_s * 1e3, digits)
rest_ms, broken_iqr_ms = round(saved_ms - trips_ms, digits), round(broken_iqr_ms, digits)
trips_said = f"; the trips can account for up to {trips_ms:.{digits}f} ms, and the {rest_ms:.{digits}f} ms left is "
print(f"\nwhy, on the {SIZE}x{SIZE} tensor: copying it once takes {copy_ms:.{digits + 1}f} ms, so the {breaks_before} "
      f"extra trips through memory the breaks add ({extra_copies} copies' worth, as the last graph reads x again) cost at most "
      f"about {trips_ms:.{digits}f} ms of the broken version's {broken_ms:.{digits}f} ms (less where a loop's "
      "arithmetic hides its memory traffic); the rest is the arithmetic (five transcendental functions per element), "
      "compiled separately in each version, and anything else the timing caught" + busy_said(large) + ". "
      + {"faster": f"Here the fused version saved {saved_ms:.{digits}f} ms" + (
             ", within what the trips can cost, so they can account for it." if rest_ms <= 0 else
             trips_said + f"inside the broken version's own spread (IQR {broken_iqr_ms:.{digits}f} ms), so the "
             "trips can account for all of it; this run cannot tell whether the arithmetic itself differed."
             if rest_ms <= broken_iqr_ms else
             trips_said + f"more than the broken version's own spread (IQR {broken_iqr_ms:.{digits}f} ms): the "
             "fused version saved more than the trips can cost, and this cell does not time the arithmetic apart, "
             "so it does not say where the rest was saved."),
         "no clear difference": f"Here {tie_said(large, 'compiled, fixed', 'compiled, 3 breaks')}, so the saved "
                                f"trips did not show{scalar_note(compared=False)}.",
         "slower": f"Here the fused version was slower although it saves memory trips{scalar_note(compared=False)}; "
                   "the next cell "
                   "separates the generated loops from the calls around them."}[large_word])
TRANSCENDENTAL = {"sin", "cos", "tan", "sigmoid", "tanh", "exp", "expm1", "log", "log1p", "erf", "pow"}


class CountPasses(TorchDispatchMode):
    """Count the operators whose output is as large as the input: each is one pass over memory. For
    those with no transcendental function (memory-bound), also add up the data they move, in copies."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.passes, self.cheap, self.cheap_copies = numel, 0, 0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel:
            self.passes += 1
            if func.overloadpacket.__name__ not in TRANSCENDENTAL:
                reads = sum(isinstance(a, torch.Tensor) and a.numel() == self.numel for a in args)
                self.cheap += 1
                self.cheap_copies += (reads + 1) / 2  # a copy is one read and one write
        return out


with CountPasses(big.numel()) as passes_seen:
    broken_block(big, hot)  # the eager row runs this function as it is
gap_ms = (large.row("eager").median_s - large.row("compiled, fixed").median_s) * 1e3
eager_iqr_ms = large.row("eager").iqr_s * 1e3
cheap_ms = passes_seen.cheap_copies * copy_ms  # what eager's memory-bound operators cost, about
left_ms = gap_ms - cheap_ms
n_trans = passes_seen.passes - passes_seen.cheap
passes_said = (f"its one loop reads the tensor once and writes it once, where eager makes {passes_seen.passes} passes over "
               f"memory, one per operator. The {passes_seen.cheap} with no transcendental function do almost no arithmetic, "
               f"so their time is about their memory traffic: {passes_seen.cheap_copies:g} copies' worth (one that reads "
               f"two tensors moves one and a half), about {cheap_ms:.1f} ms at a copy's {copy_ms:.2f} ms, time the fused "
               f"loop does not spend (the other {n_trans} may hide their traffic behind their arithmetic, so they are "
               "not counted). ")
cannot_tell = ("the passes over memory alone can account for the gap; this run cannot tell whether the arithmetic "
               "itself differed.")

eager_word = large.verdict("compiled, fixed", "eager")
print(f"against eager on the {SIZE}x{SIZE} tensor: the fixed block is {large.describe('compiled, fixed', 'eager')}; " + {
    "faster": passes_said
              + (f"That covers the {gap_ms:.1f} ms eager loses: " + cannot_tell if left_ms <= 0 else
                 f"That leaves {left_ms:.1f} ms of the {gap_ms:.1f} ms eager loses, inside eager's own spread "
                 f"(IQR {eager_iqr_ms:.1f} ms): " + cannot_tell if left_ms <= eager_iqr_ms else
                 f"That leaves {left_ms:.1f} ms of the {gap_ms:.1f} ms eager loses, more than eager's own spread "
                 f"(IQR {eager_iqr_ms:.1f} ms), so the one generated loop, doing all the work, took less time than "
                 f"eager's {n_trans} transcendental kernels alone.")
              + (f" Note that {large.load_note()}." if large.load_note() else ""),
    "no clear difference": tie_said(large, "compiled, fixed", "eager") + scalar_note()
                           + ", so this run cannot rank them" + (busy_said(large) or " or say why") + ".",
    "slower": f"the fused loop was slower although it skips the memory traffic of eager's {passes_seen.cheap} "
              f"operators with no transcendental function, about {cheap_ms:.1f} ms ({passes_seen.cheap_copies:g} "
              f"copies' worth){scalar_note()}; this cell does not split the arithmetic from the rest" + busy_said(large)
              + "."
    }[eager_word])
tiny_word = tiny.verdict("compiled, fixed", "compiled, 3 breaks")
print("why, on 8 numbers: the fixed block makes one call into one graph where the broken one enters four graphs, "
      "checks four sets of guards and runs Python and an .item() between them; " + {
          "faster": "here those per-call costs showed clearly.",
          "no clear difference": "here " + tie_said(tiny, "compiled, fixed", "compiled, 3 breaks")
                                 + (busy_said(tiny) or "; this run cannot say why") + ".",
          "slower": "here the fixed block was slower all the same" + (busy_said(tiny) or "; this run cannot say why")
                    + "."}[tiny_word])

# %% [markdown]
# Which part of the large-tensor time is the generated loops' own work, and which the calls around
# them? The 8-number timings answer it without a profiler: there the loops have almost nothing to
# do, so a call's time is what surrounds them (Python, guards, the `.item()`, handing out tensors),
# and that part hardly grows with the tensor (getting memory for the outputs does, and the broken
# version gets more of it, so the split below if anything flatters the fixed version's loop). Take it away from the large-tensor times and what is
# left is the loops. (A profiler cannot see inside compiled code unless Inductor is told to mark
# each loop, `torch._inductor.config.cpp.enable_kernel_profile`; that recompiles both versions, and
# the marks themselves change what is timed.)

# %%
around_ms = {label: tiny.row(label).median_s * 1e3 for label in ("compiled, 3 breaks", "compiled, fixed")}
loops_ms = {label: large.row(label).median_s * 1e3 - around_ms[label] for label in around_ms}
loops_gap_ms = loops_ms["compiled, fixed"] - loops_ms["compiled, 3 breaks"]
print(f"around the loops (a call on 8 numbers): broken {around_ms['compiled, 3 breaks']:.3f} ms, "
      f"fixed {around_ms['compiled, fixed']:.3f} ms")
print(f"so the loops themselves, on the {SIZE}x{SIZE} tensor: the fused loop about {loops_ms['compiled, fixed']:.1f} ms, "
      f"the broken version's four loops about {loops_ms['compiled, 3 breaks']:.1f} ms together")
around_gap_ms = around_ms["compiled, 3 breaks"] - around_ms["compiled, fixed"]  # what the fixed version saves outside


def ms(value: float) -> str:
    """A time in ms, with three decimals below 1 ms (quick mode's small tensor)."""
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3f}"


around_said = f"what surrounds the loops differs by {abs(around_gap_ms):.3f} ms per call"
if large_word == "slower":
    said = (f"the fixed version's call is slower because of its loop: {around_said}, against {ms(loops_gap_ms)} ms "
            f"between the loops. The one fused loop ran slower than the four loops together, although it makes "
            f"{breaks_before} fewer trips through memory (up to {ms(trips_ms)} ms of the broken version's time): the "
            "difference lies in how the one loop's arithmetic ran, which this cell does not take apart (one candidate: "
            "the one loop body carries all five transcendental functions at once)" + scalar_note(compared=False))
elif large_word == "faster":
    said = (f"the fixed version's call is faster mostly because of its loop ({around_said}, against "
            f"{ms(-loops_gap_ms)} ms between the loops)" if -loops_gap_ms > abs(around_gap_ms) else
            f"the fixed version's call is faster mostly because of what surrounds the loops ({around_said}, against "
            f"{ms(-loops_gap_ms)} ms between the loops)")
else:
    said = (f"the whole calls showed no clear difference; by this split the calls around the loops favour the fixed "
            f"version by {around_gap_ms:.3f} ms and its loop costs {loops_gap_ms:+.3f} ms against the four loops, "
            "which together did not add up to a clear difference")
print(said)

# %% [markdown]
# Where the time goes in the broken version, on every call:
#
# - **lost fusion**: `fixed_block` became one fused loop (counted above) that reads `x` once and
#   writes the result once. `broken_block` runs four graphs, each with its own loop; each writes its
#   output tensor to memory in full and the next one reads it back. On a large tensor that is three
#   extra round trips through memory (and the last graph reads `x` a second time). How
#   much they cost depends on how the element-wise maths (five transcendental functions here)
#   compares with your memory bandwidth; and the one fused loop is different code from the four
#   separate loops, so it may do that maths faster or more slowly than they do. So the large-tensor
#   ratio depends on the machine and need not favour the fused version; the verdict lines above say
#   how it went here, against the broken version and against eager.
# - **Python between the graphs**: leaving compiled code, running the logging call and the
#   `.item()`, evaluating the `if` in Python, entering the next graph.
# - **guards**: four graphs, four sets of guards to check.
# - **`.item()` is a synchronisation point**: it needs the value now. On a CPU the value is already
#   in memory; on a GPU the CPU has to wait until all queued GPU work is done (the guarded cell below).
#
# On 8 numbers there is nothing to fuse and the overheads are all that is left, so that is the
# cleanest measure of what the breaks themselves cost per call (it is the headline result). On the
# large tensor those fixed costs are small next to the arithmetic, and what fusion saves in memory
# traffic can be outweighed by how the one loop's arithmetic runs: the verdict lines say whether the
# difference was clear on yours and which way it went, and the loop timings say where it lay.
#
# The guarded cell repeats the measurement on a GPU, where each `.item()` drains the GPU's queue.
# It runs where Inductor writes GPU kernels with Triton: NVIDIA and AMD GPUs (CUDA, ROCm) and Intel's
# XPU. On Apple's MPS, Inductor's backend is a prototype, so the cell skips there.

# %%
if requires_accelerator("the same comparison on a GPU, where .item() makes the CPU wait for the GPU",
                        kinds=("cuda", "xpu")):
    dev = accelerator()
    big_gpu, hot_gpu = big.to(dev), hot.to(dev)
    gpu = bench.compare(variants, big_gpu, hot_gpu)  # the first calls compile GPU versions of both functions
    torch.testing.assert_close(compiled_fixed(big_gpu, hot_gpu), broken_block(big_gpu, hot_gpu),
                               rtol=1e-4, atol=1e-5)
    print(gpu)
    gpu_said = gpu.describe("compiled, fixed", "compiled, 3 breaks", name="breaks.gpu.fixed_vs_broken")
    gpu_word = gpu.verdict("compiled, fixed", "compiled, 3 breaks")
    print(f"on the {dev.type.upper()} GPU, the fixed version is {gpu_said}: " + {
        "faster": "the broken version runs four graphs and an .item() that makes the CPU wait for the GPU's queue "
                  "to drain; this cell does not time them apart",
        "no clear difference": "within 5%: whatever the breaks' launches and the .item() wait cost did not show at "
                               "this size; this cell does not time them apart"
                               if gpu.within_margin("compiled, fixed", "compiled, 3 breaks") else
                               "any difference stayed inside this run's timing spread (the IQR column)",
        "slower": "the fixed version cost more per call here although it launches fewer kernels and waits on no "
                  ".item(); this cell does not break that down"}[gpu_word])

# %% [markdown]
# ## Check yourself
#
# **Exercise 1.** How many graph breaks does `torch.compile` hit in `mystery`? Read it, write your
# guess, then check your reasoning with `break_report(mystery, x)` if you like.

# %%
from course_utils.exercises.nb02 import mystery, soft_clip, STEP_SOURCE, RECOMPILE_OPTIONS

print(inspect.getsource(mystery))

# %%
my_count = None  # Your code here: the number of graph breaks, as an int

exercises.check("02.count_breaks", my_count)

# %% [markdown]
# **Exercise 2.** `soft_clip` divides by the peak when it exceeds 1. Write `soft_clip_fixed`
# that returns the same values and compiles with `fullgraph=True`; pass the plain function, the
# checker compiles it.

# %%
print(inspect.getsource(soft_clip))


def soft_clip_fixed(x: torch.Tensor) -> torch.Tensor:
    # Your code here: the same values as soft_clip, without a graph break.
    return soft_clip(x)


exercises.check("02.fullgraph", soft_clip_fixed)

# %% [markdown]
# **Exercise 3.** `step` below is compiled and called once as `step(torch.randn(32, 10), 0.1)`.
# Which of the second calls A-F would make it recompile? Each is considered on its own, right
# after that first call. Answer with a set of letters. (The checker measures the answer on your
# torch, and resets the compiler to do so: compiled functions above recompile on their next call.)

# %%
print(STEP_SOURCE)
for letter, call in RECOMPILE_OPTIONS.items():
    print(f"  {letter}. {call}")

my_letters = set()  # Your code here, e.g. {"A", "C"}

exercises.check("02.recompile", my_letters)

# %% [markdown]
# **Exercise 4.** `row_scores` should give one score per row, a `(batch,)` tensor, for any batch.
# It does not at batch 1. Write `row_scores_fixed` so that it does, in eager mode and compiled with
# the batch dimension unbacked, in one graph; the checker runs both at batch sizes 4, 1 and 7,
# compares them with a weighted sum computed another way, and asks `explain` for breaks (which
# resets the compiler, as in exercise 3).

# %%
from course_utils.exercises.nb02 import SCORE_WEIGHTS, row_scores  # noqa: E402

print(inspect.getsource(row_scores))


def row_scores_fixed(x: torch.Tensor) -> torch.Tensor:
    # Your code here: one score per row at every batch size, 1 included.
    return (x @ SCORE_WEIGHTS).squeeze()


exercises.check("02.size_one", row_scores_fixed)

# %% [markdown]
# Stuck? `print(exercises.solution_source("02.fullgraph"))` shows a reference solution (the same
# works for the other three); try on your own first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.
#
# ## Summary
#
# - A graph break splits a compiled function into several graphs with Python in between. It costs
#   fusion across the break (on a large tensor the fused version may come out faster, level or
#   slower: see the verdict above), Python and guard checks on every call, and compile time.
#   `torch._dynamo.explain` lists the breaks and their reasons (count them with `len(break_reasons)`;
#   `graph_break_count` counts graphs). It resets Dynamo, so do not use it between compile and benchmark.
# - What breaks on current torch: printing and logging, C functions Dynamo has no model of
#   (`time.perf_counter`), libraries it cannot see into (SciPy), and anything that needs a tensor's
#   value in Python (`if` on a tensor, `.item()`, `.tolist()`). NumPy calls, `try`/`except`,
#   `getattr` and dict lookups no longer break.
# - Fixes, best first: move the work out or express it in tensors (`torch.where`, `torch.cond`,
#   0-d tensors instead of floats); `capture_scalar_outputs`; a custom operator for library code;
#   `torch.compiler.disable` to keep Python on purpose (the break stays); `allow_in_graph` or
#   `nonstrict_trace` with care (under Inductor their side effects happen only while compiling; see
#   above). Confirm with `fullgraph=True`,
#   which raises at the first call (`torch._dynamo.exc.Unsupported` for a break; a branch on a value
#   read with `.item()` raises `torch._dynamo.exc.UserError`, as exercise 2 shows).
# - `TORCH_LOGS="graph_breaks,recompiles,guards"` (or `torch._logging.set_logs(...)` in a notebook)
#   shows breaks, recompiles and guards as they happen.
# - Guards check each input's metadata (shape, dtype, strides, device, `requires_grad`) and the value
#   of Python constants. A failed guard recompiles; a size or a number that changed once becomes
#   dynamic (automatic dynamic). `dynamic=True` and `mark_dynamic` decide up front; sizes 0 and 1
#   still get graphs of their own. `mark_unbacked`, or `backed_size_oblivious` with a dynamic
#   dimension, fold them into one graph built for "neither 0 nor 1": check sizes 1 and 0 against
#   eager before you rely on it; code that branches on the size still compiles several graphs. After
#   `recompile_limit` versions a function falls back to eager and logs a warning; `set_stance("fail_on_recompile")`
#   turns surprise recompiles into errors.
# - The headline results (`breaks.count.before`, `breaks.count.after`, and `breaks.speedup.fixed`, the
#   per-call gain of the fixed block on a small input) feed the course's results report.
#
# **Next:** notebook 03 opens up the compile stack: the graphs Dynamo captures, what AOTAutograd does
# with them, and the code Inductor writes.
#
# ## Further reading
#
# - [torch.compile troubleshooting](https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html) (official guide: graph breaks, recompiles, logs)
# - [torch.compiler API reference](https://docs.pytorch.org/docs/stable/torch.compiler_api.html) (`disable`, `allow_in_graph`, `set_stance`, `nonstrict_trace`)
# - [Dynamic shapes](https://docs.pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html)
# - [`torch.cond`](https://docs.pytorch.org/docs/stable/cond.html)
# - [Custom operators landing page](https://docs.pytorch.org/tutorials/advanced/custom_ops_landing_page.html)
# - [`torch._logging` and `TORCH_LOGS`](https://docs.pytorch.org/docs/stable/logging.html)
# - [The graph break site](https://meta-pytorch.github.io/compile-graph-break-site/) (one page per break reason; the links in the error messages point there)
