"""``ServeSettings``: every knob of the model server, validated once; the command line is derived from it."""

from __future__ import annotations

import os
import argparse
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

BATCHING_MODES = ("iteration", "static", "none")
#: The most texts one ``/embed`` request may carry.
MAX_TEXTS_PER_REQUEST = 64
#: The largest sampling seed a request may carry (``/generate`` and ``/v1``).
MAX_SEED = 2**63 - 1
#: Seconds a 503 answer asks the client to wait before retrying (its ``Retry-After``).
RETRY_AFTER_S = "1"


def default_threads() -> int:
    """Torch threads for the model worker: 1 on small machines, at most 4 otherwise.

    On a busy 2-core machine two OpenMP threads fight the event loop and each other; one
    thread per small decoding step is faster there (measured: 20x on a loaded 2-core box).
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2 - 1 or 1))


def _opt(default: Any, help: str = "", **extra: Any) -> Any:
    """Return a dataclass field whose metadata carries its ``--help`` text (and argparse extras)."""
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class ServeSettings:
    """Settings of ``create_app`` and ``python -m course_utils serve``.

    Each field is one command-line option (dashes for underscores); its help text lives in the
    field's metadata, so ``python -m course_utils serve --help`` and this class cannot drift.
    The three batching modes: "iteration" (requests join the running batch at the next
    decoding step, finished ones leave), "static" (collect up to ``max_batch_size`` within
    ``max_wait_ms``, decode that batch to the end, then take the next) and "none" (one request
    at a time). The HTTP front is protected by ``max_body_bytes``, ``embed_queue_texts``,
    ``limit_concurrency``, ``keep_alive_s``, ``max_header_bytes``, ``head_timeout_s`` (see
    ``http_head``), ``body_timeout_s``, the per-client shares ``max_connections_per_client`` and
    ``max_requests_per_client`` (one client address cannot take every slot; see ``guards``), the
    ``/v1`` routes' ``max_stop_chars`` and ``allow_hosts`` (a server meant for this machine only
    answers 400 to other ``Host`` names, which stops DNS-rebinding pages in a browser from reaching
    it). Learners of one shared machine (a JupyterHub) all connect from 127.0.0.1: for them the
    per-client shares are one share.
    """

    host: str = _opt("127.0.0.1", "address to bind (default: loopback only)")
    port: int = _opt(8000, "TCP port to listen on")
    batching: str = _opt("iteration", "how requests share the model: iteration (join the running batch at "
                         "the next step), static (fixed batches) or none (one at a time)",
                         choices=BATCHING_MODES)
    max_batch_size: int = _opt(32, "sequences decoded together at most")
    max_wait_ms: float = _opt(5.0, "how long an idle static-batching worker (and /embed) waits for more "
                              "requests before it starts a batch")
    queue_size: int = _opt(256, "requests waiting at most (503 beyond)")
    queue_timeout_s: float = _opt(30.0, "longest wait for the first token (504 beyond)")
    max_prompt_chars: int = _opt(256, "longest prompt accepted (422 beyond)")
    max_new_tokens_limit: int = _opt(256, "largest max_new_tokens a request may ask for (422 beyond)")
    token_budget: int = _opt(256, "tokens one forward pass computes at most: one per decoding sequence, the "
                             "rest for prompts (a longer prompt is computed in chunks over several steps)")
    prefix_cache_mb: float = _opt(16.0, "memory for the keys and values of prompt blocks seen before (MiB); "
                                  "a prompt that starts like an earlier one computes only the rest (0: off)")
    compile: bool = _opt(False, "torch.compile the decoding step (slow to start on a CPU)")
    engine_process: bool = _opt(False, "run the model worker in a process of its own, so it never waits for "
                                "the HTTP event loop's GIL (see serving.extras.engine_process)")
    embed: bool = _opt(True, "serve /embed with all-MiniLM-L6-v2")
    threads: int | None = _opt(None, "torch threads of the model worker (default: 1 on small machines, "
                               "at most 4)")
    model: str | None = _opt(None, "checkpoint path (default: the shipped data/tiny_gpt.pt)")
    log_level: str = _opt("warning", "uvicorn log level")
    graceful_timeout_s: float = _opt(5.0, "on shutdown, wait this long for running requests")
    stream_interval_ms: float = _opt(10.0, "hand tokens to the network at most this often (0: after every "
                                     "step); each write costs far more CPU than a step of this tiny model, "
                                     "so coalescing is what lets batching pay over HTTP")
    max_body_bytes: int = _opt(1_048_576, "larger request bodies get 413")
    embed_queue_texts: int = _opt(1024, "texts waiting for /embed at most (503 beyond)")
    limit_concurrency: int = _opt(512, "open connections and requests at most (uvicorn answers 503 beyond)")
    keep_alive_s: float = _opt(15.0, "close idle keep-alive connections after this many seconds; longer than "
                               "httpx's 5 s (the OpenAI SDK's too), so such clients close idle ones first "
                               "instead of sending a request on a connection the server is closing")
    max_header_bytes: int = _opt(16_384, "larger request heads get 431")
    head_timeout_s: float = _opt(10.0, "a request head must arrive within this many seconds (else 408)")
    body_timeout_s: float = _opt(10.0, "a request body must arrive within this many seconds of its head (else 408)")
    max_connections_per_client: int = _opt(128, "open connections one client address may hold at most (more are "
                                           "answered 503 and closed); keep it below limit_concurrency")
    max_requests_per_client: int = _opt(128, "requests one client address may have in flight at most (429 beyond)")
    max_stop_chars: int = _opt(64, "longest stop string a /v1 request may carry (400 beyond)")
    allow_hosts: tuple[str, ...] = _opt((), "accept this Host header name besides loopback ones "
                                        "(repeatable); others get 400", flag="--allow-host")

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_hosts", tuple(self.allow_hosts or ()))
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        checks = {
            "port": 0 <= self.port <= 65535,
            "max_batch_size": self.max_batch_size >= 1,
            "max_wait_ms": self.max_wait_ms >= 0,
            "queue_size": self.queue_size >= 1,
            "queue_timeout_s": self.queue_timeout_s > 0,
            "max_prompt_chars": self.max_prompt_chars >= 1,
            "max_new_tokens_limit": self.max_new_tokens_limit >= 1,
            "token_budget": self.token_budget >= 1,
            "prefix_cache_mb": self.prefix_cache_mb >= 0,
            "threads": self.threads is None or self.threads >= 1,
            "graceful_timeout_s": self.graceful_timeout_s > 0,
            "stream_interval_ms": self.stream_interval_ms >= 0,
            "max_body_bytes": self.max_body_bytes >= 1,
            "embed_queue_texts": self.embed_queue_texts >= MAX_TEXTS_PER_REQUEST,  # one full request fits
            "limit_concurrency": self.limit_concurrency >= 1,
            "keep_alive_s": self.keep_alive_s > 0,
            "max_header_bytes": self.max_header_bytes >= 1024,
            "head_timeout_s": self.head_timeout_s > 0,
            "body_timeout_s": self.body_timeout_s > 0,
            "max_connections_per_client": self.max_connections_per_client >= 1,
            "max_requests_per_client": self.max_requests_per_client >= 1,
            "max_stop_chars": self.max_stop_chars >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError("invalid settings: " + ", ".join(f"{n}={getattr(self, n)!r}" for n in bad))

    @property
    def torch_threads(self) -> int:
        """Threads the model worker gives torch."""
        return self.threads or default_threads()

    @property
    def batch_capacity(self) -> int:
        """How many sequences decode together (1 when batching is "none")."""
        return 1 if self.batching == "none" else self.max_batch_size

    def replace(self, **changes: Any) -> ServeSettings:
        """Return a copy with ``changes`` applied (validated again)."""
        return ServeSettings(**{**asdict(self), **changes})

    def to_cli_args(self) -> list[str]:
        """Return the ``python -m course_utils serve`` arguments that reproduce these settings."""
        args: list[str] = []
        defaults = ServeSettings()
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name) and f.name not in ("host", "port"):
                continue
            flag = _flag(f)
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, tuple):
                for item in value:
                    args += [flag, str(item)]
            elif value is not None:
                args += [flag, str(value)]
        return args


def _flag(f: Field) -> str:
    """Return the option name of a settings field (``max_batch_size`` -> ``--max-batch-size``)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per ``ServeSettings`` field to an ``argparse`` parser, typed from its annotation."""
    hints = get_type_hints(ServeSettings)
    for f in fields(ServeSettings):
        kind, default = hints[f.name], f.default if f.default is not MISSING else f.default_factory()
        options: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help")}
        if "choices" in f.metadata:
            options["choices"] = f.metadata["choices"]
        if kind is bool:
            options.update(action=argparse.BooleanOptionalAction, default=default)
        elif get_origin(kind) is tuple:
            options.update(action="append", default=None, metavar="NAME")
        else:
            (scalar,) = [t for t in get_args(kind) if t is not type(None)] or [kind]
            options.update(type=scalar, default=default)
        parser.add_argument(_flag(f), **options)


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """Return the ``ServeSettings`` given by parsed CLI arguments (options left out keep their defaults)."""
    given = {f.name: getattr(args, f.name) for f in fields(ServeSettings)
             if getattr(args, f.name, None) is not None}
    return ServeSettings(**given)
