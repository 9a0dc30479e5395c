# %% [markdown]
# # 11 · Attention kernels and compiling real models
#
# Every transformer spends much of its time in one operation, attention, and PyTorch ships several
# kernels for it: a fused `scaled_dot_product_attention` that picks a backend for you, and
# FlexAttention, which lets you write a mask or a score bias as a small Python function and have
# the compiler turn it into a fused kernel. The second half of this notebook is about making
# `torch.compile` practical on a model of realistic shape: compiling the repeated block instead of
# the whole model to cut the cold start, measuring what compiling gives real vision and language
# models on your CPU, compiling the optimizer step and the backward pass, and
# reading the compiler's own report (`TORCH_TRACE` + `tlparse`) when something goes wrong. All of it
# runs on a CPU.

# %% [markdown]
# ## What you will learn
#
# - to check `F.scaled_dot_product_attention` (SDPA) against a hand-written softmax(QKᵀ/√d)V, which
#   backends exist and which one your CPU runs, and how time and memory grow with the sequence;
# - FlexAttention's `score_mod` and `block_mask`: causal, sliding-window, ALiBi-style bias and
#   document masking, each checked against a masked SDPA reference, and how much work a block mask skips;
# - autocast to bfloat16 under `torch.compile` on the CPU: its error, and whether it is faster here;
# - regional compilation (compile the repeated block, or mark it with `nested_compile_region`):
#   cold-start compile time in fresh processes and steady-state speed against whole-model compile;
# - what `torch.compile` gives real models here (torchvision's ResNet-18, MobileNetV2 and a ViT, the
#   MiniLM encoder and the tiny GPT): default, freezing, max-autotune and bf16, first call beside steady
#   state, and geometric means beside the PyTorch team's published figures;
# - a compiled optimizer step with its LR scheduler, and compiled autograd: what each captures;
# - `TORCH_TRACE` and `tlparse`: a report on a run with a graph break and a recompilation, read in
#   the notebook, and how to attach it to a bug report; `error_on_graph_break` and `set_stance`.
#
# **Prerequisites:** notebooks 01 (`torch.compile`, cold and warm caches) and 02 (graph breaks,
# recompilation); notebook 03 helps with the compiler's stages. Knowing what attention computes is
# enough for the first half. Section 5 loads the MiniLM encoder (notebooks 06–08) and the tiny GPT
# (notebook 10); neither notebook needs to have been run.
#
# **Time on a laptop CPU:** <!-- stamp:time -->5.8 min the first time (every cache empty), 5.9 min after that (compile cache warm, yet no faster in these two runs), 1.3 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time --> Section 4's cold starts (each in a fresh process) and section 5's table compile from empty caches in every full-mode run, on purpose, so a warm compile cache can shorten only the compiles in the rest of the notebook. Quick mode uses shorter sequences and a smaller model, leaves the `nested_compile_region` cold start to full mode, and runs section 5's table for the tiny GPT alone.
#
# **GPU:** not needed. One guarded cell lists the GPU attention backends (flash, memory-efficient, cuDNN) that a CUDA machine would also run.

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
import json
import logging
import math
import os
import shutil
import time
import warnings
from contextlib import redirect_stderr

os.environ.setdefault("KINETO_LOG_LEVEL", "6")   # keep the profiler's start/stop lines out of the output

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile
from torchvision.models.vision_transformer import VisionTransformer
from tqdm import tqdm

from course_utils import bench, compat, config, cpu, exercises, fresh, inductor_code, session, trace_report
from course_utils.data import load_corpus, load_retrieval_set
from course_utils.device import requires_cuda
from course_utils.expect import expect_error
from course_utils.models import load_minilm, load_tiny_gpt
from course_utils.text import about, counted

print(session.start(seed=0))
BUILD = config.build_dir() / "nb11"
BUILD.mkdir(parents=True, exist_ok=True)


# %% [markdown]
# ## 1 · Scaled dot-product attention
#
# Attention takes queries `Q`, keys `K` and values `V` of shape (batch, heads, sequence, head
# dimension) and returns softmax(QKᵀ/√d)·V: each query position mixes the value vectors of all key
# positions, weighted by how well its query matches their keys. Written out by hand it is three
# lines, and it builds the whole (sequence × sequence) score matrix in memory.
# `F.scaled_dot_product_attention` computes the same thing with a fused kernel. First: are they equal?

# %%
def attention_by_hand(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v; mask (bool, True = may attend) removes scores before the softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


B, H, S, D = 2, 4, config.pick(256, 512), 64
q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
causal = torch.ones(S, S, dtype=torch.bool).tril()

TOL = 1e-5   # absolute, in float32 with values of order 1
err_full = (F.scaled_dot_product_attention(q, k, v) - attention_by_hand(q, k, v)).abs().max().item()
err_causal = (F.scaled_dot_product_attention(q, k, v, is_causal=True)
              - attention_by_hand(q, k, v, causal)).abs().max().item()
print(f"largest difference, SDPA vs by hand: {err_full:.2e} (no mask), {err_causal:.2e} (causal)")
assert max(err_full, err_causal) < TOL
bench.record("attn.sdpa.max_abs_err", max(err_full, err_causal), "abs", seq=S, head_dim=D, tol=TOL);

# %% [markdown]
# The differences are rounding: the fused kernel adds the same numbers in a different order.
# `is_causal=True` is the cheap way to say "position i attends to positions ≤ i": the kernel never
# needs the mask tensor. Any other mask goes in `attn_mask` (boolean, True = may attend, or a float
# bias added to the scores).
#
# ### Which kernel runs?
#
# SDPA is a dispatcher over backends. `torch.nn.attention.sdpa_kernel` restricts it to the backends
# you list, which is how you find out what your machine can run: a backend that cannot handle the
# inputs is skipped, and with none left SDPA raises an error.

# %%
runs_here = {}
for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION):
    try:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        runs_here[backend.name] = (out - attention_by_hand(q, k, v, causal)).abs().max().item() < TOL
    except RuntimeError:
        runs_here[backend.name] = False
print("backends that run on this", q.device.type.upper(), "for these inputs:",
      ", ".join(name for name, ok in runs_here.items() if ok))

with profile(activities=[ProfilerActivity.CPU]) as prof:
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
kernels = [e.key for e in prof.key_averages() if "attention" in e.key and e.key != "aten::scaled_dot_product_attention"]
print("the default choice dispatched to:", kernels)
assert runs_here["MATH"] and runs_here["FLASH_ATTENTION"]
assert any("flash_attention_for_cpu" in name for name in kernels)

# %% [markdown]
# On a CPU two backends exist: `MATH` (the composite of matmuls and softmax, like our hand-written
# version, kept as the reference) and a CPU flash-attention kernel, which the dispatcher picks by
# default. The flash idea is to walk over the keys in blocks and keep a running softmax, so the full
# score matrix never exists. The memory-efficient and cuDNN backends are CUDA kernels.

