"""The pictures are rendered from the Graphviz sources beside them, and shown.

Each ``docs/diagrams/NAME.dot`` has its ``NAME.svg``, which records the
SHA-256 of the source it was rendered from (``docs/diagrams/render.py``,
``make diagrams``): an edited source without a fresh render fails here,
on any machine, Graphviz or not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.markdown import DOCS, links, pages

DIAGRAMS = DOCS / "diagrams"
SOURCES = sorted(DIAGRAMS.glob("*.dot"))


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render", DIAGRAMS / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_the_four_pictures() -> None:
    assert [source.stem for source in SOURCES] == [
        "authorities", "chaining", "where", "workers"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda source: source.name)
def test_each_svg_is_rendered_from_its_current_source(source: Path) -> None:
    svg = source.with_suffix(".svg")
    assert svg.exists(), f"{svg.name} missing: run make diagrams"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert f"<!-- source: {source.name} sha256: {digest} -->" in svg.read_text(), (
        f"{svg.name} was not rendered from the current {source.name}: run make diagrams")
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall(".//{http://www.w3.org/2000/svg}g")) > 3  # drawn, not empty


def test_every_svg_has_a_source_and_every_picture_is_shown() -> None:
    assert sorted(svg.stem for svg in DIAGRAMS.glob("*.svg")) == [s.stem for s in SOURCES]
    shown = {(link.page.parent / link.target).resolve()
             for page in pages() for link in links(page)}
    assert [s.with_suffix(".svg").name for s in SOURCES
            if s.with_suffix(".svg").resolve() not in shown] == []


def test_an_edited_source_is_stale_until_rendered(tmp_path: Path) -> None:
    render = _renderer()
    source = tmp_path / "pic.dot"
    source.write_text("digraph pic { a -> b; }\n")
    source.with_suffix(".svg").write_text(
        "<?xml version='1.0'?>\n" + render.SOURCE_COMMENT.format(
            name="pic.dot", digest=render.digest(source)) + "\n<svg/>\n")
    assert render.is_current(source)
    source.write_text("digraph pic { a -> c; }\n")
    assert not render.is_current(source)
    if shutil.which("dot") is None:
        return  # rendering needs Graphviz; the check above does not
    svg = render.render(source)
    assert render.is_current(source)
    lines = svg.read_text().splitlines()
    assert lines[0].startswith("<?xml") and lines[1].startswith("<!-- source: pic.dot sha256:")
    assert sum("<!--" in line for line in lines) == 1  # Graphviz's own comments dropped
