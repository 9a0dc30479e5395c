# %% [markdown]
# # 04 · Data-dependent control flow: `torch.cond`, `while_loop` and friends
#
# Real models make decisions on the numbers flowing through them: skip a refinement step when the
# input is already clean, route a hard example to a bigger sub-network, iterate until a solver
# converges. In eager PyTorch that is a plain Python `if` or `while` on a tensor's value. A compiler
# that records tensor operations into a graph cannot see that decision. `torch.compile` copes by
# splitting the graph, and `torch.export`, which needs one whole graph, refuses outright. This
# notebook shows both failures, then the structured control-flow operators (`torch.cond`,
# `torch.while_loop`, `scan`, `map`) that put the decision *into* the graph, the rules they impose,
# and what they cost and save when you measure them.

# %% [markdown]
# ## What you will learn
#
# - what `torch.compile` and `torch.export` each do with an `if` on a tensor's value, and why;
# - `torch.cond(pred, true_fn, false_fn, operands)`: the predicate, the branches, the operands, and
#   the rules the branches must follow, with the error each broken rule raises and its fix;
# - `cond` in a module with parameters, nested `cond`, and what gradients flow through it;
# - loops: `torch.while_loop`, and `scan`, `map` and `associative_scan` from `torch._higher_order_ops`;
# - how to read an exported program that contains a `cond`, run it down both branches, and ship it
#   to ONNX as an `If` node;
# - the speed of a compiled `cond` against a Python `if` with its graph break, and against a
#   branchless `torch.where`: which one wins, when, and how far counts of buffers and passes
#   explain it.
#
# **Prerequisites:** notebook 00 (first `torch.compile`, timing with `course_utils.bench`) and
# notebook 02 (graph breaks and `torch._dynamo.explain`). Notebook 01 helps for the speed section.
#
# **Time on a laptop CPU:** <!-- stamp:time -->1.2 min the first time (every cache empty), 1.2 min after that (compile cache warm, yet no faster in these two runs), 0.6 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time -->
#
# **GPU:** not needed; nothing here is GPU-only.

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
import io
import re
import textwrap
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from course_utils import bench, compat, config, cpu, exercises, session
from course_utils.breaks import break_report
from course_utils.expect import expect_error
from course_utils.inductor_code import fused_kernels, generated_code, kernel_source, scalar_note
from course_utils.text import counted

print(session.start(seed=0))


# %% [markdown]
# Several cells below *expect* an error: it is the lesson. `expect_error` (from
# `course_utils.expect`) runs a call, checks that it fails with the message we predict (so the
# notebook stops if a future torch changes the behaviour), and returns the exception so we can print
# its key line. While tracing fails, torch also logs the half-built graph to stderr; `expect_error`
# keeps that log out of the way. `break_report` (from `course_utils.breaks`) counts graph breaks
# with `torch._dynamo.explain`, as notebook 02 does.

# %%
def key_line(err: Exception, match: str) -> str:
    """Return the error's type and the line of its message that matches `match`."""
    line = next(ln for ln in str(err).splitlines() if re.search(match, ln, flags=re.I))
    quoted = re.search(r"got \w+\((['\"])(.*?)\1\)", line)  # Dynamo quotes the original error
    text = quoted.group(2) if quoted else line.strip()
    text = textwrap.shorten(text.replace(chr(92) + "n", " "), width=180, placeholder=" ...")  # whole words
    if text.count("[") > text.count("]") and not text.endswith("..."):   # a tensor printed over several lines
        text += " ..."
    return f"{type(err).__name__}: {text}"


# %% [markdown]
# ## 1 · The problem: an `if` on a tensor's value
#
# The running example does some work, then decides on a value it computed: if the vector `h` is
# longer than `LIMIT`, scale it back to length `LIMIT` (clipping by norm, as in gradient clipping);
# otherwise leave it alone. Then it does some more work. Two inputs, one for each branch:

# %%
LIMIT = 8.0


def clip_then_score(x: torch.Tensor) -> torch.Tensor:
    h = F.leaky_relu(x, 0.1) * 1.5             # work before the decision
    if h.norm() > LIMIT:                        # a decision on a tensor's VALUE
        h = h * (LIMIT / h.norm())              # pull h back to length LIMIT
    return h * h + 1                            # work after the decision


x_loud = torch.randn(256)          # h is long: the scaling branch runs
x_quiet = 0.1 * torch.randn(256)   # h is short: h passes through unchanged
for name, x in [("x_loud", x_loud), ("x_quiet", x_quiet)]:
    h_norm = (F.leaky_relu(x, 0.1) * 1.5).norm().item()
    print(f"{name}: |h| = {h_norm:6.2f} -> {'scaled' if h_norm > LIMIT else 'unchanged'}")
assert (F.leaky_relu(x_loud, 0.1) * 1.5).norm() > LIMIT
assert (F.leaky_relu(x_quiet, 0.1) * 1.5).norm() <= LIMIT

# %% [markdown]
# ### What `torch.compile` does: a graph break
#
# Dynamo (the part of `torch.compile` that reads your Python) records tensor operations without
# running them on real data, so when it reaches `if h.norm() > LIMIT` it does not know the answer.
# It stops the graph there, lets Python evaluate the condition on the real tensor, and continues
# in a new graph. Notebook 02 covers graph breaks in general; here we count this one with
# `torch._dynamo.explain`:

# %%
explanation = torch._dynamo.explain(clip_then_score)(x_loud)
print(f"graphs: {explanation.graph_count}, graph breaks: {explanation.graph_break_count}")
print(f"reason: {explanation.break_reasons[0].reason}")
python_if_breaks = len(explanation.break_reasons)
assert python_if_breaks == explanation.graph_break_count == 1
bench.record("cond.breaks.python_if", python_if_breaks, "breaks", fn="clip_then_score");

# %% [markdown]
# `generic_jump TensorVariable()` is Dynamo's name for "a jump whose condition is a tensor". The
# program still runs correctly, because Python takes over at the break. But look at what gets
# compiled. A small custom backend that just records each graph it is handed shows it: the first
# call compiles the part before the `if` and the continuation for the branch it took; the first
# call that takes the *other* branch compiles one more graph.

# %%
compiled_graphs = []


def recording_backend(gm: torch.fx.GraphModule, example_inputs):
    compiled_graphs.append(gm)
    return gm.forward  # run the graph as it is: we only want to count


compiled_if = torch.compile(clip_then_score, backend=recording_backend)
torch.testing.assert_close(compiled_if(x_loud), clip_then_score(x_loud))
after_loud = len(compiled_graphs)
torch.testing.assert_close(compiled_if(x_quiet), clip_then_score(x_quiet))
after_quiet = len(compiled_graphs)
print(f"graphs compiled after the loud input: {after_loud}; after the quiet one too: {after_quiet}")
assert (after_loud, after_quiet) == (2, 3)


# %% [markdown]
# Every call now runs two compiled pieces with Python in between, and the two pieces cannot be
# optimised together: whatever Inductor could have fused across the `if` stays unfused.
#
# ### What `torch.export` does: an error
#
# `torch.export` must produce *one* graph that is correct for every input, with no Python left to
# fall back on. Asking for that with `torch.compile(..., fullgraph=True)` turns the graph break into
# an error, and `torch.export.export` fails in both of its tracing modes: `strict=True` (Dynamo
# traces the Python bytecode) and `strict=False` (Python runs for real while torch records the
# operations; the default in every release this course supports, where older releases defaulted to
# strict):

# %%
class ClipThenScore(nn.Module):
    def forward(self, x):
        return clip_then_score(x)


err_fullgraph = expect_error(torch.compile(clip_then_score, backend="eager", fullgraph=True), x_loud,
                             match="data-dependent branching")
err_strict = expect_error(lambda x: torch.export.export(ClipThenScore(), (x,), strict=True), x_loud,
                          match="data-dependent branching")
err_nonstrict = expect_error(lambda x: torch.export.export(ClipThenScore(), (x,), strict=False), x_loud,
                             match="could not guard on data-dependent expression")
print("compile(fullgraph=True):", key_line(err_fullgraph, "data-dependent"))
print("export, strict=True:    ", key_line(err_strict, "data-dependent"))
print("export, strict=False:   ", key_line(err_nonstrict, "data-dependent"))
assert isinstance(err_strict, torch._dynamo.exc.Unsupported)
print("\nthe strict error ends with this hint:",
      next(ln.strip() for ln in str(err_strict).splitlines() if "torch.cond" in ln))


# %% [markdown]
# The two modes fail differently because they trace differently:
#
# - **strict** export runs Dynamo, the same bytecode reader as `torch.compile`, which reports the
#   data-dependent branch and suggests `torch.cond`;
# - **non-strict** export runs your Python for real, but on *fake* tensors that carry shapes and
#   dtypes and no values. `h.norm() > LIMIT` becomes an unknown value, the symbol `u0` in the
#   message, standing for 0 or 1 (false or true; `Eq(u0, 1)` asks "is it true?"), and Python's `if`
#   needs a definite `True` or `False`: export cannot "guard on" it.
#
# Either way the message is about the same thing: export would have to pick one branch from the
# example input and silently bake it in, which would be wrong for every input that goes the other
# way. (Some older texts show this as `UserError: Dynamic control flow is not supported`, and list
# `torch.export` as supporting data-dependent control flow. It does, but only when you write it
# with the operators below; a plain `if` fails as shown.)
#
# ## 2 · `torch.cond`: both branches in the graph
#
# `torch.cond(pred, true_fn, false_fn, operands)` behaves like
#
# ```python
# true_fn(*operands) if pred else false_fn(*operands)
# ```
#
# but it is one operator that *contains* both branches as sub-graphs. Tracing it records both
# branches and the predicate; the choice is made when the graph runs. Its arguments:
#
# - `pred`: a Python `bool` or a one-element tensor (normally a `torch.bool` one, such as
#   `h.norm() > LIMIT`);
# - `true_fn`, `false_fn`: callables taking the operands (plain functions, lambdas and `nn.Module`s
#   all appear below);
# - `operands`: a tuple of the tensors the branches take.

