# %% [markdown]
# # 08 · Quantization: from a hand-written int8 Linear to torchao and ONNX Runtime
#
# A trained network stores every weight as a 32-bit float, and at inference time much of the work
# can be moving those weights from memory to the arithmetic units. Store them in 8 bits instead and the
# weights take a quarter of the bytes: the model downloads faster, fits in a phone's memory, and,
# with the right kernels, runs faster too. The catch is in two words of that sentence: *right
# kernels*.
# This notebook writes int8 quantization by hand to see exactly what it does, then uses the tools
# PyTorch users reach for today (torchao and ONNX Runtime), and measures size, speed and quality
# side by side on a real pretrained transformer and a small CNN, including the cases where int8
# makes things *slower*.

# %% [markdown]
# ## What you will learn
#
# - how to measure a model's storage (serialized bytes) and what a bf16 or fp16 cast saves and costs;
# - symmetric int8 quantization written by hand, per tensor and per output channel, and why the
#   simple version (dequantize the whole weight on every call) saves bytes but adds work to every
#   call;
# - the status of PyTorch's old `torch.ao.quantization` (deprecated) and where its pieces moved;
# - today's path: torchao's `quantize_` with int8 weight-only and dynamic-activation configurations,
#   and how it combines with `torch.compile`;
# - ONNX Runtime's dynamic and static quantization, and the per-channel switch that decides quality;
# - PyTorch's own static int8 flow, PT2E (`torch.export`, `prepare_pt2e` with `X86InductorQuantizer`,
#   calibration, `convert_pt2e`, `torch.compile`), and the Inductor setting without which its int8
#   kernels never run, shown by counting kernels in the generated code;
# - quantization-aware training with torchao's `QATConfig`, and how to tell whether it was needed;
# - the FP8 formats (`float8_e4m3fn`, `float8_e5m2`), their ranges, and a scaled FP8 matmul;
# - one table per model (all-MiniLM-L6-v2 and a digits CNN): size, latency and quality of every variant.
#
# **Prerequisites:** notebook 00 (timing with `course_utils.bench`) and 01 (`torch.compile`);
# notebook 07 (ONNX export) helps but is not required: this notebook exports what it needs.
#
# **Time on a laptop CPU:** <!-- stamp:time -->2.5 min the first time (every cache empty), 2.5 min after that (compile cache warm, yet no faster in these two runs), 0.8 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time --> Quick mode skips, among other things,
# compiling the transformer. On a CPU without AVX-512 VNNI or AMX,
# torchao's dynamic int8 layers run torch's own int8 loop, which can make the transformer section
# take longer there.
#
# **Your CPU decides the speed results.** Int8 pays only where the library has fast integer
# kernels for your CPU (8-bit dot-product instructions help most). The setup cell prints your
# CPU's class; every speed result below is a verdict for *this* machine, with the reason it holds
# here.
#
# **GPU:** not needed. A *fast* scaled FP8 matrix multiply needs FP8 hardware: on NVIDIA, compute
# capability 8.9 or newer (on a machine without such hardware, torchao's float8 configuration names
# the hardware it accepts in the message printed below); the cell that times one says it skipped
# otherwise. The arithmetic itself is checked on the CPU where this torch build has a CPU kernel.

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

# The profiler used in one cell below logs Kineto messages (and, on a CPU-only machine, a harmless
# "gpuGetDeviceCount failed") to stderr unless this is set before it first starts.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import copy
import logging
import re
import warnings
from collections import Counter

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from course_utils import bench, compat, config, cpu, exercises, inductor_code, session, size, threads
from course_utils.data import digits_loaders, load_retrieval_set, ranking_agreement, similarity
from course_utils.device import requires_cuda, skip_cell
from course_utils.kit.cpu_profiles import PROFILES
from course_utils.models import SmallResNet, load_minilm

# torchao registers an Enum with torch's pytree at import time, and torch 2.14 logs a note that
# this is no longer needed; it is noise for us, so silence that one logger.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# Two more notes that are noise here: tqdm.auto (imported by transformers) asks for Jupyter widgets,
# and compiling torchao's tensor subclasses notes that they do not support AOT autograd caching.
warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message=".*_stable_hash_for_caching")
import onnx
import onnxruntime as ort
import torchao
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                  IntxWeightOnlyConfig, quantize_)
from torchao.quantization.granularity import PerAxis

print(session.start(seed=0))
print(f"torchao {torchao.__version__}, onnxruntime {ort.__version__}")
cpu_facts = cpu.info()
print("CPU class:", cpu_facts.line())
# A CPU profile without an emulator caps only torch's own code: oneDNN and ONNX Runtime still read the real CPU
# (None with no profile, and under an emulated CPU such as `haswell`, which every library sees).
real_cpu_profile = cpu.settings_only_profile()
BUILD = config.build_dir() / "nb08"
BUILD.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Why quantize, and how we measure size
#
# A float32 weight takes 4 bytes, a bfloat16 or float16 weight 2, an int8 weight 1. Fewer bytes
# help in three places: on disk and over the network (the file you ship), in memory (how many
# models fit), and in time, because a layer whose weights are bigger than the CPU caches can be
# limited by how fast memory delivers them rather than by arithmetic (the timing of one layer
# further down says whether this notebook's layer is, here).
#
# The measure of storage in this course is `course_utils.size.serialized_bytes`: the number of
# bytes `torch.save` writes for a module's `state_dict`, which is what you would ship. Our first
# subject is a plain MLP, 1024 → 4096 → 1024, the shape of a transformer's feed-forward block.

# %%
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).eval()
x_mlp = torch.randn(16, 1024)  # a batch of 16 token vectors

n_params = size.count_parameters(mlp)
mlp_bytes = size.serialized_bytes(mlp)
print(f"parameters: {n_params:,}   dtypes: {size.parameter_dtypes(mlp)}")
print(f"serialized: {mlp_bytes / 1e6:.2f} MB   (4 bytes x parameters = {4 * n_params / 1e6:.2f} MB)")
assert abs(mlp_bytes - 4 * n_params) < 0.01 * 4 * n_params  # the rest is names and metadata


# %% [markdown]
# ## Halving the bytes: bf16 and fp16
#
# The simplest reduction is a cast: `model.to(torch.bfloat16)` turns every floating-point parameter
# and buffer into 16 bits. The two 16-bit formats spend their bits differently. **bfloat16** keeps
# float32's 8 exponent bits (same range) and keeps only 7 mantissa bits; **float16** has 10
# mantissa bits (finer steps) but 5 exponent bits, so it overflows above 65504. `torch.finfo` says
# so:

# %%
def finfo_row(dtype: torch.dtype) -> str:
    fi = torch.finfo(dtype)
    return f"{str(dtype):<22} {fi.bits:>4} {fi.max:>12.4g} {fi.tiny:>12.4g} {fi.eps:>10.3g}"


print(f"{'dtype':<22} {'bits':>4} {'max':>12} {'smallest normal':>15} {'eps':>8}")
for dt in (torch.float32, torch.bfloat16, torch.float16):
    print(finfo_row(dt))

# %% [markdown]
# Now the real model of this notebook: **all-MiniLM-L6-v2**, a 6-layer BERT-style sentence
# encoder (22.7 million parameters) that maps a sentence to a 384-number embedding. Quality is
# measured on the course's retrieval set (questions and passages): the mean cosine similarity
# between a variant's embeddings and the fp32 ones, and `ranking_agreement`, the fraction of
# questions whose top-3 passages come out in the same order as with fp32.

# %%
mini = load_minilm()
retrieval = load_retrieval_set()
texts = retrieval.queries + retrieval.passages
n_queries = len(retrieval.queries)

with torch.inference_mode():
    emb_fp32 = mini.encode(texts)
sims_fp32 = similarity(emb_fp32[:n_queries], emb_fp32[n_queries:])


def embedding_quality(model) -> tuple[float, float]:
    """Return (mean cosine to fp32, top-3 ranking agreement) for a variant taking (ids, mask)."""
    with torch.inference_mode():
        emb = mini.encode(texts, model=model)
    # normalized here in float32: a float16 model's own normalizing leaves norms a little off 1
    cosine = (F.normalize(emb, dim=-1) * emb_fp32).sum(dim=-1).mean().item()
    agree = ranking_agreement(sims_fp32, similarity(emb[:n_queries], emb[n_queries:]), k=3)
    return cosine, agree


fp32_bytes = size.serialized_bytes(mini.model)
print(f"MiniLM: {size.count_parameters(mini.model):,} parameters, {fp32_bytes / 1e6:.1f} MB serialized, "
      f"{len(texts)} texts to embed")
half_cos = {}
for dtype in (torch.bfloat16, torch.float16):
    half = copy.deepcopy(mini.model).to(dtype)
    cos, agree = embedding_quality(half)
    ratio = size.serialized_bytes(half) / fp32_bytes
    print(f"{str(dtype):<15} size {ratio:.2f}x fp32, "
          f"mean cosine to fp32 {cos:.5f}, top-3 rankings unchanged for {agree:.0%} of queries")
    assert cos > 0.99 and 0.49 < ratio < 0.51  # half the bytes, a tiny loss
    half_cos[dtype] = cos
assert half_cos[torch.float16] > half_cos[torch.bfloat16]  # float16's finer mantissa


# %% [markdown]
# Half the bytes for a tiny loss of accuracy. float16's finer mantissa gives the closer embeddings
# (asserted above); float16's narrower range (overflow above 65,504) did not cost it here. On a CPU, whether a
# cast also saves time depends on the CPU (recent x86 chips have bf16 dot-product instructions,
# older ones emulate them) and on the library that runs the matmuls. The final table measures it
# for bf16.
#
# ## Int8 by hand
#
# Integers need a *scale*. Symmetric int8 quantization maps a float weight `w` to
# `q = round(w / scale)`, clamped to [-127, 127], with `scale = max|w| / 127`, so the largest
# weight lands exactly on ±127 and zero stays zero. To use the weight we *dequantize*:
# `w ≈ q * scale`. Each weight is then off by at most half a step, `scale / 2`.
#
# The question is what `max|w|` is taken over. **Per tensor**: one scale for the whole matrix, so
# one large weight anywhere makes the steps coarse for every row. **Per output channel**: one scale
# per row of the `(out_features, in_features)` weight, so each output neuron gets steps sized to
# its own weights. It costs one extra float per row, nothing at all next to the row itself.
#
# The code below is written for clarity, not speed. `Int8Linear` stores int8 weights and their
# scales as buffers, and, like most first attempts, dequantizes the whole weight on every
# forward call.

# %%
def quantize_int8(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q, scale): symmetric int8 values and the float scale(s) with q * scale ≈ w."""
    if per_channel:
        amax = w.abs().amax(dim=1, keepdim=True)  # one value per output row, shape (out, 1)
    else:
        amax = w.abs().amax()                      # one value for the whole tensor
    scale = amax.clamp(min=1e-12) / 127
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """A Linear layer whose weight is stored as int8 plus scale(s); it computes in float."""

    def __init__(self, linear: nn.Linear, per_channel: bool = True) -> None:
        super().__init__()
        q, scale = quantize_int8(linear.weight.detach(), per_channel)
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_int8.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Rebuilds a full float32 weight on EVERY call, then does an ordinary float matmul.
        w = self.dequantized_weight().to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))


def swap_linears(model: nn.Module, per_channel: bool = True) -> nn.Module:
    """Replace every nn.Linear inside ``model`` (in place) by an Int8Linear; return the model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child, per_channel))
        else:
            swap_linears(child, per_channel)
    return model


mlp_int8 = swap_linears(copy.deepcopy(mlp))
print(mlp_int8)
print(f"dtypes now: {size.parameter_dtypes(mlp_int8)}")
print(f"serialized: {size.serialized_bytes(mlp_int8) / 1e6:.2f} MB, "
      f"{size.serialized_bytes(mlp_int8) / mlp_bytes:.3f}x the fp32 MLP")
with torch.inference_mode():
    torch.testing.assert_close(mlp_int8(x_mlp), mlp(x_mlp), rtol=0.05, atol=0.01)
print("int8 MLP output matches fp32 within rtol=0.05, atol=0.01")

# %% [markdown]
# ### Error per layer, per tensor against per channel
#
# How much does each MiniLM weight matrix lose? The relative error `‖W − dequant(W)‖ / ‖W‖` of
# every Linear layer, both ways:

# %%
linears = {name: m for name, m in mini.model.named_modules() if isinstance(m, nn.Linear)}
rel_err = {"per tensor": [], "per channel": []}
for name, lin in linears.items():
    w = lin.weight.detach()
    for label, per_channel in (("per tensor", False), ("per channel", True)):
        q, scale = quantize_int8(w, per_channel)
        rel_err[label].append(((q.float() * scale - w).norm() / w.norm()).item())

worst = max(range(len(linears)), key=lambda i: rel_err["per tensor"][i])
worst_name = list(linears)[worst]
max_rel_err = max(rel_err["per channel"])
print(f"{len(linears)} Linear layers")
for label, errs in rel_err.items():
    print(f"{label:>12}: mean relative error {sum(errs) / len(errs):.4f}, worst {max(errs):.4f}")
print(f"worst layer per tensor: {worst_name}")
assert all(c <= t + 1e-6 for c, t in zip(rel_err["per channel"], rel_err["per tensor"]))
assert max_rel_err < 0.05
bench.record("quant.handwritten.max_rel_err", max_rel_err, "ratio", scheme="int8 symmetric per channel",
             model="all-MiniLM-L6-v2", layers=len(linears));

# %%
w = linears[worst_name].weight.detach()
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
axes[0].plot(rel_err["per tensor"], "o-", label="per tensor")
axes[0].plot(rel_err["per channel"], "o-", label="per channel")
axes[0].set(xlabel="Linear layer (in model order)", ylabel="relative error", title="int8 error per layer")
axes[0].legend()
axes[1].hist(w.flatten().numpy(), bins=200, log=True, color="tab:gray")
axes[1].set(xlabel="weight value", ylabel="count (log)", title=f"weights of {worst_name.split('encoder.')[-1]}")
for label, per_channel in (("per tensor", False), ("per channel", True)):
    q, scale = quantize_int8(w, per_channel)
    axes[2].hist((q.float() * scale - w).flatten().numpy(), bins=200, histtype="step", log=True, label=label)
axes[2].set(xlabel="dequantized - original", ylabel="count (log)", title="error distribution, same layer")
axes[2].legend()
fig.tight_layout();

# %% [markdown]
# The weight histogram has long tails: a few large weights set `max|w|`. Per tensor, those
# outliers make the step coarse for every row; per channel, only their own rows pay. The error
# histograms show it: per tensor, the errors spread evenly over a band as wide as that coarse step;
# per channel, they stay in a narrow spike around zero.
#
# ### What the hand-written version costs at run time
#
# `Int8Linear` saves bytes on disk, but each call rebuilds a float32 copy of the weight (a
# conversion and then a multiply: about 13 bytes of memory traffic per weight) and then runs the
# same float matmul as before, which reads the 4 bytes per weight that fp32 reads. Timing one
# 1024 → 4096 layer at batch 16:

