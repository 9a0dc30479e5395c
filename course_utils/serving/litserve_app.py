"""The course's TinyGPT served by LitServe, with LitServe's own batching and streaming.

Run it as its own process, bound to loopback::

    python -m course_utils.serving.litserve_app --port 8001 --max-batch-size 32 --batch-timeout 0.005

LitServe (0.2.x) builds a FastAPI app served by uvicorn and runs the model in a separate worker
process. With ``max_batch_size > 1`` it collects up to that many requests, waiting at most
``batch_timeout`` seconds for the batch to fill, then calls ``predict`` once for the batch; with
``stream=True`` ``predict`` is a generator and every value it yields goes to the clients at once.
This is *static* batching: a request that arrives while a batch decodes waits for the next one.

The route is ``POST /predict`` with the same JSON body as our server's ``/generate``
(``{"prompt": str, "max_new_tokens": int, "temperature": 0.0}``; greedy decoding only), and the
stream carries the same server-sent events: ``data: {"token": ..., "index": i}`` per token, then
``event: end`` with ``{"reason": "length", "tokens": n}``. So the course's load generator and its
stream checks drive both servers unchanged. (LitServe sends the chunks with its default media
type rather than ``text/event-stream``; the bytes are the same.) ``GET /health`` answers ``ok``
once the worker has loaded the model.
"""

import argparse
import functools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import litserve as ls
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..models.gpt import TinyGPT, greedy_steps, pad_prompts
from .settings import default_threads

#: LitServe's route; ours is /generate.
ROUTE = "/predict"
#: The same request limits as our server's defaults (``ServeSettings``).
MAX_PROMPT_CHARS = 256
MAX_NEW_TOKENS = 256


def load_model(path: str | None = None) -> tuple[torch.nn.Module, Any]:
    """Return ``(model, tokenizer)``: the course's TinyGPT checkpoint, in eval mode.

    ``path`` defaults to ``$COURSE_SERVE_MODEL`` and then to the shipped ``data/tiny_gpt.pt``.
    """
    from .checkpoint import load_tiny_gpt

    model, tok = load_tiny_gpt(path or os.environ.get("COURSE_SERVE_MODEL") or None)
    return model.eval(), tok


def greedy_rows(model: TinyGPT, prompts: Sequence[Sequence[int]],
                max_new_tokens: Sequence[int]) -> Iterator[list[int | None]]:
    """Yield, step by step, one new greedy token id per row (``None`` once a row has all its tokens).

    A static batch over the model's key-value cache (``greedy_steps``, the same kernels our
    server's engine uses): it runs until its longest request is done.
    """
    idx, lengths = pad_prompts(prompts)
    for step, nxt in enumerate(greedy_steps(model, idx, lengths, max(max_new_tokens))):
        yield [t if step < n else None for t, n in zip(nxt.tolist(), max_new_tokens)]


def sse(data: dict[str, Any], event: str | None = None) -> str:
    """Return one server-sent event as text (``event:`` line only when given)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


@functools.cache
def _vocabulary() -> frozenset[str]:
    return frozenset(load_model()[1].chars)


class GenerateRequest(BaseModel):
    """The body of ``POST /predict``: the same fields and limits as our server's ``/generate``.

    FastAPI validates it in LitServe's HTTP process, so a bad request gets a 422 there and never
    reaches (or fails) a batch in the model worker. Unknown fields are rejected, as on our server.
    """

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    max_new_tokens: int = Field(64, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(0.0, ge=0.0, le=0.0, description="greedy decoding only")

    @field_validator("prompt")
    @classmethod
    def _known_characters(cls, prompt: str) -> str:
        unknown = sorted(set(prompt) - _vocabulary())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {', '.join(map(repr, unknown[:10]))}")
        return prompt


class TinyGPTLitAPI(ls.LitAPI):
    """LitServe API: decode a batch of prompts greedily, streaming each step's tokens."""

    def setup(self, device: str) -> None:
        # Same thread count as our server's model worker (one on a small machine).
        torch.set_num_threads(int(os.environ.get("COURSE_SERVE_THREADS") or default_threads()))
        self.model, self.tok = load_model()

    def decode_request(self, request: GenerateRequest) -> tuple[list[int], int]:
        return self.tok.encode(request.prompt), request.max_new_tokens

    def batch(self, inputs: list[tuple[list[int], int]]) -> list[tuple[list[int], int]]:
        return list(inputs)

    def predict(self, batch: list[tuple[list[int], int]]) -> Iterator[list[str]]:
        prompts = [ids for ids, _ in batch]
        limits = [n for _, n in batch]
        with torch.inference_mode():
            for step, tokens in enumerate(greedy_rows(self.model, prompts, limits)):
                chunks = []
                for row, tok_id in enumerate(tokens):
                    if tok_id is None:
                        chunks.append("")
                        continue
                    chunk = sse({"token": self.tok.decode([tok_id]), "index": step})
                    if step + 1 == limits[row]:
                        chunk += sse({"reason": "length", "tokens": limits[row]}, event="end")
                    chunks.append(chunk)
                yield chunks

    def unbatch(self, output: Iterator[list[str]]) -> Iterator[list[str]]:
        yield from output

    def encode_response(self, output):  # no annotations: LitServe reads them as the response type
        yield from output


def build_server(max_batch_size: int = 32, batch_timeout: float = 0.005) -> Any:
    """Return a ``litserve.LitServer`` for TinyGPT on the CPU, batching and streaming."""
    api = TinyGPTLitAPI(max_batch_size=max_batch_size, batch_timeout=batch_timeout, stream=True,
                        api_path=ROUTE)
    return ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=60)


def command(port: int, max_batch_size: int = 32, batch_timeout: float = 0.005,
            model: str | None = None, threads: int | None = None) -> list[str]:
    """Return the command line that starts this app on 127.0.0.1:``port`` (for ``ServerProcess``)."""
    import sys

    cmd = [sys.executable, "-m", "course_utils.serving.litserve_app", "--port", str(port),
           "--max-batch-size", str(max_batch_size), "--batch-timeout", str(batch_timeout)]
    if model:
        cmd += ["--model", str(model)]
    if threads:
        cmd += ["--threads", str(threads)]
    return cmd


def litserve_process(max_batch_size: int = 32, batch_timeout: float = 0.005, model: str | None = None,
                     threads: int | None = None, startup_timeout_s: float = 90.0) -> Any:
    """Return a ``ServerProcess`` (use it with ``with``) running this app on a free loopback port."""
    from .process import ServerProcess
    from .server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    return ServerProcess(command(port, max_batch_size, batch_timeout, model, threads), f"{url}/health",
                         startup_timeout_s=startup_timeout_s, env=env, url=url, cwd=root)



def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the server until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-timeout", type=float, default=0.005, help="seconds")
    parser.add_argument("--model", default=None, help="checkpoint path (default: data/tiny_gpt.pt)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the model worker")
    args = parser.parse_args(argv)
    # LitServe runs the model in a spawned worker process: hand it these through the environment.
    if args.model:
        os.environ["COURSE_SERVE_MODEL"] = args.model
    if args.threads:
        os.environ["COURSE_SERVE_THREADS"] = str(args.threads)
    server = build_server(args.max_batch_size, args.batch_timeout)
    server.run(host=args.host, port=args.port, num_api_servers=1, log_level="warning",
               generate_client_file=False)


if __name__ == "__main__":
    main()
