"""Notebook 10's demo page (its ``demo_page.py`` cell) over real HTTP: ``stream_generate`` turns errors
into lines, and proxy settings in the environment never hijack its loopback calls."""

import os

import httpx
import pytest

pytest.importorskip("gradio", reason="gradio is not installed")

from course_utils.serving import ServeSettings  # noqa: E402
from course_utils.models.checkpoint import load_tiny_gpt  # noqa: E402
from course_utils.serving.server.runner import ThreadedServer, free_port  # noqa: E402
from notebook_files import import_written  # noqa: E402


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The demo page module, as notebook 10 writes it."""
    return import_written("10_serving.ipynb", "APPS", "demo_page", tmp_path_factory.mktemp("nb10"))


@pytest.fixture(scope="module")
def server():
    model, tok = load_tiny_gpt()
    with ThreadedServer(ServeSettings(embed=False, threads=1), model=model, tokenizer=tok) as srv:
        yield srv


def test_stream_generate_yields_the_growing_text(page, server):
    updates = list(page.stream_generate(server.url, "The ", max_new_tokens=5))
    assert len(updates) == 5 and all(b.startswith(a) for a, b in zip(updates, updates[1:]))


def test_an_unreachable_server_gives_an_error_line_not_an_exception(page):
    updates = list(page.stream_generate(f"http://127.0.0.1:{free_port()}", "The ", max_new_tokens=5, timeout_s=5))
    assert len(updates) == 1 and updates[0].startswith("[error] ConnectError")


def test_a_refused_request_gives_an_error_line(page, server):
    updates = list(page.stream_generate(server.url, "", max_new_tokens=5))
    assert len(updates) == 1 and updates[0].startswith("[error 422]") and "at least 1 character" in updates[0]


@pytest.fixture
def dead_proxy(monkeypatch):
    """Proxy variables pointing at a closed loopback port, and no NO_PROXY."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return proxy


def test_proxy_settings_do_not_hijack_stream_generate(page, server, dead_proxy):
    with pytest.raises(httpx.TransportError):  # what a client that trusts the environment does
        httpx.get(server.url + "/health", timeout=5)
    updates = list(page.stream_generate(server.url, "The ", max_new_tokens=4))
    assert len(updates) == 4 and not updates[-1].startswith("[error")


def test_the_demo_page_starts_with_proxy_settings_in_the_environment(page, server, dead_proxy):
    demo, url = page.launch_demo(server.url)  # Gradio's own start-up check used to go to the proxy
    try:
        assert httpx.get(url, timeout=30, trust_env=False).status_code == 200
    finally:
        demo.close()
    assert "NO_PROXY" not in os.environ and "no_proxy" not in os.environ  # the environment is restored
