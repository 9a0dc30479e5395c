"""The OpenAI-compatible ``/v1`` API: returns an ``APIRouter`` that ``create_app`` mounts beside ``/generate``.

Any client of the OpenAI API (the official ``openai`` package and the tools built on it) can use
the course's server: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")``. The
routes run on the same ``GenerationEngine`` as ``/generate`` (same queue, same batches):
``GET /v1/models`` (one model, ``"tiny-gpt"``), ``POST /v1/completions`` (a text prompt) and
``POST /v1/chat/completions`` (``messages``; the tiny GPT is a character-level text model, not a
chat model, so a chat becomes one ``Role: content`` transcript ending in ``"Assistant:"``, see
``chat_prompt``, and the answer is the model's continuation of it). Both take ``max_tokens``
(chat: ``max_completion_tokens``), ``temperature`` (default 1, as in the API; 0 is greedy),
``seed``, ``stop`` (up to ``MAX_STOP`` strings, cut before the first one, see ``StopScanner``),
``stream`` and ``stream_options.include_usage``.

A token is one character here, so ``usage`` counts characters. A stream is ``data: {chunk}``
events, then ``data: [DONE]``; a failure after it started ends it with ``data: {"error": ...}``
and no ``[DONE]``. A client that disconnects frees its batch row, streamed or not.

What this server cannot do is refused with a 400 naming the parameter (the ``ONLY`` table), never
silently ignored; bookkeeping fields (``user``, ``metadata``, ``store``, ``service_tier``) are
accepted and ignored; unknown fields are rejected, as the OpenAI API does, so a typo is not
mistaken for a setting. Every error has the API's shape, ``{"error": {"message", "type", "param",
"code"}}``: 400 for bad input (malformed JSON included), 404 for an unknown model, 503 with
``Retry-After`` when the queue is full or the server stops, 504 when no batch slot freed up in
time, 500 when generating failed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ...data.text import CharTokenizer
from ..server.engine import MAX_TEMPERATURE, MIN_TEMPERATURE, GenerationEngine, GenRequest, QueueFull, ShuttingDown
from ..server.disconnect import ClientGone, until_disconnect
from ..server.settings import MAX_SEED, RETRY_AFTER_S, ServeSettings
from ..server.sse import DONE, format_event

#: The id clients pass as ``model``.
MODEL_ID = "tiny-gpt"
#: The ``owned_by`` of ``/v1/models``.
OWNER = "course_utils"
#: At most this many stop strings, as in the OpenAI API.
MAX_STOP = 4
#: Default new tokens (capped by the server's ``max_new_tokens_limit``), as on ``/generate``.
DEFAULT_MAX_TOKENS = 64
#: The chat template's name for each role.
ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class OpenAIError(Exception):
    """An answer in the OpenAI error shape; ``response()`` turns it into HTTP."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = _printable(message)
        self.param = param
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        """Return ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """Return the JSON answer (with ``Retry-After`` on a 503)."""
        headers = {"Retry-After": RETRY_AFTER_S} if self.status == 503 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _printable(text: str, limit: int = 500) -> str:
    """Return ``text`` cut to ``limit`` characters, with anything UTF-8 cannot encode escaped."""
    return str(text)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


#: What pydantic calls the branches of a union in an error's location (``stop.str``, ``stop.list[str]``).
_SCALAR_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


#: How an error message names a union's branches.
_BRANCH_NAMES = {"str": "a string", "list[str]": "a list of strings",
                 "list[TextPart]": "a list of text parts ({'type': 'text', 'text': ...})"}


def _is_branch(part: object) -> bool:
    return isinstance(part, str) and (part in _SCALAR_BRANCHES or any(c in part for c in "[]-("))


def _param(loc: Sequence[Any]) -> tuple[str | None, str | None]:
    """Return an error location as the API names parameters (``messages[0].content``) and, when
    it went through a union, the union's branch (pydantic names it in the location; the API does
    not): then the parameter is the union itself, whatever failed inside the branch."""
    parts = [p for p in loc if p != "body"]
    if not parts or not isinstance(parts[0], str):
        return None, None
    out = parts[0]
    for p in parts[1:]:
        if _is_branch(p):
            return _printable(out, 200), str(p)
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return _printable(out, 200), None


def validation_error(exc: RequestValidationError) -> OpenAIError:
    """Return the 400 for a body that failed validation: the first problem, said as the API says
    it, naming the parameter but never echoing the value sent."""
    errors = list(exc.errors())
    if not errors:
        return OpenAIError(400, "invalid request body")
    located = [(err, *_param(err.get("loc", ()))) for err in errors]
    err, param, branch = located[0]
    kind = err.get("type", "")
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if kind == "json_invalid":
        detail = err.get("ctx", {}).get("error", "")
        message, param, code = f"the request body is not valid JSON: {detail}", None, "invalid_json"
    elif kind == "extra_forbidden":
        message, code = f"Unrecognized request argument supplied: {param}", "unknown_parameter"
    elif kind == "missing":
        message, code = f"Missing required parameter: '{param}'.", "missing_required_parameter"
    elif param is None:
        message, code = f"the request body must be a JSON object ({msg})", "invalid_type"
    elif branch is not None:  # every branch of the union failed: say which kinds are accepted
        kinds = dict.fromkeys(_BRANCH_NAMES.get(b, b) for _, p, b in located if p == param and b is not None)
        message, code = f"Invalid value for '{param}': expected {' or '.join(kinds)}", "invalid_type"
    else:
        message, code = f"Invalid value for '{param}': {msg}", "invalid_value"
    others = len({p for _, p, _ in located} - {param})
    if others:
        message += f" (and problems with {others} more parameter{'s' if others > 1 else ''})"
    return OpenAIError(400, message, param=param, code=code)


class OpenAIRoute(APIRoute):
    """A route whose validation errors and ``OpenAIError``s answer in the OpenAI error shape
    (the app-wide handler keeps answering 422 for the other routes)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """Return the handler, wrapped to translate errors."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return validation_error(exc).response()
            except OpenAIError as err:
                return err.response()

        return route


# ---- request bodies ---------------------------------------------------------------------------

#: Parameters of the API this server takes only with these values (or left out); any other value is
#: refused with the message (a 400 naming the parameter). ``value == allowed`` counts only for the same type.
ONLY = {
    "top_p": ((1, 1.0), "only top_p=1 is supported (sampling uses the whole distribution; use temperature)"),
    "n": ((1,), "only n=1 is supported (send one request per completion)"),
    "frequency_penalty": ((0, 0.0), "penalties are not supported (only 0)"),
    "presence_penalty": ((0, 0.0), "penalties are not supported (only 0)"),
    "logit_bias": (({},), "logit_bias is not supported"),
    "echo": ((False,), "echo is not supported"),
    "logprobs": ((False,), "logprobs are not supported"),
    "top_logprobs": ((), "logprobs are not supported"),
    "best_of": ((1,), "only best_of=1 is supported"),
    "suffix": ((), "suffix (inserting text) is not supported"),
    "tools": (([],), "this model cannot call tools"),
    "tool_choice": (("none",), "this model cannot call tools (tool_choice may only be 'none')"),
    "response_format": (({"type": "text"},), "only {'type': 'text'} is supported (the model cannot promise JSON)"),
}


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = Field(None, strict=True)


class _Common(BaseModel):
    """The parameters both generation endpoints take."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str
    max_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = None
    n: int | None = Field(None, strict=True)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, strict=True)
    stream: bool | None = Field(False, strict=True)
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted, ignored
    metadata: dict[str, str] | None = None  # accepted, ignored
    store: bool | None = Field(None, strict=True)  # accepted, ignored: nothing is stored
    service_tier: str | None = None  # accepted, ignored

    @field_validator("temperature")
    @classmethod
    def _greedy_or_in_range(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:  # the logits would overflow
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}")
        return value

    @field_validator(*ONLY, check_fields=False)
    @classmethod
    def _supported(cls, value: Any, info: ValidationInfo) -> Any:
        allowed, message = ONLY[info.field_name]  # type: ignore[index]
        if value is not None and not any(type(value) is type(a) and value == a for a in allowed):
            raise ValueError(message)
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str] | None:
        stops = [value] if isinstance(value, str) else value
        if stops is None:
            return None
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    def stops(self) -> list[str]:
        """Return the stop strings as a list (empty when none)."""
        return list(self.stop or [])  # the validator made it a list


