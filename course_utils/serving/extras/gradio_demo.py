"""A browser demo of the course's model server: a Gradio page that streams from ``POST /generate``.

``build_demo(base_url)`` returns the page; ``launch_demo(base_url)`` serves it on 127.0.0.1 without
blocking the caller (a notebook cell returns at once) and returns ``(demo, url)``; call
``demo.close()`` to stop it. Gradio's telemetry is switched off and no public share link is made.
The page holds no model: each click opens one streamed request to the server at ``base_url`` and
shows the text growing token by token, so it behaves exactly as any other client of the server.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

# Gradio reads this when it sends usage statistics; set it before gradio is imported.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import httpx  # noqa: E402

from ..server.sse import ERROR, TOKEN, SSEParser  # noqa: E402

TITLE = "TinyGPT, served with request batching and token streaming"


def stream_generate(base_url: str, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0,
                    timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the text generated so far (prompt excluded) after each token the server streams.

    Reads the server-sent events of ``POST {base_url}/generate`` with the course's parser
    (``sse.SSEParser``, which also checks the token order). A 4xx/5xx answer, an ``error``
    event, a connection failure or a malformed stream ends the stream with a readable
    ``[error ...]`` line instead of raising, because a demo page should show what went wrong.
    The client ignores proxy settings (``trust_env=False``): the server is on this machine.
    """
    body = {"prompt": prompt, "max_new_tokens": int(max_new_tokens), "temperature": float(temperature)}
    text = ""
    parser = SSEParser()
    try:
        with httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False) as client:
            with client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    yield f"[error {resp.status_code}] {_detail(resp.text)}"
                    return
                for chunk in resp.iter_bytes():
                    for kind, value in parser.feed_bytes(chunk):
                        if kind == TOKEN:
                            text += value
                            yield text
                        elif kind == ERROR:
                            detail = value.get("detail", value) if isinstance(value, dict) else value
                            yield _after(text, f"[error] {detail}")
                            return
                        else:  # END
                            return
                parser.finish()
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:  # unreachable server, cut or bad stream
        yield _after(text, f"[error] {type(err).__name__}: {err}")
        return
    yield _after(text, "[error] the stream ended without an end event")


def _after(text: str, line: str) -> str:
    return f"{text}\n{line}" if text else line


def _detail(body: str) -> str:
    try:
        detail: Any = json.loads(body).get("detail", body)
    except (ValueError, AttributeError):
        return body[:300]
    return json.dumps(detail)[:300] if not isinstance(detail, str) else detail[:300]


def build_demo(base_url: str) -> gr.Blocks:
    """Return a Gradio page (prompt box, length slider, button, streamed output) for the server at ``base_url``."""
    base_url = base_url.rstrip("/")

    def generate(prompt: str, max_new_tokens: float) -> Iterator[str]:
        yield from stream_generate(base_url, prompt, int(max_new_tokens))

    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"### {TITLE}\nThe server at `{base_url}` decodes greedily; text appears as it streams.")
        prompt = gr.Textbox(label="Prompt", value="The Python interpreter ", elem_id="prompt")
        max_new = gr.Slider(1, 128, value=64, step=1, label="New tokens", elem_id="max-new-tokens")
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        output = gr.Textbox(label="Generated text", lines=6, elem_id="output")
        button.click(generate, inputs=[prompt, max_new], outputs=output)
        prompt.submit(generate, inputs=[prompt, max_new], outputs=output)
    return demo


def launch_demo(base_url: str, port: int | None = None) -> tuple[gr.Blocks, str]:
    """Return ``(demo, url)`` after starting the page on 127.0.0.1 in the background (no share link).

    ``port=None`` lets Gradio pick a free port. Stop it with ``demo.close()``.
    """
    demo = build_demo(base_url)
    with _no_proxy_for_loopback():  # Gradio checks its own page with an httpx client that reads HTTP_PROXY
        demo.launch(server_name="127.0.0.1", server_port=port, share=False, prevent_thread_lock=True,
                    inbrowser=False, quiet=True, show_error=True, ssr_mode=False, inline=False)
    return demo, demo.local_url


@contextlib.contextmanager
def _no_proxy_for_loopback() -> Iterator[None]:
    """Within the block, proxy settings from the environment skip loopback addresses."""
    from ... import config

    loopback = "localhost,127.0.0.1,::1"
    with config.environment(**{name: ",".join(filter(None, [os.environ.get(name), loopback]))
                               for name in ("NO_PROXY", "no_proxy")}):
        yield
