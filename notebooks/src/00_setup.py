# %% [markdown]
# # 00 · Setup: your machine, this course, and a first `torch.compile`
#
# PyTorch 2 keeps the eager, line-by-line PyTorch you know and adds a compiler you can switch on
# with one call. Whether that call pays off depends on your model **and on your machine**, so this
# course never quotes a speed-up from somewhere else: every number you see is measured on the
# computer in front of you. This first notebook makes sure that computer is ready, shows how the
# course is organised, and takes a first honest measurement.

# %% [markdown]
# ## What you will learn
#
# - how the notebooks are ordered, what *quick mode* is, and how GPU-only cells behave on a laptop;
# - how to read the environment report and what the course *doctor* checks;
# - what the first call to a compiled function costs, and whether later calls save anything on your
#   machine (they do not always);
# - how to time code properly (warm-up, many runs, median) with `course_utils.bench`.
#
# **Prerequisites:** Python, and PyTorch tensors and `nn.Module` at beginner level. No earlier notebook.
#
# **Time on a laptop CPU:** <!-- stamp:time -->0.6 min the first time (every cache empty), 0.5 min after that (compile cache warm), 0.3 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time -->
#
# **GPU:** not needed. One cell shows your GPU if you have one and says it skipped otherwise.

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

import torch

from course_utils import bench, config, exercises, inductor_code, session
from course_utils.device import accelerator, accelerator_description, accelerator_memory, requires_accelerator
from course_utils.kit import doctor, env
from course_utils.text import counted

print(session.start(seed=0))

# %% [markdown]
# `session.start` seeds every random number generator, clears any compiled code left in the
# kernel (`torch._dynamo.reset()`), applies the course's thread policy, and returns the one-line
# summary above. Every notebook begins with it, so results do not depend on what you ran before.
# The line names your torch and Python, the cores and torch's threads, your **CPU class** (which
# vector instructions torch can use, such as `x86-avx2` or `x86-amx`; verdicts that depend on it
# can differ between classes), whether torch sees a CUDA GPU (`cuda:`), and the mode. "idle threads sleep" means
# waiting threads do not spin on a core (README, "On a busy laptop"). "BUSY: ..." appears when
# other programs were using the CPU as the notebook started: close them, or read the timings below
# as rough.
#
# ## How the course is organised
#
# The notebooks are numbered and meant to be taken in order; each one lists its prerequisites.
# The README has the full map with the time each one takes on a laptop CPU.
#
# - **Quick mode.** With the environment variable `COURSE_QUICK=1` every notebook shrinks its sizes
#   and iteration counts so the whole course runs in minutes. `make test` sets it; you normally
#   leave it off to see effects at their real size. The switch is read in exactly one place,
#   `course_utils.config`, and notebooks size their experiments with `config.pick(quick, full)`.
# - **CPU first, GPU extras.** Everything runs on a CPU-only laptop. Material that only exists on a
#   GPU sits in guarded cells that print `skipped: needs ...` and the reason on a CPU machine (the
#   section on GPUs below says how the guards work).
# - **Everything is checked.** Cells `assert` what must hold (results match, counts are right), and
#   `make test` runs every notebook top to bottom. To test just this one:
#   `make test-nb NB=notebooks/00_setup.ipynb`.
# - **Exercises grade themselves.** Each notebook ends with *Check yourself*: you write an answer
#   and `exercises.check(...)` confirms it or gives a hint.

# %%
SIZE = config.pick(quick=256, full=1024)  # side of the square tensors used below
print(f"mode: {config.mode_name()}; tensor size for this notebook: {SIZE} x {SIZE}")
print(f"course data:   {config.data_dir()}")
print(f"build outputs: {config.build_dir()}  (git-ignored)")

# %% [markdown]
# ## Your environment
#
# When you ask for help, or compare your numbers with someone else's, this report is the first
# thing to share: library versions, the CPU and how many threads torch uses, whether a CUDA GPU
# is visible, and whether a C++ compiler works (TorchInductor, `torch.compile`'s default backend,
# writes C++ for the CPU and needs one to build it).