class CompletionRequest(_Common):
    """Body of ``POST /v1/completions``."""

    prompt: Any  # checked by the validator: the API's union is wider than what a char model takes
    echo: bool | None = Field(None, strict=True)
    logprobs: int | None = Field(None, strict=True)
    best_of: int | None = Field(None, strict=True)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_text_prompt(cls, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str):
            if not value:
                raise ValueError("the prompt must not be empty")
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            raise ValueError("one prompt per request (a list holding one string is accepted)")
        if isinstance(value, list) and value and all(isinstance(v, int | list) for v in value):
            raise ValueError("token-id prompts are not supported: send the prompt as text")
        raise ValueError("the prompt must be a string")


class TextPart(BaseModel):
    """A text part of a message's content (the only kind a text model reads)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat: a role and its text."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None  # accepted, ignored

    def text(self) -> str:
        """Return the content as one string (text parts joined)."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Common):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    logprobs: bool | None = Field(None, strict=True)
    top_logprobs: int | None = Field(None, strict=True)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = Field(None, strict=True)  # accepted, ignored
    response_format: dict[str, Any] | None = None

    def new_tokens(self) -> int | None:
        """Return the requested number of new tokens (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """Return the prompt a chat becomes: one ``"Role: content"`` line per message (System, User
    or Assistant), then ``"Assistant:"``, which the model continues."""
    lines = [f"{ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


# ---- reading the engine's events --------------------------------------------------------------

def _borders(stop: str) -> list[int]:
    """Return the prefix function of ``stop`` (Knuth-Morris-Pratt): entry ``k`` is the length of the
    longest proper prefix of ``stop[:k + 1]`` that is also a suffix of it."""
    border, k = [0] * len(stop), 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = border[k - 1]
        if stop[i] == stop[k]:
            k += 1
        border[i] = k
    return border


class StopScanner:
    """Cuts streamed text before the first stop string, holding back only what could still
    become one, so streamed pieces always join to the non-streamed text.

    "First" is the stop string that is complete earliest in the text (of two complete at the same
    character, the longer one, which starts earlier), so the answer does not depend on how the text
    was split. Each stop string keeps a matching automaton (its ``_borders``): ``feed`` reads each
    new character once per stop string, and the text held back is only the longest unfinished stop
    start (shorter than the longest stop string): the work per piece is O(len(piece) + longest stop),
    never a rescan of earlier text (held-back text used to be searched again at every piece).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._borders = [_borders(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # characters of each stop string matched at the text's end
        self.pending = ""
        self.emitted = 0  # characters handed out
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Take new text; return the part that can be sent now (``matched`` is set once a stop string
        appears: nothing after it is ever returned)."""
        if self.matched is not None or not text:
            return ""
        if not self.stops:
            self.emitted += len(text)
            return text
        window = self.pending + text
        state, stops, borders = self._state, self.stops, self._borders
        for pos in range(len(self.pending), len(window)):
            c = window[pos]
            done = None
            for j, stop in enumerate(stops):
                k = state[j]
                if k == len(stop):  # (a stop string is never left complete: we return below)
                    k = borders[j][k - 1]
                while k and stop[k] != c:
                    k = borders[j][k - 1]
                if stop[k] == c:
                    k += 1
                state[j] = k
                if k == len(stop) and (done is None or k > len(done)):
                    done = stop
            if done is not None:
                self.matched = done
                out = window[:pos + 1 - len(done)]
                self.pending = ""
                self.emitted += len(out)
                return out
        hold = max(state)
        cut = len(window) - hold
        out, self.pending = window[:cut], window[cut:]
        self.emitted += len(out)
        return out

    def flush(self) -> str:
        """Return what is held back (the text ended without a stop string)."""
        out, self.pending = self.pending, ""
        self.emitted += len(out)
        return out

    @property
    def generated(self) -> int:
        """Return the characters the answer used: those sent plus the stop string that ended it."""
        return self.emitted + len(self.matched or "")


@dataclass
class Outcome:
    """How a generation ended: a ``finish_reason``, or the error event's info."""

    finish_reason: str | None = None
    error: dict[str, Any] | None = None


async def _texts(req: GenRequest, first: tuple[str, Any], chars: str) -> AsyncIterator[tuple[str, Any]]:
    """Yield ``("text", str)`` for every run of tokens already waiting, then the end or error event."""
    item = first
    while True:
        ids: list[int] = []
        last = None
        while True:  # everything already waiting goes in one piece
            kind, value = item
            if kind != "token":
                last = item
                break
            ids.append(value)
            if req.events.empty():
                break
            item = req.events.get_nowait()
        if ids:
            yield ("text", "".join(chars[i] for i in ids))
        if last is not None:
            yield last
            return
        item = await req.events.get()


async def _answer(req: GenRequest, first: tuple[str, Any], chars: str, scanner: StopScanner,
                  outcome: Outcome) -> AsyncIterator[str]:
    """Yield the answer's text as it is generated, cut at a stop string; fills ``outcome``."""
    async for kind, value in _texts(req, first, chars):
        if kind == "text":
            out = scanner.feed(value)
            if out:
                yield out
            if scanner.matched is not None:
                req.cancel("ok")  # free the batch row now (the rest would be thrown away); a success
                outcome.finish_reason = "stop"
                return
        elif kind == "end":
            rest = scanner.flush()
            if rest:
                yield rest
            outcome.finish_reason = "length"
            return
        else:
            outcome.error = value
            return


def _engine_error(info: dict[str, Any]) -> OpenAIError:
    """Return the error for an engine error event (503 shutdown, 500 failure)."""
    if info.get("status") == 503:
        return OpenAIError(503, str(info.get("detail")), code="server_unavailable")
    return OpenAIError(500, str(info.get("detail")), code="generation_failed")


# ---- the router -------------------------------------------------------------------------------

def openai_router(engine: GenerationEngine, tokenizer: CharTokenizer, settings: ServeSettings) -> APIRouter:
    """Return the ``/v1`` router, serving on ``engine`` within ``settings``' limits."""
    router = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI-compatible"])
    created = int(time.time())
    chars = tokenizer.chars
    limit = settings.max_new_tokens_limit
    default_new = min(DEFAULT_MAX_TOKENS, limit)
    model_card = {"id": MODEL_ID, "object": "model", "created": created, "owned_by": OWNER}

    def check_model(name: str) -> None:
        if name != MODEL_ID:
            raise OpenAIError(404, f"The model '{_printable(name, 100)}' does not exist; this server serves "
                                   f"'{MODEL_ID}' (see GET /v1/models)", param="model", code="model_not_found")

    def encode(prompt: str, param: str) -> list[int]:
        if len(prompt) > settings.max_prompt_chars:
            raise OpenAIError(400, f"the prompt is {len(prompt)} characters; this server takes at most "
                                   f"{settings.max_prompt_chars}", param=param, code="context_length_exceeded")
        try:
            return tokenizer.encode(prompt)
        except ValueError as err:
            raise OpenAIError(400, f"the prompt has {err} (this character-level model knows "
                                   f"{len(chars)} characters)", param=param, code="invalid_value") from None

    def check_stops(stops: list[str]) -> None:
        longest = max(map(len, stops), default=0)
        if longest > settings.max_stop_chars:
            raise OpenAIError(400, f"a stop sequence is {longest} characters; this server takes at most "
                                   f"{settings.max_stop_chars}", param="stop", code="invalid_value")

    def new_tokens(value: int | None, param: str) -> int:
        if value is None:
            return default_new
        if value > limit:
            raise OpenAIError(400, f"{param} may be at most {limit} on this server",
                              param=param, code="invalid_value")
        return value

    async def start(ids: list[int], max_new: int, body: _Common) -> tuple[GenRequest, tuple[str, Any]]:
        """Queue the request and wait for its first event; raise ``OpenAIError`` if it fails before that."""
        temperature = 1.0 if body.temperature is None else body.temperature
        try:
            req = engine.submit(ids, max_new, temperature, body.seed)
        except (QueueFull, ShuttingDown) as err:
            raise OpenAIError(503, str(err), code="server_unavailable") from None
        try:
            first = await asyncio.wait_for(req.events.get(), timeout=settings.queue_timeout_s)
        except TimeoutError:  # two classes on Python 3.10, one from 3.11
            req.cancel()
            raise OpenAIError(504, f"timed out: no batch slot within {settings.queue_timeout_s} s",
                              code="timeout") from None
        except BaseException:
            req.cancel()
            raise
        if first[0] == "error":
            raise _engine_error(first[1])
        return req, first

    def usage(prompt: int, scanner: StopScanner) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": scanner.generated,
                "total_tokens": prompt + scanner.generated}

    async def respond(request: Request, body: _Common, ids: list[int], max_new: int, chat: bool) -> Response:
        """Answer one generation request; a client that leaves before its answer is ready cancels it."""
        try:
            return await until_disconnect(request, answer_for(body, ids, max_new, chat))
        except ClientGone:
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    async def answer_for(body: _Common, ids: list[int], max_new: int, chat: bool) -> Response:
        req, first = await start(ids, max_new, body)
        scanner, outcome = StopScanner(body.stops()), Outcome()
        answer = _answer(req, first, chars, scanner, outcome)
        prefix = "chatcmpl-" if chat else "cmpl-"
        head = {"id": prefix + uuid.uuid4().hex[:24],
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": MODEL_ID}

        def choice(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            if body.stream:
                delta: dict[str, str] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish}

        if not body.stream:
            try:
                text = "".join([piece async for piece in answer])
            finally:
                req.cancel()  # no-op when finished; frees the row when this handler is cancelled
            if outcome.error is not None:
                raise _engine_error(outcome.error)
            return JSONResponse({**head, "choices": [choice(text, outcome.finish_reason)],
                                 "usage": usage(len(ids), scanner)})

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunk_head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        if include_usage:
            chunk_head["usage"] = None

        async def events() -> AsyncIterator[str]:
            try:
                if chat:
                    yield format_event({**chunk_head, "choices": [choice("", None, role=True)]})
                async for piece in answer:
                    yield format_event({**chunk_head, "choices": [choice(piece, None)]})
                if outcome.error is not None:
                    yield format_event(_engine_error(outcome.error).body())
                    return
                yield format_event({**chunk_head, "choices": [choice(None if chat else "", outcome.finish_reason)]})
                if include_usage:
                    yield format_event({**chunk_head, "choices": [], "usage": usage(len(ids), scanner)})
                yield DONE
            finally:
                req.cancel()  # a client that went away frees its batch row at the next step

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    @router.get("/models")
    async def list_models() -> dict[str, Any]:
        """The models this server serves: one."""
        return {"object": "list", "data": [model_card]}

    @router.get("/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        """One model's card (404 for any other id)."""
        check_model(model_id)
        return model_card

    @router.post("/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """Continue a prompt (OpenAI's legacy completions)."""
        check_model(body.model)
        check_stops(body.stops())
        ids = encode(body.prompt, "prompt")
        return await respond(request, body, ids, new_tokens(body.max_tokens, "max_tokens"), chat=False)

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        """Continue a chat transcript (see ``chat_prompt``; the model is not a chat model)."""
        check_model(body.model)
        check_stops(body.stops())
        ids = encode(chat_prompt(body.messages), "messages")
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        return await respond(request, body, ids, new_tokens(body.new_tokens(), param), chat=True)

    return router
