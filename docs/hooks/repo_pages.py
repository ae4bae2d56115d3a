"""MkDocs hook: pages that show a Markdown file of the repository root (README.md as the site's front page,
ARCHITECTURE.md, BENCHMARKS.md, MODELS.md), so each of those files is written once, where GitHub shows it.

A page whose whole text is ``<!-- repo-file: NAME -->`` shows the file NAME (a path from the repository root).
Its links are made links of this site: ``docs/<page>`` becomes ``<page>``, a shown file becomes the page that
shows it, and a link to any other repository file (the site holds only ``docs/``) becomes that file's path in
code after the link text. Every link that stays a link is still checked by ``mkdocs build --strict``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = re.compile(r"\A\s*<!-- repo-file: (\S+) -->\s*\Z")
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")

_shown: dict[str, str] = {}  # repository path -> the page (under docs/) that shows it


def on_files(files: Any, config: Any) -> Any:
    """Records which page shows which repository file.

    Args:
        files: the site's files.
        config: the MkDocs config.

    Returns:
        The files, unchanged.
    """
    _shown.clear()
    for file in files.documentation_pages():
        match = MARKER.match(Path(file.abs_src_path).read_text(encoding="utf-8"))
        if match:
            _shown[match.group(1)] = file.src_uri
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    """The text of the file a marker page shows, its links made links of this site.

    Args:
        markdown: the page's Markdown.
        page: the page.
        config: the MkDocs config (``config_file_path`` locates the repository root).
        **kwargs: the rest of MkDocs' hook arguments, unused.

    Returns:
        The Markdown to render.
    """
    match = MARKER.match(markdown)
    if not match:
        return markdown
    root = Path(config.config_file_path).parent
    text = (root / match.group(1)).read_text(encoding="utf-8")
    return LINK.sub(lambda link: _site_link(link.group(1), link.group(2), page.file.src_uri), text)


def _site_link(text: str, target: str, page_uri: str) -> str:
    """One Markdown link of a shown file, as this site writes it."""
    if re.match(r"[a-z]+:|#", target):  # a web address or an anchor of the same page
        return f"[{text}]({target})"
    path, _, anchor = target.partition("#")
    anchor = f"#{anchor}" if anchor else ""
    depth = "../" * page_uri.count("/")
    if path.startswith("docs/"):
        return f"[{text}]({depth}{path[len('docs/'):]}{anchor})"
    if path in _shown:
        return f"[{text}]({depth}{_shown[path]}{anchor})"
    code = f"`{path.rstrip('/')}`"
    return code if text.strip("`").rstrip("/") == path.rstrip("/") else f"{text} ({code})"
