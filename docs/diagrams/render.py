"""Render every Graphviz source in docs/diagrams/ to the SVG beside it (``make diagrams``).

The pictures are kept in the repository as text (``NAME.dot``) so that a
change to one is a reviewable diff; the rendered ``NAME.svg`` is committed
too, so that a clone shows them without Graphviz. Each SVG records the
SHA-256 of the source it was rendered from, in a comment on its second line,
which is how ``tests/docs`` tells a stale picture from a current one without
needing Graphviz itself. The comments Graphviz writes (its version, the
source's name) are dropped, so that the same source renders to the same bytes
on any machine with the same Graphviz.

    python docs/diagrams/render.py          # render the ones whose source changed
    python docs/diagrams/render.py --all    # render them all
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The comment that records the source: ``<!-- source: where.dot sha256: HEX -->``.
SOURCE_COMMENT = "<!-- source: {name} sha256: {digest} -->"
_GRAPHVIZ_COMMENT = re.compile(r"<!--.*?-->\n?", re.DOTALL)


def digest(source: Path) -> str:
    """The SHA-256 of a source file's bytes, as its SVG records it."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def is_current(source: Path) -> bool:
    """Whether ``source``'s SVG exists and was rendered from these very bytes."""
    svg = source.with_suffix(".svg")
    comment = SOURCE_COMMENT.format(name=source.name, digest=digest(source))
    return svg.exists() and comment in svg.read_text()


def render(source: Path) -> Path:
    """Render ``source`` with Graphviz's ``dot`` to the SVG beside it; its path."""
    svg = subprocess.run(["dot", "-Tsvg", str(source)], check=True, capture_output=True,
                         text=True).stdout
    svg = _GRAPHVIZ_COMMENT.sub("", svg)
    header, _, body = svg.partition("\n")  # the <?xml ...?> line stays first
    comment = SOURCE_COMMENT.format(name=source.name, digest=digest(source))
    target = source.with_suffix(".svg")
    target.write_text(f"{header}\n{comment}\n{body}")
    return target


def main(argv: list[str]) -> int:
    if shutil.which("dot") is None:
        print("render.py needs Graphviz's dot (Debian: apt-get install graphviz)",
              file=sys.stderr)
        return 1
    for source in sorted(HERE.glob("*.dot")):
        if "--all" in argv or not is_current(source):
            print(f"rendered {render(source).relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