# %%
if requires_cuda("the CUDA attention backends (flash, memory-efficient, cuDNN)"):
    qc, kc, vc = (t.cuda().half() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        reference = F.scaled_dot_product_attention(*(t.float() for t in (qc, kc, vc)), is_causal=True)
    ran_here = []
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
        except RuntimeError as err:
            print(f"{backend.name:<20} not available here: {str(err).splitlines()[0][:80]}")
            continue
        gap = (out.float() - reference).abs().max().item()
        ran_here.append(backend.name)
        print(f"{backend.name:<20} runs; max difference from float32 math {gap:.1e}")
        assert gap < 1e-2, f"{backend.name} in half precision should stay within 1e-2 of float32"
    fused = [name for name in ran_here if name != "MATH"]
    assert fused, "at least one fused CUDA backend (flash, memory-efficient or cuDNN) should run on this GPU"

    def only(name):
        """Return a call of SDPA restricted to one backend."""
        def call():
            with sdpa_kernel([getattr(SDPBackend, name)]):
                return F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
        return call

    gpu_attn = bench.compare({name: only(name) for name in ran_here}, baseline="MATH", device="cuda")
    print(gpu_attn)
    best = min(fused, key=lambda name: gpu_attn.row(name).median_s)
    print(f"the fastest fused backend here, {best}: {gpu_attn.describe(best, 'MATH', name='attn.gpu.fused_vs_math')}")
else:
    print("On a GPU this cell would time each CUDA backend in half precision; which ones run depends on "
          "the GPU's generation and the head dimension.")


# %% [markdown]
# ### Time and memory as the sequence grows
#
# The score matrix has S² entries per head, so the hand-written version's memory grows with the
# square of the sequence. The profiler's memory accounting (`profile_memory=True`) adds up what each
# call allocates; the cell compares that with the size of one score matrix and prints how much each
# doubling of the sequence multiplies it by.

# %%
def allocated_mb(fn, *args):
    """Megabytes allocated on the CPU while fn(*args) runs (sum of every allocation)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn(*args)
    return sum(e.self_cpu_memory_usage for e in p.key_averages() if e.self_cpu_memory_usage > 0) / 2**20


sdpa_causal = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
by_hand_causal = lambda q, k, v: attention_by_hand(q, k, v, torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril())  # noqa: E731
lengths = config.pick([128, 256, 512], [128, 256, 512, 1024, 2048])
growth = {"by hand": {"ms": [], "mb": []}, "SDPA": {"ms": [], "mb": []}}
for n in lengths:
    qs, ks, vs = (torch.randn(1, H, n, D) for _ in range(3))
    cmp = bench.compare({"by hand": by_hand_causal, "SDPA": sdpa_causal}, qs, ks, vs,
                        min_run_time=config.pick(0.1, 0.4), rounds=2)
    for name, fn in (("by hand", by_hand_causal), ("SDPA", sdpa_causal)):
        growth[name]["ms"].append(cmp.row(name).median_s * 1e3)
        growth[name]["mb"].append(allocated_mb(fn, qs, ks, vs))
    print(f"S={n:5}: by hand {growth['by hand']['ms'][-1]:8.2f} ms, {growth['by hand']['mb'][-1]:7.1f} MB | "
          f"SDPA {growth['SDPA']['ms'][-1]:8.2f} ms, {growth['SDPA']['mb'][-1]:6.1f} MB | "
          f"SDPA {cmp.describe('SDPA', name=f'attn.sdpa.vs_by_hand.s{n}')}")

score_mb = H * lengths[-1] ** 2 * 4 / 2**20   # one float32 score matrix for every head
per_doubling = {name: [b / a for a, b in zip(g["mb"], g["mb"][1:])] for name, g in growth.items()}
for name, steps in per_doubling.items():
    print(f"{name:<7} memory per doubling of S: " + ", ".join(f"{x:.1f}x" for x in steps))
n_threads = torch.get_num_threads()
torch.set_num_threads(1)                   # the same call at the longest length, on one thread
one_thread_mb = allocated_mb(sdpa_causal, qs, ks, vs)
torch.set_num_threads(n_threads)
output_mb = qs.numel() * 4 / 2**20         # SDPA's float32 output, the shape of q
print(f"SDPA at S={lengths[-1]}: {one_thread_mb:.1f} MB on one thread"
      + (f", {growth['SDPA']['mb'][-1]:.1f} MB on this machine's {n_threads} threads" if n_threads > 1 else "")
      + f"; {output_mb:.1f} MB of {'either' if n_threads > 1 else 'it'} is its output, the rest the kernel's scratch"
      + (", which grows with the thread count" if n_threads > 1 else ""))
assert growth["by hand"]["mb"][-1] >= score_mb, "the hand-written version builds at least one score matrix"
# The last doubling: S² makes the hand-written version's memory about 4x; SDPA's output doubles and its
# scratch (one buffer per thread, sized by the kernel's blocks) grows less, whatever the thread count.
assert per_doubling["by hand"][-1] > 3.5 and per_doubling["SDPA"][-1] < 2.5
assert one_thread_mb > output_mb and (n_threads == 1 or growth["SDPA"]["mb"][-1] > one_thread_mb)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for name, g in growth.items():
    axes[0].plot(lengths, g["ms"], "o-", label=name)
    axes[1].plot(lengths, g["mb"], "o-", label=name)
axes[1].axhline(score_mb, color="grey", ls=":", label=f"one score matrix at S={lengths[-1]}")
for ax, label in zip(axes, ("milliseconds per call", "MB allocated per call")):
    ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=label)
    ax.legend()
fig.suptitle(f"causal attention, {H} heads, head dim {D}")
fig.tight_layout();

# %% [markdown]
# The memory panel is the structural result: the hand-written version allocates at least one full
# score matrix (several, in fact: the scores, their scaled copy, the masked copy and the softmax), so its
# memory grows with S². The fused kernel never builds that matrix: it allocates its output, which grows
# linearly with S, plus a scratch buffer for each thread, sized by the blocks of queries and keys it
# works on (the blocks are as long as the sequence up to a cap, and the query block's cap rises at longer
# sequences, so at shorter lengths the scratch can grow faster than S), so over long sequences its memory
# grows far more slowly (the cell asserts both at the last doubling). Because
# the scratch is per thread, SDPA's figure also depends on how many threads torch uses, which is why the
# cell measured it on one thread as well. The time panel is this machine's verdict, printed per length above.
#
# ## 2 · FlexAttention: masks and biases as Python functions
#
# Real models need other patterns: a sliding window (each token sees only the last W tokens), a
# position bias added to the scores (ALiBi), or several documents packed into one sequence that
# must not see each other. With SDPA each becomes a dense S×S `attn_mask`, and the kernel still
# visits every block. FlexAttention takes two small functions instead:
#
# - `score_mod(score, b, h, q_idx, kv_idx)` returns a new score (a bias, a scaling);
# - `mask_mod(b, h, q_idx, kv_idx)` returns True where attention is allowed. `create_block_mask`
#   evaluates it at every (query, key) position, once, when the mask is built, and keeps for each
#   (block × block) tile only whether it is empty, full or partial: the kernel skips the empty tiles
#   and calls `mask_mod` only inside the partial ones.
#
# `torch.compile(flex_attention)` generates one fused kernel for each combination; on the CPU it
# uses Inductor's C++ template. Without compiling, FlexAttention runs an unfused reference (and warns that it should be compiled).
# Inductor builds that CPU template only on x86 CPUs with AVX2 or better and torch's vector code on
# (not under the course's `default` CPU profile), so not on Arm and not on macOS: on any other
# machine the first call raises an error that says the platform is not supported, and the cells
# below fall back to the unfused reference, which gives the same answers without the fusion.

# %%
S_FLEX, WINDOW = config.pick(512, 1024), config.pick(128, 256)
qf, kf, vf = (torch.randn(1, H, S_FLEX, D) for _ in range(3))
documents = torch.zeros(S_FLEX, dtype=torch.long)          # three packed documents
documents[S_FLEX // 3:] = 1
documents[S_FLEX // 2:] = 2
slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])   # one ALiBi slope per head


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def window_mask(b, h, q_idx, kv_idx):
    return q_idx - kv_idx < WINDOW


def same_document(b, h, q_idx, kv_idx):
    return documents[q_idx] == documents[kv_idx]


def alibi_bias(score, b, h, q_idx, kv_idx):
    return score + slopes[h] * (kv_idx - q_idx)    # farther back = lower score, per-head slope


sliding_window = and_masks(causal_mask, window_mask)
document_causal = and_masks(causal_mask, same_document)
compiled_flex = torch.compile(flex_attention)



# %% [markdown]
# Each variant's reference is SDPA with the equivalent dense inputs, built from the same rule on a
# grid of indices: a boolean mask for the masks, and for ALiBi a float `attn_mask` holding the bias
# with −∞ above the diagonal.

# %%
i = torch.arange(S_FLEX).view(-1, 1)
j = torch.arange(S_FLEX).view(1, -1)
zero = torch.tensor(0)
dense = {"causal": causal_mask(zero, zero, i, j), "sliding window": sliding_window(zero, zero, i, j),
         "document": document_causal(zero, zero, i, j)}
alibi_dense = (slopes.view(H, 1, 1) * (j - i)).masked_fill(~dense["causal"], float("-inf"))

variants = {   # name: (block mask, score_mod, SDPA reference)
    name: (create_block_mask(rule, None, None, S_FLEX, S_FLEX, device="cpu"), None,
           F.scaled_dot_product_attention(qf, kf, vf, attn_mask=dense[name]))
    for name, rule in (("causal", causal_mask), ("sliding window", sliding_window), ("document", document_causal))
}
variants["ALiBi + causal"] = (variants["causal"][0], alibi_bias,
                              F.scaled_dot_product_attention(qf, kf, vf, attn_mask=alibi_dense))

FLEX_TOL = 1e-5
flex = compiled_flex
matches = 0
for name, (block_mask, score_mod, reference) in variants.items():
    try:   # the first call's time, and what Inductor's graph cache did meanwhile
        first_s, events = bench.first_call_and_cache(flex, qf, kf, vf, score_mod=score_mod, block_mask=block_mask)
    except Exception as err:  # Inductor's CPU FlexAttention needs x86 with AVX2 vector code, and not macOS
        if flex is flex_attention or "not supported for CPU" not in str(err):
            raise
        flex = flex_attention  # the unfused reference: the same answers, none of the fusion
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        cause = next(ln.strip() for ln in str(err).splitlines() if "not supported for CPU" in ln)
        print(f"compiled FlexAttention is not available here ({cause}); this cell and the ones below use the "
              "unfused reference (which warns to use torch.compile, which cannot help on this CPU, so the cell "
              "silences that warning)")
        first_s, events = bench.first_call_and_cache(flex, qf, kf, vf, score_mod=score_mod, block_mask=block_mask)
    out = flex(qf, kf, vf, score_mod=score_mod, block_mask=block_mask)
    err = (out - reference).abs().max().item()
    matches += err < FLEX_TOL
    print(f"{name:<15} max difference from SDPA {err:.1e} | "
          f"first call ({bench.first_call_words(events) if flex is compiled_flex else 'unfused'}) {first_s:5.1f} s | "
          f"blocks skipped {block_mask.sparsity():5.1f}%")
assert matches == len(variants), "every FlexAttention variant must equal its SDPA reference"
bench.record("attn.flex.variants_equal", matches, "count", variants=len(variants), seq=S_FLEX, tol=FLEX_TOL);

# %% [markdown]
# ### What a block mask skips
#
# A `BlockMask` stores, for each row of query blocks, which key blocks hold at least one allowed
# entry. `sparsity()` is the percentage of tiles with none. We can count it ourselves from the
# dense mask, tile by tile, and see the mask the kernel works from.

# %%
sw_mask = variants["sliding window"][0]
block = sw_mask.BLOCK_SIZE[0]
tiles = dense["sliding window"].view(S_FLEX // block, block, S_FLEX // block, block).any(dim=(1, 3))
skipped = 1.0 - tiles.float().mean().item()
print(f"block size {block}: {tiles.numel()} tiles, {int((~tiles).sum())} of them empty -> skip {skipped:.1%} "
      f"(BlockMask.sparsity() says {sw_mask.sparsity():.1f}%)")
print(sw_mask)
assert math.isclose(skipped * 100, sw_mask.sparsity(), abs_tol=1e-6)
bench.record("attn.flex.block_sparsity", skipped, "fraction", seq=S_FLEX, window=WINDOW, block=block);

# %% [markdown]
# Skipping empty tiles is what a block mask makes possible; the tiles on the window's edge are
# only partly allowed, and the kernel applies the `mask_mod` inside them. Does skipping pay on this
# CPU against SDPA with the same mask as a dense tensor?

# %%
sw_dense = dense["sliding window"]
sliding = bench.compare({
    "SDPA, dense mask": lambda: F.scaled_dot_product_attention(qf, kf, vf, attn_mask=sw_dense),
    "flex, block mask": lambda: flex(qf, kf, vf, block_mask=sw_mask),
}, min_run_time=config.pick(0.3, 1.0))
print(sliding)
said = sliding.describe("flex, block mask", name="attn.flex.sliding_window.vs_sdpa_dense")
if flex is not compiled_flex:
    why = (f"; it ran unfused here: the reference computes every score and masks afterwards, so it skips none of "
           f"the {skipped:.0%} of tiles the block mask marks empty; only the compiled kernel would")
elif sliding.verdict("flex, block mask") == "faster":
    why = (f" (the block mask lets it skip {skipped:.0%} of the tiles, which SDPA with a dense mask computes; "
           "this cell does not split the gain)")
elif sliding.verdict("flex, block mask") == "slower":
    why = (f"; although the block mask lets it skip {skipped:.0%} of the tiles, it was slower here than SDPA's "
           "dense kernel (this cell does not measure why)")
else:
    why = (f"; the block mask lets it skip {skipped:.0%} of the tiles, yet it was not clearly faster here than "
           "SDPA's dense kernel (this cell does not measure why)")
print(f"verdict on this machine: FlexAttention is {said}{why}")

# %% [markdown]
# ### What the CPU backend does not do
#
# On the installed torch, FlexAttention on the CPU is for inference: it has no backward pass there
# (compiled or, where the cells above fell back to it, the unfused reference), so training with it
# needs a GPU. The error says so directly:

# %%
q_train = qf.clone().requires_grad_()
err = expect_error(lambda: flex(q_train, kf, vf, block_mask=sw_mask).sum().backward(), match="backward")
print(type(err).__name__ + ":", str(err).splitlines()[0])

# %% [markdown]
# ## 3 · Autocast to bfloat16 with `torch.compile`
#
# bfloat16 keeps float32's exponent range but only 8 significant bits (7 stored, one implicit), which
# is between two and three significant decimal digits.
# `torch.autocast("cpu", dtype=torch.bfloat16)` follows two lists (PyTorch's "Autocast Op
# Reference" prints them for each device). Ops on the CPU's lower-precision list (matrix products,
# `linear`, convolutions, `scaled_dot_product_attention`) run in bf16; ops on its float32 list
# (mostly losses, some pooling, FFTs and linear algebra) run in float32; every other op, softmax and
# layer norm included, is left alone and runs in the dtype of its input. So a layer norm on the
# float32 residual stream stays float32, while a softmax over a bf16 product runs in bf16. (The
# CUDA policy differs: there softmax and layer norm are on the float32 list.) The cell below asks
# the installed torch:

# %%
probe_x = torch.randn(4, 16)                        # float32
probe_w = torch.randn(16, 16)
with torch.autocast("cpu", dtype=torch.bfloat16):
    product = probe_x @ probe_w                     # a bf16 result, from float32 inputs
    probe = {
        "matmul (float32 in)": product.dtype,
        "linear (float32 in)": F.linear(probe_x, probe_w).dtype,
        "softmax (float32 in)": torch.softmax(probe_x, dim=-1).dtype,
        "layer_norm (float32 in)": F.layer_norm(probe_x, (16,)).dtype,
        "softmax (the bf16 product in)": torch.softmax(product, dim=-1).dtype,
        "layer_norm (the bf16 product in)": F.layer_norm(product, (16,)).dtype,
        "mse_loss (the bf16 product in)": F.mse_loss(product, product).dtype,  # on the float32 list
    }
for op, dtype in probe.items():
    print(f"{op:<34} -> {dtype}")
assert probe["matmul (float32 in)"] == probe["linear (float32 in)"] == torch.bfloat16
assert probe["softmax (float32 in)"] == probe["layer_norm (float32 in)"] == torch.float32
assert probe["softmax (the bf16 product in)"] == probe["layer_norm (the bf16 product in)"] == torch.bfloat16
assert probe["mse_loss (the bf16 product in)"] == torch.float32


# %% [markdown]
# `torch.compile` traces the autocast region and generates code for the mixed types. The error is
# easy to measure; whether bf16 is faster depends on the CPU: bf16 arithmetic is native with
# AVX-512 BF16, AMX or Arm's BF16, and converted on older CPUs.

# %%
class AttentionBlock(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=-1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


block = AttentionBlock(256, 4).eval()
xa = torch.randn(config.pick(4, 8), config.pick(64, 128), 256)
compiled_block = torch.compile(block)


caps = cpu.capabilities()
# torch's CPU attention packs bf16 data for AMX whenever oneDNN sees AMX, then calls a packing kernel built
# for ATen's vector level, which refuses below AVX-512. No real CPU has AMX without AVX-512; only a run
# capped below it (a CPU profile, or ATEN_CPU_CAPABILITY) meets this, and it takes the math attention instead.
amx_below_avx512 = bool(caps.get("amx_bf16")) and not torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def bf16_block(x):
    attention = sdpa_kernel(SDPBackend.MATH) if amx_below_avx512 else contextlib.nullcontext()
    with attention, torch.autocast("cpu", dtype=torch.bfloat16):
        return compiled_block(x)


with torch.no_grad():
    fp32 = block(xa)
    bf16 = bf16_block(xa)
    rel = ((bf16.float() - fp32).norm() / fp32.norm()).item()
    amp = bench.compare({"fp32 compiled": compiled_block, "bf16 autocast compiled": bf16_block}, xa,
                        min_run_time=config.pick(0.3, 1.0))
print(f"relative error against fp32: {rel:.2e} (the output is {bf16.dtype}: the residual additions mix a "
      "float32 input with bf16 products, and autocast leaves additions to type promotion)")
print(amp)
if amx_below_avx512:
    print(f"(torch's vector code is capped at {torch.backends.cpu.get_cpu_capability()} on a CPU with AMX, a mix no "
          "real CPU has: the bf16 row's attention ran on the math backend, which this mix needs)")
native = [name for name in ("avx512_bf16", "amx_bf16", "bf16") if caps.get(name)]   # "bf16": Arm's
no_native = "none (bf16 products are computed through float32 conversions)"
print(f"native bf16 instructions on this CPU: {', '.join(native) if native else no_native}"
      + (f"; the {cpu.settings_only_profile()} profile leaves oneDNN, which runs these products, on the real CPU "
         "and those instructions" if cpu.settings_only_profile() and native else ""))
where = (f"the {cpu.settings_only_profile()} profile, with oneDNN's bf16 products on the real CPU's "
         f"{', '.join(native)}: a real {cpu.cpu_class()} CPU, without bf16 instructions, can differ"
         if cpu.settings_only_profile() and native else cpu.cpu_class())
print(f"verdict on this machine ({where}): bf16 is "
      f"{amp.describe('bf16 autocast compiled', name='compile.bf16.block.vs_fp32')}"
      + ("" if native else "; this CPU has no native bf16 instructions, so its bf16 products cannot run on bf16 "
         "units: they take another route (converting to and from float32 on the way), and this cell does not "
         "measure which part of that route costs what"))
assert rel < 2e-2, "bf16 keeps 2 to 3 significant digits: the error should be well under 2%"

# %% [markdown]
# The error is what bf16's short mantissa predicts, far below what matters for most inference.
# The speed verdict belongs to your CPU: bf16 products move half the bytes on any CPU; with native
# bf16 instructions they also run on bf16 units, while without them each product has to take another
# route, converting to and from float32, which can cost far more than it saves (the verdict above
# says how it came out on yours).
#
# ## 4 · Regional compilation: compile the block, not the model
#
# A transformer is the same block repeated N times. `torch.compile(model)` traces all N copies into
# one graph and lowers each of them (a kernel whose code comes out identical to one already built is
# built only once), so the work of compiling grows with the depth of the model. The cell below prints
# each cold start beside its C++ compiler time (summed over builds that run at the same time) and what
# is left once that is taken away (tracing and lowering, mostly; a lower bound, since overlapping
# builds are summed), and in full mode the code cell after the next text says which of the two grew
# with the depth.
# *Regional compilation* compiles the repeated block instead (`block.compile()` on each): Dynamo
# traces one block, and since every block has the same code and the same shapes, the other N−1 reuse
# that compiled code. The price is the Python loop between blocks and no fusion across them.
#
# Recent releases add `torch.compiler.nested_compile_region` (the notebook asks `compat.has` first),
# the same idea inside a whole-model compile: mark the block's `forward`, compile the whole model, and the marked region is compiled
# once and reused.
#
# The only honest cold start is a new process with empty caches (notebook 01, section 7).
# `course_utils.fresh.run_script` runs a script in a new Python with its own empty Inductor cache
# directory and returns the JSON the script prints. The model below is written once as a string of Python code, so
# that this notebook and the fresh processes run exactly the same code.
# One thing such a cold start can still find ready: the precompiled C++ header that Inductor builds
# once per compiler, set of flags and torch install, and that torch 2.14 keeps under the temporary directory, outside the
# cache directory (notebook 01, section 7, times a first compile without it). The cell counts these
# headers before and after each cold start and says which runs, if any, built one.

# %%
MODEL_SOURCE = """
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

class Transformer(nn.Module):
    def __init__(self, n_layer, dim, heads):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(n_layer))
        self.ln = nn.LayerNorm(dim)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln(x)

