"""Every relative link in the README and docs/ leads somewhere in the repository.

Links are what a reader of a clone (or of the repository on a forge)
follows; one to a file that moved, or to a heading that was renamed, fails
here rather than in front of them. Links to other sites are not fetched.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.docs.markdown import REPO, Link, anchors, links, pages, slug


def _relative_links() -> list[Link]:
    return [link for page in pages() for link in links(page)
            if not link.target.startswith(("http://", "https://", "mailto:"))]


def problem(link: Link, root: Path = REPO) -> str | None:
    """Why ``link`` leads nowhere under ``root``, or None when it leads somewhere."""
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / unquote(path)).resolve() if path else link.page
    if not target.is_relative_to(root):
        return "leaves the repository"
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"no heading with anchor #{anchor} in {target.name}"
    return None


@pytest.mark.parametrize("link", _relative_links(),
                         ids=lambda link: f"{link.page.relative_to(REPO)}->{link.target}")
def test_every_relative_link_resolves(link: Link) -> None:
    assert problem(link) is None, f"{link.page.relative_to(REPO)}: {link.target}: {problem(link)}"


def test_every_page_is_linked_from_another() -> None:
    assert len(_relative_links()) > 50  # the checks above have something to check
    linked = {(link.page.parent / unquote(link.target.split("#")[0])).resolve()
              for link in _relative_links() if not link.target.startswith("#")}
    unlinked = [str(page.relative_to(REPO)) for page in pages()[1:]
                if page.resolve() not in linked]
    assert unlinked == [], "pages no other page links to"


def test_the_checker_finds_a_missing_file_a_missing_heading_and_a_way_out(
        tmp_path: Path) -> None:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("# Page\n\n## Beyond one core: `--workers`\n\n"
                    "[a](other.md) [b](#beyond-one-core---workers) [c](#nowhere) "
                    "[d](../../outside.md) `[e](in-code.md)`\n\n```\n[f](in-a-block.md)\n```\n")
    found = links(page)
    assert [link.target for link in found] == [
        "other.md", "#beyond-one-core---workers", "#nowhere", "../../outside.md"]
    assert [problem(link, tmp_path) for link in found] == [
        "no such file", None, "no heading with anchor #nowhere in page.md",
        "leaves the repository"]


def test_anchors_are_githubs() -> None:
    assert slug("Beyond one core: `--workers`") == "beyond-one-core---workers"
    assert slug("gRPC: `GRPC_XDS_BOOTSTRAP`") == "grpc-grpc_xds_bootstrap"
    assert slug("Upstream (the relay's single Delta-ADS stream)") == \
        "upstream-the-relays-single-delta-ads-stream"