# %%
layer = mlp[0]
layer_int8 = Int8Linear(layer)
with torch.inference_mode():
    t_layer = bench.compare({
        "fp32 nn.Linear": layer,
        "Int8Linear (dequantize + float matmul)": layer_int8,
        "dequantize alone": lambda x: layer_int8.dequantized_weight(),
    }, x_mlp)
print(t_layer)
layer_word = t_layer.verdict("Int8Linear (dequantize + float matmul)", "fp32 nn.Linear",
                            name="quant.handwritten.layer.vs_fp32")  # describe() below prints this verdict
print(f"\nthe hand-written int8 layer is {t_layer.describe('Int8Linear (dequantize + float matmul)', 'fp32 nn.Linear')}: "
      + {"slower": "it saves storage, not time", "no clear difference": "it saves storage, and no time",
         "faster": "it saves storage and, on this machine, even time"}[layer_word])
# Is this layer limited by memory here? Set the rate the fp32 layer read its weights beside the rate the
# dequantize step moved its ~13 bytes per weight (a lower bound on what memory delivers on this machine).
n_w = layer.weight.numel()
deq_gbs = 13 * n_w / t_layer.row("dequantize alone").median_s / 1e9
lin_gbs = 4 * n_w / t_layer.row("fp32 nn.Linear").median_s / 1e9
mem_word = bench.band_verdict(lin_gbs, deq_gbs, band=0.3)
print(f"dequantize alone moved about {deq_gbs:.0f} GB/s; fp32 nn.Linear read its weights at {lin_gbs:.0f} GB/s: "
      + {"lower": "well below what memory delivered to the dequantize step, so this layer is not limited by memory "
                  "here",
         "no clear difference": "about as fast as memory delivered to the dequantize step (30% band), so memory may "
                                "limit this layer here",
         "higher": "faster than the dequantize step moved its bytes, and that step's rate is only a lower bound on "
                   "what memory delivers, so this cell cannot tell whether memory limits this layer"}[mem_word]
      + (" (rough rates: see the spread note above)" if t_layer.spread_note() else ""))

# %% [markdown]
# A real int8 kernel never builds that float32 copy. It reads the int8 weights directly (a
# quarter of the memory traffic), and, when the activations are quantized too, multiplies int8 by
# int8 into 32-bit integer accumulators. Then it applies one float rescale per output element:
# `y[i, j] ≈ acc[i, j] · scale_x[i] · scale_w[j]`. Exercise 2 asks you to write exactly that.
#
# How fast that integer product runs depends on the CPU more than anything else in this course:
#
# - **x86 with AVX-512 VNNI, AVX-VNNI or AMX** (recent server chips, many recent laptops): one
#   `VPDPBUSD` instruction multiplies groups of four 8-bit pairs and adds them straight into 32-bit
#   sums; AMX does whole tiles at once.
# - **x86 with AVX2 only** (most laptops and cloud machines a few years old): there is no 8-bit dot
#   product. Libraries multiply unsigned 8-bit by signed 8-bit values with `VPMADDUBSW`, which adds
#   neighbouring pairs into a *16-bit* lane (and can saturate there, see the CNN section), then
#   widen; some libraries have no vectorised int8 kernel at all on such a CPU.
# - **ARM** (Apple silicon, Graviton): `SDOT`/`UDOT` where the core has the dot-product extension.
#
# So before any model, measure the bare int8 matrix product against the float one, with the same
# shape as the MLP's first layer:
#

# %%
a_q = torch.randint(-64, 65, (16, 1024), dtype=torch.int8)
b_q = torch.randint(-64, 65, (1024, 4096), dtype=torch.int8)
a_f, b_f = a_q.float(), b_q.float()
# Exact: every partial sum is an integer far below 2**24, so float32 holds it without rounding.
torch.testing.assert_close(torch._int_mm(a_q, b_q).float(), a_f @ b_f, rtol=0, atol=0)

gemm_table = bench.compare({"fp32 mm": lambda: a_f @ b_f, "int8 torch._int_mm": lambda: torch._int_mm(a_q, b_q)})
print(gemm_table)
route = cpu.onednn_report()  # a fresh process with ONEDNN_VERBOSE=1: which library ran the int8 product?
print(f"\ntorch._int_mm ran through: {route['int_mm']}; oneDNN's instruction set: {route['isa']}")
int8_gemm = gemm_table.verdict("int8 torch._int_mm", "fp32 mm", name="quant.int8_gemm.int_mm_vs_fp32")  # printed below
bench.record("quant.int8_gemm.speedup", gemm_table.speedup("int8 torch._int_mm"), "x", route=route["int_mm"],
             shape="16x1024 @ 1024x4096", cpu=cpu_facts.line())
print(f"on this CPU ({cpu_facts.cpu_class}) the int8 product is "
      f"{gemm_table.describe('int8 torch._int_mm', 'fp32 mm')}")
onednn_dot = any(word in route["isa"] for word in ("DL Boost", "VNNI", "AMX"))
if route["int_mm"] != "oneDNN":
    why = ("on a CPU without AVX-512 VNNI torch runs the int8 product in its own fallback code, not in oneDNN's "
           "int8 kernels (the route line above shows no oneDNN primitive ran)")
elif onednn_dot:
    why = "oneDNN runs it with 8-bit dot-product instructions (VNNI or AMX), several multiply-adds per instruction"
else:
    why = ("oneDNN has no 8-bit dot-product instruction here: it pairs products into 16-bit sums "
           "and widens them, more instructions per multiply-add than a float FMA needs")
print("why:", why)
if cpu_facts.profile and route["int_mm"] == "oneDNN" and onednn_dot and not cpu_facts.int8_dot:
    print(f"(CPU profile {cpu_facts.profile}: torch picks this route from the real CPU, which has VNNI; on a real "
          "AVX2-only CPU it would be torch's own loop. `make test-haswell` emulates one to show that.)")
elif cpu_facts.profile:
    profile_settings = PROFILES.get(cpu_facts.profile, {})
    if "COURSE_EMULATOR" in profile_settings:
        print(f"(CPU profile {cpu_facts.profile}: every library sees the emulated CPU, so these are that CPU's "
              "kernels, run under emulation)")
    else:
        capped = "torch's and Inductor's own vector code" + (
            " and FBGEMM" if "FBGEMM_ENABLE_INSTRUCTIONS" in profile_settings else "")
        print(f"(CPU profile {cpu_facts.profile}: it caps {capped}; oneDNN and ONNX Runtime still use the real "
              "CPU's instructions, so the int8 timings in this notebook mix the two)")

# %% [markdown]
# ## PyTorch's eager dynamic quantization: deprecated, still running
#
# Many older tutorials call `torch.quantization.quantize_dynamic`, the eager-mode API of
# `torch.ao.quantization`. It swaps each `nn.Linear` for a `DynamicQuantizedLinear` that stores
# int8 weights (per tensor by default) and quantizes activations on the fly, using the int8
# kernels of the backend named by `torch.backends.quantized.engine`. Here is what the installed
# torch says when you call it:

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlp_ao = torch.ao.quantization.quantize_dynamic(copy.deepcopy(mlp), {nn.Linear}, dtype=torch.qint8)

seen = set()
for w_ in caught:
    first_line = str(w_.message).strip().splitlines()[0]
    if first_line not in seen:
        seen.add(first_line)
        print(f"{w_.category.__name__}: {first_line}")
deprecations = [w_ for w_ in caught if issubclass(w_.category, DeprecationWarning)]
assert deprecations and "torchao" in str(deprecations[0].message), "expected a deprecation pointing at torchao"
where_to = [ln.strip() for ln in str(deprecations[0].message).splitlines()[1:] if "torchao" in ln]
print("where it says each piece went:" + "".join(f"\n  {ln}" for ln in where_to))
print()
print(mlp_ao[0])
print(f"quantized engine: {torch.backends.quantized.engine}")
print(f"serialized: {size.serialized_bytes(mlp_ao) / mlp_bytes:.3f}x the fp32 MLP")
with torch.inference_mode():
    torch.testing.assert_close(mlp_ao(x_mlp), mlp(x_mlp), rtol=0.05, atol=0.02)
print("it still runs, and matches fp32 within rtol=0.05, atol=0.02")

# %% [markdown]
# The warning names a removal release, yet the API is still here in the torch you are running:
# read such dates as intent, not as a schedule, and migrate anyway. (A second warning may follow:
# the quantized tensor dtypes such as `torch.qint8` are slated for removal too.) The same message
# says where each piece went: eager quantization to torchao's `quantize_`, and the graph-mode
# flows (FX, and PT2E, the `torch.export`-based flow for static quantization) to
# `torchao.quantization.pt2e`. Does torch itself still ship PT2E? The next cell tries to import it:

# %%
try:
    import torch.ao.quantization.quantize_pt2e  # noqa: F401
    print("torch.ao.quantization.quantize_pt2e still ships with this torch")
except ModuleNotFoundError as err:
    print(f"in torch {torch.__version__}: {err}")
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402,F401

print("torchao provides:", prepare_pt2e.__module__ + ".prepare_pt2e / convert_pt2e")

# %% [markdown]
# ## Today's path: torchao `quantize_`
#
# torchao is PyTorch's quantization library. Its entry point is `quantize_(model, config)`: it walks
# the model and, for each `nn.Linear` (or whatever `filter_fn` selects), replaces the weight
# *in place* by a tensor subclass that holds int8 data and scales and knows how to run
# `F.linear`. The module stays an ordinary `nn.Linear`; only its weight changed type. Two
# configurations run on a CPU:
#
# - `Int8WeightOnlyConfig()`: int8 weights per output channel, activations stay float. It saves
#   memory; whether it saves time depends on a fast weight-only kernel for your hardware.
# - `Int8DynamicActivationInt8WeightConfig()`: weights as above, and each activation row is
#   quantized at run time, so the matmul itself runs in int8.

# %%
mlp_wo = copy.deepcopy(mlp)
quantize_(mlp_wo, Int8WeightOnlyConfig())
mlp_dyn = copy.deepcopy(mlp)
quantize_(mlp_dyn, Int8DynamicActivationInt8WeightConfig())

weight = mlp_dyn[0].weight
print(f"module type: {type(mlp_dyn[0]).__name__}; weight type: {type(weight).__name__}")
print(f"inside: qdata {weight.qdata.dtype} {tuple(weight.qdata.shape)}, scale {tuple(weight.scale.shape)}")
for name, model in (("weight-only", mlp_wo), ("dynamic act + weight", mlp_dyn)):
    with torch.inference_mode():
        torch.testing.assert_close(model(x_mlp), mlp(x_mlp), rtol=0.05, atol=0.02)
    # (measure sizes outside inference_mode: saving these subclass weights inside it fails)
    print(f"{name:>20}: {size.serialized_bytes(model) / mlp_bytes:.3f}x the fp32 size, "
          "output matches fp32 within rtol=0.05, atol=0.02")

# %% [markdown]
# Does `size.serialized_bytes` measure these subclass weights correctly? It calls `torch.save`
# on the state dict, which stores the subclass with its int8 payload and scales. Check it against
# the bytes the payload must take, and check the file loads back with `weights_only=True` (torchao
# registers its tensor classes as safe to load):

# %%
import io

payload = sum(m.weight.qdata.numel() + 4 * m.weight.scale.numel() + 4 * m.bias.numel()
              for m in mlp_dyn if isinstance(m, nn.Linear))
measured = size.serialized_bytes(mlp_dyn)
print(f"int8 payload + float scales + biases: {payload / 1e6:.3f} MB; torch.save wrote {measured / 1e6:.3f} MB")
assert payload <= measured < payload * 1.01

buf = io.BytesIO()
torch.save(mlp_dyn.state_dict(), buf)
buf.seek(0)
restored = torch.load(buf, weights_only=True)
print(f"reloaded with weights_only=True: {type(restored['0.weight']).__name__}")

# %% [markdown]
# ### Speed, and how it combines with `torch.compile`
#
# torchao's tensor subclasses work in eager mode, but they are designed for `torch.compile`:
# Inductor sees the quantize, int8 matmul and rescale as one graph and fuses the pieces around the
# matmul. The fair comparison therefore includes compiled fp32 too. Compiling each variant costs
# seconds once (`bench.compare` warms up first, so it is not timed).

# %%
# What does compiling the fp32 MLP generate? Read it now: generated_code resets Dynamo, as the next line does.
with torch.inference_mode():
    _, fp32_mlp_sources = inductor_code.generated_code(torch.compile(copy.deepcopy(mlp)), x_mlp)
torch._dynamo.reset()
mlp_variants = {
    "fp32 eager": mlp,
    "fp32 compiled": torch.compile(copy.deepcopy(mlp)),
    "torch.ao dynamic int8 (deprecated)": mlp_ao,
    "torchao int8 weight-only, eager": mlp_wo,
    "torchao int8 dyn-act, eager": mlp_dyn,
    "torchao int8 dyn-act, compiled": torch.compile(copy.deepcopy(mlp_dyn)),
}
if not config.is_quick():
    mlp_variants["torchao int8 weight-only, compiled"] = torch.compile(copy.deepcopy(mlp_wo))

with torch.inference_mode():
    for name, fn in tqdm(list(mlp_variants.items()), desc="warm-up and compile"):
        torch.testing.assert_close(fn(x_mlp), mlp(x_mlp), rtol=0.05, atol=0.02)
    mlp_table = bench.compare(mlp_variants, x_mlp)
print(mlp_table)
bench.bar_chart(mlp_table, title="MLP 1024-4096-1024, batch 16, CPU");

# %%
for name, key in (("torch.ao dynamic int8 (deprecated)", "torch_ao_dynamic"),
                  ("torchao int8 dyn-act, compiled", "torchao_dyn_act_compiled"),
                  ("torchao int8 dyn-act, eager", "torchao_dyn_act_eager"),
                  ("torchao int8 weight-only, eager", "torchao_weight_only_eager")):
    print(f"{name:<36} {mlp_table.describe(name, 'fp32 eager', name=f'quant.mlp.{key}.vs_fp32_eager')}")
said = mlp_table.describe("torchao int8 dyn-act, compiled", "fp32 compiled",
                         name="quant.mlp.torchao_dyn_act_compiled.vs_fp32_compiled")
print(f"{'torchao int8 dyn-act, compiled':<36} {said}")
# The other rows of the table get their verdict too (a ratio alone is not a direction).
said = mlp_table.describe("fp32 compiled", "fp32 eager", name="quant.mlp.fp32_compiled.vs_fp32_eager")
others = threads.other_load()  # other programs' CPU use, sampled after the timing
busy_note = (f"; other programs used about {others:.1f} cores, sampled after the timing"
             if others is not None and others >= threads.BUSY_CORES else "")
