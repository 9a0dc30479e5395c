# %% [markdown]
# # 10 · Serving: from a Gradio demo to a batched, streaming model server
#
# A trained model is only useful once something can call it. The quickest way to share one is a
# demo page; the way to serve many people at once is an HTTP server that keeps the model busy.
# Between the two lies most of what makes serving hard: many clients at once, a Python event loop
# that must never block, a model that runs far more efficiently on a batch than on one request,
# and users who want to see the first words before the last are written. This notebook walks that
# path one step at a time, measuring what each step fixes, then puts the course's own server
# (`course_utils.serving`) under load and compares it with LitServe on the same model.

# %% [markdown]
# ## What you will learn
#
# - to put a model behind a Gradio page, then behind a FastAPI endpoint, and what each lacks;
# - why an `async` endpoint that runs the model itself stalls the whole server, and the fix;
# - request batching: a queue, a model worker thread, a maximum batch size and a maximum wait;
# - token streaming with server-sent events, and why time to first token is its own metric;
# - *iteration-level* (continuous) batching with a key-value cache, measured against static
#   batching and against no batching at 1, 8 and 32 concurrent clients;
# - how close the server comes to the bare model, where the rest of the time goes (the worker's
#   phases, its threads' CPU time, the GIL) and what running the engine in a process of its own buys;
# - an OpenAI-compatible API on the same server, so any client that speaks it (here the official
#   `openai` package) can use the model;
# - what `torch.compile` does inside a server, how our server compares with LitServe, and where
#   the production engines (vLLM, Ray Serve, Triton, TorchServe) stand.
#
# **Prerequisites:** notebook 01 (`torch.compile`); HTTP requests and JSON at user level. The
# model is the course's character-level `TinyGPT` (trained on Python's documentation, shipped in
# `data/tiny_gpt.pt`).
#
# **Time on a laptop CPU:** <!-- stamp:time -->2.3 min the first time (every cache empty), 2.4 min after that (compile cache warm, yet no faster in these two runs), 0.9 min in quick mode; measured on the reference machine (2 cores, x86-amx, torch 2.14.1, 2026-12-06) and stamped here by `make stamp`. A slower or busy laptop takes longer. The outputs stored below may come from another machine: the line the imports cell prints names their CPU class (`cpu class:`).<!-- /stamp:time --> Quick mode sends fewer requests and skips the compiled server.
#
# **GPU:** not needed; every server here runs on the CPU. One guarded cell notes what changes on a GPU.

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
import asyncio
import contextlib
import importlib
import json
import os
import queue
import statistics
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import matplotlib.pyplot as plt
import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field
from tqdm import tqdm

from course_utils import bench, config, exercises, inductor_code, session
from course_utils.device import accelerator, requires_accelerator
from course_utils.models import load_tiny_gpt
from course_utils.models.gpt import generate_cached, greedy_steps, pad_prompts
from course_utils.models.greedy import same_greedy
from course_utils.serving.extras.bare import bare_decode_tokens_per_s
from course_utils.serving.server.loadgen import run_load
from course_utils.serving.server.process import serve_in_subprocess
from course_utils.serving.server.settings import default_threads
from course_utils.text import whole_percents

print(session.start(seed=0))
APPS = config.build_dir() / "nb10"   # the programs this notebook writes (%%writefile cells) go here
APPS.mkdir(parents=True, exist_ok=True)
sys.path.insert(0, str(APPS))

# %% [markdown]
# ## The model we serve
#
# `load_tiny_gpt()` checks the checkpoint's sha256 and loads it with `torch.load(...,
# weights_only=True)`, which reads tensors and plain containers only and never runs code stored in
# the file. `generate_cached` continues a batch of prompts greedily with the model's key-value
# cache: the prompt is run once (*prefill*), then each step feeds one new token per sequence and
# attends to the keys and values stored for the earlier ones.
#
# One setting matters before anything is timed: the number of threads torch uses. A decoding step
# of this model is a handful of small matrix products; on a small, busy machine, several OpenMP
# threads per step can spend more time synchronising than computing, and they compete with the
# server's own threads (`python tools/busy_threads.py` measures the effect on your machine). The course's server uses `default_threads()` (one thread on a machine with
# few cores), and so does this notebook.

# %%
model, tok = load_tiny_gpt()
torch.set_num_threads(default_threads())
n_params = sum(p.numel() for p in model.parameters())
print(f"TinyGPT: {n_params / 1e6:.2f} M parameters, {model.config.n_layer} layers, "
      f"context {model.config.block_size} characters, vocabulary {tok.vocab_size}; "
      f"torch threads: {torch.get_num_threads()}")


def complete(prompt: str, max_new_tokens: int = 32) -> str:
    """Return the greedy continuation of one prompt (the text after it)."""
    ids = torch.tensor([tok.encode(prompt)])
    return tok.decode(generate_cached(model, ids, max_new_tokens)[0])


PROMPTS = ["The ", "A class ", "def ", "import ", "If the ", "for x in ", "The object ", "print("]
print(repr("The Python " + complete("The Python ", 48)))



def check_greedy(got: str, prompt: str, n: int, what: str) -> None:
    """Check that `got` is the model's greedy continuation of `prompt`: the same text, or a difference only where
    the two best tokens were within float rounding (a near-tie another order of additions can flip), which
    `same_greedy` names; any other difference fails."""
    tie = same_greedy(model, [tok.encode(prompt)], [tok.encode(got)], [tok.encode(complete(prompt, n))], what=what)
    if tie:
        print(tie)


# The cached decoding gives the same tokens as re-running the whole sequence every step (up to a near-tie).
ids = torch.tensor([tok.encode("The Python ")])
uncached = model.generate(ids, 48, temperature=0.0)[0, ids.shape[1]:].tolist()
tie = same_greedy(model, [ids[0].tolist()], [generate_cached(model, ids, 48)[0]], [uncached], what="the KV cache")
if tie:
    print(tie)
one = bench.time_fn(complete, "The Python ", 32, min_run_time=config.pick(0.3, 1.0))
print(f"one request of 32 tokens: {one.median_ms:.1f} ms, "
      f"i.e. {32 / one.median_s:,.0f} tokens/s for a single user")

# %% [markdown]
# ## Step 1 · A Gradio prototype
#
# Gradio turns a Python function into a web page: give it the function, an input and an output
# component, and `launch()`. Two settings keep it local: `server_name="127.0.0.1"` (only this
# machine can connect) and no `share=True` (which would open a public tunnel through Gradio's
# servers). `prevent_thread_lock=True` returns at once instead of blocking the cell, and the
# environment variable `GRADIO_ANALYTICS_ENABLED=False` stops Gradio from sending usage statistics.
#
# At the end of this notebook the same idea comes back as a page of its own (`demo_page.py`, written
# by a cell you can edit), pointed at our HTTP server instead of at the model.

# %%
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
with warnings.catch_warnings():  # gradio imports tqdm.auto, which warns that widgets are missing
    warnings.filterwarnings("ignore", message="IProgress not found")
    import gradio as gr

prototype = gr.Interface(fn=lambda prompt: complete(prompt, 32), inputs=gr.Textbox(label="Prompt"),
                         outputs=gr.Textbox(label="Continuation"), analytics_enabled=False)
prototype.launch(server_name="127.0.0.1", server_port=None, share=False, prevent_thread_lock=True,
                 quiet=True, ssr_mode=False, inline=False)
page = httpx.get(prototype.local_url, timeout=30, trust_env=False)
print(f"Gradio page at {prototype.local_url}: HTTP {page.status_code}, {len(page.text):,} bytes of HTML")
# Gradio's queue runs each event this many at a time (change it with demo.queue(default_concurrency_limit=...))
print(f"events of this page run {prototype._queue.default_concurrency_limit!r} at a time by default")
assert page.status_code == 200
prototype.close()


# %% [markdown]
# A prototype is the right tool for showing a model to people, and it is fine for a handful
# of them. What it does not give you: a documented API with validated inputs for other programs,
# control over how concurrent requests share the model (Gradio's queue runs each event one at a
# time by default, printed above), metrics, and a way to batch requests. The rest of the notebook
# builds those.
#
# ## Step 2 · A plain FastAPI endpoint
#
# FastAPI maps a Python function to a URL and validates the JSON body against a pydantic model: a
# missing field, a wrong type or a value outside the limits is answered with HTTP 422 and a message
# saying what is wrong, before our code runs. Limits are not decoration: the prompt length and the
# number of new tokens bound how much work one request can demand.
#
# `TestClient` calls the application in-process, without opening a socket: the quickest way to try
# an endpoint.

# %%
class GenerateIn(BaseModel):
    prompt: str = Field(min_length=1, max_length=256)
    max_new_tokens: int = Field(32, ge=1, le=256)


plain = FastAPI()


@plain.get("/health")
def health() -> dict:
    return {"status": "ok"}


@plain.post("/generate")
def generate_plain(req: GenerateIn) -> dict:
    return {"text": complete(req.prompt, req.max_new_tokens)}


with TestClient(plain) as client:
    ok = client.post("/generate", json={"prompt": "The ", "max_new_tokens": 16})
    bad = client.post("/generate", json={"prompt": "", "max_new_tokens": 1000})
print("good request:", ok.status_code, ok.json())
print("bad request: ", bad.status_code, [(e["loc"][-1], e["msg"]) for e in bad.json()["detail"]])
check_greedy(ok.json()["text"], "The ", 16, what="the server")
assert bad.status_code == 422 and len(bad.json()["detail"]) == 2


# %% [markdown]
# ### Measuring with real clients
#
# To see how an endpoint behaves with several users we need a real server and real connections.
# `serve_in_thread` runs uvicorn (the ASGI server FastAPI apps run on) in a background thread on
# a free loopback port; `hammer` starts `clients` threads that each send requests, while one more
# client checks `/health` every 20 ms. The health check is the canary: a server that cannot answer
# it quickly cannot answer anything else quickly either.

# %%
@contextlib.contextmanager
def serve_in_thread(app: FastAPI):
    """Run `app` with uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def hammer(url: str, clients: int, per_client: int, new_tokens: int = 48) -> dict:
    """Return requests/s, the median /health latency and how many health checks were answered."""
    done, health_ms = threading.Event(), []

    def user(i: int) -> None:
        with httpx.Client(timeout=120, trust_env=False) as c:
            for j in range(per_client):
                body = {"prompt": PROMPTS[(i + j) % len(PROMPTS)], "max_new_tokens": new_tokens}
                c.post(f"{url}/generate", json=body).raise_for_status()

    def probe() -> None:
        with httpx.Client(timeout=120, trust_env=False) as c:
            while not done.is_set():
                start = time.perf_counter()
                c.get(f"{url}/health").raise_for_status()
                health_ms.append(1e3 * (time.perf_counter() - start))
                time.sleep(0.02)

    checker = threading.Thread(target=probe)
    checker.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(user, range(clients)))
    wall = time.perf_counter() - start
    done.set()
    checker.join()
    return {"req_per_s": clients * per_client / wall, "health_ms": statistics.median(health_ms),
            "health_checks": len(health_ms), "wall_s": wall}


CLIENTS = 8
PER_CLIENT = config.pick(quick=2, full=4)
step_results = {}
with serve_in_thread(plain) as url:
    step_results["def endpoint"] = hammer(url, CLIENTS, PER_CLIENT)


def show_steps() -> None:
    for name, r in step_results.items():
        print(f"{name:26s} {r['req_per_s']:5.1f} requests/s | /health: median {r['health_ms']:7.1f} ms, "
              f"{r['health_checks']:3d} answered in {r['wall_s']:.1f} s")


show_steps()

# %% [markdown]
# ## Step 3 · `async def`, and the trap in it
#
# FastAPI runs a plain `def` endpoint in a pool of worker threads, so several requests run the model
# at once in different threads; they do not get faster, they take turns on the same cores. An
# `async def` endpoint runs *on the event loop itself*. That is right for code that waits (on a
# database, on another service, on a queue) because `await` hands the loop to other requests while
# it waits. It is wrong for code that computes: a model call inside `async def` holds the loop for
# its whole duration, and every other request, health checks included, waits behind it.
#
# A common suggestion is to add `async` to the endpoint to serve requests
# concurrently; here is what that does when the model runs inside it:

# %%
blocking = FastAPI()
blocking.get("/health")(health)


@blocking.post("/generate")
async def generate_blocking(req: GenerateIn) -> dict:
    return {"text": complete(req.prompt, req.max_new_tokens)}  # computes ON the event loop


with serve_in_thread(blocking) as url:
    step_results["async, model on the loop"] = hammer(url, CLIENTS, PER_CLIENT)
show_steps()
blocked, threaded = step_results["async, model on the loop"], step_results["def endpoint"]
ratio = blocked["health_ms"] / threaded["health_ms"]
print(f"median health check with the model on the event loop: {ratio:.1f}x the threaded server's "
      f"(medians of {blocked['health_checks']} and {threaded['health_checks']} checks)")
# How much slower depends on the machine and its load, so the size is a verdict: one run each, and
# a ratio between 1/1.2 and 1.2 is called no clear difference.
health_word = "much slower" if ratio > 5 else {"higher": "slower", "lower": "faster", "no clear difference":
                                               "no clear difference"}[bench.band_verdict(ratio, 1.0, band=0.2)]
bench.record_verdict("serve.blocking_loop.health_check", health_word, ratio=round(ratio, 2))
answered = (f"{blocked['health_checks']} answered in {blocked['wall_s']:.1f} s, against "
            f"{threaded['health_checks']} in {threaded['wall_s']:.1f} s")
print("verdict on this machine: " + {
    "much slower": f"much slower: health checks wait for whole generations ({answered})",
    "slower": "slower, but by less than 5x in this run",
    "faster": "faster in this run",
    "no clear difference": "no clear difference in this run"}[health_word] +
      ("" if health_word == "much slower" else
       f" ({bench.band_text(0.2)}; this cell does not measure why, rerun it to see whether the result holds)"))
# Requests per second, one run each too: a ratio between 1/1.15 and 1.15 is called no clear difference.
loop_ratio = blocked["req_per_s"] / threaded["req_per_s"]
loop_word = bench.band_verdict(blocked["req_per_s"], threaded["req_per_s"], band=0.15,
                               name="serve.blocking_loop.req_per_s")
print("verdict on this machine: the model on the loop served " + {
    "higher": "more requests per second than",
    "lower": "fewer requests per second than",
    "no clear difference": "no clearly different number of requests per second from"}[loop_word] +
      f" the threaded def endpoint ({bench.ratio_text(loop_ratio, 0.15)}, one run each; "
      f"{bench.band_text(0.15, inside=loop_word == 'no clear difference')})" + {
    "higher": f"; a candidate reason, which this cell does not measure: one request at a time runs alone, while the "
              f"def endpoint's {CLIENTS} model calls contend for the GIL and the cores",
    "lower": "; this cell does not measure why",
    "no clear difference": ""}[loop_word])


# %% [markdown]
# The health check does no work at all, yet on the loop it can only be answered between generations:
# while the model runs, nothing else is even read from the network. The table counts how many checks
# were answered and the verdict says how the two compared here; a load balancer whose checks time
# out takes a server for dead. On a busy machine the threaded server's checks wait too, for the GIL and the cores its
# model threads hold, which is why the size of the gap is this machine's verdict. Nor does `async` make the model itself
# concurrent: the two throughput figures only differ in how requests take turns on the same cores
# (one after another on the loop, or several threads contending for the GIL and the cores), and neither
# lets requests share the model's work. The cell's second verdict says which of the two served more
# requests per second here, with a candidate reason where the blocking server did; whichever did, its
# health checks show the blocking server's price. The fix is not `async` as such: it is to keep the loop
# free and give the model its own thread. That is what the next step does, and the same structure also
# lets us batch.
#
# ## Step 4 · A batching worker
#
# Running the model on 8 prompts at once can cost less than 8 separate runs: the weights are read
# once per step for the whole batch, and the per-step Python and dispatch overhead is shared. So we
# decouple receiving requests from running the model:
#
# - the endpoint puts each request on a `queue.Queue` and `await`s its result, leaving the loop free;
# - one **model worker thread** takes the first waiting request, then keeps collecting until it has
#   `max_batch` requests or `max_wait_s` has passed since the first, whichever comes first;
# - it prefills the batch (prompts right-padded to the same length) and decodes it step by step with
#   the KV cache (`greedy_steps`, the generator `generate_cached` is built on), and hands each
#   token back to the event loop with `loop.call_soon_threadsafe`, one of the two documented
#   thread-safe ways for another thread to touch asyncio objects (the other,
#   `asyncio.run_coroutine_threadsafe`, hands the loop a whole coroutine).
#
# The worker starts and stops with the app's **lifespan**, so no thread outlives the server.

# %%
class Batcher:
    """A model worker thread: collects queued requests into batches and decodes each batch."""

    def __init__(self, max_batch: int = 32, max_wait_s: float = 0.005) -> None:
        self.pending: queue.Queue = queue.Queue()
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.batch_sizes: list[int] = []
        self.waits_s: list[float] = []  # per request: seconds from submit to the start of its batch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def submit(self, prompt: str, max_new_tokens: int, on_token) -> None:
        """Queue a request; on_token(text) is called per token, then on_token(None) at the end."""
        self.pending.put((tok.encode(prompt), max_new_tokens, on_token, time.perf_counter()))

    def _take_batch(self) -> list:
        try:
            batch = [self.pending.get(timeout=0.1)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch and (left := deadline - time.monotonic()) > 0:
            try:
                batch.append(self.pending.get(timeout=left))
            except queue.Empty:
                break
        return batch

    @torch.inference_mode()
    def _decode(self, batch: list) -> None:
        idx, lengths = pad_prompts([ids for ids, *_ in batch])  # right-padded prompts
        steps = max(n for _, n, *_ in batch)  # a static batch runs until its longest request ends
        # greedy_steps prefills the batch once, then yields one token per row and decoding step
        for step, nxt in enumerate(greedy_steps(model, idx, lengths, steps)):
            for (_, n, on_token, _), t in zip(batch, nxt.tolist()):
                if step < n:
                    on_token(tok.decode([t]))
                if step + 1 == n:
                    on_token(None)

    def _run(self) -> None:
        while not self._stop.is_set():
            if batch := self._take_batch():
                self.batch_sizes.append(len(batch))
                started = time.perf_counter()
                self.waits_s += [started - queued for *_, queued in batch]
                self._decode(batch)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def batched_app(batcher: Batcher, stream: bool) -> FastAPI:
    """Return an app whose /generate goes through `batcher` (whole answer, or streamed as SSE)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        batcher.stop()

    app = FastAPI(lifespan=lifespan)
    app.get("/health")(health)

    @app.post("/generate")
    async def generate(req: GenerateIn):
        loop, tokens = asyncio.get_running_loop(), asyncio.Queue()
        batcher.submit(req.prompt, req.max_new_tokens,
                       lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t))
        if not stream:
            pieces = []
            while (t := await tokens.get()) is not None:
                pieces.append(t)
            return {"text": "".join(pieces)}

        async def events():
            index = 0
            while (t := await tokens.get()) is not None:
                yield f"data: {json.dumps({'token': t, 'index': index})}\n\n"
                index += 1
            yield f"event: end\ndata: {json.dumps({'reason': 'length', 'tokens': index})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


