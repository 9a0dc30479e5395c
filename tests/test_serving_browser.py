"""Notebook 10's demo page (its ``demo_page.py`` cell) in a real headless browser: type a prompt, click, read the streamed text.

Uses Debian's chromium (/usr/bin/chromium) through playwright, so nothing is downloaded; skips,
saying why, on a machine without them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from course_utils import config

CHROMIUM = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"no chromium browser at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
pytest.importorskip("gradio", reason="gradio is not installed")

from course_utils.models.gpt import generate_cached  # noqa: E402
from course_utils.models.checkpoint import load_tiny_gpt  # noqa: E402
from course_utils.serving.server.process import serve_in_subprocess  # noqa: E402
from notebook_files import import_written  # noqa: E402

PROMPT = "The Python "
NEW_TOKENS = 24


def test_gradio_page_streams_generated_text(tmp_path):
    model_path = os.environ.get("COURSE_SERVE_MODEL") or None
    model, tok = load_tiny_gpt(model_path)
    expected = tok.decode(generate_cached(model, torch.tensor([tok.encode(PROMPT)]), NEW_TOKENS)[0])
    page = import_written("10_serving.ipynb", "APPS", "demo_page", tmp_path)
    settings = {"batching": "iteration", "embed": False, "model": model_path}
    with serve_in_subprocess(settings, startup_timeout_s=120) as server:
        demo, url = page.launch_demo(server.url)
        try:
            assert url.startswith("http://127.0.0.1:")
            with sync_api.sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
                try:
                    page = browser.new_page()
                    page.goto(url, timeout=30_000)
                    page.locator("#prompt textarea").fill(PROMPT)
                    page.locator("#max-new-tokens input[type=number]").fill(str(NEW_TOKENS))
                    page.locator("#max-new-tokens input[type=number]").press("Enter")
                    page.locator("#generate").click()
                    page.wait_for_function(
                        "n => document.querySelector('#output textarea').value.length >= n",
                        arg=NEW_TOKENS, timeout=60_000)
                    shot = config.build_dir() / "serving_gradio_demo.png"
                    page.screenshot(path=str(shot))
                    text = page.locator("#output textarea").input_value()
                finally:
                    browser.close()
        finally:
            demo.close()
    assert text == expected
    assert shot.stat().st_size > 1000