# What compiling changed: the library calls eager makes (profiled once) against the generated code's.
with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    mlp(x_mlp)
eager_calls = [e.key.split("::")[1] for e in prof.events() if e.key in ("aten::addmm", "aten::mm")]
fp32_calls = inductor_code.library_calls(fp32_mlp_sources[0])
fp32_loops = inductor_code.kernel_calls(fp32_mlp_sources[0])
same_calls = sorted(fp32_calls) == sorted(eager_calls)
loops = f"{len(fp32_loops)} loop{'s' if len(fp32_loops) != 1 else ''} Inductor wrote ({', '.join(fp32_loops) or 'none'})"
contents = ((f"its generated code makes the same {len(fp32_calls)} library matmul calls as eager ({', '.join(fp32_calls)})"
             if same_calls else f"its generated code calls {fp32_calls} where eager calls {eager_calls}")
            + f" and runs {loops}")
fp32_compile_word = mlp_table.verdict("fp32 compiled", "fp32 eager")  # recorded above
if fp32_compile_word == "slower":
    how = "; this notebook does not profile why"
elif not same_calls:
    how = "; this notebook does not profile what each part costs"
elif fp32_compile_word == "faster":
    how = (f", so the gain came from what {'that loop replaces' if len(fp32_loops) == 1 else 'those loops replace'} "
           "(eager's element-wise operators) and the code around the library calls")
else:
    how = (f", so compiling changed only what {'that loop replaces' if len(fp32_loops) == 1 else 'those loops replace'} "
           "(eager's element-wise operators) and the code around the library calls")
print(f"{'fp32 compiled':<36} {said} ({contents}{how}{busy_note})")
if "torchao int8 weight-only, compiled" in mlp_variants:
    said = mlp_table.describe("torchao int8 weight-only, compiled", "fp32 compiled",
                             name="quant.mlp.torchao_weight_only_compiled.vs_fp32_compiled")
    print(f"{'torchao int8 weight-only, compiled':<36} {said}")

# Why: which library call does the work in each int8 variant? Count it with the profiler.
def top_ops(fn, n=3):
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(x_mlp)
    events = [e for e in prof.key_averages() if "::" in e.key]  # operators (aten::, quantized::), not framework rows
    return [e.key for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:n]]

ao_ops = top_ops(mlp_variants["torch.ao dynamic int8 (deprecated)"])
tao_ops = top_ops(mlp_variants["torchao int8 dyn-act, compiled"])
print(f"\ntorch.ao's heaviest operator calls:            {ao_ops}")
print(f"compiled torchao dyn-act's heaviest operator calls: {tao_ops} (the code Inductor generated is not an "
      "operator; it is measured below)")
assert any("linear_dynamic" in k for k in ao_ops), "torch.ao runs FBGEMM's fused dynamic int8 Linear"
assert any("_int_mm" in k for k in tao_ops), "torchao's dynamic int8 Linear runs torch._int_mm"

# Where a compiled torchao call spends its time: the int8 products, the code Inductor generated around them
# (the profiler's "## Call CompiledFxGraph ... ##" row), and the rest (guards, wrappers, other operators).
# Several warm calls, averaged per call: a single call can land far from the timed median.
PROFILED_CALLS = 5
schedule = torch.profiler.schedule(wait=1, warmup=1, active=PROFILED_CALLS)
with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                    schedule=schedule) as prof:
    for _ in range(2 + PROFILED_CALLS):  # one call skipped, one to warm the profiler up, then the recorded ones
        mlp_variants["torchao int8 dyn-act, compiled"](x_mlp)
        prof.step()
self_ms = {e.key: e.self_cpu_time_total / 1e3 / PROFILED_CALLS for e in prof.key_averages()}  # ms per call
int_mm_ms = sum(ms for key, ms in self_ms.items() if "_int_mm" in key)
generated_ms = sum(ms for key, ms in self_ms.items() if key.startswith("## Call CompiledFxGraph"))
profiled_ms = sum(self_ms.values())
rest_ms = profiled_ms - int_mm_ms - generated_ms
tao_ms = mlp_table.row("torchao int8 dyn-act, compiled").median_s * 1e3
# The split can explain the table only where the profiled calls took about as long as the timed ones.
profile_fits = bench.band_verdict(profiled_ms, tao_ms, band=0.3) == "no clear difference"
print(f"{PROFILED_CALLS} warm compiled torchao dyn-act calls, profiled: {profiled_ms:.2f} ms per call against the "
      f"timed median {tao_ms:.2f} ms; per call, int8 products {int_mm_ms:.2f} ms, Inductor's generated code around "
      f"them {generated_ms:.2f} ms, the rest {rest_ms:.2f} ms")
if not profile_fits:
    print("the profiled calls and the timed ones differ by more than a factor of 1.3, so this split does not explain "
          "the table here" + (busy_note + ": rerun when the machine is quiet" if busy_note else ": rerun the cell"))
else:
    print("the profiled calls fit the timed median (within a factor of 1.3): the split can be read")
# torchao's CPU int8 product picks its route from the real CPU (not from a CPU profile): with VNNI and no AMX on
# torch 2.12 or newer, it shifts the activations to unsigned and subtracts a correction that sums each output
# channel's int8 weights on every call (torchao.kernel.intmm._int_scaled_matmul_cpu).
import torchao.utils as tao_utils

u8s8 = (hasattr(tao_utils, "_cpu_is_vnni_supported") and tao_utils._cpu_is_vnni_supported()
        and not tao_utils._cpu_is_amx_tile_supported() and compat.torch_version() >= (2, 12))
print("torchao's int8 product route here: " + (
    "u8s8 (this CPU has AVX-512 VNNI and no AMX"
    + (f"; read from the real CPU, whatever CPU profile {cpu_facts.profile} caps" if cpu_facts.profile else "")
    + "): besides quantizing each activation row and rescaling, every call sums each output channel's int8 weights "
    "(one sum per row of the (out, in) weight), a full pass over the weights, inside the generated code"
    if u8s8 else "s8s8: the product alone, with the quantize and rescale steps around it"))

tao_word = mlp_table.verdict("torchao int8 dyn-act, compiled", "fp32 eager")  # recorded above, as ...vs_fp32_eager
compile_word = mlp_table.verdict("torchao int8 dyn-act, compiled", "torchao int8 dyn-act, eager",
                                 name="quant.mlp.torchao_dyn_act_compiled.vs_eager")
print(f"compiling the torchao dyn-act MLP: "
      f"{mlp_table.describe('torchao int8 dyn-act, compiled', 'torchao int8 dyn-act, eager')}"
      + ("" if compile_word != "slower" else
         f" (the generated code took {generated_ms:.2f} ms per profiled call and the products {int_mm_ms:.2f} ms, "
         f"against the eager call's {mlp_table.row('torchao int8 dyn-act, eager').median_s * 1e3:.2f} ms median; this "
         "notebook does not profile the eager call's parts)" if profile_fits else
         " (the profile does not fit the timing, so this cell cannot say why)"))
gemm_words = {"faster": "faster than", "slower": "slower than", "no clear difference": "not clearly different from"}
rank = {"slower": 0, "no clear difference": 1, "faster": 2}  # to tell which of two verdicts is the better one
eager_dyn_ms = mlp_table.row("torchao int8 dyn-act, eager").median_s * 1e3
fp32_eager_ms = mlp_table.row("fp32 eager").median_s * 1e3
around_ms = generated_ms + rest_ms
if tao_word == int8_gemm:
    why_not = ""
elif not profile_fits:
    why_not = " (the profile above does not fit the timing, so this cell cannot say why)"
elif compile_word == "slower" and generated_ms > eager_dyn_ms:
    why_not = (" (compiling made these layers slower than running them eagerly here: in the profiled calls above the "
               f"code Inductor generated in place of the eager operators around the products (quantize, rescale and, on the "
               f"u8s8 route, the weight sums) took {generated_ms:.2f} ms "
               f"per call alone, more than the whole eager call's {eager_dyn_ms:.2f} ms median, while the products took "
               f"{int_mm_ms:.2f} ms" + busy_note + ")")
elif rank[tao_word] < rank[int8_gemm]:
    why_not = (f" (per profiled call the int8 products took {int_mm_ms:.2f} ms and the work around them {around_ms:.2f} ms, "
               f"against fp32 eager's {fp32_eager_ms:.2f} ms median: "
               + ("the work around the products took longer than the products"
                  if around_ms > int_mm_ms else "the products themselves took most of each call") + ")")
else:
    why_not = (" (the bare product measured earlier has the shape of the MLP's first layer only; this notebook does "
               "not profile why the whole MLP fared better)")
print(f"\ntorchao's int8 layer rides on that product: the bare int8 GEMM measured earlier was {gemm_words[int8_gemm]} "
      f"fp32 on this CPU, and the compiled torchao MLP was {gemm_words[tao_word]} fp32 eager" + why_not)

# %% [markdown]
# The operator lists above say what each int8 variant calls. torch.ao's deprecated layers call
# FBGEMM's `quantized::linear_dynamic`, one fused call that quantizes the activation and runs
# FBGEMM's own int8 kernels, which exist for AVX2 and for AVX-512 (with VNNI where present).
# torchao's dynamic layers quantize each activation row and then call `torch._int_mm`: their speed
# rests on the bare int8 product measured before, plus the steps around it: quantizing each
# activation row, rescaling, and on some CPUs (the route line above says) a per-call sum over each
# int8 weight. `torch.compile` can fuse those steps (uncompiled, they run one small operator at a
# time). The profiled split above says where a compiled call's time went, and the line under it
# says whether that split fits the timed median at all. Whether compiling paid for these layers on this machine, the
# compiled-against-eager line above says.
#
# Weight-only quantization keeps the arithmetic in float. In torchao 0.18 (the version the course
# pins; the setup cell printed yours), `Int8WeightOnlyConfig` on a CPU converts the whole int8
# weight to a float copy on every call, eager or compiled, runs the ordinary float matmul and scales
# its output. Like `Int8Linear`, it reads the int8 weight and then writes and reads a float one, so
# it adds work to every call unless a dedicated weight-only kernel exists for your hardware. The
# verdicts above say how that came out here.
#
# Two more facts hide in those layers. torch.ao's dynamic Linear passes `reduce_range=True` to
# `quantized::linear_dynamic`: the activations are quantized to 7 bits, not 8, to keep the 16-bit
# pair sums of AVX2 from saturating. That can cost torch.ao some quality. The final table shows
# torch.ao's whole loss, which mixes the 7-bit activations with the int8 weights; nothing here
# separates the two. And the other
# torchao configurations may not run on this machine; the next cell tries each and prints what the
# library says:
#

# %%
from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig

for config_cls in (Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig):
    probe = nn.Sequential(nn.Linear(256, 256))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(probe, config_cls())
            probe(torch.randn(4, 256))
        print(f"{config_cls.__name__}: ran here")
    except Exception as err:  # what the library reports on this machine
        print(f"{config_cls.__name__}: {type(err).__name__}: {str(err).splitlines()[0]}")


# %% [markdown]
# ## ONNX Runtime quantization
#
# ONNX Runtime has its own quantization tools, which rewrite an ONNX file. **Dynamic** quantization
# (`onnxruntime.quantization.quantize_dynamic`) stores the weights of `MatMul` (and embedding
# `Gather`) nodes as int8 and inserts `DynamicQuantizeLinear` nodes that quantize activations at
# run time, feeding `MatMulInteger`. First export MiniLM to ONNX with the `torch.export`-based
# exporter (`dynamo=True`), with batch and sequence length dynamic:

# %%
def ort_session(path) -> ort.InferenceSession:
    """Return a CPU session using as many threads as torch does (a fair comparison)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    # Idle pool threads sleep instead of spinning, as torch's do here (notebook 07 measures why).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OrtEncoder:
    """Call an ONNX MiniLM like the torch module: (ids, mask) tensors in, a tensor out."""

    def __init__(self, path) -> None:
        self.session = ort_session(path)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        return torch.from_numpy(self.session.run(None, feeds)[0])


ids_small, mask_small = mini.tokenize(texts[:2])
batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=256)
minilm_onnx = BUILD / "minilm_fp32.onnx"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # exporter notes about transformers internals
    torch.onnx.export(mini.model, (ids_small, mask_small), str(minilm_onnx), dynamo=True,
                      external_data=False, verbose=False,
                      input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
                      dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
ort_fp32 = OrtEncoder(minilm_onnx)
with torch.inference_mode():
    torch.testing.assert_close(ort_fp32(ids_small, mask_small), mini.model(ids_small, mask_small),
                               rtol=1e-4, atol=1e-5)
print(f"{minilm_onnx.name}: {size.serialized_bytes(minilm_onnx) / 1e6:.1f} MB, matches torch within 1e-4")


# %%
class quiet_logging:
    """Silence logging inside a with-block (ONNX Runtime's quantizer logs a generic tip each call)."""

    def __enter__(self):
        logging.disable(logging.WARNING)

    def __exit__(self, *exc):
        logging.disable(logging.NOTSET)


def ort_quantize_dynamic(src, name: str, per_channel: bool):
    dst = BUILD / name
    with quiet_logging():
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
    return dst


minilm_int8_tensor = ort_quantize_dynamic(minilm_onnx, "minilm_int8_per_tensor.onnx", per_channel=False)
minilm_int8_channel = ort_quantize_dynamic(minilm_onnx, "minilm_int8_per_channel.onnx", per_channel=True)

ops = Counter(node.op_type for node in onnx.load(str(minilm_int8_channel)).graph.node)
print("quantized graph:", {op: ops[op] for op in ("MatMulInteger", "DynamicQuantizeLinear", "MatMul", "Gather")})
ort_quality = {}
for label, path in (("per tensor (the default)", minilm_int8_tensor), ("per channel", minilm_int8_channel)):
    cos, agree = embedding_quality(OrtEncoder(path))
    ort_quality[label] = cos
    print(f"ORT dynamic int8, {label:<24}: {size.serialized_bytes(path) / size.serialized_bytes(minilm_onnx):.3f}x "
          f"the fp32 file, mean cosine {cos:.4f}, top-3 agreement {agree:.0%}")
assert ort_quality["per channel"] > ort_quality["per tensor (the default)"]

# %% [markdown]
# The default, `per_channel=False`, gives one scale per weight matrix, and on this model that
# costs quality (asserted above); `per_channel=True` is the switch to remember. Against torchao
# (see the final table), one difference left is the activations: ONNX Runtime's `DynamicQuantizeLinear` uses one
# scale for a whole activation tensor (asymmetric uint8), while torchao's dynamic configuration
# uses one scale per row, that is per token.
#
# The int8 file is about a quarter of the fp32 one because the quantizer also stored the token
# embedding table (the `Gather`) in int8. In MiniLM that table is about half of all parameters:

# %%
emb_params = sum(m.weight.numel() for m in mini.model.modules() if isinstance(m, nn.Embedding))
lin_params = sum(m.weight.numel() for m in linears.values())
total = size.count_parameters(mini.model)
print(f"embeddings: {emb_params / total:.0%} of parameters; Linear weights: {lin_params / total:.0%}")
print("so quantizing only the Linear layers can at best bring the model to about "
      f"{(total - lin_params * 0.75) / total:.2f}x its fp32 size")

# %% [markdown]
# That is why the torchao variants in the final table also quantize the embeddings, with
# `IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))` (one scale per token's
# row) applied only to `nn.Embedding` through `quantize_`'s `filter_fn`.
#
# ## FP8: 8-bit floats
#
# Newer GPUs (compute capability 8.9 and up: Ada, Hopper, Blackwell) multiply 8-bit *floats*.
# PyTorch has the two standard formats as dtypes: **e4m3fn** (4 exponent bits, 3 mantissa bits,
# no infinities) for weights and activations, and **e5m2** (the range of float16, fewer steps)
# mostly for gradients. Their ranges are tiny next to float32:

# %%
print(f"{'dtype':<22} {'bits':>4} {'max':>12} {'smallest normal':>15} {'eps':>8}")
for dt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16):
    print(finfo_row(dt))