# %%
def scale_down(h: torch.Tensor) -> torch.Tensor:
    return h * (LIMIT / h.norm())


def keep(h: torch.Tensor) -> torch.Tensor:
    return h.clone()  # a branch may not hand back its input itself: see the rules below


def clip_then_score_cond(x: torch.Tensor) -> torch.Tensor:
    h = F.leaky_relu(x, 0.1) * 1.5
    h = torch.cond(h.norm() > LIMIT, scale_down, keep, (h,))
    return h * h + 1


for x in (x_loud, x_quiet):
    torch.testing.assert_close(clip_then_score_cond(x), clip_then_score(x), rtol=0, atol=0)
cond_breaks = break_report(clip_then_score_cond, x_loud).breaks
print(f"graph breaks: Python if {python_if_breaks}, torch.cond {cond_breaks}")
assert cond_breaks == 0, "the cond version must be one graph"
bench.record("cond.breaks.cond", cond_breaks, "breaks", fn="clip_then_score_cond");


class ClipThenScoreCond(nn.Module):
    def forward(self, x):
        return clip_then_score_cond(x)


for strict in (True, False):
    program = torch.export.export(ClipThenScoreCond(), (x_loud,), strict=strict)
    for x in (x_loud, x_quiet):
        torch.testing.assert_close(program.module()(x), clip_then_score(x))
print("exports in both modes; the exported program is right on both branches")

# %% [markdown]
# Same results, bit for bit, in eager mode; no graph break; and export now works, in both
# modes. Section 4 opens the exported program to see where the branches went.
#
# In eager mode, `torch.cond` runs only the branch the predicate picks, but on first use it still
# traces both branches with Dynamo to check the rules below. That is why its errors, further down,
# read like compiler errors even when no `torch.compile` is in sight.
#
# ### The predicate
#
# A one-element tensor or a Python `bool`. A bool (say, from a test on a fixed shape) is just an
# `if`: eager `cond` runs the branch it picks without tracing or checking either one, and
# `torch.export` keeps only that branch (the cell counts the `cond` nodes in each export). A tensor
# keeps both branches in the graph, and so does a shape test on a dimension exported as dynamic
# (notebook 06 covers `dynamic_shapes`; here `Dim("rows", min=2)` lets the rows be any number from 2
# up): there the test is a symbolic bool, decided at run time.
# A tensor with more than one element is refused, just as Python's `if` refuses to turn one into a
# bool:

# %%
h = torch.randn(4, 3)
print("one-element tensor:", torch.cond(h.sum() > 0, torch.sin, torch.cos, (h,)).shape)
print("Python bool:       ", torch.cond(h.shape[0] > 2, torch.sin, torch.cos, (h,)).shape)


class PickByValue(nn.Module):
    def forward(self, h):
        return torch.cond(h.sum() > 0, torch.sin, torch.cos, (h,))


class PickByShape(nn.Module):
    def forward(self, h):
        return torch.cond(h.shape[0] > 2, torch.sin, torch.cos, (h,))


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # export warns that a Python-bool predicate specialises
    cond_nodes = {name: sum(node.target is torch.ops.higher_order.cond
                            for node in torch.export.export(module(), (h,), dynamic_shapes=dims).graph.nodes)
                  for name, module, dims in (("tensor", PickByValue, None), ("bool", PickByShape, None),
                                             ("symbolic", PickByShape, {"h": {0: torch.export.Dim("rows", min=2)}}))}
print(f"cond nodes in the exported graph: tensor predicate {cond_nodes['tensor']}, Python-bool predicate "
      f"{cond_nodes['bool']} (only the branch it picked is left), the same shape test with the rows exported as "
      f"dynamic {cond_nodes['symbolic']}")
assert cond_nodes == {"tensor": 1, "bool": 0, "symbolic": 1}
# with a bool, eager cond checks nothing: this true branch hands back its input (the aliasing rule
# below) and the false branch returns another shape, yet the call goes through
unchecked = torch.cond(True, lambda t: t, lambda t: t.sum(), (h,))
print(f"a bool predicate with branches that break the rules, in eager mode: no error; the output is h itself: "
      f"{unchecked is h}")
assert unchecked is h
err = expect_error(lambda h: torch.cond(h > 0, torch.sin, torch.cos, (h,)), h,
                   match="single-element tensor")
print("whole tensor:      ", key_line(err, "single-element"))

# %% [markdown]
# ### The rules for branches, each broken once
#
# Because both branches become sub-graphs with one output, `cond` asks more of them than an `if`:
#
# 1. **Same output structure**: the same number of tensors, nested the same way.
# 2. **Same dtype and number of dimensions** for each output tensor.
# 3. **No aliasing**: a branch may not return one of its operands, or a view of one, as its output.
# 4. **No in-place mutation** of operands or of tensors the branch closes over (globals, attributes,
#    enclosing variables), whenever grad mode is on, even for tensors that do not require gradients.
# 5. **No Python side effects**: no `print`, no appending to a list outside the branch.
#
# *Reading* closed-over tensors is fine (module parameters, a global weight): the tracer adds them
# to the operands for you. The next cell breaks each rule once and shows the key line of the error
# on this torch.

# %%
h = torch.randn(4, 3)
running_total = torch.zeros(())  # a tensor outside the branches


def two_outputs(h):        return h.sin(), h.cos()
def one_output(h):         return h.sin()
def as_mask(h):            return h > 0                 # bool instead of float
def row_sums(h):           return h.sum(dim=-1)         # 1 dimension instead of 2
def hand_back(h):          return h                     # the operand itself
def transpose_view(h):     return h.t()                 # a view of the operand
def add_in_place(h):       return h.add_(1)             # mutates the operand


def bump_total(h):
    running_total.add_(1)                              # mutates a closed-over tensor
    return h.sin()


def chatty(h):
    print("taking the true branch")                    # a Python side effect
    return h.sin()


broken = [  # (rule, true_fn, pattern expected in the error)
    ("1 different output structure", two_outputs, r"unmatched output spec"),
    ("2 different dtype", as_mask, r"expected same dtype"),
    ("2 different number of dims", row_sums, r"expected same dim"),
    ("3 returns its operand", hand_back, r"aliasing"),
    ("3 returns a view of its operand", transpose_view, r"aliasing"),
    ("4 mutates its operand", add_in_place, r"input mutation"),
    ("4 mutates a closed-over tensor", bump_total, r"input mutation"),
    ("5 calls print", chatty, r"print"),
]
for rule, true_fn, pattern in broken:
    err = expect_error(lambda h: torch.cond(h.sum() > 0, true_fn, one_output, (h,)), h, match=pattern)
    print(f"{rule:33s} {key_line(err, pattern)}")
assert running_total.item() == 0, "the failed trace must not have run the mutation for real"


# %% [markdown]
# Each has a standard fix:
#
# - rules 1 and 2: make the branches agree (`keepdim=True` on one side or neither; `.to(dtype)`;
#   return the same tuple from both; pad a missing output with zeros);
# - rule 3: return a copy, `h.clone()`, as `keep` did above;
# - rule 4: compute out of place (`h + 1`), or clone first and mutate the clone; to update state such
#   as a running total, pass it in as an operand and *return* its new value;
# - rule 5: move the `print` outside the `cond`, or log the predicate instead.
#
# The state fix is the one that changes how you write code, so here it is working. Mutating a
# fresh clone inside a branch is fine too, since only operands and closed-over tensors are protected
# (with grad mode on):

# %%
def bump_and_sin(h, total):
    return h.sin(), total + 1            # new state is an output, not a mutation


def keep_and_cos(h, total):
    return h.cos(), total.clone()


def add_one_to_copy(h):
    out = h.clone()
    out.add_(1)                          # in place, but on a tensor the branch created
    return out


for h_in in (torch.ones(4, 3), -torch.ones(4, 3)):
    out, running_total = torch.cond(h_in.sum() > 0, bump_and_sin, keep_and_cos, (h_in, running_total))
print(f"running_total after one positive and one negative input: {running_total.item():.0f}")
assert running_total.item() == 1
out = torch.cond(h.sum() > 0, add_one_to_copy, lambda h: h - 1, (h,))
torch.testing.assert_close(out, h + 1 if h.sum() > 0 else h - 1)


# %% [markdown]
# **Sizes may differ, dimensions may not.** Rule 2 is about the *number* of dimensions. On the
# installed torch, branches whose outputs have the same number of dimensions but different sizes
# are accepted: the output size becomes a symbol whose value is known only at run time, and the
# exported program records the range it can take. Code after such a `cond` then works with a size
# it cannot specialise on, so prefer equal shapes when you can.

# %%
def first_rows(h):      return h[:2].clone()   # (2, 3)
def more_rows(h):       return h[:3].clone()   # (3, 3)


def pick_rows(h):
    return torch.cond(h.sum() > 0, first_rows, more_rows, (h,))


class PickRows(nn.Module):
    def forward(self, h):
        return pick_rows(h)


