"""The course's TinyGPT served by LitServe, with LitServe's own batching and streaming.

Run it as its own process, bound to loopback::

    python -m course_utils.serving.extras.litserve_app --port 8001 --max-batch-size 32 --batch-timeout 0.005

LitServe (0.2.x) builds a FastAPI app served by uvicorn and runs the model in a separate worker
process. With ``max_batch_size > 1`` it collects up to that many requests, waiting at most
``batch_timeout`` seconds for the batch to fill, then calls ``predict`` once for the batch; with
``stream=True`` ``predict`` is a generator and every value it yields goes to the clients at once.
This is *static* batching: a request that arrives while a batch decodes waits for the next one.

The route is ``POST /predict`` with the same JSON body as our server's ``/generate``
(``{"prompt": str, "max_new_tokens": int, "temperature": 0.0, "seed": null}``), and the stream
carries the same server-sent events: ``data: {"token": ..., "index": i}`` per token, then
``event: end`` with ``{"reason": "length", "tokens": n}``. So the course's load generator and its
stream checks drive both servers unchanged. (LitServe sends the chunks with its default media
type rather than ``text/event-stream``; the bytes are the same.) ``GET /health`` answers ``ok``
once the worker has loaded the model.

The HTTP front has our server's guards, from the same code and the same ``ServeSettings``:
the request model of ``/generate`` (``app.generate_request_model``: prompt length and vocabulary,
``max_new_tokens``, ``temperature`` 0 or in [0.01, 2], ``seed``, no NaN or Infinity, no unknown
fields), its 422 answer that names the field and the rule but never echoes the value
(``app.validation_error``; LitServe's FastAPI default echoes it, and answers 500 when the value
is NaN or a lone surrogate), the body cap (``guards.BodyLimit``: 413 over ``max_body_bytes``)
and the ``Host`` check (``guards.HostCheck``: 400 unless loopback or an allowed name). All of it
runs in LitServe's HTTP process, before a request reaches (or can fail) a batch in the worker.
"""

import argparse
import os
from collections.abc import Iterator, Sequence
from typing import Any

import litserve as ls
import torch
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from ... import config
from ...data.text import CharTokenizer
from ...models.gpt import TinyGPT
from ..core import EngineCore
from ..core import Sequence as Row
from ..core import sampling_generator as row_generator
from ..server.app import generate_request_model, validation_error
from ..server.engine import check_limits
from ..server.guards import BodyLimit, HostCheck
from ..server.runner import http_protocol
from ..server.settings import ServeSettings, default_threads
from ..server.sse import END, format_event, token_event

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
    from ...models.checkpoint import load_tiny_gpt

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
    # last, so it runs first, as on our server.
    guards = [(BodyLimit, {"max_bytes": settings.max_body_bytes}), (HostCheck, {"allowed": settings.allow_hosts})]
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=60,
                          middlewares=guards)
    server.app.add_exception_handler(RequestValidationError, validation_error)
    return server


def command(port: int, max_batch_size: int = MAX_BATCH_SIZE, batch_timeout: float = BATCH_TIMEOUT_S,
            model: str | None = None, threads: int | None = None) -> list[str]:
    """Return the command line that starts this app on 127.0.0.1:``port`` (for ``ServerProcess``)."""
    import sys

    cmd = [sys.executable, "-m", "course_utils.serving.extras.litserve_app", "--port", str(port),
           "--max-batch-size", str(max_batch_size), "--batch-timeout", str(batch_timeout)]
    if model:
        cmd += ["--model", str(model)]
    if threads:
        cmd += ["--threads", str(threads)]
    return cmd


def litserve_process(max_batch_size: int = MAX_BATCH_SIZE, batch_timeout: float = BATCH_TIMEOUT_S, model: str | None = None,
                     threads: int | None = None, startup_timeout_s: float = 90.0) -> Any:
    """Return a ``ServerProcess`` (use it with ``with``) running this app on a free loopback port."""
    from ..server.process import ServerProcess
    from ..server.runner import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"PYTHONPATH": config.child_pythonpath(), "PYTHONUNBUFFERED": "1"}
    return ServerProcess(command(port, max_batch_size, batch_timeout, model, threads), f"{url}/health",
                         startup_timeout_s=startup_timeout_s, env=env, url=url, cwd=config.REPO_ROOT)


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
    server = build_server(args.max_batch_size, args.batch_timeout, settings)
    # uvicorn's limits as on our server (LitServe hands these keywords to uvicorn.Config).
    server.run(host=args.host, port=args.port, num_api_servers=1, log_level="warning",
               generate_client_file=False, limit_concurrency=settings.limit_concurrency,
               timeout_keep_alive=settings.keep_alive_s, h11_max_incomplete_event_size=settings.max_header_bytes,
               http=http_protocol(settings))  # request-head time and size limits (408, 431)


if __name__ == "__main__":
    main()