def prepare(model, how):
    if how == "whole model":
        return torch.compile(model)
    if how == "regional":
        for block in model.blocks:
            block.compile()
        return model
    if how == "nested region":
        Block.forward = torch.compiler.nested_compile_region(Block.forward)
        return torch.compile(model)
    return model
"""

COLD_START = MODEL_SOURCE + """
import json, sys, time
from torch._dynamo.utils import compile_times, counters
how, n_layer, dim, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = Transformer(n_layer, dim, 4).eval()
x = torch.randn(4, tokens, dim)
run = prepare(model, how)
start = time.perf_counter()
with torch.no_grad():
    run(x)
first_s = time.perf_counter() - start
names, values = compile_times(repr="csv", aggregate=True)
times = {n: float(v) for n, v in zip(names, values)}
print(json.dumps({"first_s": first_s, "cpp_build_s": times.get("compile_file", 0.0),
                  "graphs": counters["stats"]["unique_graphs"], "ops_traced": counters["stats"]["calls_captured"]}))
"""

DEPTHS, DIM, TOKENS = config.pick([6], [6, 48]), config.pick(128, 256), config.pick(32, 128)
N_LAYER = DEPTHS[-1]             # the model of the headline result and of the steady-state comparison
model_code = {}
exec(MODEL_SOURCE, model_code)   # the same classes here, for the steady-state comparison below
Transformer, prepare = model_code["Transformer"], model_code["prepare"]

# The floor: what a cold start costs for a one-line function (loading the compiler, its CPU probes).
FLOOR = """
import json, time, torch
f = torch.compile(lambda x: x + 1)
start = time.perf_counter()
f(torch.randn(8))
print(json.dumps({"first_s": time.perf_counter() - start}))
"""
HEADERS_BEFORE = set(config.precompiled_headers())   # Inductor's precompiled headers, outside the cache folder


def cold_start(script: str, args: list | None = None) -> dict:
    """Run ``script`` in a fresh process with empty compile caches; note whether a precompiled header appeared
    during its run (the folder is this user's, so another program compiling at the same moment could add one)."""
    before = set(config.precompiled_headers())
    result = fresh.run_script(script, args or [], cold=True)
    result["built_header"] = bool(set(config.precompiled_headers()) - before)
    return result


floor = cold_start(FLOOR)
floor_s = floor["first_s"]
print(f"floor: a one-line function, compiled cold, first call {floor_s:.1f} s"
      + (" (it built a precompiled header)" if floor["built_header"] else ""))
cold = {}
for n in DEPTHS:
    hows = ["whole model", "regional"]
    if n == N_LAYER and compat.has("nested_compile_region") and not config.is_quick():
        hows.append("nested region")
    for how in hows:
        r = cold[(how, n)] = cold_start(COLD_START, [how, n, DIM, TOKENS])
        print(f"{how:<14} {n:2} blocks: cold first call {r['first_s']:6.1f} s (C++ compiler time, summed over "
              f"builds that overlap: {r['cpp_build_s']:5.1f} s; "
              # the rest from the figures as printed (to 0.1 s), so that the line adds up
              + (f"the rest: {round(r['first_s'], 1) - round(r['cpp_build_s'], 1):5.1f} s"
                 if r["first_s"] > r["cpp_build_s"] else
                 "more than the cold start, since builds overlapped")
              + ") | "
              f"graphs {r['graphs']}, operations traced {r['ops_traced']}"
              + (" | built a precompiled header" if r["built_header"] else ""))
built = [name for name, r in [("the floor", floor), *((f"{how}, {n} blocks", r) for (how, n), r in cold.items())]
         if r["built_header"]]
where = config.precompiled_header_dir()
if built:
    print(f"precompiled headers: {'a header' if len(built) == 1 else 'headers'} appeared in {where} during the "
          f"{'run' if len(built) == 1 else 'runs'} of {'; '.join(built)}, so "
          f"{'that figure includes building it' if len(built) == 1 else 'those figures include building them'}; "
          "any run after with the same compiler flags found it ready")
elif HEADERS_BEFORE:
    print(f"precompiled headers: {len(HEADERS_BEFORE)} already in {where} before these runs (one per header, "
          "compiler, set of flags and torch install this machine has compiled with), and none of these runs built "
          "one, so every cold start above leaves out that build (a machine's very first compile pays it; notebook "
          "01, section 7, times it)")
else:
    print(f"precompiled headers: none in {where} before or after these runs (this compiler or torch keeps none "
          "there), so no cold start above left such a build out")

# %% [markdown]
# The counts differ by construction: whole-model compile traces every block's operations; regional
# compile traces one block and reuses it, so it traces about 1/N as many. Whether tracing is where the
# time goes is for the measurements to say: for each depth the next cell splits the gap between the two
# cold starts into C++ compiler time and the rest. What does not shrink is the
# floor measured first: any cold start loads the compiler and builds a small C++ program that probes
# the CPU (notebook 01 counts such probes), whatever it compiles; each run here found Inductor's precompiled header
# ready unless the line above says otherwise (a run that built it also holds that build, and the next
# cell says where that touches a comparison). The ratio of the two cold starts is therefore the ratio of
# (floor + the whole model's work) to (floor + one block's work). Each work term also holds a fixed
# cost of lowering and building any graph at all, which the whole model pays once, not N times; the next
# cell prints both terms above the floor where one block's term is at least a tenth of the floor. The
# ratio reaches 2 only once the whole model's
# work exceeds the floor plus twice one block's, and when the floor is many seconds that can take a
# deep model: full mode's deeper model has 48 blocks for that reason, and the 6-block model shows
# what a shallow one gets on this machine. The next cell prints the ratio for each depth and says whether it reaches the
# course's target for compiling only the block.

# %%
for n in DEPTHS:
    assert cold[("regional", n)]["ops_traced"] * (n - 1) < cold[("whole model", n)]["ops_traced"], \
        "regional compile traces one block, not all of them"
ratios = {n: cold[("whole model", n)]["first_s"] / cold[("regional", n)]["first_s"] for n in DEPTHS}
whole, regional = cold[("whole model", N_LAYER)], cold[("regional", N_LAYER)]
cold_ratio = ratios[N_LAYER]
bench.record("compile.regional.cold_start_ratio", cold_ratio, "x", n_layer=N_LAYER, dim=DIM,
             whole_s=whole["first_s"], regional_s=regional["first_s"], floor_s=floor_s)
for n, ratio in ratios.items():
    w, r = cold[("whole model", n)]["first_s"], cold[("regional", n)]["first_s"]
    # One cold start each, no spread: shorter or longer only beyond a 10% band.
    word = {"lower": "shorter", "higher": "longer", "no clear difference": "no clear difference"}[
        bench.band_verdict(r, w, band=0.1)]
    said = "not clearly different from whole-model compile's" if word == "no clear difference" else word
    bench.record_verdict(f"compile.regional.cold_start.n{n}", word, whole_s=w, regional_s=r, band=0.1)
    target = bench.record_verdict(f"compile.regional.cold_start_target.n{n}", "meets" if ratio >= 2 else "misses",
                                  ratio=ratio, target=2.0)
    traced = (cold[("whole model", n)]["ops_traced"], cold[("regional", n)]["ops_traced"])
    # In quick mode one block's work is a fraction of a second above a floor of many seconds that moves as much.
    # Differences from the figures as printed (to 0.1 s), so that the printed numbers add up.
    w1, r1, floor1 = round(w, 1), round(r, 1), round(floor_s, 1)
    above = ("no figures above the floor, since the floor's run built the precompiled header that the others "
             "found ready" if floor["built_header"] else
             f"above the floor: {w1 - floor1:.1f} s against {r1 - floor1:.1f} s" if r - floor_s >= 0.1 * floor_s
             else f"regional's cold start is within 10% of the floor ({floor_s:.1f} s), or below it: one block's "
                  "work is too small to separate from it")
    builders = [how for how in ("whole model", "regional") if cold[(how, n)]["built_header"]]
    if builders:
        above += (f" (careful: the {' and the '.join(builders)} run also built the precompiled header, a one-off "
                  "build that later runs found ready, so this comparison carries it)")
    print(f"{n:2} blocks: whole model {w:.1f} s, regional {r:.1f} s: regional's cold start is {said} (10% band; "
          f"whole/regional {f'{ratio:.3f}x' if f'{ratio:.2f}' == '2.00' else bench.ratio_text(ratio)}, {target} "
          "the 2x target), for "
          f"{traced[0]} against {traced[1]} operations traced; {above}")
    cpp_w, cpp_r = cold[("whole model", n)]["cpp_build_s"], cold[("regional", n)]["cpp_build_s"]
    cpp_diff = round(cpp_w, 1) - round(cpp_r, 1)
    print(f"    whole model - regional = {w1 - r1:.1f} s: " + (
        f"C++ compiler time {cpp_diff:+.1f} s, the rest {(w1 - r1) - cpp_diff:+.1f} s" if w > cpp_w and r > cpp_r
        else "no split, since the overlapping builds' summed time exceeds a cold start"))
if len(DEPTHS) > 1:
    deeper = bench.band_verdict(ratios[DEPTHS[-1]], ratios[DEPTHS[0]], band=0.1,
                                name="compile.regional.cold_ratio.deeper_vs_shallower")
    own = bench.band_verdict(regional["first_s"], cold[("regional", DEPTHS[0])]["first_s"], band=0.1,
                             name="compile.regional.cold_start.regional_deeper_vs_shallower")
    same_ops = {cold[("regional", n)]["ops_traced"] for n in DEPTHS}
    traced = f"both trace the same {same_ops.pop()} operations" if len(same_ops) == 1 else ""
    why = ("" if not traced else f" (as expected: {traced})" if own == "no clear difference"
           else f" ({traced}; with one cold start each, this may be run-to-run variation"
                + (" or the extra blocks' own run time in the first call)" if own == "higher" else ")"))
    print(f"the ratio at {DEPTHS[-1]} blocks against {DEPTHS[0]}: {deeper} (band 10%); regional's own cold start "
          f"at {DEPTHS[-1]} against {DEPTHS[0]} blocks: {own}{why}")
    shallow, deep = cold[("whole model", DEPTHS[0])], cold[("whole model", DEPTHS[-1])]
    # the rest from the figures as printed above (to 0.1 s), so that both lines give the same numbers
    parts = {"C++ compiler time": (shallow["cpp_build_s"], deep["cpp_build_s"]),
             "the rest": tuple(round(r["first_s"], 1) - round(r["cpp_build_s"], 1) for r in (shallow, deep))}
    # The compiler time is a sum over builds that may run side by side, so it can exceed the cold start itself:
    # then "the rest" is not a time, and the split says so instead of comparing it.
    print(f"whole-model compile, {DEPTHS[0]} -> {DEPTHS[-1]} blocks (one cold start each, 10% band): " + "; ".join(
        f"{part} {a:.1f} -> {b:.1f} s, {bench.band_verdict(b, a, band=0.1)}" if min(a, b) > 0 else
        f"{part} {a:.1f} -> {b:.1f} s: not a time here (the overlapping builds' summed time exceeds a cold start), "
        "so no verdict" for part, (a, b) in parts.items())
        + (" (careful: one of these two runs built the precompiled header, so the change carries that one-off build)"
           if shallow["built_header"] != deep["built_header"] else ""))
if ("nested region", N_LAYER) in cold:
    nested = cold[("nested region", N_LAYER)]["first_s"]
    nested_word = {"lower": "shorter than", "higher": "longer than", "no clear difference": "not clearly different from"}[
        bench.band_verdict(nested, whole["first_s"], band=0.1)]
    bench.record_verdict("compile.regional.nested.cold_start_vs_whole", nested_word, nested_s=nested,
                         whole_s=whole["first_s"], band=0.1)
    print(f"nested_compile_region, {N_LAYER} blocks: {nested:.1f} s cold, {nested_word} whole-model compile "
          f"({bench.ratio_text(whole['first_s'] / nested)}; 10% band)")

fig, ax = plt.subplots(figsize=(6.5, 1.0 + 0.45 * (len(cold) + 1)))
labels = ["one-line function (floor)"] + [f"{how}, {n} blocks" for how, n in cold]
ax.barh(labels, [floor_s] + [r["first_s"] for r in cold.values()], label="first call (cold)")
ax.barh(labels[1:], [r["cpp_build_s"] for r in cold.values()], label="C++ compiler time (summed; builds overlap)")
ax.invert_yaxis()
ax.set_xlabel("seconds, in a new process with empty caches")
ax.set_title("transformer cold starts")
ax.legend(loc="lower right")
fig.tight_layout();

# %% [markdown]
# Now the steady state, measured side by side in this process (these compiles reuse this machine's
# warm cache after the first run of the notebook): does giving up cross-block fusion cost speed?

# %%
torch.manual_seed(0)
base = Transformer(N_LAYER, DIM, 4).eval()
xs = torch.randn(4, TOKENS, DIM)


def twin_of(model):
    """A new Transformer with the same weights (each compile variant gets its own copy)."""
    twin = Transformer(N_LAYER, DIM, 4).eval()
    twin.load_state_dict(model.state_dict())
    return twin


whole_model = prepare(twin_of(base), "whole model")
regional_model = prepare(twin_of(base), "regional")
with torch.no_grad():
    reference = base(xs)
    for name, m in (("whole model", whole_model), ("regional", regional_model)):
        torch.testing.assert_close(m(xs), reference, rtol=1e-4, atol=1e-4)
    steady = bench.compare({"eager": base, "whole model": whole_model, "regional": regional_model}, xs,
                           min_run_time=config.pick(0.4, 2.0))
print(steady)
steady_ratio = steady.ratio("regional", "whole model")   # regional time / whole-model time
bench.record("compile.regional.steady_ratio", steady_ratio, "x", n_layer=N_LAYER, dim=DIM)
band = bench.band_verdict(steady.row("regional").median_s, steady.row("whole model").median_s, band=0.1,
                          name="compile.regional.steady.regional_vs_whole")
print(f"regional takes {bench.ratio_text(steady_ratio)} the whole model's time per call: {band} (band: 10%); "
      f"the target, regional at no more than 1.10x the whole model's time (no cross-block fusion lost that matters), "
      f"is {'missed' if band == 'higher' else 'met'}.")
vs_eager = {how: steady.verdict(how, "eager") for how in ("whole model", "regional")}
for how in ("whole model", "regional"):
    key = "whole" if how == "whole model" else "regional"
    print(f"against eager, {how} is "
          f"{steady.describe(how, 'eager', name=f'compile.regional.steady.{key}_vs_eager')}")
if "slower" in vs_eager.values():
    print("(a compiled version ran slower than eager here: this cell does not measure why)")

# %% [markdown]
# Regional compilation has the most to save on deep models, where whole-model compile has the
# most to trace (full mode compares two depths above, 6 and 48 blocks); whole-model compile keeps the chance of
# fusing across blocks. The lines above say whether either compiled version beat eager on this model here,
# and whether regional lost anything against whole-model compile. The compile cache (notebook 01, which
# measures it) can shorten the compile time of either approach on a second run (Dynamo still traces), but it
# does not change the steady-state comparison above.

# %% [markdown]
# ## 5 · Real models: what does `torch.compile` give them on this CPU?
#
# Every speed-up so far came from a function or a block chosen to show one effect. The question a
# learner brings is another: what does one line of `torch.compile` give *my* model, on *this*
# laptop? The PyTorch team answers it for its own benchmark suites, about 170 real networks in three
# collections (TorchBench, Hugging Face transformers and TIMM image models), with the geometric mean
# of Inductor's speed-ups over eager in its TorchInductor CPU updates on the PyTorch developer forum.
# This section builds a small suite of the same kinds from what is installed and prints its
# geometric means beside theirs:
#
# - **vision**: torchvision's ResNet-18 and MobileNetV2 (both also in TorchBench) and a vision
#   transformer, torchvision's `VisionTransformer` at ViT-Tiny's width (192 channels, 3 heads,
#   16×16 patches) with 6 layers instead of 12 to keep its compile short. Their weights are random:
#   nothing is downloaded, and since none of these models branches on values, a call does the same
#   work whatever the weights hold;
# - **language**, the Hugging Face kind: the course's MiniLM, a BERT-style Hugging Face encoder with its
#   real weights (notebooks 06–08), and the tiny GPT that notebook 10 serves (`data/tiny_gpt.pt`).
#
# Each model runs eager and under these settings:
#
# - **default**: `torch.compile(model)` and nothing else;
# - **freezing** (Inductor's `freezing` setting, for inference only): Inductor may treat the
#   weights as constants, so it folds each batch norm into the convolution before it, computes once
#   whatever depends on weights alone, and stores the weights in the layout oneDNN's kernels read
#   best. Later changes to the weights are ignored, so never freeze a model you are training;
# - **max-autotune** (with freezing): times Inductor's own C++ matrix-multiply templates against the
#   library call for every matrix multiply and keeps whichever was faster in that timing of the one
#   multiply, in isolation, which need not make the whole model faster (a line under the table
#   compares it with freezing). That adds compile time for each
#   distinct matrix shape, so it runs on one model only: MiniLM, an encoder whose arithmetic is
#   mostly the matrix multiplies of its linear layers (the library share printed beside its verdicts
#   says how much of its eager operator time goes to those and to attention). In the convolution nets it would find only the classifier to tune
#   (convolutions stay with oneDNN in every mode; notebook 01, section 3), and on the ViT and the
#   tiny GPT it would add its tuning to the table's time to ask MiniLM's question again;
# - **bf16 autocast** (with freezing), on one model of each kind, where the CPU has native bf16
#   instructions (AVX-512 BF16, AMX or Arm's BF16); without them every product converts to and from bf16
#   (section 3).
#
# In full mode each model's default setting compiles from an empty Inductor cache and its freezing
# setting from another one, in this process, which has already loaded the compiler (section 4's floor
# is not in it). The bf16 and max-autotune rows are compiled into freezing's cache right after it, so
# they reuse any kernel freezing already built with the same code: their first call is their own trace
# and lowering plus whatever they need that freezing did not, which for max-autotune means its tuning.
# (The "first calls" line under the table counts whole graphs found in the cache; kernels reused this
# way are not counted there.)
# The batch is small (2) and each timing short, to keep the whole table within a few minutes; the
# cell that prints the table (after the next text and the cell that runs the compiles) prints how long it took and how much of that went into first calls. Quick mode runs the tiny GPT
# alone, default setting, with whatever the on-disk cache holds.

# %%
REAL_BATCH = 2
caps = cpu.capabilities()
native_bf16 = [name for name in ("avx512_bf16", "amx_bf16", "bf16") if caps.get(name)]   # "bf16": Arm's
# On x86, torch's vector code capped below AVX-512 (a CPU profile, or ATEN_CPU_CAPABILITY) stands for a CPU
# without bf16 instructions; on Arm, torch's vector levels say nothing about them.
capped = cpu.cpu_class().startswith("x86") and not torch.backends.cpu.get_cpu_capability().startswith("AVX512")
bf16_here = bool(native_bf16) and not capped


def empty_cache():
    """Full mode: an empty temporary Inductor cache, so a first call is a whole compile. Quick: the on-disk cache."""
    return fresh_cache() if not config.is_quick() else contextlib.nullcontext()


def tiny_vit(layers: int) -> nn.Module:
    """torchvision's ViT at ViT-Tiny's width (192 wide, 3 heads, 16x16 patches), random weights."""
    vit = VisionTransformer(image_size=224, patch_size=16, num_layers=layers, num_heads=3, hidden_dim=192, mlp_dim=768)
    nn.init.normal_(vit.heads.head.weight, std=0.02)   # torchvision starts the classifier at zero: every output 0
    return vit


def images(model):
    return model, (torch.randn(REAL_BATCH, 3, 224, 224),)


def minilm_inputs():
    mini = load_minilm()
    passages = load_retrieval_set().passages
    texts = [" ".join(passages[5 * i:5 * i + 5]) for i in range(REAL_BATCH)]   # five passages: about 128 tokens
    return mini.model, mini.tokenize(texts, pad_to=128)


def gpt_inputs(tokens):
    gpt, tok = load_tiny_gpt()
    return gpt, (torch.tensor(tok.encode(load_corpus()[:REAL_BATCH * tokens])).view(REAL_BATCH, tokens),)


# name: (kind, name in the records, builds the model and its inputs, settings beyond default and freezing)
REAL = {
    "ResNet-18": ("vision", "resnet18", lambda: images(torchvision.models.resnet18()), ["bf16 autocast"]),
    "MobileNetV2": ("vision", "mobilenet_v2", lambda: images(torchvision.models.mobilenet_v2()), []),
    "ViT (Tiny width, 6 layers)": ("vision", "vit_tiny6", lambda: images(tiny_vit(6)), []),
    "MiniLM": ("hf", "minilm", minilm_inputs, ["max-autotune", "bf16 autocast"]),
    "tiny GPT": ("hf", "tiny_gpt", lambda: gpt_inputs(config.pick(64, 256)), []),
}
if config.is_quick():
    REAL = {"tiny GPT": REAL["tiny GPT"]}
built = {}
for name, (kind, _, build, _) in REAL.items():
    torch.manual_seed(0)
    model, inputs = build()
    built[name] = (model.eval(), tuple(inputs))
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{name:<27} {kind:<6} {params:5.1f}M parameters, input {' and '.join('x'.join(map(str, t.shape)) for t in inputs)}")
print(cpu.info().line())
cpu_profile = cpu.active_profile()
why_not = (f"torch's vector code is capped at {torch.backends.cpu.get_cpu_capability()} here"
           + (f" (the {cpu_profile} CPU profile)" if cpu_profile else "")
           + ", which stands for a CPU without bf16 instructions, although oneDNN, which that cap does not "
           "reach, still uses the real CPU's (section 3)" if capped and native_bf16
           else "no native bf16 here")
print(f"native bf16 instructions: {', '.join(native_bf16) if native_bf16 else 'none'}; "
      f"bf16 rows {'run' if bf16_here else 'skipped: ' + why_not}")

# %% [markdown]
# One function compiles one model under every setting and times them all. Each setting is passed twice.
# It goes into the model's own `torch.compile(model, options=...)` call (for max-autotune, the options
# its mode stands for, plus freezing), so that each setting gets a compiled version of its own: Dynamo
# keeps compiled versions apart by that call's arguments and by guards on the inputs and on state such as
# grad mode and autocast. And it is set around the first call with `torch._inductor.config.patch`,
# because Dynamo reads the global `freezing` setting while it traces, to decide whether to treat the
# weights as constants that Inductor may fold into the code. The cell asserts that each setting's first
# call compiled graphs of its own; the table's error column shows whether a setting changed the
# computation (folded weights round differently). bf16 calls the frozen compiled model inside
# `torch.autocast`, which fails a guard on the autocast state and compiles a second graph. With all of a
# model's versions in one process, eager and every compiled version are timed in one interleaved
# comparison: a slow spell on a busy machine falls on every row's rounds, not on one row's, and every
# verdict is over the same eager run.
#
# The error bounds. In float32 the compiled code adds in another order and folds batch norms into the
# weights, each a rounding of about 1e-7 of a value, so a relative error (in norm) above 1e-4 would be a
# wrong computation, not rounding. bf16 keeps 8 significant bits (a rounding error of up to 2⁻⁸ ≈ 0.4%
# of a value) and rounds the
# inputs of every product, layer after layer, so its bound is 5e-2.
#
# The cell also profiles five eager calls of each model and counts the share of its operator time in
# convolutions, matrix multiplies and attention. Those are library kernels. In the default setting
# the compiled code still calls them, but for a convolution net on the CPU Inductor first switches the
# activations to the channels-last memory layout, for which oneDNN picks other convolution kernels.
# What compiling fuses away is the rest, together with the Python time between operators, which this
# share leaves out (notebook 01, section 5). The other settings change the library calls further: freezing hands them packed
# weights, with batch norms folded in and activations fused into the call, max-autotune may replace
# them with its own templates, and bf16 swaps them for bf16 ones. So the share is a guide to where a
# model's time goes, not a bound on what compiling can gain.

# %%
FP32_TOL, BF16_TOL = 1e-4, 5e-2
LIBRARY_OPS = ("conv", "linear", "addmm", "mm", "bmm", "matmul", "scaled_dot_product", "mkldnn")


def rel_err(out, ref):
    """Relative error of out against ref, in norm (both as float32)."""
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def in_bf16(fn):
    """fn, called inside a bf16 autocast region."""
    def run(*args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*args)
    return run


def as_is(fn):
    return fn


def compile_settings(name, model, inputs, settings):
    """Compile model once per setting, check each output against eager's, and time eager and every compiled
    version side by side. settings: label -> (torch.compile options, wrapper around the compiled model).

    Full mode: the default setting's first call starts from an empty Inductor cache and the others share a
    second one (each later one reuses kernels an earlier one built); quick mode uses the on-disk cache."""
    torch._dynamo.reset()
    compiled, fns, first_s, cache, tuning = {}, {}, {}, {}, {}
    with torch.no_grad(), redirect_stderr(io.StringIO()):
        reference = model(*inputs)
        for labels in (["default"], [label for label in settings if label != "default"]):
            with empty_cache() if labels else contextlib.nullcontext():
                for label in labels:
                    options, wrap = settings[label]
                    key = tuple(sorted(options.items()))   # settings with the same options share one compile
                    if key not in compiled:
                        compiled[key] = torch.compile(model, options=options or None)
                    fns[label] = wrap(compiled[key])
                    before = {k: counters[g][k] for g, k in TUNING_COUNTERS.values()}
                    graphs = counters["stats"]["unique_graphs"]
                    with torch._inductor.config.patch(options):   # Dynamo reads `freezing` while it traces
                        first_s[label], cache[label] = bench.first_call_and_cache(fns[label], *inputs)
                    assert counters["stats"]["unique_graphs"] > graphs, f"{name}, {label}: no graph of its own"
                    tuning[label] = {what: counters[g][k] - before[k] for what, (g, k) in TUNING_COUNTERS.items()}
        errors = {label: rel_err(fn(*inputs), reference) for label, fn in fns.items()}
        table = bench.compare({"eager": model, **fns}, *inputs, warmup=1, min_run_time=0.6)
    return {"first_s": first_s, "cache": cache, "errors": errors, "table": table, "tuning": tuning}


SHARE_CALLS = 5  # summed over a few calls: one call's share moves a lot on a busy machine


def library_share(model, inputs):
    """Share of eager operator time (SHARE_CALLS calls) spent in convolutions, matrix multiplies and attention."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(SHARE_CALLS):
            model(*inputs)
    ops = [e for e in p.key_averages() if e.key.startswith("aten::")]
    library = sum(e.self_cpu_time_total for e in ops if any(word in e.key for word in LIBRARY_OPS))
    return library / sum(e.self_cpu_time_total for e in ops)


# what max-autotune did: matrix-multiply shapes it timed candidates for, and kernels from Inductor's own templates
TUNING_COUNTERS = {"autotuned": ("inductor", "select_algorithm_autotune"),
                   "templates": ("inductor", "cpp_templated_kernel_counter")}
FROZEN = {"freezing": True}
MAX_AUTOTUNE = {**torch._inductor.list_mode_options("max-autotune"), **FROZEN}
real = {}
table_start = time.perf_counter()
for name, (kind, key, _, extra) in tqdm(REAL.items(), desc="models", ncols=80):
    model, inputs = built[name]
    settings = {"default": ({}, as_is)}
    if not config.is_quick():
        settings["freezing"] = (FROZEN, as_is)
        if "bf16 autocast" in extra and bf16_here:
            settings["bf16 autocast"] = (FROZEN, in_bf16)
        if "max-autotune" in extra:
            settings["max-autotune"] = (MAX_AUTOTUNE, as_is)
    real[name] = {"kind": kind, "key": key, **compile_settings(name, model, inputs, settings),
                  "library": library_share(model, inputs)}
table_s = time.perf_counter() - table_start

# %%
SETTING_KEYS = {"default": "default", "freezing": "freezing", "max-autotune": "max_autotune", "bf16 autocast": "bf16"}
COLOURS = {"faster": "tab:green", "no clear difference": "tab:gray", "slower": "tab:red"}
rows = []
for name, r in real.items():
    table = r["table"]
    eager = table.row("eager")
    for label, first_s in r["first_s"].items():
        tol = BF16_TOL if label == "bf16 autocast" else FP32_TOL
        assert r["errors"][label] < tol, f"{name}, {label}: relative error {r['errors'][label]:.1e} (bound {tol})"
        compiled = table.row(label)
        word = bench.record_verdict(f"compile.real.{r['key']}.{SETTING_KEYS[label]}_vs_eager", table.verdict(label),
                                    noisy=any(x.iqr_s > bench.NOISY_SPREAD * x.median_s for x in (eager, compiled)),
                                    label=label, against="eager", ratio=round(table.speedup(label), 4),
                                    margin=bench.VERDICT_MARGIN)
        rows.append({"model": name, "kind": r["kind"], "setting": label, "first_s": first_s,
                     "first_words": bench.first_call_words(r["cache"][label]),
                     "eager_ms": eager.median_s * 1e3, "ms": compiled.median_s * 1e3,
                     "eager_iqr": eager.iqr_s * 1e3, "iqr": compiled.iqr_s * 1e3, "speedup": table.speedup(label),
                     "error": r["errors"][label], "word": word, "said": table.describe(label)})

print(f"{'model':<27} {'setting':<14} {'first call':>10} {'eager ms (IQR)':>15} {'compiled ms (IQR)':>18} "
      f"{'speed-up':>8} {'error':>8}")
for row in rows:
    print(f"{row['model']:<27} {row['setting']:<14} {row['first_s']:>9.1f}s {row['eager_ms']:>8.1f} ({row['eager_iqr']:4.1f}) "
          f"{row['ms']:>11.1f} ({row['iqr']:4.1f}) {row['speedup']:>7.2f}x {row['error']:>8.1e}")
first_calls_s = sum(row["first_s"] for row in rows)
bf16_ran = any(row["setting"] == "bf16 autocast" for row in rows)
print(f"\nevery output within {FP32_TOL:g} (fp32)" + (f" or {BF16_TOL:g} (bf16)" if bf16_ran else "")
      + " of eager's, relative")
print(f"the table took {table_s:.0f} s on this machine: {first_calls_s:.0f} s in the {len(rows)} first calls, "
      f"{round(table_s) - round(first_calls_s)} s in timing, error checks and profiling")
bench.record("compile.real.table_s", table_s, "s", first_calls_s=first_calls_s, rows=len(rows), models=len(real),
             batch=REAL_BATCH, threads=torch.get_num_threads())
# What Inductor's graph cache did in each first call: in full mode the default setting starts from an empty
# cache and the other settings share a second one, so a later setting (bf16, max-autotune) may find what
# freezing stored.
plain = [row for row in rows if not real[row["model"]]["cache"][row["setting"]]["hit"]]
print("first calls: " + ("every one compiled all of its graphs" if len(plain) == len(rows) else "; ".join(
    f"{row['model']}, {row['setting']} ({row['first_words']})" for row in rows if row not in plain)
    + (f"; the other {counted(len(plain), 'row')} compiled all of their graphs" if plain else "")))


def spread_cause(table):
    """Why a model's timings spread, by the other programs' load sampled just after them; the timings are retaken
    by the cell above, which compiles every model again, not by this one."""
    load, rerun = table.other_load, f"rerun the cell above, which compiles and times every model ({table_s:.0f} s here)"
    if load is None:
        return f"the timings varied from call to call, so treat them as rough and {rerun}"
    if load >= bench.BUSY_LOAD:
        return (f"other programs were using about {load:.1f} cores just after the timings, so treat them as rough "
                f"and, when the machine is quiet, {rerun}")
    return (f"other programs were nearly idle just after the timings (about {load:.1f} cores), so the calls "
            f"themselves varied or a burst of other work had ended before the sample; treat them as rough and {rerun}")


for name, r in real.items():  # models with a row whose IQR exceeds 20% of its median
    if r["table"].spread_note():
        print(f"{name}: {r['table'].spread_note(cause=spread_cause(r['table']))}")
print("verdicts on this machine, each over the model's eager run in the same interleaved timing, with the share of "
      "eager's operator time in library kernels (convolutions, matrix multiplies, attention), the part that "
      "compiling hands to library kernels rather than generating code for:")
for row in rows:
    tail = ""
    if row["word"] == "faster":  # so each call saves time: the first call over the time saved per call
        tail = f"; the first call is repaid after {about(row['first_s'] * 1e3 / (row['eager_ms'] - row['ms']), 'call')}"
    said = row["said"] + ("; this cell does not measure why it ran slower" if row["word"] == "slower" else "")
    print(f"- {row['model']}, {row['setting']}: {said} | library share {real[row['model']]['library']:.0%}{tail}")
if cpu.settings_only_profile():   # the compiled rows mix capped generated code with uncapped library kernels
    print(f"CPU profile {cpu_profile}: it caps torch's own vector kernels and the code Inductor generates, at "
          f"{torch.backends.cpu.get_cpu_capability()}, but not the library kernels, which still use the real CPU's "
          "instructions, so these rows stand for no real CPU exactly" + inductor_code.scalar_note())

fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.32 * len(rows)))
ax.barh([f"{row['model']}, {row['setting']}" for row in rows], [row["speedup"] for row in rows],
        color=[COLOURS[row["word"]] for row in rows])
ax.axvline(1.0, color="black", lw=1)
ax.set_xscale("log")
ax.set_xlabel("speed-up over eager (log scale): green faster, grey no clear difference, red slower")
ax.invert_yaxis()
ax.set_title(f"torch.compile on real models, this CPU, batch {REAL_BATCH}")
fig.tight_layout();


# %% [markdown]
# Two settings build on freezing, so the next cell also judges them against it, in the same interleaved
# timing: bf16 against frozen fp32 where bf16 ran, and max-autotune against freezing. Then the geometric
# mean of each kind, beside the published figures.

# %%
def geomean(values):
    """The geometric mean: the one speed-up that, applied to every model, gives the same product."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


bf16_gains = {}
for name, r in real.items():
    table = r["table"]
    if "bf16 autocast" in r["first_s"]:
        said = table.describe("bf16 autocast", "freezing", name=f"compile.real.{r['key']}.bf16_vs_freezing")
        bf16_gains[name] = table.ratio("freezing", "bf16 autocast")
        print(f"{name}, bf16 autocast against frozen fp32: {said}")
    if "max-autotune" in r["first_s"]:
        said = table.describe("max-autotune", "freezing", name=f"compile.real.{r['key']}.max_autotune_vs_freezing")
        word, tuning = table.verdict("max-autotune", "freezing"), r["tuning"]["max-autotune"]
        tail = ""
        if word != "no clear difference" and not tuning["templates"]:
            tail = (": with no template chosen both run the same library calls for their matrix multiplies, so this "
                    "cell cannot tell where the gap comes from")
        elif word == "slower":
            tail = (f": it chose {'them' if tuning['templates'] > 1 else 'it'} by timing each matrix multiply alone, "
                    "and in the whole model the result ran slower than freezing's library calls; this cell does not "
                    "measure why")
        templates = (f"{tuning['templates']} of the kernels it generated are Inductor's own templates"
                     if tuning["templates"] else "none of the kernels it generated is one of Inductor's own templates")
        print(f"{name}, max-autotune against freezing: {said}; it timed candidates for {tuning['autotuned']} "
              f"matrix-multiply shapes, and {templates}{tail}")

# TorchInductor CPU update 5 (PyTorch developer forum, 2023): the geometric-mean speed-up of Inductor over
# eager, fp32 inference, (all threads of one server socket, one thread on one core).
PUBLISHED = {"TorchBench": (1.39, 1.29), "Hugging Face": (1.20, 1.15), "TIMM": (1.73, 1.37)}
SUITES = {"vision": ("TorchBench", "TIMM"), "hf": ("Hugging Face",)}
geo = {}
for kind, suites in SUITES.items():
    picked = {s: [row for row in rows if row["kind"] == kind and row["setting"] == s] for s in ("default", "freezing")}
    geo[kind] = {s: geomean([row["speedup"] for row in v]) for s, v in picked.items() if v}
    if not geo[kind]:
        continue
    # The published CPU figures were measured with freezing on, so ours are compared with freezing's mean.
    best = "freezing" if "freezing" in geo[kind] else "default"
    n_models = len(picked["default"])
    # How firm each mean is: its rows that were not clearly different from eager, and its models whose timings
    # had a large spread (the notes under the table)
    unclear = {s: sum(row["word"] == "no clear difference" for row in v) for s, v in picked.items() if v}
    spread = [name for name, r in real.items() if r["kind"] == kind and r["table"].spread_note()]
    print(f"\n{kind}, {n_models} model{'s' if n_models != 1 else ''}, geometric mean over eager: " + ", ".join(
        f"{s} {g:.2f}x" + (f" ({unclear[s]} of its {len(picked[s])} rows not clearly different from eager)"
                           if unclear[s] else "") for s, g in geo[kind].items()))
    rough = (f"; rough: {' and '.join(spread)} had a large spread (the notes under the table)" if spread else "")
    for suite in suites:
        socket, one_thread = PUBLISHED[suite]
        word = bench.band_verdict(geo[kind][best], one_thread, band=0.1,
                                  name=f"compile.real.geomean.{kind}.vs_{suite.lower().replace(' ', '_')}_one_thread")
        other = "default" if best == "freezing" and "default" in geo[kind] else None
        other_word = other and bench.band_verdict(geo[kind][other], one_thread, band=0.1)
        also = (f" (with the default setting, {geo[kind][other]:.2f}x: {other_word}; the setting decides it here)"
                if other and other_word != word else "")
        print(f"    published for {suite}: {socket:.2f}x on a socket, {one_thread:.2f}x on one thread; "
              f"ours ({best}" + (", the setting the published CPU figures used" if best == "freezing" else "")
              + f") against the one-thread figure: {word} (10% band){also}{rough}")
print(f"\nhere: {torch.get_num_threads()} torch threads on {os.cpu_count()} cores, {cpu.cpu_model()} ({cpu.cpu_class()}), "
      f"batch {REAL_BATCH}, {len(real)} model{'s' if len(real) != 1 else ''}, torch {torch.__version__.split('+')[0]}, "
      "Inductor's settings of today; "
      "published: a server socket or one of its cores, each suite's own inputs and batch sizes, 46 to 61 models a suite")

largest = max(rows, key=lambda row: row["first_s"])
bench.record("compile.real.first_call_s", largest["first_s"], "s", model=largest["model"], setting=largest["setting"],
             cache="on-disk cache as found" if config.is_quick()
             else "empty Inductor cache, warm process" if largest["setting"] in ("default", "freezing")
             else "freezing's cache, warm process")
for kind in ("vision", "hf"):
    if geo.get(kind):
        best = "freezing" if "freezing" in geo[kind] else "default"
        value = geo[kind][best]
        context = dict(setting=best, default=geo[kind]["default"], batch=REAL_BATCH, threads=torch.get_num_threads(),
                       models=", ".join(n for n in real if real[n]["kind"] == kind))
        if kind == "vision":
            bench.record("compile.real.geomean.vision", value, "x", **context)
        else:
            bench.record("compile.real.geomean.hf", value, "x", **context)
if bf16_gains:
    bench.record("compile.real.bf16_speedup", geomean(list(bf16_gains.values())), "x", over="frozen fp32",
                 models=", ".join(bf16_gains), native=", ".join(native_bf16))
print(f"largest first call: {largest['model']}, {largest['setting']}, {largest['first_s']:.1f} s"
      + (f"; bf16 over frozen fp32, geometric mean of {len(bf16_gains)}: {geomean(list(bf16_gains.values())):.2f}x"
         if bf16_gains else ""))

# %% [markdown]
# Why our geometric means and the published ones need not agree, item by item (each can move a
# figure either way):
#
# - **Threads.** The published runs used all the threads of a server socket, or exactly one. This
#   notebook uses the threads torch has here, printed above. The costs compiling removes (a dispatch
#   and a pass over memory for every operation) shrink less than the arithmetic does when more
#   threads share the work: a dispatch not at all, a pass over memory only until the memory bandwidth
#   runs out. So their share of a call, and what removing them is worth, changes with the thread count.
# - **Batch.** With few inputs a call does little arithmetic, so fixed per-operation costs are a larger
#   share, which is what compiling removes; with large batches the library kernels dominate. The
#   suites run each model at its own batch size.
# - **CPU.** A different CPU has different vector units, caches and memory bandwidth, and oneDNN picks
#   other kernels; the cell printed this one's class.
# - **Model set.** The few models here (the table above counts them) are not 170. The library share
#   printed beside each verdict is the part of eager's operator time spent in library kernels, which
#   compiling calls rather than generates, and a suite's mean depends on how many of its models spend
#   their time there. A geometric mean of a handful of models is a sample, not a benchmark.
# - **Release.** Inductor and oneDNN have changed since the figures were published; so has eager.
#
# What carries over is the method: compile your own model, check its output against eager, time it
# side by side after warm-up, and read the first call beside the steady state: where a row's verdict is
# faster, its line says after about how many calls the saving adds up to the first call's compile. On a
# laptop the compile cache (notebook 01, section 7) can shorten that first call in a second process, but
# only the generated code comes from the cache and Dynamo still traces (from this notebook's second run on,
# a first call labelled "traced, code from the cache", as in section 6, and in section 2 where FlexAttention
# compiled, shows what such a first call still costs here). Freezing, and the max-autotune row built on it, is for a model you run for inference, never one you train.

# %% [markdown]
# ## 6 · Compiling the optimizer step and the backward pass
#
# `torch.compile(model)` compiles the forward and, through AOTAutograd, the matching backward. Two
# parts of a training step stay outside it:
#
# - **The optimizer step.** `opt.step()` is a loop over every parameter tensor, a few small
#   element-wise operations each. Compiled, Inductor can fuse them into a few loops over all of them
#   (notebook 03 shows how to read the generated code; the cells below count graphs and time the step). Put
#   the learning rate in a tensor (`lr=torch.tensor(...)`) so that an LR scheduler changing it does
#   not trigger a recompile: a Python float would be a constant in the graph.
# - **Hooks and the autograd engine.** *Compiled autograd* (`torch._dynamo.config.compiled_autograd`)
#   traces the backward pass when `.backward()` runs, hooks included, into one graph.

# %%
threads_before = torch.get_num_threads()
torch.set_num_threads(1)   # many small tensors: waking a second thread can cost more than it saves (notebook 10)


def make_mlp():
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(config.pick(6, 12))]
    return nn.Sequential(*layers, nn.Linear(64, 1))


