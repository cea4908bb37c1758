"""What the docs tests read in Markdown: pages, links, headings' anchors, fenced blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def pages() -> list[Path]:
    """The README and every page under docs/."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """``text`` without fenced blocks and HTML comments (links there are not links)."""
    return _COMMENT.sub("", _FENCE.sub("", text))


@dataclass(frozen=True)
class Link:
    page: Path
    target: str


def links(page: Path) -> list[Link]:
    """Every link and image target written in ``page``'s prose."""
    text = _CODE_SPAN.sub("", prose(page.read_text()))
    return [Link(page, target) for target in _LINK.findall(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (a repeated one gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(prose(page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of ``page`` in ``language`` (```yaml ... ```), in order."""
    return [body for lang, body in _BLOCK.findall(page.read_text()) if lang == language]


def section(page: Path, heading: str) -> str:
    """The text under the ``## heading`` of ``page``, up to the next heading of its level."""
    text = page.read_text()
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert match is not None, f"{page.relative_to(REPO)} has no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest
