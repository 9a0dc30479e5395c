"""The course site (``make site``, tools/build_site.py): built offline from the stored outputs, then
read in headless Chromium.

The browser tests build the site themselves, into a temporary folder, with the site's own
environment (``build/venv-site``, which ``make site`` makes from site/requirements.txt) and the
network removed (an empty network namespace where Linux allows one, the Python guard always).
They then serve it on loopback and open every page in Debian's chromium through playwright, with
every request that is not for the local server refused and recorded. Without build/venv-site or
chromium they skip, saying so; ``make test-site`` and its CI job are where they run for real.
The tests of the driver's parsing need neither and always run.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from course_utils import config

sys.path.insert(0, str(config.REPO_ROOT / "tools"))
try:
    import build_site
finally:
    sys.path.remove(str(config.REPO_ROOT / "tools"))

ROOT = config.REPO_ROOT
SITE_PYTHON = build_site.SITE_VENV / "bin" / "python"
CHROMIUM = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
REPO_URL = "https://github.com/example-org/example-course"
BRANCH = "main"
#: A word notebook 13 teaches; the site's search must find notebook 13's page with it.
SEARCH_TERM = "preemption"
#: Chromium without the requests it makes on its own (updates, safe browsing, first-run pages).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions"]


def _needs_site_tools() -> None:
    """Skip, saying why, where the site's environment or the browser is missing."""
    if not SITE_PYTHON.exists():
        pytest.skip(f"no site environment at {SITE_PYTHON.relative_to(ROOT)}: `make site` builds it from "
                    "site/requirements.txt (the test-site target and its CI job run these tests)")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium browser at {CHROMIUM} (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")


# --- the driver's parsing: no tools needed ---------------------------------------------------

def test_readme_gives_a_front_matter_and_a_row_for_every_notebook():
    front, map_section = build_site.readme_parts((ROOT / "README.md").read_text(encoding="utf-8"))
    assert front.startswith("# ") and "\n## " not in front
    assert map_section.startswith(build_site.MAP_HEADING)
    headers, rows = build_site.notebook_rows(map_section)
    stored = sorted(path.name for path in (ROOT / "notebooks").glob(build_site.NOTEBOOK_GLOB))
    assert len(stored) == 14 and sorted(rows) == stored
    assert any("last passed" in header for header in headers)


def test_a_readme_without_the_notebook_map_is_a_clear_error():
    with pytest.raises(build_site.SiteError, match="Notebook map"):
        build_site.readme_parts("# Title\n\ntext\n\n## Two commands\n\nmore\n")
    with pytest.raises(build_site.SiteError, match="names no notebook"):
        build_site.notebook_rows("## Notebook map\n\n| notebook | topic |\n|---|---|\n| nothing here | x |\n")


@pytest.mark.parametrize("remote, url", [
    ("git@github.com:some-org/course.git", "https://github.com/some-org/course"),
    ("ssh://git@github.com/some-org/course.git", "https://github.com/some-org/course"),
    ("https://github.com/some-org/course.git\n", "https://github.com/some-org/course"),
    ("https://github.com/some-org/course/", "https://github.com/some-org/course"),
])
def test_remote_urls_become_https_repository_urls(remote, url):
    assert build_site._https_url(remote) == url


def test_the_repository_url_comes_from_the_environment_first_then_a_placeholder(tmp_path):
    repo = build_site.repository(tmp_path, {"COURSE_SITE_REPOSITORY": "git@github.com:a/b.git"})
    assert (repo.url, repo.branch, repo.is_placeholder) == ("https://github.com/a/b", "main", False)
    actions = build_site.repository(tmp_path, {"GITHUB_REPOSITORY": "c/d", "COURSE_SITE_BRANCH": "pages"})
    assert (actions.url, actions.branch) == ("https://github.com/c/d", "pages")
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://github.com/e/f"\n')
    assert build_site.repository(tmp_path, {}).url == "https://github.com/e/f"
    (tmp_path / "pyproject.toml").unlink()
    assert build_site.repository(tmp_path, {}).is_placeholder  # tmp_path is no git checkout


def test_relative_links_point_at_site_pages_or_at_the_online_repository():
    repo = build_site.Repository("https://github.com/o/r", "main", "test")
    pages = {"docs/instructor.md": "instructor.md", "notebooks/01_x.ipynb": "notebooks/01_x.ipynb"}
    text = ("[guide](docs/instructor.md) [nb](notebooks/01_x.ipynb#pitfalls) [data](data/README.md) "
            "[web](https://pytorch.org/docs) [here](#notebook-map) [mail](mailto:a@b.c)")
    assert build_site.rewrite_links(text, ".", pages, repo) == (
        "[guide](instructor.md) [nb](notebooks/01_x.ipynb#pitfalls) [data](https://github.com/o/r/blob/main/data/README.md) "
        "[web](https://pytorch.org/docs) [here](#notebook-map) [mail](mailto:a@b.c)")
    from_docs = "[readme](../README.md#versions) [tool](../tools/build_site.py)"
    assert build_site.rewrite_links(from_docs, "docs", pages, repo) == (
        "[readme](https://github.com/o/r/blob/main/README.md#versions) "
        "[tool](https://github.com/o/r/blob/main/tools/build_site.py)")


def test_the_build_is_always_behind_the_network_guard_and_in_a_namespace_where_one_exists():
    from course_utils.kit import netns

    prefix, env, how = build_site.offline_prefix("guard", sys.executable)
    assert prefix == [] and env["COURSE_OFFLINE"] == "1" and "guard" in how
    prefix, env, how = build_site.offline_prefix("auto", sys.executable)
    assert env["COURSE_OFFLINE"] == "1"
    assert bool(prefix) == (netns.wrap(sys.executable)[0] is not None), how
    assert build_site.offline_prefix("none", sys.executable) == ([], {}, "network left as it is (--offline none)")


def test_the_notebook_map_table_is_wrapped_for_the_site_css():
    section = "## Notebook map\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nAfter.\n"
    assert build_site._wrap_table(section, "notebook-map") == (
        "## Notebook map\n\n:::{container} notebook-map\n| a | b |\n|---|---|\n| 1 | 2 |\n:::\n\nAfter.\n")


# --- the real site, built offline and read in a browser ---------------------------------------

def _run_build(out: Path, root: Path | None = None) -> str:
    """Build the site into ``out`` with the site's Python; return what the build printed."""
    env = {**os.environ, "COURSE_SITE_REPOSITORY": REPO_URL, "COURSE_SITE_BRANCH": BRANCH}
    env.pop("PYTHONPATH", None)
    command = [str(SITE_PYTHON), str(ROOT / "tools" / "build_site.py"), "--out", str(out)]
    if root is not None:
        command += ["--root", str(root)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "building offline: " in output and "network left as it is" not in output, output
    return output


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would drown pytest's output
        pass


@pytest.fixture(scope="module")
def serve():
    """Return ``serve(folder)``: the URL of a loopback HTTP server for ``folder`` (stopped at the end)."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_Quiet, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """Build the course's site once for this module; return its folder and the build's output."""
    _needs_site_tools()
    out = tmp_path_factory.mktemp("site")
    return {"html": out / "html", "log": _run_build(out)}


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (the system's, through playwright), closed at the end."""
    _needs_site_tools()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Visit:
    """One browser context on one origin: every other request is refused and remembered."""

    def __init__(self, browser, base: str) -> None:
        self.base = base
        self.outside: list[str] = []
        self.context = browser.new_context()
        self.context.route("**/*", self._route)

    def _route(self, route) -> None:
        if route.request.url.startswith(self.base):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def open(self, path: str) -> tuple[object, list[str]]:
        """Open ``path``; return (the page, its console errors, uncaught exceptions and failed loads)."""
        page = self.context.new_page()
        problems: list[str] = []
        page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error" else None)
        page.on("pageerror", lambda err: problems.append(f"uncaught: {err}"))
        page.on("requestfailed", lambda req: problems.append(f"failed: {req.url}")
                if req.url.startswith(self.base) else None)
        page.on("response", lambda res: problems.append(f"HTTP {res.status}: {res.url}")
                if res.status >= 400 else None)
        page.goto(self.base + path, wait_until="load", timeout=60_000)
        return page, problems


@pytest.fixture(scope="module")
def visit(site, browser, serve) -> Iterator[Visit]:
    visit = Visit(browser, serve(site["html"]))
    yield visit
    visit.context.close()


def _stored_notebooks() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted((ROOT / "notebooks").glob(build_site.NOTEBOOK_GLOB))}


def _outputs(nb: dict) -> Iterator[dict]:
    for cell in nb["cells"]:
        yield from cell.get("outputs", [])


def _pages(html: Path) -> list[str]:
    return sorted(str(path.relative_to(html)) for path in html.rglob("*.html")
                  if not path.relative_to(html).parts[0].startswith("_"))


def test_the_site_has_the_landing_page_the_guide_and_every_notebook(site):
    expected = {"index.html", "instructor.html", "search.html",
                *(f"notebooks/{stem}.html" for stem in _stored_notebooks())}
    assert set(_pages(site["html"])) == expected
    assert "launch buttons point at " + REPO_URL in site["log"]


#: What each page shows, read in the browser in one visit per page.
_READ_PAGE = """() => ({
  main: document.querySelectorAll('main').length,
  hrefs: Array.from(document.querySelectorAll('a[href]'), a => a.href),
  images: Array.from(document.querySelectorAll('article img'))
    .filter(i => i.src.includes('/_images/'))
    .map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  colab: Array.from(document.querySelectorAll("a[href*='colab.research.google.com']"), a => a.href),
  text: (document.querySelector('article') || document.body).innerText,
  colours: Array.from(document.querySelectorAll("article [class*='-Color-']"), s => getComputedStyle(s).color),
  plain: Array.from(document.querySelectorAll('article pre'), p => getComputedStyle(p).color)[0] || null,
})"""


@pytest.fixture(scope="module")
def pages(site, visit) -> dict[str, dict]:
    """Open every page of the site once; return what each one showed and the problems it logged."""
    seen = {}
    for path in _pages(site["html"]):
        page, problems = visit.open(path)
        seen[path] = {**page.evaluate(_READ_PAGE), "problems": problems}
        page.close()
    return seen


def test_every_page_renders_without_errors_and_no_request_leaves(pages, visit):
    assert {path: seen["problems"] for path, seen in pages.items() if seen["problems"]} == {}
    assert all(seen["main"] == 1 for seen in pages.values())
    assert visit.outside == [], f"requests that would have left this machine: {sorted(set(visit.outside))}"


def test_every_internal_link_resolves(site, pages, visit):
    html, base = site["html"], urlsplit(visit.base)
    broken, checked = [], 0

    @functools.cache
    def ids(target: Path) -> frozenset[str]:
        return frozenset(re.findall(r'\bid="([^"]+)"', target.read_text(encoding="utf-8")))

    for path, seen in pages.items():
        for href in seen["hrefs"]:
            if not href.startswith(visit.base):
                continue
            checked += 1
            parts = urlsplit(href)
            target = html / unquote(parts.path.removeprefix(base.path))
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{path} -> {href} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in ids(target):
                    broken.append(f"{path} -> {href} (no element with that id)")
    assert broken == []
    assert checked > 100  # the sidebar alone links every page from every page


def test_every_stored_image_is_shown_and_every_notebook_has_its_colab_button(pages):
    for stem, nb in _stored_notebooks().items():
        seen = pages[f"notebooks/{stem}.html"]
        stored = sum(1 for out in _outputs(nb) for mime in out.get("data", {}) if mime.startswith("image/"))
        assert len(seen["images"]) == stored, f"{stem}: {stored} images stored, {seen['images']} shown"
        assert all(image["ok"] for image in seen["images"]), f"{stem}: {seen['images']}"
        colab = f"https://colab.research.google.com/github/example-org/example-course/blob/{BRANCH}/notebooks/{stem}.ipynb"
        assert colab in seen["colab"], f"{stem}: {seen['colab']}"
    assert sum(len(seen["images"]) for seen in pages.values()) > 0


def test_each_notebook_page_shows_its_time_line_and_its_row_of_the_readme_table(pages):
    headers, rows = build_site.notebook_rows(
        build_site.readme_parts((ROOT / "README.md").read_text(encoding="utf-8"))[1])
    for name, row in rows.items():
        text = pages[f"notebooks/{Path(name).stem}.html"]["text"]
        assert "Time on a laptop CPU:" in text, name
        for header, value in zip(headers[2:], row[2:]):
            plain = re.sub(r"[`*]", "", value)
            assert plain in text, f"{name}: README's {header!r} value {plain!r} is not on its page"


def test_the_landing_page_holds_the_front_matter_and_the_notebook_map(pages):
    front, map_section = build_site.readme_parts((ROOT / "README.md").read_text(encoding="utf-8"))
    text = pages["index.html"]["text"]
    title = front.splitlines()[0].removeprefix("# ")
    assert title in text and "Notebook map" in text and "instructor guide" in text
    links = {href.rsplit("/", 1)[-1] for href in pages["index.html"]["hrefs"]}
    assert {f"{stem}.html" for stem in _stored_notebooks()} <= links
    assert "Instructor guide" in pages["instructor.html"]["text"]


def test_ansi_colours_render_as_colours_not_escape_codes(site, pages):
    seen = pages["notebooks/13_serving_engine.html"]
    assert seen["colours"] and all(colour != seen["plain"] for colour in seen["colours"]), seen["colours"]
    for path in pages:
        assert "\x1b[" not in (site["html"] / path).read_text(encoding="utf-8"), path


def test_search_finds_notebook_13_by_a_term_it_teaches(visit):
    assert SEARCH_TERM in json.dumps(_stored_notebooks()["13_serving_engine"]["cells"]).lower()
    page, problems = visit.open(f"search.html?q={SEARCH_TERM}")
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    found = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
    page.close()
    assert problems == []
    assert any("notebooks/13_serving_engine.html" in href for href in found), found


# --- the rendering settings on outputs the stored notebooks may not hold today -----------------

def _png(side: int = 4) -> str:
    """Return a ``side`` x ``side`` red PNG, base64-encoded as a notebook stores it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([200, 30, 30]) * side for _ in range(side))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


def _fixture_course(root: Path) -> None:
    """Write a one-notebook course (README, guide, notebook) whose outputs are a PNG, an HTML table,
    ANSI text and a warning on stderr."""
    (root / "notebooks").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "README.md").write_text(
        "# Fixture course\n\nFront matter.\n\n## Two commands\n\nnot on the site\n\n## Notebook map\n\n"
        "| notebook | topic | minutes | needs a GPU for | last passed (torch, date) |\n|---|---|---|---|---|\n"
        "| [`00_fixture.ipynb`](notebooks/00_fixture.ipynb) | outputs | 0.1 | nothing | torch 9.9, 2099-01-01 |\n\n"
        "## Versions\n\nnot on the site either\n", encoding="utf-8")
    (root / "docs" / "instructor.md").write_text("# Instructor guide\n\nFixture.\n", encoding="utf-8")
    table = "<table class='fixture-table'><tr><th>variant</th><th>ms</th></tr><tr><td>eager</td><td>1.0</td></tr></table>"
    outputs = [
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": _png(), "text/plain": "<Figure>"}},
        {"output_type": "execute_result", "execution_count": 1, "metadata": {},
         "data": {"text/html": table, "text/plain": "variant ms"}},
        {"output_type": "stream", "name": "stdout", "text": "\x1b[31mred words\x1b[0m plain words\n"},
        {"output_type": "stream", "name": "stderr", "text": "UserWarning: a warning the learner saw\n"},
    ]
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "cells": [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# 00 · Fixture\n\nWhy."},
                    {"cell_type": "code", "id": "code", "metadata": {}, "execution_count": 1,
                     "source": "show()", "outputs": outputs}]}
    (root / "notebooks" / "00_fixture.ipynb").write_text(json.dumps(nb), encoding="utf-8")


def test_png_html_tables_ansi_and_stderr_outputs_all_render(tmp_path, browser, serve):
    _needs_site_tools()
    _fixture_course(tmp_path / "course")
    _run_build(tmp_path / "out", root=tmp_path / "course")
    visit = Visit(browser, serve(tmp_path / "out" / "html"))
    try:
        page, problems = visit.open("notebooks/00_fixture.html")
        image = page.eval_on_selector("article img", "i => i.complete && i.naturalWidth")
        cells = page.eval_on_selector_all("article table.fixture-table td", "tds => tds.map(td => td.innerText)")
        red = page.eval_on_selector("article [class*='-Color-Red']", "s => [s.innerText, getComputedStyle(s).color]")
        text = page.locator("article").inner_text()
        page.close()
        landing, _ = visit.open("index.html")
        landing_text = landing.locator("article").inner_text()
        landing.close()
    finally:
        visit.context.close()
    assert problems == [] and visit.outside == []
    assert image == 4
    assert cells == ["eager", "1.0"]
    assert red[0] == "red words" and red[1] != "rgb(0, 0, 0)"
    assert "a warning the learner saw" in text and "torch 9.9, 2099-01-01" in text
    assert "Front matter." in landing_text and "00_fixture" in landing_text
    assert "not on the site" not in landing_text