# %%
print(env.format_report())

# %% [markdown]
# The **doctor** goes further: it checks every package against the course's minimum version,
# tries a real `torch.compile` in a fresh process, verifies the shipped data files against their
# checksums, and checks that the course can write its caches. Each failure comes with the fix.
# The temporary-directory line counts Inductor's precompiled C++ headers (one per set of compiler
# flags; notebook 01 explains them): deleting them is safe, the next compile builds them again.
# From a terminal, `make doctor` (or `python -m course_utils doctor`) runs the same checks and
# exits with a non-zero status if anything is wrong.

# %%
checks = doctor.run_checks()
for check in checks:
    print(check.line())
problems = [c for c in checks if not c.ok]
assert not problems, "fix the FAIL lines above before going on"
warned = [c for c in checks if c.warning]
print(f"{len(checks)} checks, none failed" + (f"; {counted(len(warned), 'warning')}: read the WARN lines" if warned else ""))

# %% [markdown]
# Do you need a GPU? No. Every lesson measures on the CPU, on every machine, a GPU machine
# included, so your figures can be set beside the course's CPU ranges (`data/expected_ranges.json`;
# `make report` sets your results beside them). A few cells go further where
# torch sees a GPU (CUDA graphs, Triton kernels, FP8, CUDA profiler rows). Each starts with a guard:
# `requires_cuda` for cells written against `torch.cuda` (ROCm builds drive AMD GPUs through it
# too), `requires_accelerator` for cells that run on any accelerator (CUDA, ROCm, XPU, or a Mac's
# MPS), narrowed with `kinds=` where only some of them do (Inductor writes Triton kernels for CUDA
# and XPU, not for MPS); `requires_cuda(..., allow_rocm=False)` marks the cells that need an NVIDIA
# GPU (ONNX Runtime's CUDA provider, FP8 matrix multiplies on compute capability 8.9 or newer).
# Where the guard's condition fails, the cell prints why it skipped and the notebook goes on.
# Inside, the cell asks `accelerator()` for the device instead of assuming CUDA, so the same lines
# describe an NVIDIA, AMD, Apple or Intel GPU.
#
# Two settings change this. `COURSE_DEVICE=cpu` keeps the GPU cells off a GPU you have. Naming a
# device (`COURSE_DEVICE=cuda`, `mps` or `xpu`) makes a missing one an error, so the doctor's
# device line above fails instead of the GPU cells skipping one by one. The cell below is one such
# guarded cell.

# %%
if requires_accelerator("the name, architecture and memory of your GPU"):
    dev = accelerator()
    print(f"accelerator torch sees: {accelerator_description()}")  # name; sm_XY on NVIDIA, gfx on AMD
    memory = accelerator_memory(dev)
    print(f"its memory: {memory.total_bytes / 2**30:.1f} GiB ({memory.meaning})" if memory is not None
          else f"its memory: torch reports none for a {dev.type} device")

# %% [markdown]
# ## A first `torch.compile`
#
# `torch.compile(fn)` returns a wrapped function. Nothing happens until the first call; then
# TorchDynamo reads the Python bytecode of `fn` and records the tensor operations as a graph,
# and TorchInductor turns that graph into C++ (on a GPU, Triton) code, compiles it, and caches it.
# Later calls with inputs of the same kind skip all of that and run the generated code directly.
#
# A chain of element-wise operations is where fusion removes the most memory traffic. In eager mode
# each operation below reads its whole input from memory and writes a whole new tensor back. Inductor
# *fuses* the chain into one loop that reads `x` once and writes the result once. Whether that shows
# as time, and how much of it the saved memory traffic explains, the timing cells further down say.
#
# The cell counts the graphs Dynamo compiles (`torch._dynamo.utils.counters`) around each of the
# first two calls, and times both.

# %%
from torch._dynamo.utils import counters