x = torch.randn(100_000)
for dt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16):
    rel = ((x.to(dt).float() - x).abs() / x.abs()).median().item()
    print(f"cast of N(0, 1) samples to {str(dt):<20} median relative error {rel:.4f}")
big = torch.tensor([300.0, 448.0, 500.0, 1000.0])
big_cast = big.to(torch.float8_e4m3fn).float()
print(f"casting {big.tolist()} to e4m3fn gives {big_cast.tolist()}")
e4m3_max = torch.finfo(torch.float8_e4m3fn).max
beyond = big_cast[big > e4m3_max]
assert bool((beyond.isnan() | (beyond == e4m3_max)).all())  # older torch releases give NaN, newer ones saturate
print(f"values beyond the maximum, this torch ({torch.__version__}): "
      + (f"saturates them to the maximum, {e4m3_max:g}" if bool((beyond == e4m3_max).all())
         else "turns them into NaN (e4m3fn has no infinity)"))


# %% [markdown]
# With only 3 mantissa bits, e4m3fn rounds to within a few percent, and values beyond its maximum
# are lost: depending on the torch release, the cast saturates them to 448 or turns them into NaN
# (the line above says which this one does). So FP8 is always *scaled*:
# divide the tensor by `amax / 448` first so it fills the format's range, and keep that float
# scale next to the FP8 data, just as int8 keeps its scale. `torch._scaled_mm` multiplies two FP8
# matrices and applies both scales in one kernel (a private API, the one torchao's float8 layers
# call). Recent torch builds also implement it on the CPU, which is handy to check the arithmetic
# (it says nothing about FP8 speed); the next cell tries it, and says so if this build has none:

# %%
def to_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (t scaled into float8_e4m3fn, the float32 scale with t ≈ fp8.float() * scale)."""
    scale = t.abs().amax().float().clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (t / scale).to(torch.float8_e4m3fn), scale


a, b = torch.randn(64, 128) * 30, torch.randn(32, 128) * 0.01  # b like a (out, in) weight
a8, sa = to_fp8(a)
b8, sb = to_fp8(b)
reference = a @ b.T
try:
    # _scaled_mm wants the first operand row-major and the second column-major: b8.t() is.
    out = torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    err = ((out - reference).norm() / reference.norm()).item()
    print(f"FP8 scaled matmul on the CPU: relative error {err:.4f} against fp32")
    assert err < 0.1
except RuntimeError as e:  # older torch releases implement _scaled_mm on CUDA only
    print(f"torch._scaled_mm is not available on the CPU in torch {torch.__version__}: {str(e).splitlines()[0]}")

# %%
# NVIDIA only: AMD GPUs under ROCm have FP8 too, but which of the two formats (e4m3fn here, or the
# "fnuz" variants) each generation multiplies differs, so the cell skips there rather than guess.
if requires_cuda("FP8 torch._scaled_mm against a bf16 matmul, compute capability >= 8.9", allow_rocm=False):
    cc = torch.cuda.get_device_capability()
    if cc < (8, 9):
        skip_cell(f"this GPU is sm_{cc[0]}{cc[1]}; FP8 matmul needs compute capability 8.9 or newer")
    else:
        n = config.pick(2048, 8192)
        a_gpu = torch.randn(n, n, device="cuda")
        w_gpu = torch.randn(n, n, device="cuda") * 0.02
        a8_gpu, sa_gpu = to_fp8(a_gpu)
        w8_gpu, sw_gpu = to_fp8(w_gpu)
        a_bf16, w_bf16 = a_gpu.bfloat16(), w_gpu.bfloat16()

        def bf16_mm():
            return a_bf16 @ w_bf16.T

        def fp8_mm():  # both operands quantized in advance: the multiply alone
            return torch._scaled_mm(a8_gpu, w8_gpu.t(), scale_a=sa_gpu, scale_b=sw_gpu, out_dtype=torch.bfloat16)

        def fp8_mm_quantizing_a():  # what inference pays: activations arrive in bf16 on every call
            a8_now, sa_now = to_fp8(a_bf16)
            return torch._scaled_mm(a8_now, w8_gpu.t(), scale_a=sa_now, scale_b=sw_gpu, out_dtype=torch.bfloat16)

        ref_gpu = a_gpu @ w_gpu.T
        fp8_err = ((fp8_mm().float() - ref_gpu).norm() / ref_gpu.norm()).item()
        print(f"FP8 relative error vs fp32: {fp8_err:.4f}")
        assert fp8_err < 0.1
        gpu_table = bench.compare({"bf16 matmul": bf16_mm, "fp8 _scaled_mm": fp8_mm,
                                   "fp8, quantizing a each call": fp8_mm_quantizing_a}, device="cuda")
        print(gpu_table)
        print(f"{n}x{n}, the multiply alone: FP8 is "
              f"{gpu_table.describe('fp8 _scaled_mm', 'bf16 matmul', name='quant.gpu.fp8_vs_bf16')}")
        print(f"{n}x{n}, quantizing the activations on each call as inference must: FP8 is "
              f"{gpu_table.describe('fp8, quantizing a each call', 'bf16 matmul')}")

# %% [markdown]
# ## A CNN: the digits classifier
#
# Transformers are mostly Linear layers; convolutional networks are mostly convolutions, which
# torchao's int8 configurations do not cover (they target Linear layers). For a CNN on a CPU the
# usual tool is ONNX Runtime, and the choice that matters is **dynamic** against **static**
# quantization. Static quantization runs calibration data through the model once to fix the
# activation scales in advance, so no scale is computed at run time and the quantize and
# dequantize steps can be fused into the integer convolutions.
#
# First a small residual CNN (`course_utils.models.SmallResNet`) trained briefly on the 8×8 digits:

# %%
torch.manual_seed(0)
train_loader, test_loader = digits_loaders(batch_size=64)
cnn = SmallResNet(width=32)
optimizer = torch.optim.AdamW(cnn.parameters(), lr=3e-3)
epochs = config.pick(quick=2, full=6)
for epoch in tqdm(range(epochs), desc="training"):
    cnn.train()
    for images, labels in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(cnn(images), labels).backward()
        optimizer.step()
cnn.eval()

x_test = torch.cat([images for images, _ in test_loader])
y_test = torch.cat([labels for _, labels in test_loader])
x_calib = torch.cat([images for images, _ in train_loader])[:512]  # calibration: training images only


def accuracy(fn) -> float:
    with torch.inference_mode():
        return (fn(x_test).argmax(dim=1) == y_test).float().mean().item() * 100


acc_fp32 = accuracy(cnn)
print(f"fp32 test accuracy after {epochs} epochs: {acc_fp32:.2f}%  ({len(y_test)} test images)")
assert acc_fp32 > 90

# %%
digits_onnx = BUILD / "digits_fp32.onnx"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(cnn, (x_test[:8],), str(digits_onnx), dynamo=True, external_data=False,
                      verbose=False, input_names=["image"], output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))


class CalibrationImages(CalibrationDataReader):
    """Feeds calibration batches to ONNX Runtime's static quantizer."""

    def __init__(self, images: torch.Tensor, batch_size: int = 64) -> None:
        self.batches = iter(images.split(batch_size))

    def get_next(self):
        batch = next(self.batches, None)
        return None if batch is None else {"image": batch.numpy()}


digits_dyn = ort_quantize_dynamic(digits_onnx, "digits_int8_dynamic.onnx", per_channel=True)


def ort_quantize_static(name: str, reduce_range: bool):
    """Static QDQ int8: uint8 activations, int8 per-channel weights (7-bit ones with reduce_range)."""
    dst = BUILD / name
    with quiet_logging():
        quantize_static(str(digits_onnx), str(dst), CalibrationImages(x_calib),
                        quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce_range,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return dst


digits_static = ort_quantize_static("digits_int8_static_qdq.onnx", reduce_range=True)
digits_static_full = ort_quantize_static("digits_int8_static_qdq_fullrange.onnx", reduce_range=False)
for path in (digits_dyn, digits_static):
    ops = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    print(f"{path.name}: {dict(ops.most_common(5))}")
    # The nodes the text below talks about, whether or not they are among the five most common:
    print("  " + ", ".join(f"{op} {ops[op]}" for op in
                           ("DynamicQuantizeLinear", "ConvInteger", "QuantizeLinear", "DequantizeLinear", "Conv")))
# What ONNX Runtime makes of the static file when a session loads it: the session can write the graph it
# optimised, where each DequantizeLinear -> Conv -> QuantizeLinear group has become one integer convolution.
static_convs = Counter(node.op_type for node in onnx.load(str(digits_static)).graph.node)["Conv"]
fused_opts = ort.SessionOptions()
fused_opts.log_severity_level = 3  # the optimised file is specific to this CPU: no warning needed
fused_opts.optimized_model_filepath = str(BUILD / "digits_int8_static_optimised.onnx")
ort.InferenceSession(str(digits_static), sess_options=fused_opts, providers=["CPUExecutionProvider"])
fused = Counter(node.op_type for node in onnx.load(fused_opts.optimized_model_filepath).graph.node)
(BUILD / "digits_int8_static_optimised.onnx").unlink()  # only needed for counting
print(f"{digits_static.name} as ONNX Runtime runs it: " + ", ".join(
    f"{op} {fused[op]}" for op in ("QLinearConv", "Conv", "QuantizeLinear", "DequantizeLinear"))
      + f" ({static_convs} Conv nodes in the file)")
if cpu_facts.cpu_class.startswith("x86"):  # ONNX Runtime's CPU provider fuses QDQ groups on x86
    assert fused["QLinearConv"] == static_convs and fused["Conv"] == 0, fused


class OrtClassifier:
    """Call an ONNX image classifier like a torch module."""

    def __init__(self, path) -> None:
        self.session = ort_session(path)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {"image": images.numpy()})[0])


# %% [markdown]
# Two static variants are built above, and the difference between them is one switch. ONNX
# Runtime's fast int8 convolutions take **unsigned** 8-bit activations and **signed** 8-bit weights
# (U8S8). On an x86 CPU without VNNI, the instruction that multiplies them, `VPMADDUBSW`, adds each
# pair of neighbouring products into a signed 16-bit lane, which tops out at 32767, and a pair of
# full-range values does not fit. `reduce_range=True` stores the weights in 7 bits, so every pair
# does fit. CPUs with VNNI (and ARM's dot products) add into 32 bits and never saturate. The
# arithmetic, checked:
#

# %%
int16_max = torch.iinfo(torch.int16).max
pair_full = 2 * 255 * 128    # two products of a uint8 activation and a full-range int8 weight
pair_reduced = 2 * 255 * 64  # the same with reduce_range's 7-bit weights, in [-64, 64]
print(f"largest pair sum: {pair_full} with 8-bit weights, {pair_reduced} with 7-bit ones; int16 holds {int16_max}")
assert pair_reduced <= int16_max < pair_full
# ONNX Runtime reads the CPU itself: a CPU profile without an emulator does not change its choice (under
# `haswell` it sees the emulated CPU).
ort_kernels = cpu.onnxruntime_kernels()
saturates_here = "can saturate" in ort_kernels
print(f"ONNX Runtime on this CPU uses {ort_kernels}: "
      + ("full-range U8S8 pairs CAN saturate here" if saturates_here
         else "full-range weights cannot saturate here")
      + (f" (ONNX Runtime reads the real CPU, not CPU profile {real_cpu_profile})" if real_cpu_profile else ""))

# %%
digits_variants = {
    "fp32 torch eager": (cnn, size.serialized_bytes(cnn)),
    "fp32 ONNX Runtime": (OrtClassifier(digits_onnx), size.serialized_bytes(digits_onnx)),
    "int8 ORT dynamic": (OrtClassifier(digits_dyn), size.serialized_bytes(digits_dyn)),
    "int8 ORT static QDQ": (OrtClassifier(digits_static), size.serialized_bytes(digits_static)),
    "int8 static, 8-bit weights": (OrtClassifier(digits_static_full), size.serialized_bytes(digits_static_full)),
}
x_batch = x_test[:256]
with torch.inference_mode():
    digits_table = bench.compare({name: fn for name, (fn, _) in digits_variants.items()}, x_batch)

print(f"{'variant':<26} {'size KB':>8} {'latency ms':>11} {'vs torch':>9} {'accuracy':>9}")
digits_acc = {}
for name, (fn, nbytes) in digits_variants.items():
    digits_acc[name] = accuracy(fn)
    row = digits_table.row(name)
    print(f"{name:<26} {nbytes / 1e3:>8.1f} {row.median_s * 1e3:>11.3f} {row.speedup:>8.2f}x {digits_acc[name]:>8.2f}%")

acc_drop = acc_fp32 - digits_acc["int8 ORT static QDQ"]
full_drop = acc_fp32 - digits_acc["int8 static, 8-bit weights"]


def change(drop: float) -> str:
    """Say an accuracy drop in percentage points, a negative drop as a gain."""
    return f"a drop of {drop:.2f} points" if drop >= 0 else f"a gain of {-drop:.2f} points"


ACC_BAND = 0.5  # percentage points: about two test images either way
print(f"\nstatic int8 (reduce_range) against fp32: {change(acc_drop)}; with full-range 8-bit weights: "
      f"{change(full_drop)}")
extra = full_drop - acc_drop
if saturates_here and extra > ACC_BAND:
    print(f"  on this CPU the full-range variant's pair sums can saturate, and it lost {extra:.2f} points more")
elif saturates_here:
    print(f"  on this CPU the full-range variant's pair sums can saturate, but no extra loss showed here (within "
          f"{ACC_BAND} points): a pair saturates only where large activations meet large weights of the same sign, "
          "and this cell does not count how often that happened, only that accuracy did not show it")
else:
    print("  on this CPU nothing saturates, so the two differ only by the 7-bit weights' coarser steps")