xo, yo = torch.randn(32, 64), torch.randn(32, 1)
models, optimizers, schedulers = [], [], []
for _ in range(2):
    m = make_mlp()
    m.zero_grad()
    F.mse_loss(m(xo), yo).backward()            # the same gradients in both copies
    opt = torch.optim.AdamW(m.parameters(), lr=torch.tensor(0.01))
    models.append(m)
    optimizers.append(opt)
    schedulers.append(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50))


def eager_step():
    optimizers[0].step()
    schedulers[0].step()


@torch.compile
def compiled_opt_step():
    optimizers[1].step()


def compiled_step():
    compiled_opt_step()
    schedulers[1].step()


# step() wraps itself in a profiler label, which the compiled step drops; Dynamo's warning that it does is noise here.
logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(lambda r: "Profiler record function" not in str(r.msg))
torch._dynamo.reset()
counters.clear()
first_s, events = bench.first_call_and_cache(compiled_step)
print(f"first compiled step: {first_s:.1f} s ({bench.first_call_words(events)})")
eager_step()
for _ in range(20):
    eager_step()
    compiled_step()
STEPS = 21  # one of each above, then 20 pairs
assert schedulers[0].last_epoch == schedulers[1].last_epoch == STEPS
graphs_after_steps = counters["stats"]["unique_graphs"]
diff = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters()))
lrs = [float(o.param_groups[0]["lr"]) for o in optimizers]
print(f"after {STEPS} steps each: parameters differ by at most {diff:.1e}; learning rates {lrs[0]:.5f} / "
      f"{lrs[1]:.5f}; graphs compiled {graphs_after_steps}")
