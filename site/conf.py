"""Sphinx configuration of the course site: the notebooks as they were stored, never executed.

``tools/build_site.py`` stages the sources (landing page, instructor guide, notebooks) and runs
``sphinx-build -c site``; it sets COURSE_SITE_REPOSITORY and COURSE_SITE_BRANCH for the launch
buttons. Read ``site/README.md`` first.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_site  # noqa: E402  (tools/build_site.py: the repository URL and its placeholder)

_repo = build_site.repository()

project = "PyTorch 2, hands on"
author = "the course's authors"
copyright = "the course's authors, MIT licence"
language = "en"

extensions = ["myst_nb"]
# Which staged files are pages: the notebooks, the landing page and the guide (Markdown through MyST).
source_suffix = {".ipynb": "myst-nb", ".md": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# The outputs are the ones stored by the full-mode run (`make execute`): show them, run nothing.
nb_execution_mode = "off"
nb_output_stderr = "show"          # warnings a cell printed are part of what the learner saw
nb_merge_streams = True            # one block per cell instead of one per print flush
nb_render_text_lexer = "myst-ansi"  # ANSI colours in printed text become coloured spans

myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3           # '#notebook-map' and the like resolve to headings
smartquotes = False                # prose quotes option names and strings: keep the characters typed

html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_last_updated_fmt = None
html_use_index = False              # no index entries are written, so no empty genindex page
html_show_sourcelink = True
html_copy_source = True             # the .ipynb download button serves the staged copy
html_theme_options = {
    "repository_url": _repo.url,
    "repository_branch": _repo.branch,
    "path_to_docs": "",             # a staged page 'notebooks/NN_x' is the repository's notebooks/NN_x.ipynb
    "use_repository_button": not _repo.is_placeholder,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
    # the landing page's wide notebook table gets the width the page's table of contents took
    "secondary_sidebar_items": {"**": ["page-toc"], "index": []},
    "home_page_in_toc": True,
    # nothing fetched from another site when a page is viewed: no analytics, no external icons
    "icon_links": [],
}
html_context = {"default_mode": "light"}
# search runs in the browser from searchindex.js; no server is needed
html_search_language = "en"