print("ORT static int8 (reduce_range): "
      + digits_table.describe("int8 ORT static QDQ", "fp32 ONNX Runtime", name="quant.digits.ort_static.vs_ort_fp32"))
print("ORT dynamic int8:               "
      + digits_table.describe("int8 ORT dynamic", "fp32 ONNX Runtime", name="quant.digits.ort_dynamic.vs_ort_fp32"))
print("ORT static, 8-bit weights:      " + digits_table.describe(
    "int8 static, 8-bit weights", "fp32 ONNX Runtime", name="quant.digits.ort_static_fullrange.vs_ort_fp32"))
print("fp32 ONNX Runtime:              " + digits_table.describe(
    "fp32 ONNX Runtime", "fp32 torch eager", name="quant.digits.ort_fp32.vs_torch_eager"))
fp32_onnx_kb = size.serialized_bytes(digits_onnx)
print(f"int8 files: {size.serialized_bytes(digits_dyn) / fp32_onnx_kb:.2f}x (dynamic) and "
      f"{size.serialized_bytes(digits_static) / fp32_onnx_kb:.2f}x (static) the fp32 ONNX file")
weight_share = 4 * size.count_parameters(cnn) / fp32_onnx_kb
int8_estimate = 1 - 0.75 * weight_share  # the weights at a quarter of their bytes, the rest of the file unchanged
print(f"the weights are {weight_share:.0%} of the fp32 file, so storing every weight in 8 bits, and changing "
      f"nothing else, would give {int8_estimate:.2f}x; the quantizer also rewrites the rest of the graph, "
      "so a file can land above or below that estimate")
int8_file_ratios = [size.serialized_bytes(m) / fp32_onnx_kb for m in (digits_dyn, digits_static)]
assert 0.25 < int8_estimate < 1 and min(int8_file_ratios) > 0.25  # int8 bytes plus what does not shrink
assert acc_drop <= 1.0
bench.record("quant.digits.int8.acc_drop", acc_drop, "pp", variant="onnxruntime static QDQ per-channel int8, reduce_range",
             fp32_acc=acc_fp32, epochs=epochs)
bench.bar_chart(digits_table, title="digits CNN, batch 256, CPU");

# %% [markdown]
# Read the size lines first: the int8 files stay above a quarter of the fp32 file (asserted).
# Quantization shrinks the weights, so the weights' share of the file sets roughly how far the file
# can shrink: the last line above prints that estimate for this model. Besides its weights, the file
# holds the graph and other constants that do not shrink, and the quantizer adds scales, zero points
# and nodes, and rewrites other parts of the graph, so a file can land on either side of the
# estimate: the last two lines above show the weights' share and where each int8 file landed
# against it.
#
# On speed, look at what each variant does per call. Dynamic quantization makes ONNX Runtime
# compute an activation scale before every convolution (`DynamicQuantizeLinear`) and run a generic
# integer convolution (`ConvInteger`) between float operations; the node counts printed after the
# export show how many of each the file has. Static QDQ quantization fixes the scales ahead of
# time, and ONNX Runtime fuses each `DequantizeLinear → Conv → QuantizeLinear` pattern into one
# integer convolution (`QLinearConv`, counted after the export) that keeps activations in 8 bits
# from layer to layer. The verdict lines above say
# what that was worth on this CPU. Read them with two things in mind: a call on 8×8 images does
# little arithmetic, so the fixed costs of a call weigh more here than in a larger image network;
# and whether the integer kernels gain anything at all depends on the kernels ONNX Runtime has for
# this CPU (the line on ONNX Runtime's kernels above says which), so a larger network gives them
# more work, not necessarily a gain.
#
# On accuracy: the course uses `reduce_range=True` because it is safe on every x86 CPU. If you
# quantize with full 8-bit weights, check the accuracy on the oldest CPU you deploy to: a loss from
# saturation can appear only on CPUs without VNNI (the cell above says whether it did here), so a
# model can pass on a new development machine and fail in production. (The course's test suite runs
# this model on an emulated AVX2-only CPU to check it.)
#
# ## Static int8 inside PyTorch: PT2E with `X86InductorQuantizer`
#
# ONNX Runtime's static quantization needed an ONNX file and ONNX Runtime to run it. PyTorch has a
# static flow of its own, PT2E (PyTorch 2 Export quantization), which now lives in torchao. It
# works on the graph that `torch.export` captures and hands its result to Inductor, in five steps:
#
# 1. **Capture**: `torch.export.export(model, example).module()` returns a graph of ATen operators
#    that still runs like the model. The quantizer finds a Linear layer or a convolution from the
#    record each node keeps of the module it came from. Under torch 2.11, the course's oldest
#    supported torch, the default, non-strict capture keeps that record in a form the quantizer's
#    pattern matcher cannot read, so it marks nothing; unchecked, the steps below would run without
#    an error and leave a float model. The function below counts the observers step 2 attached. If
#    there are none, it captures again with `strict=True` (TorchDynamo traces the model and writes
#    the record the matcher reads). On newer torch the default capture works. Either way, its first
#    printed line names the capture it used and how many observers it attached.
# 2. **Prepare**: `prepare_pt2e(graph, quantizer)`. The quantizer decides what gets quantized:
#    `X86InductorQuantizer` marks the patterns for which oneDNN (the x86 kernel library Inductor's
#    CPU backend calls) has int8 kernels, such as a convolution or a Linear layer with the ReLU or
#    addition after it, and `prepare_pt2e` attaches an *observer* to every tensor it marked.
# 3. **Calibrate**: run a few representative batches; each observer records its tensor's range.
# 4. **Convert**: `convert_pt2e` turns the ranges into fixed scales and zero points, stores the
#    weights in int8, and leaves a `quantize → dequantize` pair where each observer was. The graph
#    is now a *reference*: it still computes in float, with int8's rounding built in.
# 5. **Lower**: `torch.compile`. Inductor looks for `dequantize → linear → quantize` (and the same
#    around a convolution) and can replace each such pattern by one oneDNN int8 kernel.
#
# The default configuration, `get_default_x86_inductor_quantization_config()`, makes activations
# uint8 with one scale per tensor (chosen from a histogram of the calibration values) and weights
# int8 with one scale per output channel. One exception, decided from the instruction set oneDNN
# reported above (no VNNI, DL Boost or AMX in it, or none reported): without an 8-bit dot-product
# instruction, oneDNN multiplies uint8 by int8 in pairs and adds each pair in a 16-bit lane, which
# saturates when both products of a pair are large and have the same sign, so the compiled kernels
# could differ from the reference graph. There the cell asks for `reduce_range=True` (here the
# activations, not the weights as in ONNX Runtime's option): activations use 7 bits (0 to 127), and
# every pair sum fits. The MLP first, calibrated on a few batches like its input:

# %%
from torchao.quantization.pt2e.observer import ObserverBase
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)

# Two notes that are noise here: one from inside Inductor's oneDNN lowering, and the quantizer's
# remark that it leaves a max-pool in float because its input is float.
warnings.filterwarnings("ignore", message="To copy construct from a tensor")
warnings.filterwarnings("ignore", message="The input of maxpool2d is not quantized")


def observer_count(gm: torch.fx.GraphModule) -> int:
    """How many observers ``prepare_pt2e`` attached to ``gm``: 0 means the quantizer marked nothing."""
    return sum(isinstance(m, ObserverBase) for m in gm.modules())


def pt2e_int8(model: nn.Module, example: torch.Tensor, calibration, dynamic_shapes=None) -> torch.fx.GraphModule:
    """Return ``model`` quantized statically to int8 by PT2E, calibrated on the batches in ``calibration``."""
    # without an int8 dot-product instruction, 7-bit activations keep oneDNN's 16-bit pair sums from saturating
    quant_config = get_default_x86_inductor_quantization_config(reduce_range=not onednn_dot)
    for strict in (False, True):
        graph = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes, strict=strict).module()  # 1.
        prepared = prepare_pt2e(graph, X86InductorQuantizer().set_global(quant_config))  # 2. observers attached
        if observer_count(prepared):
            break
        if not strict:
            print(f"torch {torch.__version__}: the quantizer marked nothing in the non-strict capture; "
                  "capturing again with strict=True")
    assert observer_count(prepared), "the quantizer marked nothing: the model would stay float"
    print(f"capture: {'strict' if strict else 'non-strict (the default)'}; "
          f"{observer_count(prepared)} observers attached")
    with torch.no_grad():
        for batch in calibration:  # 3. the observers record value ranges
            prepared(batch)
    return convert_pt2e(prepared)  # 4. fixed scales, int8 weights, quantize/dequantize pairs


torch.manual_seed(1)
mlp_calibration = [torch.randn(16, 1024) for _ in range(4)]  # drawn like x_mlp, but not x_mlp itself
mlp_pt2e = pt2e_int8(mlp, x_mlp, mlp_calibration)

graph_ops = Counter(str(n.target).split(".")[1] for n in mlp_pt2e.graph.nodes if n.op == "call_function")
print("operators in the converted graph:", dict(graph_ops))


def graph_tensor(gm: torch.fx.GraphModule, target: str) -> torch.Tensor:
    """Return the tensor a ``get_attr`` node reads; its target may be dotted ("0.bias")."""
    owner, _, leaf = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, leaf)


int8_tensors = {n.target: tuple(graph_tensor(mlp_pt2e, n.target).shape) for n in mlp_pt2e.graph.nodes
                if n.op == "get_attr" and graph_tensor(mlp_pt2e, n.target).dtype == torch.int8}
print("int8 tensors it reads:", int8_tensors)
with torch.inference_mode():
    reference_out = mlp_pt2e(x_mlp)
    pt2e_err = ((reference_out - mlp(x_mlp)).norm() / mlp(x_mlp).norm()).item()
PT2E_ERR_MAX = 0.05  # asserted below: int8 with calibrated scales keeps this MLP's output within 5%
print(f"relative error of the reference int8 graph against fp32: {pt2e_err:.4f} (the cell asserts it stays "
      f"below {PT2E_ERR_MAX}: {pt2e_err / PT2E_ERR_MAX:.0%} of that limit)")
assert graph_ops["quantize_per_tensor"] == graph_ops["linear"] == 2 and len(int8_tensors) == 2
assert pt2e_err < PT2E_ERR_MAX


# %% [markdown]
# Before timing anything, check what a file of this model would hold. `size.serialized_bytes`
# saves a module's `state_dict`, and the module `convert_pt2e` returns can hold more than its graph
# reads. The cell lists what no node of the graph reads, then drops it:

# %%
def unread_tensors(gm: torch.fx.GraphModule) -> list[str]:
    """Return the names of the parameters and buffers of ``gm`` that no node of its graph reads."""
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    held = [name for name, _ in gm.named_parameters()] + [name for name, _ in gm.named_buffers()]
    return [name for name in held if name not in read]