assert diff < 1e-5 and math.isclose(lrs[0], lrs[1], rel_tol=1e-6)
assert graphs_after_steps <= 2, "a tensor learning rate must not recompile at every scheduler step"

# %% [markdown]
# This section runs torch on one thread: each parameter tensor here is small, and on a small
# machine waking a second thread for every little loop can cost more than the work it takes over.
#
# Twenty-one steps each, the learning rate changing at each, and the compiled step still matches the eager
# one to rounding, without a recompile per step. (The optimizer's first step may compile twice: its
# state is created on the first call.) The speed, measured on the same parameters:

# %%
opt_cmp = bench.compare({"eager AdamW step": eager_step, "compiled AdamW step": compiled_step},
                        min_run_time=config.pick(0.3, 1.5))
print(opt_cmp)
step_speedup = opt_cmp.speedup("compiled AdamW step")
n_tensors = len(list(models[0].parameters()))
bench.record("compile.optimizer.step_speedup", step_speedup, "x", param_tensors=n_tensors)
step_word = opt_cmp.verdict("compiled AdamW step", "eager AdamW step")
print(f"verdict on this machine: the compiled step is "
      f"{opt_cmp.describe('compiled AdamW step', name='compile.optimizer.step.compiled_vs_eager')} " + {
          "faster": f"({n_tensors} parameter tensors: eager dispatches several small operations per tensor)",
          "no clear difference": f"({n_tensors} parameter tensors)",
          "slower": f"({n_tensors} parameter tensors; this cell does not measure why)"}[step_word])