pos, neg = torch.ones(4, 3), -torch.ones(4, 3)
print("eager shapes:", tuple(pick_rows(pos).shape), tuple(pick_rows(neg).shape))
program = torch.export.export(PickRows(), (pos,))
output_node = next(n for n in program.graph.nodes if n.op == "output")
print("exported output shape:", output_node.args[0][0].meta["val"].shape,
      "| range constraints:", program.range_constraints)
assert program.module()(pos).shape == (2, 3) and program.module()(neg).shape == (3, 3)

# %% [markdown]
# **Rule 4 and inference.** Autograd needs the original value of a tensor that a later gradient
# reads, which is why in-place mutation of operands is refused whenever grad mode is on (the cell
# above refused it on a tensor that does not even require gradients).
# Under `torch.no_grad()`, `torch.cond`'s documentation in 2.14 allows a branch to mutate its
# *inputs*, and still says a branch cannot mutate global variables. The next cell tries both, an
# operand and a closed-over tensor, and reports what your torch does (on fresh tensors, because a
# permitted mutation really does change them). Anything it allows beyond the documented case is not
# a promise: releases differ here, so do not build on it.

# %%
h_copy = torch.ones(4, 3)
outside = torch.zeros(())  # a fresh closed-over tensor, so running_total above stays as it is


def bump_outside(h):
    outside.add_(1)
    return h.sin()


def under_no_grad(call, watched: torch.Tensor) -> str:
    """Run a mutating cond under no_grad; say whether it was allowed and whether ``watched`` changed."""
    before = watched.clone()
    with torch.no_grad():
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                call()
        except Exception as err:
            return f"refused ({type(err).__name__})"
    changed = "changed" if not torch.equal(before, watched) else "did not change"
    return (f"allowed, and the tensor {changed} (first value {before.flatten()[0].item():.0f} -> "
            f"{watched.flatten()[0].item():.0f})")


on_operand = under_no_grad(lambda: torch.cond(h_copy.sum() > 0, add_in_place, lambda h: h - 1, (h_copy,)), h_copy)
on_closed = under_no_grad(lambda: torch.cond(h_copy.sum() > 0, bump_outside, lambda h: h.cos(), (h_copy,)), outside)
if on_closed.startswith("allowed"):
    on_closed += ", beyond what the documentation promises"
print(f"torch {torch.__version__}, in-place mutation under no_grad:\n  of an operand: {on_operand}\n"
      f"  of a closed-over tensor: {on_closed}")


# %% [markdown]
# ### `cond` in a module with parameters
#
# A typical use: a learned router sends each batch either through a cheap layer or through a
# deeper block. The branches are sub-modules here; they read their own parameters, which is the
# allowed kind of closing over. (The branch is chosen for the whole
# batch: `cond` makes one decision per call. Per-example choices need `torch.where` or masking.)

# %%
class Router(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.score = nn.Linear(d, 1)
        self.cheap = nn.Linear(d, d)
        self.deep = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return torch.cond(self.score(x).mean() > 0, self.deep, self.cheap, (x,))


class RouterPythonIf(Router):  # same parameters, plain Python if
    def forward(self, x):
        return self.deep(x) if self.score(x).mean() > 0 else self.cheap(x)


router = Router()
router_if = RouterPythonIf()
router_if.load_state_dict(router.state_dict())
w_score = router.score.weight.detach()
toward = w_score / w_score.norm()           # the direction in which the score grows
x_deep = torch.randn(8, 16) + 3 * toward    # scored high: the deep block
x_cheap = torch.randn(8, 16) - 3 * toward   # scored low: the cheap layer
with torch.no_grad():
    assert router.score(x_deep).mean() > 0 > router.score(x_cheap).mean()

compiled_router = torch.compile(router, backend="eager", fullgraph=True)
for x in (x_deep, x_cheap):
    torch.testing.assert_close(router(x), router_if(x))
    torch.testing.assert_close(compiled_router(x), router_if(x))
print("router: cond and Python-if versions agree on both branches, eager and compiled with fullgraph=True")


# %% [markdown]
# ### Gradients through `cond`
#
# Gradients flow through the branch that ran. Two differences from a Python `if` are worth knowing
# before you train through a `cond`:

# %%
def grads_after_backward(model, x):
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


def describe(g):
    return "None" if g is None else f"|g| = {g.abs().sum().item():8.3f}"


for label, x in [("x_deep", x_deep), ("x_cheap", x_cheap)]:
    g_cond, g_if = grads_after_backward(router, x), grads_after_backward(router_if, x)
    print(f"input {label}:")
    for name in ("score.weight", "cheap.weight", "deep.0.weight"):
        print(f"  {name:14s} cond: {describe(g_cond[name]):14s} python if: {describe(g_if[name])}")
        if g_if[name] is not None:
            torch.testing.assert_close(g_cond[name], g_if[name])
    assert g_cond["score.weight"] is None and g_if["score.weight"] is None
    untaken = "cheap.weight" if label == "x_deep" else "deep.0.weight"
    assert g_if[untaken] is None and torch.count_nonzero(g_cond[untaken]) == 0

torch._dynamo.reset()
router_aot = torch.compile(router, backend="aot_eager", fullgraph=True)  # builds the backward graph
router.zero_grad(set_to_none=True)
router_aot(x_deep).pow(2).sum().backward()  # gradients land on `router`'s own parameters
torch.testing.assert_close(router.deep[0].weight.grad, grads_after_backward(router_if, x_deep)["deep.0.weight"])
print("\ncompiled (aot_eager) gradients match the Python-if gradients")


# %% [markdown]
# 1. **The router's score gets no gradient at all** (`None`), with `cond` and with `if` alike: a
#    hard yes/no decision has no derivative. To learn the routing, make the score reach the loss
#    some other way, for instance by scaling the chosen branch's output by a softmax of the scores,
#    as mixture-of-experts layers do.
# 2. **The branch that did not run gets zeros, not `None`.** The parameters of *both* branches are
#    operands of the `cond` (section 4 shows them in the exported graph), and `cond`'s backward
#    returns a gradient for every operand: zeros for the ones the untaken branch used. Optimisers
#    skip parameters whose gradient is `None`, but not those whose gradient is zero, so weight decay
#    keeps moving the idle branch:

# %%
def untaken_branch_moves(model) -> bool:
    before = model.cheap.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    opt.zero_grad(set_to_none=True)
    model(x_deep).pow(2).sum().backward()   # x_deep takes the deep branch: `cheap` is idle
    opt.step()
    return not torch.equal(before, model.cheap.weight)


router_copy, router_if_copy = Router(), RouterPythonIf()
router_copy.load_state_dict(router.state_dict())
router_if_copy.load_state_dict(router.state_dict())
moves_cond, moves_if = untaken_branch_moves(router_copy), untaken_branch_moves(router_if_copy)
print(f"idle branch changed by one SGD step with weight decay: cond {moves_cond}, python if {moves_if}")
assert moves_cond and not moves_if


# %% [markdown]
# `aot_eager` above is a debugging backend: it runs AOTAutograd, the stage of `torch.compile` that
# derives the backward graph (notebook 03), and skips Inductor's code generation, so the check is
# quick. Section 5 uses the default backend.
#
# ### Nested `cond`
#
# A branch may contain its own `cond`. A three-way piecewise function, written with a Python
# `if`/`elif`/`else` and with two nested `cond`s:

# %%
def piecewise_if(x):
    m = x.mean()
    if m > 1:
        return x - 1
    elif m < -1:
        return x + 1
    else:
        return x * 0.5


def outer_false(x):  # reached when mean <= 1: decide between the other two pieces
    return torch.cond(x.mean() < -1, lambda x: x + 1, lambda x: x * 0.5, (x,))


def piecewise_cond(x):
    return torch.cond(x.mean() > 1, lambda x: x - 1, outer_false, (x,))


class Piecewise(nn.Module):
    def forward(self, x):
        return piecewise_cond(x)


inputs = {"mean > 1": torch.full((5,), 3.0), "mean < -1": torch.full((5,), -3.0), "in between": torch.randn(5) * 0.1}
compiled_piecewise = torch.compile(piecewise_cond, backend="eager", fullgraph=True)
program = torch.export.export(Piecewise(), (inputs["in between"],))
for label, x in inputs.items():
    expected = piecewise_if(x)
    for result in (piecewise_cond(x), compiled_piecewise(x), program.module()(x)):
        torch.testing.assert_close(result, expected)
print("python if, cond, compiled cond and exported cond agree on all three pieces")
print("sub-graphs in the exported program:", [name for name, _ in program.graph_module.named_modules() if name])

# %% [markdown]
# The exported program nests the same way the code does: the outer `false_graph_0` holds its
# own pair of branch graphs.
#
# ## 3 · Loops: `while_loop`, `scan`, `map`
#
# Loops have the same problem, once per iteration. A Python `for` over a fixed range is fine for
# the compiler: it is unrolled into the graph. A loop whose *number of iterations* depends on
# tensor values is not. Where these operators live, on the torch range the course supports:
#
# - `torch.while_loop` is public, next to `torch.cond`;
# - `scan`, `map` and `associative_scan` live in `torch._higher_order_ops`: the leading underscore
#   marks a private, prototype namespace that may move. The course asks `course_utils.compat.has`
#   (for example `compat.has("scan")`) before using those private ones, so a release that moves
#   them is fixed in one place.

# %%
print(f"torch {torch.__version__}")
print(f"  torch.cond: {hasattr(torch, 'cond')}, torch.while_loop: {hasattr(torch, 'while_loop')}")
print(f"  compat.has('while_loop'): {compat.has('while_loop')}, compat.has('scan'): {compat.has('scan')}")
import torch._higher_order_ops as hops
print("  in torch._higher_order_ops:", [n for n in ("scan", "map", "associative_scan") if hasattr(hops, n)])


# %% [markdown]
# ### `torch.while_loop`: iterate until converged
#
# `torch.while_loop(cond_fn, body_fn, carried_inputs)` runs `carried = body_fn(*carried)` while
# `cond_fn(*carried)` is true. The carried values must keep their shapes and dtypes from one
# iteration to the next, and `body_fn` must return new tensors (no aliasing, no in-place mutation of
# the carried inputs). Newton's method for square roots stops when the error is small, so the
# number of iterations depends on the input:

# %%
def newton_sqrt_python(a, tol=1e-5, max_iters=50):
    y, i = torch.ones_like(a), 0
    while (y * y - a).abs().max() > tol and i < max_iters:
        y, i = 0.5 * (y + a / y), i + 1
    return i, y


def newton_sqrt(a, tol=1e-5, max_iters=50):
    def not_done(i, y):
        return ((y * y - a).abs().max() > tol) & (i < max_iters)  # `a` is read from the closure

    def newton_step(i, y):
        return i + 1, 0.5 * (y + a / y)

    return torch.while_loop(not_done, newton_step, (torch.zeros((), dtype=torch.int64), torch.ones_like(a)))


a = torch.tensor([2.0, 9.0, 100.0])
iters_py, root_py = newton_sqrt_python(a)
iters, root = newton_sqrt(a)
torch.testing.assert_close(root, root_py)
torch.testing.assert_close(root, a.sqrt())
assert int(iters) == iters_py
explained = torch._dynamo.explain(newton_sqrt_python)(a)
print(f"Python while: {len(explained.break_reasons)} graph break ({explained.break_reasons[0].reason}), "
      f"{explained.graph_count} compiled graph of {explained.op_count} ops: the loop body is not in it; "
      f"graph_break_count {explained.graph_break_count}")
assert len(explained.break_reasons) == 1 and explained.graph_count == 1 and explained.graph_break_count == 0
while_loop_breaks = break_report(newton_sqrt, a).breaks
print(f"while_loop:   {while_loop_breaks} graph breaks; {int(iters)} iterations for {a.tolist()}")
assert while_loop_breaks == 0


# %% [markdown]
# Note how `explain` counts the Python loop. It reports the break reason but only one graph: the
# operations up to the first test of the condition. Dynamo cannot resume compiling in the middle of
# a loop, so it leaves the rest of the function, the whole loop, to ordinary Python, and its
# `graph_break_count` (graphs minus one) says 0 (printed above). Read `break_reasons` instead.
#
# The `while_loop` version exports, and the exported program runs as many iterations as each new
# input needs; nothing about the example input's iteration count is baked in:

# %%
class NewtonSqrt(nn.Module):
    def forward(self, a):
        return newton_sqrt(a)


program = torch.export.export(NewtonSqrt(), (a,))
loop_nodes = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.while_loop]
print(f"while_loop nodes in the exported graph: {len(loop_nodes)}")
for new_a in (torch.tensor([2.0, 9.0, 100.0]), torch.tensor([1e6, 0.25, 3.0])):
    n_iters, y = program.module()(new_a)
    torch.testing.assert_close(y, new_a.sqrt())
    print(f"  sqrt of {new_a.tolist()}: {int(n_iters)} iterations")


