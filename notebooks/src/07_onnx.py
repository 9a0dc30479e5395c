# %% [markdown]
# # 07 · ONNX export and ONNX Runtime on a real transformer
#
# Training happens in PyTorch; inference often does not. A phone app, a C# service, a browser, an
# embedded board or a cloud "upload your model" endpoint cannot import torch, but many of them can
# run an **ONNX** file: a portable description of the computation (operators, weights, input and
# output signatures) that a separate runtime executes. This notebook exports the course's real
# pretrained sentence encoder (all-MiniLM-L6-v2) to ONNX, runs it in **ONNX Runtime**, proves the
# two agree to a stated tolerance, measures how its speed compares with eager PyTorch
# and where it does not pay, and works through the failures you will actually meet: an operator the
# exporter cannot translate, and a name clash that produces a file the runtime refuses.

# %% [markdown]
# ## What you will learn
#
# - how `torch.onnx.export` works in PyTorch 2 (built on `torch.export`, returning an `ONNXProgram`),
#   with dynamic batch and sequence axes, and what has been removed or deprecated;
# - how to inspect an ONNX graph: the checker, the opset, the operator counts;
# - how to run it in ONNX Runtime: sessions, execution providers, graph optimisation levels, threads;
# - how to prove parity (maximum absolute and relative error) on random and on real inputs, and that
#   retrieval rankings do not change;
# - how eager PyTorch and ONNX Runtime compare at batch 1 and batch 32, how much of the batch-1 gap is a
#   cost per call that does not grow with the tokens, what a profiler can and cannot say about that
#   cost, and what the one-off costs are;
# - that a torchaudio front end (`MelSpectrogram`) exports inside a model;
# - what to do when an operator has no ONNX translation: a custom translation or a rewrite.
#
# **Prerequisites:** notebook 00 (timing with `course_utils.bench`). Notebook 06 (`torch.export`)
# helps: the ONNX exporter starts from the same graph capture.
#
# **Time on a laptop CPU:** <!-- stamp:time -->1.0 min the first time (every cache empty), 1.1 min after that (caches warm; it compiles nothing, yet no faster in these two runs), 0.6 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time -->
#
# **GPU:** not needed. One guarded cell runs the model on ONNX Runtime's CUDA provider when a GPU
# and the `onnxruntime-gpu` package are present.

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

# The profiler used once below logs Kineto messages (and, on a CPU-only machine, a harmless
# "gpuGetDeviceCount failed") to stderr unless this is set before it first starts.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import collections
import io
import logging
import math
import re
import tempfile
import time
import warnings

import onnx
import onnxruntime as ort
import torch
import torchaudio
from torch import nn
from tqdm import tqdm

from course_utils import bench, config, exercises, session, threads
from course_utils.data import (evaluate, load_retrieval_set, ranking_agreement, ranking_margin, relevance_margin,
                                similarity, synthetic_audio)
from course_utils.deploy import onnx_tools
from course_utils.device import requires_cuda, skip_cell
from course_utils.models import load_minilm
from course_utils.text import about

print(session.start(seed=0))
print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, torchaudio {torchaudio.__version__}")
ONNX_DIR = config.build_dir() / "onnx"  # git-ignored: exported files never go into the repository
ONNX_DIR.mkdir(parents=True, exist_ok=True)
THREADS = torch.get_num_threads()
print(f"torch uses {THREADS} threads; every ONNX Runtime session below gets the same number")


# %% [markdown]
# ## The idea: a graph file that another runtime executes
#
# A model is a program whose instructions are tensor operators (matrix multiply, softmax, layer norm
# and so on). ONNX standardises those operators (each with a version number: the **opset**) and a
# file format that stores the graph of operators together with the weights. Exporting means
# *capturing* the graph once, from example inputs, and *translating* each PyTorch operator into
# ONNX operators. A runtime such as ONNX Runtime then loads the file, rewrites the graph for the
# hardware it runs on (fusing operators, choosing kernels) and executes it, with no Python or
# PyTorch involved.
#
# In PyTorch 2 the capture is `torch.export` (the same full-graph capture notebook 06 teaches), and
# the translation is written in ONNX Script. This is now what `torch.onnx.export` does **by
# default**: you no longer need to pass `dynamo=True`. The old entry point
# `torch.onnx.dynamo_export` is gone, and the TorchScript-based exporter (`dynamo=False`) still
# runs but warns that it is deprecated. Let's see all three on a two-layer network.

# %%
class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(10, 16), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


tiny = TinyNet().eval()
x = torch.randn(4, 10)
program = torch.onnx.export(tiny, (x,), verbose=False)  # dynamo=True is the default
print(type(program).__module__ + "." + type(program).__name__)
print("ops:", [node.op_type for node in program.model_proto.graph.node])
print("has torch.onnx.dynamo_export:", hasattr(torch.onnx, "dynamo_export"))

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.onnx.export(tiny, (x,), io.BytesIO(), dynamo=False)  # the legacy TorchScript exporter
legacy = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
print("\nwhat dynamo=False prints:")
for message in legacy:
    print(" ", message[:160] + ("..." if len(message) > 160 else ""))
assert not hasattr(torch.onnx, "dynamo_export")
assert any("legacy TorchScript-based ONNX export" in m for m in legacy)
assert any("will be removed" in m for m in legacy)

# %% [markdown]
# The result is an `ONNXProgram`. It holds the ONNX model in memory (`model_proto`, and
# `model`, an editable in-memory representation from the `onnx_ir` package), the
# `torch.export` program it came from (`exported_program`), and it can run itself: calling it
# starts an ONNX Runtime session behind the scenes. `save(path)` writes the `.onnx` file.
#
# ## Exporting the real model with dynamic batch and sequence length
#
# The course's MiniLM wrapper takes `input_ids` and `attention_mask`, both `int64` of shape
# `(batch, seq)`, and returns L2-normalised sentence embeddings of shape `(batch, 384)`. Sentences
# differ in length and requests differ in batch size, so both axes must stay **dynamic**; otherwise
# the file only accepts the exact shape of the example. `torch.export.Dim` names each dynamic axis;
# using the same `Dim` for both inputs tells the exporter the two have the same shape.

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # transformers and torchao print notices at import
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    mini = load_minilm()
sentences = ["The train to the airport leaves every twenty minutes.",
             "Water boils at a lower temperature on a high mountain."]
ids, mask = mini.tokenize(sentences)
print("example input:", tuple(ids.shape), ids.dtype)

batch = torch.export.Dim("batch", min=1, max=4096)
seq = torch.export.Dim("seq", min=2, max=512)


def export_encoder():
    with warnings.catch_warnings():
        # Both inputs share the two Dims; the exporter notes that it keeps one name for each.
        warnings.filterwarnings("ignore", message=r".*axis name.*will not be used")
        return torch.onnx.export(
            mini.model.eval(), (ids, mask), verbose=False,
            input_names=["input_ids", "attention_mask"],
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        )



holder = {}
export_s = bench.first_call(lambda: holder.setdefault("program", export_encoder()))
mini_program = holder["program"]
print(f"export took {export_s:.1f} s")

# %% [markdown]
# The exporter works in three steps: capture with `torch.export` (non-strict mode), decompose the
# operators that have no direct ONNX translation into simpler ATen ones, translate each one into
# ONNX. Before shipping a file, inspect it.
# `onnx.checker.check_model` validates the structure, types and operator versions (it raises if
# anything is wrong); the opset says which version of the operator set the runtime must support;
# the operator counts show what the transformer became.

# %%
proto = mini_program.model_proto
onnx.checker.check_model(proto)  # raises onnx.checker.ValidationError on a malformed model
opsets = {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import}
print("checker: OK; opsets:", opsets)
for value in proto.graph.input:
    dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    print(f"input  {value.name}: {onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)} {dims}")
    assert dims == ["batch", "seq"], "both axes should be symbolic"
for value in proto.graph.output:
    dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    print(f"output {value.name}: {dims}")
op_counts = collections.Counter(node.op_type for node in proto.graph.node)
n_weights = sum(math.prod(t.dims) for t in proto.graph.initializer)
print(f"{sum(op_counts.values())} nodes of {len(op_counts)} operator types, "
      f"{len(proto.graph.initializer)} weight tensors ({n_weights / 1e6:.1f}M numbers)")
print("most used:", ", ".join(f"{op} {n}" for op, n in op_counts.most_common(8)))
print("whole graph (6 layers):", {op: op_counts[op] for op in ("Softmax", "Gelu", "LayerNormalization")})
assert op_counts["Softmax"] == op_counts["Gelu"] == 6  # one attention and one MLP per layer
assert op_counts["LayerNormalization"] == 2 * 6 + 1  # two per layer, one after the embeddings

# %% [markdown]
# Two things to notice. The encoder's six layers show up as six `Softmax` nodes (one per
# attention) and six `Gelu` nodes; the thirteenth `LayerNormalization` sits after the embeddings.
# And the output kept an automatic name: we asked only for input names. The obvious fix,
# `output_names=["embedding"]`, breaks the file for this very model; the pitfalls section shows why.
#
# ## Running it in ONNX Runtime
#
# ONNX Runtime's Python API has one central object, the `InferenceSession`. You give it the file,
# a list of **execution providers** in order of preference (the CPU provider always exists; GPU
# builds add CUDA or TensorRT), and `SessionOptions`: the size of the intra-op thread pool (the
# threads that split one operator's work, the same role as `torch.set_num_threads`) and the graph
# optimisation level. The session below, and every session this notebook times on the CPU except
# the one that spins on purpose to measure the difference, also set
# `session.intra_op.allow_spinning` to `"0"`, because ONNX Runtime's pool is its own (the
# `OMP_WAIT_POLICY=PASSIVE` the course sets for torch, see `course_utils/threads.py`, does not reach
# it) and by default its idle threads spin, which on a busy machine can fight other work for the
# cores (below: what that does to ONNX Runtime's own time on your machine).
# `session.run(output_names, feeds)` takes NumPy arrays keyed by input name and returns NumPy arrays.

