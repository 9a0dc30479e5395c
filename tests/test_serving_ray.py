"""Scaling out: the load generator's retries (a tiny flaky server, no Ray), and the parts of notebook 13's
ray_app.py that its own run does not reach (refusals, a config file's args, waiting out a racy status).

The two replicas themselves (both serve the same greedy answers as the course server, a killed one is
replaced and with retries nothing is lost, Ray's daemons end with the cluster) are asserted in notebook
13's cells, which ``make test`` runs; a second local Ray cluster here would repeat them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from course_utils.serving.server.loadgen import run_load
from course_utils.serving.server.runner import free_port
from course_utils.serving.server.sse import END, format_event, token_event
from notebook_files import written_module


def ray_app():
    """Notebook 13's ray_app.py (its %%writefile cell), imported once."""
    pytest.importorskip("ray.serve")
    return written_module("13_serving_engine.ipynb", "APPS", "ray_app")

NEW_TOKENS = 6


# ---- run_load's retries and header counts, against a server that fails on purpose ----------------

def flaky_app(fail: str, failures: dict[str, int]) -> Starlette:
    """An app whose ``/generate`` fails each prompt's first attempt as ``fail`` says, then answers."""

    async def generate(request: Request):
        body = await request.json()
        prompt, n = body["prompt"], body["max_new_tokens"]
        failures[prompt] = failures.get(prompt, 0) + 1
        first = failures[prompt] == 1
        if first and fail in ("503", "422"):
            return JSONResponse({"detail": "try again"}, status_code=int(fail))

        async def stream():
            for i in range(n):
                if first and fail == "cut" and i == 2:
                    raise RuntimeError("the replica died")  # uvicorn drops the connection mid-body
                yield token_event("x", i)
                await asyncio.sleep(0)
            yield format_event({"reason": "length", "tokens": n}, END)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"x-served-by": "first" if first else "again"})

    return Starlette(routes=[Route("/generate", generate, methods=["POST"])])


@pytest.fixture
def flaky() -> Iterator:
    """Return ``start(fail) -> url``: runs a flaky app in a uvicorn thread until the test ends."""
    servers = []

    def start(fail: str) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(flaky_app(fail, {}), host="127.0.0.1", port=port,
                                               log_level="critical", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the flaky server did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("fail", ["503", "cut"])
def test_without_retries_a_failed_attempt_is_lost(flaky, fail):
    report = run_load(flaky(fail), concurrency=2, n_requests=4, max_new_tokens=NEW_TOKENS,
                      prompts=["a", "b", "c", "d"])
    assert report.n_lost == 4 and report.n_ok == 0 and report.retries == 0
    assert report.served_by == {}  # not asked for


@pytest.mark.parametrize("fail", ["503", "cut"])
def test_a_retried_request_that_succeeds_is_not_lost(flaky, fail):
    report = run_load(flaky(fail), concurrency=2, n_requests=4, max_new_tokens=NEW_TOKENS,
                      prompts=["a", "b", "c", "d"], retries=2, retry_backoff_s=0.01,
                      count_header="x-served-by", keep_texts=True)
    assert report.n_ok == 4 and report.n_lost == 0, report.errors
    assert report.retries == 4 and len(report.errors) == 4  # one failed attempt per request
    assert report.served_by == {"again": 4}  # only successful answers are counted
    assert report.texts == ["x" * NEW_TOKENS] * 4
    assert report.tokens == 4 * NEW_TOKENS
    if fail == "503":
        assert report.statuses == {"503": 4, "200": 4}


def test_a_client_error_is_not_retried(flaky):
    report = run_load(flaky("422"), concurrency=1, n_requests=2, max_new_tokens=NEW_TOKENS,
                      prompts=["a", "b"], retries=3)
    assert report.n_failed == 2 and report.retries == 0
    assert report.statuses == {"422": 2}


def test_retry_arguments_are_checked():
    with pytest.raises(ValueError, match="retries"):
        run_load("http://127.0.0.1:9", concurrency=1, n_requests=1, retries=-1)


def test_ray_serving_refuses_replicas_that_do_not_fit():
    ray_serving = ray_app().ray_serving

    with pytest.raises(ValueError, match="do not fit"):
        with ray_serving(num_replicas=3, num_cpus=2):
            pass
    with pytest.raises(ValueError, match="route_prefix"):
        with ray_serving(num_replicas=1, num_cpus=2, route_prefix="tiny"):
            pass


def scripted_polls(monkeypatch, module, polls: list[tuple[list[str], dict[str, int]]]) -> list[int]:
    """Make ``module``'s actor list and Serve status answer ``polls`` in turn (the last one for ever);
    return a one-item list counting the polls made."""
    made = [0]

    def actors(*_):
        made[0] += 1
        return polls[min(made[0], len(polls)) - 1][0]

    monkeypatch.setattr(module, "replica_actor_names", actors)
    monkeypatch.setattr(module, "replica_states", lambda *_: polls[min(made[0], len(polls)) - 1][1])
    monkeypatch.setattr(module.time, "sleep", lambda s: None)
    return made


def test_wait_for_replicas_needs_two_agreeing_polls(monkeypatch):
    module = ray_app()
    # The CI race: a new replica's actor appears between the two reads while Serve still counts the
    # killed one RUNNING; the next poll shows the truth (one RUNNING, one STARTING).
    made = scripted_polls(monkeypatch, module, [
        (["a", "b"], {"RUNNING": 2}),                   # before the kill
        (["a", "new"], {"RUNNING": 2}),                 # one racy poll that looks done
        (["a", "new"], {"RUNNING": 1, "STARTING": 1}),
        (["a", "new"], {"RUNNING": 2}),
        (["a", "new"], {"RUNNING": 2}),
    ])
    module.wait_for_replicas(2, timeout_s=60)
    assert made[0] == 5
    made = scripted_polls(monkeypatch, module, [(["a", "b"], {"RUNNING": 2, "STOPPING": 1})])
    with pytest.raises(TimeoutError, match="STOPPING"):
        module.wait_for_replicas(2, timeout_s=0.01)
    made = scripted_polls(monkeypatch, module, [([], {})])
    module.wait_for_replicas(0, timeout_s=60)
    assert made[0] == 2


def test_app_builder_reads_a_config_files_args():
    pytest.importorskip("ray.serve")
    app_builder = ray_app().app_builder

    app = app_builder({"num_replicas": 3, "cpus_per_replica": 2, "threads": 2, "allow_hosts": ["a.example"]})
    deployment = app._bound_deployment
    assert deployment.num_replicas == 3 and deployment.ray_actor_options["num_cpus"] == 2
    settings = deployment.init_args[0]
    assert settings.threads == 2 and settings.allow_hosts == ("a.example",) and not settings.embed
    with pytest.raises(ValueError, match="invalid settings"):
        app_builder({"threads": -1})
