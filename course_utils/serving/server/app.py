"""The FastAPI application: routes, request models, and a lifespan that runs the workers.

API (all JSON unless said otherwise):

- ``POST /generate`` ``{"prompt", "max_new_tokens"=64, "temperature"=0.0, "seed"=null}`` →
  ``text/event-stream``: one ``data: {"token": "<text>", "index": i}`` event per token, then
  ``event: end`` with ``{"reason": "length", "tokens", "ttft_ms", "latency_ms"}``. A failure
  after the stream started (shutdown, an error in the model) ends it with ``event: error``
  ``{"detail", "status"}``. ``temperature`` is 0 (greedy) or in [0.01, 2]; ``seed`` in [0, 2**63).
  Before the stream starts: 422 bad input or malformed JSON; 503 + ``Retry-After`` when the
  queue is full or the server is stopping; 504 when no batch slot freed up within
  ``queue_timeout_s`` (the request is dropped from the queue); 500 when generating failed.
- ``POST /embed`` ``{"texts": [...]}`` (1..64 texts of 1..1000 characters) →
  ``{"model": "all-MiniLM-L6-v2", "embeddings": [[384 floats], ...]}``; 404 when disabled;
  503 + ``Retry-After`` when ``embed_queue_texts`` texts already wait, or when the embedding
  worker is stopping or died (the detail says why); 504 after ``queue_timeout_s``.
- ``GET /health`` → ``{"status": "ok", ...}``; 503 with ``"stopping"`` during shutdown, or with
  ``"error"`` and a ``"reason"`` when a worker thread died and the server cannot serve. The answer
  carries this server's token in the ``X-Course-Instance`` header (see ``instance``), so the process
  that started it can tell its own server from another one on the same port.
- ``GET /metrics`` → Prometheus text format.
- ``/v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``: the OpenAI-compatible
  API on the same engine, for any OpenAI client (see ``openai_api``; its errors use the OpenAI
  shape ``{"error": {...}}`` and 400 for bad input).

Every other error answer is JSON ``{"detail": ...}``. A 422 lists, per problem, the field (``loc``),
the rule (``msg``) and its ``type``, never the value sent (it may be huge or not printable).
Bodies over ``max_body_bytes`` get 413, bodies not whole within ``body_timeout_s`` 408; a client
address with ``max_requests_per_client`` requests in flight gets 429 + ``Retry-After`` (and one with
``max_connections_per_client`` connections open gets 503 as it connects, see ``http_head``); a
``Host`` header that does not name loopback (or an ``allow_hosts`` name) gets 400 (see ``guards``).
"""


import asyncio
import queue
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from ...data.text import CharTokenizer
from ...models.gpt import TinyGPT
from .embed import MODEL_NAME, EmbedError, EmbedUnavailable, EmbedWorker
from .engine import MAX_TEMPERATURE, MIN_TEMPERATURE, GenerationEngine, GenRequest, QueueFull, ShuttingDown
from ..extras.engine_process import EngineProcess, merged_metrics
from .guards import BodyLimit, ClientShare, HostCheck
from .instance import INSTANCE_HEADER, instance_token
from .metrics import ServingMetrics
from ..extras.openai_api import openai_router
from .settings import MAX_SEED, MAX_TEXTS_PER_REQUEST, RETRY_AFTER_S, ServeSettings
from .sse import format_event, token_event

MAX_ERRORS_SHOWN = 20


def generate_request_model(settings: ServeSettings, tokenizer: CharTokenizer) -> type[BaseModel]:
    """Return the pydantic model of a ``/generate`` body, with this server's limits."""
    default_new = min(64, settings.max_new_tokens_limit)

    class GenerateRequest(BaseModel):
        """Body of ``POST /generate``."""

        model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
        prompt: str = Field(min_length=1, max_length=settings.max_prompt_chars)
        max_new_tokens: int = Field(default_new, ge=1, le=settings.max_new_tokens_limit, strict=True)
        temperature: float = Field(0.0, ge=0.0, le=MAX_TEMPERATURE)
        seed: int | None = Field(None, ge=0, le=MAX_SEED, strict=True)

        @field_validator("prompt")
        @classmethod
        def _known_characters(cls, value: str) -> str:
            tokenizer.encode(value)  # ValueError naming the unknown characters → 422
            return value

        @field_validator("temperature")
        @classmethod
        def _greedy_or_in_range(cls, value: float) -> float:
            if 0 < value < MIN_TEMPERATURE:  # dividing by a tiny temperature overflows the logits
                raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} "
                                 f"and {MAX_TEMPERATURE}")
            return value

    return GenerateRequest