def drop_unread(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Delete (in place) the parameters and buffers no node reads; return ``gm``."""
    for name in unread_tensors(gm):
        owner, _, leaf = name.rpartition(".")
        delattr(gm.get_submodule(owner) if owner else gm, leaf)
    return gm


unread = unread_tensors(mlp_pt2e)
held_bytes = size.serialized_bytes(mlp_pt2e)
print(f"tensors held but never read: {unread} ({', '.join(str(mlp_pt2e.get_parameter(n).dtype) for n in unread)})")
drop_unread(mlp_pt2e)
pt2e_mlp_bytes = size.serialized_bytes(mlp_pt2e)
print(f"serialized: {held_bytes / 1e6:.2f} MB as converted, {pt2e_mlp_bytes / 1e6:.2f} MB with only what the graph "
      f"reads; fp32 MLP {mlp_bytes / 1e6:.2f} MB, so {mlp_bytes / pt2e_mlp_bytes:.2f}x smaller")
with torch.inference_mode():
    torch.testing.assert_close(mlp_pt2e(x_mlp), reference_out, rtol=0, atol=0)  # dropping them changed nothing
assert not unread_tensors(mlp_pt2e) and mlp_bytes / pt2e_mlp_bytes > 3.5
bench.record("quant.pt2e.size_ratio", mlp_bytes / pt2e_mlp_bytes, "x", model="MLP 1024-4096-1024",
             scheme=f"PT2E X86InductorQuantizer {'default' if onednn_dot else 'reduce_range (7-bit activations)'}: "
                    "int8 per-channel weights, uint8 per-tensor activations",
             unread_dropped=len(unread));


# %% [markdown]
# Where that list is not empty, the module as `convert_pt2e` returns it is not what you want to
# ship: measure, and save, what the graph reads.
#
# ### The freezing switch decides which kernels run
#
# Inductor replaces the quantized patterns by oneDNN kernels in its *freezing* passes. Freezing
# treats the weights as constants, so it can pack each int8 weight into oneDNN's layout once, at
# compile time. It is off by default (`torch._inductor.config.freezing`), because a frozen graph
# must never see its weights change, which rules out training. Compile the same converted MLP both
# ways and count, in the generated code, the oneDNN int8 calls, the float matmul calls and the
# generated loops that dequantize:

# %%
def census(source: str) -> dict[str, int]:
    """Return what one generated module runs: oneDNN int8 calls, float matmul/conv calls, _int_mm calls,
    and the generated loops that dequantize something."""
    call = "\n".join(line for line in inductor_code.wrapper_call(source).splitlines()
                     if not line.strip().startswith("#"))  # code only: comments name the original ops
    return {
        "oneDNN int8": inductor_code.count(call, r"torch\.ops\.onednn\.q(?:linear|conv)\w*\."),
        "float matmul/conv": inductor_code.count(
            call, r"extern_kernels\.(?:addmm|mm|bmm|convolution)\(|torch\.ops\.(?:mkl|mkldnn)\.\w+\."),
        "_int_mm": inductor_code.count(call, r"extern_kernels\._int_mm\("),
        "dequantize loops": sum("dequantize" in name for name in inductor_code.kernel_calls(source)),
    }


mlp_census = {}
for freezing in (False, True):
    with torch._inductor.config.patch(freezing=freezing), torch.inference_mode():
        compiled = torch.compile(mlp_pt2e)
        out, sources = inductor_code.generated_code(compiled, x_mlp)  # resets Dynamo, then compiles
    assert len(sources) == 1
    torch.testing.assert_close(out, reference_out, rtol=0.05, atol=0.02)  # right answers either way
    mlp_census[freezing] = census(sources[0])
    print(f"freezing {'on ' if freezing else 'off'}: {mlp_census[freezing]}")
mlp_pt2e_frozen = compiled  # the frozen one, kept for the timing below
n_linear = sum(isinstance(m, nn.Linear) for m in mlp.modules())
if cpu_facts.cpu_class.startswith("x86"):  # the rewrite is oneDNN's, the same on every x86 CPU class
    assert mlp_census[False]["oneDNN int8"] == 0 and mlp_census[False]["float matmul/conv"] == n_linear
    assert mlp_census[True]["oneDNN int8"] == n_linear and mlp_census[True]["float matmul/conv"] == 0
    print(f"freezing off: {n_linear} float matmuls, after {mlp_census[False]['dequantize loops']} generated loops "
          f"that dequantize; freezing on: {n_linear} oneDNN int8 Linear kernels and no float matmul")
else:
    print(f"on {cpu_facts.cpu_class} the counts above are this platform's: X86InductorQuantizer targets x86 CPUs")

# %% [markdown]
# Without freezing, the compiled model does exactly what the reference graph does: generated loops
# turn the int8 weights back into float on every call and the matmuls run in float. Nothing
# complains, the outputs are right, and the int8 kernels you quantized for never run. So turn
# freezing on for inference, for the whole process in a deployment script
# (`torch._inductor.config.freezing = True`: the setting is read whenever a graph compiles,
# including a recompile for a new input shape), and check the generated code as above.
#
# ### Speed, compared like with like
#
# The int8 MLP runs frozen, so the fair baselines are compiled with freezing too: fp32 compiled,
# and torchao's dynamic int8 MLP from earlier. Compiling does not always make the fp32 MLP faster
# than eager, so fp32 eager stays in the table, the cell says how the two fp32 rows compare, and the
# reason it gives for PT2E's result is set against whichever fp32 row was clearly faster (fp32 eager
# when the two are not clearly different). The census lines say what each compiled variant runs. Each variant
# must compute what fp32 computes, within int8's rounding (twice as coarse with 7-bit activations);
# one exception is named where it happens: torchao's dynamic MLP was quantized with its default
# full 8-bit activations (its config has a `reduce_range` switch too), so on an x86 CPU without an
# int8 dot-product instruction the cell prints how far its frozen version lands from fp32 instead
# of asserting.

# %%
pt2e_label = "PT2E int8, compiled (freezing)"
frozen_mlps = {}
if not config.is_quick():  # two more compiles: quick mode compares with fp32 eager only
    with torch._inductor.config.patch(freezing=True), torch.inference_mode():
        frozen_mlps = {"fp32 compiled (freezing)": torch.compile(copy.deepcopy(mlp)),
                       "torchao int8 dyn-act, compiled (freezing)": torch.compile(copy.deepcopy(mlp_dyn))}
        for label, fn in frozen_mlps.items():
            _, sources = inductor_code.generated_code(fn, x_mlp)
            print(f"{label:<42} {census(sources[0])}")
print(f"{pt2e_label:<42} {mlp_census[True]}")
pt2e_mlp_variants = {"fp32 eager": mlp, **frozen_mlps, pt2e_label: mlp_pt2e_frozen}
unasserted_gap = {}  # label -> (largest difference from fp32, within the others' tolerance?), where not asserted
with torch._inductor.config.patch(freezing=True), torch.inference_mode():
    for label, fn in pt2e_mlp_variants.items():  # generated_code reset Dynamo: these calls recompile, frozen
        if onednn_dot or "torchao" not in label or not cpu_facts.cpu_class.startswith("x86"):
            # 7-bit activations (reduce_range, on a CPU without VNNI) double the rounding step: a wider atol
            torch.testing.assert_close(fn(x_mlp), mlp(x_mlp), rtol=0.05, atol=0.02 if onednn_dot else 0.04)
        else:  # torchao's dynamic activations use all 8 bits, and frozen they run in oneDNN's int8 kernels
            out_here = fn(x_mlp)
            gap = (out_here - mlp(x_mlp)).abs().max().item()
            unasserted_gap[label] = (gap, torch.allclose(out_here, mlp(x_mlp), rtol=0.05, atol=0.04))
            print(f"{label}: up to {gap:.3f} from fp32 here (not asserted: no int8 dot-product instruction, "
                  "and the only variant with full 8-bit activations, whose 16-bit pair sums can saturate)")
    pt2e_mlp_table = bench.compare(pt2e_mlp_variants, x_mlp)
print()
print(pt2e_mlp_table)
for other, key in (("fp32 eager", "vs_fp32_eager"), ("fp32 compiled (freezing)", "vs_fp32_compiled"),
                   ("torchao int8 dyn-act, compiled (freezing)", "vs_torchao_dyn_act")):
    if other in pt2e_mlp_variants:
        print(f"PT2E int8 MLP: {pt2e_mlp_table.describe(pt2e_label, other, name=f'quant.pt2e.mlp.{key}')}")
torchao_frozen = "torchao int8 dyn-act, compiled (freezing)"
if torchao_frozen in pt2e_mlp_variants:
    print("why, against torchao's dynamic MLP: the census above counts the int8 calls each runs, not which of "
          "oneDNN's kernels ran; PT2E quantized the activations with scales fixed at calibration (unsigned, "
          + ("8-bit" if onednn_dot else "7-bit on this CPU") + "), "
          "torchao quantizes them per row on every call (signed 8-bit), so besides that per-call work the two can "
          "take different int8 kernels, "
          + {"faster": "and this notebook does not profile which of the two accounts for the gap",
             "no clear difference": "and neither showed as a clear difference here",
             "slower": "so the difference lies elsewhere (compare the census lines)"}[
              pt2e_mlp_table.verdict(pt2e_label, torchao_frozen)])
    if torchao_frozen in unasserted_gap:
        gap, within = unasserted_gap[torchao_frozen]
        print(f"(and torchao's frozen MLP was up to {gap:.3f} from fp32 here, "
              + ("within the tolerance the others were held to (rtol 0.05, atol 0.04) after all)" if within else
                 "outside the tolerance the others were held to (rtol 0.05, atol 0.04): a timing of what it ran, "
                 "not a like-for-like baseline)"))
if config.is_quick():
    print("(quick mode: the compiled fp32 and torchao baselines are left out; the full run compares with them)")
pt2e_base = "fp32 eager"  # the reason below is given against the faster fp32 row (eager on a tie)
if frozen_mlps:
    fp32_frozen = "fp32 compiled (freezing)"
    fp32_word = pt2e_mlp_table.verdict(fp32_frozen, "fp32 eager")
    print(f"{fp32_frozen} is {pt2e_mlp_table.describe(fp32_frozen, 'fp32 eager')}" + {
        "faster": "",
        "no clear difference": "; the reason below is given against fp32 eager",
        "slower": (": compiling the fp32 MLP with freezing made it slower here, so PT2E's ratio against it "
                   "overstates what int8 gained; the reason below is given against fp32 eager")}[fp32_word])
    if fp32_word == "faster":
        pt2e_base = fp32_frozen
pt2e_word = pt2e_mlp_table.verdict(pt2e_label, pt2e_base)  # recorded above
print(f"why, against {pt2e_base}: " + {
    "faster": (f"oneDNN's int8 kernels on this CPU (oneDNN: {route['isa']}) "
               + ("do several 8-bit multiply-adds per instruction" if onednn_dot else
                  "have no 8-bit dot-product instruction; their 16-bit pair sums still put more products into one "
                  "instruction than a float32 multiply-add does, though adding them up takes further instructions")
               + ("; they also read a quarter of the weight bytes, but the single-layer timing above found that layer "
                  "not limited by memory here, so that is not what made the difference" if mem_word == "lower" else
                  "; they also read a quarter of the weight bytes")
               + "; this cell does not time the kernels' parts"),
    "no clear difference": "no clear difference at batch 16 here; this cell does not time the int8 kernels' parts",
    "slower": f"oneDNN's int8 kernels on this CPU (oneDNN: {route['isa']}) "
              + ("cost more than the float ones they replace" if onednn_dot else
                 "have no 8-bit dot-product instruction: 16-bit pair sums, more instructions per multiply-add"),
}[pt2e_word])
if real_cpu_profile and onednn_dot and not cpu_facts.int8_dot:
    print(f"(CPU profile {real_cpu_profile}: oneDNN reads the real CPU, so these int8 timings are not "
          "an AVX2-only CPU's)")
elif real_cpu_profile:
    print(f"(CPU profile {real_cpu_profile}: oneDNN reads the real CPU, while the fp32 baselines' generated code "
          "is capped by the profile)")
elif cpu_facts.profile:
    print(f"(CPU profile {cpu_facts.profile}: every library sees the emulated CPU)")

# %% [markdown]
# With freezing on, torchao's dynamic layers can be rewritten into oneDNN calls as well (the census
# above shows whether they were here): the freezing passes that torchao registers when its x86
# quantizer is imported also match the `torch._int_mm` pattern of dynamic quantization. What still
# differs is how the activations are quantized: PT2E fixed their scales at calibration (*static*,
# unsigned; 7-bit on a CPU without VNNI), torchao computes one per row on every call (*dynamic*,
# signed 8-bit). That is
# per-call work PT2E does not do, and it can also send the two to different oneDNN kernels: the
# census counts calls, not kernels, so it cannot say which of the two mattered. The verdict line says
# how far apart they landed here.
#
# ### The digits CNN through PT2E
#
# Convolutions are where PT2E covers what torchao's `quantize_` does not. The same five steps on the
# trained digits CNN, calibrated on the same 512 training images as ONNX Runtime's static model.
# `prepare_pt2e` also folds each BatchNorm into the convolution before it. The accuracy is
# measured twice: on the converted graph run eagerly (the reference arithmetic) and compiled.

# %%
cnn_pt2e = pt2e_int8(cnn, x_calib[:64], x_calib.split(64),
                     dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))
cnn_unread = len(unread_tensors(cnn_pt2e))
drop_unread(cnn_pt2e)
n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in cnn.modules())
bn_left = sum("batch_norm" in str(n.target) for n in cnn_pt2e.graph.nodes)
print(f"BatchNorm layers: {n_bn} in the model, {bn_left} left in the converted graph (folded into the convolutions)")
assert bn_left == 0
acc_pt2e_reference = accuracy(cnn_pt2e)
# dynamic=False: one static graph; every call below passes the whole test set, so it compiles once.
cnn_pt2e_frozen = torch.compile(cnn_pt2e, dynamic=False)
with torch._inductor.config.patch(freezing=True), torch.inference_mode():
    _, sources = inductor_code.generated_code(cnn_pt2e_frozen, x_test)
cnn_census = census(sources[0])
n_conv = sum(isinstance(m, nn.Conv2d) for m in cnn.modules())
n_cnn_linear = sum(isinstance(m, nn.Linear) for m in cnn.modules())
print(f"compiled with freezing: {cnn_census} for {n_conv} convolutions and {n_cnn_linear} Linear layer")
if cpu_facts.cpu_class.startswith("x86"):
    assert cnn_census["oneDNN int8"] == n_conv + n_cnn_linear and cnn_census["float matmul/conv"] == 0

acc_pt2e = accuracy(cnn_pt2e_frozen)
pt2e_drop = acc_fp32 - acc_pt2e
cnn_bytes, cnn_pt2e_bytes = size.serialized_bytes(cnn), size.serialized_bytes(cnn_pt2e)
print(f"accuracy: fp32 {acc_fp32:.2f}%, PT2E reference graph {acc_pt2e_reference:.2f}%, "
      f"PT2E compiled (oneDNN int8) {acc_pt2e:.2f}%: a drop of {pt2e_drop:.2f} percentage points")
print(f"size: {cnn_bytes / 1e3:.1f} KB fp32, {cnn_pt2e_bytes / 1e3:.1f} KB int8 ({cnn_unread} unread tensors dropped), "
      f"{cnn_bytes / cnn_pt2e_bytes:.2f}x smaller")
assert pt2e_drop <= 1.0
bench.record("quant.pt2e.acc_drop", pt2e_drop, "pp", model="digits SmallResNet", fp32_acc=acc_fp32,
             reference_acc=acc_pt2e_reference, calibration_images=len(x_calib), epochs=epochs);

# %%
pt2e_cnn_variants = {"fp32 torch eager": cnn, "int8 ORT static QDQ": digits_variants["int8 ORT static QDQ"][0]}
if not config.is_quick():  # compiling the fp32 CNN too costs seconds that quick mode saves
    pt2e_cnn_variants["fp32 compiled (freezing)"] = torch.compile(copy.deepcopy(cnn), dynamic=False)
pt2e_cnn_variants[pt2e_label] = cnn_pt2e_frozen
with torch._inductor.config.patch(freezing=True), torch.inference_mode():
    for fn in pt2e_cnn_variants.values():
        fn(x_test)  # warm-up (and, for the fp32 one, the compile) with freezing on
    pt2e_cnn_table = bench.compare(pt2e_cnn_variants, x_test)
print(f"digits CNN, batch {len(x_test)}")
print(pt2e_cnn_table)
for other, key in (("fp32 torch eager", "vs_fp32_eager"), ("fp32 compiled (freezing)", "vs_fp32_compiled"),
                   ("int8 ORT static QDQ", "vs_ort_static")):
    if other in pt2e_cnn_variants:
        print(f"PT2E int8 CNN: {pt2e_cnn_table.describe(pt2e_label, other, name=f'quant.pt2e.cnn.{key}')}")
if config.is_quick():
    print("(quick mode: the fp32 compiled CNN is left out; the full run compares with it too)")

# %% [markdown]
# Both static int8 paths, ONNX Runtime's QDQ model and PT2E's compiled graph, run integer
# convolutions whose outputs stay in 8 bits where the next layer takes int8 too (the census counts
# the loops that still dequantize, around the layers left in float); they differ in who fuses the
# pattern (ONNX Runtime's graph optimizer, Inductor's freezing passes) and in whose kernels run
# (MLAS, oneDNN). The verdicts above are for this CPU; the table near the end of this notebook says
# which kernels each library has for each CPU class.
#
# ## Quantization-aware training with torchao
#
# Post-training quantization (PTQ), everything so far, rounds a trained model's weights and hopes
# the network tolerates the rounding. Quantization-aware training (QAT) lets the network adapt to it:
# during a short fine-tuning, every forward pass rounds the weights exactly as the quantized model
# will ("fake" quantization: round onto the integer grid, then multiply back to float), while the
# backward pass lets the gradient through the rounding as if it were not there (the
# straight-through estimator), so the float weights keep learning. torchao runs it in two calls of
# `quantize_` around your usual training loop:
#
# - `quantize_(model, QATConfig(base_config, step="prepare"))` swaps each `nn.Linear` for a
#   `FakeQuantizedLinear` that simulates `base_config`'s rounding;
# - fine-tune as usual;
# - `quantize_(model, QATConfig(base_config, step="convert"))` swaps them back and applies
#   `base_config` for real.
#
# `QATConfig` swaps `nn.Linear` and `nn.Embedding` layers only. How much of the digits CNN is that?

# %%
cnn_linear_share = sum(m.weight.numel() for m in cnn.modules() if isinstance(m, nn.Linear)) / size.count_parameters(cnn)
print(f"the digits CNN: {cnn_linear_share:.1%} of its parameters are in Linear layers")
assert cnn_linear_share < 0.05

# %% [markdown]
# Too little to teach anything (PT2E has its own QAT flow for convolutions, `prepare_qat_pt2e`). So
# this section trains a digits classifier made of Linear layers: an MLP on the same 8×8 images,
# 64 → 128 → 128 → 10. The base configuration is `IntxWeightOnlyConfig` with one scale per output
# channel, at 4 bits (a common target for QAT) and at 2 bits (a stress test: four levels per
# weight). The comparison is fair on training: the PTQ model gets the same extra epochs of float
# fine-tuning that the QAT model gets with fake quantization, so any gain QAT shows cannot come from
# training longer.

# %%
from torchao.quantization.qat import QATConfig


def train_digits(model: nn.Module, n_epochs: int, lr: float) -> nn.Module:
    """Train ``model`` on the digits for ``n_epochs`` with AdamW; return it in eval mode."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(n_epochs):
        model.train()
        for images, labels in train_loader:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
    return model.eval()


torch.manual_seed(0)
digits_mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                           nn.Linear(128, 10))
base_epochs, tune_epochs = config.pick(quick=6, full=15), config.pick(quick=2, full=4)
train_digits(digits_mlp, base_epochs, lr=3e-3)
tuned_fp32 = train_digits(copy.deepcopy(digits_mlp), tune_epochs, lr=1e-3)  # the control: float fine-tuning
acc_mlp_fp32 = accuracy(tuned_fp32)
print(f"digits MLP, fp32: {acc_mlp_fp32:.2f}% after {base_epochs} + {tune_epochs} epochs")
assert acc_mlp_fp32 > 90