# %% [markdown]
# Gradients through `while_loop` are newer than through `cond`: its docstring in several releases
# still says it does not support training. The next cell asks the installed torch, eager and compiled,
# and checks the result against the exact derivative of a square root, 1 / (2 sqrt(a)):

# %%
def d_sqrt(run) -> str:
    a_grad = a.clone().requires_grad_()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            run(a_grad)[1].sum().backward()
    except Exception as err:
        return f"not supported ({type(err).__name__})"
    torch.testing.assert_close(a_grad.grad, 0.5 / a.sqrt(), rtol=1e-4, atol=1e-6)
    return "supported, and equal to 1 / (2 sqrt(a))"


torch._dynamo.reset()
print(f"torch {torch.__version__}, gradient through while_loop:")
print("  eager:              ", d_sqrt(newton_sqrt))
print("  compiled, aot_eager:", d_sqrt(torch.compile(newton_sqrt, backend="aot_eager", fullgraph=True)))


# %% [markdown]
# ### `scan`: a loop that carries state and emits one output per step
#
# Many loops run a fixed number of steps but carry state: a recurrent cell, a cumulative
# statistic. A Python `for` compiles fine, because it is unrolled, but the graph grows with the
# number of steps. `scan(combine_fn, init, xs)` keeps one copy of the step: `combine_fn(carry, x)`
# returns `(next_carry, y)` for each slice `x` of `xs`, and `scan` returns the last carry and the
# stacked `y`s. An exponential moving average, both ways:

# %%
def ema_python(xs, decay=0.9):
    carry, ys = torch.zeros_like(xs[0]), []
    for x in xs:
        carry = decay * carry + (1 - decay) * x
        ys.append(carry)
    return torch.stack(ys)


def ema_scan(xs, decay=0.9):
    def step(carry, x):
        new = decay * carry + (1 - decay) * x
        return new, new.clone()  # the output may not alias the carry

    return hops.scan(step, torch.zeros_like(xs[0]), xs)[1]


class Ema(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, xs):
        return self.fn(xs)


if compat.has("scan"):
    print(f"{'steps':>6} {'Python for: graph nodes':>24} {'scan: graph nodes':>18}")
    scan_sizes = set()
    for steps in config.pick(quick=(8, 64), full=(8, 64, 256)):
        xs = torch.randn(steps, 16)
        torch.testing.assert_close(ema_scan(xs), ema_python(xs))
        nodes = {}
        for name, fn in (("python", ema_python), ("scan", ema_scan)):
            program = torch.export.export(Ema(fn), (xs,))
            torch.testing.assert_close(program.module()(xs), ema_python(xs))
            nodes[name] = len(program.graph.nodes)
        print(f"{steps:>6} {nodes['python']:>24} {nodes['scan']:>18}")
        scan_sizes.add(nodes["scan"])
    assert nodes["scan"] < nodes["python"]
    assert len(scan_sizes) == 1, f"the scan graph's size changed with the step count: {scan_sizes}"
else:
    print(f"skipped: torch {torch.__version__} has no torch._higher_order_ops.scan")

# %% [markdown]
# The unrolled loop's graph grows with the step count; the `scan` graph stays the same size (the
# cell asserts it). There is a second difference. The unrolled graph is made for the example's step
# count, so asking export for a *dynamic* number of steps (notebook 06 covers
# `dynamic_shapes`) fails, while one exported `scan` serves any length:

# %%
if compat.has("scan"):
    steps = torch.export.Dim("steps")
    program = torch.export.export(Ema(ema_scan), (torch.randn(8, 16),), dynamic_shapes={"xs": {0: steps}})
    for n_steps in (3, 50):
        xs = torch.randn(n_steps, 16)
        torch.testing.assert_close(program.module()(xs), ema_python(xs))
    print("scan, exported once with a dynamic step count, runs 3 and 50 steps correctly")
    err = expect_error(lambda: torch.export.export(Ema(ema_python), (torch.randn(8, 16),),
                                             dynamic_shapes={"xs": {0: steps}}), match="specialized")
    print("the Python loop:", key_line(err, "specialized"))
    print("  (torch's message speaks of mark_dynamic; with export it means the Dim passed in dynamic_shapes)")
else:
    print(f"skipped: torch {torch.__version__} has no torch._higher_order_ops.scan")

# %% [markdown]
# `map(f, xs)` applies `f` to each slice of `xs` along the first dimension and stacks the results
# (when `f` is vectorisable, notebook 05's `vmap` is usually the better tool), and
# `associative_scan(combine_fn, xs, dim)` computes prefix combinations with an associative
# operator, such as a cumulative sum, in a form that can run in parallel. Its default
# `combine_mode="pointwise"` is meant for GPUs, and some releases refuse CPU tensors with it (the
# cell says whether yours does); `combine_mode="generic"` works on the CPU in every release this
# course supports, so that is what the cell checks:

# %%
if compat.has("scan"):
    xs = torch.randn(6, 4)
    torch.testing.assert_close(hops.map(lambda row: row.softmax(dim=-1), xs),
                               torch.stack([row.softmax(dim=-1) for row in xs]))
    torch.testing.assert_close(hops.associative_scan(lambda u, v: u + v, xs, dim=0, combine_mode="generic"), xs.cumsum(dim=0))
    print("map matches a Python loop; associative_scan with + matches cumsum")
    try:
        pointwise = hops.associative_scan(lambda u, v: u + v, xs, dim=0)  # the default, combine_mode="pointwise"
        torch.testing.assert_close(pointwise, xs.cumsum(dim=0))
        print(f"torch {torch.__version__} also accepts CPU tensors with combine_mode='pointwise' (and matches cumsum)")
    except (ValueError, RuntimeError) as err:
        print(f"torch {torch.__version__} refuses CPU tensors with combine_mode='pointwise': {str(err).splitlines()[0]}")
else:
    print(f"skipped: torch {torch.__version__} has no torch._higher_order_ops.scan")

# %% [markdown]
# ## 4 · Reading an exported program that contains `cond`
#
# Export the router from section 2 and print its graph: the top level computes the predicate, then
# calls `torch.ops.higher_order.cond` with two sub-graphs and a list of operands.

