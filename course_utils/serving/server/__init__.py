"""The course's HTTP server around the serving core: what runs when you type ``python -m course_utils serve``.

- ``engine``: ``GenerationEngine``, the worker thread that drives ``serving.core.EngineCore`` and hands
  its tokens to asyncio (queue, batching policy, delivery, metrics).
- ``app``: ``create_app(settings)``, the FastAPI application (``/generate`` with SSE, ``/embed``,
  ``/health``, ``/metrics``, and the OpenAI routes of ``extras.openai_api``).
- ``settings``: ``ServeSettings`` (also the command-line options). ``metrics``: Prometheus metrics.
- ``embed``: the embedding worker (all-MiniLM-L6-v2, batched across requests).
- ``guards`` and ``http_head``: the ``Host`` check, the body size cap and the request-head limits.
- ``runner``: uvicorn in the foreground or in a thread. ``process``: the server as a subprocess.
- ``sse``: the token stream's format. ``loadgen``: ``run_load``. ``percentile``: its nearest-rank percentile.
"""