# %%
path = ONNX_DIR / "minilm_nb07.onnx"
mini_program.save(str(path))
print(f"saved {path.name} in {path.parent} ({path.stat().st_size / 2**20:.0f} MiB)")
print("providers in this onnxruntime build:", ort.get_available_providers())

options = ort.SessionOptions()
options.intra_op_num_threads = THREADS  # the same number of threads as torch
options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads sleep
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
sess = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
print("this session runs on:", sess.get_providers())
for arg in sess.get_inputs():
    print(f"  input  {arg.name:15s} {arg.type:15s} {arg.shape}")
for arg in sess.get_outputs():
    print(f"  output {arg.name:15s} {arg.type:15s} {arg.shape}")

(out,) = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
print(f"run() returned a {type(out).__name__} of shape {out.shape}, dtype {out.dtype}")

# %% [markdown]
# ### What the graph optimisation levels do
#
# At session creation ONNX Runtime rewrites the graph. `basic` applies rewrites that keep to
# standard ONNX operators (constant folding, removing redundant nodes); a rewrite can also *add*
# standard nodes, so fewer nodes is not guaranteed at this level. `extended` adds fusions into ONNX
# Runtime's own operators (domain `com.microsoft`), such as a residual add plus layer norm into
# `SkipLayerNormalization`. `layout` (where the installed version has it) and `all` add layout
# rewrites for the CPU it runs on; those target convolutions (a blocked channel layout), which a
# transformer does not have. Setting `optimized_model_filepath` saves the rewritten graph, so we can
# count what each level did to MiniLM; the cell prints what `basic` added or removed, and whether
# the layout rewrites changed anything here:

# %%
levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
if hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):  # newer onnxruntime versions have it
    levels = {**dict(list(levels.items())[:3]), "layout": ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT,
              "all": levels["all"]}
optimised = {}
for name, level in levels.items():
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3  # 'all' warns that its file is specific to this CPU; we know
    opts.optimized_model_filepath = str(ONNX_DIR / f"minilm_opt_{name}.onnx")
    ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    saved = onnx.load(opts.optimized_model_filepath)
    optimised[name] = collections.Counter(node.op_type for node in saved.graph.node)
    custom = sorted({node.op_type for node in saved.graph.node if node.domain == "com.microsoft"})
    print(f"{name:9s} {sum(optimised[name].values()):4d} nodes; ONNX Runtime's own ops: {custom or 'none'}")
    (ONNX_DIR / f"minilm_opt_{name}.onnx").unlink()  # only needed for counting
added, removed = optimised["basic"] - optimised["disable"], optimised["disable"] - optimised["basic"]
print(f"\n'basic' against 'disable': added {dict(added) or 'nothing'}, removed {dict(removed) or 'nothing'}")
extra, fewer = optimised["all"] - optimised["extended"], optimised["extended"] - optimised["all"]
print("layout rewrites ('all' against 'extended') on this CPU:",
      f"added {dict(extra)}, removed {dict(fewer)}" if extra or fewer else "no change in the operator counts")
assert sum(optimised["extended"].values()) < sum(optimised["disable"].values())


# %% [markdown]
# ## Parity: does the runtime compute the same thing?
#
# An exported model is a different program: different kernels, a different order of floating
# point operations. It must agree with eager PyTorch to a tolerance you state and check. We report
# the largest absolute difference and the largest relative one (over entries whose size is at
# least 1e-3, so that a difference on an entry that is almost zero does not dominate), first on
# random token ids with random padding at shapes the export never saw, then on real sentences.

