"""``ServeSettings``: every knob of the model server, validated once, with CLI arguments."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Any

BATCHING_MODES = ("iteration", "static", "none")
#: The most texts one ``/embed`` request may carry.
MAX_TEXTS_PER_REQUEST = 64


def default_threads() -> int:
    """Torch threads for the model worker: 1 on small machines, at most 4 otherwise.

    On a busy 2-core machine two OpenMP threads fight the event loop and each other; one
    thread per small decoding step is faster there (measured: 20x on a loaded 2-core box).
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2 - 1 or 1))


@dataclass(frozen=True)
class ServeSettings:
    """Settings of ``create_app`` and ``python -m course_utils serve`` (same names, dashes in the CLI).

    ``batching``: "iteration" (requests join the running batch at the next decoding step,
    finished ones leave), "static" (collect up to ``max_batch_size`` within ``max_wait_ms``,
    decode that batch to the end, then take the next) or "none" (one request at a time).
    ``max_wait_ms`` is how long an idle "static" worker waits for more requests before it
    starts a batch; "iteration" starts at once (latecomers join at the next step) and uses it
    only for ``/embed`` batches, like the other modes.
    ``queue_timeout_s`` bounds how long a request may wait for its first token (HTTP 504).
    ``stream_interval_ms``: the worker hands tokens to the event loop at most this often
    (every token is still its own SSE event, but several share one network write); 0 sends
    after every decoding step. Each write costs the server and the client far more CPU than
    a decoding step of this tiny model, so coalescing is what lets batching pay over HTTP.
    ``model``: checkpoint path; ``None`` loads the shipped ``data/tiny_gpt.pt``.

    Protection of the HTTP front: ``max_body_bytes`` (larger request bodies get 413),
    ``embed_queue_texts`` (texts waiting for ``/embed`` at most; 503 beyond),
    ``limit_concurrency`` (open connections and requests at most; uvicorn answers 503 beyond),
    ``keep_alive_s`` (idle keep-alive connections close after this), ``max_header_bytes``
    (larger request heads get 431) and ``head_timeout_s`` (a request head must arrive within
    this, else 408; see ``http_head``),
    ``allow_hosts``: ``Host`` header names accepted besides loopback ones (localhost,
    127.0.0.1, [::1]); anything else gets 400, which stops DNS-rebinding pages in a browser
    from reaching a server meant for this machine only.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    batching: str = "iteration"
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    queue_size: int = 256
    queue_timeout_s: float = 30.0
    max_prompt_chars: int = 256
    max_new_tokens_limit: int = 256
    compile: bool = False
    embed: bool = True
    threads: int | None = None
    model: str | None = None
    log_level: str = "warning"
    graceful_timeout_s: float = 5.0
    stream_interval_ms: float = 10.0
    max_body_bytes: int = 1_048_576
    embed_queue_texts: int = 1024
    limit_concurrency: int = 512
    keep_alive_s: float = 5.0
    max_header_bytes: int = 16_384
    head_timeout_s: float = 10.0
    allow_hosts: tuple[str, ...] = ()

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
            "threads": self.threads is None or self.threads >= 1,
            "graceful_timeout_s": self.graceful_timeout_s > 0,
            "stream_interval_ms": self.stream_interval_ms >= 0,
            "max_body_bytes": self.max_body_bytes >= 1,
            "embed_queue_texts": self.embed_queue_texts >= MAX_TEXTS_PER_REQUEST,  # one full request fits
            "limit_concurrency": self.limit_concurrency >= 1,
            "keep_alive_s": self.keep_alive_s > 0,
            "max_header_bytes": self.max_header_bytes >= 1024,
            "head_timeout_s": self.head_timeout_s > 0,
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
            flag = "--" + f.name.replace("_", "-")
            if f.name == "compile":
                args.append("--compile" if value else "--no-compile")
            elif f.name == "embed":
                args.append("--embed" if value else "--no-embed")
            elif f.name == "allow_hosts":
                for name in value:
                    args += ["--allow-host", name]
            elif value is not None:
                args += [flag, str(value)]
        return args


def add_cli_arguments(parser: Any) -> None:
    """Add one option per setting to an ``argparse`` parser (``serve`` subcommand)."""
    d = ServeSettings()
    parser.add_argument("--host", default=d.host, help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=d.port)
    parser.add_argument("--model", default=None, help="checkpoint path (default: data/tiny_gpt.pt)")
    parser.add_argument("--batching", choices=BATCHING_MODES, default=d.batching)
    parser.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    parser.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms)
    parser.add_argument("--queue-size", type=int, default=d.queue_size)
    parser.add_argument("--queue-timeout-s", type=float, default=d.queue_timeout_s)
    parser.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars)
    parser.add_argument("--max-new-tokens-limit", type=int, default=d.max_new_tokens_limit)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the model worker")
    parser.add_argument("--log-level", default=d.log_level)
    parser.add_argument("--graceful-timeout-s", type=float, default=d.graceful_timeout_s)
    parser.add_argument("--stream-interval-ms", type=float, default=d.stream_interval_ms,
                        help="hand tokens to the network at most this often (0: every step)")
    parser.add_argument("--compile", action="store_true", default=d.compile,
                        help="torch.compile the decoding step (slow to start on a CPU)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--embed", action="store_true", default=d.embed,
                        help="serve /embed with all-MiniLM-L6-v2 (default)")
    parser.add_argument("--no-embed", dest="embed", action="store_false")
    parser.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                        help="larger request bodies get 413")
    parser.add_argument("--embed-queue-texts", type=int, default=d.embed_queue_texts,
                        help="texts waiting for /embed at most (503 beyond)")
    parser.add_argument("--limit-concurrency", type=int, default=d.limit_concurrency,
                        help="open connections and requests at most (uvicorn answers 503 beyond)")
    parser.add_argument("--keep-alive-s", type=float, default=d.keep_alive_s,
                        help="close idle keep-alive connections after this many seconds")
    parser.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes,
                        help="larger request heads get 431")
    parser.add_argument("--head-timeout-s", type=float, default=d.head_timeout_s,
                        help="a request head must arrive within this many seconds (else 408)")
    parser.add_argument("--allow-host", dest="allow_hosts", action="append", default=None, metavar="NAME",
                        help="accept this Host header name besides loopback ones (repeatable); "
                             "others get 400")


def settings_from_args(args: Any) -> ServeSettings:
    """Return the ``ServeSettings`` given by parsed CLI arguments."""
    names = [f.name for f in fields(ServeSettings)]
    return ServeSettings(**{n: getattr(args, n) for n in names if hasattr(args, n)})
