"""Serving the course's models: the engine core, the HTTP server around it, and the extras shown once.

Three rooms, read in this order:

- ``core`` (with ``prefix_cache``): ``EngineCore``, the scheduler the notebooks teach. Its ``step()``
  admits, plans a token budget, runs one forward pass (``models.gpt.mixed_step``), emits and retires;
  ``generate(prompts, ...)`` drives it with no thread and no event loop. No HTTP, asyncio or metrics.
- ``server``: the HTTP server around the core (``server.engine``, the thin adapter that feeds the core
  and hands its tokens to asyncio; the FastAPI app, SSE, settings, metrics, uvicorn, the load generator).
- ``extras``: shown once in notebooks 10 and 13 (the OpenAI API, the engine as its own process, the
  load breakdown, the bare model's speed).

The model, its KV-cache steps and its checkpoint loader live in ``course_utils.models``.
Importing this package is cheap; FastAPI, uvicorn and httpx load only with the modules that use them.
"""

from .server.settings import BATCHING_MODES, ServeSettings

__all__ = ["BATCHING_MODES", "ServeSettings"]
