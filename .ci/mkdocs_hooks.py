"""MkDocs build hooks (mkdocs.yml `hooks:`): the README as the site's home page, and the link check.

The README sits at the repository's root, where GitHub shows it, and links to the other pages as
`docs/PAGE.md`; the site's pages all live in docs/. The README is handed to MkDocs as
`index.md` with that prefix dropped, so one file is the front page of both, and
`mkdocs build --strict` checks its links (pages and anchors) as it checks every page's.

External links are checked offline: CI has no network beyond package registries, and a check
that fetched them would fail the build on someone else's outage. Each one must be a well-formed
https address on a host of ALLOWED_HOSTS (a typo'd or unexpected address warns, which --strict
turns into a failure); whether the page behind it still exists is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

README = Path(__file__).resolve().parents[1] / "README.md"
ALLOWED_HOSTS = frozenset(
    {
        "github.com",
        "docs.ray.io",
        "cloud.google.com",
        "docs.pytorch.org",
        "pytorch.org",
        "pypi.org",
        "www.mkdocs.org",
    }
)

log = get_plugin_logger("docs")
# A Markdown link into docs/ as the README writes it: `](docs/PAGE.md...)`.
_DOCS_LINK = re.compile(r"\]\(docs/")
# An external address anywhere in a page (links, autolinks, code); it ends at whitespace or at
# the Markdown or HTML punctuation that closes it.
_URL = re.compile(r"\bhttps?://[^\s<>()\[\]`'\"]+")


def readme_as_index(text: str) -> str:
    return _DOCS_LINK.sub("](", text)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    if files.get_file_from_path("index.md") is not None:
        raise ValueError("docs/index.md would hide the README, which is the site's home page")
    files.append(File.generated(config, "index.md", content=readme_as_index(README.read_text())))
    return files


def external_link_problem(url: str) -> str | None:
    """Why ``url`` is not an acceptable external link, or None."""
    parts = urlsplit(url.rstrip(".,;:"))
    if parts.scheme != "https":
        return "not https"
    if parts.hostname not in ALLOWED_HOSTS:
        return f"host {parts.hostname!r} is not in ALLOWED_HOSTS of .ci/mkdocs_hooks.py"
    return None


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    for url in _URL.findall(markdown):
        problem = external_link_problem(url)
        if problem:
            log.warning("%s: external link %s: %s", page.file.src_uri, url, problem)
    return markdown
