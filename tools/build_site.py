"""Build the course's static HTML book from the notebooks' stored outputs (nothing is executed).

Usage (what ``make site`` runs)::

    build/venv-site/bin/python tools/build_site.py [--out build/site] [--offline auto|netns|guard|none]

The site's tools live in their own environment, ``build/venv-site``, pinned by
``site/requirements.txt``; ``site/README.md`` says why Sphinx, myst-nb and sphinx-book-theme.
Steps:

1. *Stage* the sources into ``OUT/src``: the landing page (README's front matter and its
   notebook map), the instructor guide (``docs/instructor.md``), their relative links pointed at
   the site's pages or else at the files in the online repository, and a copy of every
   ``notebooks/NN_*.ipynb`` with one markdown cell added under its title: the notebook's row of
   README's table (minutes on the reference machine, what needs a GPU, last passed). The stored
   notebooks are only read.
2. *Build* with ``sphinx-build`` (configuration: ``site/conf.py``) into ``OUT/html``, with the
   network removed: inside an empty network namespace where Linux allows one
   (``course_utils.kit.netns``) and always behind the course's Python network guard
   (``course_utils.kit.offline``), so a theme or extension that tried to download something would
   fail the build instead of quietly working only on a connected machine.

The Open-in-Colab button needs the repository's URL: ``COURSE_SITE_REPOSITORY``, else GitHub
Actions' ``GITHUB_SERVER_URL``/``GITHUB_REPOSITORY``, else ``git remote get-url origin``, else
pyproject's ``[project.urls]``, else the placeholder ``PLACEHOLDER_REPOSITORY`` (the build says so).
This file uses the standard library only, so both the site's environment and the course's can run it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE_DIR = ROOT / "site"
DEFAULT_OUT = ROOT / "build" / "site"
SITE_VENV = ROOT / "build" / "venv-site"
#: Where the Colab links point when no repository URL can be found: edit it, or set COURSE_SITE_REPOSITORY.
PLACEHOLDER_REPOSITORY = "https://github.com/YOUR-ORG/YOUR-REPOSITORY"
DEFAULT_BRANCH = "main"
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
#: The id of the cell added to each staged notebook (the test finds the rendered row by it).
ROW_CELL_ID = "site-notebook-map-row"
MAP_HEADING = "## Notebook map"


class SiteError(RuntimeError):
    """The sources cannot be turned into the site (a README section or a notebook row is missing)."""


@dataclass(frozen=True)
class Repository:
    """Where the notebooks live online: the URL, the branch and how the URL was found."""

    url: str
    branch: str
    source: str

    @property
    def is_placeholder(self) -> bool:
        """Return True when no real repository URL was found."""
        return self.url == PLACEHOLDER_REPOSITORY


def _https_url(remote: str) -> str:
    """Return ``remote`` as an https URL without ``.git`` (``git@github.com:o/r.git`` included)."""
    remote = remote.strip()
    ssh = re.fullmatch(r"(?:ssh://)?git@([^:/]+)[:/](.+)", remote)
    if ssh:
        remote = f"https://{ssh.group(1)}/{ssh.group(2)}"
    return remote.removesuffix("/").removesuffix(".git")


def repository(root: Path = ROOT, environ: dict[str, str] | None = None) -> Repository:
    """Return the repository the Colab buttons point at, and where its URL came from."""
    env = dict(os.environ if environ is None else environ)
    branch = env.get("COURSE_SITE_BRANCH") or DEFAULT_BRANCH
    if env.get("COURSE_SITE_REPOSITORY"):
        return Repository(_https_url(env["COURSE_SITE_REPOSITORY"]), branch, "COURSE_SITE_REPOSITORY")
    if env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL") or "https://github.com"
        return Repository(f"{server}/{env['GITHUB_REPOSITORY']}", branch, "GITHUB_REPOSITORY")
    try:
        remote = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                                capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        remote = None
    if remote is not None and remote.returncode == 0 and remote.stdout.strip():
        return Repository(_https_url(remote.stdout), branch, "git remote origin")
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        urls = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("urls", {})
        for key in ("Repository", "Source", "Source Code", "Homepage"):
            if key in urls:
                return Repository(_https_url(urls[key]), branch, f"pyproject.toml [project.urls] {key}")
    return Repository(PLACEHOLDER_REPOSITORY, branch, "placeholder (no origin remote, no project URL)")


def readme_parts(readme: str) -> tuple[str, str]:
    """Return (README's front matter: its title and text before the first ``##``, its notebook map section)."""
    first = re.search(r"^## ", readme, flags=re.MULTILINE)
    if first is None:
        raise SiteError("README.md has no '## ' section: the landing page takes the text above the first one")
    front = readme[:first.start()].rstrip() + "\n"
    start = readme.find(f"\n{MAP_HEADING}\n")
    if start < 0:
        raise SiteError(f"README.md has no '{MAP_HEADING}' section (the notebook table)")
    end = re.search(r"^## ", readme[start + 1 + len(MAP_HEADING):], flags=re.MULTILINE)
    stop = len(readme) if end is None else start + 1 + len(MAP_HEADING) + end.start()
    return front, readme[start + 1:stop].rstrip() + "\n"


def _cells(line: str) -> list[str]:
    """Return the cells of one Markdown table row (``| a | b |`` gives ``['a', 'b']``)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def notebook_rows(map_section: str) -> tuple[list[str], dict[str, list[str]]]:
    """Return (the notebook table's headers, each notebook file name's row) from README's map section."""
    lines = [line for line in map_section.splitlines() if line.lstrip().startswith("|")]
    if len(lines) < 3:
        raise SiteError("README's notebook map has no table (a header, a separator and rows)")
    headers = _cells(lines[0])
    rows: dict[str, list[str]] = {}
    for line in lines[2:]:
        cells = _cells(line)
        name = re.search(r"\d\d_[\w-]+\.ipynb", cells[0])
        if name is None or len(cells) != len(headers):
            raise SiteError(f"README's notebook table has a row that names no notebook: {line.strip()}")
        rows[name.group(0)] = cells
    return headers, rows


def row_cell(headers: list[str], row: list[str]) -> dict:
    """Return the markdown cell that shows a notebook's row of README's table on its page."""
    facts = [f"**{header[:1].upper() + header[1:]}:** {value}" for header, value in zip(headers[2:], row[2:])]
    text = ("```{admonition} This notebook in the course's notebook map\n:class: tip\n"
            + "  \n".join(facts) + "\n\n"
            "Figures from README's [notebook map](../index.md#notebook-map), written by `make stamp`. "
            "The notebook imports the course's `course_utils` package, so a copy opened somewhere else "
            "(the launch button above) needs the repository installed there first "
            "(README, *Two commands*).\n```")
    return {"cell_type": "markdown", "id": ROW_CELL_ID, "metadata": {}, "source": text}


def _wrap_table(section: str, css_class: str) -> str:
    """Return ``section`` with its Markdown table inside a ``{container}`` of ``css_class`` (for the site's CSS)."""
    lines = section.splitlines()
    rows = [i for i, line in enumerate(lines) if line.lstrip().startswith("|")]
    if not rows:
        return section
    first, last = rows[0], rows[-1]
    return "\n".join([*lines[:first], f":::{{container}} {css_class}", *lines[first:last + 1], ":::",
                      *lines[last + 1:]]) + "\n"


def landing_page(front: str, map_section: str, notebooks: list[str]) -> str:
    """Return index.md: README's front matter, its notebook map, a pointer to the guide, the toctrees."""
    pages = "\n".join(f"notebooks/{Path(name).stem}" for name in notebooks)
    return (f"{front}\n{_wrap_table(map_section, 'notebook-map')}\n"
            "## For instructors\n\n"
            "The [instructor guide](instructor.md) covers preparing a class, half-day and full-day "
            "agendas, what learners ask at each notebook and the failures seen on laptops.\n\n"
            f"```{{toctree}}\n:hidden:\n:caption: Notebooks\n:maxdepth: 1\n\n{pages}\n```\n\n"
            "```{toctree}\n:hidden:\n:caption: Teaching\n\ninstructor\n```\n")


_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def rewrite_links(text: str, folder: str, pages: dict[str, str], repo: Repository) -> str:
    """Return Markdown ``text`` (a file in the repository's ``folder``) with each relative link
    pointing at its page on the site where ``pages`` (repository path -> staged path) has one, and
    at the file in the online repository otherwise; absolute URLs and ``#anchors`` stay as they are.
    """
    def replace(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        in_repo = os.path.normpath(os.path.join(folder, path)).replace(os.sep, "/")
        if in_repo in pages:
            new = pages[in_repo] + (f"#{anchor}" if anchor else "")
        else:
            new = f"{repo.url}/blob/{repo.branch}/{in_repo}" + (f"#{anchor}" if anchor else "")
        return f"{match.group(1)}{new}{match.group(3)}"

    return _LINK.sub(replace, text)


def stage(src: Path, root: Path = ROOT, repo: Repository | None = None) -> list[str]:
    """Write the site's sources into ``src`` (emptied first) and return the notebook file names staged."""
    repo = repository(root) if repo is None else repo
    readme = (root / "README.md").read_text(encoding="utf-8")
    front, map_section = readme_parts(readme)
    headers, rows = notebook_rows(map_section)
    notebooks = sorted(path.name for path in (root / "notebooks").glob(NOTEBOOK_GLOB))
    if not notebooks:
        raise SiteError(f"no notebooks match {root / 'notebooks' / NOTEBOOK_GLOB}")
    missing = [name for name in notebooks if name not in rows]
    if missing:
        raise SiteError(f"README's notebook table has no row for {', '.join(missing)}")
    if src.exists():
        shutil.rmtree(src)
    (src / "notebooks").mkdir(parents=True)
    # README itself links to the online repository: the landing page holds only two of its parts
    pages = {"docs/instructor.md": "instructor.md", **{f"notebooks/{name}": f"notebooks/{name}" for name in notebooks}}
    index = rewrite_links(landing_page(front, map_section, notebooks), ".", pages, repo)
    (src / "index.md").write_text(index, encoding="utf-8")
    guide = (root / "docs" / "instructor.md").read_text(encoding="utf-8")
    # both pages sit at the top of the staged tree, so a staged path is also the link from either
    (src / "instructor.md").write_text(rewrite_links(guide, "docs", pages, repo), encoding="utf-8")
    for name in notebooks:
        nb = json.loads((root / "notebooks" / name).read_text(encoding="utf-8"))
        nb["cells"].insert(1, row_cell(headers, rows[name]))
        (src / "notebooks" / name).write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n",
                                              encoding="utf-8")
    return notebooks


def offline_prefix(mode: str, python: str) -> tuple[list[str], dict[str, str], str]:
    """Return (command prefix, environment additions, what it does) for building with no network.

    ``netns``: an empty network namespace or fail; ``guard``: the Python guard alone; ``auto``:
    the namespace where Linux allows one, with the guard in every case; ``none``: neither.
    """
    if mode == "none":
        return [], {}, "network left as it is (--offline none)"
    sys.path.insert(0, str(ROOT))
    from course_utils.kit import netns, offline  # standard library only, no torch

    guard = offline.child_env()
    if mode == "guard":
        return [], guard, "Python network guard (course_utils.kit.offline)"
    prefix, how = netns.wrap(python)
    if prefix is None:
        if mode == "netns":
            raise SiteError(f"--offline netns: {how}")
        return [], guard, f"Python network guard only ({how})"
    return prefix, guard, f"empty network namespace ({how}) + Python network guard"


def build(out: Path, offline_mode: str = "auto", jobs: str = "1", python: str = sys.executable,
          root: Path = ROOT) -> float:
    """Stage the sources of the course in ``root`` and build ``out/html``; return the seconds it took."""
    started = time.perf_counter()
    repo = repository()
    staged = stage(out / "src", root, repo)
    prefix, extra_env, how = offline_prefix(offline_mode, python)
    # the guard's environment keeps any PYTHONPATH already set (course_utils.config.child_pythonpath)
    env = {**os.environ, **extra_env, "COURSE_SITE_REPOSITORY": repo.url, "COURSE_SITE_BRANCH": repo.branch}
    print(f"site: {len(staged)} notebooks staged in {out / 'src'}; building offline: {how}")
    print(f"site: launch buttons point at {repo.url} (branch {repo.branch}; from {repo.source})")
    if repo.is_placeholder:
        print("site: WARNING: no repository URL found; the Colab buttons use a placeholder. Set "
              "COURSE_SITE_REPOSITORY=https://github.com/OWNER/REPO (or add an origin remote).", file=sys.stderr)
    command = [*prefix, python, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-j", jobs,
               "-c", str(SITE_DIR), "-d", str(out / "doctrees"), str(out / "src"), str(out / "html")]
    result = subprocess.run(command, env=env, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise SiteError(f"sphinx-build failed (exit status {result.returncode}); its messages are above")
    seconds = time.perf_counter() - started
    print(f"site: built {out / 'html' / 'index.html'} in {seconds:.1f} s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Build the site; return the exit status (1 with one ``error:`` line when it cannot)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default build/site)")
    parser.add_argument("--offline", choices=["auto", "netns", "guard", "none"], default="auto",
                        help="how the network is removed while building (default: auto)")
    parser.add_argument("--jobs", default="1", help="sphinx-build -j (default: 1; the whole build is a few CPU-seconds)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the course to publish: README.md, docs/instructor.md, notebooks/ (default: this repository)")
    args = parser.parse_args(argv)
    try:
        import sphinx  # noqa: F401  (is this the site's environment?)
    except ImportError:
        print(f"error: Sphinx is not installed for {sys.executable}; run `make site`, which builds "
              f"{SITE_VENV.relative_to(ROOT)} from site/requirements.txt", file=sys.stderr)
        return 1
    try:
        build(args.out.resolve(), args.offline, args.jobs, root=args.root.resolve())
    except SiteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