# %%
router.eval()
program = torch.export.export(router, (x_deep,))
print(program.graph_module.code.strip())

# %% [markdown]
# Look at the operands list: besides `x` it contains every parameter of *both* branches,
# `p_deep_*` and `p_cheap_*`. The branches closed over their parameters through `self`; export
# lifted them into explicit inputs, and both branch graphs take the same list (each uses only its
# own). Printing the two branch graphs:

# %%
for name in ("true_graph_0", "false_graph_0"):
    branch = getattr(program.graph_module, name)
    ops = [str(n.target) for n in branch.graph.nodes if n.op == "call_function"]
    print(f"{name}: {ops}")
print("\nexported inputs:", [f"{s.arg.name} ({s.kind.name})" for s in program.graph_signature.input_specs])

# %% [markdown]
# Now run the exported program on inputs that take each branch, check it against eager, and
# round-trip it through `torch.export.save` / `torch.export.load`: the `cond` is part of the
# saved artefact, not something Python decides at load time.

# %%
path = config.build_dir() / "router_cond.pt2"
torch.export.save(program, path)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*non-writable.*")  # some releases warn while loading
    loaded = torch.export.load(path)
with torch.no_grad():
    for label, x in [("x_deep", x_deep), ("x_cheap", x_cheap)]:
        branch = "deep" if router.score(x).mean() > 0 else "cheap"
        expected = router_if(x)
        torch.testing.assert_close(program.module()(x), expected)
        torch.testing.assert_close(loaded.module()(x), expected)
        print(f"{label}: took the {branch} branch; exported and reloaded programs match eager")

# %% [markdown]
# The same module converts to ONNX: the `cond` becomes an ONNX `If` node with a sub-graph per
# branch (notebook 07 covers ONNX export in depth). ONNX Runtime then takes the branch at run time:

# %%
import onnxruntime as ort

onnx_path = config.build_dir() / "router_cond.onnx"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # exporter notes about opset choices: not the lesson here
    onnx_program = torch.onnx.export(router, (x_deep,), str(onnx_path), dynamo=True, verbose=False)
