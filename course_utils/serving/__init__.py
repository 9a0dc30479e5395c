"""Serving the course's models over HTTP: batching, token streaming, metrics, load testing.

- ``settings``: ``ServeSettings`` (also the ``python -m course_utils serve`` options).
- ``engine``: the generation worker (KV cache; "iteration", "static" or "none" batching).
- ``embed``: the embedding worker (all-MiniLM-L6-v2, batched across requests).
- ``app``: ``create_app(settings)``, the FastAPI application (SSE streaming, /metrics).
- ``guards``: the ``Host`` header check and the request body size cap in front of the app.
- ``metrics``: Prometheus metrics. ``server``: uvicorn in the foreground or in a thread.
- ``process``: ``serve_in_subprocess`` / ``ServerProcess``. ``loadgen``: ``run_load``.
- ``sse``: the token stream's format, written by the servers and read by the clients.
- ``percentile``: the nearest-rank percentile the load generator reports.
- ``bare``: tokens/s of the model alone.

The model, its KV-cache decoding and its checkpoint loader live in ``course_utils.models``.

Importing this package is cheap; FastAPI, uvicorn and httpx load only with the modules that use them.
"""

from .settings import BATCHING_MODES, ServeSettings

__all__ = ["BATCHING_MODES", "ServeSettings"]