# (pydantic rejects a lone surrogate, which JSON's "\ud800" can carry, in a constrained string)
EmbedText = Annotated[str, StringConstraints(min_length=1, max_length=1000)]


class EmbedRequest(BaseModel):
    """Body of ``POST /embed``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    texts: list[EmbedText] = Field(min_length=1, max_length=MAX_TEXTS_PER_REQUEST)


def _printable(part: object, limit: int = 200) -> str | int:
    """Return ``part`` as an int or a short string that any JSON encoder can write."""
    if isinstance(part, int):
        return part
    return str(part)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """Return the 422 for a request that failed validation: field, rule and type of each problem,
    never the value sent (FastAPI's default echoes it, and cannot encode NaN or lone surrogates)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = []
    for err in errors[:MAX_ERRORS_SHOWN]:
        msg = str(err.get("msg", ""))
        if err.get("type") == "json_invalid" and isinstance(err.get("ctx", {}).get("error"), str):
            msg += f": {err['ctx']['error']}"
        detail.append({"loc": [_printable(p) for p in err.get("loc", ())], "msg": _printable(msg),
                       "type": _printable(err.get("type", ""))})
    body: dict[str, Any] = {"detail": detail}
    if len(errors) > MAX_ERRORS_SHOWN:
        body["more_errors"] = len(errors) - MAX_ERRORS_SHOWN
    return JSONResponse(body, status_code=422)


def _unavailable(detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": RETRY_AFTER_S})


def create_app(settings: ServeSettings | None = None, *, model: TinyGPT | None = None,
               tokenizer: CharTokenizer | None = None, mini: object | None = None,
               instance: str | None = None) -> FastAPI:
    """Return the server application. ``model``/``tokenizer`` default to the shipped checkpoint
    (``settings.model`` overrides the path); ``mini`` to ``load_minilm()`` when ``settings.embed``;
    ``instance`` (the token ``/health`` sends back) to ``$COURSE_SERVER_INSTANCE``, else a random one."""
    settings = settings or ServeSettings()
    instance = instance or instance_token()
    if model is None or tokenizer is None:
        from ...models.checkpoint import load_tiny_gpt

        model, tokenizer = load_tiny_gpt(settings.model)
    metrics = ServingMetrics()
    # the worker as a thread of this process, or (engine_process) in a child process of its own
    engine: GenerationEngine | EngineProcess = (
        EngineProcess if settings.engine_process else GenerationEngine)(model, settings, metrics)
    GenerateRequest = generate_request_model(settings, tokenizer)
    state: dict[str, Any] = {"status": "starting", "embedder": None}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(engine.warm_up)  # compile (if asked) before reporting healthy
        engine.start(asyncio.get_running_loop())
        if settings.embed:
            encoder = mini
            if encoder is None:
                from ...models.minilm import load_minilm

                encoder = await asyncio.to_thread(load_minilm)
            state["embedder"] = EmbedWorker(encoder, settings, metrics)
            state["embedder"].start()
        state["status"] = "ok"
        try:
            yield
        finally:
            state["status"] = "stopping"
            engine.begin_shutdown()
            await asyncio.to_thread(engine.stop)
            if state["embedder"] is not None:
                await asyncio.to_thread(state["embedder"].stop)

    app = FastAPI(title="course_utils model server", lifespan=lifespan,
                  summary="Tiny GPT with batched, streamed generation; MiniLM embeddings")
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(HostCheck, allowed=settings.allow_hosts)
    app.add_middleware(ClientShare, max_requests=settings.max_requests_per_client,  # added last: runs first
                       retry_after=RETRY_AFTER_S)
    app.state.engine = engine
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.serving = state
    app.include_router(openai_router(engine, tokenizer, settings))

    def begin_shutdown() -> None:
        state["status"] = "stopping"
        engine.begin_shutdown()

    app.state.begin_shutdown = begin_shutdown

    async def stream(req: GenRequest, first: tuple[str, Any]) -> AsyncIterator[str]:
        index = 0
        item = first
        try:
            while True:
                parts = []
                done = False
                while True:  # send everything already waiting in one chunk
                    kind, value = item
                    if kind == "token":
                        parts.append(token_event(tokenizer.chars[value], index))
                        index += 1
                    else:
                        parts.append(format_event(value, kind))
                        done = True
                        break
                    if req.events.empty():
                        break
                    item = req.events.get_nowait()
                yield "".join(parts)
                if done:
                    return
                item = await req.events.get()
        finally:
            req.cancel()  # a client that went away frees its batch row at the next step

    @app.post("/generate", response_model=None)
    async def generate(body: GenerateRequest) -> Response:  # type: ignore[valid-type]
        try:
            req = engine.submit(tokenizer.encode(body.prompt), body.max_new_tokens,
                                body.temperature, body.seed)
        except (QueueFull, ShuttingDown) as err:
            return _unavailable(str(err))
        try:
            first = await asyncio.wait_for(req.events.get(), timeout=settings.queue_timeout_s)
        except TimeoutError:  # two classes on Python 3.10, one from 3.11
            req.cancel()
            return JSONResponse({"detail": f"timed out: no batch slot within {settings.queue_timeout_s} s"},
                                status_code=504)
        except BaseException:
            req.cancel()
            raise
        if first[0] == "error":
            if first[1].get("status") == 500:
                return JSONResponse({"detail": first[1]["detail"]}, status_code=500)
            return _unavailable(first[1]["detail"])
        return StreamingResponse(stream(req, first), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/embed", response_model=None)
    async def embed(body: EmbedRequest) -> Response | dict[str, Any]:
        embedder = state["embedder"]
        if embedder is None:
            return JSONResponse({"detail": "embeddings are disabled on this server (--no-embed)"},
                                status_code=404)
        if state["status"] != "ok":
            return _unavailable("server shutting down")
        try:
            job = embedder.submit(body.texts)
        except queue.Full:
            metrics.embed_requests.labels("rejected").inc()
            return _unavailable(f"the embedding queue is full ({embedder.queued_texts} texts waiting)")
        except EmbedUnavailable as err:  # the worker died (its reason) or is stopping
            return _unavailable(str(err))
        try:
            vectors = await asyncio.wait_for(job.future, timeout=settings.queue_timeout_s)
        except TimeoutError:  # two classes on Python 3.10, one from 3.11
            job.cancel()  # the worker skips it instead of computing it for nobody
            return JSONResponse({"detail": f"timed out after {settings.queue_timeout_s} s"}, status_code=504)
        except EmbedError as err:
            return JSONResponse({"detail": str(err)}, status_code=500)
        except RuntimeError as err:
            return _unavailable(str(err))
        except BaseException:
            job.cancel()
            raise
        return {"model": MODEL_NAME, "embeddings": vectors}

    @app.get("/health", response_model=None)
    async def health() -> Response:
        embedder = state["embedder"]
        problem = engine.failure or (embedder.failure if embedder is not None else None)
        status = "error" if problem and state["status"] == "ok" else state["status"]
        body = {"status": status, "model": "tiny-gpt",
                "params": sum(p.numel() for p in model.parameters()),
                "batching": settings.batching, "max_batch_size": settings.batch_capacity,
                "max_wait_ms": settings.max_wait_ms, "embed": settings.embed,
                "embed_model": MODEL_NAME if settings.embed else None,
                "active": len(engine.rows), "queued": engine.queued,
                "max_prompt_chars": settings.max_prompt_chars,
                "max_new_tokens_limit": settings.max_new_tokens_limit}
        if problem:
            body["reason"] = problem
        return JSONResponse(body, status_code=200 if status == "ok" else 503,
                            headers={INSTANCE_HEADER: instance})

    @app.get("/metrics")
    async def prometheus() -> Response:
        if isinstance(engine, EngineProcess):  # the engine's metrics live in its process
            return Response(merged_metrics(await engine.metrics_text(), metrics), media_type=metrics.content_type)
        return Response(metrics.render(), media_type=metrics.content_type)

    return app