# %%
def train_step(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss


eager_model, ca_model = make_mlp(), make_mlp()
for m in (eager_model, ca_model):      # a gradient hook: compiled autograd traces it into the backward graph
    m[0][0].weight.register_hook(lambda g: g.clamp(-0.01, 0.01))

train_step(eager_model, xo, yo)
torch._dynamo.reset()
counters.clear()
with torch._dynamo.config.patch(compiled_autograd=True):   # read when torch.compile wraps the function
    compiled_train_step = torch.compile(train_step)
    first_s, events = bench.first_call_and_cache(compiled_train_step, ca_model, xo, yo)
print(f"first step with compiled autograd: {first_s:.1f} s ({bench.first_call_words(events)}); "
      f"backward graphs captured by compiled autograd: {counters['compiled_autograd']['captures']}; "
      f"graphs in all: {counters['stats']['unique_graphs']}, operations traced: {counters['stats']['calls_captured']}")
grad_diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(eager_model.parameters(), ca_model.parameters()))
print(f"gradients differ from eager by at most {grad_diff:.1e}; the hooked weight's gradient stays in "
      f"[{ca_model[0][0].weight.grad.min().item():.3f}, {ca_model[0][0].weight.grad.max().item():.3f}]")
assert counters["compiled_autograd"]["captures"] >= 1 and grad_diff < 1e-5
assert ca_model[0][0].weight.grad.abs().max() <= 0.01 + 1e-7
torch.set_num_threads(threads_before)