# %%
def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Return (max absolute error, max relative error over entries with |ref| >= 1e-3)."""
    diff = (got - ref).abs()
    big = ref.abs() >= 1e-3
    return diff.max().item(), (diff[big] / ref.abs()[big]).max().item()


def run_ort(session, input_ids, attention_mask):
    feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
    return torch.from_numpy(session.run(None, feeds)[0])


gen = torch.Generator().manual_seed(0)
vocab = mini.tokenizer.vocab_size
print(f"{'shape':>10}  {'max abs err':>11}  {'max rel err':>11}")
for b, t in [(1, 5), (3, 40), (8, config.pick(64, 200))]:
    rand_ids = torch.randint(1000, vocab, (b, t), generator=gen)
    lengths = torch.randint(2, t + 1, (b,), generator=gen)
    lengths[0] = t  # at least one row without padding
    rand_mask = (torch.arange(t) < lengths[:, None]).long()
    with torch.inference_mode():
        ref = mini.model(rand_ids, rand_mask)
    got = run_ort(sess, rand_ids, rand_mask)
    abs_err, rel_err = errors(got, ref)
    print(f"{str((b, t)):>10}  {abs_err:11.2e}  {rel_err:11.2e}")
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
print("random inputs: ONNX Runtime matches eager within atol=1e-4, rtol=1e-4")

# %%
data = load_retrieval_set()
texts = data.queries + data.passages
real_ids, real_mask = mini.tokenize(texts)
with torch.inference_mode():
    ref = mini.model(real_ids, real_mask)
got = run_ort(sess, real_ids, real_mask)
max_abs_err, max_rel_err = errors(got, ref)
print(f"{len(texts)} real sentences, padded to {real_ids.shape[1]} tokens: "
      f"max abs err {max_abs_err:.2e}, max rel err {max_rel_err:.2e}")
assert max_abs_err < 1e-4, "ONNX Runtime should match PyTorch within 1e-4 on MiniLM"
headline = bench.record("onnx.minilm.max_abs_err", max_abs_err, "abs", sentences=len(texts),
             max_rel_err=max_rel_err, opset=opsets["ai.onnx"])

# %% [markdown]
# PyTorch ships a helper that runs this comparison for every output (and, with
# `compare_intermediates=True`, for every intermediate value, which is how you find the first node
# where two runs part ways). `verify_onnx_program` runs the `ExportedProgram` and the ONNX model on
# the same inputs (by default the export's example inputs) and returns one `VerificationInfo` per
# value. Its relative difference divides by *every* entry, near-zero ones included, which our own
# measure above leaves out; the cell recomputes both on the same example inputs so you can see the
# difference, and asserts only the absolute difference:

# %%
from torch.onnx.verification import verify_onnx_program

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    infos = verify_onnx_program(mini_program)
for info in infos:
    print(f"{info.name}: max abs diff {info.max_abs_diff:.2e}, max rel diff {info.max_rel_diff:.2e}, "
          f"{info.expected_dtype} vs {info.actual_dtype}")
assert all(info.max_abs_diff < 1e-4 for info in infos)
with torch.inference_mode():
    example_ref = mini.model(ids, mask)  # the export's example inputs, as verify_onnx_program uses
example_got = run_ort(sess, ids, mask)
all_rel = (example_got - example_ref).abs() / (example_ref.abs() + 1e-7)  # its definition: every entry, +1e-7
worst = all_rel.flatten().argmax()
print(f"what its relative figure includes: over every entry the largest relative difference "
      f"({all_rel.flatten()[worst].item():.2e}) falls on an entry of size {example_ref.abs().flatten()[worst].item():.1e}; "
      f"over entries of at least 1e-3, as measured above, it is {errors(example_got, example_ref)[1]:.2e}. "
      "Only the absolute difference is asserted.")

# %% [markdown]
# ## The course helper: `course_utils.deploy.onnx_tools`
#
# Notebook 08 (quantization) and the serving code need the same file, so the course packages these steps:
# `export_minilm()` writes `build/onnx/minilm.onnx` (inputs `input_ids`, `attention_mask`; output
# `embedding`) and reuses it while the weights and the torch version are unchanged (we already
# paid for one export, so `save_program` stores ours there and `export_minilm` then returns at once);
# `ort_session(path, threads=, opt_level=, spinning=)` opens a CPU session with the same number of
# threads as torch by default, idle threads sleeping unless `spinning=True`; `OrtEncoder(session)` is a callable `(ids, mask) -> tensor`, so
# `mini.encode(texts, model=OrtEncoder(session))` embeds text through ONNX Runtime. Read
# `course_utils/deploy/onnx_tools.py`: it is short.

# %%
helper_path = onnx_tools.save_program(mini_program)  # renames the output, saves, stamps
assert onnx_tools.export_minilm(mini=mini) == helper_path  # up to date: no second export
session_s = bench.first_call(onnx_tools.ort_session, helper_path)
ort_encoder = onnx_tools.OrtEncoder(onnx_tools.ort_session(helper_path, threads=THREADS))
print(f"{helper_path.name}: output {[o.name for o in ort_encoder.session.get_outputs()]}; "
      f"opening a session took {session_s:.2f} s")
torch.testing.assert_close(mini.encode(sentences, model=ort_encoder), mini.encode(sentences),
                           atol=1e-4, rtol=1e-4)
print("mini.encode(..., model=OrtEncoder(session)) matches eager")


# %% [markdown]
# ## Measurement: eager PyTorch vs ONNX Runtime at batch 1 and batch 32
#
# Both run the same real inputs (one query for batch 1, the first 32 passages of the retrieval set
# for batch 32), after warm-up, with the same number of threads, timed side by side by
# `bench.compare`. The tokenizer is not timed: it is the same for both.

# %%
@torch.inference_mode()
def eager(input_ids, attention_mask):
    return mini.model(input_ids, attention_mask)


batches = {1: data.queries[:1], 32: data.passages[:32]}
tables = {}
for size, batch_texts in batches.items():
    b_ids, b_mask = mini.tokenize(batch_texts)
    tables[size] = bench.compare({"eager PyTorch": eager, "ONNX Runtime": ort_encoder}, b_ids, b_mask,
                                 warmup=config.pick(1, 3))
    print(f"batch {size} (padded to {b_ids.shape[1]} tokens), {THREADS} threads each:")
    print(f"{tables[size]}\n")
others = threads.other_load()  # other programs' CPU use, sampled right after the timings
speedups = {size: table.speedup("ONNX Runtime") for size, table in tables.items()}
for size, value in speedups.items():
    _ = bench.record(f"onnx.minilm.speedup.b{size}", value, "x", threads=THREADS,
                 opt_level="all", tokens=mini.tokenize(batches[size])[0].shape[1])

import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(11, 2.4))
for ax, (size, table) in zip(axes, tables.items()):
    bench.bar_chart(table, title=f"MiniLM, batch {size}", ax=ax)
fig.tight_layout();

# %%
for size, table in tables.items():
    eager_ms = table.row("eager PyTorch").median_s * 1e3
    ort_ms = table.row("ONNX Runtime").median_s * 1e3
    said = table.describe("ONNX Runtime", "eager PyTorch", name=f"onnx.minilm.ort_vs_eager.b{size}")
    print(f"batch {size:2d}: ONNX Runtime ({ort_ms:.1f} ms) is {said}")
# Two separate tables: call the gains different only when they differ by more than 10%.
gain_word = bench.band_verdict(speedups[1], speedups[32], band=0.1, name="onnx.minilm.gain.b1_vs_b32")
if tables[1].verdict("ONNX Runtime", "eager PyTorch") != "faster":
    print("at batch 1 the two were not clearly different in this run (see the spread), so there is no batch-1 gain "
          "to compare with batch 32; the next cells still time the parts of a batch-1 call")
elif gain_word == "higher":
    print({"faster": "the gain is larger at batch 1 than at batch 32 (10% band)",
           "no clear difference": "ONNX Runtime gained at batch 1 and not clearly at batch 32",
           "slower": "ONNX Runtime gained at batch 1 and was slower at batch 32"}[
              tables[32].verdict("ONNX Runtime", "eager PyTorch")]
          + "; the next cells try to split the batch-1 gap into a cost per call and a cost per token")
else:
    print("the gain is not clearly larger at batch 1 on this machine (10% band)")
from course_utils import cpu

cpu_info = cpu.info()
capped = f", capped by CPU profile {cpu_info.profile!r}" if cpu_info.profile else ""
print(f"torch: CPU class {cpu_info.cpu_class} (vector code {cpu_info.torch_capability}{capped}); ONNX Runtime: "
      f"{cpu.onnxruntime_kernels(dtype='float32')} for this float32 model, chosen by asking the CPU itself")
if cpu_info.profile:
    print("a CPU profile caps torch's own kernels and Inductor's code; torch's matrix multiplies go to a BLAS library "
          "(MKL or oneDNN on x86) that, like ONNX Runtime, asks the CPU itself")
print("the two runtimes ship different matrix-multiply kernels for each instruction set (AVX2, AVX-512, ARM), "
      "so how far apart they land, at either batch size, can differ from one CPU class to another")
if others is None:
    print("other programs' CPU use could not be sampled here (psutil is missing)")
else:
    print(f"other programs used about {others:.1f} of {threads.usable_cores()} cores just after these timings"
          + ("; load can slow the two runtimes by different amounts, so rerun on a quiet machine before reading these "
             "verdicts as this CPU's" if others >= 0.5 else ""))
# How much ONNX Runtime gains depends on the CPU class and on the load, so it is a verdict here;
# the report checks the recorded speed-ups against their expected ranges.

# %% [markdown]
# ### Where does the batch-1 difference come from, if there is one?
#
# A call's time has two parts: one that grows with the number of tokens, and one that does not.
# The part that does not grow is more than overhead. Eager PyTorch pays Python (the transformers
# model's own code and every module call) plus the dispatcher and an output allocation for each ATen
# operator it runs; ONNX Runtime pays its C++ executor walking the graph's nodes. And both read every
# weight matrix of the six layers once per call, whatever the number of tokens: with a handful of
# tokens a matrix multiply does little arithmetic per weight it reads, so reading the weights can
# take most of its time. Which part makes the gap, where there is one, is something a cell can
# measure: time both runtimes on 2 tokens (the shortest sequence the export was declared for,
# `Dim("seq", min=2)`), on the query and on 64 tokens of passage text, draw the straight line
# through the 2- and 64-token times and take it back to 0 tokens. What is left there is the cost of
# a call that does not grow with the tokens. (The two ends lie far apart so that the growth between
# them is large beside the timing spread; with only the query's few tokens beyond 2, the spread could
# hide the growth.) The query's own rows give the gap to split; the cell shows how far they sit
# from the line, and whether that distance lies inside their timing spread. The cell also counts the operators each
# runtime runs per call, and then profiles one 2-token call of each runtime (`torch.profiler` for
# eager, ONNX Runtime's own profiler) to split that cost into matrix multiplies, other operators
# and, for eager, the time spent outside ATen operators (Python, and the profiler's own overhead).
# ONNX Runtime's profiler is a session option: `onnx_tools.ort_session(..., profile_dir=...)` sets
# `SessionOptions.enable_profiling`, and `onnx_tools.node_times` runs the session, calls
# `session.end_profiling()` and sums the per-node times of the JSON file it returns; both are short
# enough to read before you profile a model of your own.

# %%
from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    "Count the ATen operators eager PyTorch dispatches (views launch no kernel and are left out)."

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


query_ids, query_mask = mini.tokenize(batches[1])
n_query = query_ids.shape[1]
LONG = 64  # the line's far end: passage text cut at 64 tokens
long_ids, long_mask = mini.tokenize([" ".join(data.passages[:8])], max_length=LONG)
assert long_ids.shape[1] == LONG and 2 < n_query < LONG, (long_ids.shape, n_query)
inputs = {2: (query_ids[:, :2].clone(), query_mask[:, :2].clone()), n_query: (query_ids, query_mask),
          LONG: (long_ids, long_mask)}
with CountOps() as op_counter:
    eager(query_ids, query_mask)
ort_nodes = sum(optimised["all"].values())  # the sessions above optimise at level 'all'
print(f"per call: eager dispatches {op_counter.count} ATen operators, ONNX Runtime runs {ort_nodes} graph nodes "
      "(eager's views, such as reshapes and transposes, launch no kernel and are left out, while ONNX Runtime's "
      "count includes its Reshape and Transpose nodes: the two counts do not compare one to one)")
torch.testing.assert_close(ort_encoder(*inputs[2]), eager(*inputs[2]), atol=1e-4, rtol=1e-4)

runtimes = {"eager": eager, "ORT": ort_encoder}
split = bench.compare({f"{rt}, {n} tokens": (lambda fn=fn, args=args: fn(*args))
                       for n, args in inputs.items() for rt, fn in runtimes.items()},
                      warmup=config.pick(1, 3), rounds=config.pick(3, 10), min_run_time=config.pick(0.3, 3.0))
# (more, shorter rounds than elsewhere: six variants interleaved, so a slow spell hits each of them)
print(split)
ms = {row.label: row.median_s * 1e3 for row in split.rows}
per_token = {rt: (ms[f"{rt}, {LONG} tokens"] - ms[f"{rt}, 2 tokens"]) / (LONG - 2) for rt in runtimes}
# The line through (2, t_2) and (64, t_64), taken back to 0 tokens: t_2 - 2 * (t_64 - t_2) / (64 - 2).
fixed = {rt: ms[f"{rt}, 2 tokens"] - 2 * per_token[rt] for rt in runtimes}
gap_query = ms[f"eager, {n_query} tokens"] - ms[f"ORT, {n_query} tokens"]
said_2 = split.describe("ORT, 2 tokens", "eager, 2 tokens", name="onnx.minilm.fixed_cost.ort_vs_eager",
                        against_as="eager PyTorch")
print(f"\non 2 tokens, ONNX Runtime is {said_2}")
query_faster = split.verdict(f"ORT, {n_query} tokens", f"eager, {n_query} tokens") == "faster"
# More tokens cannot take less time: a line that falls says the timings were too rough to split. A line
# needs each runtime's 64 tokens clearly slower than its 2 tokens ("faster" below: the 2 tokens took less time).
flat = [rt for rt in runtimes if split.verdict(f"{rt}, 2 tokens", f"{rt}, {LONG} tokens") != "faster"]
rough = bool(flat)
raw_share = (fixed["eager"] - fixed["ORT"]) / gap_query if query_faster else 0.0
share = max(0.0, min(1.0, raw_share))
share_word = bench.record_verdict("onnx.minilm.fixed_cost.share_of_gap", "no gap" if not query_faster else
                                  "unclear" if rough else "most" if share >= 0.5 else "part" if share >= 0.1
                                  else "little", noisy=bool(split.spread_note()), share=round(share, 3))
if not rough:  # the line is only drawn when both runtimes clearly grow from 2 to 64 tokens
    print(f"cost of a call that does not grow with the tokens (the line through 2 and {LONG} tokens at 0 tokens): "
          f"eager {fixed['eager']:.2f} ms, ONNX Runtime {fixed['ORT']:.2f} ms; cost per token: eager "
          f"{per_token['eager']:.3f} ms, ONNX Runtime {per_token['ORT']:.3f} ms")
    # The query's gap in three parts: the line's fixed costs, the line's growth up to the query, and how far the
    # two query rows sit off the line (their timing spread, or a cost the line's two ends do not show).
    on_line = {rt: fixed[rt] + n_query * per_token[rt] for rt in runtimes}
    off_line = {rt: ms[f"{rt}, {n_query} tokens"] - on_line[rt] for rt in runtimes}
    off = off_line["eager"] - off_line["ORT"]
    query_spread = sum(split.row(f"{rt}, {n_query} tokens").iqr_s * 1e3 / 2 for rt in runtimes)  # half-IQRs
    print(f"at the query's {n_query} tokens the line gives eager {on_line['eager']:.2f} ms and ONNX Runtime "
          f"{on_line['ORT']:.2f} ms (measured: {ms[f'eager, {n_query} tokens']:.2f} and "
          f"{ms[f'ORT, {n_query} tokens']:.2f} ms)")
    if query_faster:  # split the gap only where there is one
        print(f"the query's gap of {gap_query:.2f} ms in three parts: {fixed['eager'] - fixed['ORT']:+.2f} ms that does "
              f"not grow, {n_query * (per_token['eager'] - per_token['ORT']):+.2f} ms that grows with the tokens, and "
              f"{off:+.2f} ms from the query rows sitting off the line ("
              + (f"inside the two rows' timing spread, ±{query_spread:.2f} ms)" if abs(off) <= query_spread else
                 f"beyond the two rows' timing spread of ±{query_spread:.2f} ms: the time did not grow in a straight "
                 "line with the tokens here, and this cell does not measure why)"))
if share_word == "no gap":
    earlier_faster = tables[1].verdict("ONNX Runtime", "eager PyTorch") == "faster"  # same query, table above
    print(f"on the {n_query}-token query ONNX Runtime is "
          f"{split.describe(f'ORT, {n_query} tokens', f'eager, {n_query} tokens')} in this table"
          + (", although the earlier table called it faster" if earlier_faster else "")
          + ": no gap to split here"
          + ("; rerun the cell when the machine is quiet" if earlier_faster or split.spread_note() else ""))
elif share_word == "unclear":
    names = {"eager": "eager PyTorch", "ORT": "ONNX Runtime"}
    said = [f"{names[rt]} took no more time on {LONG} tokens than on 2" if per_token[rt] <= 0 else
            f"{names[rt]} took not clearly more time on {LONG} tokens than on 2 ("
            + ("within 5%" if split.within_margin(f"{rt}, {LONG} tokens", f"{rt}, 2 tokens")
               else "inside the timing spread") + ")" for rt in flat]
    print(f"the split is unclear in this run: {'; '.join(said)}, so a line through the two times would rest on "
          "the timing noise; rerun the cell" + (" when the machine is quiet" if split.spread_note() else ""))
else:
    # How far each runtime grew from 2 to 64 tokens, and whether the difference of the two growths lies outside
    # the four rows' spreads (interval arithmetic on the median +- IQR/2 bands, as verdict uses).
    growth = {rt: ms[f"{rt}, {LONG} tokens"] - ms[f"{rt}, 2 tokens"] for rt in runtimes}
    growth_spread = sum(split.row(f"{rt}, {n} tokens").iqr_s * 1e3 / 2 for rt in runtimes for n in (2, LONG))
    growth_favours_eager = growth["eager"] < growth["ORT"] and growth["ORT"] - growth["eager"] > growth_spread
    part = (f"about {share:.0%} of the gap" if raw_share <= 1 else
            "more than the whole gap (the rest favours eager)" if growth_favours_eager else "more than the whole gap")
    print(f"the costs that do not grow with the tokens make {part} on the query "
          f"({fixed['eager'] - fixed['ORT']:.2f} ms of a {gap_query:.2f} ms gap): " + {
              "most": ("all" if raw_share > 1 else "most" if share >= 2 / 3 else "over half")
                      + " of ONNX Runtime's edge at batch 1 is in that cost (Python and dispatch, and how fast each "
                      "runtime's matrix-multiply kernels get through the weights with few tokens; both read the same "
                      "weights)" + ("" if raw_share <= 1 else
                                    ", and the part that grows with the tokens favours eager" if growth_favours_eager else
                                    f"; the part that grows with the tokens (eager {growth['eager']:+.2f} ms, ONNX "
                                    f"Runtime {growth['ORT']:+.2f} ms from 2 tokens to {LONG}) does not clearly "
                                    "favour either runtime here")
                      + (" (a rough share: see the spread note above)" if split.spread_note() else "")
                      + "; the profiles below try to split it, and the line under them says whether they could",
              "part": "part of ONNX Runtime's edge at batch 1 is in that cost (Python and dispatch, and how fast "
                      "each runtime's matrix-multiply kernels get through the weights with few tokens); the "
                      "three-part split printed above says where the rest lies",
              "little": "little of ONNX Runtime's edge at batch 1 is in the cost of a call; the three-part split "
                        "printed above says where the rest lies"}[share_word])

# %%
from torch.profiler import ProfilerActivity, profile

# Where one 2-token call's time goes. torch.profiler gives each ATen operator's own ("self") time;
# whatever the call took beyond their sum ran outside the operators: Python and the module calls.
MATMUL_ATEN = {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
PROFILED_CALLS = config.pick(3, 10)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    start = time.perf_counter()
    for _ in range(PROFILED_CALLS):
        eager(*inputs[2])
    eager_wall = (time.perf_counter() - start) * 1e3 / PROFILED_CALLS
aten_self = {e.key: e.self_cpu_time_total / 1e3 / PROFILED_CALLS for e in prof.key_averages() if e.key.startswith("aten::")}
eager_mm = sum(t for op, t in aten_self.items() if op in MATMUL_ATEN)
eager_parts = {"matrix multiplies": eager_mm, "other ATen operators": sum(aten_self.values()) - eager_mm,
               "outside ATen operators (Python, profiler)": max(0.0, eager_wall - sum(aten_self.values()))}
# ONNX Runtime's own profiler, on the same 2 tokens (its JSON file goes to a temporary folder and is deleted).
with tempfile.TemporaryDirectory() as folder:
    ort_times = onnx_tools.node_times(onnx_tools.ort_session(helper_path, threads=THREADS, profile_dir=folder),
                                      {"input_ids": inputs[2][0].numpy(), "attention_mask": inputs[2][1].numpy()},
                                      runs=PROFILED_CALLS)
ort_mm, ort_other = onnx_tools.matmul_split(ort_times)
ort_parts = {"matrix multiplies": ort_mm, "other nodes": ort_other}
# the six layers' Linear weights; BERT's pooler, which eager computes and nothing reads, is counted apart
linear_sizes = {name: m.weight.numel() for name, m in mini.model.named_modules() if isinstance(m, nn.Linear)}
pooler_weights = sum(n for name, n in linear_sizes.items() if "pooler" in name)
linear_weights = sum(linear_sizes.values()) - pooler_weights
helper_graph = onnx.load(helper_path, load_external_data=False).graph
pooler_exported = any(node.op_type == "Tanh" for node in helper_graph.node)  # the pooler's tanh
print(f"one 2-token call, profiled ({PROFILED_CALLS} calls averaged, at another moment than the table above, which "
      f"timed eager at {ms['eager, 2 tokens']:.2f} ms and ONNX Runtime at {ms['ORT, 2 tokens']:.2f} ms unprofiled; "
      "compare the parts with each other):")
print(f"  eager PyTorch  {eager_wall:6.2f} ms: " + ", ".join(f"{k} {v:.2f} ms" for k, v in eager_parts.items()))
print(f"  ONNX Runtime   {sum(ort_times.values()):6.2f} ms of node time: "
      + ", ".join(f"{k} {v:.2f} ms" for k, v in ort_parts.items()))
print(f"  the matrix multiplies read every weight matrix once per call: {linear_weights / 1e6:.1f}M numbers "
      f"({linear_weights * 4 / 2**20:.0f} MiB), however few the tokens"
      + (f"; eager also runs BERT's pooler ({pooler_weights / 1e6:.2f}M more), whose output nothing uses"
         + (", and the exported graph has it too" if pooler_exported else
            ", and which the exported graph leaves out (it has no Tanh node)") if pooler_weights else ""))
sdpa = any("scaled_dot_product" in op for op in aten_self)
print("  (the two 'matrix multiplies' parts are counted differently: eager's attention products ran inside its "
      "attention operator (scaled_dot_product_attention), under 'other ATen operators', while ONNX Runtime's "
      "MatMul nodes include them)" if sdpa else "  (both 'matrix multiplies' parts include the attention products)")
largest = max(eager_parts, key=eager_parts.get)
mm_word = bench.band_verdict(eager_mm, ort_mm, band=0.1)
gap_2 = split.verdict("ORT, 2 tokens", "eager, 2 tokens") == "faster"  # is there a 2-token gap to place?
ort_node = sum(ort_times.values())
# Each profile against its runtime's unprofiled 2-token call in the table (one profiled run each, so a 10% band).
ort_stretched = bench.band_verdict(ort_node, ms["ORT, 2 tokens"], band=0.1) == "higher"
eager_stretched = bench.band_verdict(eager_wall, ms["eager, 2 tokens"], band=0.1) == "higher"
stretched = ("both profiles ran longer than their unprofiled calls" if ort_stretched and eager_stretched else
             f"{'ONNX Runtime' if ort_stretched else 'eager'}'s profile ran longer than its unprofiled call")
if ort_stretched or eager_stretched:
    print(f"  ({stretched}, beyond a 10% band: ONNX Runtime {ort_node:.2f} ms of node time against "
          f"{ms['ORT, 2 tokens']:.2f} ms unprofiled, eager {eager_wall:.2f} against {ms['eager, 2 tokens']:.2f} ms)")
# The profiles can place the gap only if they show it too (one profiled run each, so a 10% band).
profile_shows_gap = bench.band_verdict(eager_wall, ort_node, band=0.1) == "higher"
rest_longer = bench.band_verdict(eager_wall - eager_mm, ort_other, band=0.1) == "higher"
elsewhere = (", so the 2-token gap is elsewhere: in the other operators and in Python" if rest_longer else
             ", and the rest of eager's call was not clearly longer than ONNX Runtime's other nodes either (10% band), "
             "so these profiles cannot place the gap")
head = (f"the largest part of eager's 2-token call on this machine: {largest} ({eager_parts[largest]:.2f} ms of "
        f"{eager_wall:.2f} ms)")
no_gap = ", but the table above did not find ONNX Runtime faster on 2 tokens: no 2-token gap to place"
if ort_stretched and gap_2 and mm_word == "higher" and not eager_stretched:
    # stretching ONNX Runtime's nodes can only have narrowed this ratio
    print(f"{head}; eager's matrix multiplies took {eager_mm / ort_mm:.2f}x the time of ONNX Runtime's ({eager_mm:.2f} "
          f"against {ort_mm:.2f} ms), although ONNX Runtime's profile ran long, which can only have narrowed that "
          "ratio (eager's profile ran within 10% of its unprofiled call): eager's matrix-multiply kernels are part of "
          "the 2-token gap")
elif ort_stretched or eager_stretched:
    who = ("both profiles" if ort_stretched and eager_stretched else
           "ONNX Runtime's profile" if ort_stretched else "eager's profile")
    print(f"{head}; as the line above says, {who} "
          "ran long, so the two profiles' milliseconds do not compare; as shares "
          f"of each runtime's own profile, matrix multiplies took {eager_mm / eager_wall:.0%} of eager's call and "
          f"{ort_mm / ort_node:.0%} of ONNX Runtime's node time"
          + (", and these profiles cannot place the 2-token gap" if gap_2 else no_gap))
else:
    print(f"{head}; eager's matrix multiplies took {eager_mm / ort_mm:.2f}x the time of ONNX Runtime's "
          + {"higher": "(more than 10% longer)", "lower": "(more than 10% shorter)",
             "no clear difference": "(within 10%)"}[mm_word]
          + ((", so its matrix-multiply kernels are part of the 2-token gap" if mm_word == "higher" else elsewhere)
             if gap_2 and profile_shows_gap else
             f", but in these profiles eager's call ({eager_wall:.2f} ms) was not clearly longer than ONNX Runtime's "
             f"node time ({ort_node:.2f} ms, 10% band): they do not show the 2-token gap the table measured, so they "
             "cannot place it; rerun the cell" if gap_2 else no_gap))
profile_load = threads.other_load()  # other programs' CPU use, sampled right after the profiles
if profile_load is not None and profile_load >= 0.5:
    print(f"other programs used about {profile_load:.1f} of {threads.usable_cores()} cores just after these profiles; "
          "load stretches each part by a different amount, so rerun on a quiet machine before reading the parts as "
          "this CPU's")

# %% [markdown]
# ### Idle threads: sleeping or spinning
#
# A thread of ONNX Runtime's pool that runs out of work can *spin* (keep polling, so it starts the
# next piece of work without a wake-up delay) or sleep. The sessions above sleep; ONNX Runtime's
# default is to spin. Spinning can save the wake-up delays when the cores are otherwise idle; when
# they are not, a spinning thread holds a core that other work needs, ONNX Runtime's own working
# threads included. The same model at batch 1, both ways, side by
# side; the printed verdict says which way it went on this machine:

# %%
one_ids, one_mask = mini.tokenize(batches[1])
spinning_encoder = onnx_tools.OrtEncoder(onnx_tools.ort_session(helper_path, threads=THREADS, spinning=True))
spin_table = bench.compare({"ORT, idle threads sleep": ort_encoder, "ORT, idle threads spin": spinning_encoder},
                           one_ids, one_mask, warmup=config.pick(1, 3))
others = threads.other_load()  # other programs' CPU use, sampled right after the timing
print(spin_table)
spin_word = spin_table.verdict("ORT, idle threads spin", "ORT, idle threads sleep", name="onnx.threads.spin_vs_sleep")
if THREADS == 1:
    why = "with one thread there is no pool to spin, so both sessions run the same way"
else:
    # A tie only says the two effects cancel when the table is tight and other programs were quiet.
    busy = others is not None and others >= 0.5
    margin_tie = not spin_table.spread_note() and spin_table.within_margin("ORT, idle threads spin",
                                                                           "ORT, idle threads sleep")
    why = {"faster": "the cores were free enough here that skipping the wake-ups paid" if not busy else
                     "skipping the wake-ups paid even with other programs busy (ONNX Runtime's threads won the cores "
                     "they spun on); on a machine shared more heavily it can go the other way",
           "no clear difference": "the wake-ups saved and the cores taken roughly cancel on this machine"
                                  if margin_tie and not busy else
                                  "the two are within 5% of each other, but other programs were busy, so this need not "
                                  "hold on a quiet machine; rerun when it is quiet" if margin_tie else
                                  "the timings spread too widely to tell" + (
                                      " while other programs were busy; rerun on a quiet machine"
                                      if busy else "; rerun the cell"),
           "slower": "the spinning threads held cores that other work needed, ONNX Runtime's own working "
                     "threads included"}[spin_word]
load = "could not be sampled" if others is None else f"about {others:.1f} of {threads.usable_cores()} cores"
print(f"batch 1, {THREADS} threads: spinning is {spin_table.describe('ORT, idle threads spin', 'ORT, idle threads sleep')}: "
      f"{why} (other programs' CPU use just after: {load})")

# %% [markdown]
# ### Where ONNX Runtime does not pay
#
# **One-off costs.** The file has to be exported (seconds, once per model version) and every
# process has to open a session (parse the file, optimise the graph, allocate). For a script that
# embeds a handful of sentences and exits, that can cost more than it saves. The break-even point,
# with the numbers measured above:

# %%
saved_s = tables[1].row("eager PyTorch").median_s - tables[1].row("ONNX Runtime").median_s
payback = bench.record_verdict("onnx.payback.b1", "pays" if tables[1].verdict("ONNX Runtime", "eager PyTorch") == "faster"
                               else "does not pay")
if payback == "does not pay":
    print("at batch 1 ONNX Runtime was not clearly faster on this machine, so the one-off costs do not pay "
          "back in this run")
else:
    per_process = math.ceil(session_s / saved_s)
    with_export = math.ceil((export_s + session_s) / saved_s)
    print(f"each call at batch 1 saves {saved_s * 1e3:.1f} ms")
    print(f"opening a session ({session_s:.2f} s) pays back after {about(per_process, 'call')} in that process")
    print(f"export + session ({export_s + session_s:.1f} s) pay back after {about(with_export, 'call')}")

# %% [markdown]
# **Graph optimisations: do they pay here?** The fusions counted earlier remove nodes and the
# memory traffic between them, but they change only the time of the nodes they fuse (and that can
# go either way), and a
# transformer at batch 32 may spend much of its time in matrix multiplies that fusion mostly leaves as
# they are. Compare the same file with optimisations off and fully on (quick mode uses fewer
# passages), then ask ONNX Runtime's profiler how each session's node time splits between matrix
# multiplies and the rest; the printed verdict builds its reason from that split:

# %%
level_batch = batches[32][:config.pick(8, 32)]
b_ids, b_mask = mini.tokenize(level_batch)
by_level = bench.compare(
    {f"opt {name}": onnx_tools.OrtEncoder(onnx_tools.ort_session(helper_path, opt_level=name))
     for name in ("disable", "all")}, b_ids, b_mask, warmup=config.pick(1, 3))
print(by_level)
word = by_level.verdict("opt all", "opt disable", name="onnx.graph_opt.all_vs_disable")
level_feeds = {"input_ids": b_ids.numpy(), "attention_mask": b_mask.numpy()}
with tempfile.TemporaryDirectory() as folder:  # ONNX Runtime's profile files are deleted after reading
    level_times = {name: onnx_tools.node_times(onnx_tools.ort_session(helper_path, opt_level=name, profile_dir=folder),
                                               level_feeds, runs=config.pick(1, 2))
                   for name in ("disable", "all")}
mm_ms, rest_ms = {}, {}
for name, t in level_times.items():
    mm_ms[name], rest_ms[name] = onnx_tools.matmul_split(t)
mm_share = {name: mm_ms[name] / (mm_ms[name] + rest_ms[name]) for name in level_times}
for name in level_times:
    print(f"profile, opt {name:7s}: matrix multiplies {mm_ms[name]:7.1f} ms ({mm_share[name]:.0%} of the node time), "
          f"other nodes {rest_ms[name]:6.1f} ms; node time {mm_ms[name] + rest_ms[name]:.1f} ms against "
          f"{by_level.row(f'opt {name}').median_s * 1e3:.1f} ms timed above")
print("(a rough split: a profile of a few runs, taken at another moment than the timing, with the profiler's overhead)")
rest_word = bench.band_verdict(rest_ms["all"], rest_ms["disable"], band=0.1)  # one profile each: a 10% band
node_ms = {name: mm_ms[name] + rest_ms[name] for name in level_times}
node_gap = node_ms["all"] - node_ms["disable"]  # what the profile adds, against what the timing added
timed_gap = (by_level.row("opt all").median_s - by_level.row("opt disable").median_s) * 1e3
# The profile shows the timed difference when its node gap goes the same way and is at least half as large.
profile_shows = timed_gap != 0 and node_gap / timed_gap >= 0.5
node_word = bench.band_verdict(node_ms["all"], node_ms["disable"], band=0.1)  # and clears a 10% band (one profile each)
# How much of the profiled node gap the matrix multiplies made (0.5 or more: at least half of it).
mm_part = (mm_ms["all"] - mm_ms["disable"]) / node_gap if node_gap else 0.0
gaps_said = f"the profiled nodes took {node_gap:+.1f} ms against the {timed_gap:+.1f} ms timed"
change = {"lower": "less, beyond a 10% band", "higher": "more, beyond a 10% band",
          "no clear difference": "no clear change within a 10% band"}[rest_word]
rest_said = (f"in the profile the other nodes took {rest_ms['disable']:.1f} ms unoptimised and {rest_ms['all']:.1f} ms "
             f"optimised, {change}; matrix multiplies made up {mm_share['all']:.0%} of the optimised "
             "graph's node time")
in_band = (f"the profiled nodes took {node_gap:+.1f} ms ({node_gap / node_ms['disable']:+.0%}) against the "
           f"{timed_gap:+.1f} ms timed, inside the 10% band of one profile each, so the profile does not place the "
           f"difference; this cell does not measure why ({rest_said}); rerun it to see whether it repeats")
if rest_word == {"faster": "lower", "slower": "higher"}.get(word):  # the other nodes alone moved with the verdict
    rest_gap = rest_ms["all"] - rest_ms["disable"]
    in_band = (f"in the profiles, the nodes other than matrix multiplies went from {rest_ms['disable']:.1f} to "
               f"{rest_ms['all']:.1f} ms ({rest_gap / rest_ms['disable']:+.0%}, beyond a 10% band) and the matrix "
               f"multiplies from {mm_ms['disable']:.1f} to {mm_ms['all']:.1f} ms, so the other nodes carry part of "
               f"the difference (all profiled nodes together: {node_gap:+.1f} ms, "
               f"{node_gap / node_ms['disable']:+.0%}, inside the 10% band, against the {timed_gap:+.1f} ms timed)")
tie_said = (f"its medians within {bench.VERDICT_MARGIN:.0%} of each other"
            if by_level.within_margin("opt all", "opt disable") else "its medians inside the timing spread")
why = {"faster": (f"the profile, taken at another moment, does not show the gain: {gaps_said} ({rest_said}); rerun "
                  "the cell to see whether it repeats" if not profile_shows else
                  in_band if node_word != "lower" else
                  f"the fused operators saved real work at this batch: {gaps_said} ({rest_said})"
                  if rest_word == "lower" else
                  f"the whole call gained, and so did the profiled nodes ({gaps_said}), though the rest of the "
                  f"graph did not gain beyond its 10% band ({rest_said}; matrix multiplies {mm_ms['disable']:.1f} ms "
                  f"unoptimised, {mm_ms['all']:.1f} ms optimised): " + (
                      "most of the gain is in the matrix multiplies" if mm_part >= 0.5 else
                      "the gain is spread over both parts" if mm_part > 0 else
                      "the matrix multiplies did not gain, so the gain is in the other nodes, too small a change "
                      "against their time to clear the band")),
       "no clear difference": rest_said + (f": the saving was too small a part of the time to show in the whole "
                                           f"call, {tie_said}" if rest_word == "lower" else
                                           (": in this run the fusions did not shorten the rest of the graph either"
                                            if rest_word == "no clear difference" else
                                            ": in this profile the rest of the graph took longer after fusion, "
                                            f"yet the whole call did not clearly change, {tie_said}")),
       "slower": (f"the rewritten graph's nodes took longer here than the plain ones: {gaps_said} "
                  f"({rest_said}; matrix multiplies {mm_ms['disable']:.1f} ms unoptimised, {mm_ms['all']:.1f} ms "
                  "optimised)" if profile_shows and node_word == "higher" else
                  in_band if profile_shows else
                  f"the profile, taken at another moment, does not show it: {gaps_said} ({rest_said}), so the extra "
                  "time lies outside the profiled nodes or in the moment the timing was taken; rerun the cell to see "
                  "whether it repeats")}[word]
# A profile that ran well beyond its own timed median (one profiled run each, so a 10% band) was taken in a slow
# spell: then its parts say nothing about what the optimisation changed.
timed_ms = {name: by_level.row(f"opt {name}").median_s * 1e3 for name in level_times}
long_ran = [name for name in level_times if bench.band_verdict(node_ms[name], timed_ms[name], band=0.1) == "higher"]
if long_ran:
    why = ("the profiles do not compare here: " + " and ".join(
        f"opt {name}'s profile ran {node_ms[name] / timed_ms[name] - 1:.1%} longer than its timed median "
        f"({node_ms[name]:.1f} against {timed_ms[name]:.1f} ms)" for name in long_ran)
        + f", beyond a 10% band, so a slow spell may have stretched {'its' if len(long_ran) == 1 else 'their'} "
        f"parts, and the split says nothing about what the optimisation changed (matrix multiplies "
        f"{mm_ms['disable']:.1f} -> {mm_ms['all']:.1f} ms, other nodes {rest_ms['disable']:.1f} -> "
        f"{rest_ms['all']:.1f} ms); rerun the cell to see whether it repeats")
print(f"\nat batch {len(level_batch)}, full graph optimisation is {by_level.describe('opt all', 'opt disable')}: {why}")
level_load = threads.other_load()  # other programs' CPU use, sampled right after the timings and profiles
if level_load is not None and level_load >= 0.5:
    print(f"other programs used about {level_load:.1f} of {threads.usable_cores()} cores just after these timings and "
          "profiles; load can slow the two sessions by different amounts, so rerun on a quiet machine before reading "
          "this verdict as this CPU's")

# %% [markdown]
# ## Retrieval through ONNX Runtime: the same recall and MRR and the same top-3 passages as PyTorch
#
# Tiny numeric differences only matter if they change what the model is used for. The course's
# retrieval set has questions with a known relevant passage: embed everything through both
# engines, score recall and MRR, and compare the rankings themselves.
#
# Whether a ranking can change is a matter of margins. Two passages swap places only if their
# scores move towards each other by at least the gap between them. Each of the two can move by up
# to the largest change of any score, so together they close by at most twice it. The cell measures the
# largest change ONNX Runtime made to any similarity score and sets it beside two gaps taken from
# PyTorch's scores: the closest pair of neighbours in any query's top 4 (what could reorder a top
# 3) and the closest any other passage comes to a relevant one (what could change recall or MRR).
# It asserts that the change stays under half of each gap, and so that recall, MRR and every top 3
# are the same. The full order of all passages compares more neighbours, so its smallest gap can
# be no larger (the cell prints it); how often that order agrees is printed, not asserted, since
# the last digits of a score can differ from one CPU to another.

# %%
embedded = {}  # each engine embeds each text list once


def eager_embed(batch_texts):
    key = ("eager", tuple(batch_texts))
    if key not in embedded:
        embedded[key] = mini.encode(batch_texts)
    return embedded[key]


def ort_embed(batch_texts):
    key = ("ort", tuple(batch_texts))
    if key not in embedded:
        embedded[key] = mini.encode(batch_texts, model=ort_encoder)
    return embedded[key]


scores_eager, scores_ort = evaluate(eager_embed, data), evaluate(ort_embed, data)
print("eager PyTorch:", scores_eager)
print("ONNX Runtime: ", scores_ort)
sims_eager = similarity(eager_embed(data.queries), eager_embed(data.passages))
sims_ort = similarity(ort_embed(data.queries), ort_embed(data.passages))
top3 = ranking_agreement(sims_eager, sims_ort, k=3)
full = ranking_agreement(sims_eager, sims_ort, k=len(data.passages))
moved = (sims_eager - sims_ort).abs().max().item()
top_gap, rel_gap = ranking_margin(sims_eager, k=3), relevance_margin(sims_eager, data)
full_gap = ranking_margin(sims_eager, k=len(data.passages))
print(f"largest change of a similarity score: {moved:.1e}")
for name, gap in [("closest neighbours in any top 4", top_gap), ("closest passage to a relevant one", rel_gap),
                  (f"closest neighbours in the full order of {len(data.passages)}", full_gap)]:
    times = f"{gap / 2 / moved:,.1f}x the change" if moved > 0 else "above a change of 0"
    print(f"  {name + ':':<50} gap {gap:.1e}, half of it {times}")
print(f"queries with the same top-3 passages: {top3:.0%}; "
      f"with the same order of all {len(data.passages)} passages: {full:.0%}")
assert moved < top_gap / 2 and moved < rel_gap / 2, "ONNX Runtime moved a score far enough to reorder a top 3"
assert scores_ort == scores_eager and top3 == 1.0  # what those two margins guarantee
if full == 1.0:
    print("full order: the same for every query on this machine"
          + (" (the change is under half its smallest gap, so it could not differ)" if moved < full_gap / 2 else ""))
else:
    print(f"full order: {1 - full:.0%} of queries swap passages below their top 3 on this machine; the closest "
          f"neighbours of any query's full order lie {full_gap:.1e} apart, and the change is "
          f"{moved / (full_gap / 2):.1f}x half of that")

# %% [markdown]
# ## A torchaudio front end inside the exported model
#
# Audio models usually start with a feature extractor: a short-time Fourier transform (STFT)
# and a mel filter bank. If the front end stays in Python, every client must re-implement it
# exactly; exported inside the model, the file takes raw waveforms. `torchaudio.transforms.MelSpectrogram`
# is written with tensor operations, and the exporter translates its STFT to ONNX's `STFT`
# operator. We train a small CNN on the course's synthetic clips (tone, chirp, noise, pulses) for a
# few steps, then export waveform → log-mel → CNN → logits with a dynamic batch.

# %%
train, test = synthetic_audio(n_per_class=config.pick(16, 48), seed=0), synthetic_audio(n_per_class=16, seed=1)


class MelClassifier(nn.Module):
    def __init__(self, sample_rate: int, n_classes: int) -> None:
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(sample_rate, n_fft=256, hop_length=128, n_mels=32)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, n_classes))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.net(torch.log(self.mel(wave) + 1e-6).unsqueeze(1))


clf = MelClassifier(train.sample_rate, len(train.classes))
opt = torch.optim.Adam(clf.parameters(), lr=3e-3)
for step in tqdm(range(config.pick(40, 150)), desc="training", mininterval=1):
    pick = torch.randint(0, len(train.labels), (32,))
    loss = nn.functional.cross_entropy(clf(train.waveforms[pick]), train.labels[pick])
    opt.zero_grad()
    loss.backward()
    opt.step()
clf.eval()
with torch.inference_mode():
    eager_logits = clf(test.waveforms)
accuracy = (eager_logits.argmax(1) == test.labels).float().mean().item()
print(f"test accuracy after training: {accuracy:.0%} ({len(test.labels)} clips, 4 classes)")

# %%
audio_program = torch.onnx.export(clf, (test.waveforms[:4],), verbose=False, input_names=["waveform"],
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
audio_path = ONNX_DIR / "mel_classifier.onnx"
audio_program.save(str(audio_path))
audio_ops = collections.Counter(node.op_type for node in audio_program.model_proto.graph.node)
print("operators:", dict(audio_ops))
audio_sess = ort.InferenceSession(str(audio_path), providers=["CPUExecutionProvider"])
(ort_logits,) = audio_sess.run(None, {"waveform": test.waveforms.numpy()})
ort_logits = torch.from_numpy(ort_logits)
abs_err, rel_err = errors(ort_logits, eager_logits)
same = (ort_logits.argmax(1) == eager_logits.argmax(1)).float().mean().item()
print(f"{len(test.labels)} clips in one batch: max abs err {abs_err:.1e}; same predicted class for {same:.0%}")
assert "STFT" in audio_ops
torch.testing.assert_close(ort_logits, eager_logits, atol=1e-4, rtol=1e-4)
assert same == 1.0


# %% [markdown]
# The clip length stays fixed here (the example's number of samples); a model that accepts any
# length needs a `Dim` on that axis too, and a check that the shortest allowed clip still gives
# at least one STFT frame.
#
# ## Pitfalls and their fixes
#
# ### 1. An operator the exporter cannot translate
#
# The exporter translates each core ATen operator with a function from its registry. Some have none
# in the installed versions; `torch.median` along a dimension is one (a robust pooling step you may
# well write). The message says at which of the three steps the export failed:

# %%
class MedianPool(nn.Module):
    """Pool a (batch, time, features) tensor over time with the median: robust to outliers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.median(dim=1).values