qat_rows = {}
for bits, dtype in ((4, torch.int4), (2, torch.int2)):
    base_config = IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerAxis(0))
    ptq = copy.deepcopy(tuned_fp32)
    quantize_(ptq, base_config)  # post-training: round the fine-tuned float weights
    qat = copy.deepcopy(digits_mlp)
    quantize_(qat, QATConfig(base_config, step="prepare"))
    train_digits(qat, tune_epochs, lr=1e-3)  # the same extra epochs, with the rounding simulated
    with torch.inference_mode():
        simulated = qat(x_test)
    quantize_(qat, QATConfig(base_config, step="convert"))
    with torch.inference_mode():
        converted = qat(x_test)
    torch.testing.assert_close(converted, simulated, rtol=1e-4, atol=1e-4)  # QAT trained the model convert built
    levels = qat[1].weight.qdata  # the converted weights: small integers stored one per byte
    assert -(2 ** (bits - 1)) <= levels.min() and levels.max() <= 2 ** (bits - 1) - 1
    assert levels.element_size() == 1  # one byte per value, whatever the bit width
    qat_rows[bits] = {"ptq": accuracy(ptq), "qat": accuracy(qat), "bytes": size.serialized_bytes(qat)}
assert qat_rows[4]["bytes"] == qat_rows[2]["bytes"]  # hence the same size for int4 and int2

print(f"\n{'weights':>8} {'PTQ acc':>8} {'QAT acc':>8} {'QAT - PTQ':>11} {'size vs fp32':>13}")
fp32_mlp_bytes = size.serialized_bytes(tuned_fp32)
for bits, r in qat_rows.items():
    print(f"{f'int{bits}':>8} {r['ptq']:>7.2f}% {r['qat']:>7.2f}% {r['qat'] - r['ptq']:>+9.2f}pp "
          f"{r['bytes'] / fp32_mlp_bytes:>12.2f}x")

# %%
BAND_PP = 1.0  # 1 percentage point: four or five of the test images; closer than that is noise


def pp_verdict(gain: float) -> str:
    """Return "higher", "lower" or "no clear difference" for an accuracy difference in points (band: BAND_PP)."""
    return "higher" if gain > BAND_PP else "lower" if gain < -BAND_PP else "no clear difference"


for bits, r in qat_rows.items():
    lost = bench.record_verdict(f"quant.qat.int{bits}.ptq_vs_fp32", pp_verdict(r["ptq"] - acc_mlp_fp32),
                                band_pp=BAND_PP, ptq=r["ptq"], fp32=acc_mlp_fp32)
    gained = bench.record_verdict(f"quant.qat.int{bits}.qat_vs_ptq", pp_verdict(r["qat"] - r["ptq"]),
                                  band_pp=BAND_PP, qat=r["qat"], ptq=r["ptq"])
    meaning = {"higher": "QAT recovered accuracy that PTQ lost" if lost == "lower" else "QAT did better still",
               "no clear difference": "nothing to recover" if lost != "lower" else "QAT did not recover it",
               "lower": "QAT did worse than PTQ"}[gained]
    print(f"int{bits}: PTQ accuracy vs fp32 {lost}; QAT accuracy vs PTQ {gained} "
          f"(band {BAND_PP:g} point): {meaning}")
bench.record("quant.qat.acc_recovered", qat_rows[2]["qat"] - qat_rows[2]["ptq"], "pp", bits=2,
             model="digits MLP 64-128-128-10", base_config="IntxWeightOnlyConfig per channel",
             fp32_acc=acc_mlp_fp32, ptq_acc=qat_rows[2]["ptq"], qat_acc=qat_rows[2]["qat"], tune_epochs=tune_epochs);


# %% [markdown]
# Read the rows from the top. Where post-training rounding already keeps the accuracy (the verdict
# says "no clear difference" against fp32), QAT has nothing to recover, and a few epochs of it buy
# nothing but training time. Where the rounding is coarse enough to cost accuracy, the verdicts say
# whether fine-tuning with the rounding in the loop won it back. Two more lessons sit in the table:
# the converted model computes what the fake-quantized one trained on, within rtol = atol = 1e-4
# (asserted), and the
# size column is the same for 4 and 2 bits: this configuration keeps each value in a byte of its own
# (asserted: one byte per small integer in `qdata`), whatever the bit width. Packed layouts that
# store two or four values per byte come with the kernels of specific backends (the int4 line above
# says whether it ran here and, if not, what it lacked).
#
# ## The transformer, every variant side by side
#
# Now all-MiniLM-L6-v2, with the variants of this notebook that apply to a whole transformer
# (PT2E and QAT were shown on the MLP and the digits models above). Size is the serialized state dict
# (torch variants) or the ONNX file (ONNX Runtime variants), each compared with fp32 in the same
# format; latency is a batch of 16 sentences; quality is measured on the whole retrieval set.
# Quick mode leaves out the compiled variants (compiling MiniLM takes a while). On a CPU without
# AVX-512 VNNI or AMX (AVX-VNNI alone is not enough), torchao's dynamic int8 variants run torch's
# own int8 loop (the route line near the top says which route yours takes), and then the next cell
# alone can take a minute or more (its progress bar follows the quality pass; the timing comes after it).

# %%
def torchao_minilm(linear_config) -> nn.Module:
    """Return a copy of MiniLM with Linear layers quantized by ``linear_config`` and int8 embeddings."""
    model = copy.deepcopy(mini.model)
    quantize_(model, linear_config)  # the default filter picks nn.Linear layers
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
              filter_fn=lambda module, fqn: isinstance(module, nn.Embedding))
    return model


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the torch.ao deprecation, already shown above
    minilm_ao = torch.ao.quantization.quantize_dynamic(copy.deepcopy(mini.model), {nn.Linear}, dtype=torch.qint8)

fp32_onnx_bytes = size.serialized_bytes(minilm_onnx)
minilm_variants = {  # name: (callable taking (ids, mask), serialized bytes, fp32 bytes of that format)
    "fp32 eager": (mini.model, fp32_bytes, fp32_bytes),
    "bf16 eager": (copy.deepcopy(mini.model).to(torch.bfloat16), None, fp32_bytes),
    "hand-written int8 Linear": (swap_linears(copy.deepcopy(mini.model)), None, fp32_bytes),
    "torch.ao dynamic int8 (deprecated)": (minilm_ao, None, fp32_bytes),
    "torchao int8 weight-only": (torchao_minilm(Int8WeightOnlyConfig()), None, fp32_bytes),
    "torchao int8 dyn-act": (torchao_minilm(Int8DynamicActivationInt8WeightConfig()), None, fp32_bytes),
    "ORT fp32": (ort_fp32, fp32_onnx_bytes, fp32_onnx_bytes),
    "ORT int8 dynamic per-channel": (OrtEncoder(minilm_int8_channel), size.serialized_bytes(minilm_int8_channel),
                                     fp32_onnx_bytes),
}
if not config.is_quick():
    torch._dynamo.reset()
    minilm_variants["fp32 compiled"] = (torch.compile(mini.model), fp32_bytes, fp32_bytes)
    dyn_model = minilm_variants["torchao int8 dyn-act"][0]
    minilm_variants["torchao int8 dyn-act, compiled"] = (torch.compile(dyn_model), size.serialized_bytes(dyn_model),
                                                         fp32_bytes)

rows = {}
for name, (fn, nbytes, ref_bytes) in tqdm(minilm_variants.items(), desc="quality"):
    if nbytes is None:
        nbytes = size.serialized_bytes(fn)
    cos, agree = embedding_quality(fn)  # also warms up (and compiles) each variant
    rows[name] = {"size_mb": nbytes / 1e6, "size_ratio": nbytes / ref_bytes, "cosine": cos, "agree": agree}

ids16, mask16 = mini.tokenize(retrieval.passages[:16])
with torch.inference_mode():  # every variant was warmed up (and compiled) by the quality pass
    minilm_table = bench.compare({name: v[0] for name, v in minilm_variants.items()}, ids16, mask16, warmup=1)
for name, row in rows.items():
    row["latency_ms"] = minilm_table.row(name).median_s * 1e3
    row["latency_ratio"] = 1 / minilm_table.speedup(name)
print(f"batch of 16 sentences, {ids16.shape[1]} tokens each after padding")

# %%
print(f"{'variant':<34} {'size MB':>8} {'vs fp32':>8} {'latency ms':>11} {'IQR ms':>7} {'time vs fp32 eager':>20} "
      f"{'cosine':>8} {'top-3 agree':>12}")
for name, r in rows.items():
    iqr_ms = minilm_table.row(name).iqr_s * 1e3  # the spread the verdicts below weigh
    print(f"{name:<34} {r['size_mb']:>8.1f} {r['size_ratio']:>7.2f}x {r['latency_ms']:>11.1f} {iqr_ms:>7.1f} "
          f"{r['latency_ratio']:>19.2f}x {r['cosine']:>8.4f} {r['agree']:>12.0%}")
if minilm_table.spread_note():
    print(minilm_table.spread_note())

fig, axes = plt.subplots(1, 2, figsize=(12, 0.9 + 0.42 * len(rows)), sharey=True)
names = list(rows)
axes[0].barh(names, [rows[n]["size_mb"] for n in names], color="tab:green")
axes[0].set(xlabel="serialized size (MB)", title="size")
axes[1].barh(names, [rows[n]["latency_ms"] for n in names], color="tab:blue")
axes[1].set(xlabel="median latency, batch 16 (ms)", title="latency")
axes[0].invert_yaxis()
fig.tight_layout();

# %%
int8_rows = {n: r for n, r in rows.items() if "int8" in n}
smallest = min(int8_rows, key=lambda n: int8_rows[n]["size_ratio"])
# A fast variant only counts if it keeps the quality: the fastest among those with cosine >= 0.99.
good = [n for n, r in int8_rows.items() if r["cosine"] >= 0.99]
fastest = min(good, key=lambda n: int8_rows[n]["latency_ratio"])
s = int8_rows[smallest]
print(f"smallest int8 variant: {smallest}: {s['size_ratio']:.3f}x the fp32 size, mean cosine {s['cosine']:.4f}, "
      f"top-3 agreement {s['agree']:.0%}")
print(f"fastest int8 variant with mean cosine >= 0.99: {fastest}: "
      f"{int8_rows[fastest]['latency_ratio']:.2f}x the fp32 eager latency")
runner_up = min((n for n in good if n != fastest), key=lambda n: int8_rows[n]["latency_ratio"], default=None)
if runner_up is not None:  # "fastest" by medians: is it clearly ahead of the next good one?
    print(f"  against the next good int8 variant: {fastest} is {minilm_table.describe(fastest, runner_up)}"
          + ("" if minilm_table.verdict(fastest, runner_up) == "faster" else
             ": by its median only, so on this run either could be called the fastest"))
print("int8 variants below that quality bar: " + (", ".join(n for n in int8_rows if n not in good) or "none"))


def verdict_key(variant: str) -> str:
    """Return a variant's label as one word of a verdict name: 'bf16 eager' -> 'bf16_eager'."""
    return re.sub(r"[^a-z0-9]+", "_", variant.lower()).strip("_")


int8_words = {n: minilm_table.verdict(n, "fp32 eager", name=f"quant.minilm.{verdict_key(n)}.vs_fp32_eager")
              for n in int8_rows}
for word, heading in (("faster", "FASTER than"), ("no clear difference", "not clearly different from"),
                      ("slower", "SLOWER than")):
    names = [n for n in int8_rows if int8_words[n] == word]
    print(f"int8 variants {heading} fp32 eager on this CPU: " + ("; ".join(names) or "none"))
lowest = min(rows, key=lambda n: rows[n]["cosine"])
print(f"lowest quality: {lowest} (mean cosine {rows[lowest]['cosine']:.4f}, "
      f"top-3 agreement {rows[lowest]['agree']:.0%})")
same = abs(rows["hand-written int8 Linear"]["cosine"] - rows["torchao int8 weight-only"]["cosine"])
print(f"hand-written per-channel int8 and torchao weight-only differ in mean cosine by {same:.1e} (both "
      "symmetric per-channel int8 on the Linear weights, on slightly different grids: torchao's step is "
      "max|w| / 127.5 over [-128, 127], the hand-written one max|w| / 127 over [-127, 127]; torchao's variant "
      "also stores the embedding table in int8)")

assert s["size_ratio"] <= 0.30, "the int8 model should be at most 30% of fp32"
assert s["cosine"] >= 0.99, "int8 embeddings should stay within cosine 0.99 of fp32"
bench.record("quant.minilm.int8.size_ratio", s["size_ratio"], "x", variant=smallest)
bench.record("quant.minilm.int8.cosine", s["cosine"], "cosine", variant=smallest, top3_agreement=s["agree"])
bench.record("quant.minilm.int8.latency_ratio", int8_rows[fastest]["latency_ratio"], "x", variant=fastest,
             baseline="fp32 eager", batch=16, tokens=ids16.shape[1], selection="fastest with cosine >= 0.99")
print(f"on this CPU ({cpu_facts.cpu_class}) the fastest good int8 variant is "
      f"{minilm_table.describe(fastest, 'fp32 eager', name='quant.minilm.int8_fastest_good.vs_fp32_eager')}"
      + (f" (ONNX Runtime reads the real CPU, not CPU profile {real_cpu_profile})"
         if real_cpu_profile and "ORT" in fastest else ""))
if "ORT" in fastest:  # part of that gain is ONNX Runtime's, not int8's: set it beside the same runtime's fp32 model
    print("  against ONNX Runtime's own fp32 model, the int8 part of it: "
          + minilm_table.describe(fastest, "ORT fp32", name="quant.minilm.int8_fastest_good.vs_ort_fp32"))