# %% [markdown]
# Compiled autograd is meant for a backward pass that is more than AOTAutograd's precomputed graph:
# hooks, gradient accumulation into `.grad`, and distributed training, where it lets the compiler
# overlap gradient communication with computation. Enable it only around the training step, as
# above (the setting is read when `torch.compile` wraps the function), so the rest of the program
# keeps the ordinary autograd engine.
#
# ## 7 · What did the compiler do? `TORCH_TRACE` and `tlparse`
#
# `TORCH_LOGS` (notebook 02) prints while the program runs. For a whole run, set
# `TORCH_TRACE=<folder>`: torch writes a structured log of everything the compiler did, per
# process, and `tlparse` turns it into an HTML report with one section per *compile ID*: `[0/1]`
# means frame 0 (the first function Dynamo compiled), its second compilation (a recompile). The
# program below has a graph break (a `print`) and a recompilation (an input of another rank). We run
# it in a fresh process so that the trace holds this program alone.

# %%
TRACED = """
import json, torch

def scaled_tanh(x, scale):
    y = torch.tanh(x) * scale
    print("checkpoint")              # a graph break: Dynamo cannot put print() in a graph
    return y.sum(dim=-1)

f = torch.compile(scaled_tanh)
f(torch.randn(8, 16), 2.0)
f(torch.randn(8, 16), 2.0)           # same guards: no new compile
f(torch.randn(4, 8, 16), 2.0)        # another rank: a recompilation
print(json.dumps({"done": True}))
"""
trace_dir, report_dir = BUILD / "trace", BUILD / "tlparse"
shutil.rmtree(trace_dir, ignore_errors=True)
assert fresh.run_script(TRACED, env={"TORCH_TRACE": str(trace_dir)}, cold=False)["done"]
log = trace_report.trace_logs(trace_dir)[-1]
index = trace_report.render(log, report_dir)
pages = trace_report.pages(report_dir)
print(f"trace: {log.name} ({log.stat().st_size / 1e3:.0f} kB); report: {index} with {len(pages)} HTML pages")

