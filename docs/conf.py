"""Sphinx configuration of the AgentCall docs site.

Build it with ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html`` (the
`docs` extra, which the `dev` extra includes, installs Sphinx and MyST). The Markdown pages in
``docs/`` are the guides as they are; the reference pages under ``docs/reference/`` are made from
the code while building (``docs/_ext/reference_directives.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# The checkout first, so the reference is made from this tree's code, installed or not.
sys.path.insert(0, str(DOCS.parent))

import agentcall  # noqa: E402

project = "AgentCall"
author = "The AgentCall authors"
copyright = "2026, The AgentCall authors"
version = release = agentcall.__version__

extensions = ["myst_parser", "docs._ext.reference_directives"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "**/README.md"]
# Links such as protocol.md#the-offline-mailbox name a heading by its slug.
myst_heading_anchors = 3
# Shell sessions and file listings are shown as written, and so is prose: `--flag` stays two
# hyphens and quotes stay straight, as a terminal shows them.
highlight_language = "none"
smartquotes = False
html_theme = "alabaster"
html_title = f"AgentCall {release}"
html_theme_options = {"description": "Call a coworker's coding agent", "fixed_sidebar": True}
# Nothing is fetched while building: no intersphinx, no remote images.