frames = torch.randn(4, 9, 6)
try:
    torch.onnx.export(MedianPool().eval(), (frames,), verbose=False)
    raise AssertionError("expected the export to fail")
except torch.onnx.OnnxExporterError as err:
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # drop the terminal colour codes the message carries
    print(type(err).__name__ + ":")
    print("\n".join(line for line in message.splitlines()
                    if "aten.median" in line or "No ONNX function" in line or "This is step" in line))
assert "No ONNX function found for <OpOverload(op='aten.median', overload='dim')>" in message

# %% [markdown]
# Two fixes. **Rewrite** the model with operators that do export (Exercise 1 below asks you to),
# or **supply a translation**: `custom_translation_table` maps an ATen operator to a function
# written with ONNX Script operators. `aten.median.dim` returns the lower median (rank
# `(n - 1) // 2`) and its index; ONNX's `TopK` with `largest=0` gives the smallest `k` values in
# order, so the last of the smallest `(n - 1) // 2 + 1` is the median. `Shape` reads `n` at run
# time, so the sequence axis can stay dynamic.

# %%
from onnxscript import opset18 as op


def median_dim(self, dim: int, keepdim: bool = False):
    """ONNX translation of aten.median.dim: (values, indices) of the lower median along dim."""
    n = op.Shape(self, start=dim, end=dim + 1)
    one = op.Constant(value_ints=[1])
    k = op.Add(op.Div(op.Sub(n, one), op.Constant(value_ints=[2])), one)  # (n - 1) // 2 + 1
    smallest, where = op.TopK(self, k, axis=dim, largest=0, sorted=1)
    last = op.Sub(k, one)
    values, indices = op.Gather(smallest, last, axis=dim), op.Gather(where, last, axis=dim)
    if not keepdim:
        axes = op.Constant(value_ints=[dim])
        values, indices = op.Squeeze(values, axes), op.Squeeze(indices, axes)
    return values, indices