def activation_chain(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * torch.cos(x) + torch.tanh(x) ** 2
    return torch.nn.functional.gelu(y) * 0.5 + torch.sigmoid(y)


x = torch.randn(SIZE, SIZE)
compiled_chain = torch.compile(activation_chain)

graphs_before = counters["stats"]["unique_graphs"]
# trace, then generate and build the C++ (or load it from Inductor's on-disk cache), run
first_s, cache_events = bench.first_call_and_cache(compiled_chain, x)
graphs_first = counters["stats"]["unique_graphs"] - graphs_before
from_disk = cache_events["hit"] > 0  # Inductor's on-disk cache had this graph
second_s = bench.first_call(compiled_chain, x)  # just run
graphs_second = counters["stats"]["unique_graphs"] - graphs_before - graphs_first
print(f"first call : {first_s:8.3f} s   (graphs compiled during it: {graphs_first}; code from Inductor's disk "
      f"cache: {'yes' if from_disk else 'no'})")
print(f"second call: {second_s * 1e3:8.3f} ms  (graphs compiled during it: {graphs_second})")
# One call each, no spread to judge against: the first counts as longer only beyond a 10% band.
first_word = bench.band_verdict(first_s, second_s, band=0.1, name="setup.first_call.vs_second")
print(f"the 10% band's rule: {bench.band_text(0.1)}")
print(f"first call against second: {first_word} ({first_s / second_s:,.0f}x the time; 10% band): " + {
    "higher": "the first call traced the function and " + ("loaded its generated code from Inductor's on-disk "
              "cache (an earlier run built it)" if from_disk else "generated and built its C++ code") +
              ", the second only ran that code",
    "no clear difference": "the compile work was too small to show against one run of the chain here",
    "lower": "the second call took longer; this cell does not measure why"}[first_word])

torch.testing.assert_close(compiled_chain(x), activation_chain(x), rtol=1e-5, atol=1e-5)
assert (graphs_first, graphs_second) == (1, 0), "the first call compiles the graph, the second reuses it"
chain_diff = (compiled_chain(x) - activation_chain(x)).abs().max().item()
print(f"compiled and eager results agree within rtol=1e-5, atol=1e-5 (largest absolute difference {chain_diff:.1e}; "
      f"bit for bit: {torch.equal(compiled_chain(x), activation_chain(x))})")
# What Inductor wrote for the chain (generated_code resets Dynamo first; the next cell compiles it again).
_, (chain_source, *_) = inductor_code.generated_code(torch.compile(activation_chain), x)
chain_kernels, chain_library = inductor_code.kernel_calls(chain_source), inductor_code.library_calls(chain_source)
print(f"the generated code runs {counted(len(chain_kernels), 'kernel')} ({', '.join(chain_kernels)}) and "
      f"{counted(len(chain_library), 'library call')}")
assert len(chain_kernels) == 1 and not chain_library, "the whole chain fuses into one generated loop"

# %% [markdown]
# Only the first call compiled anything (the counts above): tracing and, unless an earlier run left
# the result in Inductor's on-disk cache, code generation and building the C++ (the first-call line
# says which happened here, and the verdict line what it cost next to one run of the chain). A second run of this
# notebook on the same machine finds the code in that cache (notebook 01 measures cold and warm
# caches). Results agree with eager to a tight tolerance but need not agree bit for bit (the line
# above says whether they did here): a fused loop may evaluate the same formula in a slightly
# different order.
#
# ### Timing done properly
#
# A single `time.time()` around one call is not a measurement. `bench.compare` does it properly
# with `torch.utils.benchmark`: it warms every variant up (so the compile is not timed), runs each
# one many times in blocks, interleaves the variants over several rounds so a busy moment on the
# machine hits all of them, and reports the median and the interquartile range (IQR) of each.
# It also uses as many threads as torch does (`torch.utils.benchmark.Timer` alone uses one).
#
# Each comparison ends in a verdict. *Faster* (or *slower*) only when the two medians are more
# than 5% apart **and** their bands, median ± IQR/2, do not overlap; anything else is *no clear
# difference*, and the line says which rule decided ("within 5%" or "inside the timing spread").
# A figure measured once, such as a first call, has no spread, so it is judged against a stated
# band instead ("10% band"; the first-call cell above prints the ratios that band calls no clear
# difference; beyond them it says higher or lower).
#
# Beside the table, the next cell times one pass over the tensor, `x + 1` (it reads the tensor and
# writes a new one), for scale: roughly what each of eager's operations costs in memory traffic
# alone.

# %%
table = bench.compare({"eager": activation_chain, "compiled": compiled_chain}, x)
# Other programs' load, sampled right after the timings whatever the spread (compare samples it only for a
# large one); the reasons below name it only from the course's threshold.
table = table.with_load()
print(table)
speedup = table.speedup("compiled")
bench.record("setup.first_call_s", first_s, "s", size=SIZE, from_disk=from_disk)
bench.record("setup.steady_speedup", speedup, "x", size=SIZE)
bench.bar_chart(table, title=f"element-wise chain on a {SIZE}x{SIZE} tensor");

# %%
eager_ms = table.row("eager").median_s * 1e3
compiled_ms = table.row("compiled").median_s * 1e3
pass_ms = bench.time_fn(lambda t: t + 1, x).median_ms   # one pass: read the tensor, write a new one
n_ops = sum(node.op == "call_function" for node in torch.fx.symbolic_trace(activation_chain).graph.nodes)
saved_ms = (n_ops - 1) * pass_ms      # eager makes n_ops passes over the tensor, the fused loop one
gain_ms = eager_ms - compiled_ms
eager_iqr_ms = table.row("eager").iqr_s * 1e3
widest_iqr_ms = max(eager_iqr_ms, table.row("compiled").iqr_s * 1e3)
chain_load = table.load_note()   # other programs' load, from the sample taken right after the timings
print(f"eager makes {n_ops} passes over the tensor (a few read two tensors), the fused loop one; at {pass_ms:.3f} ms "
      f"a pass (x + 1, timed on its own), the {n_ops - 1} saved passes are worth roughly {saved_ms:.2f} ms of eager's "
      f"{eager_ms:.2f} ms; the rest of eager's time ({eager_ms - n_ops * pass_ms:.2f} ms) is everything this cell does "
      f"not time apart: the maths, {n_ops} dispatches and allocating each intermediate tensor, whose page faults "
      "notebook 01 counts" + (f"; and any waiting on other programs: {chain_load}" if chain_load else "")
      + f" (eager's IQR {eager_iqr_ms:.2f} ms)")
chain_word = table.verdict("compiled")
left_ms = gain_ms - saved_ms
chain_reason = {
    "faster": (f"it gained {gain_ms:.2f} ms a call; the saved passes (roughly {saved_ms:.2f} ms) can account for all "
               "of it" if left_ms <= 0 else
               f"it gained {gain_ms:.2f} ms a call; the saved passes account for roughly {saved_ms:.2f} ms, which "
               f"leaves {left_ms:.2f} ms, inside eager's own spread (IQR {eager_iqr_ms:.2f} ms): this run cannot tell "
               "whether anything beyond the saved passes (the maths, the dispatches, the allocations) added to the "
               "gain" if left_ms <= eager_iqr_ms else
               f"it gained {gain_ms:.2f} ms a call; the saved passes account for roughly {saved_ms:.2f} ms, which "
               f"leaves {left_ms:.2f} ms, more than eager's spread (IQR {eager_iqr_ms:.2f} ms): the saved passes, as "
               "timed with x + 1, do not account for it, and this cell does not time the maths, the dispatches "
               "and the allocations apart"),
    "no clear difference": (f"the {n_ops - 1} saved passes (roughly {saved_ms:.2f} ms) are within the timing spread "
                            f"(the wider IQR is {widest_iqr_ms:.2f} ms), so they could not show ("
                            + (f"{chain_load}; a tensor small enough to stay in cache would also hide them)"
                               if chain_load else "this cell does not measure why; a tensor small enough to stay in "
                               "cache is one possibility)") if saved_ms <= widest_iqr_ms else
                            f"the {n_ops - 1} saved passes (roughly {saved_ms:.2f} ms) are more than the timing spread "
                            f"(the wider IQR is {widest_iqr_ms:.2f} ms), so the fused loop's own work took about that "
                            "much longer than eager's separate kernels; this cell does not time the maths, the "
                            "dispatches and the allocations apart"),
    "slower": f"the generated loop took longer than eager's {n_ops} kernels put together, although it saved roughly "
              f"{saved_ms:.2f} ms of memory passes; this cell does not time the maths apart" + inductor_code.scalar_note()
              + (f"; {chain_load}" if chain_load else "")}[chain_word]
chain_said = table.describe("compiled", name="setup.chain.compiled_vs_eager")
print(f"steady state ({compiled_ms:.3f} ms vs {eager_ms:.3f} ms per call): compiled is {chain_said}")
print(f"why, on this machine: {chain_reason}")


# %% [markdown]
# ### Where fusion has nothing to save
#
# A single matrix multiply has nothing to fuse: on the CPU, Inductor hands it to the same optimised
# library routine (oneDNN/MKL) that eager PyTorch calls, and adds a check per call of the guards
# that confirm each input still matches what was compiled (notebook 02 shows them). The cell
# prints what the generated code calls, and how the two compared here:

# %%
def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


w = torch.randn(SIZE, SIZE)
# generated_code also returns the code Inductor wrote (it resets Dynamo first, so the chain above is forgotten)
_, (mm_source, *_) = inductor_code.generated_code(torch.compile(project), x, w)
mm_library, mm_loops = inductor_code.library_calls(mm_source), inductor_code.fused_kernels(mm_source)
print(f"the compiled matmul calls {', '.join(mm_library)} through extern_kernels (the ATen operator eager's x @ w "
      "runs, backed by the same BLAS library)" if mm_library else "the compiled matmul calls no library routine",
      f"and defines {counted(len(mm_loops), 'loop')} of its own")
compiled_project = torch.compile(project)
mm_table = bench.compare({"eager": project, "compiled": compiled_project}, x, w)
print(mm_table)
torch.testing.assert_close(compiled_project(x, w), project(x, w), rtol=1e-4, atol=1e-3)
mm_speedup = mm_table.speedup("compiled")
mm_word = mm_table.verdict("compiled")
mm_reason = {"no clear difference": "both run the same library routine, and the guard check a compiled call adds "
                                    "(notebook 02 shows the guards) did not show beside the multiply",
             "faster": f"the library routine is the same, so nothing counted here explains the gap "
                       f"({mm_table.bands_text('compiled')}): rerun the cell",
             "slower": f"the library routine is the same, so nothing counted here explains the gap "
                       f"({mm_table.bands_text('compiled')}): rerun the cell"
             }[mm_word] if mm_library and not mm_loops else "Inductor wrote code of its own here: read the generated code"
print(f"\nmatmul: compiled is {mm_table.describe('compiled', name='setup.matmul.compiled_vs_eager')}: {mm_reason}")

# %% [markdown]
# Small tensors are a subtler case. On 8 numbers there is no memory traffic to save, but eager
# PyTorch pays Python and dispatcher overhead for each of the chain's ten operations, while the
# compiled version makes one call into one generated loop. Whether one call plus the guard checks
# beats ten dispatches depends on your machine; measure rather than guess:

# %%
tiny = torch.randn(8)
tiny_table = bench.compare({"eager": activation_chain, "compiled": compiled_chain}, tiny)
print(tiny_table)
torch.testing.assert_close(compiled_chain(tiny), activation_chain(tiny), rtol=1e-5, atol=1e-5)
tiny_speedup = tiny_table.speedup("compiled")
tiny_verdict = tiny_table.verdict("compiled")
reason = {"faster": "one generated loop beat ten eager dispatches on this machine",
          "slower": ("the compiled call took longer than ten dispatches here; its guard checks and the call into "
                     "compiled code are the likely cost (this cell does not time them apart)"),
          "no clear difference": (
              (f"the medians were within {bench.VERDICT_MARGIN:.0%}: the saved dispatches and the added per-call "
               "checks roughly cancel here" if tiny_table.within_margin("compiled") else
               "the difference stayed inside the timing spread, so this run cannot tell which costs more")
              + (f" ({tiny_table.load_note()})" if tiny_table.load_note() else ""))}[tiny_verdict]
tiny_said = tiny_table.describe("compiled", name="setup.tiny_chain.compiled_vs_eager")
print(f"\nthe chain on 8 numbers: compiled is {tiny_said}: {reason}")


# %% [markdown]
# Notebook 01 maps out this trade-off across models (where compiling pays on a CPU and where it
# does not, and why), and notebook 02 looks at the guards that run on every call.
#
# ## Check yourself
#
# **Exercise 1.** Write `rms_norm(x)`: divide each row of `x` by the root of the mean of its
# squares over the last dimension, `x / sqrt(mean(x**2, dim=-1, keepdim=True) + 1e-6)`, then pass
# the *compiled* function to the checker. (RMSNorm is the normalisation used in many current
# language models.)

# %%
def rms_norm(x: torch.Tensor) -> torch.Tensor:
    # Your code here: replace the line below.
    return x


exercises.check("00.rms_norm", torch.compile(rms_norm))


# %% [markdown]
# **Exercise 2.** The first compiled call takes `first_call_s` (compiling *and* running once); each
# later compiled call takes `compiled_s`, and each eager call `eager_s`. So `n` compiled calls cost
# `first_call_s + (n - 1) * compiled_s`. Write `break_even(first_call_s, eager_s, compiled_s)` that
# returns the smallest `n >= 1` for which that is no more than `n * eager_s`, or `None` when
# `compiled_s >= eager_s` (compiled calls are not cheaper, so compiling never pays).

# %%
def break_even(first_call_s: float, eager_s: float, compiled_s: float) -> int | None:
    # Your code here.
    return None


exercises.check("00.break_even", break_even)

# %% [markdown]
# Once your `break_even` passes, the next cell applies it to what you measured above.
# Stuck? `print(exercises.solution_source("00.break_even"))` reveals a reference solution:
# try for yourself first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
if exercises.check("00.break_even", break_even):
    eager_s = table.row("eager").median_s
    compiled_s = table.row("compiled").median_s
    n = break_even(first_s, eager_s, compiled_s)
    first_said = ("its first call loaded the code from Inductor's disk cache (notebook 01 measures a cold start)"
                  if from_disk else "its first call built the code")
    if chain_word == "slower":
        print("the compiled calls were slower in this run, so at these timings compiling this function does not pay")
    elif chain_word != "faster":
        print(f"the chain's verdict above is '{chain_word}', so this run gives no break-even point to trust")
    else:
        print(("on this machine compiling never pays for this function" if n is None
               else f"in this run compiling pays for itself after {n:,} calls") + f" ({first_said})")
else:
    print("solve Exercise 2 to see your machine's break-even point")

# %% [markdown]
# ## Summary
#
# - `make lab` and `make test` set everything up; the doctor tells you what is missing and how to
#   fix it.
# - `torch.compile` pays a one-off compile cost on the first call, then runs generated code.
#   Fusing an element-wise chain saves memory passes and per-operation dispatches, and the one
#   generated loop may compute the maths faster than eager's separate kernels (the chain's lines
#   above split eager's time into passes and everything else); a lone matrix multiply has nothing to fuse,
#   and on a tiny tensor what compiling can save is dispatch overhead, which competes with
#   per-call guard checks. The verdict lines above say how each case came out on your machine,
#   judged against the timing spread or a stated band.
# - Measure with warm-up, many runs and medians (`course_utils.bench`), and compare variants in
#   the same run. The results you recorded here (`setup.first_call_s`, `setup.steady_speedup`)
#   feed the course's results report.
#
# **Next:** notebook 01 takes `torch.compile` apart: its modes, backends and caches, and where
# it pays on real models.
#
# ## Further reading
#
# - [Introduction to `torch.compile`](https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html) (official tutorial)
# - [`torch.compiler` documentation](https://pytorch.org/docs/stable/torch.compiler.html)
# - [PyTorch Benchmark recipe](https://pytorch.org/tutorials/recipes/recipes/benchmark.html) (`torch.utils.benchmark`)