batcher = Batcher(max_batch=32, max_wait_s=0.005)
with serve_in_thread(batched_app(batcher, stream=False)) as url:
    answer = httpx.post(f"{url}/generate", json={"prompt": "The ", "max_new_tokens": 16}, timeout=60).json()
    batcher.batch_sizes.clear()  # count only the batches of the load below, not the single check above
    step_results["batching worker"] = hammer(url, CLIENTS, PER_CLIENT)
check_greedy(answer["text"], "The ", 16, what="batched decoding")
show_steps()
sizes = batcher.batch_sizes
mean_batch = sum(sizes) / len(sizes)
print(f"the worker ran {len(sizes)} batches, mean size {mean_batch:.1f}, largest {max(sizes)}")
batched = step_results["batching worker"]
gain, gain_one = batched["req_per_s"] / threaded["req_per_s"], batched["req_per_s"] / blocked["req_per_s"]
print(f"batching serves {gain:.1f}x the requests per second of the plain endpoint and {gain_one:.1f}x those of the "
      f"model on the loop (one request at a time, step 3) at {CLIENTS} clients")
assert max(sizes) > 1, "with 8 concurrent clients the worker should have formed real batches"
# One run each, so no spread to judge against: a ratio between 1/1.15 and 1.15 is called no clear difference.
batch_word = bench.band_verdict(gain, 1.0, band=0.15, name="serve.batching_worker.req_per_s")
if batch_word != "higher":
    why = f"mean batch {mean_batch:.1f}; this cell does not measure why"
else:
    why = f"mean batch {mean_batch:.1f}: each decoding step served that many requests on average"
    if loop_word == "higher":  # step 3's verdict: one request at a time beat the plain endpoint too
        why += (f"; the plain endpoint also served fewer requests per second than one request at a time (step 3), "
                f"so over one request at a time batching bought {gain_one:.1f}x")
print("verdict on this machine: batching served " + {
    "higher": "more requests per second than", "lower": "fewer requests per second than",
    "no clear difference": "no clearly different number of requests per second from"}[batch_word] +
      f" the plain endpoint ({why}; {bench.band_text(0.15, inside=batch_word == 'no clear difference')})")
batched_health, plain_health = batched["health_ms"], threaded["health_ms"]
batched_health_word = {"higher": "slower", "lower": "faster", "no clear difference": "not clearly different"}[
    bench.band_verdict(batched_health, plain_health, band=0.2, name="serve.batching_worker.health_check")]
print("verdict on this machine: the median health check " + (
    "showed no clear difference between the batching worker and the plain endpoint"
    if batched_health_word == "not clearly different" else
    f"was {batched_health_word} with the batching worker than with the plain endpoint") +
      f" ({batched_health:.1f} ms against {plain_health:.1f} ms, one run each; "
      f"{bench.band_text(0.2, inside=batched_health_word == 'not clearly different')})" + {
          "faster": "; this cell does not measure why (a candidate below)",
          "slower": "; this cell does not measure why", "not clearly different": ""}[batched_health_word])

# %% [markdown]
# Two things can change at once here, and the two verdicts above say whether they did on this
# machine: the throughput, which can rise because concurrent requests now share each decoding step,
# and the health check's latency, which can fall because one worker thread, instead of a model call per
# request in the thread pool, competes with the event loop for the GIL and the cores (no cell here
# measures that). (Torch releases Python's global interpreter lock inside its operators, so the loop
# really does run while the model computes; the Python code between steps still takes turns with it.)
#
# ## Step 5 · Streaming tokens
#
# So far each client waits for its whole answer. Generation produces one token per step, so the
# server can send each token as soon as it exists: the text appears while it is being written, and
# the user sees the first words after the first step of their batch instead of after the last. The standard way to
# stream over plain HTTP is **server-sent events** (SSE, the `text/event-stream` media type): the
# response stays open and carries lines like `data: {...}` separated by blank lines. Our events
# follow the course server's format: `data: {"token": ..., "index": i}` per token, then
# `event: end` with a summary, so a client can tell a finished stream from one cut off halfway.
#
# With streaming, latency splits into two numbers: the **time to first token** (TTFT: how long the
# user stares at nothing) and the time to the last token. The course's load generator
# (`course_utils.serving.server.loadgen.run_load`) measures both and checks every stream: well-formed
# events, indices in order, the requested number of tokens, an `end` event.

# %%
stream_batcher = Batcher(max_batch=32, max_wait_s=0.005)
with serve_in_thread(batched_app(stream_batcher, stream=True)) as url:
    with httpx.stream("POST", f"{url}/generate", json={"prompt": "The ", "max_new_tokens": 3}, timeout=60) as r:
        print(r.headers["content-type"])
        print(r.read().decode())
    stream_batcher.waits_s.clear()  # count only the requests of the load below
    streamed = run_load(url, concurrency=CLIENTS, n_requests=CLIENTS * PER_CLIENT, prompts=PROMPTS,
                        max_new_tokens=32, keep_texts=True)
assert streamed.n_lost == 0, streamed.errors
check_greedy(streamed.texts[0], PROMPTS[0], 32, what="streaming")
ttft_p50 = streamed.ttft_ms["p50"]
print(f"{streamed.n_ok} streams, all valid: first token after {ttft_p50:.0f} ms (median), "
      f"last token after {streamed.latency_ms['p50']:.0f} ms (median)")
wait_p50 = 1e3 * statistics.median(stream_batcher.waits_s)  # the worker's stamps, over the same requests
print(f"a request waited {wait_p50:.0f} ms (median) in the queue before its batch started, "
      + ("more than half" if wait_p50 > ttft_p50 / 2 else "at most half") + " of the median first-token time; the "
      "rest of that time (the prompt, the first step, the trip through the event loop and HTTP) this cell does not "
      f"time apart. Up to max_wait_s ({1e3 * stream_batcher.max_wait_s:.0f} ms) of a queue wait is the worker "
      "collecting company; beyond that, the request waits while the worker decodes the batch ahead (a static batch "
      "runs to its end before the worker takes the next)")

# %% [markdown]
# The cell prints both times, to the first token and to the whole answer, and how long a request waited for its
# batch to start. This notebook's servers are enough to understand the design, but they have gaps that matter under
# real load:
#
# - a **static batch** runs until its longest request is done: a request that arrives one step after
#   a batch started waits for the whole batch, and finished rows keep occupying their slot;
# - the queue is unbounded, so an overloaded server accepts work it can never finish instead of
#   refusing it early;
# - a client that disconnects keeps its row decoding until the end;
# - there are no metrics to tell any of this is happening.
#
# ## The course's server: iteration-level batching under load
#
# `course_utils.serving` closes those gaps. Its `/generate` has the same request and event format as
# above, and its worker runs in one of three modes (`ServeSettings(batching=...)`):
#
# - `"none"`: one request at a time (the baseline);
# - `"static"`: the design of step 4 (collect up to `max_batch_size` within `max_wait_ms`, decode to the end);
# - `"iteration"`: *iteration-level* (continuous) batching: the KV cache holds one row per live
#   sequence, a new request's prompt is computed in the running batch's next forward pass (so it
#   joins at once), and a finished or disconnected one leaves at once, its row reused.
#
# ### Reading the engine
#
# The engine lives in two files, on top of the model's cache code (`KVCache` and `mixed_step` in
# `course_utils/models/gpt.py`). `course_utils/serving/core.py` is the scheduler, with no threads, no
# event loop and no metrics in it (its prefix cache is `serving/prefix_cache.py`): `EngineCore.step()`
# first files the prompt blocks computed at the last step in the prefix cache and lets cancelled
# requests go (the first `_retire` frees their rows), then admits waiting sequences into free cache
# rows, plans the step's tokens under a budget (one for each decoding sequence, the rest for prompts; a
# long prompt is computed in chunks over several steps), runs **one** forward pass for all of them,
# emits the next token of every sequence that is ready, and retires the finished ones.
# `course_utils/serving/server/engine.py` is the server's adapter around it: a bounded queue, the batching
# policy, a worker thread that calls `step()` in a loop, and the hand-over of tokens to the asyncio
# loop. Here is `step()`, and the core driven directly, without any server:
#

# %%
import inspect

from course_utils.serving.core import EngineCore

print(inspect.getsource(EngineCore.step))
core = EngineCore(model, capacity=4, max_len=128)
prompts = ["The ", "def ", "import "]
answers = core.generate([tok.encode(p) for p in prompts], max_new_tokens=24)
alone = [generate_cached(model, torch.tensor([tok.encode(p)]), 24)[0] for p in prompts]
# each answer equals decoding that prompt alone with the KV cache, up to a near-tie (same_greedy names one)
tie = same_greedy(model, [tok.encode(p) for p in prompts], answers, alone, what="the engine core's batched steps")
if tie:
    print(tie)
for p, a in zip(prompts, answers):
    print(repr(p + tok.decode(a)))
print(f"{core.steps} forward passes for {len(prompts)} prompts of 24 tokens each")

# %% [markdown]
# Notebook 13 writes the same loop by hand and checks it against this core token for token.
#
# The queue is bounded (full queue: HTTP 503 with `Retry-After`; waited too long: 504), shutdown ends
# every open stream with a clear event, and `/metrics` exposes queue depth, batch sizes, latencies and
# tokens per second in Prometheus format. Here it runs as a separate process on loopback, started
# by `serve_in_subprocess`, so the load generator in this kernel does not share an interpreter with
# it. Each mode serves 1, 8 and 32 concurrent clients; the table also gives the rows per forward pass of each
# run, read from the server's `/metrics` just before and just after it. The cell after the plot prints one of the
# course's targets for this server (a minimum for the better batching mode's tokens per second over
# no batching's, at 32 clients) and whether your machine met it.

# %%
from course_utils.serving.extras.breakdown import Snapshot  # a server's /metrics counters at one moment

CONCURRENCY = [1, 8, 32]
NEW_TOKENS = 32
ROUNDS = config.pick(quick=2, full=8)  # requests per client in each measurement (short runs are dominated by their start and end)
MODES = ["none", "static", "iteration"]
reports: dict[tuple[str, int], object] = {}
rows_per_pass: dict[tuple[str, int], float] = {}  # the server's mean rows per forward pass over each run
client_cpu_s: dict[tuple[str, int], float] = {}  # CPU time this kernel (the clients) spent per run
with tqdm(total=len(MODES) * len(CONCURRENCY), desc="mode x clients") as bar:
    for mode in MODES:
        with serve_in_subprocess({"batching": mode, "embed": False, "max_batch_size": 32}) as server:
            run_load(server.url, concurrency=4, n_requests=4, max_new_tokens=4)  # warm-up
            for c in CONCURRENCY:
                counts = Snapshot.take(server.url)   # the server's /metrics counters before this run
                cpu = time.process_time()
                reports[mode, c] = run_load(server.url, concurrency=c, n_requests=c * ROUNDS,
                                            prompts=PROMPTS, max_new_tokens=NEW_TOKENS)
                client_cpu_s[mode, c] = time.process_time() - cpu
                rows_per_pass[mode, c] = Snapshot.take(server.url).since(counts).mean_rows
                bar.update()
            if mode == "iteration":
                metrics_text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text

