"""Stop waiting for a client that left: run a route's work until it ends or the client disconnects.

A streamed answer notices a client that left when a write fails (Starlette also listens for the
disconnect while it streams). A route that waits first (for a batch slot, or for a whole answer
it returns in one piece) writes nothing until then, so without this it computes for nobody:
``until_disconnect`` watches the connection (``receive()`` gives ``http.disconnect`` when the client
closes it) beside the work and cancels the work when the client goes. The work's own clean-up
(``GenRequest.cancel()`` in a ``finally``) then frees the engine's row, counted ``"cancelled"``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed the connection (its body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # (a pipelined next request's bytes: not ours; keep watching)


async def until_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Return ``work``'s result; raise ``ClientGone`` (after cancelling ``work`` and awaiting its
    clean-up) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself was cancelled
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone("the client disconnected")
    return task.result()