op_types = [node.op_type for node in onnx_program.model_proto.graph.node]
print("top-level ONNX nodes:", op_types)
assert "If" in op_types
session_ort = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
input_name = session_ort.get_inputs()[0].name
with torch.no_grad():
    for x in (x_deep, x_cheap):
        out = session_ort.run(None, {input_name: x.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(out), router(x), rtol=1e-4, atol=1e-5)
print("ONNX Runtime matches eager on both branches (rtol=1e-4)")

# %% [markdown]
# ## 5 · Speed: compiled `cond` against a Python `if` with its graph break
#
# Capturing the whole function is the main reason to use `cond`. Is it also faster? Four versions
# of `clip_then_score`, all computing the same thing:
#
# - **eager, Python if**: the baseline;
# - **compiled, Python if**: two compiled graphs with Python (and a guard check) in between;
# - **compiled cond**: one graph; the branch choice happens inside the compiled code;
# - **compiled where**: no branch at all. `torch.where(pred, scaled, h)` computes *both* branches and
#   keeps one. Both branches here are cheap, so this is a fair candidate.
#
# Two sizes: a short vector, where per-call overhead dominates, and a long one (in full mode 64 MiB:
# more than many laptops' last-level cache, though not every server's; the cell prints this
# machine's where Linux lists it), where the versions differ in how many vector-sized buffers they
# allocate and how many passes they make over the vector. Beside the variants the cell times two
# ways of moving the vector once: a copy into fresh memory and an in-place pass over memory that
# already exists, the two units the lines under the timings use to set each version's time against
# its counts. Every variant is checked against eager on both branches before it is timed, and each
# first call also reports what Inductor's on-disk graph cache did with the graphs it compiled.

# %%
from torch._dynamo.utils import counters


def clip_then_score_where(x: torch.Tensor) -> torch.Tensor:
    h = F.leaky_relu(x, 0.1) * 1.5
    h = torch.where(h.norm() > LIMIT, h * (LIMIT / h.norm()), h)  # written as the other two: the norm twice
    return h * h + 1


SIZES = config.pick(quick=(256, 65_536), full=(256, 16_777_216))  # 16M floats: 64 MiB, more than many CPU caches
FRESH, IN_PLACE = "copy into fresh memory", "in-place pass over existing memory"
CACHE_EVENTS = bench.CACHE_EVENTS  # what Inductor's on-disk FX graph cache did: hit, miss, bypass


tables, memory_tables, first_calls, cache_events, copy_ms = {}, {}, {}, {}, {}
# Inductor's one-time start-up (its compile workers, the C++ toolchain check) goes to a throwaway
# function, so the first variant timed below does not pay it for the others
bench.first_call(torch.compile(lambda t: t * 2 + 1), torch.randn(8))
for n in tqdm(SIZES, desc="sizes"):
    torch._dynamo.reset()  # each size starts from a clean compiler
    x_big, x_small = torch.randn(n), 1e-3 * torch.randn(n)  # scaled and unchanged branches
    variants = {
        "eager, Python if": clip_then_score,
        "compiled, Python if": torch.compile(clip_then_score),
        "compiled cond": torch.compile(clip_then_score_cond),
        "compiled where": torch.compile(clip_then_score_where),
    }
    # each first call's time, and what Inductor's graph cache did with the graphs it compiled
    first = {name: bench.first_call_and_cache(fn, x_big) for name, fn in variants.items() if name != "eager, Python if"}
    first_calls[n] = {name: seconds for name, (seconds, _) in first.items()}
    cache_events[n] = {name: events for name, (_, events) in first.items()}
    for fn in variants.values():
        for x in (x_big, x_small):
            torch.testing.assert_close(fn(x), clip_then_score(x), rtol=1e-4, atol=1e-4)
    tables[n] = bench.compare(variants, x_big, rounds=5,
                              min_run_time=config.pick(0.3, 3.0)).with_load()  # long: noisy machines; load sampled
    # one read and one write of the vector each: into a new tensor, as every version's output is, or in place
    scratch = x_big.clone()
    memory_tables[n] = bench.compare({FRESH: torch.clone, IN_PLACE: lambda _: scratch.mul_(1.0)}, x_big, rounds=5)
    copy_ms[n] = memory_tables[n].row(FRESH).median_s * 1e3


for n in SIZES:
    print(f"\n{n:,} elements (first compiled calls, s, and what the graph cache did: "
          + ", ".join(f"{k} {v:.1f} [{bench.cache_words(cache_events[n][k])}]" for k, v in first_calls[n].items()) + ")")
    compiled_here = [k for k in first_calls[n] if bench.graphs_built(cache_events[n][k])]
    if len(compiled_here) < 2:   # a hit's first call skips code generation: it does not compare with a compile
        print("  (" + (f"only {compiled_here[0]} compiled its graphs" if compiled_here else "no version compiled its "
                       "graphs") + " in this run: these first calls do not compare with each other)")
    print(tables[n])
    if n == max(SIZES):  # on a short vector both memory timings are call overhead, not memory
        print(memory_tables[n])

# does the long vector fit in this CPU's last-level cache? If it does, an in-place pass can run from cache
vector_bytes = max(SIZES) * x_big.element_size()
llc = cpu.last_level_cache()  # (level, bytes) from Linux's /sys; None elsewhere
fits = llc is not None and vector_bytes <= llc[1]
print(f"\nthe long vector is {vector_bytes / 2**20:g} MiB; " + (
    "this cell could not read this CPU's last-level cache size (it reads Linux's /sys), so whether the vector "
    "fits in it is unknown" if llc is None else
    f"this CPU's last-level cache (L{llc[0]}) is {llc[1] / 2**20:g} MiB, so the vector "
    + ("can stay in cache here" if fits else "does not fit in it")))

print("\nwhat a second run of the notebook can expect, by the graph-cache events of these first calls (both sizes):")
for name in first_calls[SIZES[0]]:
    events = {e: sum(cache_events[n][name][e] for n in SIZES) for e in CACHE_EVENTS}
    kept, bypassed = events["hit"] + events["miss"], events["bypass"]
    print(f"  {name}: " + (
        "no graph-cache events: the cache is off here, so every run generates its code again" if not kept + bypassed else
        "its graphs were found in the cache or stored there, so a second run skips their code generation "
        "and C++ build" if not bypassed else
        "Inductor would not store its graphs (bypass), so every run generates its code again" if not kept else
        f"{kept} of its graphs were found or stored and {bypassed} bypassed: a second run generates the bypassed "
        "ones again"))
fig, axes = plt.subplots(1, len(SIZES), figsize=(12, 3.2))
for ax, n in zip(axes, SIZES):
    bench.bar_chart(tables[n], title=f"{n:,} elements", ax=ax)
fig.tight_layout();


# %% [markdown]
# To explain these numbers, look at what Inductor generated for each version: how many compiled
# graphs, and how many kernels (fused loop nests) in each. `run_and_get_code` (from `torch._inductor.utils`)
# compiles a function and hands back the generated source; `course_utils.inductor_code` wraps it
# (`generated_code`) and lists the kernels each source defines (`fused_kernels`). The cell also
# counts what one call down the scaling branch (the branch the timed vectors take) does: the kernels
# it runs, how many of them compute the norm (a sum over the vector: its C++ keeps an accumulator),
# the passes over the vector those kernels make (a kernel may loop over the vector more than once:
# the cell counts the loops in its C++ that run over every element) and the fresh vector-sized
# buffers it allocates (the source's `empty_strided_cpu` lines), counting the `call` function and
# the `cond` branch it enters, at each size timed above. All three versions are written alike, with
# `h.norm()` in the test and again in the scaling; within one graph Inductor computes it once, but
# a branch compiled as a graph of its own cannot reuse the value from the graph before it:

# %%
def vector_loops(kernel_cpp: str, numel: int) -> int:
    """Loops over all numel elements in one kernel's C++: each is one pass over the vector."""
    return len(re.findall(rf"for\s*\(\s*int64_t x0\s*=[^;]*;\s*x0\s*<\s*static_cast<int64_t>\({numel}L\)", kernel_cpp))


def per_call(sources: list[str], numel: int) -> tuple[int, int, int, int]:
    """Return (fresh numel-element buffers allocated, kernels run, passes over the vector, kernels that compute
    the norm) for one call down the scaling branch: each generated source's `call` function plus, where it
    holds a cond, the true branch's function. Passes are 0 where a kernel's loops were not recognised."""
    buffers = kernels = passes = norms = 0
    for source in sources:
        defined = set(fused_kernels(source))
        code = re.sub(r"'''.*?'''", "''", source, flags=re.S)  # drop the kernels' C++ text
        pieces = re.split(r"^[ \t]*def (\w+)\(", code, flags=re.M)  # [preamble, name, body, name, body, ...]
        for name, body in zip(pieces[1::2], pieces[2::2]):
            if name == "call" or re.fullmatch(r"true_graph_\d+", name):
                buffers += body.count(f"empty_strided_cpu(({numel}, )")
                ran = [word for word in re.findall(r"\b(\w+)\(", body) if word in defined]
                kernels += len(ran)
                loops = [vector_loops(kernel_source(source, k), numel) for k in ran]
                passes = passes + sum(loops) if passes >= 0 and all(loops) else -1   # -1: a kernel not understood
                norms += sum("tmp_acc" in kernel_source(source, k) for k in ran)  # an accumulator: the norm's sum
    return buffers, kernels, max(passes, 0), norms


torch._dynamo.reset()
generated, per_size = {}, {}
for name, fn in [("compiled, Python if", clip_then_score), ("compiled cond", clip_then_score_cond),
                 ("compiled where", clip_then_score_where)]:
    for n in SIZES:  # x_loud repeated, so the scaling branch runs; the code kept for printing is the short one's
        _, sources = generated_code(torch.compile(fn), x_loud.repeat(n // x_loud.numel()))
        per_size[name, n] = per_call(sources, n)
        generated.setdefault(name, sources)
buffers, runs, passes, norms = ({name: per_size[name, max(SIZES)][i] for name in generated} for i in range(4))
assert all(per_size[name, n] == (buffers[name], runs[name], passes[name], norms[name]) for name, n in per_size), \
    "the same counts at every size"
for name, sources in generated.items():
    kernels = [len(fused_kernels(src)) for src in sources]
    print(f"{name:20s} {counted(len(kernels), 'graph')}, kernels per graph: {kernels}; one call runs "
          f"{counted(runs[name], 'kernel')} ({norms[name]} computing the norm), "
          + (f"makes {counted(passes[name], 'pass', 'passes')} over the vector " if all(passes.values()) else "")
          + f"and allocates {counted(buffers[name], 'fresh vector-sized buffer')}")
if not all(passes.values()):
    print("(this torch's generated loops were not recognised, so the passes over the vector are not counted)")
kernel_counts = {k: [len(fused_kernels(src)) for src in v] for k, v in generated.items()}
assert len(kernel_counts["compiled, Python if"]) == 2 and len(kernel_counts["compiled cond"]) == 1
assert kernel_counts["compiled cond"][0] > kernel_counts["compiled where"][0]
assert buffers["compiled where"] < buffers["compiled cond"] == buffers["compiled, Python if"], buffers
assert runs["compiled cond"] > runs["compiled, Python if"] > runs["compiled where"], runs
assert norms["compiled where"] == 1 < norms["compiled, Python if"] == norms["compiled cond"], norms  # no reuse across
if all(passes.values()):
    assert passes["compiled cond"] > passes["compiled, Python if"] > passes["compiled where"], passes
reads_back = {name: sum(src.count(".item()") for src in sources) for name, sources in generated.items()}
print(f".item() calls in the generated code (a value read back to pick a branch): compiled cond "
      f"{reads_back['compiled cond']}, compiled where {reads_back['compiled where']}; compiled, Python if "
      f"{reads_back['compiled, Python if']}: its `if` is the graph break, so Python reads the predicate between "
      "its two graphs")
assert reads_back["compiled where"] == reads_back["compiled, Python if"] == 0 < reads_back["compiled cond"]

wrapper = generated["compiled cond"][0].splitlines()
start = next((i for i, line in enumerate(wrapper) if ".item()" in line), None)
if start is not None:
    print("\nthe cond's branch, inside the generated wrapper code:")
    print("\n".join(line for line in wrapper[start:start + 14] if line.strip()))


# %%
def rough(t: bench.Comparison, *labels: str) -> str:
    """A clause for a reason built on these rows' medians when one of their spreads is large, else ""."""
    noisy = any(t.row(k).iqr_s > bench.NOISY_SPREAD * t.row(k).median_s for k in labels)
    return "; this run's spread is large (see the note under the table), so treat that as rough" if noisy else ""


def passes_text(n: int, more: str = "") -> str:
    """'3 passes over the vector' (or '3 more passes ...'), or '' where the cell above could not count them."""
    return f"{counted(n, (more + ' pass').strip(), (more + ' passes').strip())} over the vector" if all(passes.values()) else ""


def outside_counts(t: bench.Comparison) -> str:
    """What the cell can say about a time its counts do not explain: other programs' load, if it sampled that."""
    if t.other_load is None:
        return "this cell does not measure what it is"
    if t.load_note():
        return f"{t.load_note()}; rerun when quiet"
    return ("not other programs, which were nearly idle: how each loop was compiled, or the calls' own variation; "
            "this cell does not measure which")


for n in SIZES:
    t = tables[n]
    fastest = min(t.rows, key=lambda r: r.median_s).label
    role = "small" if n == min(SIZES) else "large"  # the large size differs between quick and full mode
    cond_said = t.describe("compiled cond", "compiled, Python if", name=f"cond.sizes.cond_vs_if.{role}")
    where_said = t.describe("compiled where", "compiled cond", name=f"cond.sizes.where_vs_cond.{role}")
    runner_up = min((r for r in t.rows if r.label != fastest), key=lambda r: r.median_s).label
    fastest_said = (f"fastest: '{fastest}'" if t.verdict(fastest, runner_up) == "faster" else
                    f"lowest median: '{fastest}', not clearly apart from '{runner_up}'")
    print(f"{n:>9,} elements ({fastest_said}):\n"
          f"  compiled cond is {cond_said}\n"
          f"  compiled where is {where_said}")
    if role == "small":
        print(f"  why: at this size the time is per-call overhead (a copy of the vector takes "
              f"{copy_ms[n] * 1e3:.1f} µs): the Python-if version enters two graphs with "
              "Python and guards between them, cond enters one graph that runs more kernels (counted above); "
              "both read the predicate back to pick a branch, while where enters one graph, runs one kernel "
              "and reads nothing back")
        continue
    fresh_ms, pass_ms = copy_ms[n], memory_tables[n].row(IN_PLACE).median_s * 1e3
    fresh_word = memory_tables[n].verdict(FRESH, IN_PLACE)
    pass_rate = 2 * vector_bytes / pass_ms / 1e6  # GB/s: one read and one write of the vector
    print(f"  moving the vector once: a copy into fresh memory took {fresh_ms:.2f} ms, an in-place pass over existing "
          f"memory {pass_ms:.2f} ms, so " + {
              "slower": (f"the copy took {fresh_ms - pass_ms:.2f} ms more than the pass" if fits else
                         "getting fresh memory was most of the copy's time" if fresh_ms > 2 * pass_ms else
                         f"getting fresh memory added {fresh_ms - pass_ms:.2f} ms to it"),
              "no clear difference": "getting fresh memory made no clear difference here",
              "faster": "getting fresh memory cost nothing measurable here (the copy was the faster)"}[fresh_word]
          + (f" (the in-place pass moved {pass_rate:.0f} GB/s over a vector that fits in this CPU's last-level "
             "cache, so it can run from cache: the gap includes new pages and cache misses, and this cell does not "
             "split them" + (f"; {memory_tables[n].load_note()}, which also stretches them"
                             if memory_tables[n].load_note() else "")
             + ")" if fits and fresh_word == "slower" else ""))
    counted_passes = bool(passes_text(1))

    def predicted_ms(name: str) -> float:
        """What the counts alone predict: each fresh buffer one fresh copy's time, each further pass an in-place one."""
        return buffers[name] * fresh_ms + max(passes[name] - buffers[name], 0) * pass_ms

    shares = {}
    for name in ("compiled where", "compiled, Python if", "compiled cond"):
        ms = t.row(name).median_s * 1e3
        shares[name] = predicted_ms(name) / ms
        print(f"  {name:20s} {ms:8.2f} ms = {ms / fresh_ms:4.1f} fresh copies' time; it allocates "
              f"{counted(buffers[name], 'fresh buffer')} and runs {counted(runs[name], 'kernel')}"
              + (f", making {passes_text(passes[name])}; " + (
                  f"the counts account for about {predicted_ms(name):.2f} ms ({shares[name]:.0%})" if shares[name] <= 1
                  else f"the counts predict about {predicted_ms(name):.2f} ms, a little more than measured (its fresh "
                       "memory cost less than the timed copy here)") if counted_passes else "") + " (counted above)")
    under_half = [name for name, share in shares.items() if share < 0.5]
    if counted_passes and under_half:
        print(f"  the counts account for under half of the time of {', '.join(under_half)} here: the rest is work inside "
              "the loops (their arithmetic) that buffers and passes do not measure, so the gaps below can lie there too"
              + scalar_note(compared=False))
    # where against cond: cond allocates more fresh buffers and runs more kernels (asserted above)
    cond_row, where_row = t.row("compiled cond"), t.row("compiled where")
    gap_ms = (cond_row.median_s - where_row.median_s) * 1e3
    adds = (f"cond allocates {counted(buffers['compiled cond'] - buffers['compiled where'], 'more fresh buffer')} "
            f"than where and runs {counted(runs['compiled cond'] - runs['compiled where'], 'more kernel')}"
            + (f", making {passes_text(passes['compiled cond'] - passes['compiled where'], 'more')}"
               if passes_text(1) else ""))
    where_word = t.verdict("compiled where", "compiled cond")
    if where_word == "faster":
        expected_ms = predicted_ms("compiled cond") - predicted_ms("compiled where")
        why_where = (f"{adds}; its extra {gap_ms:.2f} ms is {gap_ms / fresh_ms:.1f} fresh copies' time"
                     + ((f", about what those counts predict ({expected_ms:.2f} ms)"
                         if 0.5 * expected_ms <= gap_ms <= 2 * expected_ms else
                         f", less than half what those counts predict ({expected_ms:.2f} ms): the extra buffer and "
                         "passes cost less here than the timed moves" if gap_ms < 0.5 * expected_ms else
                         f", more than twice what those counts predict ({expected_ms:.2f} ms), so the rest is outside "
                         f"them ({outside_counts(t)})") if counted_passes and expected_ms > 0 else "")
                     + (scalar_note() if gap_ms > 2 * expected_ms else "")
                     + rough(t, "compiled where", "compiled cond"))
    elif where_word == "no clear difference" and not t.within_margin("compiled where", "compiled cond"):
        why_where = (f"{adds}, but this run's timings are too spread to show what those cost (cond's IQR is "
                     f"{cond_row.iqr_s * 1e3 / fresh_ms:.1f} fresh copies' time)")
    elif where_word == "no clear difference":
        expected_ms = predicted_ms("compiled cond") - predicted_ms("compiled where")
        pair_spread_ms = (cond_row.iqr_s + where_row.iqr_s) * 1e3
        lower = "cond" if gap_ms < 0 else "where"
        why_where = (f"{adds}, yet the medians are within 5% ({abs(gap_ms):.2f} ms apart, {lower} the lower)"
                     + ((f": the counts predict {expected_ms:.2f} ms between them, more than their timing spread "
                         f"({pair_spread_ms:.2f} ms), so the extra buffer and passes cost less here than the timed "
                         "moves would predict" if expected_ms > pair_spread_ms else
                         f": the counts predict {expected_ms:.2f} ms between them, inside their timing spread "
                         f"({pair_spread_ms:.2f} ms), so this run cannot show it") if counted_passes else "")
                     + (f"; {scalar_note().strip(' ;()')}" if scalar_note() and expected_ms > pair_spread_ms else "")
                     + rough(t, "compiled where", "compiled cond"))
    else:
        why_where = (f"{adds}, yet where was slower although it does less of both; it computes both branches in its "
                     "one kernel, and this cell does not time that, so what decided is outside these counts "
                     f"({outside_counts(t)})" + (f"; {scalar_note().strip(' ;()')}" if scalar_note() else "")
                     + rough(t, "compiled where", "compiled cond"))
    print(f"  why where against cond: {why_where}")
    # cond against the Python if: the same fresh buffers, more kernels and passes (asserted above)
    more = runs["compiled cond"] - runs["compiled, Python if"]
    more_passes = passes["compiled cond"] - passes["compiled, Python if"]   # 0 where not counted
    same = (f"both allocate {counted(buffers['compiled cond'], 'fresh buffer')}, and cond runs "
            f"{counted(more, 'more kernel')}"
            + (f" and makes {passes_text(more_passes, 'more')}" if more_passes else "")
            + f", all over memory it already has (an in-place pass took {pass_ms:.2f} ms here)")
    cond_word = t.verdict("compiled cond", "compiled, Python if")
    short = tables[min(SIZES)]  # what one graph instead of two saved per call on the short vector
    short_gap_ms = (short.row("compiled, Python if").median_s - short.row("compiled cond").median_s) * 1e3
    d_ms = (cond_row.median_s - t.row("compiled, Python if").median_s) * 1e3
    why_cond = {
        "no clear difference": same + ("; the two medians are within 5%" + rough(t, "compiled cond", "compiled, Python if")
                                       if t.within_margin("compiled cond", "compiled, Python if") else
                                       "; the two medians are inside the timing spread"),
        "slower": (f"{same}; its extra {d_ms:.2f} ms is {d_ms / pass_ms:.1f} in-place passes' time"
                   + ((f", more than its {passes_text(more_passes, 'extra')} explain, so the rest is outside these "
                       f"counts ({outside_counts(t)})" if d_ms / pass_ms > 2 * more_passes else
                       f", within what its {passes_text(more_passes, 'extra')} could take (the cell would call the gap "
                       f"unexplained above {2 * more_passes} in-place passes' time, twice their count)") if more_passes else
                      " (this torch's passes were not counted, so the cell cannot set that against them)")
                   + rough(t, "compiled cond", "compiled, Python if")),
        "faster": (f"{same}, yet cond was faster by {-d_ms:.2f} ms"
                   + (f", far more than one graph instead of two saved on the short vector ({short_gap_ms * 1e3:.1f} µs)"
                      if 0 < short_gap_ms and -d_ms > 10 * short_gap_ms else "")
                   + f": what decided is outside these counts ({outside_counts(t)})"
                   + rough(t, "compiled cond", "compiled, Python if")),
    }[cond_word]
    print(f"  why cond against the Python if: {why_cond}{scalar_note()}")
    # where against the Python if: fewer fresh buffers, kernels and passes (asserted above), but every element is
    # scaled whichever branch applies
    if_row = t.row("compiled, Python if")
    saved_ms = (if_row.median_s - where_row.median_s) * 1e3
    fewer = (f"where allocates {counted(buffers['compiled, Python if'] - buffers['compiled where'], 'fewer fresh buffer')}"
             f" and computes the norm once ({norms['compiled, Python if']} times in the if's two graphs, which "
             "cannot share it)" + (f", making {passes_text(passes['compiled, Python if'] - passes['compiled where'], 'fewer')}"
                                   if passes_text(1) else ""))
    where_if_word = t.verdict("compiled where", "compiled, Python if")
    expected_if_ms = predicted_ms("compiled, Python if") - predicted_ms("compiled where")
    spread_ms = (if_row.iqr_s + where_row.iqr_s) * 1e3
    if not counted_passes:
        where_if_load_said = "; this torch's passes were not counted, so the cell cannot set the gap against them"
    elif expected_if_ms <= spread_ms:
        where_if_load_said = (f"; the counts predict {expected_if_ms:.2f} ms between them, inside their timing spread "
                              f"({spread_ms:.2f} ms), so this run cannot show it")
    else:
        where_if_load_said = (f"; the counts predict {expected_if_ms:.2f} ms between them, more than their timing "
                              f"spread ({spread_ms:.2f} ms), so what they count did not decide here: the arithmetic "
                              "inside each loop, which this cell does not time, can")
    if t.load_note():
        where_if_load_said += f" ({t.load_note()}; rerun when quiet)"
    why_where_if = {
        "faster": f"{fewer}; it saved {saved_ms:.2f} ms, {saved_ms / fresh_ms:.1f} fresh copies' time"
                  + rough(t, "compiled where", "compiled, Python if"),
        "no clear difference": f"{fewer}, yet " + ("the medians are within 5%" if t.within_margin(
            "compiled where", "compiled, Python if") else "the difference stayed inside the timing spread")
            + where_if_load_said
            + rough(t, "compiled where", "compiled, Python if"),
        "slower": f"{fewer}, yet where was slower; the counts cover buffers and passes, not the arithmetic inside each "
                  f"loop, so what decided is outside these counts ({outside_counts(t)})"
                  + rough(t, "compiled where", "compiled, Python if"),
    }[where_if_word]
    print(f"  compiled where is {t.describe('compiled where', 'compiled, Python if')}\n"
          f"  why where against the Python if: {why_where_if}{scalar_note()}")

# %% [markdown]
# How to read this, on any machine:
#
# - **Short vectors: fixed costs per call.** At 256 elements every version takes microseconds, so
#   the table measures overhead, and the two branching versions pay different kinds. The Python-if
#   version runs two compiled graphs, checks two sets of guards and returns to Python in between,
#   but launches one kernel per graph (counted above). The `cond` version makes one call into one
#   graph, but that graph holds more kernels (counted above: those around the branch and one in each
#   branch), of which the untaken branch's does not run, and, as the `if` does in Python between its
#   two graphs, it reads the predicate
#   back (`.item()`, counted above) to pick a branch. Which total is smaller depends on the machine,
#   and on a busy one the gap can drown in noise: compare it with the IQR column before you believe
#   it. `where` has neither cost: one graph, one kernel (counted above), nothing read back.
# - **Long vectors: fresh buffers and passes over memory**, where the loops' arithmetic is cheap
#   next to them (the lines under the timings say how much of each time the counts account for). Inductor compiles each branch of a `cond`
#   as its own sub-graph, so it cannot fuse across the `cond` boundary: one kernel before the `cond`
#   writes `h` into a new buffer, the branch's kernel reads it and writes its result into another,
#   and a kernel after the `cond` updates that result in place. Both branching versions compute the
#   norm twice (counted above), since the branch cannot reuse the value from the graph before it. The
#   graph-break version fuses the taken branch with the code after it, so it runs fewer kernels and
#   passes than `cond` but allocates as many new buffers (all counted above); `where` allocates the
#   fewest and makes the fewest passes (its one kernel loops over the vector once for the norm and
#   again for the output). When `h`'s norm is at most `LIMIT`, so that it passes through unchanged, `where` still
#   computes the scaled values and throws them away
#   (see "When `where` does not pay"). A new buffer can cost more than the
#   bytes written into it: a large one comes fresh from the operating system, which supplies each
#   page of it when it is first written. That is why the cell times a copy into fresh memory beside
#   an in-place pass. The lines under the long vector set each version's time beside its counts, in
#   units of those two timed moves, and the "why" lines put the gaps between versions in the same
#   units, so you can see how far the counts go to explain them. Where the vector fits in the CPU's
#   last-level cache (the cell prints both sizes where it can read the cache's), the in-place pass
#   can run from cache, so that unit is a cache rate rather than a memory one.
# - So speed is not why you reach for `cond`: it is what makes the function capturable (for export,
#   for `fullgraph=True`, for code that must not break the graph). If it comes out ahead on the short
#   vector, the counts above suggest why (one graph instead of two: no graph break, one guard check
#   and one call into Inductor's wrapper, which picks the branch itself, as the `if` in the code
#   printed above shows), but the cell does not time those parts; where it comes out behind on the long vector, the
#   "why" lines set its extra time beside the passes and buffers its boundary adds.
# - **When `where` does not pay.** `where` evaluates both branches on every call. With two cheap
#   branches that costs little; with an expensive branch that is rarely taken (the router's deep
#   block), computing it every time can cost more than the branch saves, and `cond` is the tool to
#   try (time both on your model: nothing here times the router).
#
# Read the first-call times together with the cache events beside them. A *hit* skips code
# generation and the C++ build, so that version's first call is what is left: tracing and loading
# the stored code (the cell does not split the two, and how long they take varies a lot between
# machines). Compare first calls only between versions that both compiled their graphs in this run
# (a miss or a bypass). `cond`'s first call compiles both branches up front; the Python-if version
# compiles the graph before the `if` and the branch it took, and pays for one more graph the first
# time the other branch runs (section 1; here, inside the correctness checks). The cell warmed
# Inductor up on a throwaway function first, so no variant pays its one-time start-up; which first
# call is longer depends on how those compiles add up on your machine, and with one sample each, a
# gap of a few tenths of a second says nothing. The events beside each first call say what Inductor's on-disk graph cache did: *hit*
# (found from an earlier run, so no code generation or C++ build), *miss* (compiled now and stored,
# so the next run of the notebook finds it) or *bypass* (not stored, so every run generates its code
# again, though the C++ builds of its kernels may still be found on disk; for `cond`'s graph, torch
# 2.14's cache check refuses graphs that hold a `cond`, its source says; the bypass events above show
# that it was not stored). The lines under the tables say, for
# each version, what a second run can expect from it.
#
# ### Where `cond` does not help
#
# Outside a compiler, `cond` adds work and saves none: its first eager call traces both branches
# into a graph (Dynamo counts it), and every later call still goes through that traced code's
# guards before running the branch. If you never compile or export a function, a Python `if` is
# simpler; the cell below counts the traced graphs and measures what the traced code costs on top:

# %%
torch._dynamo.reset()
graphs_before = counters["stats"]["unique_graphs"]
first_eager_cond_s = bench.first_call(clip_then_score_cond, x_loud)
graphs_first = counters["stats"]["unique_graphs"] - graphs_before
eager_table = bench.compare({"eager, Python if": clip_then_score, "eager cond": clip_then_score_cond}, x_loud)
torch.testing.assert_close(clip_then_score_cond(x_quiet), clip_then_score(x_quiet))  # the other branch, same graph
graphs_later = counters["stats"]["unique_graphs"] - graphs_before - graphs_first
print(f"first eager call of the cond version: {first_eager_cond_s * 1e3:.0f} ms, graphs traced: {graphs_first}; "
      f"graphs traced by every later call (both branches): {graphs_later}")
assert (graphs_first, graphs_later) == (1, 0), "eager cond traces once, then reuses the traced graph"
print(eager_table)
cond_word = eager_table.verdict("eager cond", name="cond.eager.cond_vs_if")
print(f"eager cond is {eager_table.describe('eager cond')}: " + {
    "slower": "every eager call goes back through torch.compile (a new compile wrapper, the traced graph's "
              "guards) and runs the cond operator's Python dispatch; this cell times the sum, not the parts",
    "no clear difference": "on this machine the traced code's extra cost was lost in the timing spread",
    "faster": "on this machine the spread favoured it, although it does the same work plus the guards; "
              "this cell does not measure why"
              + (f" ({eager_table.load_note()})" if eager_table.load_note() else "")}[cond_word])


# %% [markdown]
# ## Check yourself
#
# **Exercise 1.** `normalize_if_loud` divides a signal by its peak when the peak is above 1 and
# otherwise returns it unchanged. As written it cannot be exported. Rewrite it with `torch.cond` so
# that it can (the checker first compiles your function with `fullgraph=True`, then runs
# `torch.export` on it and both branches through the exported program).

# %%
def normalize_if_loud(x: torch.Tensor) -> torch.Tensor:
    # Your code here: replace the Python if with torch.cond.
    peak = x.abs().max()
    if peak > 1.0:
        return x / peak
    return x


exercises.check("04.cond_export", normalize_if_loud)


# %% [markdown]
# **Exercise 2.** `row_summary` should return one number per row: the row means when the whole
# batch has a positive mean, otherwise the row maxima. Its `torch.cond` fails: read the error, then
# fix the branches so both return shape `(batch,)`.

# %%
def row_summary(x: torch.Tensor) -> torch.Tensor:
    # Your code here: fix the branches.
    return torch.cond(x.mean() > 0,
                      lambda x: x.mean(dim=-1, keepdim=True),
                      lambda x: x.amax(dim=-1),
                      (x,))


exercises.check("04.fix_shapes", row_summary)


# %% [markdown]
# **Exercise 3.** Write `halvings(x)`: how many times must `x` be halved until `x.abs().max() <= 1`?
# Use `torch.while_loop`, carrying a counter and the halved tensor, and return the counter (a 0-d
# integer tensor is fine). The checker also compiles it with `fullgraph=True`.

# %%
def halvings(x: torch.Tensor) -> torch.Tensor:
    # Your code here.
    return None


exercises.check("04.halvings", halvings)

# %% [markdown]
# Stuck? `print(exercises.solution_source("04.cond_export"))` (or `"04.fix_shapes"`,
# `"04.halvings"`) shows a reference solution. Try for yourself first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.
#
# ## Summary
#
# - A Python `if` or `while` on a tensor's value is a **graph break** under `torch.compile` (the
#   function still runs, in pieces, with one more compiled graph per branch taken) and an **error**
#   under `torch.export` and `fullgraph=True`. Strict export says *data-dependent branching*;
#   non-strict export says it *could not guard on a data-dependent expression*.
# - `torch.cond(pred, true_fn, false_fn, operands)` puts both branches in the graph. Branches must
#   agree on output structure, dtype and number of dimensions (on this torch sizes may differ and
#   become symbolic), must not return their operands or views of them, and must not mutate operands
#   or closed-over tensors while grad mode is on (under `no_grad`, section 2's rule 4 cell shows what
#   your torch allows); reading parameters and other closed-over tensors is fine.
# - Gradients flow through the branch taken; the predicate gets none, and the other branch's
#   parameters get **zeros**, not `None`, which weight decay notices (measured in section 2).
# - `torch.while_loop` handles loops whose length depends on values; `scan` keeps a fixed-length
#   loop as one step instead of unrolling it (`scan`, `map` and `associative_scan` live in the
#   private `torch._higher_order_ops`; guard them with `compat.has`).
# - An exported `cond` is a `torch.ops.higher_order.cond` node with two sub-graphs, survives
#   `torch.export.save`/`load`, and becomes an ONNX `If`.
# - `cond` is about capture, not speed: it removes the break (one graph; its wrapper picks the branch) but
#   adds kernels and passes at its boundary that Inductor cannot fuse (counted in section 5). When
#   both branches are cheap, a branchless `torch.where` has neither (one kernel, the fewest fresh
#   buffers and passes, no decision); section 5's verdicts say how each compared on your machine.
#
# **Next:** notebook 05 turns to `torch.func`: `vmap`, `grad` and friends.
#
# ## Further reading
#
# - [`torch.cond`](https://docs.pytorch.org/docs/stable/generated/torch.cond.html) and the
#   [control flow operators](https://docs.pytorch.org/docs/main/higher_order_ops/index.html) pages
#   (`cond`, `while_loop`, `scan`, ...)
# - [`torch.export`](https://docs.pytorch.org/docs/stable/export.html), including strict and non-strict tracing
# - [ExportDB: `torch.cond` examples](https://docs.pytorch.org/docs/stable/generated/exportdb/torch.cond.html)
# - [`torch.compile` troubleshooting and graph breaks](https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html)