print(f"{'mode':>10} {'clients':>7} {'tokens/s':>9} {'TTFT p50':>9} {'latency p50':>12} {'p99':>8} {'rows/pass':>10}  lost")
for (mode, c), r in reports.items():
    print(f"{mode:>10} {c:>7} {r.tokens_per_s:>9.0f} {r.ttft_ms['p50']:>7.0f}ms {r.latency_ms['p50']:>10.0f}ms "
          f"{r.latency_ms['p99']:>6.0f}ms {rows_per_pass[mode, c]:>10.1f}  {r.n_lost}")
assert all(r.n_lost == 0 for r in reports.values()), [r.errors[:2] for r in reports.values() if r.n_lost]

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for mode in MODES:
    ax1.plot(CONCURRENCY, [reports[mode, c].tokens_per_s for c in CONCURRENCY], "o-", label=mode)
    ax2.plot(CONCURRENCY, [reports[mode, c].latency_ms["p99"] for c in CONCURRENCY], "o-", label=mode)
for ax, title in ((ax1, "throughput (tokens/s)"), (ax2, "p99 latency of a request (ms)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    ax.set_xlabel("concurrent clients")
    ax.set_title(title)
    ax.legend()
ax2.set_yscale("log")
fig.suptitle(f"TinyGPT served on this CPU, {NEW_TOKENS} new tokens per request")
fig.tight_layout();

# %%
none32 = reports["none", 32]
best_mode = max(["static", "iteration"], key=lambda m: reports[m, 32].tokens_per_s)
best32 = reports[best_mode, 32]
batched_gain = best32.tokens_per_s / none32.tokens_per_s
print(f"at 32 clients, '{best_mode}' batching serves {best32.tokens_per_s:,.0f} tokens/s against "
      f"{none32.tokens_per_s:,.0f} without batching: {batched_gain:.1f}x")
print(f"p99 latency {best32.latency_ms['p99']:,.0f} ms against {none32.latency_ms['p99']:,.0f} ms; "
      f"median time to first token {best32.ttft_ms['p50']:,.0f} ms against {none32.ttft_ms['p50']:,.0f} ms")
it1, it32 = reports["iteration", 1], reports["iteration", 32]
one_word = bench.band_verdict(it1.tokens_per_s, reports["none", 1].tokens_per_s, band=0.15,
                              name="serve.load.iteration_vs_none.c1")
ONE_ROW_GAP = ("with one row there is nothing to batch, so the gap is each mode's own per-step machinery or the "
               "machine's load (the modes are measured one after another); this cell cannot tell which")
print(f"with one client, batching has nothing to batch: iteration mode {it1.tokens_per_s:,.0f} tokens/s, "
      f"no batching {reports['none', 1].tokens_per_s:,.0f}: " + {
          "no clear difference": f"no clear difference ({bench.band_text(0.15, inside=True)}), as expected",
          "higher": f"iteration higher ({bench.band_text(0.15)}): " + ONE_ROW_GAP,
          "lower": f"iteration lower ({bench.band_text(0.15)}): " + ONE_ROW_GAP}[one_word])
from course_utils.serving.server.percentile import nearest_rank  # noqa: E402  (the course's one p99 rule)

ORDINAL = {2: "nd", 3: "rd"}
for c in (8, 32):
    st, it = reports["static", c], reports["iteration", c]
    # One run each, and a p99 rests on the few slowest requests: a ratio between 1/1.15 and 1.15 is
    # called no clear difference.
    p99_word = bench.band_verdict(st.latency_ms["p99"], it.latency_ms["p99"], band=0.15)
    lower_p99 = bench.record_verdict(f"serve.load.lower_p99.c{c}", {
        "higher": "iteration", "lower": "static", "no clear difference": "no clear difference"}[p99_word],
        clients=c, ratio=round(st.latency_ms["p99"] / it.latency_ms["p99"], 2), band=0.15)
    n = it.n_ok  # both modes served c * ROUNDS requests (none lost, asserted)
    slowest = n - nearest_rank(range(1, n + 1), 99) + 1  # the p99 of ranks 1..n is its own rank
    which = "the slowest" if slowest == 1 else f"the {slowest}{ORDINAL.get(slowest, 'th')} slowest"
    p99_said = (f"no clear difference in p99 ({bench.band_text(0.15, inside=True)})" if lower_p99 == "no clear difference"
                else f"the lower p99 here is {lower_p99}'s ({bench.band_text(0.15)})")
    tput_word = bench.band_verdict(it.tokens_per_s, st.tokens_per_s, band=0.15)
    winner = "iteration" if tput_word == "higher" else "static"
    tput_said = (f"no clear difference: {bench.band_text(0.15, inside=True)}" if tput_word == "no clear difference"
                 else f"{winner} served more; {bench.band_text(0.15)}")
    # The rows per forward pass of the same two runs (the table's last column): the measured side of the reason.
    rows_said = f"rows per forward pass: static {rows_per_pass['static', c]:.1f}, iteration {rows_per_pass['iteration', c]:.1f}"
    if tput_word != "no clear difference":
        pass_rows_word = bench.band_verdict(rows_per_pass["iteration", c], rows_per_pass["static", c], band=0.15)
        rows_said += (f", so {winner}'s passes held more rows, in line with its throughput" if pass_rows_word == tput_word else
                      ": the rows per pass do not account for the throughput gap, and this cell does not measure what does")
    elif bench.band_verdict(rows_per_pass["iteration", c], rows_per_pass["static", c], band=0.15) != "no clear difference":
        rows_said += (": the passes held clearly different numbers of rows, yet neither mode served clearly more, so a "
                      "fuller pass did not pay off in tokens here (a larger pass also takes longer; this cell does not "
                      "time the passes)")
    print(f"{c} clients: iteration/static throughput {bench.ratio_text(it.tokens_per_s / st.tokens_per_s, 0.15)} "
          f"({tput_said}); {rows_said}")
    print(f"  the same runs: median TTFT {it.ttft_ms['p50']:.0f} ms (iteration) vs {st.ttft_ms['p50']:.0f} ms (static), "
          f"p99 latency {it.latency_ms['p99']:.0f} ms vs {st.latency_ms['p99']:.0f} ms ({which} of {n} requests "
          f"in each run): {p99_said}")
ctx = dict(mode=best_mode, clients=32, new_tokens=NEW_TOKENS, requests=best32.n_requests)
bench.record("serve.batched_vs_unbatched.c32", batched_gain, "x", **ctx)
bench.record("serve.p99_ms.c32", best32.latency_ms["p99"], "ms", **ctx)
bench.record("serve.ttft_p50_ms.c32", best32.ttft_ms["p50"], "ms", **ctx)
target_word = bench.record_verdict("serve.target.batched_4x_c32", "met" if batched_gain >= 4 else "not met")
print(f"course target: batched >= 4x unbatched at 32 clients -> {'met' if target_word == 'met' else 'NOT met'} "
      "on this machine")
# One load run per mode, no spread of its own: a ratio between 1/1.15 and 1.15 is called no clear difference.
word = {"higher": "more", "lower": "fewer", "no clear difference": "no clearly different number of"}[
    bench.band_verdict(batched_gain, 1.0, band=0.15, name="serve.load.batched_vs_unbatched.c32")]
print(f"verdict on this machine: batched ({best_mode}) served {word} tokens/s than unbatched at 32 clients")

# %% [markdown]
# The unbatched server can only run the model's single-sequence speed, whatever the number of
# clients, so its latency grows with the queue in front of it. Batched, one decoding step serves
# every running request, so a request no longer waits for 31 others to finish one by one; how much
# that buys in tokens per second depends on how much cheaper a row of a batch is than a step of
# its own on this CPU (the cell above prints this machine's ratio and verdict, with both servers'
# p99 latency).
#
# Compare the two batching modes line by line above; which one wins depends on the load. This
# benchmark is the kindest case for static batching: every request asks for the same number of
# tokens and the clients send their next request as soon as the previous one ends, so a batch forms,
# decodes without interruption and finishes together. Its cost is waiting: a request that arrives
# while a batch decodes waits for that whole batch before its own can start, and that wait is part of its time
# to first token (the cell above prints both modes' median TTFT); meanwhile it is in no batch, so static's passes can
# hold fewer rows (the cell above prints both modes' rows per pass beside the throughput verdict). Its tail latency
# can still come out lower than iteration's (the cell above prints whether either p99 was clearly lower on this machine).
# One possible reason: a step of iteration mode can also compute newcomers' prompts, so the rows already decoding
# wait for them; this benchmark does not separate that from other causes. With one client, static batching still waits up to
# `max_wait_ms` (5 ms by default) for company on every request; that is part of the gap between the TTFT of the
# 1-client rows, and this benchmark does not measure the rest.
# Iteration-level batching lets no request wait for a batch to drain and no slot idle on a finished
# sequence; it is built for requests of mixed lengths that arrive at random times, as real traffic
# does, which this benchmark does not send. The server's own metrics show the batch sizes it actually ran (Prometheus histogram, from
# the iteration-mode server above, over its whole life: the warm-up and the runs at 1, 8 and 32
# clients together, so the mean is not the 32-client batch; the table's `rows/pass` column gives each run's own):

# %%
lines = [ln for ln in metrics_text.splitlines()
         if ln.startswith(("serve_batch_size_count", "serve_batch_size_sum", "serve_tokens_generated_total"))]
print("\n".join(lines) or metrics_text[:800])
count = next((float(ln.split()[-1]) for ln in lines if ln.startswith("serve_batch_size_count")), None)
total = next((float(ln.split()[-1]) for ln in lines if ln.startswith("serve_batch_size_sum")), None)
if count and total:
    print(f"mean rows per forward pass: {total / count:.1f}")

# %% [markdown]
# ### How close to the bare model?
#
# The ceiling for a server is the model itself, decoding a batch with no HTTP, no queue and no event
# loop: `bare_decode_tokens_per_s` times exactly that (prefill plus decoding, KV cache, batch of 32,
# the same number of torch threads as the server's model worker). The ratio of served to bare tokens
# per second says how much the serving machinery costs. The course sets a minimum for this ratio,
# which the cell prints beside the ratio. It is a goal for the design, not a promise for every
# machine: with the HTTP side, the event loop and the model worker in one Python process on
# one core, they take turns on the GIL, and the cell prints whether the target was met here and
# where the rest of the time went. Further down this section the engine moves into a process of its
# own, and the same target is printed for that layout.
#
# To measure the server rather than the machine, the next cell gives the server process one core
# and this kernel (the load generator) the others, where the operating system allows it
# (`os.sched_setaffinity`, Linux; elsewhere they share every core, and the cell says so). A pinned
# server gets one torch thread for its one core, whatever `default_threads()` would give it on a
# bigger machine: more threads than cores would only take turns on that core. The cell runs
# 32 clients long enough that starting and draining the batch are a small part of the run. While it
# runs, `course_utils.serving.extras.breakdown` reads the server's own counters (`/metrics`: seconds per
# phase of the model worker, forward passes, rows per pass, the passes that also computed prompts) and the CPU seconds of each of
# its threads, so the cell can say where the time went.

# %%
from course_utils.serving.extras.breakdown import WALL_PARTS, measure, own_core_plan, pinned

EFF_ROUNDS = config.pick(quick=3, full=24)   # requests per client: long enough for a steady batch
plan = own_core_plan()                       # ({server core}, {client cores}) or None
# One torch thread per core the server is pinned to (one); unpinned, the server's default. The bare
# model, the engine-process runs and this cell's server all use this count.
EFF_THREADS = len(plan[0]) if plan else default_threads()


def bare32_now() -> float:
    """The bare model's tokens per second at batch 32, a few short repeats on this machine now."""
    return bare_decode_tokens_per_s(model, batch_size=32, prompt_len=8, new_tokens=NEW_TOKENS,
                                    repeats=config.pick(3, 5), threads=EFF_THREADS)


# The bare rate is a few short repeats, the served rate a long run: measure the bare one just before and just
# after the served run and take the mean, so a slow or fast spell of the machine around the run weighs on
# both sides of the ratio (the cell prints both figures, so a large gap between them shows).
bare_before = bare32_now()
with serve_in_subprocess({"batching": "iteration", "embed": False, "max_batch_size": 32,
                          "threads": EFF_THREADS}) as server, \
        pinned({server.proc.pid: plan[0], os.getpid(): plan[1]} if plan else {}) as is_pinned:
    run_load(server.url, concurrency=8, n_requests=8, max_new_tokens=8)  # warm-up
    cpu, clock = time.process_time(), time.perf_counter()
    eff_run, breakdown = measure(server.url, server.proc.pid, lambda: run_load(
        server.url, concurrency=32, n_requests=32 * EFF_ROUNDS, prompts=PROMPTS, max_new_tokens=NEW_TOKENS))
    client_s, client_window_s = time.process_time() - cpu, time.perf_counter() - clock  # CPU and clock, one window
assert eff_run.n_lost == 0, (eff_run.errors[:3], server.log_tail(1500))  # the server's log, kept after it stopped
bare_after = bare32_now()
bare32 = (bare_before + bare_after) / 2
bare_gap = abs(bare_before - bare_after) / bare32   # how much the machine's speed moved around the served run
efficiency = eff_run.tokens_per_s / bare32
print(f"bare model, batch 32, timed in this kernel (not pinned): {bare32:,.0f} tokens/s (the mean of "
      f"{bare_before:,.0f} before and {bare_after:,.0f} after the served run); served at 32 clients: "
      f"{eff_run.tokens_per_s:,.0f} tokens/s "
      f"-> efficiency {efficiency:.2f} (both with {EFF_THREADS} torch thread{'s' if EFF_THREADS > 1 else ''})")
if bare_gap > 0.1:
    print(f"(the two bare figures differ by {bare_gap:.0%}: the machine's speed moved around the served run; against "
          f"either one alone the efficiency would be {eff_run.tokens_per_s / max(bare_before, bare_after):.2f} to "
          f"{eff_run.tokens_per_s / min(bare_before, bare_after):.2f})")
print("server pinned to one core, load generator to "
      + ("the other core" if len(plan[1]) == 1 else f"the other {len(plan[1])} cores")
      + "; other programs on a busy machine still share them"
      if is_pinned else
      "server and load generator share every core (this OS or machine cannot give each its own)")
print("\n".join(breakdown.lines()))
print(f"load generator (this kernel): {client_s / client_window_s:.0%} of a core")
bench.record("serve.efficiency.c32", efficiency, "ratio", mode="iteration", pinned=is_pinned, rounds=EFF_ROUNDS,
             bare_tokens_per_s=round(bare32), bare_before=round(bare_before), bare_after=round(bare_after),
             served_tokens_per_s=round(eff_run.tokens_per_s))
eff_word = bench.record_verdict("serve.target.efficiency_c32", "met" if efficiency >= 0.7 else "not met")
print(f"course target: efficiency >= 0.7 -> {'met' if eff_word == 'met' else 'NOT met'} on this machine")
# A sanity check, printed rather than asserted: the server runs the bare model's forward passes plus
# its own work, so it should not serve more than 1.15x the bare rate (one run each, so a band).
if bench.band_verdict(eff_run.tokens_per_s, bare32, band=0.15) == "higher":
    print("sanity check FAILED: served above 1.15x the bare model, which the server cannot do by design; one of "
          "the two figures was taken in a slower or faster spell of this machine (the bare one is the mean of "
          "two sets of short repeats, before and after the run), and this cell cannot tell which: rerun it")
else:
    print("sanity check: served at most 1.15x the bare model's rate, as a server running the same forward "
          "passes plus its own work should")
assert efficiency > 0
assert breakdown.tokens == eff_run.n_ok * NEW_TOKENS, "the server counted other tokens than the clients received"

# %%
# Where the wall time went: the worker's forward passes while it ran on a CPU (counted up to the
# bare model's time for the same tokens), then each loss. The worker's phases are clock time; its CPU
# seconds say how much of that it actually ran (the rest it waited for the GIL or a core).
# `Breakdown.wall_seconds` does the sums.
FLOOR_LABEL = "forward passes, worker on a CPU (at most the bare model's time for these tokens)"
part_label = {WALL_PARTS[0]: FLOOR_LABEL}
parts = breakdown.wall_seconds(bare32)
# whole percents that add up to the total (largest remainders), as in any table of shares
part_pct = dict(zip(parts, whole_percents([breakdown.share(seconds) for seconds in parts.values()])))
for name, pct in part_pct.items():
    print(f"{pct:4d}%  {part_label.get(name, name)}")
print(f"the bare model needs {breakdown.share(breakdown.tokens / bare32):.0%} of this wall time for these tokens; "
      "its figure, taken on this machine, includes its own waits")
if breakdown.worker_on_cpu() is None:
    print("(this OS does not report CPU seconds per thread, so waiting cannot be told from working)")
print(f"largest loss on this machine: {breakdown.largest_loss(bare32)}")
if len(breakdown.thread_cpu_s) >= 2 and EFF_THREADS == 1:
    # The worker's wait set against the event loop's running: the gap is the wait that the event loop
    # does not account for. Pinned, the server's core over the run: its busy share (psutil's per-core
    # times, every process) minus the server's own threads is other programs' share, named as the cause
    # of the gap when it is at least half the gap: set against what it would explain, not against a fixed
    # share of the core.
    loop, wait = breakdown.share(breakdown.thread_cpu_s[1]), part_pct[WALL_PARTS[4]] / 100
    gap = (part_pct[WALL_PARTS[4]] - round(100 * loop)) / 100   # from the whole percents printed, so they add up
    # the event loop accounts for the wait when the gap is small, both in points and next to the wait itself
    covered = gap < min(0.05, 0.2 * wait)
    server_share = breakdown.share(sum(breakdown.thread_cpu_s))
    server_core = breakdown.busy_cores(plan[0]) if is_pinned else None
    split, others = "", 0.0
    if server_core is not None:
        # whole percents here too
        core_pct, server_pct = round(100 * max(server_core, server_share)), round(100 * server_share)
        others = (core_pct - server_pct) / 100
        split = f"the core busy {core_pct}% of the run, the server's threads {server_pct}%"
    head = ("the second-busiest server thread, the event loop (HTTP, JSON, SSE; the worker runs one torch thread "
            f"here, so no thread of its own comes second), ran {loop:.0%} of the wall time")
    covers = f"enough to account for {'about ' if gap > 0 else ''}all of the worker's {wait:.0%} wait"
    gil = ("about that much of the worker's wait was for the GIL (more if the event loop was preempted while "
           "holding it)")
    if is_pinned and covered:
        print(f"{head}, {covers}: on one core the worker cannot run while the event loop does"
              + (f" ({split}, other programs {others:.0%})" if split else ""))
    elif not is_pinned and covered:
        print(f"{head}, {covers}, for the GIL while the event loop holds it or for a core, which the server shares "
              "with the load generator and anything else running; this cell does not measure which")
    elif not is_pinned:
        print(f"{head}: {gil}; the rest ({gap:.0%} of the wall time) was a wait for a core, shared with the load "
              "generator and anything else running")
    elif server_core is None:
        print(f"{head}: {gil}; the rest ({gap:.0%} of the wall time) was a wait for its core (this OS does not "
              "report each core's busy time, so this cell cannot tell what else ran there)")
    elif others >= gap / 2:
        print(f"{head}: {gil}; the rest ({gap:.0%} of the wall time) was a wait for its core, where other "
              f"programs ran {others:.0%} of the run ({split}): " + (
                  "enough to account for it" if others >= gap else
                  "at least half of it, and this cell does not measure what the remainder was"))
    else:
        print(f"{head}: {gil}; other programs ran {others:.0%} of the run on its core ({split}), too little to "
              f"account for the rest ({gap:.0%} of the wall time), so this cell does not measure what the rest was")
elif len(breakdown.thread_cpu_s) >= 2:
    print(f"the second-busiest server thread ran {breakdown.share(breakdown.thread_cpu_s[1]):.0%} of the wall time; "
          f"with {EFF_THREADS} torch threads it can be one of the worker's own rather than the event loop, so this "
          "cell cannot tell how much of the worker's wait was for the GIL")
# the worker is always in exactly one phase, so its phases cannot add up to more than the run
ph = breakdown.phases_s
assert sum(ph.values()) <= 1.05 * breakdown.wall_s + 0.05, (ph, breakdown.wall_s)
assert sum(parts.values()) <= 1.05 * breakdown.wall_s + 0.05, parts

# %% [markdown]
# The shares above are this machine's. What each means, and what production engines do about it:
#
# - **Forward passes beyond the floor.** A client whose request has finished is away for a round trip
#   (through the load generator and the event loop) before its next request joins, so the batch runs
#   with fewer than 32 rows (the measuring cell two cells above prints the mean rows per pass), and a
#   step's fixed cost (every layer's
#   Python and dispatch) is shared by fewer tokens. Newcomers' prompts are computed in the same passes
#   (as vLLM schedules them: the token budget of chunked prefill, notebook 13), so their tokens are
#   in this part too, instead of in passes of their own.
# - **Prefix cache copies.** Copying cached prompt blocks into a newcomer's row and filing a prompt's
#   blocks after its first token; small with prompts this short.
# - **The worker not running.** The model worker and the event loop are threads of one Python
#   process. Torch releases the GIL inside each operator, but the Python between operators needs
#   it, and the event loop holds it while it parses requests and writes tokens; on a small machine
#   the worker also waits for a core, which it shares with the event loop (with the load generator
#   too where pinning is not available) and with whatever else runs on the machine.
#   vLLM runs its engine in a separate process from its API server for the first reason;
#   `ServeSettings(engine_process=True)` (`serve --engine-process`) does the same for the course's
#   server, and the next cell measures what that buys on this machine.
# - **Worker idle.** No request is in the engine at all: the batch finished and the clients' next
#   requests are still on their way through the clients and the event loop; it can grow when
#   those wait for a core (the table above gives this run's share).
#
# Every cost above is per step or per token, so a model with more work per token makes them a smaller
# part of the whole. A GPU works the other way for a model this small: it shortens the model's own
# part of each step, while the Python, dispatch, bookkeeping and GIL costs stay on the CPU, so they
# become a larger share (the compiled-server section below comes back to this; no cell here measures it).

# %%
# The same load against the server with its engine as a thread and as a process of its own, side by
# side: both servers run for the whole cell and take turns, nobody pinned (the engine process needs a
# core of its own to pay, and pinning the whole server to one core would take that away), with the
# torch threads of the bare model above (EFF_THREADS).
ep_rates: dict[str, list[float]] = {}
with serve_in_subprocess({"batching": "iteration", "embed": False, "threads": EFF_THREADS}) as srv_thread, \
        serve_in_subprocess({"batching": "iteration", "embed": False, "engine_process": True,
                             "threads": EFF_THREADS}) as srv_process:
    servers = {"engine thread": srv_thread, "engine process": srv_process}
    for srv in servers.values():
        run_load(srv.url, concurrency=8, n_requests=8, max_new_tokens=8)  # warm-up
    for _ in range(config.pick(1, 3)):
        for name, srv in servers.items():
            r = run_load(srv.url, concurrency=32, n_requests=32 * EFF_ROUNDS, prompts=PROMPTS,
                         max_new_tokens=NEW_TOKENS)
            assert r.n_lost == 0, (name, r.errors[:3], srv.log_tail(1500))
            ep_rates.setdefault(name, []).append(r.tokens_per_s)
# Two servers taking turns, a median of a few runs each: this cell and the two pairs below (the
# compiled server, LitServe) use one rule for such pairs, a ratio of the medians between 1/1.15 and
# 1.15 is called no clear difference.
PAIR_BAND = 0.15


def runs_text(rates: list[float]) -> str:
    """Return 'median of n runs, lowest-highest' for one server's tokens/s."""
    if len(rates) == 1:
        return "1 run"
    return f"median of {len(rates)} runs, which ranged {min(rates):,.0f}-{max(rates):,.0f}"


def ranges_overlap(a: list[float], b: list[float]) -> bool:
    """Whether the range of runs ``a`` (lowest to highest) and the range ``b`` share any value."""
    return min(a) <= max(b) and min(b) <= max(a)


def overlap_text(a: list[float], b: list[float], word: str = "no clear difference") -> str:
    """Say whether two servers' ranges of runs overlap (nothing to say with one run each), and, when
    they do while the medians' verdict (``word``) is a direction, that a few runs leave it unsettled."""
    if len(a) == 1 and len(b) == 1:
        return ""
    if not ranges_overlap(a, b):
        return "; the two ranges do not overlap" + (
            ": one server's every run beat the other's every run, though the medians differ by less than the band"
            if word == "no clear difference" else "")
    if word == "no clear difference":
        return "; the two ranges overlap"
    return f"; but the two ranges overlap, so {min(len(a), len(b))} runs each do not settle it: rerun the cell"


def pair_verdict(a: list[float], b: list[float]) -> str:
    """Return ``bench.band_verdict`` for the median of runs ``a`` against that of ``b``, with PAIR_BAND."""
    return bench.band_verdict(statistics.median(a), statistics.median(b), band=PAIR_BAND)


def pair_record(a: list[float], b: list[float], word: str) -> dict:
    """Return what the record of a pair's verdict ``word`` carries (``bench.record_verdict(name, word, **...)``): the
    medians and the band, and noisy where ``word`` is a direction the runs leave unsettled (their ranges overlap,
    as ``overlap_text`` then prints)."""
    return dict(noisy=word != "no clear difference" and min(len(a), len(b)) > 1 and ranges_overlap(a, b),
                value=statistics.median(a), other=statistics.median(b), band=PAIR_BAND)


ep_median = {name: statistics.median(rates) for name, rates in ep_rates.items()}
for name, rate in ep_median.items():
    print(f"{name:15s} {rate:8,.0f} tokens/s at 32 clients ({runs_text(ep_rates[name])})")
ep_word = pair_verdict(ep_rates["engine process"], ep_rates["engine thread"])
bench.record_verdict("serve.engine_process.vs_thread", ep_word,
                     **pair_record(ep_rates["engine process"], ep_rates["engine thread"], ep_word))
print(f"engine in its own process: {bench.ratio_text(ep_median['engine process'] / ep_median['engine thread'], PAIR_BAND)} the "
      f"throughput of the engine thread -> {ep_word} on this machine ({os.cpu_count()} cores; for the medians, "
      f"{bench.band_text(PAIR_BAND)}"
      f"{overlap_text(ep_rates['engine process'], ep_rates['engine thread'], ep_word)})")
print("served / bare model (the bare figure above), unpinned: " +
      ", ".join(f"{name} {rate / bare32:.2f}" for name, rate in ep_median.items()))
differ = ["the length of the run", "the moment", "a second server alive beside it"]
if EFF_THREADS != default_threads():
    differ.append("the torch threads")
differ[-1] = "and " + differ[-1]
print(f"(the table further up served iteration mode at 32 clients at {reports['iteration', 32].tokens_per_s:,.0f} "
      f"tokens/s, in a run of {reports['iteration', 32].n_requests} requests right after its 8-client run; these "
      f"runs are {32 * EFF_ROUNDS} requests each: {', '.join(differ)} differ, and this cell cannot tell which "
      "moved the figures, so set these servers beside each other rather than beside that table)")

# %% [markdown]
# Whether a separate engine process pays depends on the cores: it removes the wait for the GIL, but
# the engine process then wants a core to itself, while the event loop and, in this notebook, the
# load generator still need theirs. The verdict above is this machine's. The cell below gives the
# engine that core, puts the HTTP side and the load generator together on the remaining cores, and
# sets the run beside the first breakdown (the server with its engine thread, alone on one core).
# It prints, before and after:
#
# - tokens per second, with a verdict;
# - each share of the wall time, and the largest loss;
# - the rows per forward pass, and the requests outside the batch: of the 32 requests the clients
#   keep going, those not being decoded at that moment (in the clients, in the HTTP side, on the
#   pipe to the engine, or waiting in its queue);
# - how much of a core each part of the system used, and how busy the load generator's core was
#   in all, other programs included.
#
# Its last line says what these figures point to on this machine, and when they do not settle it.
# (The server's default stays one process: simpler to read, to debug and to stop.)

# %%
# The engine process once more, now alone on one core, with the HTTP side and the load generator on
# the other: the worker shares its GIL and its core with no other part of the server (other programs
# on a busy machine can still take the core). Its breakdown beside the first one's.
from course_utils.serving.extras.breakdown import engine_child, thread_cpu_seconds


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid``'s threads (not its children); 0 when unknown."""
    return sum(thread_cpu_seconds(pid, children=False).values()) if pid else 0.0


own = None
if plan is None:
    print("skipped: this OS or machine cannot give the engine a core of its own")
else:
    with serve_in_subprocess({"batching": "iteration", "embed": False, "engine_process": True,
                              "threads": EFF_THREADS}) as server:
        child = engine_child(server.proc.pid)   # the whole server on the other core, then its engine on its own
        layout = {server.proc.pid: plan[1], child: plan[0], os.getpid(): plan[1]} if child else {}
        with pinned(layout) as pinned_own:
            run_load(server.url, concurrency=8, n_requests=8, max_new_tokens=8)  # warm-up
            cpu0, clock = (cpu_seconds(child), cpu_seconds(server.proc.pid), time.process_time()), time.perf_counter()
            own_run, own = measure(server.url, server.proc.pid, lambda: run_load(
                server.url, concurrency=32, n_requests=32 * EFF_ROUNDS, prompts=PROMPTS, max_new_tokens=NEW_TOKENS))
            engine_s, http_s, own_client_s = (cpu_seconds(child) - cpu0[0], cpu_seconds(server.proc.pid) - cpu0[1],
                                              time.process_time() - cpu0[2])
            own_window_s = time.perf_counter() - clock   # the clock over the same window as these CPU seconds
    assert own_run.n_lost == 0, (own_run.errors[:3], server.log_tail(1500))
    assert own.tokens == own_run.n_ok * NEW_TOKENS, "the engine counted other tokens than the clients received"
    print(("engine process alone on one core, HTTP side and load generator on the other" if pinned_own else
           "the engine could not be pinned apart here, so this run shares every core") +
          f": {own_run.tokens_per_s:,.0f} tokens/s -> served / bare {own_run.tokens_per_s / bare32:.2f}")
    print("course target (efficiency >= 0.7), with the engine in its own process: "
          + ("met" if own_run.tokens_per_s / bare32 >= 0.7 else "NOT met") + " on this machine")
    print("\n".join(own.lines()))
    first, alone = breakdown.wall_seconds(bare32), own.wall_seconds(bare32)
    print("\nshare of the wall time     thread, server on one core | engine process alone on one core")
    first_pct = whole_percents([breakdown.share(first[name]) for name in WALL_PARTS])
    alone_pct = whole_percents([own.share(alone[name]) for name in WALL_PARTS])
    for name, a, b in zip(WALL_PARTS, first_pct, alone_pct):
        print(f"{a:>26d}% | {b:>4d}%   {part_label.get(name, name)}")
    loss_before, loss_after = breakdown.largest_loss(bare32), own.largest_loss(bare32)
    print(f"largest loss, unchanged: {loss_after}" if loss_before == loss_after else
          f"largest loss: {loss_before} -> {loss_after}")

    print("\nbefore -> after (engine thread, server on one core -> engine process alone on one core)")
    # One run each, cells apart: the band is the wider of the pairs' band and the widest spread of one
    # server's runs measured above.
    widest = max(max(r) / min(r) - 1 for r in ep_rates.values())  # 0 with one run each (quick mode)
    one_run_band = max(PAIR_BAND, widest)
    tps_word = bench.band_verdict(own_run.tokens_per_s, eff_run.tokens_per_s, band=one_run_band,
                                  name="serve.engine_process.own_core_vs_thread")
    print(f"tokens/s at 32 clients: {eff_run.tokens_per_s:,.0f} -> {own_run.tokens_per_s:,.0f} "
          f"({bench.ratio_text(own_run.tokens_per_s / eff_run.tokens_per_s, one_run_band)}: {tps_word}; "
          "one run each, so the band is the "
          f"wider of the pairs' {PAIR_BAND:.0%} and the widest spread of one server's runs above, "
          + (f"{widest:.1%}" if widest > 0 else "none with one run each")
          + f": {bench.band_text(one_run_band)})")
    print(f"forward passes: {breakdown.steps:,} in {breakdown.wall_s:.2f} s -> {own.steps:,} in {own.wall_s:.2f} s")
    rows_word = bench.band_verdict(own.mean_rows, breakdown.mean_rows, band=0.15, name="serve.engine_process.rows_own_core")
    rows_rule = bench.band_text(0.15, inside=rows_word == "no clear difference")
    print(f"rows per forward pass: {breakdown.mean_rows:.1f} -> {own.mean_rows:.1f} ({rows_word}; {rows_rule}); "
          f"requests outside the batch (32 - rows): {32 - breakdown.mean_rows:.1f} -> {32 - own.mean_rows:.1f}")
    n_other = len(plan[1])
    cores_word = "core" if n_other == 1 else f"{n_other} cores"
    # each CPU figure over the clock of its own window (the breakdown's threads over its own wall time)
    before_server, before_client = breakdown.share(sum(breakdown.thread_cpu_s)), client_s / client_window_s
    engine_share, http_share, client_share = (seconds / own_window_s for seconds in (engine_s, http_s, own_client_s))
    shared = (http_share + client_share) / n_other  # how busy the HTTP side and the clients kept their cores
    # Everything that ran on those cores over the run (psutil's per-core times, every process); what the
    # two processes did not use of it is other programs', named beside the sending side from a quarter of
    # those cores' time (the sending side then had at most three quarters of them).
    measured = own.busy_cores(plan[1])
    busy = shared if measured is None else max(shared, measured / n_other)
    # whole percents, so that they add up; at most 100 (two clocks read a moment apart can give 101)
    busy_pct, shared_pct = min(100, round(100 * busy)), min(100, round(100 * shared))
    others_named = measured is not None and busy_pct - shared_pct >= 25   # by the percents printed
    their, was = ("their core", "was") if n_other == 1 else (f"their {n_other} cores", "were")
    after = (f"engine {engine_share:.0%} (on its core), HTTP side {http_share:.0%} + load generator "
             f"{client_share:.0%} on the other {cores_word}, i.e. {shared_pct}% of {'it' if n_other == 1 else 'them'}"
             if pinned_own else
             "not pinned apart: " + (f"engine {engine_share:.0%}, " if child else "engine not found, ")
             + f"HTTP side {http_share:.0%}, load generator {client_share:.0%}")
    print(f"CPU used, as a share of the wall time: before, server {before_server:.0%} (on its core) and load "
          f"generator {before_client:.0%} (on the other {cores_word}); after, {after} (each process's threads "
          "together, from just before to just after the run; the breakdown above lists single threads)")
    if not pinned_own:
        print("(the engine was not pinned apart, so this cell cannot tell other programs' share of the cores "
              "from the server's)")
    elif measured is None:
        print(f"(this OS does not report each core's busy time, so this cell cannot tell what else ran on the "
              f"{cores_word} of the HTTP side and the load generator)")
    else:
        print(f"{their.replace('their', 'that' if n_other == 1 else 'those')} over the run, every process: busy "
              f"{busy_pct}% (HTTP side and load generator {shared_pct}%, other programs {busy_pct - shared_pct}%), "
              f"idle {100 - busy_pct}%")
    busy_text = (f"{their} {was} busy {busy_pct}% of the time"
                 + (f", other programs {busy_pct - shared_pct}% of it" if others_named else "")
                 if measured is not None else
                 f"the HTTP side and the load generator kept {their} busy {shared:.0%} of the time")
    if not pinned_own:
        print("what it points to: nothing certain; the engine could not be pinned apart, so every part shared "
              "every core in this run")
    elif rows_word == "lower" and busy >= 0.9:
        print(f"what it points to: more requests were outside the engine's batch, while {busy_text}: requests came "
              f"back to the engine more slowly than it freed rows, so it ran smaller passes ({breakdown.steps:,} -> "
              f"{own.steps:,} passes, the engine busy {engine_share:.0%}); the side that sends requests and reads "
              "tokens" + (", short of CPU beside other programs," if others_named else "")
              + " is the likely limit on this machine (the pipe between the HTTP side and the engine is not "
              "timed apart here)")
    elif rows_word == "lower":
        print(f"what it points to: fewer requests were in the engine's batch, but {busy_text}, so these figures "
              "do not show where the requests outside the batch waited")
    elif rows_word == "higher" and tps_word == "higher":
        print("what it points to: more rows per forward pass, in line with the higher tokens/s")
    else:
        held = ("about as many rows as before (within the band)" if rows_word == "no clear difference" else
                "more rows than before (beyond the band)")
        print(f"what it points to: the batch held {held}, "
              + ("so the requests outside it do not explain the change in tokens/s; the shares of the wall time "
                 "above show which part changed" if tps_word != "no clear difference" else
                 "and tokens/s did not clearly change: the engine process alone on a core made no clear difference "
                 "on this machine against the engine thread with the whole server on one core (this comparison "
                 "changes both at once)"))

# %% [markdown]
# ### Testing the pointer: less work for the sending side
#
# The last line above names what the figures point to. A pointer is a hypothesis until a run changes
# that one thing and looks again. The side that sends requests and reads tokens does some of its work
# per *chunk* of a stream: the HTTP side writes each chunk, and the load generator receives each one
# (it parses every token's event whatever the chunks, so that part stays).
# `stream_interval_ms` sets how often the engine hands tokens over (10 ms by default; a request's first
# and last tokens go at once). A longer interval sends the same tokens in fewer, larger chunks, so that
# side should have less work per token (the cell measures whether it did); each token reaches its
# client up to that much later (this cell does not time that delay).
#
# The cell below runs the layout of the cell above (the engine process alone on one core, the HTTP
# side and the load generator on the other core or cores) at 10 ms and at 40 ms, two servers taking turns, and prints
# for each the tokens per second, the rows per forward pass and the sending side's CPU time per
# thousand tokens (the HTTP side's threads and the load generator's together), each with a verdict. If
# the sending side limited the batch, the longer interval should cut its CPU per token and fill the
# batch; if it did not, the batch stays as it was. Fewer hand-overs also save the engine some work of its own (fewer messages on its pipe),
# which this cell does not time apart; that saving would show as faster passes, not as fuller ones,
# so the rows per pass are the figure to watch. The last line says what this run shows.

# %%
if plan is None:
    print("skipped: this OS or machine cannot give the engine a core of its own")
else:
    INTERVALS = (10, 40)               # ms: the default, and four times it
    IV_ROUNDS = config.pick(quick=2, full=12)   # requests per client in each run (the batch fills and drains once)
    IV_RUNS = config.pick(quick=2, full=5)      # runs per server, taking turns
    SENDING = "sending side CPU ms per 1k tokens"   # HTTP side + load generator
    iv: dict[int, dict[str, list[float]]] = {ms: {"tokens/s": [], "rows": [], SENDING: []} for ms in INTERVALS}
    with contextlib.ExitStack() as stack:
        servers = {ms: stack.enter_context(serve_in_subprocess(
            {"batching": "iteration", "embed": False, "engine_process": True, "threads": EFF_THREADS,
             "stream_interval_ms": ms})) for ms in INTERVALS}
        children = {ms: engine_child(srv.proc.pid) for ms, srv in servers.items()}
        layout = {os.getpid(): plan[1]}
        for ms, srv in servers.items():
            layout[srv.proc.pid] = plan[1]
            if children[ms]:
                layout[children[ms]] = plan[0]
        iv_pinned = stack.enter_context(pinned(layout if all(children.values()) else {}))
        for srv in servers.values():
            run_load(srv.url, concurrency=8, n_requests=8, max_new_tokens=8)  # warm-up
        for round_ in range(IV_RUNS):  # rounds alternate which server goes first
            for ms in (INTERVALS if round_ % 2 == 0 else INTERVALS[::-1]):
                srv = servers[ms]
                cpu = cpu_seconds(srv.proc.pid) + time.process_time()   # the HTTP side's threads + this kernel's
                iv_run, iv_bd = measure(srv.url, srv.proc.pid, lambda: run_load(
                    srv.url, concurrency=32, n_requests=32 * IV_ROUNDS, prompts=PROMPTS, max_new_tokens=NEW_TOKENS))
                sending_cpu = cpu_seconds(srv.proc.pid) + time.process_time() - cpu
                assert iv_run.n_lost == 0, (ms, iv_run.errors[:3], srv.log_tail(1500))
                iv[ms]["tokens/s"].append(iv_run.tokens_per_s)
                iv[ms]["rows"].append(iv_bd.mean_rows)
                iv[ms][SENDING].append(1e6 * sending_cpu / (iv_run.n_ok * NEW_TOKENS))
    print("engine process alone on one core, HTTP side and load generator on the other" if iv_pinned else
          "the engines could not be pinned apart, so these runs share every core")
    med = {ms: {k: statistics.median(v) for k, v in figures.items()} for ms, figures in iv.items()}
    words = {}
    for what, short in (("tokens/s", "tokens_per_s"), ("rows", "rows"), (SENDING, "sending_cpu")):
        a, b = med[INTERVALS[1]][what], med[INTERVALS[0]][what]
        words[what] = pair_verdict(iv[INTERVALS[1]][what], iv[INTERVALS[0]][what])
        bench.record_verdict(f"serve.stream_interval.{short}.40_vs_10", words[what],
                             **pair_record(iv[INTERVALS[1]][what], iv[INTERVALS[0]][what], words[what]))
        spread = {ms: f"{min(iv[ms][what]):,.1f}-{max(iv[ms][what]):,.1f}" for ms in INTERVALS}
        print(f"{what:>34}: {INTERVALS[0]} ms {b:8,.1f} | {INTERVALS[1]} ms {a:8,.1f} -> "
              f"{bench.ratio_text(a / b, PAIR_BAND)}, {words[what]} "
              f"(medians of {IV_RUNS} runs, ranges {spread[INTERVALS[0]]} and {spread[INTERVALS[1]]}"
              f"{overlap_text(iv[INTERVALS[1]][what], iv[INTERVALS[0]][what], words[what])})")
    print(f"(for the medians, {bench.band_text(PAIR_BAND)})")
    runs = {what: (iv[INTERVALS[0]][what], iv[INTERVALS[1]][what]) for what in words}   # (10 ms runs, 40 ms runs)
    small_cut = (words[SENDING] == "no clear difference" and not ranges_overlap(*runs[SENDING])
                 and med[INTERVALS[1]][SENDING] < med[INTERVALS[0]][SENDING])   # every longer-interval run lower
    if small_cut:
        rows_ratio = med[INTERVALS[1]]["rows"] / med[INTERVALS[0]]["rows"]
        print("what this run shows: the longer interval cut the sending side's CPU per token only a little "
              f"({bench.ratio_text(med[INTERVALS[1]][SENDING] / med[INTERVALS[0]][SENDING], PAIR_BAND)} by the medians, "
              f"inside the band, though every {INTERVALS[1]} ms run used less than every {INTERVALS[0]} ms run), and the "
              f"batch {'grew' if words['rows'] == 'higher' else 'did not clearly grow'} (rows "
              f"{bench.ratio_text(rows_ratio, PAIR_BAND)}): a cut this small tests the pointer only weakly"
              + ("" if words["rows"] == "higher" else
                 ", and these runs do not show the sending side's work per chunk limiting the batch"))
    elif words[SENDING] != "lower":
        moved = [f"{what} {words[what]}" for what in ("rows", "tokens/s") if words[what] != "no clear difference"]
        print("what this run shows: the longer interval did not clearly cut the sending side's CPU per token, so it "
              "did not test the pointer here" + (f" ({' and '.join(moved)} all the same, from a cause this cell "
                                                 "does not measure)" if moved else ""))
    elif words["rows"] == "higher":
        tokens_said = {"higher": "rose by the medians", "lower": "fell by the medians",
                       "no clear difference": "showed no clear difference"}[words["tokens/s"]]
        gained = (f"the batch held more rows ({med[INTERVALS[0]]['rows']:.1f} -> {med[INTERVALS[1]]['rows']:.1f} "
                  f"by the medians), and tokens/s {tokens_said}")
        unsettled = [what for what in (SENDING, "tokens/s")
                     if words[what] != "no clear difference" and ranges_overlap(*runs[what])]
        print(f"what this run shows: with fewer chunks to send and read, {gained}: "
              + (f"every run at {INTERVALS[1]} ms held more rows than every run at {INTERVALS[0]} ms, so fewer chunks "
                 "went with a fuller batch, which points to the sending side's work per chunk as a limit on the batch "
                 "on this machine in these runs" + (f" (the ranges of {' and of '.join(unsettled)} overlap, so "
                                                    f"{'that figure is' if len(unsettled) == 1 else 'those figures are'}"
                                                    " not settled)" if unsettled else "")
                 if not ranges_overlap(*runs["rows"]) else
                 "the medians point to the sending side's work per chunk as a limit on the batch, but the rows' "
                 + ("ranges overlap" if not ranges_overlap(*runs[SENDING]) else
                    "ranges overlap (and so do those of the sending side's CPU per token)")
                 + f", so {IV_RUNS} runs each do not settle it: rerun the cell, or raise IV_RUNS"))
    else:
        overlapping = [(said, question) for what, said, question in (
            (SENDING, "the sending side's CPU per token", "whether the sending side's CPU per token fell"),
            ("rows", "the rows per pass", "whether the batch grew")) if ranges_overlap(*runs[what])]
        print("what this run shows: the sending side spent less CPU per token"
              + (" by the medians" if ranges_overlap(*runs[SENDING]) else "")
              + ", but the batch " + ("held fewer rows by the medians" if words["rows"] == "lower"
                                      else "did not clearly grow")
              + f" (tokens/s: {words['tokens/s']}): these runs do not show the sending side's work per chunk "
              "limiting the batch" + (f"; the two intervals' ranges overlap for {' and for '.join(o for o, _ in overlapping)}"
                                      f", so {IV_RUNS} runs each do not settle "
                                      + " or ".join(q for _, q in overlapping) if overlapping else ""))

# %% [markdown]
# ## Compiling the model inside the server
#
# `ServeSettings(compile=True)` compiles the tensor work of a decoding step
# (`course_utils.models.gpt.decode_core`) with `torch.compile(..., dynamic=True)`. Two details make
# that work in a server. First, what stays outside the compiled region: `decode_step` reads a Python
# number out of a tensor (how far back to attend) and writes the new keys and values into the
# cache; inside a compiled function the first would break the graph (notebook 02) and the second
# would make Inductor copy the whole cache on every step. `decode_core` only computes, so it
# compiles to one graph for batch size 1 (sizes 0 and 1 are specialised) and one dynamic graph shared
# by every other batch size and length (`tests/test_serving_batching.py` counts them: two). Steps that also compute prompt tokens run
# eager (`EngineCore` uses the compiled step only when every row decodes). Second, *when* it compiles: the server compiles during start-up, before
# `/health` answers, so no client waits for it; `serve_in_subprocess` waits for that.
# Compiling adds to the start-up (the cell prints both servers' start-up times here, and whether Inductor's on-disk
# cache gained compiled graphs meanwhile: with that cache cold the start-up also builds the code, which notebook 01
# measures), so quick mode skips this cell. The compiled and
# the eager server run side by side, taking turns, so a slow spell of the machine hits both.

# %%
if config.is_quick():
    print("skipped in quick mode: compiling the server's decoding step is too slow for quick mode")
else:
    import statistics

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    graph_dir = os.path.join(cache_dir(), "fxgraph")   # where Inductor files each graph it compiles (torch 2.14)

    def graph_files() -> int:
        """Files in Inductor's on-disk graph cache (the servers inherit this kernel's cache folder)."""
        return sum(len(files) for _, _, files in os.walk(graph_dir))

    rates: dict[str, list[float]] = {"compiled": [], "eager": []}
    files_before = graph_files()
    started = time.perf_counter()
    with serve_in_subprocess({"batching": "iteration", "embed": False, "compile": True},
                             startup_timeout_s=300) as compiled_srv:
        startup_s = time.perf_counter() - started
        new_files = graph_files() - files_before
        started = time.perf_counter()
        with serve_in_subprocess({"batching": "iteration", "embed": False}) as eager_srv:
            eager_startup_s = time.perf_counter() - started
            pair = {"compiled": compiled_srv, "eager": eager_srv}
            for srv in pair.values():
                run_load(srv.url, concurrency=8, n_requests=16, max_new_tokens=NEW_TOKENS)  # warm caches
            for round_ in range(3):  # rounds alternate which server goes first
                for name in (list(pair) if round_ % 2 == 0 else list(pair)[::-1]):
                    report = run_load(pair[name].url, concurrency=32, n_requests=32 * ROUNDS,
                                      prompts=PROMPTS, max_new_tokens=NEW_TOKENS)
                    assert report.n_lost == 0, (name, report.errors[:3], pair[name].log_tail(1500))
                    rates[name].append(report.tokens_per_s)
    median = {name: statistics.median(r) for name, r in rates.items()}
    compile_band = pair_verdict(rates["compiled"], rates["eager"])
    bench.record_verdict("serve.compile.compiled_vs_eager", compile_band,
                         **pair_record(rates["compiled"], rates["eager"], compile_band))
    compile_word = {"higher": "pays", "lower": "is slower", "no clear difference": "makes no clear difference"}[compile_band]
    # Where Inductor writes scalar code: with a difference, the note says what it can mean; without one, only that
    # the compiled loops are scalar here.
    scalar_said = inductor_code.scalar_note(compared=compile_band != "no clear difference")
    cache_said = (f"Inductor's on-disk cache gained {new_files} file{'s' if new_files != 1 else ''} of compiled graphs, "
                  "so this start-up built at least part of the code" if new_files > 0 else
                  "Inductor's on-disk cache gained no compiled graph, so the code most likely came from an earlier "
                  "run's entries" if files_before else
                  "Inductor's on-disk cache stayed empty, so this cell cannot tell whether the start-up built the code "
                  "or found it; the cache may be switched off")
    print(f"start-up including the compile: {startup_s:.0f} s ({cache_said}); the eager server's start-up: "
          f"{eager_startup_s:.0f} s (clients could not connect to either before its start-up ended)")
    print("iteration batching at 32 clients, " + "; ".join(
        f"{name} {median[name]:,.0f} tokens/s ({runs_text(r)})" for name, r in rates.items()))
    print(f"compiled / eager: {bench.ratio_text(median['compiled'] / median['eager'], PAIR_BAND)} -> "
          f"compiling {compile_word} here "
          f"(the same rule as for the engine process: for the medians, {bench.band_text(PAIR_BAND)}"
          f"{overlap_text(rates['compiled'], rates['eager'], compile_band)})" + scalar_said)

# %% [markdown]
# The verdict above is this machine's, and it can differ on another machine or under another load.
# What compiling can change here is limited either way. A decoding step of a model this small is a
# few small matrix products, and Inductor hands those to the same matrix libraries that eager mode
# calls, so the products themselves are not what it speeds up. What it can save is the rest: the
# Python and dispatch overhead that eager mode pays for every operation, and the elementwise work
# around the products (layer norms, the GELU, residual additions, reshaping for the heads), which
# Inductor fuses into fewer loops. This notebook does not measure which of the two made the
# difference where there was one. Had the compiled region contained the `int(...)` or the in-place cache
# writes, every step would have paid for a graph break or for a copy of the whole cache;
# `TORCH_LOGS="graph_breaks,recompiles"` on the server process shows such problems (notebook 02), and
# `tests/test_serving_batching.py` checks that the server's compiled step makes no new graph under
# load. On a GPU the balance is different: per-step kernel-launch overhead is larger, and fusing
# kernels plus CUDA graphs (`mode="reduce-overhead"`) target exactly that; this notebook does not
# measure it.
#
# What it does measure on a GPU, in the guarded cell below (any GPU torch drives: NVIDIA or AMD,
# Apple's MPS, Intel's XPU; nothing in it is compiled), is batching itself: the eager decoder
# continuing one prompt and 32 prompts for the same number of steps, timed side by side.

# %%
if requires_accelerator("batched decoding on a GPU: a batch of 32 against one row"):
    dev = accelerator()
    gpu_model = load_tiny_gpt()[0].to(dev)
    gpu_prompts = {b: torch.randint(0, tok.vocab_size, (b, 8), device=dev) for b in (1, 32)}
    gpu_decode = bench.compare({f"batch {b}": lambda idx=idx: generate_cached(gpu_model, idx, NEW_TOKENS)
                                for b, idx in gpu_prompts.items()}, device=dev)
    print(gpu_decode)
    for b in gpu_prompts:
        print(f"{dev.type.upper()}, batch {b:2d}: {b * NEW_TOKENS / gpu_decode.row(f'batch {b}').median_s:,.0f} tokens/s")
    gpu_said = gpu_decode.describe("batch 32", "batch 1", name="serve.gpu.batch32_vs_batch1")
    print(f"a call decoding 32 rows ({NEW_TOKENS} steps, 32x the tokens) against one decoding 1 row: {gpu_said}")
    rows = generate_cached(gpu_model, gpu_prompts[32], NEW_TOKENS)
    assert len(rows) == 32 and all(len(r) == NEW_TOKENS for r in rows)
    with torch.inference_mode():  # a row's logits do not depend on the rows beside it (up to rounding)
        torch.testing.assert_close(gpu_model(gpu_prompts[32])[:1], gpu_model(gpu_prompts[32][:1]), atol=1e-4, rtol=1e-4)
    del gpu_model

# %% [markdown]
# ## The same model in LitServe
#
# [LitServe](https://lightning.ai/docs/litserve) is a serving framework built on FastAPI and uvicorn.
# You write a `LitAPI` class (`setup` loads the model, `decode_request`, `predict`,
# `encode_response`), and LitServe runs the model in separate worker processes, batches requests
# (`max_batch_size`, `batch_timeout`) and streams (`stream=True`: `predict` yields). Its batching is
# static: a batch is collected, handed to `predict`, and decoded to the end.
#
# The next cell writes `litserve_app.py`, which serves our checkpoint that way: `predict` runs a
# static batch on the course's serving core (`EngineCore(join_running=False)`: every prompt in the
# first step, then decoding until the batch's longest request is done) and yields each step's
# tokens as the same server-sent events our server writes, so the same load generator drives both
# unchanged. The HTTP front gets our server's guards from the same code and settings: the request
# model of `/generate` with its limits (LitServe's own validation echoes the value it refuses, and
# answers 500 to a NaN), its 422 answer, the body cap and the `Host` check. Two LitServe details
# the file works around, each with a comment: the request model is made at run time, so it pickles
# as a plain dict for the worker process; and the route's body type comes from `decode_request`'s
# annotation. The app runs as its own process bound to 127.0.0.1, like our server. Same prompts,
# same number of new tokens, same number of clients; our server runs in its default mode, iteration,
# and the two take turns for the whole cell, as the pairs above did:

# %%
# %%writefile {APPS}/litserve_app.py
"""TinyGPT served by LitServe, with LitServe's own (static) batching and streaming; notebook 10 writes this file.

Run it as its own process, bound to loopback: ``python litserve_app.py --port 8001``. The route is
``POST /predict`` with our ``/generate`` body and the same server-sent events; the HTTP front has
our server's request model, 422 answer, body cap and Host check, from the same code and settings.
"""

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import litserve as ls
import torch
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from course_utils import config
from course_utils.data.text import CharTokenizer
from course_utils.models.gpt import TinyGPT
from course_utils.serving.core import EngineCore
from course_utils.serving.core import Sequence as Row
from course_utils.serving.core import sampling_generator as row_generator
from course_utils.serving.server.app import generate_request_model, validation_error
from course_utils.serving.server.engine import check_limits
from course_utils.serving.server.guards import BodyLimit, HostCheck
from course_utils.serving.server.instance import InstanceHeader, PortError, instance_token, listen_socket, report_port
from course_utils.serving.server.runner import http_protocol
from course_utils.serving.server.settings import ServeSettings, default_threads
from course_utils.serving.server.sse import END, format_event, token_event

#: LitServe's route; ours is /generate.
ROUTE = "/predict"
#: Defaults of the app's batching (the function arguments and the command line share them).
MAX_BATCH_SIZE = 32
BATCH_TIMEOUT_S = 0.005
#: A request as the model worker gets it: prompt ids, max_new_tokens, temperature, sampling generator.
Decoded = tuple[list[int], int, float, torch.Generator | None]


def load_model(path: str | None = None) -> tuple[torch.nn.Module, Any]:
    """Return ``(model, tokenizer)``: the course's TinyGPT checkpoint, in eval mode.

    ``path`` defaults to ``$COURSE_SERVE_MODEL`` and then to the shipped ``data/tiny_gpt.pt``.
    """
    from course_utils.models.checkpoint import load_tiny_gpt

    model, tok = load_tiny_gpt(path or os.environ.get("COURSE_SERVE_MODEL") or None)
    return model.eval(), tok


def decode_rows(model: TinyGPT, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
                temperatures: Sequence[float] | None = None,
                generators: Sequence[torch.Generator | None] | None = None) -> Iterator[list[int | None]]:
    """Yield, step by step, one new token id per row (``None`` once a row has all its tokens).

    A static batch on the course's serving core (``EngineCore`` with ``join_running=False``, a
    budget that computes every prompt in the first step): it runs until its longest request is done.
    Rows are greedy unless ``temperatures`` gives them a temperature above 0; then they sample with
    ``generators`` (``sample_token``, exactly as our server's engine does it).
    """
    n = len(prompts)
    temperatures = list(temperatures) if temperatures is not None else [0.0] * n
    generators = list(generators) if generators is not None else [None] * n
    longest = max(len(p) + m for p, m in zip(prompts, max_new_tokens))
    core = EngineCore(model, capacity=n, max_len=min(model.config.block_size, longest),
                      token_budget=sum(len(p) for p in prompts) + n, join_running=False)
    seqs = [core.add(Row(list(p), m, t, g)) for p, m, t, g in zip(prompts, max_new_tokens, temperatures, generators)]
    row_of = {seq: row for row, seq in enumerate(seqs)}
    while core.has_work():
        tokens: list[int | None] = [None] * n
        for seq, tok in core.step().emitted:
            tokens[row_of[seq]] = tok
        yield tokens


class QueuedAsDict:
    """Mixin for the request model: it pickles as the plain dict of its validated fields.

    LitServe pickles the validated request to hand it to the model worker (another process,
    started with "spawn"). The request model is made at run time by ``generate_request_model``
    (its limits come from the settings), so the worker could not import its class; a dict it
    can always read, and it holds nothing the model did not validate.
    """

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return dict, (self.model_dump(),)  # type: ignore[attr-defined]


def request_model(settings: ServeSettings | None = None,
                  tokenizer: CharTokenizer | None = None) -> type[BaseModel]:
    """Return the model of a ``POST /predict`` body: our server's ``/generate`` model, with the limits
    of ``settings`` (default: ``ServeSettings()``) and ``tokenizer``'s vocabulary (default: the
    served checkpoint's), made picklable for LitServe's worker (``QueuedAsDict``)."""
    settings = settings or ServeSettings()
    if tokenizer is None:
        tokenizer = load_model()[1]
    base = generate_request_model(settings, tokenizer)
    return type(base.__name__, (QueuedAsDict, base), {"__module__": __name__, "__doc__": base.__doc__})


class TinyGPTLitAPI(ls.LitAPI):
    """LitServe API: decode a batch of prompts (greedy or sampled per request), streaming each step's tokens."""

    def setup(self, device: str) -> None:
        # Same thread count as our server's model worker (one on a small machine).
        torch.set_num_threads(int(os.environ.get("COURSE_SERVE_THREADS") or default_threads()))
        self.model, self.tok = load_model()

    def declare_request_type(self, request_type: type[BaseModel]) -> None:
        """Make ``request_type`` the body model of the route.

        LitServe takes it from the annotation of ``decode_request`` when ``LitServer`` is built, so
        this shadows the method with an annotated copy on this instance. The copy stays in this
        (the HTTP) process: ``__getstate__`` leaves it out when LitServe pickles the API for its
        worker, which decodes with the plain method (and could not unpickle the run-time class).
        """
        def decode_request(request: request_type) -> Decoded:  # type: ignore[valid-type]
            return TinyGPTLitAPI.decode_request(self, request)

        self.decode_request = decode_request  # type: ignore[method-assign]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("decode_request", None)  # see declare_request_type
        return state

    def decode_request(self, request: Any) -> Decoded:
        """Return what ``predict`` needs of one validated request (a dict in the worker, see ``QueuedAsDict``)."""
        fields = request if isinstance(request, dict) else request.model_dump()
        temperature = float(fields["temperature"])
        return (self.tok.encode(fields["prompt"]), int(fields["max_new_tokens"]), temperature,
                row_generator(temperature, fields.get("seed")))

    def batch(self, inputs: list[Decoded]) -> list[Decoded]:
        return list(inputs)

    def predict(self, batch: list[Decoded]) -> Iterator[list[str]]:
        prompts, limits, temperatures, generators = (list(column) for column in zip(*batch))
        with torch.inference_mode():
            for step, tokens in enumerate(decode_rows(self.model, prompts, limits, temperatures, generators)):
                chunks = []
                for row, tok_id in enumerate(tokens):
                    if tok_id is None:
                        chunks.append("")
                        continue
                    chunk = token_event(self.tok.decode([tok_id]), step)
                    if step + 1 == limits[row]:
                        chunk += format_event({"reason": "length", "tokens": limits[row]}, END)
                    chunks.append(chunk)
                yield chunks

    def unbatch(self, output: Iterator[list[str]]) -> Iterator[list[str]]:
        yield from output

    def encode_response(self, output):  # no annotations: LitServe reads them as the response type
        yield from output


def build_server(max_batch_size: int = MAX_BATCH_SIZE, batch_timeout: float = BATCH_TIMEOUT_S,
                 settings: ServeSettings | None = None) -> Any:
    """Return a ``litserve.LitServer`` for TinyGPT on the CPU, batching and streaming.

    ``settings`` (default ``ServeSettings()``) gives the request limits, ``max_body_bytes`` and
    ``allow_hosts``, exactly as for our server; its other fields do not apply to LitServe.
    """
    settings = settings or ServeSettings()
    model, tok = load_model()
    check_limits(settings, model)
    api = TinyGPTLitAPI(max_batch_size=max_batch_size, batch_timeout=batch_timeout, stream=True,
                        api_path=ROUTE)
    api.declare_request_type(request_model(settings, tok))
    # Our BodyLimit, not LitServe's ``max_payload_size``: that one only counts while the route
    # reads (no Content-Length check first) and answers in its own words. HostCheck is added
    # last, so it runs first, as on our server. InstanceHeader tells our parent process it reached this server.
    guards = [(BodyLimit, {"max_bytes": settings.max_body_bytes}), (HostCheck, {"allowed": settings.allow_hosts}),
              (InstanceHeader, {"token": instance_token()})]
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=60,
                          middlewares=guards)
    server.app.add_exception_handler(RequestValidationError, validation_error)
    return server


def command(port: int, max_batch_size: int = MAX_BATCH_SIZE, batch_timeout: float = BATCH_TIMEOUT_S,
            model: str | None = None, threads: int | None = None) -> list[str]:
    """Return the command line that starts this app on 127.0.0.1:``port`` (for ``ServerProcess``)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--port", str(port),
           "--max-batch-size", str(max_batch_size), "--batch-timeout", str(batch_timeout)]
    if model:
        cmd += ["--model", str(model)]
    if threads:
        cmd += ["--threads", str(threads)]
    return cmd


def litserve_process(max_batch_size: int = MAX_BATCH_SIZE, batch_timeout: float = BATCH_TIMEOUT_S, model: str | None = None,
                     threads: int | None = None, startup_timeout_s: float = 90.0) -> Any:
    """Return a ``ServerProcess`` (use it with ``with``) running this app on a loopback port it binds itself."""
    from course_utils.serving.server.process import ServerProcess

    env = {"PYTHONPATH": config.child_pythonpath(), "PYTHONUNBUFFERED": "1"}
    # Port 0: the app binds a free port itself and reports it (no race with other programs for it).
    return ServerProcess(command(0, max_batch_size, batch_timeout, model, threads),
                         startup_timeout_s=startup_timeout_s, env=env, cwd=config.REPO_ROOT)


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, ServeSettings]:
    """Parse the command line; return the arguments and the ``ServeSettings`` they give."""
    defaults = ServeSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE)
    parser.add_argument("--batch-timeout", type=float, default=BATCH_TIMEOUT_S, help="seconds")
    parser.add_argument("--model", default=None, help="checkpoint path (default: data/tiny_gpt.pt)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the model worker")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes,
                        help="larger request bodies get 413")
    parser.add_argument("--allow-host", dest="allow_hosts", action="append", default=None, metavar="NAME",
                        help="accept this Host header name besides loopback ones (repeatable); others get 400")
    args = parser.parse_args(argv)
    try:
        settings = defaults.replace(max_body_bytes=args.max_body_bytes, allow_hosts=tuple(args.allow_hosts or ()))
    except ValueError as err:
        parser.error(str(err))
    return args, settings


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the server until interrupted."""
    args, settings = parse_args(argv)
    # LitServe runs the model in a spawned worker process: hand it these through the environment.
    if args.model:
        os.environ["COURSE_SERVE_MODEL"] = args.model
    if args.threads:
        os.environ["COURSE_SERVE_THREADS"] = str(args.threads)
    try:  # bind first: a taken port is one clear line, before the model loads
        sock = listen_socket(args.host, args.port)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    port = sock.getsockname()[1]
    server = build_server(args.max_batch_size, args.batch_timeout, settings)
    report_port(port)
    # uvicorn's limits as on our server (LitServe hands these keywords to uvicorn.Config); LitServe
    # refuses port 0, so it gets the socket we bound (fd) and its real port.
    server.run(host=args.host, port=port, fd=sock.fileno(), num_api_servers=1, log_level="warning",
               generate_client_file=False, limit_concurrency=settings.limit_concurrency,
               timeout_keep_alive=settings.keep_alive_s, h11_max_incomplete_event_size=settings.max_header_bytes,
               http=http_protocol(settings))  # request-head time and size limits (408, 431)


if __name__ == "__main__":
    main()

# %%
import litserve_app  # noqa: E402  (the file the cell above wrote)

litserve_app = importlib.reload(litserve_app)
ROUTE, litserve_process = litserve_app.ROUTE, litserve_app.litserve_process

# Ours in its default mode, iteration (chosen before measuring), and LitServe side by side: both run for the
# whole cell and take turns, each round starting with the other, as in the pairs above.
OURS_MODE = "iteration"
lit_runs: dict[str, list] = {"ours": [], "LitServe": []}
with litserve_process(max_batch_size=32, batch_timeout=0.005) as lit, \
        serve_in_subprocess({"batching": OURS_MODE, "embed": False, "max_batch_size": 32}) as ours_srv:
    targets = {"ours": (ours_srv.url, "/generate"), "LitServe": (lit.url, ROUTE)}
    for url, path in targets.values():
        run_load(url, concurrency=4, n_requests=4, max_new_tokens=4, path=path)  # warm-up
    for round_ in range(config.pick(1, 3)):
        for name in (list(targets) if round_ % 2 == 0 else list(targets)[::-1]):
            url, path = targets[name]
            r = run_load(url, concurrency=32, n_requests=32 * ROUNDS, prompts=PROMPTS, max_new_tokens=NEW_TOKENS,
                         path=path, keep_texts=name == "LitServe")
            assert r.n_lost == 0, (name, r.errors[:3], {"ours": ours_srv, "LitServe": lit}[name].log_tail(1500))
            lit_runs[name].append(r)
lit32 = lit_runs["LitServe"][0]
check_greedy(lit32.texts[1], PROMPTS[1], NEW_TOKENS, what="LitServe")
lit_rates = {name: [r.tokens_per_s for r in runs] for name, runs in lit_runs.items()}
lit_median = {name: statistics.median(rates) for name, rates in lit_rates.items()}
vs_lit = lit_median["ours"] / lit_median["LitServe"]
print(f"32 clients: ours ({OURS_MODE}) {lit_median['ours']:,.0f} tokens/s ({runs_text(lit_rates['ours'])}), "
      f"LitServe {lit_median['LitServe']:,.0f} tokens/s ({runs_text(lit_rates['LitServe'])}) -> "
      f"{bench.ratio_text(vs_lit, PAIR_BAND)}")
print("medians over the runs: TTFT p50 " + ", ".join(
    f"{name} {statistics.median(r.ttft_ms['p50'] for r in runs):.0f} ms" for name, runs in lit_runs.items()) +
      "; p99 latency " + ", ".join(
    f"{name} {statistics.median(r.latency_ms['p99'] for r in runs):.0f} ms" for name, runs in lit_runs.items()))
bench.record("serve.vs_litserve.c32", vs_lit, "x", ours=OURS_MODE, litserve_batch=32, litserve_timeout_s=0.005,
             new_tokens=NEW_TOKENS, requests=lit32.n_requests, runs=len(lit_rates["ours"]))
# The rule for pairs above (PAIR_BAND on the medians). The target (at least LitServe's throughput)
# lives in the results report's expected range.
lit_band = pair_verdict(lit_rates["ours"], lit_rates["LitServe"])
bench.record_verdict("serve.litserve.ours_vs_litserve.c32", lit_band,
                     **pair_record(lit_rates["ours"], lit_rates["LitServe"], lit_band))
lit_word = {"higher": "faster than", "lower": "slower than", "no clear difference": "not clearly different from"}[lit_band]
print(f"verdict on this machine: our server is {lit_word} LitServe at 32 clients (for the medians, "
      f"{bench.band_text(PAIR_BAND)}{overlap_text(lit_rates['ours'], lit_rates['LitServe'], lit_band)})"
      + ("" if lit_band == "no clear difference" else
         f"; the two differ in their batching policy (ours {OURS_MODE}, LitServe's static) and in LitServe's hops "
         "between its processes, and this cell does not split the one from the other"))

# %%
# Two groups, each measured in one cell: the table's three modes, and the side-by-side pair (medians).
names = ["none (table)", "static (table)", "iteration (table)", f"ours, {OURS_MODE} (pair)", "LitServe (pair)"]
values = [reports[m, 32].tokens_per_s for m in MODES] + [lit_median["ours"], lit_median["LitServe"]]
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.barh(names, values, color=["#bbb", "#7aa6d6", "#2c6fbb", "#2c6fbb", "#e08a3c"])
for y, v in enumerate(values):
    ax.text(v, y, f" {v:,.0f}", va="center")
ax.axhline(2.5, color="#888", linewidth=0.8)
ax.invert_yaxis()
ax.set_xlabel("tokens/s at 32 concurrent clients")
ax.set_title("the same TinyGPT checkpoint, served four ways (compare bars within a group)")
fig.tight_layout();

# %% [markdown]
# Both run the same model on the same machine; what differs is around it: the batching policy (ours
# in iteration mode, LitServe's static), and the hops between processes: LitServe passes every
# request and every streamed chunk between its HTTP process and its worker process through queues, while our worker hands tokens to
# the event loop in the same process. LitServe's design buys isolation (a crashed worker does not take the HTTP server down) and scaling to several workers and
# devices with one setting; on a small CPU the extra hops can show (the verdict above is this machine's). The cell
# does not tell the policy from the hops: to split them, add our server in static mode
# (`{"batching": "static", ...}`) as a third server in the same rounds; set against LitServe it differs only in the
# hops and the machinery, set against ours in iteration mode only in the policy.
#
# ## Many requests at once
#
# Throughput means little if requests get lost. The last measurement sends many requests from 64
# concurrent clients, twice the maximum batch, so more requests are in flight than a batch can hold, and counts
# every request that failed or whose stream was malformed (wrong order, missing tokens, no `end`).
# If any is lost, the assert shows the first errors (each with the error under httpx's, such as a
# reset connection, and when it came) and the end of the server's log.

# %%
N_LOAD = config.pick(quick=192, full=1000)
LOAD_TOKENS = config.pick(quick=8, full=16)
with serve_in_subprocess({"batching": "iteration", "embed": False}) as server:
    load = run_load(server.url, concurrency=64, n_requests=N_LOAD, prompts=PROMPTS,
                    max_new_tokens=LOAD_TOKENS, timeout_s=120)
print(f"{load.n_requests} requests, 64 clients: {load.n_ok} ok, {load.n_failed} failed, "
      f"{load.n_malformed} malformed, in {load.wall_s:.1f} s ({load.requests_per_s:.0f} requests/s); "
      f"statuses {load.statuses}")
bench.record("serve.load.lost", load.n_lost, "requests", requests=N_LOAD, concurrency=64,
             new_tokens=LOAD_TOKENS, note="quick mode sends fewer than 1,000 requests" if config.is_quick() else "")
assert load.n_lost == 0, (load.errors[:5], server.log_tail(1500))  # the server's log, kept after it stopped

# %% [markdown]
# ## The demo page, against the real server
#
# The prototype of step 1 held the model itself. A demo page for the real server holds no model: it
# is one more client, reading the token stream of `POST /generate` and showing the text as it
# grows. The next cell writes it as a small program, `demo_page.py`, in this notebook's build
# folder: `stream_generate` reads the server-sent events with the course's parser
# (`course_utils.serving.server.sse.SSEParser`, which also checks the token order) and turns every
# failure (a refused request, an error event, a server that is not there, a stream cut short) into a
# readable `[error ...]` line, because a demo page should show what went wrong rather than raise;
# `launch_demo` starts the page on 127.0.0.1 without blocking the cell. Both ignore proxy settings
# for loopback addresses: a laptop behind a company proxy often has `HTTP_PROXY` set, and a request
# for `127.0.0.1` sent to the proxy fails. Edit the file and run the cells again to change the page.
# The test suite drives this page in a headless Chromium (`tests/test_serving_browser.py`): it
# types a prompt, clicks, and checks the streamed text is the model's greedy continuation.

# %%
# %%writefile {APPS}/demo_page.py
"""A Gradio page that streams from the course server's ``POST /generate`` (notebook 10 writes this file)."""

import json
import os
from collections.abc import Iterator

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import gradio as gr  # noqa: E402
import httpx  # noqa: E402

from course_utils import config  # noqa: E402
from course_utils.serving.server.sse import ERROR, TOKEN, SSEParser  # noqa: E402

TITLE = "TinyGPT, served with request batching and token streaming"


def stream_generate(base_url: str, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0,
                    timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the text generated so far after each streamed token; a failure becomes an ``[error ...]`` line."""
    body = {"prompt": prompt, "max_new_tokens": int(max_new_tokens), "temperature": float(temperature)}
    text, parser = "", SSEParser()

    def failed(line: str) -> str:
        return f"{text}\n{line}" if text else line

    try:  # trust_env=False: the server is on this machine, never behind a proxy
        with httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False) as client:
            with client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    yield f"[error {resp.status_code}] {detail_of(resp.read().decode(errors='replace'))}"
                    return
                for chunk in resp.iter_bytes():
                    for kind, value in parser.feed_bytes(chunk):
                        if kind == TOKEN:
                            text += value
                            yield text
                        elif kind == ERROR:
                            yield failed(f"[error] {value.get('detail', value) if isinstance(value, dict) else value}")
                            return
                        else:  # the end event
                            return
                parser.finish()
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:  # unreachable server, cut or bad stream
        yield failed(f"[error] {type(err).__name__}: {err}")
        return
    yield failed("[error] the stream ended without an end event")


def detail_of(body: str) -> str:
    """Return the ``detail`` of an error answer (or the start of the body), at most 300 characters."""
    try:
        detail = json.loads(body).get("detail", body)
    except (ValueError, AttributeError):
        return body[:300]
    return (detail if isinstance(detail, str) else json.dumps(detail))[:300]


def build_demo(base_url: str) -> gr.Blocks:
    """Return the page: prompt box, length slider, button, and the streamed output."""
    base_url = base_url.rstrip("/")

    def generate(prompt: str, max_new_tokens: float) -> Iterator[str]:
        yield from stream_generate(base_url, prompt, int(max_new_tokens))

    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"### {TITLE}\nThe server at `{base_url}` decodes greedily; text appears as it streams.")
        prompt = gr.Textbox(label="Prompt", value="The Python interpreter ", elem_id="prompt")
        max_new = gr.Slider(1, 128, value=64, step=1, label="New tokens", elem_id="max-new-tokens")
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        output = gr.Textbox(label="Generated text", lines=6, elem_id="output")
        button.click(generate, inputs=[prompt, max_new], outputs=output)
        prompt.submit(generate, inputs=[prompt, max_new], outputs=output)
    return demo


def launch_demo(base_url: str, port: int | None = None) -> tuple[gr.Blocks, str]:
    """Start the page on 127.0.0.1 in the background (no share link); return ``(demo, url)``. Stop: ``demo.close()``."""
    demo = build_demo(base_url)
    # Gradio checks its own page with a client that reads HTTP_PROXY: skip the proxy for loopback meanwhile.
    skip = {name: ",".join(filter(None, [os.environ.get(name), "localhost,127.0.0.1,::1"]))
            for name in ("NO_PROXY", "no_proxy")}
    with config.environment(**skip):
        demo.launch(server_name="127.0.0.1", server_port=port, share=False, prevent_thread_lock=True,
                    inbrowser=False, quiet=True, show_error=True, ssr_mode=False, inline=False)
    return demo, demo.local_url


# %%
import demo_page  # noqa: E402  (the file the cell above wrote; APPS is on sys.path)

demo_page = importlib.reload(demo_page)  # so an edited file takes effect when you run this again
with serve_in_subprocess({"batching": "iteration", "embed": False}) as server:
    demo, demo_url = demo_page.launch_demo(server.url)
    try:
        partial = list(demo_page.stream_generate(server.url, "The Python ", max_new_tokens=24))
        print(f"demo page at {demo_url} (HTTP {httpx.get(demo_url, timeout=30, trust_env=False).status_code})")
    finally:
        demo.close()
print(f"what the page shows: {len(partial)} updates for 24 new tokens, each one character longer than the last:")
for text in partial[:3]:
    print("  ", repr(text))
print("   ...")
print("  ", repr(partial[-1]))
check_greedy(partial[-1], "The Python ", 24, what="the streaming client")
# /generate sends one event per token and stream_generate yields once per token event, on any machine
assert [len(text) for text in partial] == list(range(1, 25))

# %% [markdown]
# ## Any client: the OpenAI-compatible API
#
# `/generate` speaks the course's own event format, so only the course's clients can use it. Most
# tools that call a language model (SDKs in every language, chat front ends, evaluation harnesses,
# agent frameworks) speak one de-facto standard instead: the HTTP API of OpenAI, with
# `/v1/models`, `/v1/completions` and `/v1/chat/completions`, streamed as `data: {json}` chunks that
# end with `data: [DONE]`. vLLM, LitServe's OpenAI spec and most other engines offer it, so a client
# written against it can switch servers by changing one URL. The course's server serves it too
# (`course_utils/serving/extras/openai_api.py`), on the same engine, queue and batches as `/generate`.
#
# Two honest limits: a token is one character here (so `usage` counts characters), and TinyGPT is a
# plain text model, not a chat model. A chat becomes one transcript (`User: ...` lines, then
# `Assistant:`) and the "answer" is the model's continuation of it. What this server cannot do
# (`n > 1`, `logprobs`, tools, ...) is refused with the API's error shape and a message, so the
# official client raises its usual exceptions. Below: the official `openai` package, pointed at our
# server on 127.0.0.1 (it insists on an API key; this server checks none).
#
# The streamed completion can come in fewer chunks than it has tokens (the cell prints how many here). The demo page above grew one
# character per update because `/generate` sends one event per token. The engine hands tokens to the
# event loop at most every `stream_interval_ms` (10 ms by default; a request's first and last tokens go
# at once), and the OpenAI stream (`_texts` in `openai_api.py`) puts every token of the request that has
# arrived into one chunk, then closes with a chunk that has no text, only the finish reason. So chunk
# sizes follow the step time: short steps put several tokens into each 10 ms hand-over, steps of 10 ms
# or more (a slow or busy machine) send every token alone, and an event loop that falls behind merges
# more; the number of chunks
# changes from run to run, and the cell prints it and the size of each chunk.

# %%
import openai  # noqa: E402

from course_utils.serving.server.runner import ThreadedServer  # noqa: E402
from course_utils.serving.server.settings import ServeSettings  # noqa: E402

OAI_PROMPT, OAI_TOKENS = "The Python ", 24
with ThreadedServer(ServeSettings(embed=False, threads=default_threads()), model=model, tokenizer=tok) as server, \
        openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
    served_models = [m.id for m in client.models.list()]
    completion = client.completions.create(model="tiny-gpt", prompt=OAI_PROMPT, max_tokens=OAI_TOKENS,
                                           temperature=0)
    chat = client.chat.completions.create(
        model="tiny-gpt", max_tokens=OAI_TOKENS, temperature=0,
        messages=[{"role": "system", "content": "You answer questions about Python."},
                  {"role": "user", "content": "What does the import statement do?"}])
    chunks = [chunk.choices[0] for chunk in client.completions.create(
        model="tiny-gpt", prompt=OAI_PROMPT, max_tokens=OAI_TOKENS, temperature=0, stream=True)]
    try:  # a request this server cannot serve: the client raises, with the server's reason
        client.completions.create(model="tiny-gpt", prompt=OAI_PROMPT, n=2)
        refusal = "no error"
    except openai.BadRequestError as err:
        refusal = f"{type(err).__name__} ({err.status_code}), param {err.body['param']!r}: {err.body['message']}"

text = completion.choices[0].text
pieces = [c.text for c in chunks]
print(f"models: {served_models}")
print(f"completion ({completion.usage.completion_tokens} tokens, {completion.choices[0].finish_reason}): {text!r}")
chat_text = chat.choices[0].message.content
print(f"chat, as {chat.choices[0].message.role} ({chat.usage.completion_tokens} tokens): {chat_text!r} (the model's "
      "continuation of the transcript" + (": here only blank lines and spaces, which is what this model wrote, "
                                          "not a failed call)" if not chat_text.strip() else ")"))
print(f"streamed in {len(pieces)} chunks: {''.join(pieces)!r}")
print(f"  {len(pieces) - 1} chunks of text, of {[len(p) for p in pieces[:-1]]} characters, then one with no "
      f"text and the finish reason {chunks[-1].finish_reason!r}")
print(f"refused: {refusal}")
client_ok = int(completion.usage.completion_tokens == len(text) == OAI_TOKENS
                and chat.usage.completion_tokens == len(chat.choices[0].message.content) == OAI_TOKENS
                and "".join(pieces) == text)
print(f"client_ok = {client_ok}")
assert client_ok == 1
check_greedy(text, OAI_PROMPT, OAI_TOKENS, what="the OpenAI-style endpoint")  # the model's own greedy text
assert refusal.startswith("BadRequestError (400)")
# every chunk but the last carries text and no finish reason; the last carries only the finish reason
assert all(c.text and c.finish_reason is None for c in chunks[:-1])
assert chunks[-1].text == "" and chunks[-1].finish_reason == "length"
bench.record("serve.openai.client_ok", client_ok, "flag", client=f"openai {openai.__version__}",
             new_tokens=OAI_TOKENS, calls="models, completion, chat, streamed completion");

# %% [markdown]
# ## Pitfalls and their fixes
#
# | Pitfall | What you see | Fix |
# |---|---|---|
# | model called inside `async def` | health checks and every other request stall (step 3) | model in its own worker thread; the loop only awaits |
# | touching asyncio objects from the worker thread | rare crashes, lost wake-ups | `loop.call_soon_threadsafe(...)` (step 4) |
# | too many torch threads on a small machine | a busy server can get *slower* (`python tools/busy_threads.py` measures it on your machine) | one thread per worker on a few cores (`default_threads()`) |
# | unbounded queue | latency grows without limit under overload | bounded queue, 503 with `Retry-After`, a queue timeout |
# | compile on the first request | the first users wait for the compile, or time out | compile and warm up before reporting healthy |
# | `share=True` or `0.0.0.0` in a demo | the model is reachable from outside | bind 127.0.0.1; put a real server behind a proxy for the world |
# | one slow request holds a static batch | every request in the batch waits for the longest | iteration-level batching with a KV cache |
#
# ## Production engines
#
# What we built is the core of every serving engine; the real ones add much more. Checked against
# their documentation when this notebook was written:
#
# - **vLLM** serves large language models on GPUs (and CPUs): continuous batching, *PagedAttention*
#   (the KV cache stored in fixed-size blocks, like virtual-memory pages, so sequences of any length
#   pack without waste), prefix caching, speculative decoding, and an OpenAI-compatible HTTP server.
#   Use it for LLMs instead of writing your own engine.
# - **LitServe** (Lightning AI; the course needs 0.2.19 or newer) is a thin, general layer on FastAPI and
#   uvicorn: the `LitAPI` hooks, batching, streaming, and worker processes per device, as measured above.
# - **Ray Serve** scales Python deployments over a cluster; its `@serve.batch` decorator batches calls
#   to an `async` method (`max_batch_size`, `batch_wait_timeout_s`), and a deployment can run vLLM.
# - **NVIDIA Triton Inference Server** serves models from many frameworks (PyTorch, ONNX, TensorRT,
#   Python backends) over HTTP and gRPC, with dynamic batching configured per model
#   (`dynamic_batching { max_queue_delay_microseconds: ... }`).
# - **TorchServe** is in *limited maintenance*: its documentation states there are no planned
#   updates, bug fixes or security patches; its last release was 0.12.0 (September 2024) and its
#   repository was archived in August 2025. Do not start new projects on it.
#
# Whatever the engine, the questions of this notebook stay the same: how are requests batched, how
# long does the first token take, what does the 99th percentile look like at the load you expect,
# and what happens when the load is more than that.
#
# ## Check yourself
#
# **Exercise 1.** Latency targets are stated as percentiles: "99 % of requests finish within X ms".
# Write `p99(latencies_ms)` with the *nearest-rank* rule: sort the values, and take the one at
# 1-based rank `ceil(0.99 * n)`.

# %%


def p99(latencies_ms: list[float]) -> float:
    # Your code here.
    return 0.0


exercises.check("10.p99", p99)


# %% [markdown]
# **Exercise 2.** Write `parse_sse(stream)` for the event format of this notebook: return the
# generated text (the `token` fields of the data events, joined) and the data of the `event: end`
# event as a dict, or `None` when the stream has no end event (a stream cut off halfway). Careful:
# a token may itself be a space, a newline, or text that looks like `data:`.

# %%
def parse_sse(stream: str) -> tuple[str, dict | None]:
    # Your code here.
    return "", None


exercises.check("10.parse_sse", parse_sse)


# %% [markdown]
# **Exercise 3.** A bigger batch usually means more tokens per second in total, but every client waits
# one whole decoding step for its next token. Given the bare model's tokens per second at several
# batch sizes, write `choose_batch_size(tokens_per_s, budget_ms)`: the largest batch size whose
# step time (`b` tokens at `tokens_per_s[b]`) is under `budget_ms`, or `None`. Then the next cell
# applies it to this machine. Stuck? `print(exercises.solution_source("10.batch_size"))` shows a
# reference solution.
# Every check is saved: `print(exercises.progress_report())` lists what you have passed so far.

# %%
def choose_batch_size(tokens_per_s: dict[int, float], budget_ms: float) -> int | None:
    # Your code here.
    return None


exercises.check("10.batch_size", choose_batch_size)

# %%
if exercises.check("10.batch_size", choose_batch_size):
    rates = {b: bare_decode_tokens_per_s(model, b, new_tokens=16, repeats=1, threads=default_threads())
             for b in (1, 4, 16, 64)}
    print({b: f"{r:,.0f} tok/s, {1e3 * b / r:.1f} ms/step" for b, r in rates.items()})
    print("largest batch with a 20 ms step on this machine:", choose_batch_size(rates, 20.0))
else:
    print("solve Exercise 3 to see the batch size that fits a 20 ms step on this machine")

# %% [markdown]
# ## Summary
#
# - A Gradio page is the quickest way to show a model; bind it to 127.0.0.1 and leave `share` off.
#   It is not a serving system.
# - FastAPI with pydantic limits gives a validated API. Never run the model inside `async def`:
#   it blocks the event loop. Run it in a worker thread and hand results back with
#   `call_soon_threadsafe`.
# - Batching concurrent requests lets one decoding step serve them all (what that bought on this
#   machine is the cells' verdict); streaming with SSE shows the user the first token after the first step
#   of its batch instead of after the whole answer. Measure both, plus the p99 latency, under the load you expect,
#   with streams validated (`run_load`).
# - Iteration-level batching with a KV cache lets requests join and leave the running batch at every
#   step; the results recorded here are `serve.batched_vs_unbatched.c32`, `serve.efficiency.c32`,
#   `serve.vs_litserve.c32`, `serve.load.lost`, `serve.p99_ms.c32`, `serve.ttft_p50_ms.c32` and
#   `serve.openai.client_ok` (the official `openai` client against the course's server).
# - A server's gap to the bare model is per-step and per-token work around the model: partial
#   batches, prompt tokens in the steps, a worker that waits for the GIL and for a core (shared with the
#   event loop and, on a busy machine, with other programs), and time with no request in the engine while
#   clients come back (the idle share). `course_utils.serving.extras.breakdown` measures each; a separate engine process removes the GIL wait
#   where there are cores to spare; whether that shows as tokens/s depends on the sending side keeping the batch
#   full (on this machine, the cells' verdicts).
# - A breakdown points; a run that changes as little as possible tests the pointer. Here a longer
#   `stream_interval_ms` sent the same tokens in fewer chunks (it also spares the engine some pipe
#   messages and can delay a token by up to the interval); the cell's last line says whether this
#   machine's runs backed the pointer, did not back it (less sending work, no fuller batch), were
#   too spread to tell, or tested it only weakly or not at all (when the sending side's CPU per
#   token fell too little to tell, or did not fall).
# - `torch.compile` in a server must be paid before traffic arrives (compile during start-up), and
#   the compiled region must be free of graph breaks and side effects; then measure whether it pays
#   (above: the compiled-server cell).
#
# ## Further reading
#
# - [FastAPI: concurrency and `async` / `await`](https://fastapi.tiangolo.com/async/) and
#   [lifespan events](https://fastapi.tiangolo.com/advanced/events/)
# - [Server-sent events (WHATWG HTML standard)](https://html.spec.whatwg.org/multipage/server-sent-events.html)
# - [Gradio: sharing your app](https://www.gradio.app/guides/sharing-your-app)
# - [LitServe documentation](https://lightning.ai/docs/litserve)
# - [vLLM documentation](https://docs.vllm.ai/) ·
#   [Ray Serve dynamic request batching](https://docs.ray.io/en/latest/serve/advanced-guides/dyn-req-batch.html) ·
#   [Triton Inference Server](https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/) ·
#   [TorchServe (limited maintenance)](https://pytorch.org/serve/)
# - [`torch.compile` tutorial](https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html)