# %% [markdown]
# Open `index.html` in a browser to click through it. Its table of contents is also written as JSON
# (`compile_directory.json`): for each compile ID, the artifacts the compiler logged (the captured
# graph, the generated code, the guards, and so on). Reading it here:

# %%
directory = json.loads((report_dir / "compile_directory.json").read_text())
compile_ids = [cid for cid in directory if cid != "[-/-]"]     # [-/-]: entries outside any compile
print("compile IDs:", ", ".join(compile_ids))
for cid in compile_ids:
    names = [a["name"] for a in directory[cid]["artifacts"]]
    kinds = sorted({n.rsplit("_", 1)[0] for n in names})
    print(f"  {cid:<8} {len(names):2} artifact{'s' if len(names) != 1 else ''}"
          f"{', e.g. ' if len(kinds) > 4 else ': '}{', '.join(kinds[:4])}")

def artifact_text(kind):
    """Texts of every artifact whose name starts with `kind`, with its compile ID."""
    return [(cid, (report_dir / a["url"]).read_text()) for cid in compile_ids
            for a in directory[cid]["artifacts"] if a["name"].startswith(kind)]

breaks = artifact_text("dynamo_graph_break_reason")
recompiles = artifact_text("recompile_reasons")
print(f"\ngraph-break entries: {len(breaks)}; first, in {breaks[0][0]}:")
print("   ", next(line for line in breaks[0][1].splitlines() if "print" in line).strip())
break_link = next((word for line in breaks[0][1].splitlines() for word in line.split() if word.startswith("http")), None)
print("    its page:", break_link or "(this torch links no page)")
print(f"recompile entries: {len(recompiles)}; first, in {recompiles[0][0]}:")
print("   ", recompiles[0][1].strip().splitlines()[0].strip(' []"'))
frames = {cid.strip("[]").split("/")[0] for cid in compile_ids}
assert breaks and recompiles and len(frames) >= 2 and len(compile_ids) >= 3
bench.record("compile.tlparse.report_pages", len(pages), "pages", compile_ids=len(compile_ids));

# %% [markdown]
# The report shows what this program did: frame 0 is `scaled_tanh` up to the `print`, frame 1 the
# code after it (Dynamo's *resume function*); each got a second compile ID when the rank changed, and
# the recompile entry names the guard that failed. An ID with a suffix, such as `[0/0_1]`, is a second
# attempt at the same compile: on meeting the graph break Dynamo restarted the trace, now knowing
# where to stop. Where the installed torch has one, the `print` entry links to that graph break's page
# on PyTorch's graph-break site (printed above).
#
# **Attaching it to a bug report.** The HTML folder depends on the tlparse version (the cell below
# prints its size beside the raw trace's);
# what maintainers want is the raw trace. Reproduce the problem in a small script, run it with
# `TORCH_TRACE=/tmp/trace`, and attach the folder as an archive:

# %%
archive = shutil.make_archive(str(BUILD / "trace_for_bug_report"), "gztar", root_dir=trace_dir)
size_kb = (BUILD / "trace_for_bug_report.tar.gz").stat().st_size / 1e3
report_kb = sum(p.stat().st_size for p in report_dir.rglob("*") if p.is_file()) / 1e3
trace_kb = sum(p.stat().st_size for p in trace_dir.iterdir()) / 1e3
print(f"{archive}: {size_kb:.0f} kB, from a {trace_kb:.0f} kB trace; the HTML report folder: {report_kb:.0f} kB")


# %% [markdown]
# ### Making graph breaks and recompiles loud
#
# In a model you mean to compile whole, a graph break you did not notice is a slow-down you did
# not measure. `fullgraph=True` turns any break into an error for the whole compiled function;
# `torch._dynamo.error_on_graph_break(True)` (on recent releases; the cell falls back to
# `fullgraph=True` where it is missing) does the same for the code it wraps only, so a model can allow breaks in one place and forbid them in another. For recompiles,
# `torch.compiler.set_stance("fail_on_recompile")` makes any new compile an error, for example in a
# serving loop after warm-up (notebook 02 shows the other stances).

# %%
def with_break(x):
    y = torch.sin(x)
    print("a side effect")
    return y * 2


torch._dynamo.reset()
if compat.has("error_on_graph_break"):
    strict = torch.compile(torch._dynamo.error_on_graph_break(True)(with_break))
else:   # an older torch: fullgraph=True is the way to forbid breaks
    strict = torch.compile(with_break, fullgraph=True)
err = expect_error(strict, torch.randn(4), match="print")
print("error_on_graph_break:", type(err).__name__, "-", str(err).splitlines()[0].split(". ")[0])

served = torch.compile(lambda x: torch.tanh(x) * 2)
served(torch.randn(8, 4))                        # warm-up: compiles for this shape
with torch.compiler.set_stance("fail_on_recompile"):
    served(torch.randn(8, 4))                    # same shape: fine
    err = expect_error(served, torch.randn(4, 2, 3), match="recompil")
print("fail_on_recompile:", type(err).__name__, "-", str(err).splitlines()[0].split(". ")[0])   # its first sentence


# %% [markdown]
# ### The compile-time budget
#
# Cold starts have a second remedy besides regional compilation: the compile caches. Notebook 01
# (section 7) measures a cold and a warm start in fresh processes and saves and loads the
# *mega-cache* (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`), which carries
# compiled graphs to another machine. Regional compilation shrinks the work; the caches avoid
# repeating it.
#
# ## Check yourself
#
# **Exercise 1.** Write `attention(q, k, v, mask)`: softmax(QKᵀ/√d)·V where `mask` is a boolean
# tensor that broadcasts to the scores (True = may attend). Every row keeps at least one True.

# %%
def attention(q, k, v, mask):
    # Your code here.
    return torch.zeros_like(q)


exercises.check("11.attention", attention)


# %% [markdown]
# **Exercise 2.** Write `make_sliding_window(window)` returning a FlexAttention `mask_mod`: query
# position `q_idx` may attend to key position `kv_idx` when it is not in the future and is fewer
# than `window` positions back (a window of 1 is the token itself). The arguments are tensors, so
# combine conditions with `&`, not `and`.

# %%
def make_sliding_window(window: int):
    def mask_mod(b, h, q_idx, kv_idx):
        # Your code here.
        return q_idx >= kv_idx
    return mask_mod


exercises.check("11.sliding_window", make_sliding_window)


# %% [markdown]
# **Exercise 3.** Write `block_sparsity(mask, block)`: the fraction of the (block × block) tiles of a
# square boolean mask (sides divisible by `block`) that contain no True entry, which is what a block
# mask lets the kernel skip. Stuck? `print(exercises.solution_source("11.block_sparsity"))`.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
def block_sparsity(mask: torch.Tensor, block: int) -> float:
    # Your code here.
    return 0.0


exercises.check("11.block_sparsity", block_sparsity)

# %% [markdown]
# ## Summary
#
# - `F.scaled_dot_product_attention` equals the hand-written softmax(QKᵀ/√d)V to rounding; on a CPU
#   it dispatches to a flash-attention kernel that never builds the S×S score matrix, which the
#   memory panel showed. `sdpa_kernel` lists and restricts the backends.
# - FlexAttention expresses masks and biases as small functions; each variant matched its
#   masked-SDPA reference (compiled where Inductor supports this CPU), and a block mask records the
#   empty tiles the fused kernel skips (counted above; the unfused reference computes them all). On
#   the installed torch it is inference only on the CPU.
# - Autocast to bf16 under `torch.compile` keeps two to three significant digits (section 3 printed its
#   error); whether it is faster depends on the CPU's bf16 support (the verdict above).
# - Regional compilation compiles one block and reuses it: far fewer operations traced (asserted), so
#   less to compile; its cold start, measured in fresh processes with empty caches (Inductor's
#   precompiled header aside, whose line in section 4 says whether any run built it), and its
#   steady-state cost were printed as verdicts.
# - On real models (section 5) `torch.compile` was checked against eager to 1e-4 in fp32 and, where
#   bf16 rows ran, 5e-2 in bf16; whether and how much faster each model and setting runs here, after how many calls its first call is
#   repaid, and how the geometric means compare with the published suites' are this machine's verdicts,
#   printed with the threads, batch, CPU and model set that make them differ.
# - A compiled optimizer step captures the per-parameter loop in one or two graphs (section 6 counts them and
#   times the step against eager); a tensor learning rate keeps the LR
#   scheduler from recompiling. Compiled autograd traces the backward pass, hooks included.
# - `TORCH_TRACE` + `tlparse` produce a report of a whole run (compile IDs, graph breaks, recompiles);
#   attach the raw trace to bug reports. `error_on_graph_break` and `set_stance("fail_on_recompile")`
#   make silent slow-downs loud.
# - Results recorded: `attn.sdpa.max_abs_err`, `attn.flex.variants_equal`, `attn.flex.block_sparsity`,
#   `compile.regional.cold_start_ratio`, `compile.regional.steady_ratio`, `compile.real.geomean.vision`,
#   `compile.real.geomean.hf`, `compile.real.bf16_speedup` (where bf16 ran), `compile.real.first_call_s`,
#   `compile.real.table_s` (how long section 5's table took),
#   `compile.optimizer.step_speedup`, `compile.tlparse.report_pages`.
#
# ## Further reading
#
# - [`torch.nn.functional.scaled_dot_product_attention`](https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html)
#   and [`torch.nn.attention.sdpa_kernel`](https://docs.pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html)
# - [`torch.nn.attention.flex_attention`](https://docs.pytorch.org/docs/stable/nn.attention.flex_attention.html)
# - [Autocast op reference](https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference): which ops
#   autocast lowers, keeps in float32 or leaves alone, per device
# - [Reducing compile time with regional compilation](https://docs.pytorch.org/tutorials/recipes/regional_compilation.html)
# - [TorchInductor CPU update 5: performance and key optimizations](https://dev-discuss.pytorch.org/t/torchinductor-update-5-cpu-backend-backend-performance-update-and-deep-dive-on-key-optimizations/1117)
#   (the published geometric means) · [Max-autotune on CPU](https://docs.pytorch.org/tutorials/prototype/max_autotune_on_CPU_tutorial.html)
#   · [torchvision models](https://docs.pytorch.org/vision/stable/models.html)
# - [Compiled optimizer with an LR scheduler](https://docs.pytorch.org/tutorials/recipes/compiling_optimizer_lr_scheduler.html)
#   · [Compiled autograd](https://docs.pytorch.org/tutorials/intermediate/compiled_autograd_tutorial.html)
# - [`torch.compile` troubleshooting: `TORCH_TRACE` and tlparse](https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html)
#   · [tlparse on GitHub](https://github.com/pytorch/tlparse)