median_program = torch.onnx.export(
    MedianPool().eval(), (frames,), verbose=False,
    custom_translation_table={torch.ops.aten.median.dim: median_dim},
    dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("time")},))
median_sess = ort.InferenceSession(median_program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
for shape in [(4, 9, 6), (2, 8, 6), (3, 1, 6)]:  # odd, even and single-frame lengths
    sample = torch.randn(*shape)
    (values,) = median_sess.run(None, {median_sess.get_inputs()[0].name: sample.numpy()})
    assert torch.equal(torch.from_numpy(values), sample.median(dim=1).values), shape
print("custom translation: ONNX Runtime returns exactly torch.median's values at every length tried")


# %% [markdown]
# Your **own** operators meet the same wall. A function registered with
# `torch.library.custom_op` (typically a C++ or Triton kernel; here a Python body) stays one opaque
# node through `torch.export`, and the exporter has no translation for it until you give one. The
# translation can be written in standard ONNX operators, as here, or point to a custom operator
# that your runtime implements.

# %%
@torch.library.custom_op("nb07::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
    """limit * tanh(x / limit): squashes values smoothly into (-limit, limit)."""
    return limit * torch.tanh(x / limit)


@soft_clip.register_fake
def _(x, limit):
    return torch.empty_like(x)  # shapes and dtypes only, for tracing


class Clipped(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return soft_clip(x, 3.0) * 2


wide = torch.randn(4, 5) * 5
try:
    torch.onnx.export(Clipped().eval(), (wide,), verbose=False)
    raise AssertionError("expected the export to fail")
except torch.onnx.OnnxExporterError as err:
    assert "No ONNX function found for <OpOverload(op='nb07.soft_clip'" in str(err)
    # the whole "<OpOverload(...)>" it names, or (in a release that words it otherwise) the line's start
    missing = re.search(r"No ONNX function found for <[^>]*>", str(err))
    print("without a translation:", missing.group(0) if missing else
          next(line for line in str(err).splitlines() if "No ONNX function" in line)[:120])


def soft_clip_onnx(x, limit: float):
    scale = op.Constant(value_float=limit)
    return op.Mul(scale, op.Tanh(op.Div(x, scale)))


clip_program = torch.onnx.export(Clipped().eval(), (wide,), verbose=False,
                                 custom_translation_table={torch.ops.nb07.soft_clip.default: soft_clip_onnx})
clip_sess = ort.InferenceSession(clip_program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
(clipped,) = clip_sess.run(None, {clip_sess.get_inputs()[0].name: wide.numpy()})
print("with a translation:", [node.op_type for node in clip_program.model_proto.graph.node])
torch.testing.assert_close(torch.from_numpy(clipped), Clipped()(wide), atol=1e-5, rtol=1e-5)


# %% [markdown]
# ### 2. An output name that the runtime rejects
#
# The exporter names every intermediate value after the ATen operator that made it. MiniLM's
# token lookup is `aten.embedding`, so a value called `embedding` already exists inside the graph;
# asking for `output_names=["embedding"]` then produces two definitions of one name, and ONNX
# Runtime refuses the file. This was reported upstream (pytorch/pytorch#158094, since closed), yet
# the torch installed here still does it, as the cell shows. A small model with an
# `nn.Embedding` reproduces it:

# %%
class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(100, 8)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.table(token_ids).mean(dim=1)


minilm_values = {name for node in proto.graph.node for name in node.output}  # our MiniLM export
print("inner values of the MiniLM export named embedding*:", sorted(v for v in minilm_values if v.startswith("embedding")))
assert "embedding" in minilm_values

tokens = torch.randint(0, 100, (2, 5))
clash = torch.onnx.export(BagOfWords().eval(), (tokens,), verbose=False, output_names=["embedding"])
try:
    ort.InferenceSession(clash.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    raise AssertionError("expected ONNX Runtime to refuse the model")
except Exception as err:  # onnxruntime's Fail exception
    print(str(err))
    assert "Duplicate definition of name (embedding)" in str(err)

# %% [markdown]
# The fix: export without `output_names`, then rename in the in-memory graph
# (`program.model`), moving any inner value out of the way first. `onnx_tools.export_minilm` does
# exactly this.

# %%
fixed = torch.onnx.export(BagOfWords().eval(), (tokens,), verbose=False)
graph = fixed.model.graph
for node in graph:
    for value in node.outputs:
        if value.name == "embedding" and value is not graph.outputs[0]:
            value.name = "embedding_lookup"  # the inner value gets another name
graph.outputs[0].name = "embedding"
fixed_sess = ort.InferenceSession(fixed.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
print("outputs:", [o.name for o in fixed_sess.get_outputs()])
assert [o.name for o in fixed_sess.get_outputs()] == ["embedding"]

# %% [markdown]
# ### 3. Exporting in training mode
#
# Dropout and batch-norm behave differently in training mode, and the exporter captures whatever
# mode the module is in. It warns; call `model.eval()` before exporting (every export above does).

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.onnx.export(TinyNet(), (x,), verbose=False)  # a fresh module is in training mode
train_warnings = [str(w.message) for w in caught if "training mode" in str(w.message)]
assert train_warnings, "the exporter no longer warns about a module in training mode"
print(train_warnings[0])

# %% [markdown]
# ## On a GPU
#
# The `onnxruntime` package installed here is CPU-only. On a machine with an NVIDIA GPU, install
# `onnxruntime-gpu` instead and put `"CUDAExecutionProvider"` first in the providers list; the same
# file runs unchanged. The cell below compares it with eager PyTorch on the GPU when both exist.

# %%
if requires_cuda("MiniLM on ONNX Runtime's CUDA provider against eager PyTorch on the GPU", allow_rocm=False):
    gpu_sess = None
    if "CUDAExecutionProvider" in ort.get_available_providers():
        gpu_sess = ort.InferenceSession(str(helper_path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        print("session runs on:", gpu_sess.get_providers())
    if gpu_sess is None:
        skip_cell("this onnxruntime build has no CUDA provider; install onnxruntime-gpu to use the GPU")
    elif gpu_sess.get_providers()[0] != "CUDAExecutionProvider":
        # listed but not loaded (its CUDA or cuDNN libraries do not match this machine's): ONNX Runtime
        # fell back to the CPU, and a CPU run is not the comparison this cell is about
        skip_cell("ONNX Runtime could not load its CUDA provider here (its warning above says why)")
    else:
        import copy

        gpu_model = copy.deepcopy(mini.model).cuda()
        g_ids, g_mask = mini.tokenize(batches[32])

        @torch.inference_mode()
        def eager_gpu(i, m):
            return gpu_model(i.cuda(), m.cuda()).cpu()

        gpu_encoder = onnx_tools.OrtEncoder(gpu_sess)
        # ONNX Runtime may use TF32 matrix multiplies on recent GPUs: a looser tolerance.
        torch.testing.assert_close(gpu_encoder(g_ids, g_mask), eager_gpu(g_ids, g_mask), atol=5e-3, rtol=5e-3)
        gpu_table = bench.compare({"eager PyTorch (GPU)": eager_gpu, "ONNX Runtime (CUDA)": gpu_encoder},
                                  g_ids, g_mask, device="cuda")  # CPU inputs, GPU work: say where it ran
        print(gpu_table)
        gpu_said = gpu_table.describe("ONNX Runtime (CUDA)", "eager PyTorch (GPU)", name="onnx.gpu.ort_cuda_vs_eager")
        print(f"batch of {len(g_ids)}: ONNX Runtime's CUDA provider is {gpu_said}")


# %% [markdown]
# ## Check yourself
#
# **Exercise 1.** Rewrite the median pooling so that it exports with no custom translation: write
# `median_dim1(x)` that returns the same values as `x.median(dim=1).values` (for even lengths
# `torch.median` returns the *lower* of the two middle elements) without calling `torch.median`.

# %%
def median_dim1(x: torch.Tensor) -> torch.Tensor:
    # Your code here: replace the line below.
    return x.median(dim=1).values


exercises.check("07.median_rewrite", median_dim1)

# %% [markdown]
# **Exercise 2.** Write the `dynamic_shapes` argument for exporting the encoder
# `forward(input_ids, attention_mask)` so that both the batch size and the sequence length may vary
# (the checker exports a stand-in with your spec).

# %%
dynamic_spec = None  # Your code here: a dict keyed by argument name


exercises.check("07.dynamic_shapes", dynamic_spec)


# %% [markdown]
# **Exercise 3.** `session.run` needs a dict of inputs. Write `to_feeds(ids, mask)` returning
# what the exported encoder expects (names and dtypes: see `sess.get_inputs()` above).
# Stuck? `print(exercises.solution_source("07.ort_feeds"))` shows a reference solution: try first.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
def to_feeds(ids: torch.Tensor, mask: torch.Tensor) -> dict:
    # Your code here.
    return {}


exercises.check("07.ort_feeds", to_feeds)

# %% [markdown]
# ## Summary
#
# - `torch.onnx.export(model, args, dynamic_shapes=...)` is the `torch.export`-based exporter by
#   default in this torch; it returns an `ONNXProgram` (`model_proto`, `model`, `exported_program`,
#   `save`). `torch.onnx.dynamo_export` is gone and `dynamo=False` is deprecated.
# - Inspect before shipping: `onnx.checker.check_model`, the opset, the operator counts, the input
#   signature (symbolic `batch` and `seq`).
# - ONNX Runtime: one `InferenceSession` per model, execution providers in order of preference,
#   `intra_op_num_threads` set like torch's, idle threads that sleep (`session.intra_op.allow_spinning`
#   `"0"`, ONNX Runtime's equivalent of `OMP_WAIT_POLICY=PASSIVE`), graph optimisation levels that
#   fuse into ONNX Runtime's own operators.
# - Parity is measured and asserted: on MiniLM, ONNX Runtime's outputs stay within 1e-4 of PyTorch's
#   (atol and rtol on random inputs, absolute on real ones), and give the same retrieval scores and
#   top-3 passages as PyTorch: every score moved by less than half the smallest gap that could reorder
#   a top 3 or move a relevant passage (asserted); the full order is a printed verdict.
#   `verify_onnx_program` automates the comparison (its relative figure counts near-zero entries).
# - The runtime's speed against eager was measured at batch 1 and batch 32 and recorded
#   (`onnx.minilm.speedup.b1`, `onnx.minilm.speedup.b32`); timing 2- and 64-token inputs beside the
#   query can split the batch-1 gap into the cost of a call that does not grow with the tokens (Python and
#   dispatch, and reading every weight matrix once) and the part that does (the cell's verdict says
#   whether this run's timings allowed it). The two profilers (`torch.profiler`, ONNX Runtime's
#   `enable_profiling`) show how each runtime's own call splits, as shares of its profile; profiling
#   can stretch such short calls (the cell checks whether it did), so whether they can place the gap
#   between the runtimes is a line the cell prints for your run.
#   Export and session creation are one-off costs that a short-lived process may never earn back.
# - A torchaudio `MelSpectrogram` front end exports to ONNX's `STFT` operator inside the model.
# - An operator without a translation (`aten.median.dim`, or your own `torch.library.custom_op`) is
#   fixed with a `custom_translation_table` entry written in ONNX Script, or by rewriting the model; an output name that clashes with an
#   inner value is renamed after export.
#
# **Next:** notebook 08 quantizes this model, in PyTorch and in ONNX Runtime, and measures size,
# speed and quality side by side.
#
# ## Further reading
#
# - [`torch.onnx` documentation](https://docs.pytorch.org/docs/stable/onnx.html) and the
#   [`torch.export`-based exporter](https://docs.pytorch.org/docs/stable/onnx_export.html)
# - [Extending the ONNX exporter's operator support](https://docs.pytorch.org/tutorials/beginner/onnx/onnx_registry_tutorial.html) (custom translations)
# - [ONNX Runtime: graph optimisations](https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html)
#   and [thread management](https://onnxruntime.ai/docs/performance/tune-performance/threading.html)
# - [ONNX operators](https://onnx.ai/onnx/operators/) and [ONNX Script](https://microsoft.github.io/onnxscript/)