# The rows that are not int8 get their verdict too: a ratio in the table is not a direction on its own.
bf16_dot = any(f in cpu_facts.features for f in ("avx512_bf16", "amx_bf16", "bf16"))
why_not_int8 = {
    "bf16": ("this CPU has bf16 dot-product instructions (AVX512-BF16, AMX or Arm's BF16)" if bf16_dot else
             "this CPU has no bf16 dot-product instructions, so its bf16 matmuls widen to float32 and back")
            + (f"; read from the real CPU: oneDNN's bf16 matmuls use its instructions whatever CPU profile "
               f"{real_cpu_profile} caps" if real_cpu_profile and bf16_dot else ""),
    # What the MLP section found (same_calls, fp32_loops), not MiniLM's code, which is not inspected here
    "compiled": (("on the MLP, the generated code kept eager's library matmul calls"
                  + (" and fused the element-wise work around them" if fp32_loops else "")
                  if same_calls else "on the MLP, the generated code changed the library matmul calls")
                 + " (the MLP section); MiniLM's generated code is not inspected here" + inductor_code.scalar_note()),
    "ORT": "ONNX Runtime runs the exported graph with its own float kernels and graph fusions"
           + (f"; ONNX Runtime reads the real CPU, not CPU profile {real_cpu_profile}" if real_cpu_profile else ""),
}
for name in rows:
    if name not in int8_rows and name != "fp32 eager":
        said = minilm_table.describe(name, "fp32 eager", name=f"quant.minilm.{verdict_key(name)}.vs_fp32_eager")
        key = next((k for k in why_not_int8 if k in name), None)
        why = why_not_int8.get(key, "")
        word = minilm_table.verdict(name, "fp32 eager")
        if (key in ("compiled", "ORT") or (key == "bf16" and bf16_dot)) and word != "faster":
            # the reason says what could gain; say it did not
            why += ("; here that gained nothing measurable" if word == "no clear difference" else
                    "; here it ran slower (this notebook does not profile whether the scalar loops account for it)"
                    if key == "compiled" and inductor_code.scalar_note() else
                    "; here it ran slower all the same (this notebook does not profile why)")
        elif key == "compiled" and word == "faster":  # the reason is the MLP's; say MiniLM's was not looked into
            why += "; this notebook does not profile where MiniLM's gain came from"
        elif key == "ORT" and word == "faster":  # two possible sources of the gain, neither measured
            why += "; this notebook does not profile which of them gave the gain"
        elif key == "bf16" and not bf16_dot and word == "faster":  # the reason says what could cost; say it did not
            why += "; here it ran faster all the same (this notebook does not profile why)"
        elif key == "bf16" and not bf16_dot and word == "no clear difference":
            why += "; here that cost nothing measurable"
        print(f"{name} on this CPU: {said}" + (f" ({why})" if why else ""))
if {"torchao int8 dyn-act", "torchao int8 dyn-act, compiled"} <= set(rows):
    said = minilm_table.describe("torchao int8 dyn-act, compiled", "torchao int8 dyn-act",
                                 name="quant.minilm.torchao_dyn_act_compiled.vs_eager",
                                 against_as="the uncompiled torchao int8 dyn-act")
    print("compiling torchao's dyn-act MiniLM: the compiled model is " + said)


# %% [markdown]
# How to read this table:
#
# - **Size.** Only variants that quantize the embedding table as well as the Linear layers get
#   near a quarter of fp32; the Linear-only ones (hand-written, `torch.ao`) keep the embedding
#   table in fp32 (the size column shows where each landed).
# - **Quality.** The ranking agreement is the stricter test: swapping two near-tied passages in
#   the top 3 counts as a disagreement even when the cosine barely moves. Per-channel weight scales
#   are the usual way to stay close to fp32; `torch.ao`'s dynamic quantization uses one scale per
#   weight tensor (and per activation tensor). The quality columns show what each gave on this model.
# - **Speed.** Storing int8 is not enough. A variant can only win with integer matmul kernels
#   that are fast on *this* CPU *and* little work around them. ONNX Runtime's `MatMulInteger`
#   kernels (MLAS) have their own AVX2, AVX-512, VNNI and ARM versions. torchao's dynamic layers
#   ride on `torch._int_mm` (measured near the top) and were meant to rely on `torch.compile` to
#   fuse the steps around it; the MLP and MiniLM verdicts say whether compiling paid here. The hand-written layer and weight-only quantization dequantize
#   on every call; uncompiled torchao subclasses run their quantize and rescale steps as separate
#   small operators around each of this model's many matmuls. The verdict lines above sort the int8 variants into faster, no
#   clear difference and slower on your machine, judged against the timing spread.
#
# | CPU class (`cpu.info()`) | torch.ao dynamic (FBGEMM; 7-bit activations on every x86 CPU) | torchao dyn-act, compiled without freezing (`torch._int_mm`) | PT2E static (oneDNN, frozen) | ONNX Runtime int8 (MLAS) |
# |---|---|---|---|---|
# | x86 with AMX or AVX-512 VNNI | VNNI kernels | oneDNN's VNNI or AMX kernels | oneDNN's AMX or AVX-512 VNNI kernels | AMX or AVX-512 VNNI kernels |
# | x86 with AVX-VNNI, no AVX-512 | AVX2 kernels | torch's own plain loop | oneDNN's AVX-VNNI kernels | AVX-VNNI kernels |
# | x86 with AVX2 only | AVX2 kernels | torch's own plain loop | oneDNN's AVX2 kernels (16-bit pair sums: torchao advises `reduce_range=True` in the quantization config there) | AVX2 kernels (U8S8 pairs can saturate) |
# | ARM (`arm64`) | QNNPACK engine instead of FBGEMM | depends on the build: measure | not this quantizer: torchao has an ARM one | dot-product kernels where the core has them |
#
# With freezing on, and once torchao's x86 quantizer module has been imported (which registers the
# passes), torchao's dynamic layers are rewritten into oneDNN int8 calls too (on x86; the PT2E
# section's census counts them on yours, but it cannot tell which of oneDNN's kernels each path
# takes; that section's table times the two paths side by side).
#
# Which of these your machine gets is the first thing to check before choosing an int8 path; the
# setup cell printed your class, and `python -m course_utils cpu --probe` asks oneDNN directly.
# (Under one of the course's CPU profiles the class printed is the profile's, such as `x86-baseline`
# for `default`. Under `avx2` and `default`, oneDNN and ONNX Runtime still take the real CPU's row
# while FBGEMM is capped at AVX2; under `haswell`, every library sees the emulated AVX2 CPU.)
#
# ## Pitfalls and their fixes
#
# - **Per-tensor scales on weights with outliers.** One large weight coarsens every row. Use per
#   output channel (the default in torchao's int8 configurations; `per_channel=True` in ONNX
#   Runtime, whose default is per tensor).
# - **Counting only the Linear layers.** In small transformers the token embedding table is a
#   large share of the bytes; quantize it too (torchao `IntxWeightOnlyConfig` with a `filter_fn`
#   for `nn.Embedding`, or ONNX Runtime's `Gather` quantization).
# - **Expecting speed from storage.** Dequantize-then-float-matmul (what many first attempts write, and
#   weight-only quantization without a dedicated kernel) saves bytes and adds a dequantize step to
#   every call: it does not make the matmul cheaper. Measure.
# - **Dynamic quantization on a CNN.** Per-call activation scales for every convolution, and
#   generic integer convolutions between float operations, are work that static quantization does
#   not do (the CNN's verdicts show what it cost here); calibrate and quantize statically (QDQ)
#   instead.
# - **Tiny models.** What does not shrink (the graph and other constants) and what the quantizer
#   adds (scales, zero points, nodes) weigh more the smaller the model: compare the digits CNN's size
#   lines (its weights' share, and where each int8 file landed against that estimate) with the
#   MiniLM table's int8 rows. Do not expect a small model's file to shrink as much as its weights
#   do; measure the file.
# - **PT2E compiled without freezing.** The outputs are right and the int8 kernels never run: the
#   compiled graph dequantizes its weights on every call. Set `torch._inductor.config.freezing = True`
#   for inference and count the oneDNN calls in the generated code, as the PT2E section does.
# - **Measuring the module `convert_pt2e` returns.** It can still hold float tensors its graph no
#   longer reads (the PT2E section lists them); size, and save, only what the graph reads.
# - **QAT by reflex.** Fine-tuning with fake quantization costs training time; first check whether
#   post-training quantization loses anything at the bit width you need (the QAT section's verdicts).
# - **Deprecated APIs.** `torch.quantization` / `torch.ao.quantization` still run but warn; new
#   code uses torchao (`quantize_`, and `torchao.quantization.pt2e` for export-based static flows).
# - **Keep numerically sensitive parts in float.** LayerNorm, softmax and the final pooling and
#   normalisation stay in float32 in every variant here; all the tools above quantize only the
#   weight-heavy layers.
#
# ## Check yourself
#
# **Exercise 1.** Write `quantize_per_channel(w)` for a Linear weight `w` of shape
# `(out_features, in_features)`: return `(q, scale)` where `scale` has shape `(out_features, 1)`,
# one value per output channel equal to that row's `max|w| / 127`, and `q` is the int8 tensor
# `round(w / scale)` clamped to [-127, 127].

# %%
def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Your code here: return (q, scale).
    return None


exercises.check("08.per_channel", quantize_per_channel)


# %% [markdown]
# **Exercise 2.** Write the arithmetic of a real int8 kernel,
# `int8_linear(x, w_q, w_scale)`: `w_q` is an int8 weight `(out, in)` with per-row scales
# `w_scale` `(out, 1)`. Quantize `x` `(batch, in)` on the fly with one symmetric scale per row
# (`max|row| / 127`), multiply the int8 values with int32 accumulation (`.to(torch.int32)` then
# `@`), and rescale the result by the row scale of `x` times the channel scale of `w`.

# %%
def int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    # Your code here.
    return None


exercises.check("08.int8_linear", int8_linear)

# %% [markdown]
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.
# Stuck? `print(exercises.solution_source("08.int8_linear"))` shows a reference solution; try
# first. Once it passes, the cell below compares your kernel with torchao's dynamic int8 layer on
# the MLP's first layer: each against the float32 layer, then with each other.

# %%
if exercises.check("08.int8_linear", int8_linear):
    q_w, s_w = quantize_int8(mlp[0].weight.detach(), per_channel=True)
    with torch.inference_mode():
        mine = int8_linear(x_mlp, q_w, s_w) + mlp[0].bias
        theirs = mlp_dyn[0](x_mlp)
        exact = mlp[0](x_mlp)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    print(f"relative difference from the float32 layer: yours {rel(mine, exact):.2e}, torchao's {rel(theirs, exact):.2e}")
    print(f"yours against torchao's: {rel(mine, theirs):.2e} (the two need not agree more closely than each agrees "
          "with float32: torchao's step, for the weights and for each row of x, is max / 127.5 over [-128, 127], the "
          "exercise's max / 127 over [-127, 127], so many int8 values land on a neighbouring level)")
else:
    print("solve Exercise 2 to compare your kernel with torchao's")

# %% [markdown]
# ## Summary
#
# - Storage is measured as serialized bytes; a bf16 or fp16 cast halves it with almost no loss.
# - Symmetric int8 stores `round(w / scale)`; one scale per output channel keeps the error small
#   where per-tensor scales suffer from outliers.
# - Storing int8 is not the same as computing in int8: dequantizing on every call, as the
#   hand-written layer does, saves bytes and adds work to every call. Any speed has to come from
#   integer kernels (int8 × int8 → int32), which need the activations quantized too, and only where
#   those kernels are fast on your CPU (next point).
# - Whether an int8 path is fast depends on the CPU class: integer dot-product instructions
#   (AVX-512 VNNI, AVX-VNNI, AMX, ARM dot products) and whether the library has kernels for them.
#   Measure the bare int8 product first; the verdicts above are for your CPU only.
# - `torch.ao.quantization` is deprecated but still runs (FBGEMM, with 7-bit activations);
#   torchao's `quantize_` is the maintained PyTorch API. Its int8 dynamic configuration plus
#   `torch.compile` rides on `torch._int_mm` by default; with freezing on, and once torchao's x86
#   quantizer module is imported (it registers the passes), Inductor rewrites it into oneDNN int8
#   calls (the PT2E section counts them), so check the generated code for your setting.
#   Float8 configurations need a recent GPU, int4 an extra package.
# - ONNX Runtime: the usual advice is dynamic quantization for transformers (turn on `per_channel`)
#   and static QDQ quantization with calibration data for CNNs, with `reduce_range=True` for U8S8
#   models that must run on x86 CPUs without VNNI, where 16-bit pair sums can saturate; this
#   notebook's verdicts show what each gave on your CPU.
# - PT2E is PyTorch's static int8 flow, now in torchao: `torch.export`, `prepare_pt2e` with
#   `X86InductorQuantizer`, calibration, `convert_pt2e`, then `torch.compile` **with freezing**,
#   without which Inductor keeps the float matmuls of the reference graph. The generated code says
#   which kernels ran; it covers convolutions, which torchao's `quantize_` does not.
# - QAT (`QATConfig(base_config, step="prepare")`, fine-tune, `step="convert"`) trains the exact
#   model that conversion produces. It can only win back what post-training rounding loses: check
#   that first, and compare with PTQ after the same amount of fine-tuning.
# - FP8 formats have tiny ranges, so FP8 data always travels with a scale. Fast scaled FP8 matmuls
#   need FP8 hardware (on NVIDIA, compute capability 8.9 or newer); a CPU kernel, where torch has
#   one, checks the arithmetic.
# - The headline results (`quant.minilm.int8.*`, `quant.digits.int8.acc_drop`, `quant.pt2e.*`,
#   `quant.qat.acc_recovered`, `quant.handwritten.max_rel_err`) and every verdict (`quant.*`) feed
#   the course's results report.
#
# ## Further reading
#
# - [torchao documentation](https://docs.pytorch.org/ao/stable/) (quantization overview, `quantize_`, configurations)
# - [torchao PT2E quantization tutorials](https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_ptq.html)
#   and the [PT2E quick start](https://docs.pytorch.org/ao/stable/pt2e_quantization/index.html) (`X86InductorQuantizer`)
# - [torchao `QATConfig`](https://docs.pytorch.org/ao/stable/generated/torchao.quantization.qat.QATConfig.html)
#   and the [QAT workflow guide](https://docs.pytorch.org/ao/main/workflows/qat.html)
# - [`torch.ao.quantization` (deprecated) reference](https://docs.pytorch.org/docs/stable/quantization.html)
# - [ONNX Runtime quantization guide](https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html)
# - [`torch.finfo`](https://docs.pytorch.org/docs/stable/type_info.html) and the [FP8 formats paper](https://arxiv.org/abs/2209.05433)
