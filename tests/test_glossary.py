"""docs/glossary.md defines the relay's own words, and points at code that exists."""

from __future__ import annotations

import re
from pathlib import Path

import relay.core

REPO = Path(__file__).resolve().parents[1]
GLOSSARY = REPO / "docs" / "glossary.md"

# The words issue 24 found defined nowhere in one place, and a few more.
WORDS = ["admission", "answered", "declared", "demand", "held", "host", "lease", "linger",
         "locator", "reconcile", "refetch", "resync", "scope", "settle", "upward", "variant"]


def entries() -> list[str]:
    """The words the glossary defines: each entry starts with a bold word."""
    text = GLOSSARY.read_text()
    return re.findall(r"^\*\*([a-z-]+)\*\*", text, flags=re.MULTILINE)


def test_every_word_has_one_entry() -> None:
    defined = entries()
    assert [word for word in WORDS if defined.count(word) != 1] == []


def test_entries_are_in_alphabetical_order() -> None:
    defined = entries()
    assert defined == sorted(defined)


def test_every_path_it_names_exists() -> None:
    paths = re.findall(r"`(relay/[\w/]+(?:\.py)?)`", GLOSSARY.read_text())
    assert paths, "the glossary names no module"
    assert [path for path in paths if not (REPO / path).exists()] == []


def test_readme_and_core_point_at_it() -> None:
    assert "(docs/glossary.md)" in (REPO / "README.md").read_text()
    assert relay.core.__doc__ is not None and "docs/glossary.md" in relay.core.__doc__
